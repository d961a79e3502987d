"""The nbval plugin tests/nbval_numbers.py: which stored and fresh outputs count as the same."""

import inspect

import pytest

from tests.nbval_numbers import GLUED_IMAGES, NumericText, install, numbers_agree, outputs_agree


@pytest.mark.parametrize(
    "stored, fresh",
    [
        ("2.1", "2.0999999999999996"),  # float64 error from another BLAS kernel
        ("0.891389", "0.891388"),  # one unit of the last printed digit
        ("0.1235", "0.1234"),  # one unit, four digits
        ("2.1", "2.2"),  # one unit: 2.149 and 2.151 round apart, and they are the same result
        ("0.891389", "0.891386"),  # 3e-6 relative
        ("1.2e-05", "1.3e-05"),  # one unit of the last digit, in exponent notation
        ("123456.7", "123460.1"),  # within 1e-4 relative
        ("-0.0000", "0.0000"),  # a signed zero
        ("12.", "12.0"),
    ],
)
def test_numbers_that_agree(stored, fresh):
    assert numbers_agree(stored, fresh) and numbers_agree(fresh, stored)


@pytest.mark.parametrize(
    "stored, fresh",
    [
        ("2.1", "2.3"),  # two units of the last digit
        ("0.891389", "0.891189"),  # 2e-4 relative
        ("0.5", "0.7"),
        ("5.960464e-06", "8.106231e-06"),  # float error printed: its digits are noise, and they differ
        ("10", "11"),  # integers are exact
        ("3", "3.0"),  # an integer is not a decimal
        ("nan", "0.5"),
    ],
)
def test_numbers_that_do_not_agree(stored, fresh):
    assert not numbers_agree(stored, fresh) and not numbers_agree(fresh, stored)


@pytest.mark.parametrize(
    "stored, fresh",
    [
        ("V = [2.96875 1.40625]", "V = [2.968749 1.406251]"),
        ("loss 0.3473 after 750 steps\n", "loss 0.3472 after 750 steps\n"),
        ("tensor([-0.5000,  0.2500])", "tensor([-0.5001,  0.2500])"),
        ("is 0.5.", "is 0.50001."),  # a full stop ends the sentence, not the number
        ("E6: 0.9333", "E6: 0.93334"),
        ("1-2.0000", "1-2.0001"),
    ],
)
def test_outputs_that_agree(stored, fresh):
    assert outputs_agree(stored, fresh)


@pytest.mark.parametrize(
    "stored, fresh",
    [
        ("accuracy 0.504", "precision 0.504"),  # the text around numbers is exact
        ("V = [2.96875 1.40625]", "V = [2.96875 1.40625 0.0]"),  # one number more
        ("750 steps", "751 steps"),
        ("E6: 0.9333", "E7: 0.9333"),  # a number inside a word is text
        ("x1 = 0.5", "x2 = 0.5"),
        ("0xADDRESS", "0xADDRESS2"),
        ("12,345", "12,346"),  # thousands separators: integers, exact
        ("0.5 ", "0.5"),  # whitespace is text
    ],
)
def test_outputs_that_do_not_agree(stored, fresh):
    assert not outputs_agree(stored, fresh)


def test_numeric_text_compares_with_tolerance_and_stays_a_string():
    stored, fresh = NumericText("mean 2.1"), NumericText("mean 2.0999999999999996")
    assert stored == fresh and not (stored != fresh)
    assert stored != NumericText("mean 2.3")
    assert isinstance(stored, str) and stored.upper() == "MEAN 2.1"


def test_plugin_wraps_nbvals_sanitize_and_nbval_still_compares_with_ne():
    """The plugin relies on nbval 0.11's compare_outputs comparing sanitized values with ``!=``: fail loudly if
    an nbval upgrade changes that, instead of silently falling back to exact comparison."""
    from nbval.plugin import IPyNbCell

    assert "self.sanitize(" in inspect.getsource(IPyNbCell.compare_outputs)
    assert "ref_out != test_out" in inspect.getsource(IPyNbCell.compare_outputs)
    assert "if data_key not in skip_compare" in inspect.getsource(IPyNbCell.compare_outputs)

    class Cell:
        parent = type("File", (), {"skip_compare": ("metadata",)})()

        def sanitize(self, s):
            return s.replace("0xabc", "0xADDRESS") if isinstance(s, str) else s

        def compare_outputs(self, test, ref, skip_compare=None):
            return skip_compare

    install(Cell)
    install(Cell)  # idempotent
    out = Cell().sanitize("at 0xabc: 0.891389")
    assert isinstance(out, NumericText) and out == "at 0xADDRESS: 0.891388"
    assert Cell().sanitize(["not", "text"]) == ["not", "text"]
    assert Cell().compare_outputs([], []) == ("metadata", *GLUED_IMAGES), "glued figures are not compared"
