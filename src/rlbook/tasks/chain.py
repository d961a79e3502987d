"""A long-horizon task of dependent steps: continue a lagged-sum sequence of digits for 12 to 24 steps.

``LaggedSum`` (lag ``k = 3``): each digit is the previous one plus the one three places back, mod 10,
``x_t = (x_{t-1} + x_{t-3}) mod 10``. The prompt gives the first three digits and the completion writes the next
ones, one step per digit: a count-down label, ``":"``, the digit three back (copied) and the new digit; the steps
are joined by ``","`` and the last one, labelled ``00``, holds the answer::

    prompt      "lag:16:03,15:01,14:04,"
    completion  "13:34,12:15,11:49,10:43,09:47,08:96,07:39,06:76,05:92,04:64,03:95,02:27,01:63,00:50"

(the prompt's steps write 0 where a step would copy: they have no digit three back). A completion of ``n`` steps is
``6n - 1`` characters (one token each for the character-level models); with 12 to 24 steps, 71 to 143 tokens and 107
on average: the regime of value models on long sequences (GAE's lambda, VAPO), with lengths that vary (VAPO's
length-adaptive lambda).

Every step depends on earlier ones: a wrong digit enters every later sum, so one early slip decides the outcome (the
last digit is then wrong unless later errors cancel, about one time in ten). The reward checks only the final
answer, so the outcome is decided at a token far from the one the reward is given at: a critic that spots the first
wrong step can tell the policy where the mistake was, and a Monte Carlo return cannot.

Why this shape: the steps have a fixed width, so the digit a step copies sits a fixed 18 tokens back, where rotary
positions let one attention head fetch it, and the sum then adds two digits a few tokens apart (the copy just
written and the previous step's digit); copying first gives each half its own training signal. The count-down label
tells the model when to stop (after ``00``) without counting a hundred positions, and the varied length mixes the
labels between prompts and completions. The 0.1M-parameter model learns it by SFT in a few hundred steps. Designs
it did not learn in SFT pilots (one seed each, 750 to 4,000 steps): a running sum of the prompt's digits (the digit
to add sits far back, at a shifting place), and the same recurrence without the copy, where neither operand alone
says anything about the sum, at lags 3 to 5 (one of three runs at lag 4 learned it, after about 1,000 steps).

Reward (the convention of :mod:`rlbook.tasks.base`): the last step must be labelled ``00`` and end in the answer;
the steps before it are not checked (:meth:`LaggedSum.first_wrong_step` finds the first wrong one, for analysis).
"""

from __future__ import annotations

import numpy as np

from rlbook.tasks.base import DEFAULT_MAX_COMPLETION_LENGTH, Example, Task, check_int, check_range
from rlbook.tasks.digits import STEP_SEPARATOR

LABEL_SEPARATOR = ":"


def lagged_sums(seed: str, steps: int, lag: int) -> str:
    """The ``steps`` digits after ``seed`` (``lag`` digits) of ``x_t = (x_{t-1} + x_{t-lag}) mod 10``:
    ``lagged_sums("3141", 3, 4)`` -> ``"459"`` (1 + 3 = 4, 4 + 1 = 5, 5 + 4 = 9)."""
    if len(seed) != lag or not seed.isdigit():
        raise ValueError(f"the seed must be {lag} digits (the lag), got {seed!r}")
    x = [int(d) for d in seed]
    for _ in range(steps):
        x.append((x[-1] + x[-lag]) % 10)
    return "".join(map(str, x[lag:]))


def write_steps(copies: str, digits: str, first_label: int) -> str:
    """The steps ``<label>:<copy><digit>`` joined by ``","``, labels counting down from ``first_label`` (two
    digits): ``write_steps("35", "86", 1)`` -> ``"01:38,00:56"``."""
    return STEP_SEPARATOR.join(f"{first_label - i:02d}{LABEL_SEPARATOR}{c}{d}"
                               for i, (c, d) in enumerate(zip(copies, digits)))


def step_bodies(text: str) -> list[str]:
    """What each step of ``text`` writes after its label: ``"01:38,00:56"`` -> ``["38", "56"]`` (``""`` for a step
    without a label)."""
    if not text:
        return []
    return [step.rsplit(LABEL_SEPARATOR, 1)[1].strip(" ") if LABEL_SEPARATOR in step else ""
            for step in text.split(STEP_SEPARATOR)]


class LaggedSum(Task):
    """Continue ``x_t = (x_{t-1} + x_{t-lag}) mod 10`` from the ``lag`` digits of the prompt, one labelled step per
    digit (the digit ``lag`` back, then the new one), counting down to the step labelled ``00``, whose last digit is
    the answer (see the module's docstring).

    Args:
        min_steps, max_steps: how many steps the completion writes, drawn uniformly from this range (inclusive).
        lag: how far back the second term of each sum sits, and the number of seed digits. With the defaults (3,
            12-24 steps) there are 13,000 distinct prompts. ``max_steps + lag`` must be at most 100 (two-digit
            labels).
        correct_reward, incorrect_reward, max_completion_length, **kwargs: see :class:`rlbook.tasks.base.Task`.
    """

    name = "lagged_sum"
    prefix = "lag"

    def __init__(self, min_steps: int = 12, max_steps: int = 24, lag: int = 3, correct_reward: float = 1.0,
                 incorrect_reward: float = 0.0, max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH,
                 **kwargs):
        self.min_steps = check_int(min_steps, "min_steps", minimum=1)
        self.max_steps = check_int(max_steps, "max_steps", minimum=1)
        check_range(self.min_steps, self.max_steps, "min_steps", "max_steps")
        self.lag = check_int(lag, "lag", minimum=1)
        if self.max_steps + self.lag > 100:
            raise ValueError(f"max_steps + lag must be at most 100 (two-digit labels), got {self.max_steps} + "
                             f"{self.lag}")
        super().__init__(correct_reward, incorrect_reward, max_completion_length, **kwargs)

    @property
    def max_prompt_length(self) -> int:
        """``"lag:"`` and ``lag`` steps of six characters (label, ``":"``, two digits, ``","``): ``4 + 6 lag``."""
        return len(self.prefix) + 1 + 6 * self.lag

    @property
    def max_demonstration_length(self) -> int:
        """``max_steps`` steps of five characters and the commas between them: ``6 max_steps - 1``."""
        return 6 * self.max_steps - 1

    def config(self) -> dict:
        return {"min_steps": self.min_steps, "max_steps": self.max_steps, "lag": self.lag, **super().config()}

    def sample_one(self, rng: np.random.Generator) -> Example:
        steps = int(rng.integers(self.min_steps, self.max_steps + 1))
        seed = "".join(str(d) for d in rng.integers(0, 10, size=self.lag))
        prompt = f"{self.prefix}:{write_steps('0' * self.lag, seed, steps + self.lag - 1)}{STEP_SEPARATOR}"
        return Example(prompt=prompt, answer=lagged_sums(seed, steps, self.lag)[-1],
                       meta={"seed": seed, "steps": steps})

    def _parse_prompt(self, example: Example) -> tuple[str, int]:
        """The seed digits and the number of steps to write (the last seed step's label)."""
        head = f"{self.prefix}:"
        if not (example.prompt.startswith(head) and example.prompt.endswith(STEP_SEPARATOR)):
            raise ValueError(f"prompt {example.prompt!r} is not of the form '{head}<label>:0<digit>,...,'")
        body = example.prompt[len(head):-1]
        seed = "".join(b[1:] for b in step_bodies(body))
        if len(seed) != self.lag or not seed.isdigit():
            raise ValueError(f"prompt {example.prompt!r} does not give {self.lag} seed digits")
        return seed, int(body.rsplit(STEP_SEPARATOR, 1)[-1].split(LABEL_SEPARATOR)[0])

    def num_steps(self, example: Example) -> int:
        """How many steps the completion of ``example`` writes."""
        return self._parse_prompt(example)[1]

    def right_steps(self, example: Example) -> list[str]:
        """What each step of the right completion writes after its label: the copied digit and the new one."""
        seed, steps = self._parse_prompt(example)
        x = seed + lagged_sums(seed, steps, self.lag)
        return [x[t - self.lag] + x[t] for t in range(self.lag, len(x))]

    def demonstration(self, example: Example) -> str:
        right = self.right_steps(example)
        return write_steps("".join(s[0] for s in right), "".join(s[1] for s in right), len(right) - 1)

    def check_answer(self, example: Example, text: str) -> bool:
        """The last step is ``00:<a digit><answer>``."""
        last = text.rsplit(STEP_SEPARATOR, 1)[-1].strip(" ")
        head = f"00{LABEL_SEPARATOR}"
        return len(last) == len(head) + 2 and last.startswith(head) and last[-2].isdigit() and \
            last[-1] == example.answer

    def first_wrong_step(self, example: Example, text: str) -> int | None:
        """The index of the first step of ``text`` that writes other digits than the demonstration's (the number of
        steps written if there are too few), or None when every step is right (labels are not looked at)."""
        right, written = self.right_steps(example), step_bodies(text)
        for i, body in enumerate(right):
            if i >= len(written) or written[i] != body:
                return i
        return None

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """The demonstration with one digit wrong (off by 1 to 9) and the recurrence carried on from it: the chain
        a policy writes when it slips once (if the error cancels out by the end, the last digit is changed too,
        so that the answer is wrong)."""
        seed, steps = self._parse_prompt(example)
        x = [int(d) for d in seed + lagged_sums(seed, steps, self.lag)]
        position, shift = self.lag + int(rng.integers(0, steps)), int(rng.integers(1, 10))
        x[position] = (x[position] + shift) % 10
        for t in range(position + 1, len(x)):
            x[t] = (x[t - 1] + x[t - self.lag]) % 10
        if str(x[-1]) == example.answer:
            x[-1] = (x[-1] + shift) % 10
        digits = "".join(map(str, x))
        return write_steps(digits[:-self.lag], digits[self.lag:], steps - 1)
