"""Every exercise checker answers a wrong answer with its own verdict, never with a crash of its own code.

For each public ``check_*`` of :mod:`rlbook.exercises`, wrong answers built from the exercise's reference (the
``reference_<name>`` next to the checker): ``None``, a crash inside the answer, a numpy array for a tensor (or
a tensor for an array), the wrong shape, and NaN. Each must raise :class:`CheckFailed` (or
:class:`ExerciseNotDone`) with a message that names the problem; a new checker without a case here fails.
"""

import importlib
import math
import re

import numpy as np
import pytest
import torch

import rlbook.exercises as exercises
from rlbook.exercises._compare import CheckFailed, ExerciseNotDone

CHECKERS = sorted(name for name in dir(exercises) if name.startswith("check_") and name != "check_against_reference")
FAMILY_RIGHT = {"no_reference": {"beta": 0.0}, "sequence_ratio": {"importance_sampling_level": "sequence"},
                "no_difficulty_bias": {"scale_rewards": "none"}, "token_mean": {"loss_type": "dapo"}}


def reference_of(name: str):
    """The reference solution of ``check_<name>``, in the reader's signature."""
    if name == "check_family_changes":
        return FAMILY_RIGHT.__getitem__
    module = importlib.import_module(getattr(exercises, name).__module__)
    return getattr(module, "reference_" + name.removeprefix("check_"), None)


def swapped(value):
    """A tensor as a numpy array, an array as a tensor; None when the value is neither."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return torch.as_tensor(value)
    return None


def reshaped(value):
    """The value flattened with one more element: a shape that differs from the reference's."""
    if isinstance(value, torch.Tensor):
        return torch.cat([value.reshape(-1), value.reshape(-1)[:1] * 0 + 1])
    if isinstance(value, np.ndarray):
        return np.concatenate([value.reshape(-1), np.ones(1, dtype=value.dtype)])
    return None


def with_nan(value):
    """The value with NaN everywhere (keeping the autograd graph of a tensor); None for non-float values."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value * float("nan")
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value * np.nan
    if isinstance(value, float):
        return math.nan
    return None


def changed(reference, change):
    def answer(*args, **kwargs):
        right = reference(*args, **kwargs)  # once: some references update their inputs in place
        result = change(right)
        answer.applied = answer.applied or result is not None
        return right if result is None else result
    answer.applied = False
    return answer


def boom(*args, **kwargs):
    raise ValueError("boom")


CASES = [("none", lambda *a, **k: None, r"None"), ("raises", boom, r"boom"),
         ("swapped type", swapped, r"(?i)numpy|tensor|ndarray"), ("wrong shape", reshaped, r"(?i)shape|flag"),
         ("nan", with_nan, r"(?i)nan|finite")]


def test_every_checker_has_a_reference_to_build_wrong_answers_from():
    assert len(CHECKERS) >= 28
    missing = [name for name in CHECKERS if reference_of(name) is None]
    assert not missing, f"no reference_<name> for {missing}: add one next to the checker"


@pytest.mark.parametrize("name", CHECKERS)
@pytest.mark.parametrize("case, change, pattern", CASES, ids=[case[0] for case in CASES])
def test_a_wrong_answer_gets_a_verdict_not_a_crash(name, case, change, pattern, capsys):
    check, reference = getattr(exercises, name), reference_of(name)
    answer = change if case in ("none", "raises") else changed(reference, change)
    try:
        check(answer)
    except (CheckFailed, ExerciseNotDone) as error:
        message = str(error)
        assert message.strip()
        assert re.search(pattern, message), f"{name}, {case}: {message}"
        return
    # only when the change did nothing to this exercise's answer (a list, a bool array) may it pass
    assert not getattr(answer, "applied", True), f"{name}, {case}: the wrong answer passed"
    assert capsys.readouterr().out.split() == ["ok"]
