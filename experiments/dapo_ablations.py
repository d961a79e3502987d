"""Three DAPO ablations on the shipped base policies (Chapter "DAPO").

Each ablation switches one of DAPO's techniques on and off in the trainer's ``dapo`` preset, several seeds each, and
records per-step metrics:

- ``clip``: symmetric clipping (epsilon = epsilon_high = 0.2) against clip-higher (0.2 / 0.28) on the arithmetic
  policy, with four optimizer steps per rollout (so the later ones are off-policy and the clip acts). Records the
  entropy proxy ``neg_logp`` (mean -log pi of the sampled completion tokens) and the clip fractions.
- ``dynamic``: without and with dynamic sampling on the arithmetic policy. Records the fraction of groups whose
  rewards are all equal in the first generation round (``frac_reward_zero_std``), the informative groups the update
  trained on, and the generation rounds each step needed.
- ``overlong``: without and with overlong reward shaping (overlong filtering plus the soft overlong punishment) on
  the sort_scratchpad policy under a budget that cuts off its rambling answers. Records the truncation rate.

    python experiments/dapo_ablations.py            # writes experiments/results/dapo_ablations.json
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.objectives import masked_mean
from rlbook.paths import write_results
from rlbook.trainer import Trainer, preset

RESULTS = Path(__file__).parent / "results" / "dapo_ablations.json"
# Shared by every run: 8 prompts x G = 8 completions per step; DAPO's other techniques off unless the ablation
# switches them on (the rest of the "dapo" preset stays: token-level loss, no KL, group z-score advantages).
COMMON = dict(num_generations=8, per_device_train_batch_size=64, dynamic_sampling=False,
              mask_truncated_completions=False, overlong_buffer_length=None)
ABLATIONS = {
    "clip": dict(policy="arithmetic", steps=50, common=dict(learning_rate=3e-4, per_device_train_batch_size=16,
                                                            steps_per_generation=4),
                 arms={"symmetric": dict(epsilon_high=0.2), "clip_higher": dict(epsilon_high=0.28)}),
    "dynamic": dict(policy="arithmetic", steps=50, common=dict(learning_rate=5e-4),
                    arms={"off": dict(), "on": dict(dynamic_sampling=True, max_num_gen_batches=4)}),
    "overlong": dict(policy="sort_scratchpad", steps=30, common=dict(learning_rate=5e-4, max_completion_length=36,
                                                                per_device_train_batch_size=32),
                     arms={"off": dict(), "on": dict(mask_truncated_completions=True, overlong_buffer_length=9)}),
}
KEEP = ("reward", "accuracy", "completion_length", "truncated_frac", "frac_reward_zero_std", "gen_rounds",
        "num_groups", "clip_frac_low", "clip_frac_high", "neg_logp")


class EntropyProxyTrainer(Trainer):
    """The book's trainer plus one metric: ``neg_logp``, the mean of -log pi over the sampled completion tokens of
    the step's rollouts (a Monte Carlo estimate of the per-token entropy, at the sampling temperature)."""

    def _score(self, batch, *args, **kwargs):
        out = super()._score(batch, *args, **kwargs)
        out["metrics"]["neg_logp"] = masked_mean(-batch.logprobs, batch.completion_mask.float()).item()
        return out


def train_one(ablation: str, arm: str, seed: int, base, steps: int | None = None) -> dict:
    """One run of ``ablation``'s ``arm`` from a copy of ``base = (model, tokenizer)``: per-step metrics."""
    torch.set_num_threads(1)
    spec = ABLATIONS[ablation]
    recipe = RECIPES[spec["policy"]]
    settings = {"max_completion_length": recipe.sft.max_new_tokens, **COMMON, **spec["common"], **spec["arms"][arm]}
    config = preset("dapo", seed=seed, max_steps=steps or spec["steps"], **settings)
    trainer = EntropyProxyTrainer(copy.deepcopy(base[0]), base[1], recipe.make_task(), config)
    history = trainer.train(progress=False)
    return {key: [m[key] for m in history] for key in KEEP if key in history[0]}


def run(ablations=tuple(ABLATIONS), seeds=(0, 1, 2, 3, 4), steps: int | None = None) -> dict:
    out = {"seeds": list(seeds), "common": COMMON, "ablations": {}}
    for name in ablations:
        spec = ABLATIONS[name]
        base = load_base_policy(spec["policy"])  # loaded once: every run starts from the same weights
        out["ablations"][name] = {
            "policy": spec["policy"],
            "checkpoint_sha256": load_manifest(spec["policy"])["sha256"]["model.safetensors"],
            "settings": spec["common"], "arm_settings": spec["arms"], "steps": steps or spec["steps"],
            "runs": {arm: [train_one(name, arm, seed, base, steps) for seed in seeds] for arm in spec["arms"]},
        }
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ablations", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    write_results(args.out, lambda: run(tuple(args.ablations), seeds=tuple(range(args.seeds))))


if __name__ == "__main__":
    main()
