"""Learnable λ against the three fixed aggregations (Chapter "λ-GRPO: learning the aggregation").

Trains the shipped ``sort_scratchpad`` base policy (the task of the book with the longest and most varied
completions: a scratchpad of insertion-sort passes, then the answer) with four settings that differ *only* in how
the token losses are aggregated; everything else is the trainer's ``lambda_grpo`` preset (group z-score advantages,
ε = 0.2, no KL, one update per rollout, 8 prompts × G = 8 completions per step):

- ``grpo``: each completion's token mean, averaged over the completions (f_i = 1/(B|o_i|));
- ``dapo``: the token mean over the batch (f_i = 1/Σ_j |o_j|), which is λ-GRPO with λ fixed at 0;
- ``dr_grpo``: the token sum over a constant, B · L_max (f_i = 1/(B · L_max));
- ``lambda_grpo``: DAPO's token mean with the weights f_i = G softmax_i(h_i^λ) and λ learned (start 0, lr 1e-2).

Every step records the sampled accuracy, the mean completion length, and λ; the held-out accuracy is measured
every ``eval_every`` steps.

    python experiments/lambda_grpo_compare.py            # writes experiments/results/lambda_grpo_compare.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from rlbook.checkpoints import load_manifest
from rlbook.paths import write_results
from rlbook.trainer import run_from_base_policy

POLICY = "sort_scratchpad"
PRESET = "lambda_grpo"
RESULTS = Path(__file__).parent / "results" / "lambda_grpo_compare.json"
# name -> overrides of the lambda_grpo preset: only the aggregation changes
METHODS = {
    "grpo": dict(lambda_grpo=False, loss_type="grpo"),
    "dapo": dict(lambda_grpo=False, loss_type="dapo"),
    "dr_grpo": dict(lambda_grpo=False, loss_type="dr_grpo"),
    "lambda_grpo": dict(),
}
SETTINGS = dict(num_generations=8, per_device_train_batch_size=64, learning_rate=3e-4, max_steps=150,
                eval_every=50, eval_size=128)
LOGGED = ("accuracy", "completion_length", "lambda")


def train_one(name: str, seed: int, **settings) -> dict:
    """One run of method ``name``: the recorded run of :func:`rlbook.trainer.run_from_base_policy`."""
    torch.set_num_threads(1)
    merged = {**SETTINGS, **METHODS[name], **settings}
    steps, every, size = merged.pop("max_steps"), merged.pop("eval_every"), merged.pop("eval_size")
    run = run_from_base_policy(POLICY, PRESET, seed=seed, max_steps=steps, eval_every=every, eval_size=size,
                               logged=LOGGED, **merged)
    run["metrics"] = {k: [None if v is None else round(float(v), 5) for v in values]
                      for k, values in run["metrics"].items()}
    run["seconds"] = round(run["seconds"], 1)
    return run


def run(methods=tuple(METHODS), seeds=(0, 1, 2, 3, 4), **settings) -> dict:
    out = {"policy": POLICY, "preset": PRESET,
           "checkpoint_sha256": load_manifest(POLICY)["sha256"]["model.safetensors"],
           "methods": {name: METHODS[name] for name in methods}, "settings": {**SETTINGS, **settings},
           "seeds": list(seeds), "runs": {}}
    for name in methods:
        out["runs"][name] = [train_one(name, seed, **settings) for seed in seeds]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=SETTINGS["max_steps"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    extra = {} if args.steps == SETTINGS["max_steps"] else {"max_steps": args.steps}
    write_results(args.out, lambda: run(methods=tuple(args.methods), seeds=tuple(range(args.seeds)), **extra))


if __name__ == "__main__":
    main()
