"""Exercises of the chapter "DAPO": the soft overlong punishment and the dynamic-sampling filter.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random numpy inputs (seeded, so a
failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it, and
prints ``ok`` when everything agrees.

- :func:`check_soft_overlong_penalty`: ``fn(lengths, max_length, cache_length) -> (B,)``, DAPO's soft overlong
  punishment: 0 up to ``L_max - L_cache``, then ``((L_max - L_cache) - |y|) / L_cache`` down to -1 at ``L_max``,
  and -1 beyond (the reference is :func:`rlbook.tasks.shaping.soft_overlong_penalty`). The usual mistakes: a ramp
  that starts at ``L_max`` instead of ``L_max - L_cache``, or one that is off by a token. The lengths always include
  both knots; the penalty is continuous there, so ``<`` and ``<=`` at a knot are both right.
- :func:`check_informative_groups`: ``fn(rewards, num_generations) -> (N,) bool``, True for the groups whose rewards
  are not all equal: the groups dynamic sampling keeps (all-equal groups have zero advantage everywhere).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, checker
from rlbook.tasks.shaping import soft_overlong_penalty

_SEED = 20250318
NUM_TRIALS = 200


# ---------------------------------------------------------------------------------------------- references
def reference_soft_overlong_penalty(lengths, max_length: int, cache_length: int) -> np.ndarray:
    """(B,) float64 penalty in [-1, 0]: the package's :func:`~rlbook.tasks.shaping.soft_overlong_penalty`."""
    return soft_overlong_penalty(lengths, max_length, cache_length)


def reference_informative_groups(rewards, num_generations: int) -> np.ndarray:
    """(N,) bool: True where the group's G contiguous rewards are not all equal (exactly, as floats): the package's
    :func:`~rlbook.rollout.informative_groups`, which the trainer's dynamic sampling uses."""
    from rlbook.rollout import informative_groups  # here, not at the top: it imports torch

    return informative_groups(rewards, num_generations)


# ---------------------------------------------------------------------------------------------- checkers
@checker
def check_soft_overlong_penalty(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(lengths, max_length, cache_length) -> (B,)`` with DAPO's soft overlong punishment, on random
    budgets and lengths that include both knots ``L_max - L_cache`` and ``L_max``."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        max_length = int(rng.integers(2, 41))
        cache_length = int(rng.integers(1, max_length + 1))
        knots = [max_length - cache_length, max_length]
        lengths = np.concatenate([knots, rng.integers(0, max_length + 8, size=int(rng.integers(1, 10)))])
        rng.shuffle(lengths)
        original = lengths.copy()
        inputs = (f"  inputs of trial {trial} (seed {seed}): max_length={max_length}, cache_length={cache_length}, "
                  f"lengths = {lengths.tolist()}")
        got = call_reader(fn, (lengths, max_length, cache_length), inputs)
        if got is None:
            raise AssertionError(f"your function returned None; it must return a (B,) array\n{inputs}")
        if not np.array_equal(lengths, original):
            raise AssertionError(f"your function changed lengths in place; work on a copy\n{inputs}")
        expected = reference_soft_overlong_penalty(lengths, max_length, cache_length)
        got = np.asarray(got, dtype=np.float64)
        hint = ""
        late = np.where(lengths <= max_length, np.minimum(0.0, (max_length - lengths) / cache_length), -1.0)
        if got.shape == expected.shape and np.allclose(got, late) and not np.allclose(late, expected):
            hint = " (your ramp starts at L_max; DAPO's starts L_cache tokens earlier, at L_max - L_cache)"
        assert_close(got, expected, "soft overlong penalty", atol=1e-9, rtol=1e-9, hint=hint, inputs=inputs)
    print("ok")


@checker
def check_informative_groups(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, num_generations) -> (N,) bool`` with "not all rewards of the group are equal", on 0/1,
    +-1 and real-valued rewards (the trainer filters on the task's rewards, before any shaping)."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        N, G = int(rng.integers(1, 7)), int(rng.integers(2, 9))
        kind = trial % 3
        if kind == 0:
            rewards = rng.integers(0, 2, size=N * G).astype(float)  # many all-equal groups
        elif kind == 1:
            rewards = 2.0 * rng.integers(0, 2, size=N * G) - 1.0
        else:
            rewards = np.repeat(rng.integers(0, 2, size=N).astype(float), G) - rng.uniform(0, 1, N * G) * (
                rng.random(N * G) < 0.3)
        rewards[: G] = rewards[0]  # the first group always all-equal
        original = rewards.copy()
        inputs = f"  inputs of trial {trial} (seed {seed}): num_generations={G}, rewards = {rewards.tolist()}"
        got = call_reader(fn, (rewards, G), inputs)
        if got is None:
            raise AssertionError(f"your function returned None; it must return a (N,) bool array\n{inputs}")
        if not np.array_equal(rewards, original):
            raise AssertionError(f"your function changed rewards in place; work on a copy\n{inputs}")
        got = np.asarray(got)
        expected = reference_informative_groups(rewards, G)
        if got.shape != expected.shape:
            raise AssertionError(f"informative groups: expected shape {expected.shape} (one flag per group), "
                                 f"got {got.shape}\n{inputs}")
        if got.dtype != np.bool_:
            raise AssertionError(f"informative groups: expected a bool array, got dtype {got.dtype}\n{inputs}")
        if not np.array_equal(got, expected):
            first = int(np.flatnonzero(got != expected)[0])
            raise AssertionError(f"informative groups: group {first} has rewards "
                                 f"{rewards[first * G:(first + 1) * G].tolist()}: expected {bool(expected[first])}, "
                                 f"got {bool(got[first])}\n{inputs}")
    print("ok")
