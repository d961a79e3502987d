"""REINFORCE (group-mean baseline) against PPO (GAE, value model, several epochs) at the same sample budget.

Both algorithms start from the same shipped base policy, see the same prompts at every step (the prompts depend on
(seed, step) only) and sample the same number of completions per step, so the comparison is at equal numbers of
sampled completions; PPO spends more compute on each of them (``num_iterations`` passes and a value model).
Held-out sampled accuracy (one completion per "test" problem at temperature 1) is measured every ``eval_every``
steps. Results: ``experiments/results/ppo_compare.json`` (the layout of :mod:`rlbook.experiment`: one record per
arm and seed, with the per-step metrics the chapter plots).

    python experiments/ppo_compare.py                      # the chapter's run (about 30 min on one CPU core)
    python experiments/ppo_compare.py --steps 2 --seeds 1 --eval-every 1 --out /tmp/x.json   # a smoke test
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from rlbook.checkpoints import RECIPES
from rlbook.experiment import Arm, run_experiment, train_run

# All arms: 8 prompts x 8 completions per step. PPO takes 4 optimiser steps per rollout (one per epoch), so it
# gets smaller learning rates than REINFORCE's one step: at 3e-4 it lost accuracy on the old arithmetic
# checkpoint, at 1e-3 every algorithm collapsed (one seed each).
ARMS = {
    "reinforce_baseline": Arm("reinforce_baseline", learning_rate=3e-4),
    "ppo": Arm("ppo", learning_rate=1e-4, num_iterations=4),
    "ppo_lr3e-5": Arm("ppo", learning_rate=3e-5, num_iterations=4),
}
COMMON = dict(num_generations=8, per_device_train_batch_size=64)
LOGGED = ("reward", "accuracy", "loss/value", "explained_variance", "clip_ratio/region_mean", "approx_kl",
          "ratio/max", "completions/mean_length", "loss/policy")


def run_one(name: str, arm: Arm, seed: int, *, task: str = "arithmetic", steps: int = 200, eval_every: int = 20,
            eval_size: int = 256, **settings) -> dict:
    """One training run of ``arm`` from the base policy: its config, held-out accuracy curve and logged metrics."""
    return train_run(task, arm, seed, logged=LOGGED, max_steps=steps, eval_every=eval_every, eval_size=eval_size,
                     **{**COMMON, **settings})


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="arithmetic", choices=sorted(RECIPES))
    parser.add_argument("--algorithms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=None, help="override every arm's learning rate")
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "ppo_compare.json"))
    args = parser.parse_args(argv)
    arms = {name: ARMS[name] if args.lr is None else Arm(ARMS[name].preset, **{**ARMS[name].overrides,
                                                                              "learning_rate": args.lr})
            for name in args.algorithms}
    common = dict(task=args.task, steps=args.steps, eval_every=args.eval_every, eval_size=args.eval_size)
    return run_experiment("ppo_compare", partial(run_one, **common), arms, range(args.seeds), out=args.out,
                          common={**common, **COMMON}, arguments=vars(args), checkpoints=[args.task],
                          processes=args.processes, steps_per_run=args.steps, description=__doc__.split("\n")[0])


if __name__ == "__main__":
    main()
