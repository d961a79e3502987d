"""Shared comparison helper for the exercise checkers."""

from __future__ import annotations

import numpy as np


def assert_close(got, expected, what: str, atol: float = 1e-8, rtol: float = 1e-6) -> None:
    """Raise ``AssertionError`` naming ``what`` when ``got`` differs from ``expected`` (shape or values)."""
    got_array = np.asarray(got, dtype=float)
    expected_array = np.asarray(expected, dtype=float)
    if got_array.shape != expected_array.shape:
        raise AssertionError(f"{what}: expected shape {expected_array.shape}, got {got_array.shape}")
    if np.allclose(got_array, expected_array, atol=atol, rtol=rtol):
        return
    if got_array.ndim == 0:
        raise AssertionError(f"{what}: expected {expected_array}, got {got_array}")
    worst = np.unravel_index(np.argmax(np.abs(got_array - expected_array)), got_array.shape)
    raise AssertionError(
        f"{what}: expected {expected_array[worst]}, got {got_array[worst]} at index {tuple(int(i) for i in worst)}"
    )
