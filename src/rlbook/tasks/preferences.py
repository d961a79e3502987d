"""Preference pairs for DPO: one prompt, a correct *chosen* completion and a near-miss *rejected* one.

The chosen side is the task's demonstration (reward ``correct_reward``); the rejected side is the task's
:meth:`~rlbook.tasks.base.Task.near_miss`, a plausible mistake (a digit off by one, two digits swapped, a
constraint string with one letter wrong) that the task scores as incorrect (reward ``incorrect_reward``, or
less than ``correct_reward`` under partial credit). Both are completions: the text after the prompt, EOS not
included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlbook.tasks.base import Task, check_int


@dataclass(frozen=True)
class PreferencePair:
    """A DPO training triple ``(x, y_w, y_l)``: the ``prompt``, the preferred ``chosen`` completion and the
    dispreferred ``rejected`` one (TRL's column names)."""

    prompt: str
    chosen: str
    rejected: str


def build_preference_pairs(task: Task, n: int, seed, split: str = "all") -> list[PreferencePair]:
    """Sample ``n`` problems from ``task`` (from ``split``, see :meth:`Task.sample`) and pair each demonstration
    with a near-miss.

    Deterministic given ``seed`` (an int or a numpy Generator). Raises ValueError if ``n < 1``, and
    RuntimeError if the task ever produces a chosen side that is not correct or a rejected side that is.
    """
    n = check_int(n, "n", minimum=1)
    rng = np.random.default_rng(seed)
    examples = task.sample(n, rng, split=split)
    pairs = []
    for example in examples:
        chosen = task.demonstration(example)
        rejected = task.near_miss(example, rng)
        if not task.is_correct(example, chosen) or task.is_correct(example, rejected):
            raise RuntimeError(f"{task!r} built a bad pair for {example.prompt!r}: "
                               f"chosen={chosen!r}, rejected={rejected!r}")
        pairs.append(PreferencePair(prompt=example.prompt, chosen=chosen, rejected=rejected))
    return pairs
