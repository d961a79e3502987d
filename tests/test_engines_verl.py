"""verl accepts every verl command the book prints, and computes the book's loss under it (rlbook.integrations.engines).

The release the commands are pinned to (``VERL_VERSION``) is installed from PyPI without its dependencies, once, into
``<venv>/engine-wheels/``; the test is skipped with one line when pip cannot reach the package index. For every preset
(and a few configs that reach the other branches):

1. the command runs through bash as a reader pastes it (``python3`` replaced by a function that prints its
   arguments), so the shell variables of the cluster block expand as they would;
2. Hydra composes verl's own ``verl/trainer/config/ppo_trainer.yaml`` under the arguments: an unknown key, or a
   line that is not an option, fails here (only ``reward.reward_kwargs`` may be added with ``+``); every value reads
   back from the composed config, and the preset's settings are there in verl's units;
3. verl's own ``validate_config`` passes (what ``main_ppo`` checks before it starts Ray: the micro-batch sizes, the
   batch's division over the GPUs), and its dataclass configs build;
4. verl's policy loss (``core_algos``, as ``verl.workers.utils.losses.ppo_loss`` composes it), under the composed
   actor config, equals the book's ``rlbook.objectives.policy_loss`` in value and gradient on a small batch with a
   ratio that verl's default dual clip would cut; its advantage estimator equals the book's; DAPO's reward manager
   runs on the composed config and gives the book's soft overlong punishment.

verl's Python is imported without Ray or its other heavy dependencies (``STUBBED`` modules are placeholders, only
while this file's tests run); nothing starts a job, and nothing here has run on a GPU.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import math
import re
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch

pytest.importorskip("hydra", reason="hydra-core is in requirements.txt")
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from engine_releases import (CONFIGS, assert_the_chapter_shows_exactly, install_release, pasted_argv,  # noqa: E402
                             small_batch)
from rlbook.integrations.engines import VERL_VERSION, verl_run  # noqa: E402
from rlbook.objectives import gae, group_advantages, leave_one_out_advantages, masked_whiten, policy_loss  # noqa: E402
from rlbook.presets import PRESETS, preset  # noqa: E402
from rlbook.tasks.shaping import soft_overlong_penalty  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCAL_MODEL = ROOT / "src" / "rlbook" / "checkpoints" / "arithmetic"  # a Llama config and tokenizer on disk
# the presets and the configs beyond them (engine_releases.CONFIGS) that this engine can run
RUNNABLE = sorted(key for key, c in CONFIGS.items() if verl_run(c).command is not None)
# verl's imports that this test replaces by placeholders (Ray, its tensor and queue libraries, timers)
STUBBED = ("ray", "tensordict", "codetiming", "orjson", "transfer_queue", "hdfs_io")
pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator")


# ---------------------------------------------------------------------------------------------------------------
# the release, the shell, verl's Python
# ---------------------------------------------------------------------------------------------------------------

class _Placeholders(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the :data:`STUBBED` packages that are not installed return placeholder modules."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module):
        pass


@pytest.fixture(scope="module")
def verl_root():
    return install_release("verl", VERL_VERSION)


@pytest.fixture(scope="module")
def verl(verl_root):
    """verl's config validation, trainer utilities, core algorithms and reward managers, imported from the
    installed release with its package ``__init__`` files skipped (they import Ray) and placeholders for the
    :data:`STUBBED` packages; all of it is removed again afterwards."""
    missing = [name for name in STUBBED if importlib.util.find_spec(name) is None]
    finder = _Placeholders(missing)
    before = set(sys.modules)
    sys.meta_path.insert(0, finder)

    def bare_package(name, **attributes):
        module = types.ModuleType(name)
        module.__path__ = [str(verl_root.joinpath(*name.split(".")))]
        module.__dict__.update(attributes)
        sys.modules[name] = module
        return module

    try:
        # verl/__init__.py imports verl.protocol (Ray); its DataProto appears in annotations only
        bare_package("verl", DataProto=type("DataProto", (), {}))
        for name in ("verl.experimental", "verl.experimental.reward_loop",
                     "verl.experimental.reward_loop.reward_manager"):
            bare_package(name)
        registry = importlib.import_module("verl.experimental.reward_loop.reward_manager.registry")
        managers = sys.modules["verl.experimental.reward_loop.reward_manager"]
        managers.register, managers.get_reward_manager_cls = registry.register, registry.get_reward_manager_cls
        dapo = importlib.import_module("verl.experimental.reward_loop.reward_manager.dapo")
        importlib.import_module("verl.experimental.reward_loop.reward_manager.naive")
        yield types.SimpleNamespace(
            root=verl_root,
            config=importlib.import_module("verl.utils.config"),
            utils=importlib.import_module("verl.trainer.ppo.utils"),
            core_algos=importlib.import_module("verl.trainer.ppo.core_algos"),
            registry=registry,
            dapo_source=Path(dapo.__file__).read_text(),
        )
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            if name.split(".")[0] in {"verl", *missing}:
                del sys.modules[name]


def compose_verl(verl, overrides: list[str]):
    """verl's trainer config (ppo_trainer.yaml) composed by Hydra under ``overrides``, as main_ppo composes it."""
    with initialize_config_dir(config_dir=str(verl.root / "verl" / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def composed(verl, key):
    """``(config, run, overrides)`` of ``CONFIGS[key]``: the command through bash, composed by Hydra."""
    run = verl_run(CONFIGS[key])
    argv = pasted_argv(run.command)
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"], argv[:2]
    return compose_verl(verl, argv[2:]), run, argv[2:]


# ---------------------------------------------------------------------------------------------------------------
# 1-2: the command parses, and the composed config holds the preset
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RUNNABLE)
def test_verl_composes_the_command_and_reads_it_back(verl, key):
    c = CONFIGS[key]
    cfg, run, overrides = composed(verl, key)
    parsed = OverridesParser.create().parse_overrides(overrides)
    for override in parsed:
        key_name = override.key_or_group
        added = override.is_add()
        assert not added or key_name.startswith("reward.reward_kwargs."), f"{key_name}: only reward_kwargs is new"
        value = OmegaConf.select(cfg, key_name, throw_on_missing=True)
        assert value == override.value(), f"{key_name} reads back {value!r}, the command set {override.value()!r}"
    # the preset, in verl's units (verl counts prompts; its optimizer step is ppo_mini_batch_size prompts)
    actor, rollout, algorithm = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.algorithm
    G = c.num_generations
    assert rollout.n == G and rollout.temperature == c.temperature
    assert cfg.data.max_response_length == c.max_completion_length
    assert cfg.data.train_batch_size * G == c.generation_batch_size
    assert actor.ppo_mini_batch_size * G == c.per_device_train_batch_size * c.gradient_accumulation_steps
    assert actor.ppo_epochs == c.num_iterations
    high = c.epsilon if c.epsilon_high is None else c.epsilon_high
    if c.loss_type == "cispo":  # verl's weight in [1 - low, 1 + high], the book's (TRL's) below epsilon_high
        assert actor.policy_loss.loss_mode == "cispo" and actor.clip_ratio_low == 1
        assert math.isclose(1 + actor.clip_ratio_high, high)
    elif c.loss_type == "sapo":  # no clip: the gate's temperatures
        assert actor.policy_loss.loss_mode == "sapo"
        assert (actor.tau_pos, actor.tau_neg) == (c.sapo_temperature_pos, c.sapo_temperature_neg)
    else:
        assert math.isclose(actor.clip_ratio_low, c.epsilon)
        assert math.isclose(actor.clip_ratio_high, high)
    optim = actor.optim
    assert (optim.lr, optim.weight_decay, optim.clip_grad) == (c.learning_rate, c.weight_decay, c.max_grad_norm)
    assert list(optim.betas) == [0.9, 0.999] and optim.lr_scheduler_type == "constant"
    assert optim.lr_warmup_steps_ratio == 0 and optim.lr_warmup_steps <= 0
    assert cfg.trainer.total_training_steps == c.max_steps + c.value_pretrain_steps
    assert cfg.trainer.critic_warmup == (c.value_pretrain_steps + 1 if c.value_pretrain_steps else 0)
    assert actor.use_kl_loss == (c.beta > 0 and c.kl_placement == "loss")
    assert algorithm.use_kl_in_reward == (c.beta > 0 and c.kl_placement == "reward")
    if actor.use_kl_loss:
        assert actor.kl_loss_coef == c.beta
    if algorithm.use_kl_in_reward:
        assert algorithm.kl_ctrl.kl_coef == c.beta and algorithm.kl_penalty == "kl"
    if actor.policy_loss.loss_mode == "vanilla":  # dual clip off: above every ratio verl computes (e^20)
        assert actor.clip_ratio_c > math.exp(20)
    critic = c.advantage_estimator == "gae"
    assert verl.utils.need_critic(cfg) == critic
    if critic:
        assert cfg.critic.model.path == cfg.actor_rollout_ref.model.path
        assert (cfg.critic.optim.lr, cfg.critic.optim.weight_decay) == (c.learning_rate, c.weight_decay)
        assert cfg.critic.cliprange_value == c.cliprange_value
    assert verl.utils.need_reference_policy(cfg) == (c.beta > 0)
    if c.dynamic_sampling:  # nothing the trainer would ignore with a warning, nor the gen_batch_size it overrides
        assert algorithm.filter_groups.enable and algorithm.filter_groups.max_num_gen_batches <= 0
        assert cfg.data.gen_batch_size is None
    # every option the run lists is on the command line, and the command holds nothing else
    assert [o.split("=", 1)[0] for o in overrides] == list(run.options)


def test_presets_verl_cannot_run_have_no_command():
    """A command without its estimator (or surrogate) would run another algorithm: there is none, and a reason."""
    blocked = {name: verl_run(preset(name)).blocked for name in PRESETS if verl_run(preset(name)).command is None}
    assert set(blocked) == {"reinforce", "vapo", "gfpo", "lambda_grpo"}
    assert all(setting and len(reason) > 20 for setting, reason in blocked.values())


def test_a_note_or_an_unknown_key_fails_to_compose(verl):
    """The check has teeth: the lines the old table printed as options are rejected."""
    good = pasted_argv(verl_run(preset("grpo")).command)[2:]
    for bad in ("note=verl's gspo is the GSPO-token form", "value_pretrain_steps=trainer.critic_warmup=50",
                "actor_rollout_ref.actor.router_replay.mode=R2"):
        with pytest.raises(Exception, match="override|Could not|key"):
            compose_verl(verl, good + [bad])


# ---------------------------------------------------------------------------------------------------------------
# 3: verl's own validation and dataclasses
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RUNNABLE)
def test_verl_validates_the_composed_config(verl, key):
    cfg, _, _ = composed(verl, key)
    if verl.utils.need_critic(cfg):
        # the critic's config loads its model's config and tokenizer: a local Llama stands in for $MODEL
        cfg.critic.model.path = str(LOCAL_MODEL)
    verl.config.validate_config(cfg, use_reference_policy=verl.utils.need_reference_policy(cfg),
                                use_critic=verl.utils.need_critic(cfg))
    algorithm = verl.config.omega_conf_to_dataclass(cfg.algorithm)
    assert algorithm.adv_estimator == cfg.algorithm.adv_estimator
    verl.config.omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    verl.core_algos.get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    verl.core_algos.get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    if algorithm.use_kl_in_reward:
        verl.core_algos.get_kl_controller(algorithm.kl_ctrl)


def test_a_missing_micro_batch_size_fails_validation(verl):
    """What the old table left out: without the micro-batch sizes verl does not start."""
    argv = [a for a in pasted_argv(verl_run(preset("grpo")).command)[2:] if "micro_batch_size" not in a]
    cfg = compose_verl(verl, argv)
    with pytest.raises(Exception, match="micro_batch_size"):  # hydra wraps verl's AssertionError
        verl.config.validate_config(cfg, use_reference_policy=True, use_critic=False)


# ---------------------------------------------------------------------------------------------------------------
# 4: what verl computes under the composed config
# ---------------------------------------------------------------------------------------------------------------

def verl_actor_loss(verl, actor, old, logp, ref, advantages, mask):
    """verl's actor loss on one micro-batch that is the whole optimizer step, one GPU: the policy loss of
    ``actor.policy_loss.loss_mode`` plus the KL term, as verl.workers.utils.losses.ppo_loss composes them."""
    ca = verl.core_algos
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()),
                                   global_batch_size=int((mask.sum(-1) > 0).sum()),
                                   loss_scale_factor=actor.loss_scale_factor)
    token_advantages = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logp)
    loss, _ = ca.get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old, log_prob=logp, advantages=token_advantages, response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=None)
    if actor.use_kl_loss:
        kl = ca.kl_penalty(logprob=logp, ref_logprob=ref, kl_penalty=actor.kl_loss_type)
        loss = loss + ca.agg_loss(loss_mat=kl, loss_mask=mask, loss_agg_mode=actor.loss_agg_mode,
                                  **actor.global_batch_info) * actor.kl_loss_coef
    return loss


@pytest.mark.parametrize("key", RUNNABLE)
def test_verl_computes_the_books_loss(verl, key):
    c = CONFIGS[key]
    cfg, _, _ = composed(verl, key)
    actor = verl.config.omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    old, logp, ref, advantages, mask = small_batch(c, [5, 3, 1, 4, 2, 5])
    kl_in_loss = c.beta > 0 and c.kl_placement == "loss"
    # one micro-batch is the whole optimizer step here, so the book's micro-batch means are the step's. Clip-Cov
    # draws its tokens at random, verl from torch's global generator: both draw from the same seed
    variants = {name: getattr(c, name) for name in ("covariance_method", "clip_cov_ratio", "clip_cov_lb",
                                                    "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef",
                                                    "sapo_temperature_pos", "sapo_temperature_neg")}
    torch.manual_seed(0)
    book, _ = policy_loss(logp, old, advantages, mask, epsilon=c.epsilon, epsilon_high=c.epsilon_high,
                          loss_type=c.loss_type, max_completion_length=c.max_completion_length,
                          beta=c.beta if kl_in_loss else 0.0, ref_logp=ref if kl_in_loss else None,
                          importance_sampling_level=c.importance_sampling_level, **variants)
    torch.manual_seed(0)
    ours = verl_actor_loss(verl, actor, old, logp, ref, advantages, mask)
    (book_grad,), (verl_grad,) = torch.autograd.grad(book, logp), torch.autograd.grad(ours, logp)
    torch.testing.assert_close(ours, book, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(verl_grad, book_grad, rtol=1e-5, atol=1e-6)
    if c.covariance_method is not None:  # the method acted on this batch: not PPO-Clip's loss
        plain, _ = policy_loss(logp, old, advantages, mask, epsilon=c.epsilon, epsilon_high=c.epsilon_high,
                               loss_type=c.loss_type, max_completion_length=c.max_completion_length)
        assert not torch.allclose(plain, book, rtol=1e-4, atol=1e-5)
    # and the settings the command changes matter on this batch: verl's default dual clip, or CISPO's cap read as
    # verl's clip_ratio_high unchanged (1 + epsilon_high), would not give the book's loss
    changed = {"vanilla": {"clip_ratio_c": 3.0}, "cispo": {"clip_ratio_high": c.epsilon_high}}
    if actor.policy_loss.loss_mode in changed:
        other = verl.config.omega_conf_to_dataclass(OmegaConf.merge(cfg.actor_rollout_ref.actor,
                                                                    changed[actor.policy_loss.loss_mode]))
        assert not torch.allclose(verl_actor_loss(verl, other, old, logp, ref, advantages, mask), book,
                                  rtol=1e-3, atol=1e-4)


def test_verl_sapo_reads_the_temperatures_from_the_command(verl):
    """The sapo preset's temperatures are verl's defaults too; other ones must reach verl's loss through the
    command (tau_pos, tau_neg) and give the book's loss, which the defaults would not."""
    c = preset("sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=3.0)
    cfg = compose_verl(verl, pasted_argv(verl_run(c).command)[2:])
    actor = verl.config.omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    old, logp, ref, advantages, mask = small_batch(c, [5, 3, 1, 4, 2, 5])
    book, _ = policy_loss(logp, old, advantages, mask, loss_type="sapo", sapo_temperature_pos=0.5,
                          sapo_temperature_neg=3.0)
    ours = verl_actor_loss(verl, actor, old, logp, ref, advantages, mask)
    (book_grad,), (verl_grad,) = torch.autograd.grad(book, logp), torch.autograd.grad(ours, logp)
    torch.testing.assert_close(ours, book, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(verl_grad, book_grad, rtol=1e-5, atol=1e-6)
    default = verl.config.omega_conf_to_dataclass(OmegaConf.merge(cfg.actor_rollout_ref.actor,
                                                                  {"tau_pos": 1.0, "tau_neg": 1.05}))
    assert not torch.allclose(verl_actor_loss(verl, default, old, logp, ref, advantages, mask), book,
                              rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("key", RUNNABLE)
def test_verl_computes_the_books_advantages(verl, key):
    c = CONFIGS[key]
    cfg, _, _ = composed(verl, key)
    ca, G = verl.core_algos, c.num_generations
    g = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 2, (3 * G,), generator=g).float() + 0.1 * torch.rand(3 * G, generator=g)
    mask = torch.ones(3 * G, 4, dtype=torch.bool)
    token_rewards = torch.zeros(3 * G, 4)
    token_rewards[:, -1] = rewards
    index = [str(i // G) for i in range(3 * G)]
    name = cfg.algorithm.adv_estimator
    if name == "gae":
        values = torch.randn(3 * G, 4, generator=g)
        ours, returns = ca.compute_gae_advantage_return(token_level_rewards=token_rewards, values=values,
                                                        response_mask=mask.float(), gamma=cfg.algorithm.gamma,
                                                        lam=cfg.algorithm.lam)
        book, book_returns = gae(token_rewards, values, mask, c.gamma, c.lam)
        torch.testing.assert_close(returns, book_returns, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours, masked_whiten(book, mask), rtol=1e-4, atol=1e-4)
        return
    if name == "grpo":
        ours, _ = ca.compute_grpo_outcome_advantage(token_level_rewards=token_rewards, response_mask=mask,
                                                    index=index,
                                                    norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
        scale = "none" if c.advantage_estimator == "group_mean" else c.scale_rewards
        book = group_advantages(rewards, G, scale_rewards=scale)
    else:
        ours, _ = ca.get_adv_estimator_fn(name)(token_level_rewards=token_rewards, response_mask=mask, index=index,
                                                 config=verl.config.omega_conf_to_dataclass(cfg.algorithm))
        book = leave_one_out_advantages(rewards, G)
    # verl adds 1e-6 to a group's std where the book adds 1e-4 (the notes say so): equal to 1e-3 relative here
    torch.testing.assert_close(ours[:, 0], book, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("key", [k for k in RUNNABLE if CONFIGS[k].overlong_buffer_length is not None])
def test_verl_dapo_reward_manager_runs_and_gives_the_books_penalty(verl, key):
    c = CONFIGS[key]
    cfg, _, _ = composed(verl, key)
    # every setting of overlong_buffer_cfg the manager reads (from its source) is set by the command
    read = set(re.findall(r"overlong_buffer_cfg\.(\w+)", verl.dapo_source))
    assert read and read <= set(cfg.reward.reward_kwargs.overlong_buffer_cfg), read
    assert cfg.reward.reward_kwargs.max_resp_len == cfg.data.max_response_length
    manager = verl.registry.get_reward_manager_cls(cfg.reward.reward_manager.name)(
        cfg, _Characters(), lambda **kwargs: 1.0)
    budget = cfg.data.max_response_length
    for length in range(1, budget + 1):
        result = manager.loop.run_until_complete(manager.run_single(_Completion(length, budget)))
        expected = 1.0 + float(soft_overlong_penalty([length], c.max_completion_length, c.overlong_buffer_length)[0])
        assert math.isclose(float(result["reward_score"]), expected, abs_tol=1e-9), (length, result)


def test_every_named_reward_manager_is_registered(verl):
    names = {verl_run(c).options.get("reward.reward_manager.name") for c in CONFIGS.values()} - {None}
    assert names <= set(verl.registry.REWARD_MANAGER), names


class _Characters:
    """A tokenizer whose text is one character a token."""

    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


class _Completion:
    """One rollout as DAPORewardManager.run_single reads it: ``length`` response tokens of ``budget``."""

    def __init__(self, length, budget):
        prompt = torch.ones(3, dtype=torch.long)
        self.batch = {"responses": torch.ones(budget, dtype=torch.long),
                      "attention_mask": torch.cat([prompt, torch.ones(length, dtype=torch.long),
                                                   torch.zeros(budget - length, dtype=torch.long)])}
        self.non_tensor_batch = {"data_source": "arithmetic", "reward_model": {"ground_truth": "1"}}

    def __getitem__(self, index):
        return self


# ---------------------------------------------------------------------------------------------------------------
# the book shows exactly these commands
# ---------------------------------------------------------------------------------------------------------------

def test_the_chapter_shows_exactly_the_tested_commands():
    assert_the_chapter_shows_exactly(verl_run)
