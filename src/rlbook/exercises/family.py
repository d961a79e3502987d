"""Exercise of the chapter "The family in one table": which slot of GRPO to change for a goal.

:func:`check_family_changes` takes the reader's ``answers``, a dict from goal to the overrides of the ``"grpo"``
preset (``{"beta": 0.0}``, ...), builds ``preset("grpo", **overrides)`` for each, and checks that the goal is met
and that only the goal's slot changed. The goals:

- ``"no_reference"``: no reference model is held (the KL slot, ``beta``);
- ``"sequence_ratio"``: one ratio per completion, as in GSPO (the ratio slot, ``importance_sampling_level``);
- ``"no_difficulty_bias"``: no division by the group's standard deviation (the advantage slot, ``scale_rewards``);
- ``"token_mean"``: every token of the batch weighs the same (the aggregation slot, ``loss_type``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from rlbook.exercises._compare import call_reader, checker

START = "grpo"

# goal -> (the slot's config fields, a test that the goal is met, what the goal asks)
GOALS = {
    "no_reference": (("beta",), lambda c: c.beta == 0, "no reference model held (beta = 0)"),
    "sequence_ratio": (("importance_sampling_level",),
                       lambda c: c.importance_sampling_level in ("sequence", "sequence_token"),
                       "one ratio per completion (importance_sampling_level='sequence', or 'sequence_token', which "
                       "the GSPO chapter shows is the same with per-completion advantages)"),
    "no_difficulty_bias": (("scale_rewards",), lambda c: c.scale_rewards == "none",
                           "advantages not divided by the group's std (scale_rewards='none')"),
    "token_mean": (("loss_type",), lambda c: c.loss_type in ("dapo", "bnpo"),
                   "every token weighs the same (a token mean: loss_type 'dapo' or 'bnpo')"),
}


@checker
def check_family_changes(answers: dict | Callable[[str], dict]) -> None:
    """Check the reader's overrides of the ``"grpo"`` preset for every goal in :data:`GOALS`; prints ``ok``.

    ``answers`` is a dict from goal to overrides, or a function ``overrides_for(goal) -> dict``."""
    from rlbook.presets import preset

    if callable(answers):
        answers = {goal: call_reader(answers, (goal,), f"  the goal was {goal!r}") for goal in GOALS}
    if not isinstance(answers, dict):
        raise AssertionError(f"answers must be a dict from goal to overrides, got {type(answers).__name__}")
    missing = sorted(set(GOALS) - set(answers))
    if missing:
        raise AssertionError(f"no answer for the goals {missing}")
    base = asdict(preset(START))
    for goal, overrides in answers.items():
        if goal not in GOALS:
            raise AssertionError(f"unknown goal {goal!r}; the goals are {sorted(GOALS)}")
        fields, met, wanted = GOALS[goal]
        if not isinstance(overrides, dict):
            raise AssertionError(f"{goal}: the answer must be a dict of RLConfig overrides, got {overrides!r}")
        try:
            config = preset(START, **overrides)
        except (TypeError, ValueError) as error:
            raise AssertionError(f"{goal}: preset({START!r}, **{overrides!r}) fails: {error}") from error
        if not met(config):
            raise AssertionError(f"{goal}: {overrides!r} does not give {wanted}")
        changed = sorted(k for k, v in asdict(config).items() if v != base[k])
        extra = [k for k in changed if k not in fields]
        if extra:
            raise AssertionError(f"{goal}: {overrides!r} also changes {extra}; change only {list(fields)}")
    print("ok")
