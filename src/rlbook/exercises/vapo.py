"""Exercises of the chapter "VAPO": the length-adaptive lambda and decoupled GAE.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random numpy inputs (seeded, so a
failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it, and
prints ``ok`` when everything agrees.

- :func:`check_length_adaptive_lam`: ``fn(lengths, alpha) -> (B,)``, VAPO's policy lambda ``1 - 1/(alpha * l)`` per
  completion, clamped to ``[0, 1]`` (the package's :func:`rlbook.objectives.length_adaptive_lam`). The usual mistake:
  no clamp, so completions shorter than ``1/alpha`` tokens get a negative lambda.
- :func:`check_decoupled_gae`: ``fn(rewards, values, mask, gamma, lam_policy, lam_critic) -> (advantages, returns)``,
  each (B, T): the policy's advantages from GAE with the per-row ``lam_policy`` and the critic's targets
  ``returns = A + V`` from GAE with ``lam_critic`` (the package's :func:`rlbook.objectives.gae`, called twice). The
  usual mistake: returns taken from the policy's advantages (no decoupling).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from rlbook.exercises._compare import assert_close, call_reader, checker
from rlbook.objectives import gae, length_adaptive_lam

_SEED = 20250412
NUM_TRIALS = 100


# ---------------------------------------------------------------------------------------------- references
def reference_length_adaptive_lam(lengths, alpha: float) -> np.ndarray:
    """(B,) float64: ``clip(1 - 1/(alpha * l), 0, 1)`` per completion length ``l``."""
    return length_adaptive_lam(torch.as_tensor(np.asarray(lengths)), alpha).double().numpy()


def reference_decoupled_gae(rewards, values, mask, gamma: float, lam_policy, lam_critic: float):
    """``(advantages, returns)``, each (B, T) float64 and 0 on padding: advantages from GAE with the per-row
    ``lam_policy`` (B,), returns = A + V from GAE with ``lam_critic``."""
    r, v, m = (torch.as_tensor(np.asarray(x, dtype=np.float64)) for x in (rewards, values, mask))
    advantages, _ = gae(r, v, m, gamma, torch.as_tensor(np.asarray(lam_policy, dtype=np.float64)))
    _, returns = gae(r, v, m, gamma, lam_critic)
    return advantages.numpy(), returns.numpy()


# ---------------------------------------------------------------------------------------------- checkers
@checker
def check_length_adaptive_lam(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(lengths, alpha) -> (B,)`` with VAPO's length-adaptive lambda, on lengths on both sides of
    ``1/alpha`` (where the unclamped formula is negative) and far beyond it."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        alpha = float(rng.choice([0.05, 0.1, 0.02, rng.uniform(0.01, 0.5)]))
        knee = 1.0 / alpha
        lengths = np.concatenate([[1, int(np.ceil(knee)), int(4 * knee) + 1],
                                  rng.integers(1, int(8 * knee) + 2, size=int(rng.integers(1, 8)))])
        original = lengths.copy()
        inputs = f"  inputs of trial {trial} (seed {seed}): alpha={alpha}, lengths = {lengths.tolist()}"
        got = call_reader(fn, (lengths, alpha), inputs)
        if got is None:
            raise AssertionError(f"your function returned None; it must return a (B,) array\n{inputs}")
        if not np.array_equal(lengths, original):
            raise AssertionError(f"your function changed lengths in place; work on a copy\n{inputs}")
        got = np.asarray(got, dtype=np.float64)
        expected = reference_length_adaptive_lam(lengths, alpha)
        hint = ""
        if got.shape == expected.shape and (got < 0).any():
            hint = (" (a negative lambda: for alpha * l < 1 the formula 1 - 1/(alpha l) is below 0; clamp it to "
                    "[0, 1])")
        assert_close(got, expected, "length-adaptive lambda", atol=1e-6, rtol=1e-6, hint=hint, inputs=inputs)
    print("ok")


@checker
def check_decoupled_gae(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, values, mask, gamma, lam_policy, lam_critic) -> (advantages, returns)`` with GAE run
    twice (the policy's per-row lambda for the advantages, the critic's lambda for the returns), on right-padded
    rows of random lengths."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        B, T = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        lengths = rng.integers(1, T + 1, size=B)
        mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
        rewards = rng.normal(size=(B, T)) * mask
        values = rng.normal(size=(B, T)) * mask
        gamma = float(rng.choice([1.0, 0.9, rng.uniform(0.5, 1.0)]))
        lam_policy = rng.uniform(0.0, 1.0, size=B)
        lam_critic = float(rng.choice([1.0, 0.95, rng.uniform(0.0, 1.0)]))
        inputs = (f"  inputs of trial {trial} (seed {seed}): gamma={gamma}, lam_critic={lam_critic}, lam_policy = "
                  f"{lam_policy.round(4).tolist()}, mask = {mask.astype(int).tolist()}")
        got = call_reader(fn, (rewards.copy(), values.copy(), mask.copy(), gamma, lam_policy.copy(), lam_critic),
                          inputs)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"your function must return (advantages, returns), got {type(got).__name__}\n"
                                 f"{inputs}")
        advantages, returns = (np.asarray(x, dtype=np.float64) for x in got)
        expected_adv, expected_ret = reference_decoupled_gae(rewards, values, mask, gamma, lam_policy, lam_critic)
        assert_close(advantages, expected_adv, "advantages (GAE with lam_policy)", atol=1e-6, rtol=1e-6, inputs=inputs)
        hint = ""
        coupled = expected_adv + values * mask
        if returns.shape == coupled.shape and np.allclose(returns, coupled, atol=1e-6) and not np.allclose(
                coupled, expected_ret, atol=1e-6):
            hint = " (your returns are A + V with the policy's lambda; the critic's targets use lam_critic)"
        assert_close(returns, expected_ret, "returns (GAE with lam_critic, plus V)", atol=1e-6, rtol=1e-6,
                     hint=hint, inputs=inputs)
    print("ok")
