"""The one tie rule for acting greedily on action values, shared by every function of the package that argmaxes Q.

An action ``a`` is *greedy* in state ``s`` when its value is within ``atol`` of the best one:

    G(s) = { a : Q(s, a) >= max_b Q(s, b) - atol },        atol = TIE_ATOL = 1e-10 by default.

The tolerance makes values that differ only by rounding (the same return summed in another order) count as tied.
A deterministic choice takes the *lowest index* in ``G(s)`` (:func:`greedy_action`: ``greedy_policy``,
``greedy_rollout``, policy improvement, double Q-learning's argmax); the epsilon-greedy policy spreads its greedy
mass ``1 - epsilon`` *uniformly* over ``G(s)`` (``epsilon_greedy_probs``). So the deterministic greedy action is
always one of the actions the epsilon-greedy policy treats as greedy. Without near-ties the rule is ``np.argmax``.
"""

from __future__ import annotations

import numpy as np

TIE_ATOL = 1e-10


def greedy_mask(q_values, atol: float = TIE_ATOL) -> np.ndarray:
    """Boolean mask of the greedy actions ``G(s)``, shape ``(..., A)`` like ``q_values`` (at least one per row)."""
    q = np.asarray(q_values, dtype=float)
    if q.ndim == 0 or q.shape[-1] == 0:
        raise ValueError(f"q_values must have a last axis of at least one action, got shape {q.shape}")
    if np.any(np.isnan(q)):
        raise ValueError("q_values contain NaN")
    if not atol >= 0:
        raise ValueError(f"atol must be non-negative, got {atol}")
    return q >= q.max(axis=-1, keepdims=True) - atol


def greedy_action(q_values, atol: float = TIE_ATOL):
    """The lowest-index greedy action: an int for ``q_values`` of shape ``(A,)``, an int array of shape ``(...)``
    for shape ``(..., A)``."""
    choice = np.argmax(greedy_mask(q_values, atol), axis=-1)
    return int(choice) if choice.ndim == 0 else choice
