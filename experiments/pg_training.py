"""REINFORCE with and without a baseline on the arithmetic base policy (Chapter "The policy-gradient theorem").

Trains the shipped arithmetic base policy with the presets ``reinforce`` (no baseline), ``reinforce_baseline``
(group-mean baseline) and ``rloo`` (leave-one-out baseline), several seeds each, and records held-out sampled
accuracy (test-split problems, one sample each at temperature 1) every ``eval_every`` steps, with the training
``reward`` and ``grad_norm`` of every step.

    python experiments/pg_training.py            # writes experiments/results/pg_training.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from rlbook.experiment import Arm, run_experiment, train_run

TASK = "arithmetic"
ARMS = {name: Arm(name) for name in ("reinforce", "reinforce_baseline", "rloo")}
SETTINGS = dict(num_generations=8, per_device_train_batch_size=64, learning_rate=3e-4, max_steps=300,
                eval_every=25, eval_size=512)
LOGGED = ["reward", "grad_norm"]  # the metrics kept of every step (rlbook.metrics.METRICS)
RESULTS = Path(__file__).parent / "results" / "pg_training.json"


def run_one(name: str, arm: Arm, seed: int, **settings) -> dict:
    """One run of ``arm`` from the shipped base policy: its held-out accuracy curve and per-step metrics."""
    return train_run(TASK, arm, seed, logged=LOGGED, **settings)


def run(arms=ARMS, seeds=range(5), *, out=None, processes=None, progress=True, arguments=None, **settings) -> dict:
    common = {**SETTINGS, **settings}
    return run_experiment("pg_training", functools.partial(run_one, **common), arms, seeds, out=out, common=common,
                          processes=processes, steps_per_run=common["max_steps"], progress=progress,
                          arguments=arguments, checkpoints=[TASK], description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=SETTINGS["max_steps"])
    parser.add_argument("--lr", type=float, default=SETTINGS["learning_rate"])
    parser.add_argument("--processes", type=int, default=None, help="default: one per core")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(seeds=range(args.seeds), out=args.out, processes=args.processes, arguments={**vars(args), "out": str(args.out)},
        max_steps=args.steps, learning_rate=args.lr)


if __name__ == "__main__":
    main()
