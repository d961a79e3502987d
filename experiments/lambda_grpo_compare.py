"""Learnable λ against the three fixed aggregations (Chapter "λ-GRPO: learning the aggregation").

Trains the shipped ``sort_scratchpad`` base policy (the task of the book with the longest and most varied
completions: a scratchpad of insertion-sort passes, then the answer) with four settings that differ *only* in how
the token losses are aggregated; everything else is the ``lambda_grpo`` preset (group z-score advantages,
ε = 0.2, no KL, one update per rollout, 8 prompts × G = 8 completions per step):

- ``grpo``: each completion's token mean, averaged over the completions (f_i = 1/(B|o_i|));
- ``dapo``: the token mean over the batch (f_i = 1/Σ_j |o_j|), which is λ-GRPO with λ fixed at 0;
- ``dr_grpo``: the token sum over a constant, B · L_max (f_i = 1/(B · L_max));
- ``lambda_grpo``: DAPO's token mean with the weights f_i = G softmax_i(h_i^λ) and λ learned (start 0, lr 1e-2).

Every step records the sampled ``accuracy``, ``completions/mean_length`` and ``lambda_grpo/lambda``; the held-out
accuracy is measured every ``eval_every`` steps.

    python experiments/lambda_grpo_compare.py            # writes experiments/results/lambda_grpo_compare.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from rlbook.experiment import Arm, run_experiment, train_run

POLICY = "sort_scratchpad"
RESULTS = Path(__file__).parent / "results" / "lambda_grpo_compare.json"
# the lambda_grpo preset, and only the aggregation changes
ARMS = {
    "grpo": Arm("lambda_grpo", lambda_grpo=False, loss_type="grpo"),
    "dapo": Arm("lambda_grpo", lambda_grpo=False, loss_type="dapo"),
    "dr_grpo": Arm("lambda_grpo", lambda_grpo=False, loss_type="dr_grpo"),
    "lambda_grpo": Arm("lambda_grpo"),
}
COMMON = dict(num_generations=8, per_device_train_batch_size=64, learning_rate=3e-4, max_steps=150,
              eval_every=50, eval_size=128)
LOGGED = ("accuracy", "completions/mean_length", "lambda_grpo/lambda")


def run_one(name: str, arm: Arm, seed: int, **common) -> dict:
    """One run: :func:`rlbook.experiment.train_run` with the logged metrics rounded to 5 decimals."""
    run = train_run(POLICY, arm, seed, logged=LOGGED, **common)
    run["metrics"] = {k: [None if v is None else round(float(v), 5) for v in values]
                      for k, values in run["metrics"].items()}
    return run


def run(arms=tuple(ARMS), seeds=(0, 1, 2, 3, 4), out=None, processes=None, arguments=None, **settings) -> dict:
    common = {**COMMON, **settings}
    return run_experiment("lambda_grpo_compare", functools.partial(run_one, **common),
                          {name: ARMS[name] for name in arms}, seeds, out=out, common=common,
                          extra={"policy": POLICY}, processes=processes, arguments=arguments,
                          steps_per_run=common["max_steps"], checkpoints=[POLICY], description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=COMMON["max_steps"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(arms=tuple(args.arms), seeds=tuple(range(args.seeds)), out=args.out, processes=args.processes,
        arguments=vars(args) | {"out": str(args.out)}, max_steps=args.steps)


if __name__ == "__main__":
    main()
