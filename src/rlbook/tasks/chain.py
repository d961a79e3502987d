"""A long-horizon task of dependent steps: the running sum of a digit string, mod 10, written out step by step.

``RunningSum``: ``"sum:3, 1, 4, 2="`` -> ``"33,14,48,20|0"``. Each step writes the input digit it adds, then the new
running sum mod 10, then ``","``; after the last step, ``"|"`` and the last sum. With 35 input digits (the default) a
demonstration is 106 characters (one token each for the character-level models): answers of 100 tokens and more,
the regime of value models on long sequences (GAE's lambda, VAPO).

Every step depends on the one before: sum ``i`` is sum ``i - 1`` plus digit ``i``, so a wrong sum (or a wrongly
copied digit) carries into every later sum and one early mistake decides the outcome (the last sum is then wrong
unless a later mistake cancels it, about one time in ten). The reward checks only the final answer, so the outcome
is decided at a token far from the one the reward is given at: a critic that spots the first wrong step can tell
the policy where the mistake was, and Monte Carlo returns cannot.

Why this shape: the prompt's digits are three characters apart, as the completion's steps are, and every prompt
has the same number of digits, so the digit a step copies sits a fixed number of tokens back (one attention head
could fetch it); the sum is then computed from the digit just copied and the sum of the step before, a few tokens
back; the separators tell each token its role. No base policy has been trained on it yet: in SFT pilots of the
0.1M-parameter model (learning rate 3e-3, batch 64) every form tried stayed at chance on the sums, this one
included (1,000 steps); the earlier forms were sums alone (the far digit and the previous sum are needed at once,
and neither helps without the other; 750 steps), steps whose stride changes (1,750 steps) and steps without
separators (1,750 steps). A larger model, a curriculum over the number of digits, or fewer digits are next.

Reward (the convention of :mod:`rlbook.tasks.base`): the text after the last ``"|"``, stripped of spaces, must equal
the last running sum; a completion without ``"|"`` is incorrect. The steps before it are not checked
(:func:`first_wrong_step` finds the first wrong one, for analysis).
"""

from __future__ import annotations

import numpy as np

from rlbook.tasks.base import DEFAULT_MAX_COMPLETION_LENGTH, Example, Task, check_int, check_range
from rlbook.tasks.digits import ANSWER_MARKER, STEP_SEPARATOR, final_answer


def running_sums(digits: str) -> list[int]:
    """The running sums mod 10 of ``digits``: ``"3142"`` -> ``[3, 4, 8, 0]``."""
    return [int(s) for s in np.cumsum([int(d) for d in digits]) % 10]


PROMPT_SEPARATOR = ", "


def write_steps(digits: str, sums) -> str:
    """The steps ``digit sum`` of a completion joined by ``","``, then ``"|"`` and the last sum:
    ``"3142", [3, 4, 8, 0]`` -> ``"33,14,48,20|0"``."""
    steps = STEP_SEPARATOR.join(f"{d}{s}" for d, s in zip(digits, sums))
    return steps + ANSWER_MARKER + str(sums[-1])


def first_wrong_step(digits: str, text: str) -> int | None:
    """The index of the first step of ``text`` (before ``"|"``) whose digit or sum differs from the
    demonstration's, the number of steps written if there are too few, or None when every step is right (the final
    answer is not looked at)."""
    written = text.rsplit(ANSWER_MARKER, 1)[0].split(STEP_SEPARATOR) if text else []
    right = write_steps(digits, running_sums(digits)).rsplit(ANSWER_MARKER, 1)[0].split(STEP_SEPARATOR)
    for i, step in enumerate(right):
        if i >= len(written) or written[i].strip(" ") != step:
            return i
    return None


class RunningSum(Task):
    """Write each digit of a digit string and the running sum mod 10 after it, then the last sum.

    Prompt ``"sum:<d1>, <d2>, ...="``; answer: the last running sum (one digit); demonstration: the steps
    ``<digit><sum>`` joined by ``","``, then ``"|"`` and the answer.

    Args:
        min_length, max_length: the number of input digits, drawn uniformly from this range (inclusive); the
            default, 35 for both, gives every prompt the same shape (see the module's docstring).
        correct_reward, incorrect_reward, max_completion_length, **kwargs: see :class:`rlbook.tasks.base.Task`.
    """

    name = "running_sum"
    prefix = "sum"

    def __init__(self, min_length: int = 35, max_length: int = 35, correct_reward: float = 1.0,
                 incorrect_reward: float = 0.0, max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH,
                 **kwargs):
        self.min_length = check_int(min_length, "min_length", minimum=1)
        self.max_length = check_int(max_length, "max_length", minimum=1)
        check_range(self.min_length, self.max_length, "min_length", "max_length")
        super().__init__(correct_reward, incorrect_reward, max_completion_length, **kwargs)

    @property
    def max_prompt_length(self) -> int:
        """``"sum:"``, ``L`` digits and ``L - 1`` separators ``", "``, ``"="``: ``3L + 3``."""
        return len(self.prefix) + 3 * self.max_length

    @property
    def max_demonstration_length(self) -> int:
        """``L`` steps of two characters, ``L - 1`` commas, ``"|"`` and the answer: ``3L + 1``."""
        return 3 * self.max_length + 1

    def config(self) -> dict:
        return {"min_length": self.min_length, "max_length": self.max_length, **super().config()}

    def sample_one(self, rng: np.random.Generator) -> Example:
        length = int(rng.integers(self.min_length, self.max_length + 1))
        digits = "".join(str(d) for d in rng.integers(0, 10, size=length))
        return Example(prompt=f"{self.prefix}:{PROMPT_SEPARATOR.join(digits)}=", answer=str(running_sums(digits)[-1]),
                       meta={"digits": digits, "length": length})

    def input_digits(self, example: Example) -> str:
        """The digits of the prompt ``"sum:<d1>, <d2>, ...="`` as one string."""
        head = f"{self.prefix}:"
        if not (example.prompt.startswith(head) and example.prompt.endswith("=")):
            raise ValueError(f"prompt {example.prompt!r} is not of the form '{head}<d1>, <d2>, ...='")
        return example.prompt[len(head):-1].replace(PROMPT_SEPARATOR, "")

    def demonstration(self, example: Example) -> str:
        digits = self.input_digits(example)
        return write_steps(digits, running_sums(digits))

    def check_answer(self, example: Example, text: str) -> bool:
        return final_answer(text) == example.answer

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """The demonstration with one sum wrong (off by 1 to 9) and the mistake carried to the end: the chain a
        policy writes when it slips once."""
        digits = self.input_digits(example)
        sums = running_sums(digits)
        position, shift = int(rng.integers(0, len(sums))), int(rng.integers(1, 10))
        return write_steps(digits, sums[:position] + [(s + shift) % 10 for s in sums[position:]])
