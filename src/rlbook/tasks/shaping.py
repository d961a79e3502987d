"""Length-based reward shaping added on top of a task's correctness reward.

DAPO's *soft overlong punishment* (Yu et al. 2025, arXiv:2503.14476, "Overlong Reward Shaping") for a
response of ``|y|`` tokens, an expected length ``L_max - L_cache`` and a hard budget ``L_max``:

    R_length(y) = 0                                        if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache      if L_max - L_cache < |y| <= L_max
                = -1                                       if |y| > L_max

It is added to the +-1 correctness reward; DAPO also masks the loss of truncated samples (overlong filtering),
which is a trainer's choice, not a reward.
"""

from __future__ import annotations

import numpy as np

from rlbook.tasks.base import check_int


def soft_overlong_penalty(lengths, max_length: int, cache_length: int) -> np.ndarray:
    """DAPO's soft overlong punishment per response, in [-1, 0].

    Args:
        lengths: response lengths ``|y|`` (tokens; characters for the char-level LMs), shape
        ``(B,)``.
        max_length: ``L_max``, the hard generation budget.
        cache_length: ``L_cache``, the width of the linear ramp, ``1 <= L_cache <= L_max``.

    Returns:
        float64 array of shape ``(B,)``: 0 up to ``L_max - L_cache``, then a linear ramp to -1 at
        ``L_max``, and -1 beyond it.
    """
    max_length = check_int(max_length, "max_length", minimum=1)
    cache_length = check_int(cache_length, "cache_length", minimum=1)
    if cache_length > max_length:
        raise ValueError(f"cache_length ({cache_length}) must be <= max_length ({max_length})")
    lengths = np.asarray(lengths, dtype=np.float64)
    if np.any(lengths < 0):
        raise ValueError("lengths must be non-negative")
    expected_length = max_length - cache_length
    ramp = (expected_length - lengths) / cache_length
    return np.where(lengths <= expected_length, 0.0, np.where(lengths <= max_length, ramp, -1.0))


def shape_rewards(rollout, config) -> np.ndarray:
    """A rollout's rewards (:class:`rlbook.rollout.Rollout`, (B,)) with DAPO's soft overlong punishment added
    when ``config.overlong_buffer_length`` is set (:class:`rlbook.presets.RLConfig`; the ramp's ``L_cache``
    before the budget ``max_completion_length``), else the rewards themselves."""
    if config.overlong_buffer_length is None:
        return rollout.rewards
    lengths = rollout.batch.lengths.cpu().numpy()
    return rollout.rewards + soft_overlong_penalty(lengths, config.max_completion_length,
                                                   config.overlong_buffer_length)
