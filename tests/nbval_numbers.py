"""nbval plugin: numbers in a stored output match a fresh run within a tolerance; everything else matches exactly.

Load it with ``pytest --nbval -p tests.nbval_numbers`` (``scripts/run_tests.sh`` does). Different CPUs run
different float kernels, so a fresh run of a chapter may print ``0.891388`` where the stored notebook says
``0.891389``, or ``2.0999999999999996`` where it says ``2.1``. Those are the same result. A changed integer, a
changed word or a number that moved by more than the tolerance is not.

Two outputs agree when, after nbval's sanitizers, they split into the same text between the numbers, the same
count of numbers, integers that are equal, and decimals ``a`` (stored) and ``b`` (fresh) with

    |a - b| <= max(RELATIVE * max(|a|, |b|), one unit of the last digit printed in either),

where ``RELATIVE = 1e-4``. Numbers are compared by value, so rounding (not truncation) decides: ``2.1`` and
``2.0999999999999996`` agree, ``2.1`` and ``2.2`` do not.

What this relies on in nbval 0.11.0 (pinned in requirements.txt): ``IPyNbCell.compare_outputs`` passes each
text output through ``IPyNbCell.sanitize`` and then compares the stored and the fresh value with
``ref_out != test_out``, skipping the MIME types in ``skip_compare``. We wrap ``sanitize`` so that it returns a
:class:`NumericText`, a ``str`` whose ``!=``/``==`` apply the rule above, and add glued figures
(``application/papermill.record/image/png``) to the skipped types, as nbval already skips ``image/png``. Every other use of the value (printing a diff) sees an ordinary string.
``tests/test_nbval_numbers.py`` checks that the hook is still in place, so an nbval upgrade that changes it fails
loudly instead of silently comparing exactly.
"""

from __future__ import annotations

import math
import re

RELATIVE = 1e-4

# A number not glued to a word or to another number: "E6", "x1" and "0xADDRESS" stay text. Its sign is kept
# only where the sign cannot be a binary minus: in "1-2" the lookbehind fails at "-", so "2" is read unsigned.
# A trailing full stop ends a sentence ("is 0.5."), not the number.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?!\w|\.\d)")


def _split(text: str):
    """``(texts, numbers)``: the text around the numbers (one more piece than numbers) and the number tokens."""
    return NUMBER.split(text), NUMBER.findall(text)


def _is_integer(token: str) -> bool:
    return re.fullmatch(r"[-+]?\d+", token) is not None


def _last_digit_unit(token: str) -> float:
    """The value of one unit in the last printed digit: 1e-4 for "0.1234", 1e-7 for "1.2e-06", 1 for "12."."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def numbers_agree(stored: str, fresh: str) -> bool:
    """True when the two number tokens are the same result (see the module docstring)."""
    if _is_integer(stored) or _is_integer(fresh):
        return _is_integer(stored) and _is_integer(fresh) and int(stored) == int(fresh)
    a, b = float(stored), float(fresh)
    if not (math.isfinite(a) and math.isfinite(b)):
        return stored == fresh
    # 1e-9 of slack: the unit itself is a float (10 ** -4 is not exactly representable)
    bound = max(RELATIVE * max(abs(a), abs(b)), max(_last_digit_unit(stored), _last_digit_unit(fresh)) * (1 + 1e-9))
    return abs(a - b) <= bound


def outputs_agree(stored: str, fresh: str) -> bool:
    """True when two text outputs differ at most in the last digits of their decimals."""
    if stored == fresh:
        return True
    stored_texts, stored_numbers = _split(stored)
    fresh_texts, fresh_numbers = _split(fresh)
    return (
        stored_texts == fresh_texts
        and len(stored_numbers) == len(fresh_numbers)
        and all(numbers_agree(a, b) for a, b in zip(stored_numbers, fresh_numbers))
    )


class NumericText(str):
    """A sanitized output whose comparison with another one tolerates float rounding (see :func:`outputs_agree`)."""

    def __eq__(self, other):
        if isinstance(other, str):
            return outputs_agree(str(self), str(other))
        return NotImplemented

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = str.__hash__


# A figure shown with {glue:figure} is stored as a papermill record; nbval skips image/png but not these keys,
# and would compare the picture byte for byte (its pixels move with the last digits of the data).
GLUED_IMAGES = ("application/papermill.record/image/png", "application/papermill.record/image/jpeg")


def install(cell_class) -> None:
    """Wrap ``cell_class.sanitize`` (nbval's ``IPyNbCell``) so that text outputs compare with tolerance, and
    ``cell_class.compare_outputs`` so that glued images are skipped like plain ones."""
    if getattr(cell_class.sanitize, "_numeric_text", False):
        return
    sanitize_exactly, compare_outputs = cell_class.sanitize, cell_class.compare_outputs

    def sanitize(self, s):
        s = sanitize_exactly(self, s)
        return NumericText(s) if isinstance(s, str) else s

    def compare_outputs_skipping_glued_images(self, test, ref, skip_compare=None):
        skip = tuple(skip_compare or self.parent.skip_compare) + GLUED_IMAGES
        return compare_outputs(self, test, ref, skip)

    sanitize._numeric_text = True
    cell_class.sanitize = sanitize
    cell_class.compare_outputs = compare_outputs_skipping_glued_images


def pytest_configure(config):
    from nbval.plugin import IPyNbCell

    install(IPyNbCell)
