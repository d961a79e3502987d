"""Exercise of the chapter "GFPO": the filtered group advantages.

:func:`check_gfpo_advantages` compares the reader's ``fn(rewards, lengths, num_generations, k, metric) -> (N*G,)``
with GFPO's advantages on random groups (seeded, so a failure is reproducible): in each group of G contiguous
completions keep the ``k`` best by ``metric`` (``"length"``: the shortest; ``"token_efficiency"``: the highest
``r_i / |o_i|``; ties go to the earlier completion), z-score the kept rewards with the mean and the unbiased
(n - 1) standard deviation *of the kept ones only* plus ``eps = 1e-4``, and give the others advantage 0. The
reference is the package itself: ``group_advantages(..., keep_mask=gfpo_keep_mask(...))``.

The usual mistakes it names: z-scores over the whole group (GRPO's statistics) instead of the kept subset, and
kept the longest (or the least efficient) instead of the best.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close, assert_inputs_unchanged, call_reader, checker

_SEED = 20250813
NUM_TRIALS = 200
METRICS = ("length", "token_efficiency")


# ---------------------------------------------------------------------------------------------- reference
def reference_gfpo_advantages(rewards, lengths, num_generations: int, k: int, metric: str = "length") -> np.ndarray:
    """(N*G,) float64 GFPO advantages from the package's ``gfpo_keep_mask`` and ``group_advantages``."""
    import torch

    from rlbook.objectives import gfpo_keep_mask, group_advantages

    r = torch.as_tensor(np.asarray(rewards, dtype=np.float64))
    n = torch.as_tensor(np.asarray(lengths, dtype=np.int64))
    keep = gfpo_keep_mask(r, n, num_generations, k, metric)
    return group_advantages(r, num_generations, keep_mask=keep).numpy()


def _z_scores(rewards: np.ndarray, keep: np.ndarray, G: int) -> np.ndarray:
    """Z-scores over the ``keep`` entries of each group, 0 elsewhere (for the hints): the package's
    ``group_advantages`` with that keep mask."""
    import torch

    from rlbook.objectives import group_advantages

    return group_advantages(torch.as_tensor(np.asarray(rewards, dtype=np.float64)), G,
                            keep_mask=torch.as_tensor(np.asarray(keep, dtype=bool))).numpy()


def _hint(got: np.ndarray, rewards: np.ndarray, lengths: np.ndarray, G: int, k: int, metric: str) -> str:
    """Name the usual mix-ups when the reader's answer matches one of them."""
    keep = reference_keep(rewards, lengths, G, k, metric)
    whole = _z_scores(rewards, np.ones_like(keep), G)
    if np.allclose(got, whole * keep, atol=1e-6) and not np.allclose(whole * keep, _z_scores(rewards, keep, G)):
        return " (these are z-scores with the whole group's mean and std; GFPO takes them over the kept ones only)"
    if np.allclose(got, whole, atol=1e-6):
        return " (these are plain GRPO advantages: nothing was filtered)"
    score = -lengths.astype(float) if metric == "length" else rewards / np.maximum(lengths, 1)
    worst = np.zeros_like(keep).reshape(-1, G)
    np.put_along_axis(worst, np.argsort(score.reshape(-1, G), axis=-1, kind="stable")[:, :k], True, axis=-1)
    if k < G and np.allclose(got, _z_scores(rewards, worst.reshape(-1), G), atol=1e-6):
        return " (you kept the worst k by the metric: the longest, or the least reward per token)"
    return ""


def reference_keep(rewards, lengths, G: int, k: int, metric: str) -> np.ndarray:
    """(N*G,) bool: the package's ``gfpo_keep_mask``."""
    import torch

    from rlbook.objectives import gfpo_keep_mask

    return gfpo_keep_mask(torch.as_tensor(np.asarray(rewards, dtype=np.float64)),
                          torch.as_tensor(np.asarray(lengths, dtype=np.int64)), G, k, metric).numpy()


# ---------------------------------------------------------------------------------------------- checker
@checker
def check_gfpo_advantages(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, lengths, num_generations, k, metric) -> (N*G,)`` with GFPO's filtered advantages on
    random groups: 0/1 and real rewards, lengths with ties, both metrics, and every k from 1 to G."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        N, G = int(rng.integers(1, 5)), int(rng.integers(2, 10))
        k = int(rng.integers(1, G + 1))
        metric = METRICS[trial % 2]
        rewards = (rng.integers(0, 2, size=N * G) if trial % 3 else rng.normal(size=N * G)).astype(np.float64)
        lengths = rng.integers(1, 12, size=N * G).astype(np.int64)
        before = {"rewards": rewards.copy(), "lengths": lengths.copy()}
        inputs = (f"  inputs of trial {trial} (seed {seed}): num_generations={G}, k={k}, metric={metric!r},\n"
                  f"  rewards = {rewards.tolist()},\n  lengths = {lengths.tolist()}")
        got = call_reader(fn, (rewards, lengths, G, k, metric), inputs)
        if got is None:
            raise AssertionError(f"your function returned None; it must return an (N*G,) array\n{inputs}")
        assert_inputs_unchanged(before, {"rewards": rewards, "lengths": lengths}, inputs)
        got = np.asarray(got, dtype=np.float64)
        expected = reference_gfpo_advantages(rewards, lengths, G, k, metric)
        hint = _hint(got, rewards, lengths, G, k, metric) if got.shape == expected.shape else ""
        assert_close(got, expected, "GFPO advantages", atol=1e-6, rtol=1e-6, hint=hint, inputs=inputs)
    print("ok")
