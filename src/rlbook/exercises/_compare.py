"""Shared helpers for the exercise checkers: comparing results, and calling the reader's function."""

from __future__ import annotations

from typing import Callable

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


def call_reader(fn: Callable, args: tuple, inputs: str | Callable[[], str], kwargs: dict | None = None):
    """Call the reader's ``fn(*args, **kwargs)``; if it raises, raise ``AssertionError`` that names the error and
    shows the trial's ``inputs`` (a string, or a function that builds it), chained to the original traceback.

    ``NotImplementedError`` passes through unchanged: it is the stub of an exercise not attempted yet (the student
    edition's stubs raise it), not a bug that depends on the inputs.
    """
    try:
        return fn(*args, **(kwargs or {}))
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - any crash of the reader's code is reported with its inputs
        shown = inputs() if callable(inputs) else inputs
        raise AssertionError(
            f"your function raised {type(error).__name__}: {error}\n"
            f"(its traceback is printed above this message)\n{shown}"
        ) from error
