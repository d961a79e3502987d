"""OpenRLHF's own argument parser accepts every OpenRLHF command the book prints, and OpenRLHF computes the book's loss
under the parsed arguments (rlbook.integrations.engines).

The release the commands are pinned to (``OPENRLHF_VERSION``) is installed from PyPI without its dependencies, once,
into ``<venv>/engine-wheels/``; the test is skipped with one line when pip cannot reach the package index. For every
preset (and a few configs that reach the other branches):

1. the command runs through bash as a reader pastes it (``python3`` replaced by a function that prints its
   arguments), so the shell variables of the cluster block expand as they would;
2. the body of ``if __name__ == "__main__":`` of the installed ``openrlhf/cli/train_ppo_ray.py``, read at test time,
   builds OpenRLHF's parser and runs the checks that follow it, with ``train`` replaced by a function that keeps the
   parsed arguments (so no Ray, no job): an unknown flag, a rejected value (a two-value flag written with ``=``) or
   a failed check fails the test; the parsed arguments hold the preset in OpenRLHF's units;
3. OpenRLHF's ``PolicyLoss`` (built from the parsed arguments as its actor builds it) equals the book's
   ``rlbook.objectives.policy_loss`` in value and gradient, and its overlong penalty is the book's soft overlong
   punishment.

Nothing here has run on a GPU.
"""

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import math
import shlex
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch

from engine_releases import (CONFIGS, assert_the_chapter_shows_exactly, install_release, pasted_argv,
                             small_batch)
from rlbook.integrations.engines import ADAM_BETAS, OPENRLHF_VERSION, openrlhf_run
from rlbook.objectives import policy_loss
from rlbook.presets import PRESETS, preset
from rlbook.tasks.shaping import soft_overlong_penalty

ROOT = Path(__file__).resolve().parents[1]
# the presets and the configs beyond them (engine_releases.CONFIGS) that this engine can run
RUNNABLE = sorted(key for key, c in CONFIGS.items() if openrlhf_run(c).command is not None)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


# ---------------------------------------------------------------------------------------------------------------
# the release, the shell, OpenRLHF's parser
# ---------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def bare_packages(root: Path, names, placeholders=()):
    """The packages ``names`` importable from ``root`` without running their ``__init__`` files (OpenRLHF's import
    Ray, DeepSpeed and vLLM), and ``placeholders`` (packages that are not installed) as placeholder modules; all of
    it is removed from ``sys.modules`` afterwards."""

    class Placeholders(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] not in placeholders:
                return None
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = mock.MagicMock(name=spec.name)
            module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
            return module

        def exec_module(self, module):
            pass

    placeholders = {p for p in placeholders if importlib.util.find_spec(p) is None}
    finder, before = Placeholders(), set(sys.modules)
    sys.meta_path.insert(0, finder)
    for name in names:
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")))]
        sys.modules[name] = module
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before | set(names):
            if name.split(".")[0] in {names[0].split(".")[0], *placeholders}:
                sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def openrlhf_root():
    return install_release("openrlhf", OPENRLHF_VERSION)


@pytest.fixture(scope="module")
def cli(openrlhf_root):
    """The ``__main__`` block of OpenRLHF's ``train_ppo_ray.py`` (its parser and the checks after it), compiled,
    and the standard-library imports of the module it reads."""
    path = openrlhf_root / "openrlhf" / "cli" / "train_ppo_ray.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    main = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and getattr(node.test.left, "id", None) == "__name__"]
    assert len(main) == 1, "train_ppo_ray.py has no single `if __name__ == '__main__':` block"
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
               and (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
               in sys.stdlib_module_names]
    return types.SimpleNamespace(root=openrlhf_root,
                                 imports=compile(ast.Module(body=imports, type_ignores=[]), str(path), "exec"),
                                 main=compile(ast.Module(body=main[0].body, type_ignores=[]), str(path), "exec"))


class Rejected(Exception):
    """OpenRLHF's parser or one of its checks refused the arguments."""


def parse(cli, argv: list[str]):
    """The arguments OpenRLHF's ``train_ppo_ray`` would train with, given ``argv``: its parser and its checks, run
    with ``train`` replaced; :class:`Rejected` with argparse's message or the failed check."""
    kept = {}
    namespace = {"__name__": "__main__", "train": lambda args: kept.setdefault("args", args)}
    exec(cli.imports, namespace)
    errors, saved = io.StringIO(), sys.argv
    sys.argv = ["train_ppo_ray.py", *argv]
    try:
        with bare_packages(cli.root, ["openrlhf", "openrlhf.utils"]), contextlib.redirect_stderr(errors):
            exec(cli.main, namespace)
    except SystemExit as exit_:
        raise Rejected(errors.getvalue().strip().splitlines()[-1] if errors.getvalue() else str(exit_)) from None
    except AssertionError as failed:
        raise Rejected(f"check failed: {failed}") from None
    finally:
        sys.argv = saved
    assert "args" in kept, "train_ppo_ray's __main__ block did not reach train(args)"
    return kept["args"]


def parsed(cli, key):
    """``(args, run)`` of ``CONFIGS[key]``: the command through bash, through OpenRLHF's parser."""
    run = openrlhf_run(CONFIGS[key])
    argv = pasted_argv(run.command)
    assert argv[:2] == ["-m", "openrlhf.cli.train_ppo_ray"], argv[:2]
    return parse(cli, argv[2:]), run, argv[2:]


# ---------------------------------------------------------------------------------------------------------------
# 1-2: the command parses, and the parsed arguments hold the preset
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RUNNABLE)
def test_openrlhf_parses_the_command_and_holds_the_preset(cli, key):
    c = CONFIGS[key]
    args, run, argv = parsed(cli, key)
    W, G = c.value_pretrain_steps, c.num_generations
    assert args.rollout.n_samples_per_prompt == G
    assert args.rollout.max_new_tokens == c.max_completion_length and args.rollout.temperature == c.temperature
    assert args.rollout.batch_size * G == c.generation_batch_size
    assert args.train.batch_size == c.per_device_train_batch_size * c.gradient_accumulation_steps
    assert args.train.max_epochs == c.num_iterations
    high = c.epsilon if c.epsilon_high is None else c.epsilon_high
    assert [math.isclose(a, b) for a, b in zip(args.actor.eps_clip_low_high, (c.epsilon, high))] == [True, True]
    assert args.actor.dual_clip is None
    roles = ["actor"] + (["critic"] if c.advantage_estimator == "gae" else [])
    for role in roles:  # AdamW at the book's constant rate, betas and weight decay
        entity = getattr(args, role)
        assert entity.optim == "adam" and entity.adam.lr == c.learning_rate
        assert list(entity.adam.betas) == [float(b) for b in ADAM_BETAS.split()]
        assert entity.adam.weight_decay == c.weight_decay and entity.max_norm == c.max_grad_norm
        assert entity.lr_scheduler == "constant" and entity.lr_warmup_ratio == 0
    from transformers import SchedulerType

    assert SchedulerType(args.actor.lr_scheduler) is SchedulerType.CONSTANT
    # the run: one pass over max_samples prompts, a rollout per rollout.batch_size of them
    assert args.train.num_episodes == 1
    assert args.data.max_samples == (c.max_steps + W) * c.num_prompts
    assert args.critic.freezing_steps == (W - 1 if W else -1)
    # the KL (OpenRLHF builds a reference model only when init_coef > 0)
    assert args.algo.kl.init_coef == c.beta
    assert args.algo.kl.use_loss == (c.beta > 0 and c.kl_placement == "loss")
    if c.beta > 0:
        assert args.algo.kl.estimator == ("k3" if c.kl_placement == "loss" else "k1")
    assert (args.algo.kl.target is not None) == (c.adaptive_kl_target is not None)
    # the critic: only for GAE, from the policy's weights
    critic = c.advantage_estimator == "gae"
    assert (args.critic.model_name_or_path == args.actor.model_name_or_path) if critic else (
        args.critic.model_name_or_path is None)
    if critic:
        assert args.critic.value_clip == c.cliprange_value and args.algo.advantage.lambd == c.lam
    assert args.algo.dynamic_filtering_enable == c.dynamic_sampling
    assert (args.reward.overlong_buffer_len == c.overlong_buffer_length) if c.overlong_buffer_length else (
        args.reward.overlong_buffer_len is None)
    # the rendered flags are the run's options, in order
    flags = [word for word in argv if word.startswith("--")]
    assert flags == list(run.options)


def test_presets_openrlhf_cannot_run_have_no_command():
    """A command without its estimator or surrogate would run another algorithm (OpenRLHF's ppo loss would read
    GMPO's ε = 0.4 as its ratio clip, CISPO's cap of 5 as a clip of [0.8, 6]): there is none, and a reason."""
    blocked = {n: openrlhf_run(preset(n)).blocked for n in PRESETS if openrlhf_run(preset(n)).command is None}
    assert set(blocked) == {"reinforce", "vapo", "gmpo", "gfpo", "lambda_grpo", "cispo", "sapo"}
    assert all(setting and len(reason) > 20 for setting, reason in blocked.values())


def test_the_old_renderings_are_rejected(cli):
    """The check has teeth: a two-value flag written with `=`, a flag OpenRLHF lacks, a note as a flag."""
    argv = pasted_argv(openrlhf_run(preset("dapo")).command)[2:]
    for old, new in (("--actor.eps_clip_low_high 0.2 0.28", "--actor.eps_clip_low_high=0.2 0.28"),
                     ("--algo.dynamic_filtering_range 0 1", "--algo.dynamic_filtering_range=0 1")):
        text = shlex.join(argv).replace(shlex.join(shlex.split(old)), new)
        with pytest.raises(Rejected, match="expected 2 arguments"):
            parse(cli, shlex.split(text))
    for extra in (["--actor.policy_loss_type", "gmpo"], ["--note", "dynamic filtering drops..."]):
        with pytest.raises(Rejected):
            parse(cli, argv + extra)


def test_the_parser_checks_run(cli):
    """OpenRLHF's own checks after the parser run too: dynamic filtering without a remote reward is refused."""
    argv = pasted_argv(openrlhf_run(preset("dapo")).command)[2:]
    at = argv.index("--reward.remote_url")
    with pytest.raises(Rejected, match="remote_rm_url"):
        parse(cli, argv[:at] + argv[at + 2:])


# ---------------------------------------------------------------------------------------------------------------
# 3: what OpenRLHF computes under the parsed arguments
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def openrlhf(openrlhf_root):
    """OpenRLHF's losses, KL estimator and length penalties, imported from the release without its package
    ``__init__`` files and with a placeholder for DeepSpeed."""
    names = ["openrlhf", "openrlhf.models", "openrlhf.utils", "openrlhf.trainer", "openrlhf.trainer.ppo_utils"]
    with bare_packages(openrlhf_root, names, placeholders=("deepspeed",)):
        yield types.SimpleNamespace(loss=importlib.import_module("openrlhf.models.loss"),
                                    utils=importlib.import_module("openrlhf.models.utils"),
                                    length=importlib.import_module("openrlhf.trainer.ppo_utils.length_penalty"))


def openrlhf_actor_loss(openrlhf, args, old, logp, ref, advantages, mask, with_kl=True):
    """OpenRLHF's actor loss on one micro-batch that is the whole optimizer step, one GPU: ``PolicyLoss`` built
    from ``args`` as ``PolicyModelActor`` builds it, plus (``with_kl``) the KL term as its ``training_step`` adds
    it."""
    loss_fn = openrlhf.loss.PolicyLoss(clip_eps_low=args.actor.eps_clip_low_high[0],
                                       clip_eps_high=args.actor.eps_clip_low_high[1],
                                       dual_clip=args.actor.dual_clip,
                                       token_level_loss=args.actor.loss_agg_mode == "token-mean",
                                       policy_loss_type=args.actor.policy_loss_type)
    batch = dict(dp_size=1, batch_num_tokens=mask.sum().float(), global_batch_size=(mask.sum(-1) > 0).sum().float())
    token_advantages = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logp)
    loss = loss_fn(logp, old, token_advantages, action_mask=mask, **batch)[0]
    if with_kl and args.algo.kl.use_loss and args.algo.kl.init_coef > 0:
        kl = openrlhf.utils.compute_approx_kl(logp, ref, kl_estimator=args.algo.kl.estimator)
        loss = loss + openrlhf.loss.aggregate_loss(kl, mask, **batch) * args.algo.kl.init_coef
    return loss


@pytest.mark.parametrize("key", RUNNABLE)
def test_openrlhf_computes_the_books_loss(cli, openrlhf, key):
    c = CONFIGS[key]
    args, run, _ = parsed(cli, key)
    if "loss_type" in run.missing:  # the command says it runs another aggregation (dr_grpo's constant normaliser)
        assert c.loss_type == "dr_grpo"
        return
    kl_in_loss = c.beta > 0 and c.kl_placement == "loss"
    # ragged completions: the policy term; equal lengths: the KL term too (OpenRLHF averages it over tokens, which
    # is the book's per-completion mean only when the lengths are equal; the command's note says so)
    for lengths, with_kl in (([5, 3, 1, 4, 2, 5], False), ([4] * 6, kl_in_loss)):
        old, logp, ref, advantages, mask = small_batch(c, lengths)
        book, _ = policy_loss(logp, old, advantages, mask, epsilon=c.epsilon, epsilon_high=c.epsilon_high,
                              loss_type=c.loss_type, max_completion_length=c.max_completion_length,
                              beta=c.beta if with_kl else 0.0, ref_logp=ref if with_kl else None,
                              importance_sampling_level=c.importance_sampling_level)
        ours = openrlhf_actor_loss(openrlhf, args, old, logp, ref, advantages, mask, with_kl=with_kl)
        (book_grad,), (our_grad,) = torch.autograd.grad(book, logp), torch.autograd.grad(ours, logp)
        torch.testing.assert_close(ours, book, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(our_grad, book_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key", [k for k in RUNNABLE if CONFIGS[k].overlong_buffer_length is not None])
def test_openrlhf_overlong_penalty_is_the_books(cli, openrlhf, key):
    c = CONFIGS[key]
    args, _, _ = parsed(cli, key)
    budget = args.rollout.max_new_tokens
    lengths = torch.arange(1, budget + 1)
    experience = types.SimpleNamespace(response_length=lengths, rewards=torch.ones(budget))
    openrlhf.length.apply_overlong_penalty([experience], budget, args.reward.overlong_buffer_len,
                                           args.reward.overlong_penalty_factor)
    book = 1.0 + torch.as_tensor(soft_overlong_penalty(lengths.numpy(), c.max_completion_length,
                                                       c.overlong_buffer_length), dtype=torch.float32)
    torch.testing.assert_close(experience.rewards, book, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# the book shows exactly these commands
# ---------------------------------------------------------------------------------------------------------------

def test_the_chapter_shows_exactly_the_tested_commands():
    assert_the_chapter_shows_exactly(openrlhf_run)
