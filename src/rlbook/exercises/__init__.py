"""Checkers for the book's exercises.

Each ``check_<name>(fn)`` calls the reader's ``fn`` and the reference implementation on many random inputs,
raises ``AssertionError`` with the first disagreement, and prints ``ok`` when all agree::

    from rlbook.exercises import check_expected_sarsa_update
    check_expected_sarsa_update(my_expected_sarsa_update)
"""

from rlbook.exercises._compare import assert_close

__all__ = ["assert_close"]
