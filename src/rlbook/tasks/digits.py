"""Digit-string tasks with an optional scratchpad: sort the digits, or reverse them.

``SortDigits``: ``"sort:3142="`` -> ``"1234"``.  ``ReverseDigits``: ``"rev:3142="`` -> ``"2413"``.

With ``scratchpad=True`` the demonstration first writes the answer for every prefix of the input, separated by
``","``, then the marker ``"|"`` and the final answer::

    sort:3142=  ->  3,13,134,1234|1234        (insertion sort, one digit inserted per step)
    rev:3142=   ->  3,13,413,2413|2413        (one digit prepended per step)

The scratchpad grows quadratically with the input (``L(L+1)/2 + 2L`` characters for ``L`` digits), so correct
outputs are long and their length varies across prompts: this is where the length biases of GRPO
(Dr. GRPO), DAPO's overlong shaping and GFPO's length filtering can show up.

Reward (the convention of :mod:`rlbook.tasks.base`): without a scratchpad, ``correct_reward`` when the
completion, stripped of surrounding spaces, equals the answer exactly. With a scratchpad, only the text after
the *last* ``"|"`` is checked (stripped of spaces); a completion without ``"|"`` is incorrect. The scratchpad
itself is not checked, so a model is free to shorten it, pad it, or skip it: length is its own choice.
"""

from __future__ import annotations

import numpy as np

from rlbook.tasks.base import DEFAULT_MAX_COMPLETION_LENGTH, Example, Task, check_int, check_range

ANSWER_MARKER = "|"
STEP_SEPARATOR = ","


def corrupt_digits(digits: str, rng: np.random.Generator) -> str:
    """Return a plausible near-miss of the digit string ``digits``, always different from it.

    One of: a digit off by one (mod 10), two adjacent unequal digits swapped, a digit dropped, a digit repeated.
    """
    if len(digits) == 0:
        raise ValueError("cannot corrupt an empty digit string")
    candidates = set()
    for i, digit in enumerate(digits):
        for step in (1, -1):
            candidates.add(digits[:i] + str((int(digit) + step) % 10) + digits[i + 1:])
        if len(digits) > 1:
            candidates.add(digits[:i] + digits[i + 1:])
        candidates.add(digits[:i] + digit + digits[i:])
    for i in range(len(digits) - 1):
        candidates.add(digits[:i] + digits[i + 1] + digits[i] + digits[i + 2:])
    candidates.discard(digits)
    candidates = sorted(candidates)
    return candidates[int(rng.integers(0, len(candidates)))]


def final_answer(text: str) -> str | None:
    """The text after the last ``"|"``, stripped of surrounding spaces; None if there is no ``"|"``."""
    if ANSWER_MARKER not in text:
        return None
    return text.rsplit(ANSWER_MARKER, 1)[1].strip(" ")


class DigitTransformTask(Task):
    """A task that maps a random digit string to another digit string by :meth:`transform`.

    Prompt ``f"{prefix}:{digits}="``; answer ``transform(digits)``.

    Args:
        min_length, max_length: the number of input digits is drawn uniformly from this range (inclusive).
        scratchpad: if True, demonstrations show ``transform`` of every prefix before ``"|"`` and the answer.
        correct_reward, incorrect_reward, max_completion_length, length_bonus: see
            :class:`rlbook.tasks.base.Task` (``length_bonus``: a spurious reward per completion character).
    """

    prefix = "digits"

    def __init__(
        self,
        min_length: int = 3,
        max_length: int = 6,
        scratchpad: bool = False,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH,
        length_bonus: float = 0.0,
    ):
        self.min_length = check_int(min_length, "min_length", minimum=1)
        self.max_length = check_int(max_length, "max_length", minimum=1)
        check_range(self.min_length, self.max_length, "min_length", "max_length")
        self.scratchpad = bool(scratchpad)
        super().__init__(correct_reward, incorrect_reward, max_completion_length, length_bonus)

    def transform(self, digits: str) -> str:
        """The answer for the input ``digits``."""
        raise NotImplementedError

    @property
    def max_prompt_length(self) -> int:
        """``len(prefix) + 2 + max_length`` characters (the ``":"`` and ``"="``)."""
        return len(self.prefix) + 2 + self.max_length

    @property
    def max_demonstration_length(self) -> int:
        """``max_length``, or with a scratchpad ``L(L+1)/2 + (L-1)`` step characters, ``"|"`` and ``L``."""
        length = self.max_length
        if not self.scratchpad:
            return length
        return length * (length + 1) // 2 + (length - 1) + 1 + length

    def config(self) -> dict:
        return {"min_length": self.min_length, "max_length": self.max_length,
                "scratchpad": self.scratchpad, **super().config()}

    def sample_one(self, rng: np.random.Generator) -> Example:
        """Draw a length, then that many uniform digits (repeats allowed)."""
        length = int(rng.integers(self.min_length, self.max_length + 1))
        digits = "".join(str(digit) for digit in rng.integers(0, 10, size=length))
        return Example(prompt=f"{self.prefix}:{digits}=", answer=self.transform(digits),
                       meta={"digits": digits, "length": length})

    def input_digits(self, example: Example) -> str:
        """The digit string inside the prompt ``f"{prefix}:{digits}="``."""
        head = f"{self.prefix}:"
        if not (example.prompt.startswith(head) and example.prompt.endswith("=")):
            raise ValueError(f"prompt {example.prompt!r} is not of the form '{head}<digits>='")
        return example.prompt[len(head):-1]

    def demonstration(self, example: Example) -> str:
        """The answer, or with a scratchpad ``transform`` of each prefix joined by ``","``, then ``"|answer"``."""
        if not self.scratchpad:
            return example.answer
        digits = self.input_digits(example)
        steps = [self.transform(digits[:i]) for i in range(1, len(digits) + 1)]
        return STEP_SEPARATOR.join(steps) + ANSWER_MARKER + example.answer

    def check_answer(self, example: Example, text: str) -> bool:
        """Exact match of the (final, with a scratchpad) answer, stripped of surrounding spaces."""
        if self.scratchpad:
            return final_answer(text) == example.answer
        return text.strip(" ") == example.answer

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """The demonstration with its final answer corrupted by :func:`corrupt_digits`."""
        wrong_answer = corrupt_digits(example.answer, rng)
        if not self.scratchpad:
            return wrong_answer
        steps = self.demonstration(example).rsplit(ANSWER_MARKER, 1)[0]
        return steps + ANSWER_MARKER + wrong_answer


class SortDigits(DigitTransformTask):
    """Sort the digits ascending: ``"sort:3142="`` -> ``"1234"``; scratchpad ``"3,13,134,1234|1234"``.

    Args: see :class:`DigitTransformTask`.
    """

    name = "sort_digits"
    prefix = "sort"

    def transform(self, digits: str) -> str:
        """The digits in ascending order."""
        return "".join(sorted(digits))


class ReverseDigits(DigitTransformTask):
    """Reverse the digits: ``"rev:3142="`` -> ``"2413"``; scratchpad ``"3,13,413,2413|2413"``.

    Args: see :class:`DigitTransformTask`.
    """

    name = "reverse_digits"
    prefix = "rev"

    def transform(self, digits: str) -> str:
        """The digits in reverse order."""
        return digits[::-1]
