"""GMPO against GRPO with several updates per rollout, so that the ratios move (Chapter "GMPO").

Policy and task: the shipped arithmetic base policy (``load_base_policy("arithmetic")``, 2-digit additions).
Every run reuses each rollout for ``steps_per_generation=4`` minibatches x ``num_iterations=2`` passes, i.e. eight
gradient updates per rollout, so that the token ratios rho = pi_new / pi_old drift away from 1 within a step, at
two learning rates: 2e-4 (plain names) and 5e-4 (``_fast``: the top of the range that works on these policies at
one update per rollout). Three methods at each, no KL term in any:

- ``grpo``: GRPO's token-level arithmetic-mean loss, clip (0.8, 1.2);
- ``grpo_wide``: the same loss with GMPO's clip range written in ratio space, (e^-0.4, e^0.4) = (0.670, 1.492),
  so that it differs from GMPO in the mean alone;
- ``gmpo``: the trainer's ``gmpo`` preset (geometric mean of the token ratios, clipped in log space at +-0.4).

Logged per step (means over the step's updates unless noted): reward, ``clip_frac``, ``approx_kl``, the extreme
token ratios seen during the updates (``ratio_min``/``ratio_max``), and, after the step's eight updates, the spread
of the rollout's log-ratios under the updated policy: the largest |log rho_t| over tokens (``max_abs_token``) and
the largest |mean_t log rho_t| over completions (``max_abs_sequence``, the log of the geometric-mean ratio).
Held-out accuracy every ``eval_every`` steps.

    python experiments/gmpo_stability.py            # writes experiments/results/gmpo_stability.json
"""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.paths import write_results
from rlbook.rollout import sequence_logprobs
from rlbook.trainer import Trainer, preset

RESULTS = Path(__file__).parent / "results" / "gmpo_stability.json"
TASK = "arithmetic"
COMMON = dict(num_generations=8, per_device_train_batch_size=32, steps_per_generation=4, num_iterations=2,
              beta=0.0, eval_every=20, eval_size=256)
WIDE = dict(epsilon=round(1 - math.exp(-0.4), 6), epsilon_high=round(math.exp(0.4) - 1, 6))  # (e^-0.4, e^0.4)
LEARNING_RATES = {"": 2e-4, "_fast": 5e-4}
ARMS = {
    f"{name}{tag}": dict(preset=spec["preset"], settings={**spec["settings"], "learning_rate": lr})
    for tag, lr in LEARNING_RATES.items()
    for name, spec in {"grpo": dict(preset="grpo", settings=dict(epsilon=0.2)),
                       "grpo_wide": dict(preset="grpo", settings=WIDE),
                       "gmpo": dict(preset="gmpo", settings=dict())}.items()
}
STEPS = 100
KEEP = ("reward", "clip_frac", "approx_kl", "ratio_min", "ratio_max", "max_abs_token", "max_abs_sequence")


class RatioTrainer(Trainer):
    """The book's trainer plus the post-update log-ratio spread of the module docstring."""

    def _update(self, rollout: dict, value_only: bool = False) -> dict:
        metrics = super()._update(rollout, value_only)
        ids, attn, mask = rollout["input_ids"], rollout["attention_mask"], rollout["mask"]
        with torch.no_grad():
            new_logp = sequence_logprobs(self.policy, ids, attn, mask, temperature=self.config.temperature)
        log_ratio = (new_logp - rollout["old_logp"]) * mask
        metrics["max_abs_token"] = float(log_ratio[mask.bool()].abs().max())
        metrics["max_abs_sequence"] = float((log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)).abs().max())
        return metrics


def train_one(arm: str, seed: int, base, steps: int = STEPS, common: dict = COMMON) -> dict:
    """One run of ``arm`` from a copy of ``base = (model, tokenizer)``: per-step metrics and the eval curve."""
    torch.set_num_threads(1)
    spec = ARMS[arm]
    recipe = RECIPES[TASK]
    config = preset(spec["preset"], max_completion_length=recipe.sft.max_new_tokens, seed=seed, max_steps=steps,
                    **common, **spec["settings"])
    trainer = RatioTrainer(copy.deepcopy(base[0]), base[1], recipe.make_task(), config)
    eval_steps, eval_accuracy = trainer.train_with_eval_curve()
    run = {key: [m.get(key) for m in trainer.history] for key in KEEP}
    return {**run, "eval_steps": eval_steps, "eval_accuracy": eval_accuracy}


def run(arms=tuple(ARMS), seeds=(0, 1, 2, 3, 4), steps: int = STEPS, **overrides) -> dict:
    """All ``arms`` x ``seeds``; ``overrides`` change COMMON (for the reduced test run)."""
    common = {**COMMON, **overrides}
    base = load_base_policy(TASK)
    return {
        "task": TASK, "seeds": list(seeds), "steps": steps, "common": common, "arms": ARMS,
        "checkpoint_sha256": load_manifest(TASK)["sha256"]["model.safetensors"],
        "runs": {arm: [train_one(arm, seed, base, steps, common) for seed in seeds] for arm in arms},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    write_results(args.out, lambda: run(arms=tuple(args.arms), seeds=tuple(range(args.seeds)), steps=args.steps))


if __name__ == "__main__":
    main()
