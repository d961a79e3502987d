"""Three DAPO ablations on the shipped base policies (Chapter "DAPO").

Each ablation switches one of DAPO's techniques on and off in the trainer's ``dapo`` preset, several seeds each, and
records per-step metrics:

- ``clip``: symmetric clipping (epsilon = epsilon_high = 0.2) against clip-higher (0.2 / 0.28) on the arithmetic
  policy, with four optimizer steps per rollout (so the later ones are off-policy and the clip acts). Records the
  trainer's ``entropy`` (the exact mean entropy of the sampling distribution over the completion tokens) and the
  clip fractions ``clip_ratio/low_mean`` and ``clip_ratio/high_mean``.
- ``dynamic``: without and with dynamic sampling on the arithmetic policy. Records the fraction of groups whose
  rewards are all equal in the first generation round (``frac_reward_zero_std``), the informative groups the update
  trained on (``dynamic_sampling/groups``) and the generation rounds each step needed (``dynamic_sampling/rounds``).
- ``overlong``: without and with overlong reward shaping (overlong filtering plus the soft overlong punishment) on
  the sort_scratchpad policy under a budget that cuts off its rambling answers. Records the truncation rate
  ``completions/clipped_ratio``. ``overlong_pm1`` is the same ablation with DAPO's +-1 rewards
  (``incorrect_reward=-1``) instead of the task's 0/1.

The arms are named ``<ablation>/<arm>`` (``clip/symmetric``, ``clip/clip_higher``, ``dynamic/off``, ...).

    python experiments/dapo_ablations.py            # writes experiments/results/dapo_ablations.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from rlbook.experiment import Arm, run_experiment, train_run

RESULTS = Path(__file__).parent / "results" / "dapo_ablations.json"
# Shared by every run: 8 prompts x G = 8 completions per step; DAPO's other techniques off unless the ablation
# switches them on (the rest of the "dapo" preset stays: token-level loss, no KL, group z-score advantages).
COMMON = dict(num_generations=8, per_device_train_batch_size=64, dynamic_sampling=False,
              mask_truncated_completions=False, overlong_buffer_length=None)
ABLATIONS = {  # ablation: (base policy, settings of both arms, {arm: its own settings})
    "clip": ("arithmetic", dict(max_steps=50, learning_rate=3e-4, per_device_train_batch_size=16,
                                steps_per_generation=4),
             {"symmetric": dict(epsilon_high=0.2), "clip_higher": dict(epsilon_high=0.28)}),
    "dynamic": ("arithmetic", dict(max_steps=50, learning_rate=5e-4),
                {"off": dict(), "on": dict(dynamic_sampling=True, max_num_gen_batches=4)}),
    "overlong": ("sort_scratchpad", dict(max_steps=30, learning_rate=5e-4, max_completion_length=36,
                                         per_device_train_batch_size=32),
                 {"off": dict(), "on": dict(mask_truncated_completions=True, overlong_buffer_length=9)}),
}
ARMS = {f"{ablation}/{arm}": Arm("dapo", task=policy, **shared, **own)
        for ablation, (policy, shared, arms) in ABLATIONS.items() for arm, own in arms.items()}
# The overlong ablation again with DAPO's +-1 rewards (the task's 0/1 above): with 0/1 the penalty's -1 is the whole
# right/wrong gap, so a long right answer can score below a short wrong one; with +-1 it stays above it.
_, _shared, _arms = ABLATIONS["overlong"]
ARMS.update({f"overlong_pm1/{arm}": Arm("dapo", task="sort_scratchpad", task_kwargs={"incorrect_reward": -1.0},
                                        **_shared, **own) for arm, own in _arms.items()})
LOGGED = ("reward", "accuracy", "entropy", "completions/mean_length", "completions/clipped_ratio",
          "frac_reward_zero_std", "dynamic_sampling/rounds", "dynamic_sampling/groups", "clip_ratio/low_mean",
          "clip_ratio/high_mean")


def run_one(name: str, arm: Arm, seed: int) -> dict:
    """One run of arm ``name``: per-step metrics of :data:`LOGGED`, without the keys the arm never logs (dynamic
    sampling's, when it is off)."""
    record = train_run(arm.task, arm, seed, logged=LOGGED, **COMMON)
    record["metrics"] = {k: v for k, v in record["metrics"].items() if any(x is not None for x in v)}
    return record


def run(arms=tuple(ARMS), seeds=(0, 1, 2, 3, 4), *, steps=None, out=None, processes=None, arguments=None,
        merge=False) -> dict:
    """Run ``arms`` (names of :data:`ARMS`) for ``seeds``; ``steps`` shortens every run (the tests); ``merge`` keeps
    the stored file's other arms."""
    chosen = {name: ARMS[name] for name in arms}
    if steps is not None:
        chosen = {name: Arm("dapo", task=arm.task, task_kwargs=arm.task_kwargs, **{**arm.overrides, "max_steps": steps})
                  for name, arm in chosen.items()}
    return run_experiment("dapo_ablations", run_one, chosen, seeds, out=out, common=COMMON, processes=processes,
                          steps_per_run=lambda name, arm: arm.overrides["max_steps"], arguments=arguments,
                          checkpoints=sorted({arm.task for arm in chosen.values()}), merge=merge,
                          description=__doc__.splitlines()[0],
                          summary={"last-10 accuracy": lambda r: np.mean(r["metrics"]["accuracy"][-10:])})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: each ablation's own)")
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--merge", action="store_true", help="keep the stored file's other arms")
    args = parser.parse_args()
    run(tuple(args.arms), seeds=range(args.seeds), steps=args.steps, out=args.out, processes=args.processes,
        arguments={**vars(args), "out": str(args.out)}, merge=args.merge)


if __name__ == "__main__":
    main()
