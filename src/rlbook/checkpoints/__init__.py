"""The base (reference) policies the book starts RL from, shipped inside the package, and how to rebuild them.

Each checkpoint is a tiny causal LM fine-tuned by :func:`rlbook.sft.train_sft` on the ``"train"`` split of one task
until its sampled accuracy on ``"test"`` problems has reached a target at ``stop_patience`` evaluations in a row, so
that RL has headroom. Load one with::

    from rlbook.checkpoints import load_base_policy
    model, tokenizer = load_base_policy("arithmetic")

Rebuild or check them (training runs on one CPU thread, seeded)::

    python -m rlbook.checkpoints build            # retrain and rewrite the shipped files and manifests
    python -m rlbook.checkpoints verify           # retrain into memory and check the recipe, not the bytes

A rebuild is the same bytes only on the same kind of CPU: other CPUs run other float kernels, the losses drift
apart after a few dozen steps, and training stops at another step with another model. So ``verify`` checks what
holds on every CPU: the shipped files match their manifest hashes and keep their recorded accuracy; the first
:data:`LOSS_HEAD_STEPS` SFT losses of a fresh run equal the recorded ones to :data:`LOSS_HEAD_RTOL` (which
catches a changed recipe); and the rebuild reaches its target and lands in the recipe's accuracy band.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import transformers

from rlbook.lm import build_model, build_tokenizer, count_parameters, load_policy, save_policy
from rlbook.lm.moe import training_route_digests
from rlbook.sft import SFTConfig, reached_target, sampled_accuracy, train_sft
from rlbook.tasks import get_task

MANIFEST = "manifest.json"
LOSS_HEAD_STEPS = 40  # float32 runs on different CPUs agree to ~3e-7 for about this many SFT steps
LOSS_HEAD_RTOL = 1e-5  # ... and a 2 % change of the learning rate moves them by far more than this
# A mixture of experts routes each token to its top-k experts, a discrete choice: where two experts' scores nearly
# tie, another CPU's rounding can swap them, and the loss then jumps by far more than rounding. Measured on the MoE
# recipe (40 steps, one thread): this machine's AVX-512 kernels and its AVX2 kernels repeat the recorded routing;
# torch's portable "default" kernels first route a token differently at step 38 (the loss at step 39 then differs
# by 1.8e-4 relative); a 2 % larger learning rate, at step 2. So an MoE's losses are compared up to the first step
# whose routing differs from the record (the manifest's sft_routing_head), and that step must come after
# ROUTING_HEAD_MIN_STEPS, half the head: a margin for CPUs that round further from this one.
ROUTING_HEAD_MIN_STEPS = 20
RECORDED_ACCURACY_ATOL = 0.02  # shipped files re-measured: the sampled tokens, hence the accuracy, may move a little


@dataclass(frozen=True)
class Recipe:
    """How one base policy is made: the task, the model, the SFT settings, and the accuracy band it must land in."""

    task: str
    task_kwargs: dict = field(default_factory=dict)
    size: str = "tiny"
    arch: str = "llama"
    model_seed: int = 0
    model_kwargs: dict = field(default_factory=dict)  # more build_model settings (a MoE's num_experts, ...)
    sft: SFTConfig = field(default_factory=SFTConfig)
    final_eval_size: int = 512  # "test" prompts for the accuracy recorded in the manifest (one sample each, T = 1)
    accuracy_band: tuple[float, float] = (0.3, 0.7)  # where that accuracy must lie: headroom for RL, above zero

    def make_task(self, **task_kwargs):
        """The :class:`rlbook.tasks.Task` this policy was trained on, with ``task_kwargs`` overriding its settings
        (e.g. ``incorrect_reward=-1.0`` for an organism's ±1 rewards)."""
        return get_task(self.task, **{**self.task_kwargs, **task_kwargs})


def final_sampled_accuracy(recipe: Recipe, model, tokenizer) -> float:
    """The accuracy recorded in a manifest: ``final_eval_size`` fixed ``"test"`` prompts, one sample each at T = 1."""
    task = recipe.make_task()
    examples = task.sample(recipe.final_eval_size, seed=np.random.default_rng(10_000 + recipe.sft.seed), split="test")
    return sampled_accuracy(model, tokenizer, task, examples, recipe.sft.max_new_tokens, seed=10_000)


RECIPES: dict[str, Recipe] = {
    "arithmetic": Recipe(
        task="arithmetic",
        task_kwargs={"num_digits": 2, "operations": "+"},
        sft=SFTConfig(max_steps=3000, batch_size=128, eval_every=25, stop_at_accuracy=0.45, max_new_tokens=8, seed=0),
    ),
    # Sums of 2-4-digit numbers, half the demonstrations with a least-significant-first scratchpad: the policy
    # chooses the length of its answers, and the scratchpad makes the longer sums right more often (GFPO's
    # organism, where RL has a reason to lengthen the right answers).
    "addition_scratchpad": Recipe(
        task="addition_scratchpad",
        task_kwargs={"min_digits": 2, "max_digits": 4, "scratchpad_rate": 0.5},
        sft=SFTConfig(max_steps=3000, batch_size=128, eval_every=25, stop_at_accuracy=0.4, max_new_tokens=18, seed=0),
    ),
    # The same task trained on until it is nearly solved: most groups of G samples are all right, so they carry no
    # gradient (the zero_gradient organism, DAPO's dynamic sampling).
    "arithmetic_solved": Recipe(
        task="arithmetic",
        task_kwargs={"num_digits": 2, "operations": "+"},
        sft=SFTConfig(max_steps=4000, batch_size=128, eval_every=25, stop_at_accuracy=0.9, max_new_tokens=8, seed=0),
        accuracy_band=(0.8, 0.97),
    ),
    "sort_scratchpad": Recipe(
        task="sort_digits",
        task_kwargs={"min_length": 3, "max_length": 6, "scratchpad": True},
        sft=SFTConfig(max_steps=3000, eval_every=25, stop_at_accuracy=0.35, max_new_tokens=40, seed=0),
    ),
    # The sort_scratchpad recipe on a mixture of experts (Qwen3-MoE: 16 experts a layer, 2 per token, no
    # load-balancing loss): the routing_drift organism (GSPO's Routing Replay), whose answers are long enough
    # (~40 tokens) for many tokens to be re-routed by an update.
    "sort_scratchpad_moe": Recipe(
        task="sort_digits",
        task_kwargs={"min_length": 3, "max_length": 6, "scratchpad": True},
        arch="qwen3_moe",
        model_kwargs={"num_experts": 16, "num_experts_per_tok": 2},
        sft=SFTConfig(max_steps=3000, eval_every=25, stop_at_accuracy=0.35, max_new_tokens=40, seed=0),
        accuracy_band=(0.25, 0.6),
    ),
    # The same task on a mixture of experts whose experts matter more to each token: 8 experts a layer, each as
    # wide as the dense MLP, one per token, weighted by the router's probability (not renormalised to 1). Sending a
    # position to its next-best expert moves the probability of the token it predicts about 200 times as much as
    # the other tokens' (a design probe, experiments/PLANS.md; about 30 times on sort_scratchpad_moe): the
    # routing_jumps organism, where re-routing makes GRPO's token ratios jump.
    "sort_scratchpad_moe_top1": Recipe(
        task="sort_digits",
        task_kwargs={"min_length": 3, "max_length": 6, "scratchpad": True},
        arch="qwen3_moe",
        model_kwargs={"num_experts": 8, "num_experts_per_tok": 1, "moe_intermediate_size": 192,
                      "norm_topk_prob": False},
        sft=SFTConfig(max_steps=3000, eval_every=25, stop_at_accuracy=0.4, max_new_tokens=40, seed=0),
        accuracy_band=(0.3, 0.7),
    ),
    # The long-horizon organism's policy (PPO's lambda, VAPO): 12-24 dependent steps, 71-143 tokens. The chain is
    # learned abruptly (a first build, measured every 25 steps: 0.14 at SFT step 250, 0.42 at 275, 0.63 at 300), so
    # accuracy is measured every 10 steps to stop inside the band.
    "lagged_sum": Recipe(
        task="lagged_sum",
        sft=SFTConfig(max_steps=2000, eval_every=10, stop_at_accuracy=0.3, max_new_tokens=146, seed=0),
        accuracy_band=(0.2, 0.6),
    ),
    "constraint_string": Recipe(
        task="constraint_string",
        sft=SFTConfig(max_steps=3000, eval_every=50, stop_at_accuracy=0.35, max_new_tokens=16, seed=0),
    ),
}


def checkpoint_dir(name: str) -> Path:
    """The folder of a shipped checkpoint inside the installed package."""
    if name not in RECIPES:
        raise ValueError(f"unknown base policy {name!r}; choose one of {sorted(RECIPES)}")
    return Path(str(resources.files("rlbook.checkpoints") / name))


def load_base_policy(name: str, device=None):
    """``(model, tokenizer)`` of the shipped base policy ``name`` (see :data:`RECIPES`), in eval mode."""
    path = checkpoint_dir(name)
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"checkpoint {name!r} is missing from {path}; run `python -m rlbook.checkpoints build`")
    return load_policy(path, device=device if device is not None else "cpu")


def load_manifest(name: str) -> dict:
    """What was recorded when checkpoint ``name`` was built: recipe, steps, losses, accuracies, file hashes."""
    return json.loads((checkpoint_dir(name) / MANIFEST).read_text())


def train_base_policy(recipe: Recipe, max_steps: int | None = None, routes: list | None = None):
    """Train ``recipe`` from scratch on one CPU thread; returns ``(model, tokenizer, history)``.

    ``max_steps`` cuts the run short (no stop rule) for the cheap loss-head check; ``routes``, a list, receives one
    digest of the experts chosen at each training step of a mixture-of-experts model
    (:func:`rlbook.lm.moe.training_route_digests`; nothing for a dense one).
    """
    config = recipe.sft
    if max_steps is not None:
        config = dataclasses.replace(config, max_steps=max_steps, stop_at_accuracy=None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # float reductions in a fixed order: the same bytes on every run on this CPU
    try:
        tokenizer = build_tokenizer()
        model = build_model(recipe.size, arch=recipe.arch, seed=recipe.model_seed, **recipe.model_kwargs)
        with torch.random.fork_rng(devices=[]), training_route_digests(model) as digests:
            torch.manual_seed(config.seed)
            history = train_sft(model, tokenizer, recipe.make_task(), config)
        if routes is not None:
            routes.extend(digests)
    finally:
        torch.set_num_threads(threads)
    return model, tokenizer, history


def sft_loss_head(recipe: Recipe, steps: int = LOSS_HEAD_STEPS) -> list[float]:
    """The first ``steps`` SFT losses of a fresh run of ``recipe`` (a few seconds)."""
    return sft_head(recipe, steps)[0]


def sft_head(recipe: Recipe, steps: int = LOSS_HEAD_STEPS) -> tuple[list[float], list[str]]:
    """The first ``steps`` SFT losses of a fresh run of ``recipe`` and, for a mixture of experts, the digest of
    each step's expert choices (an empty list for a dense model)."""
    routes: list[str] = []
    losses = train_base_policy(recipe, max_steps=steps, routes=routes)[2].losses
    return losses, routes[:steps]


def first_routing_difference(routes, recorded) -> int | None:
    """The first step (1-based) whose routing digest differs from ``recorded``'s, or None."""
    return next((step for step, (a, b) in enumerate(zip(routes, recorded), start=1) if a != b),
                None if len(routes) == len(recorded) else min(len(routes), len(recorded)) + 1)


def loss_head_mismatches(losses, recorded, rtol: float = LOSS_HEAD_RTOL, routes=None,
                         recorded_routes=None) -> list[int]:
    """The steps (1-based) where ``losses`` and ``recorded`` differ by more than ``rtol`` relative (or in count).

    With the routing digests of both runs (a mixture of experts), the losses are compared only before the first
    step whose routing differs, and a routing difference at or before :data:`ROUTING_HEAD_MIN_STEPS` is itself a
    mismatch (that step is returned): rounding flips a near-tied routing decision late, a changed recipe early."""
    if len(losses) != len(recorded):
        return list(range(1, max(len(losses), len(recorded)) + 1))
    compared = len(losses)
    early = []
    if routes is not None and recorded_routes is not None:
        first = first_routing_difference(routes, recorded_routes)
        if first is not None:
            compared = min(compared, first - 1)
            early = [first] if first <= ROUTING_HEAD_MIN_STEPS else []
    mismatched = [step for step, (a, b) in enumerate(zip(losses[:compared], recorded[:compared]), start=1)
                  if not np.isclose(a, b, rtol=rtol, atol=0.0)]
    return sorted(set(mismatched + early))


def build_checkpoint(name: str, out_dir: str | Path) -> dict:
    """Train base policy ``name`` from its recipe and save it in ``out_dir``; returns the manifest it writes."""
    recipe = RECIPES[name]
    out_dir = Path(out_dir)
    routes: list[str] = []
    model, tokenizer, history = train_base_policy(recipe, routes=routes)
    save_policy(model, tokenizer, out_dir)
    manifest = {
        "name": name,
        "recipe": asdict(recipe),
        "parameters": count_parameters(model),
        "sft_steps": history.steps,
        "targets": {"stop_at_accuracy": recipe.sft.stop_at_accuracy, "stop_patience": recipe.sft.stop_patience,
                    "accuracy_band": list(recipe.accuracy_band), "loss_head_rtol": LOSS_HEAD_RTOL},
        "reached_target": reached_target(history, recipe.sft),
        "sft_loss_head": history.losses[:LOSS_HEAD_STEPS],
        **({"sft_routing_head": routes[:LOSS_HEAD_STEPS]} if routes else {}),
        "sft_final_loss": history.losses[-1],
        "eval_steps": history.eval_steps,
        "eval_accuracy": history.eval_accuracy,
        "final_sampled_accuracy": final_sampled_accuracy(recipe, model, tokenizer),
        "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__},
        "sha256": file_hashes(out_dir),  # integrity of the shipped files (a rebuild on another CPU differs)
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_shipped(name: str) -> list[str]:
    """What is wrong with the shipped files of ``name``: hashes, or a recorded accuracy they no longer reach."""
    manifest, problems = load_manifest(name), []
    if file_hashes(checkpoint_dir(name)) != manifest["sha256"]:
        problems.append("shipped files differ from their manifest's sha256")
    accuracy = final_sampled_accuracy(RECIPES[name], *load_base_policy(name))
    if not np.isclose(accuracy, manifest["final_sampled_accuracy"], rtol=0.0, atol=RECORDED_ACCURACY_ATOL):
        problems.append(f"shipped accuracy {accuracy:.3f} is not the recorded {manifest['final_sampled_accuracy']:.3f}")
    return problems


def check_rebuild(name: str) -> tuple[list[str], dict]:
    """Retrain ``name`` in memory and check it against its recipe and manifest; returns ``(problems, measured)``."""
    recipe, manifest = RECIPES[name], load_manifest(name)
    routes: list[str] = []
    model, tokenizer, history = train_base_policy(recipe, routes=routes)
    accuracy = final_sampled_accuracy(recipe, model, tokenizer)
    problems = []
    mismatches = loss_head_mismatches(history.losses[:LOSS_HEAD_STEPS], manifest["sft_loss_head"],
                                      routes=routes[:LOSS_HEAD_STEPS] if routes else None,
                                      recorded_routes=manifest.get("sft_routing_head"))
    if mismatches:
        problems.append(f"SFT losses differ from the manifest by more than {LOSS_HEAD_RTOL:g} relative at steps "
                        f"{mismatches[:5]}{' ...' if len(mismatches) > 5 else ''}")
    if not reached_target(history, recipe.sft):
        problems.append(f"never reached accuracy {recipe.sft.stop_at_accuracy} at {recipe.sft.stop_patience} "
                        f"evaluations in a row within {recipe.sft.max_steps} steps")
    low, high = recipe.accuracy_band
    if not low <= accuracy <= high:
        problems.append(f"final sampled accuracy {accuracy:.3f} is outside the band [{low}, {high}]")
    return problems, {"sft_steps": history.steps, "final_sampled_accuracy": accuracy}


def file_hashes(folder: str | Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` except the manifest, by file name."""
    folder = Path(folder)
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != MANIFEST
    }
