"""Shared helpers for the exercise checkers: comparing results, calling the reader's function, and short verdicts.

Every ``check_<name>`` is wrapped by :func:`checker`, so that in a notebook

- a stub that still raises ``NotImplementedError`` gives one line, ``ExerciseNotDone: ...``, not a traceback
  through the checker's internals;
- a wrong answer gives ``CheckFailed: ...``: the first mismatch and its index, the largest difference, a hint
  when the answer matches a known mistake, then the trial's inputs, numbers rounded to 4 significant digits
  and long lists cut (the seed and the trial number rebuild them exactly);
- a crash of the reader's function shows the message and only the frames of the reader's own code;
- an answer of the wrong kind (``None``, a numpy array for a tensor, the wrong shape) is named as such, from
  the exercise's ``reference_<name>`` called on copies of the same inputs, and the checker never crashes on
  it: whatever its own code raises on the answer becomes a ``CheckFailed`` that says what it could not use.

Both exceptions subclass the built-in ones (``NotImplementedError``, ``AssertionError``), so tests and scripts
that catch those keep working; IPython prints them through their ``_render_traceback_``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import re
import traceback
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

_HERE = Path(__file__).resolve().parent  # rlbook/exercises: frames in here are the checker's, not the reader's
MAX_LINES = 24  # a verdict longer than this is cut (the trial and seed it names rebuild the inputs)


# ---------------------------------------------------------------------------------------------- short verdicts
class ExerciseNotDone(NotImplementedError):
    """The reader's function is still the stub of the student edition (it raises ``NotImplementedError``)."""

    def _render_traceback_(self) -> list[str]:  # IPython: one line instead of a traceback
        return [f"{type(self).__name__}: {self}"]


class CheckFailed(AssertionError):
    """A checker's verdict on a wrong answer (or a crash of the reader's function, kept as ``__cause__``)."""

    def _render_traceback_(self) -> list[str]:
        lines = f"{type(self).__name__}: {self}".splitlines()
        cause = self.__cause__
        if cause is not None and cause.__traceback__ is not None:
            frames = [f for f in traceback.extract_tb(cause.__traceback__)
                      if not Path(f.filename).resolve().is_relative_to(_HERE) and "site-packages" not in f.filename]
            if frames:
                lines.append("where your code raised it:")
                lines += [line.rstrip("\n") for line in traceback.format_list(frames)]
        return lines


def _round_numbers(text: str) -> str:
    """Decimal numbers with more than 4 significant digits rounded to 4 (``0.93521845`` -> ``0.9352``)."""
    def shorter(match: re.Match) -> str:
        number = match.group(0)
        digits = len(re.sub(r"[^0-9]", "", number.split("e")[0].split("E")[0]).lstrip("0"))
        return f"{float(number):.4g}" if digits > 4 else number
    return re.sub(r"(?<![\w.])-?\d+\.\d+(?:[eE][-+]?\d+)?(?![\w.])", shorter, text)


def _cut_lists(text: str, keep: int = 8) -> str:
    """Bracketed lists of more than ``keep`` items cut to their first and last few: ``[1, 2, …, 9] (10 values)``."""
    def cut(match: re.Match) -> str:
        items = [item.strip() for item in match.group(1).split(",")]
        if len(items) <= keep:
            return match.group(0)
        return f"[{', '.join(items[:keep - 2])}, …, {', '.join(items[-2:])}] ({len(items)} values)"
    return re.sub(r"\[([^\[\]\n]*)\]", cut, text)


def short(message: str) -> str:
    """A checker's message as the reader sees it: numbers rounded, long lists and long messages cut."""
    message = _cut_lists(_round_numbers(message))
    lines = message.splitlines()
    if len(lines) > MAX_LINES:
        cut = len(lines) - MAX_LINES + 1
        lines = lines[:MAX_LINES - 1] + [f"  … ({cut} more lines: rerun the trial to see them)"]
    return "\n".join(lines)


def checker(check: Callable) -> Callable:
    """Decorate a ``check_<name>(fn, ...)``: its failures become one short :class:`CheckFailed` or
    :class:`ExerciseNotDone` (see the module docstring)."""

    @functools.wraps(check)
    def wrapped(fn, *args, **kwargs):
        __tracebackhide__ = True  # pytest and IPython leave this frame out
        reference = check.__globals__.get("reference_" + check.__name__.removeprefix("check_"))
        recorder = _Recorder(fn, reference) if callable(fn) else None
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):  # "ok" only once the answer's type is known right
                result = check(recorder or fn, *args, **kwargs)
        except (ExerciseNotDone, CheckFailed):
            raise
        except NotImplementedError as error:
            name = getattr(fn, "__name__", "your function")
            raise ExerciseNotDone(
                f"{name} is not written yet (it raises NotImplementedError: {error}); replace the raise with "
                f"your solution and run this cell again") from None
        except AssertionError as error:
            message = str(error)
            if recorder is not None and recorder.problem and "returned" not in message:
                message = f"{recorder.problem}\n{message}"
            raise CheckFailed(short(message)) from error.__cause__
        except Exception as error:  # noqa: BLE001 - the checker choked on the reader's answer: say on what
            raise CheckFailed(short(_choked(recorder, error))) from error
        if recorder is not None and recorder.problem:
            raise CheckFailed(recorder.problem)
        print(printed.getvalue(), end="")
        return result

    return wrapped


def _describe(value) -> str:
    """``"a torch.Tensor of shape (4, 7)"``, ``"a numpy.ndarray of shape (4,)"``, ``"a float"``, ``"None"``."""
    if value is None:
        return "None"
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple):
        return f"a {name} of shape {tuple(shape)}"
    return f"a {name}"


def _choked(recorder, error: Exception) -> str:
    """The message when a checker's own code raised on the reader's answer (an IndexError, TypeError, ...)."""
    if recorder is not None and recorder.raised is not None:
        raised = recorder.raised
        return f"your function raised {type(raised).__name__}: {raised}"
    if recorder is not None and recorder.problem:
        return f"{recorder.problem}\n  (the checker stopped on it: {type(error).__name__}: {error})"
    got = ""
    if recorder is not None and recorder.calls:
        got = f"your function returned {_describe(recorder.last)}; "
    return (f"{got}the checker could not use your answer ({type(error).__name__}: {error}); "
            f"check the type, shape and values that the exercise asks for")


def _copy(value):
    """A copy of an argument for the reference, so that an in-place reference leaves the reader's inputs alone."""
    if hasattr(value, "detach") and hasattr(value, "clone"):
        return value.detach().clone()
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - not copyable: the reference gets the object itself
        return value


class _Recorder:
    """The reader's function as the checker calls it. It remembers the last result (or exception) and, when the
    exercise has a reference (``reference_<name>`` next to ``check_<name>``), the first result whose type or
    shape differs from the reference's on (a copy of) the same arguments: ``None``, a numpy array for a tensor,
    a list, the wrong shape. :func:`checker` reports that problem when the check crashes on it, or passes."""

    def __init__(self, fn: Callable, reference: Callable | None):
        functools.update_wrapper(self, fn)
        self._fn, self._reference = fn, reference
        self.calls, self.last, self.raised, self.problem = 0, None, None, ""

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        copies = None
        if self._reference is not None:
            copies = tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()}
        try:
            result = self._fn(*args, **kwargs)
        except Exception as error:
            self.raised = error
            raise
        self.calls, self.last, self.raised = self.calls + 1, result, None
        if not self.problem:
            self.problem = _wrong_kind(result, self._expected(copies))
        return result

    def _expected(self, copies):
        if copies is None:
            return _NOTHING
        try:
            return self._reference(*copies[0], **copies[1])
        except Exception:  # noqa: BLE001 - no reference value for these arguments: no check
            return _NOTHING


_NOTHING = object()


def _wrong_kind(got, expected) -> str:
    """What is wrong with the type or shape of ``got`` next to the reference's ``expected`` ("" if nothing)."""
    if expected is _NOTHING:
        return "your function returned None; it must return a value (a missing return?)" if got is None else ""
    want = _describe(expected)
    if got is None:
        return f"your function returned None; expected {want} (a missing return?)"
    import torch

    if isinstance(expected, torch.Tensor) and not isinstance(got, torch.Tensor):
        return f"your function returned {_describe(got)}; expected {want} (torch.as_tensor converts it)"
    if isinstance(expected, np.ndarray) and expected.ndim and not isinstance(got, np.ndarray):
        extra = " (.numpy() converts a tensor)" if isinstance(got, torch.Tensor) else ""
        return f"your function returned {_describe(got)}; expected {want}{extra}"
    if isinstance(expected, (float, int, np.number)) and not isinstance(expected, bool):
        if not isinstance(got, (float, int, np.number)) and getattr(got, "shape", None) != ():
            return f"your function returned {_describe(got)}; expected a number"
    shape, want_shape = getattr(got, "shape", None), getattr(expected, "shape", None)
    if shape is not None and want_shape is not None and tuple(shape) != tuple(want_shape):
        return f"your function returned shape {tuple(shape)} but expected {tuple(want_shape)}"
    return ""


def show(value, limit: int = 8) -> str:
    """A number, array, tensor or list in a few characters: 4 significant digits, at most ``limit`` values
    (the first and last few of longer ones)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.kind in "fc":
        text = np.array2string(array, separator=", ", threshold=limit, edgeitems=3, max_line_width=100,
                               formatter={"float_kind": lambda v: f"{v:.4g}"})
    else:
        text = np.array2string(array, separator=", ", threshold=limit, edgeitems=3, max_line_width=100)
    return text


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
        message = f"{what}: expected {float(expected_array):.4g}, got {float(got_array):.4g}"
    else:
        wrong = ~np.isclose(got_array, expected_array, atol=atol, rtol=rtol)
        first = tuple(int(i) for i in np.argwhere(wrong)[0])
        difference = np.abs(got_array - expected_array)
        largest = float(np.nanmax(difference)) if np.isfinite(difference).any() else float("nan")
        message = (f"{what}: expected {expected_array[first]:.4g}, got {got_array[first]:.4g} at index "
                   f"{first if len(first) > 1 else first[0]} (the first of {int(wrong.sum())} wrong values out of "
                   f"{wrong.size}; largest difference {largest:.3g})")
        if np.isnan(got_array).any() and not np.isnan(expected_array).any():
            message += f"\n  your result contains NaN at {int(np.isnan(got_array).sum())} places"
    raise AssertionError(message + _hint_line(hint) + (f"\n{inputs}" if inputs else ""))


def _hint_line(hint: str) -> str:
    """A checker's hint ``" (you divided by ...)"`` on a line of its own: ``likely cause: you divided by ...``."""
    text = hint.strip()
    if not text or hint.startswith("\n"):
        return hint
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return f"\n  likely cause: {text}"


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
    edition's stubs raise it), not a bug that depends on the inputs; :func:`checker` turns it into one line.
    """
    try:
        return fn(*args, **(kwargs or {}))
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as error:  # noqa: BLE001 - any crash of the reader's code is reported with its inputs
        shown = inputs() if callable(inputs) else inputs
        raise AssertionError(
            f"your function raised {type(error).__name__}: {error}\n{shown}"
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
