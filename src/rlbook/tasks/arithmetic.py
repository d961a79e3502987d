"""Integer arithmetic: ``"23+58="`` -> ``"81"``.

Reward (the convention of :mod:`rlbook.tasks.base`): ``correct_reward`` when the completion, after stripping
surrounding spaces, is *exactly* the canonical decimal form of the result, else ``incorrect_reward``.
Canonical means what Python's ``str(int)`` writes: no leading zeros (``"081"`` is wrong), no plus sign
(``"+81"`` is wrong), a minus sign only for negative results (``"-0"`` is wrong), no inner spaces.
"""

from __future__ import annotations

import numpy as np

from rlbook.tasks.base import DEFAULT_MAX_COMPLETION_LENGTH, Example, Task, check_int, check_range
from rlbook.tasks.digits import ANSWER_MARKER, STEP_SEPARATOR, final_answer

OPERATIONS = "+-*"


class Arithmetic(Task):
    """Binary arithmetic on non-negative integers with up to ``num_digits`` digits each.

    Prompt ``f"{a}{op}{b}="``, answer ``str(result)``; e.g. ``"23+58="`` -> ``"81"``, ``"7*12="`` -> ``"84"``.

    Args:
        num_digits: operands are drawn uniformly from ``0 .. 10**num_digits - 1`` (the difficulty knob).
        operations: the operators to draw from uniformly, a non-empty string over ``"+-*"`` without repeats.
        allow_negative: if False, a subtraction ``a-b`` with ``a < b`` is written ``b-a`` so every answer is
            non-negative; if True the answer may start with ``"-"``.
        correct_reward, incorrect_reward, max_completion_length, length_bonus: see
            :class:`rlbook.tasks.base.Task` (``length_bonus``: a spurious reward per completion character).
    """

    name = "arithmetic"

    def __init__(
        self,
        num_digits: int = 2,
        operations: str = "+",
        allow_negative: bool = False,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH,
        length_bonus: float = 0.0,
    ):
        self.num_digits = check_int(num_digits, "num_digits", minimum=1)
        if not isinstance(operations, str) or len(operations) == 0:
            raise ValueError(f"operations must be a non-empty string over {OPERATIONS!r}, got {operations!r}")
        for operation in operations:
            if operation not in OPERATIONS:
                raise ValueError(f"unknown operation {operation!r} in operations={operations!r}; "
                                 f"choose from {OPERATIONS!r}")
        if len(set(operations)) != len(operations):
            raise ValueError(f"operations={operations!r} repeats an operation")
        self.operations = operations
        self.allow_negative = bool(allow_negative)
        super().__init__(correct_reward, incorrect_reward, max_completion_length, length_bonus)

    @property
    def max_prompt_length(self) -> int:
        """Two operands, the operator and ``"="``: ``2 * num_digits + 2`` characters."""
        return 2 * self.num_digits + 2

    @property
    def max_demonstration_length(self) -> int:
        """The longest answer: ``num_digits + 1`` for a sum or a negative difference, ``2 * num_digits`` for a
        product, ``num_digits`` for a non-negative difference."""
        longest_answer = {
            "+": self.num_digits + 1,
            "-": self.num_digits + 1 if self.allow_negative else self.num_digits,
            "*": 2 * self.num_digits,
        }
        return max(longest_answer[operation] for operation in self.operations)

    def config(self) -> dict:
        return {"num_digits": self.num_digits, "operations": self.operations,
                "allow_negative": self.allow_negative, **super().config()}

    def sample_one(self, rng: np.random.Generator) -> Example:
        """Draw operands and an operator; returns an Example with ``meta`` = operands, operator, result."""
        high = 10 ** self.num_digits
        a = int(rng.integers(0, high))
        b = int(rng.integers(0, high))
        operation = self.operations[int(rng.integers(0, len(self.operations)))]
        if operation == "-" and not self.allow_negative and a < b:
            a, b = b, a
        result = {"+": a + b, "-": a - b, "*": a * b}[operation]
        return Example(prompt=f"{a}{operation}{b}=", answer=str(result),
                       meta={"a": a, "b": b, "operation": operation, "result": result})

    def split_key(self, example: Example) -> str:
        """The prompt, with the operands of a sum or product in ascending order: ``"58+23="`` and ``"23+58="`` are
        one problem, so they share a split."""
        prompt = example.prompt
        for operation in "+*":
            if operation in prompt:
                a, b = prompt[:-1].split(operation)
                return f"{min(a, b, key=int)}{operation}{max(a, b, key=int)}="
        return prompt

    def check_answer(self, example: Example, text: str) -> bool:
        """Exact match of the stripped text with the canonical answer (no leading zeros, no
        ``+``)."""
        return text.strip(" ") == example.answer

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """A plausible wrong answer in canonical form: off by one, off by ten (a dropped carry), or two adjacent
        digits swapped."""
        result = int(example.answer)
        candidates = {result + 1, result - 1, result + 10, result - 10}
        digits = str(abs(result))
        for i in range(len(digits) - 1):
            swapped = digits[:i] + digits[i + 1] + digits[i] + digits[i + 2:]
            if swapped[0] != "0":  # "10" -> "01" would be a different number of digits, not a swap
                candidates.add(int(swapped) * (-1 if result < 0 else 1))
        candidates.discard(result)
        answers_can_be_negative = self.allow_negative and "-" in self.operations
        if not answers_can_be_negative:
            candidates = {value for value in candidates if value >= 0}
        candidates = sorted(candidates)
        return str(candidates[int(rng.integers(0, len(candidates)))])


class ScratchpadAddition(Task):
    """The sum of two numbers of ``min_digits`` to ``max_digits`` digits each, written at once or after a
    scratchpad: ``"472+385="`` -> ``"857"``, or ``"7,5,8|857"``, the sum's digits first from the least
    significant one (the order in which a carry is worked out), then ``"|"`` and the sum.

    As with a chain of thought, only the final answer is verified: a completion is right when it is the sum, or
    when the text after its last ``"|"`` is the sum, whatever comes before. The demonstration is one form or the
    other, the scratchpad with probability ``scratchpad_rate`` (drawn with the problem): a model fine-tuned on them
    chooses the length of its answers, which is what GFPO filters (the scratchpad makes a sum of three or more
    digits right more often for the small models of this book, so RL has a reason to lengthen the right answers).

    Args:
        min_digits, max_digits: each operand has this many digits (drawn uniformly per problem; 1-digit operands
            include 0).
        scratchpad_rate: the share of demonstrations that use the scratchpad, in [0, 1].
        correct_reward, incorrect_reward, max_completion_length, length_bonus: see
            :class:`rlbook.tasks.base.Task`.
    """

    name = "addition_scratchpad"

    def __init__(self, min_digits: int = 2, max_digits: int = 4, scratchpad_rate: float = 0.5,
                 correct_reward: float = 1.0, incorrect_reward: float = 0.0,
                 max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH, length_bonus: float = 0.0):
        self.min_digits = check_int(min_digits, "min_digits", minimum=1)
        self.max_digits = check_int(max_digits, "max_digits", minimum=1)
        check_range(self.min_digits, self.max_digits, "min_digits", "max_digits")
        if not (isinstance(scratchpad_rate, (int, float)) and 0.0 <= scratchpad_rate <= 1.0):
            raise ValueError(f"scratchpad_rate must be a number in [0, 1], got {scratchpad_rate!r}")
        self.scratchpad_rate = float(scratchpad_rate)
        super().__init__(correct_reward, incorrect_reward, max_completion_length, length_bonus)

    @property
    def max_prompt_length(self) -> int:
        return 2 * self.max_digits + 2

    @property
    def max_demonstration_length(self) -> int:
        """With the scratchpad: a sum of ``max_digits + 1`` digits, reversed with commas, ``"|"``, the sum."""
        digits = self.max_digits + 1
        return (2 * digits - 1) + 1 + digits

    def config(self) -> dict:
        return {"min_digits": self.min_digits, "max_digits": self.max_digits,
                "scratchpad_rate": self.scratchpad_rate, **super().config()}

    def sample_one(self, rng: np.random.Generator) -> Example:
        """Draw the number of digits, two operands of that many, and whether the demonstration uses the
        scratchpad."""
        digits = int(rng.integers(self.min_digits, self.max_digits + 1))
        low = 10 ** (digits - 1) if digits > 1 else 0
        a, b = (int(value) for value in rng.integers(low, 10 ** digits, size=2))
        scratchpad = bool(rng.random() < self.scratchpad_rate)
        return Example(prompt=f"{a}+{b}=", answer=str(a + b),
                       meta={"a": a, "b": b, "digits": digits, "scratchpad": scratchpad})

    def split_key(self, example: Example) -> str:
        """The prompt with the operands in ascending order (``"58+23="`` and ``"23+58="`` are one problem)."""
        a, b = example.prompt[:-1].split("+")
        return f"{min(a, b, key=int)}+{max(a, b, key=int)}="

    @staticmethod
    def worked(answer: str) -> str:
        """The scratchpad form of ``answer``: ``"857"`` -> ``"7,5,8|857"``."""
        return STEP_SEPARATOR.join(reversed(answer)) + ANSWER_MARKER + answer

    def demonstration(self, example: Example) -> str:
        return self.worked(example.answer) if example.meta["scratchpad"] else example.answer

    def check_answer(self, example: Example, text: str) -> bool:
        """The sum, alone or after the last ``"|"`` (surrounding spaces stripped)."""
        answer = final_answer(text) if ANSWER_MARKER in text else text.strip(" ")
        return answer == example.answer

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """A sum off by one or by ten (a dropped carry), in the demonstration's form."""
        result = int(example.answer)
        candidates = sorted(value for value in (result - 10, result - 1, result + 1, result + 10) if value >= 0)
        wrong = str(candidates[int(rng.integers(0, len(candidates)))])
        return self.worked(wrong) if example.meta["scratchpad"] else wrong
