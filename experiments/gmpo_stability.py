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

Logged per step (:data:`LOGGED`; means over the step's updates unless noted): reward, the sampling policy's mean
token ``entropy`` (the study note says GMPO keeps it higher than GRPO), ``clip_ratio/region_mean``,
``approx_kl``, the extreme token ratios seen during the updates (``ratio/min``, ``ratio/max``), and, from
:class:`rlbook.callbacks.PostUpdateRatios`, the spread of the rollout's log-ratios under the policy after the
step's eight updates: the largest |log rho_t| over tokens (``post_update/max_abs_log_ratio_token``) and the largest
|mean_t log rho_t| over completions (``post_update/max_abs_log_ratio_sequence``, the log of the geometric-mean
ratio). Held-out accuracy every ``eval_every`` steps.

    python experiments/gmpo_stability.py            # writes experiments/results/gmpo_stability.json
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path

from rlbook.callbacks import PostUpdateRatios
from rlbook.experiment import Arm, run_experiment, train_run

RESULTS = Path(__file__).parent / "results" / "gmpo_stability.json"
TASK = "arithmetic"
COMMON = dict(num_generations=8, per_device_train_batch_size=32, steps_per_generation=4, num_iterations=2,
              beta=0.0, eval_every=20, eval_size=256)
WIDE = dict(epsilon=round(1 - math.exp(-0.4), 6), epsilon_high=round(math.exp(0.4) - 1, 6))  # (e^-0.4, e^0.4)
LEARNING_RATES = {"": 2e-4, "_fast": 5e-4}
METHODS = {"grpo": Arm("grpo", epsilon=0.2), "grpo_wide": Arm("grpo", **WIDE), "gmpo": Arm("gmpo")}
ARMS = {f"{name}{tag}": Arm(arm.preset, **arm.overrides, learning_rate=lr)
        for tag, lr in LEARNING_RATES.items() for name, arm in METHODS.items()}
STEPS = 100
LOGGED = ("reward", "entropy", "clip_ratio/region_mean", "approx_kl", "ratio/min", "ratio/max",
          "post_update/max_abs_log_ratio_token", "post_update/max_abs_log_ratio_sequence")


def run_one(name: str, arm: Arm, seed: int, steps: int = STEPS, common: dict = COMMON) -> dict:
    """One run of ``arm`` from the shipped base policy, with the post-update log-ratios of the docstring."""
    return train_run(TASK, arm, seed, callbacks=[PostUpdateRatios()], logged=LOGGED, max_steps=steps, **common)


def run(arms=tuple(ARMS), seeds=range(5), steps: int = STEPS, out=None, processes=None, arguments=None,
        **overrides) -> dict:
    """All ``arms`` x ``seeds`` (written to ``out`` when given); ``overrides`` change COMMON (for the reduced
    test run)."""
    common = {**COMMON, **overrides}
    return run_experiment("gmpo_stability", functools.partial(run_one, steps=steps, common=common),
                          {arm: ARMS[arm] for arm in arms}, seeds, out=out, common=common, extra={"steps": steps},
                          processes=processes, steps_per_run=steps, checkpoints=[TASK], arguments=arguments,
                          description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(arms=tuple(args.arms), seeds=range(args.seeds), steps=args.steps, out=args.out, processes=args.processes,
        arguments={**vars(args), "out": str(args.out)})


if __name__ == "__main__":
    main()
