"""Shared helpers for the exercise checkers: comparing results, and calling the reader's function."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np


def assert_close(got, expected, what: str, atol: float = 1e-8, rtol: float = 1e-6, hint: str = "",
                 inputs: str = "") -> None:
    """Raise ``AssertionError`` naming ``what`` when ``got`` differs from ``expected`` (shape or values).

    ``hint`` (a likely cause) is appended to the message, then the trial's ``inputs`` on a line of their own."""
    got_array = np.asarray(got, dtype=float)
    expected_array = np.asarray(expected, dtype=float)
    if got_array.shape != expected_array.shape:
        message = f"{what}: expected shape {expected_array.shape}, got {got_array.shape}"
    elif np.allclose(got_array, expected_array, atol=atol, rtol=rtol):
        return
    elif got_array.ndim == 0:
        message = f"{what}: expected {expected_array}, got {got_array}"
    else:
        worst = np.unravel_index(np.argmax(np.abs(got_array - expected_array)), got_array.shape)
        message = (f"{what}: expected {expected_array[worst]}, got {got_array[worst]} at index "
                   f"{tuple(int(i) for i in worst)}")
    raise AssertionError(message + hint + (f"\n{inputs}" if inputs else ""))


def assert_inputs_unchanged(before: dict, after: dict, inputs: str | Callable[[], str]) -> None:
    """Raise ``AssertionError`` if the reader's function changed any of its inputs in place (``before`` holds
    copies taken before the call, ``after`` the objects it was given; NaN compares equal to NaN)."""
    for name, original in before.items():
        now = after[name]
        if not np.array_equal(np.nan_to_num(np.asarray(original, dtype=float), nan=7.0),
                              np.nan_to_num(np.asarray(now, dtype=float), nan=7.0)):
            shown = inputs() if callable(inputs) else inputs
            raise AssertionError(f"your function modified its input {name!r} in place; work on a copy\n{shown}")


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


def as_tensor(got, what: str, inputs: str):
    """The reader's result as a detached CPU tensor; ``AssertionError`` naming ``what`` was expected if it is
    None or not a tensor."""
    import torch

    if got is None:
        raise AssertionError(f"your function returned None; it must return {what}\n{inputs}")
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"your function returned a {type(got).__name__}; it must return {what}\n{inputs}")
    return got.detach().cpu()


def check_against_reference(fn: Callable, trials: Iterable[tuple[dict, Callable[[], str]]], reference: Callable,
                            what: str, atol: float, rtol: float) -> None:
    """For each trial ``(arguments, shown)``: call ``fn(**arguments)``, then require that no tensor argument was
    changed in place, that the result is finite everywhere (0 on padding), and that it equals
    ``reference(**arguments)``; every message shows the trial's inputs (``shown()``)."""
    import torch

    for arguments, shown in trials:
        tensors = {name: value for name, value in arguments.items() if isinstance(value, torch.Tensor)}
        before = {name: value.clone() for name, value in tensors.items()}
        got = torch.as_tensor(call_reader(fn, tuple(arguments.values()), shown))
        assert_inputs_unchanged(before, tensors, shown)
        if not bool(torch.isfinite(got).all()):
            raise AssertionError(f"{what} must be finite everywhere (0 on padding); got\n{got}\n{shown()}")
        assert_close(got, reference(**arguments), what, atol=atol, rtol=rtol, inputs=shown())
    print("ok")
