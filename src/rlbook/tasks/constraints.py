"""Constraint following (for GAPO): write a string that satisfies every constraint stated in the prompt.

Prompt ``"len=7 x=3:"`` means: write exactly 7 lowercase letters ``a-z`` containing exactly 3 copies of ``x``.
With more count constraints, ``"len=9 x=3 b=1:"`` also asks for exactly one ``b``. Many strings are correct
(``"xxxabcd"``, ``"qxrxsxt"``, ...); the reference answer is one of them, drawn from the seed.

The constraints of a prompt, reported by :func:`check_constraints` under these keys:

- ``"length"``: the string has exactly the stated number of characters;
- ``"charset"``: every character is a lowercase letter ``a-z``;
- ``"count_x"``: the letter ``x`` occurs exactly the stated number of times (one key per count constraint).

Reward (the convention of :mod:`rlbook.tasks.base`): the completion is stripped of surrounding spaces; it is
correct when every constraint holds. By default ``score`` is 1 if correct and 0 otherwise; with
``partial_credit=True`` it is the fraction of constraints that hold, and the reward is
``incorrect_reward + score * (correct_reward - incorrect_reward)``. Truncated, overlong or non-ALPHABET
completions score 0 either way.
"""

from __future__ import annotations

import re

import numpy as np

from rlbook.tasks.base import (
    DEFAULT_MAX_COMPLETION_LENGTH,
    Example,
    Task,
    check_int,
    check_range,
)

LOWERCASE = "abcdefghijklmnopqrstuvwxyz"
PROMPT_PATTERN = re.compile(r"len=(\d+)((?: [a-z]=\d+)+):")


def parse_constraint_prompt(prompt: str) -> tuple[int, dict[str, int]]:
    """Read ``"len=9 x=3 b=1:"`` as ``(9, {"x": 3, "b": 1})``; raises ValueError on any other form."""
    match = PROMPT_PATTERN.fullmatch(prompt)
    if match is None:
        raise ValueError(f"prompt {prompt!r} is not of the form 'len=<n> <letter>=<count> ...:'")
    counts = {}
    for item in match.group(2).split():
        letter, count = item.split("=")
        if letter in counts:
            raise ValueError(f"prompt {prompt!r} constrains the letter {letter!r} twice")
        counts[letter] = int(count)
    return int(match.group(1)), counts


def check_constraints(prompt_or_example, completion: str) -> dict[str, bool]:
    """Which constraints of the prompt the completion satisfies, after stripping surrounding spaces.

    Args:
        prompt_or_example: a prompt string like ``"len=7 x=3:"`` or an :class:`Example` holding one.
        completion: the model's text after the prompt (a ``str``; anything else raises TypeError).

    Returns:
        ``{"length": bool, "charset": bool, "count_<letter>": bool, ...}``, count keys in prompt order.
    """
    prompt = prompt_or_example.prompt if isinstance(prompt_or_example, Example) else prompt_or_example
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    length, counts = parse_constraint_prompt(prompt)
    text = completion.strip(" ")
    report = {
        "length": len(text) == length,
        "charset": all(character in LOWERCASE for character in text),
    }
    for letter, count in counts.items():
        report[f"count_{letter}"] = text.count(letter) == count
    return report


class ConstraintString(Task):
    """Write ``length`` lowercase letters with exact counts of one or more named letters.

    Prompt ``"len=7 x=3:"``; a reference answer such as ``"kxxbxqa"`` (a random valid string).

    Args:
        min_length, max_length: the required length is drawn uniformly from this range (inclusive).
        num_counts: how many letters get a count constraint (distinct letters), the difficulty knob.
        min_count, max_count: each required count is drawn from this range (and so that all counts fit).
        letters: the letters that prompts and reference answers use, at least ``num_counts + 1`` distinct
            lowercase letters (the extra ones fill the reference answers). A completion may use any of ``a-z``.
        partial_credit: if True, score = fraction of constraints satisfied instead of all-or-nothing.
        correct_reward, incorrect_reward, max_completion_length: see :class:`rlbook.tasks.base.Task`.
    """

    name = "constraint_string"

    def __init__(
        self,
        min_length: int = 4,
        max_length: int = 10,
        num_counts: int = 1,
        min_count: int = 1,
        max_count: int = 3,
        letters: str = LOWERCASE,
        partial_credit: bool = False,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH,
    ):
        self.min_length = check_int(min_length, "min_length", minimum=1)
        self.max_length = check_int(max_length, "max_length", minimum=1)
        check_range(self.min_length, self.max_length, "min_length", "max_length")
        self.num_counts = check_int(num_counts, "num_counts", minimum=1)
        self.min_count = check_int(min_count, "min_count", minimum=0)
        self.max_count = check_int(max_count, "max_count", minimum=0)
        check_range(self.min_count, self.max_count, "min_count", "max_count")
        if self.num_counts * self.min_count > self.min_length:
            raise ValueError(f"num_counts * min_count ({self.num_counts * self.min_count}) letters do not fit "
                             f"in min_length ({self.min_length})")
        if not isinstance(letters, str):
            raise ValueError(f"letters must be a string of lowercase letters, got {letters!r}")
        for letter in letters:
            if letter not in LOWERCASE:
                raise ValueError(f"letters may only hold lowercase a-z, got {letter!r} in {letters!r}")
        if len(set(letters)) != len(letters):
            raise ValueError(f"letters={letters!r} repeats a letter")
        if len(letters) < self.num_counts + 1:
            raise ValueError(f"letters={letters!r} needs at least num_counts + 1 = {self.num_counts + 1} "
                             f"distinct letters (the extra ones fill the reference answers)")
        self.letters = letters
        self.partial_credit = bool(partial_credit)
        super().__init__(correct_reward, incorrect_reward, max_completion_length)

    @property
    def max_prompt_length(self) -> int:
        """``"len=" + digits + " x=" + digits`` per count + ``":"``."""
        count_digits = len(str(min(self.max_count, self.max_length)))
        return 4 + len(str(self.max_length)) + self.num_counts * (3 + count_digits) + 1

    @property
    def max_demonstration_length(self) -> int:
        """The reference answer has exactly the required length, at most ``max_length``."""
        return self.max_length

    def config(self) -> dict:
        return {"min_length": self.min_length, "max_length": self.max_length, "num_counts": self.num_counts,
                "min_count": self.min_count, "max_count": self.max_count, "letters": self.letters,
                "partial_credit": self.partial_credit, **super().config()}

    def sample_one(self, rng: np.random.Generator) -> Example:
        """Draw a length, distinct constrained letters and their counts, then a random valid answer."""
        length = int(rng.integers(self.min_length, self.max_length + 1))
        chosen = rng.choice(len(self.letters), size=self.num_counts, replace=False)
        constrained = [self.letters[int(i)] for i in chosen]
        counts = {}
        room = length
        for position, letter in enumerate(constrained):
            still_needed = (self.num_counts - position - 1) * self.min_count
            high = min(self.max_count, room - still_needed)
            counts[letter] = int(rng.integers(self.min_count, high + 1))
            room -= counts[letter]
        fillers = [letter for letter in self.letters if letter not in counts]
        characters = [letter for letter, count in counts.items() for _ in range(count)]
        characters += [fillers[int(i)] for i in rng.integers(0, len(fillers), size=room)]
        answer = "".join(characters[int(i)] for i in rng.permutation(length))
        prompt = f"len={length}" + "".join(f" {letter}={count}" for letter, count in counts.items()) + ":"
        return Example(prompt=prompt, answer=answer, meta={"length": length, "counts": counts})

    def split_key(self, example: Example) -> str:
        """The prompt with its count constraints in alphabetical order: ``"len=9 x=3 b=1:"`` and
        ``"len=9 b=1 x=3:"`` are one problem, so they share a split."""
        length, counts = parse_constraint_prompt(example.prompt)
        return f"len={length}" + "".join(f" {letter}={counts[letter]}" for letter in sorted(counts)) + ":"

    def check_answer(self, example: Example, text: str) -> bool:
        """True when every constraint of :func:`check_constraints` holds."""
        return all(check_constraints(example.prompt, text).values())

    def score(self, example: Example, completion: str, truncated: bool = False) -> float:
        """All-or-nothing, or with ``partial_credit`` the fraction of constraints that hold (0 for garbage)."""
        if not self.partial_credit:
            return super().score(example, completion, truncated)
        if not self.is_well_formed(completion, truncated):
            return 0.0
        report = check_constraints(example.prompt, completion)
        return sum(report.values()) / len(report)

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """The reference answer with one letter wrong: a constrained letter replaced, or one too many/few."""
        _, counts = parse_constraint_prompt(example.prompt)
        answer = example.answer
        free_letters = [letter for letter in self.letters if letter not in counts]
        free = free_letters[int(rng.integers(0, len(free_letters)))]
        constrained_positions = [i for i, letter in enumerate(answer) if letter in counts]
        free_positions = [i for i, letter in enumerate(answer) if letter not in counts]
        edits = ["insert_free"]
        if constrained_positions:
            edits.append("constrained_to_free")
        if free_positions:
            edits += ["free_to_constrained", "drop_free"]
        edit = edits[int(rng.integers(0, len(edits)))]
        if edit == "insert_free":  # one letter too many: the length is off by one
            i = int(rng.integers(0, len(answer) + 1))
            return answer[:i] + free + answer[i:]
        if edit == "constrained_to_free":  # one copy too few of a constrained letter
            i = constrained_positions[int(rng.integers(0, len(constrained_positions)))]
            return answer[:i] + free + answer[i + 1:]
        i = free_positions[int(rng.integers(0, len(free_positions)))]
        if edit == "free_to_constrained":  # one copy too many of a constrained letter
            letter = list(counts)[int(rng.integers(0, len(counts)))]
            return answer[:i] + letter + answer[i + 1:]
        return answer[:i] + answer[i + 1:]  # drop_free: one letter too few
