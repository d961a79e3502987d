"""Model organisms: small settings where the failure an algorithm was invented against appears under its baseline.

At the book's default scale (short answers, one right answer, 0/1 rewards) most of Part IV's failures do not show,
so each chapter's fix has nothing to fix. An *organism* is a setting built until the failure does show, the way
biologists study a process in the fruit fly: a shipped base policy, a task setting, training settings shared by
every arm, the baseline algorithm and the fixes as arms, and the held-out metric that shows the failure.

Every arm is measured by :class:`rlbook.evaluation.HeldOutEvaluation`: ``num_prompts`` held-out prompts,
``num_samples`` samples each, the same prompts and sampling stream for every arm and seed (paired). Two numbers
summarise an experiment (:func:`phenomenon`):

- the **gate**, ``baseline_change``: the metric's change under the baseline from the first evaluation to the last,
  mean and 95 % t-interval over seeds. The gate *holds* when that interval excludes 0 in the failure's direction:
  the failure appeared.
- ``fix_minus_baseline``: the fix's metric minus the baseline's at the end, over paired seeds (same seed, same
  prompts, same sampling stream), mean and 95 % t-interval.

Designing an organism until its gate holds is legitimate (the failure must exist before a fix can be shown);
measuring the fix is done once, as it comes out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from rlbook.evaluation import paired_difference
from rlbook.experiment import Arm, mean_interval

DIRECTIONS = ("up", "down")


@dataclass(frozen=True)
class Organism:
    """One organism: what it trains, how it is measured and which way the failure moves the metric.

    Attributes:
        name: e.g. ``"length_inflation"``.
        description: one sentence, the failure and the setting.
        policy: the shipped base policy (:data:`rlbook.checkpoints.RECIPES`) every arm starts from.
        task_kwargs: the task setting on top of the recipe's (e.g. ``{"incorrect_reward": -1.0}``: ±1 rewards).
        settings: trainer settings shared by every arm (completion budget, learning rate, steps, ...).
        arms: ``{name: Arm}``, the baseline first.
        metric: the :meth:`rlbook.evaluation.PolicyEvaluation.summary` key that shows the failure.
        failure: ``"up"`` or ``"down"``, which way the failure moves ``metric`` under the baseline.
        num_prompts, num_samples, eval_every: the held-out evaluation (prompts, samples per prompt, steps between
            evaluations; 0 for only the first and the last).
    """

    name: str
    description: str
    policy: str
    task_kwargs: dict
    settings: dict
    arms: dict = field(default_factory=dict)
    metric: str = "expected_accuracy"
    failure: str = "down"
    num_prompts: int = 1024
    num_samples: int = 8
    eval_every: int = 0

    def __post_init__(self):
        if self.failure not in DIRECTIONS:
            raise ValueError(f"failure must be one of {DIRECTIONS}, got {self.failure!r}")
        if not self.arms:
            raise ValueError(f"organism {self.name!r} needs at least one arm (the baseline first)")
        for arm_name, arm in self.arms.items():
            if not isinstance(arm, Arm):
                raise ValueError(f"arm {arm_name!r} of {self.name!r} must be an Arm, got {type(arm).__name__}")

    @property
    def baseline(self) -> str:
        """The baseline arm's name (the first arm)."""
        return next(iter(self.arms))

    def arm(self, name: str) -> Arm:
        """The arm ``name`` with the organism's task setting added to its own."""
        if name not in self.arms:
            raise ValueError(f"organism {self.name!r} has no arm {name!r}; its arms: {list(self.arms)}")
        arm = self.arms[name]
        return Arm(arm.preset, task=arm.task, task_kwargs={**self.task_kwargs, **arm.task_kwargs}, **arm.overrides)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["arms"] = {name: self.arm(name).to_json() for name in self.arms}
        return out


# --- the organisms ------------------------------------------------------------------------------------------------

_DAPO_PARTS = dict(dynamic_sampling=False, mask_truncated_completions=False, overlong_buffer_length=None)

ORGANISMS: dict[str, Organism] = {
    # Dr. GRPO's failure: GRPO's per-completion token mean 1/|o_i| gives each token of a long wrong answer a smaller
    # penalty, so wrong answers drift longer once the budget leaves them room (64 tokens here, 40 in SFT). The ±1
    # rewards follow the paper; GRPO's group z-scores are the same for 0/1 and ±1 rewards (Dr. GRPO's advantages,
    # not divided by the std, double).
    "length_inflation": Organism(
        name="length_inflation",
        description="sort 3-6 digits with a scratchpad, ±1 rewards and room to grow (64 tokens, the SFT budget "
                    "was 40): under GRPO's 1/|o_i| the wrong answers grow longer",
        policy="sort_scratchpad",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(max_completion_length=64, learning_rate=3e-4, max_steps=300, per_device_train_batch_size=64),
        arms={"grpo": Arm("grpo", beta=0.0), "dr_grpo": Arm("dr_grpo"),
              "gfpo": Arm("gfpo", num_generations=16, per_device_train_batch_size=128, gfpo_k=8),
              "lambda_grpo": Arm("lambda_grpo")},
        metric="mean_length_wrong", failure="up", num_prompts=1024, num_samples=8, eval_every=100,
    ),
    # DAPO's clip-higher: many valid answers per prompt, several updates per rollout so the clip binds; under the
    # symmetric clip the policy narrows onto few answers (entropy collapse).
    "entropy_collapse": Organism(
        name="entropy_collapse",
        description="write a string of given length and letter counts (many valid answers), ±1 rewards, four "
                    "updates per rollout: under the symmetric clip the entropy collapses",
        policy="constraint_string",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(learning_rate=3e-4, max_steps=300, num_iterations=4, per_device_train_batch_size=64),
        arms={"symmetric_clip": Arm("dapo", epsilon_high=0.2, **_DAPO_PARTS),
              "clip_higher": Arm("dapo", epsilon_high=0.28, **_DAPO_PARTS),
              "grpo": Arm("grpo", beta=0.0), "gmpo": Arm("gmpo")},
        metric="entropy", failure="down", num_prompts=1024, num_samples=16, eval_every=100,
    ),
}


def get_organism(name: str) -> Organism:
    if name not in ORGANISMS:
        raise ValueError(f"unknown organism {name!r}; choose one of {sorted(ORGANISMS)}")
    return ORGANISMS[name]


# --- summaries of stored results -----------------------------------------------------------------------------------


def metric_at(runs: list[dict], metric: str, where: int) -> np.ndarray:
    """One value per seed of ``metric`` at evaluation ``where`` (0 the first, -1 the last) of each run's
    ``evals``; raises ValueError if a run lacks it or it is NaN."""
    values = []
    for run in runs:
        evals = run.get("evals")
        if not evals:
            raise ValueError(f"run of seed {run.get('seed')} has no held-out evaluations ('evals')")
        value = evals[where].get(metric)
        if value is None or not np.isfinite(value):
            raise ValueError(f"run of seed {run.get('seed')}: {metric!r} is missing or NaN at evaluation {where}")
        values.append(float(value))
    return np.array(values)


def eval_series(runs: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The held-out evaluation steps ``(T,)`` and ``metric`` at each, ``(seeds, T)``, of one arm's runs (for
    :func:`rlbook.plotting.plot_seeds`); the runs must share their evaluation steps."""
    steps = [e["step"] for e in runs[0]["evals"]]
    if any([e["step"] for e in run["evals"]] != steps for run in runs):
        raise ValueError("the runs were evaluated at different steps")
    return np.array(steps), np.array([[e[metric] for e in run["evals"]] for run in runs], dtype=float)


def baseline_change(runs: list[dict], metric: str) -> tuple[float, float, float]:
    """The metric's change from the first evaluation to the last, mean and 95 % t-interval over seeds."""
    return mean_interval(metric_at(runs, metric, -1) - metric_at(runs, metric, 0))


def gate_holds(change: tuple[float, float, float], failure: str) -> bool:
    """True when the interval of the baseline's change excludes 0 in the failure's direction."""
    if failure not in DIRECTIONS:
        raise ValueError(f"failure must be one of {DIRECTIONS}, got {failure!r}")
    _, low, high = change
    return bool(low > 0) if failure == "up" else bool(high < 0)


def phenomenon(result: dict, *, chapter: str, phenomenon: str, fix: str, metric: str | None = None,
               baseline: str | None = None, direction: str | None = None, script: str) -> dict:
    """One entry of ``experiments/results/phenomena.json`` from an organism experiment's stored ``result``.

    ``metric`` defaults to the organism's; ``direction`` (which way is *better*) to the opposite of its failure;
    ``baseline`` to its first arm. Seeds are paired: ``fix_minus_baseline`` needs both arms on the same seeds.
    """
    organism = result["organism"]
    metric = metric or organism["metric"]
    baseline = baseline or next(iter(result["arms"]))
    opposite = {"up": "down", "down": "up"}
    if direction is not None and direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    failure = opposite[direction] if direction is not None else organism["failure"]
    direction = opposite[failure]
    for arm_name in (baseline, fix):
        if arm_name not in result["runs"]:
            raise ValueError(f"{result['experiment']}: no arm {arm_name!r}; it has {list(result['runs'])}")
    base_runs, fix_runs = result["runs"][baseline], result["runs"][fix]
    if [r["seed"] for r in base_runs] != [r["seed"] for r in fix_runs]:
        raise ValueError(f"{result['experiment']}: arms {baseline!r} and {fix!r} were not run on the same seeds")
    change = baseline_change(base_runs, metric)
    difference = paired_difference(metric_at(base_runs, metric, -1), metric_at(fix_runs, metric, -1))
    return {"chapter": chapter, "phenomenon": phenomenon, "organism": organism["name"], "baseline": baseline,
            "fix": fix, "metric": metric, "direction": direction, "seeds": len(base_runs),
            "baseline_change": [round(x, 6) for x in change],
            "fix_minus_baseline": [round(x, 6) for x in difference],
            "gate_holds": gate_holds(change, failure), "script": script}
