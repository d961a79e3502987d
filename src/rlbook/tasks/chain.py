"""A long-horizon task of dependent steps: the running sum of a digit string, mod 10, written out step by step.

``RunningSum``: ``"sum:3142="`` -> ``"3+1=4,4+4=8,8+2=0|0"``. Each step copies the previous running sum, adds
the next digit and writes the new sum mod 10; the answer after ``"|"`` is the last sum. With 18-22 input digits a
demonstration is 103-127 characters (one token each for the character-level models): answers of 100 tokens and
more, the regime of value models on long sequences (GAE's lambda, VAPO).

Every step depends on the one before: a wrong sum is copied into the next step, so one early mistake decides the
outcome (the final sum is then wrong unless a later mistake cancels it, about one time in ten). The reward checks
only the final answer, so the outcome is decided at a token far from the one the reward is given at: a critic
that spots the first wrong sum can tell the policy where the mistake was, and Monte Carlo returns cannot.

Reward (the convention of :mod:`rlbook.tasks.base`): the text after the last ``"|"``, stripped of spaces, must equal
the last running sum; a completion without ``"|"`` is incorrect. The steps are not checked
(:func:`first_wrong_step` finds the first wrong one, for analysis).
"""

from __future__ import annotations

import numpy as np

from rlbook.tasks.base import DEFAULT_MAX_COMPLETION_LENGTH, Example, Task, check_int, check_range
from rlbook.tasks.digits import ANSWER_MARKER, STEP_SEPARATOR, final_answer


def running_sums(digits: str) -> list[int]:
    """The running sums mod 10 of ``digits``: ``"3142"`` -> ``[3, 4, 8, 0]``."""
    return [int(s) for s in np.cumsum([int(d) for d in digits]) % 10]


def chain_steps(digits: str) -> list[str]:
    """The steps ``"a+d=b"`` of the demonstration: ``"3142"`` -> ``["3+1=4", "4+4=8", "8+2=0"]``."""
    sums = running_sums(digits)
    return [f"{sums[i - 1]}+{digits[i]}={sums[i]}" for i in range(1, len(digits))]


def first_wrong_step(digits: str, text: str) -> int | None:
    """The index of the first step of ``text`` (before ``"|"``) that differs from the demonstration's, its number
    of steps if it has too few, or None when every step is right (the final answer is not looked at)."""
    written = text.rsplit(ANSWER_MARKER, 1)[0].split(STEP_SEPARATOR) if text else []
    for i, step in enumerate(chain_steps(digits)):
        if i >= len(written) or written[i].strip(" ") != step:
            return i
    return None


class RunningSum(Task):
    """Write the running sum mod 10 of a digit string, one step per digit, then the last sum.

    Prompt ``"sum:<digits>="``; answer: the last running sum (one digit); demonstration: the steps
    ``"a+d=b"`` joined by ``","``, then ``"|"`` and the answer.

    Args:
        min_length, max_length: the number of input digits, drawn uniformly from this range (inclusive; at least 2).
        correct_reward, incorrect_reward, length_bonus, max_completion_length: see :class:`rlbook.tasks.base.Task`.
    """

    name = "running_sum"
    prefix = "sum"

    def __init__(self, min_length: int = 18, max_length: int = 22, correct_reward: float = 1.0,
                 incorrect_reward: float = 0.0, max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH,
                 **kwargs):
        self.min_length = check_int(min_length, "min_length", minimum=2)
        self.max_length = check_int(max_length, "max_length", minimum=2)
        check_range(self.min_length, self.max_length, "min_length", "max_length")
        super().__init__(correct_reward, incorrect_reward, max_completion_length, **kwargs)

    @property
    def max_prompt_length(self) -> int:
        """``len("sum:") + max_length + 1`` characters."""
        return len(self.prefix) + 2 + self.max_length

    @property
    def max_demonstration_length(self) -> int:
        """``L - 1`` steps of 5 characters, ``L - 2`` separators, ``"|"`` and the answer: ``6L - 5``."""
        return 6 * self.max_length - 5

    def config(self) -> dict:
        return {"min_length": self.min_length, "max_length": self.max_length, **super().config()}

    def sample_one(self, rng: np.random.Generator) -> Example:
        length = int(rng.integers(self.min_length, self.max_length + 1))
        digits = "".join(str(d) for d in rng.integers(0, 10, size=length))
        return Example(prompt=f"{self.prefix}:{digits}=", answer=str(running_sums(digits)[-1]),
                       meta={"digits": digits, "length": length})

    def input_digits(self, example: Example) -> str:
        head = f"{self.prefix}:"
        if not (example.prompt.startswith(head) and example.prompt.endswith("=")):
            raise ValueError(f"prompt {example.prompt!r} is not of the form '{head}<digits>='")
        return example.prompt[len(head):-1]

    def demonstration(self, example: Example) -> str:
        return STEP_SEPARATOR.join(chain_steps(self.input_digits(example))) + ANSWER_MARKER + example.answer

    def check_answer(self, example: Example, text: str) -> bool:
        return final_answer(text) == example.answer

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """The demonstration with one step's sum wrong (off by 1 to 9) and the mistake carried to the end: the
        chain a policy writes when it slips once."""
        digits = self.input_digits(example)
        position = int(rng.integers(1, len(digits)))
        shift = int(rng.integers(1, 10))
        sums = running_sums(digits)
        wrong = sums[:position] + [(s + shift) % 10 for s in sums[position:]]
        steps = [f"{wrong[i - 1]}+{digits[i]}={wrong[i]}" for i in range(1, len(digits))]
        return STEP_SEPARATOR.join(steps) + ANSWER_MARKER + str(wrong[-1])
