"""The common interface of every verifiable-reward task: an :class:`Example` and a :class:`Task`.

A task samples prompts with reference answers, writes the demonstration a model is fine-tuned on (SFT), and
scores what a model writes after the prompt with a rule, not a learned reward model.

The reward convention (the same for every task in :mod:`rlbook.tasks`):

- A *completion* is the decoded text the model produced after the prompt, with the EOS token already
  stripped. ``truncated=True`` means the model hit its token budget without emitting EOS.
- ``reward = correct_reward`` (default ``1.0``) when the completion is correct, ``incorrect_reward``
  (default ``0.0``) otherwise. DAPO's rule-based reward is ``correct_reward=1.0, incorrect_reward=-1.0``.
  A task with partial credit returns ``incorrect_reward + score * (correct_reward - incorrect_reward)`` with
  ``score`` in [0, 1]; without partial credit ``score`` is 1 or 0.
- Before a task looks at the text, a completion is scored as incorrect (score 0) when it is truncated,
  longer than ``max_completion_length`` characters, or contains a character outside
  :data:`rlbook.vocab.ALPHABET` (tabs, newlines, unicode, ...). Garbage is never an error.
- Surrounding spaces are stripped before the answer is compared; nothing else is forgiven.
- A *proxy* reward with a known flaw (reward over-optimisation, the PPO-for-RLHF chapter): ``length_bonus`` adds
  ``length_bonus * len(completion)`` (characters, one per token for the character-level models, EOS not counted)
  to every reward, right or wrong, truncated or not. The task's verdict (:meth:`Task.is_correct`, the *gold*)
  does not change: only :meth:`Task.reward` does. Default 0: no bonus.
- A completion that is not a ``str`` (``None``, bytes, a number) raises ``TypeError``: a model always
  produces text, so a ``None`` means the calling code is broken, and scoring it 0 would hide that bug.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from rlbook.vocab import ALPHABET

ALPHABET_SET = frozenset(ALPHABET)
DEFAULT_MAX_COMPLETION_LENGTH = 1024

SPLITS = ("all", "train", "test", "validation", "train_without_validation")
TEST_PERCENT = 10  # a problem is in the test split when its bucket (0..99) is below this
# The validation split: the next buckets, [TEST_PERCENT, TEST_PERCENT + VALIDATION_PERCENT). They stay in "train"
# (every stored experiment trained on the 90 % outside "test"), so a run that selects settings on "validation"
# trains on "train_without_validation" instead: then training, validation and test problems are disjoint.
VALIDATION_PERCENT = 10
MAX_CONSECUTIVE_REJECTIONS = 1000  # a 10 % split misses 1000 draws in a row with probability 0.9**1000 ~ 2e-46


def split_bucket(key: str) -> int:
    """The bucket 0..99 of a problem's split key: the first 8 bytes of sha256(key), mod 100.

    A hash of the text, not Python's ``hash`` (salted per process) or an RNG draw, so the bucket is the same on
    every machine, in every process, and for every seed.
    """
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100


@dataclass(frozen=True)
class Example:
    """One problem of a task.

    Args:
        prompt: the text the model is conditioned on, e.g. ``"23+58="``.
        answer: the reference answer, e.g. ``"81"`` (for a constraint task: one valid string).
        meta: task-specific facts about the problem (operands, target length, ...), for analysis only;
            rewards never read it, so an ``Example`` written by hand needs no ``meta``.
    """

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, hash=False)


def uses_only_alphabet(text: str) -> bool:
    """Return True when every character of ``text`` belongs to :data:`rlbook.vocab.ALPHABET`."""
    return all(character in ALPHABET_SET for character in text)


def check_int(value, name: str, minimum: int | None = None) -> int:
    """Return ``value`` as an int, or raise ValueError naming ``name`` if it is not an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_range(low: int, high: int, low_name: str, high_name: str) -> None:
    """Raise ValueError if ``low > high``, naming both bounds."""
    if low > high:
        raise ValueError(f"{low_name} ({low}) must be <= {high_name} ({high})")


class Task:
    """A verifiable-reward task: sample problems, write demonstrations, score completions.

    Subclasses set ``name``, implement :meth:`sample_one`, :meth:`check_answer`, :meth:`near_miss` and the two
    length properties, and may override :meth:`demonstration` and :meth:`score`. A subclass stores its own
    arguments first and then calls ``super().__init__``, which checks ``max_completion_length`` against the
    longest demonstration.

    Args:
        correct_reward: reward of a correct completion (1.0 by default).
        incorrect_reward: reward of anything else (0.0 by default; -1.0 for DAPO's +-1 rewards).
        max_completion_length: completions longer than this many characters are incorrect.
        length_bonus: a spurious bonus per completion character added to the reward (not to the verdict), >= 0;
            a task that accepts it (:class:`rlbook.tasks.Arithmetic`) passes it on here.
    """

    name = "task"

    def __init__(
        self,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH,
        length_bonus: float = 0.0,
    ):
        correct_reward = float(correct_reward)
        incorrect_reward = float(incorrect_reward)
        if not np.isfinite(correct_reward) or not np.isfinite(incorrect_reward):
            raise ValueError(f"rewards must be finite, got correct_reward={correct_reward}, "
                             f"incorrect_reward={incorrect_reward}")
        if not correct_reward > incorrect_reward:
            raise ValueError(f"correct_reward ({correct_reward}) must be greater than "
                             f"incorrect_reward ({incorrect_reward})")
        length_bonus = float(length_bonus)
        if not (np.isfinite(length_bonus) and length_bonus >= 0):
            raise ValueError(f"length_bonus must be a finite number >= 0, got {length_bonus}")
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self.length_bonus = length_bonus
        self.max_completion_length = check_int(max_completion_length, "max_completion_length", minimum=1)
        if self.max_completion_length < self.max_demonstration_length:
            raise ValueError(f"max_completion_length ({self.max_completion_length}) must be >= the longest "
                             f"demonstration ({self.max_demonstration_length} characters)")

    # --- what subclasses provide ---------------------------------------------------------------------------

    @property
    def max_prompt_length(self) -> int:
        """The longest prompt this task can sample, in characters."""
        raise NotImplementedError

    @property
    def max_demonstration_length(self) -> int:
        """The longest demonstration this task can write, in characters (EOS not counted)."""
        raise NotImplementedError

    def sample_one(self, rng: np.random.Generator) -> Example:
        """Draw one problem using ``rng``."""
        raise NotImplementedError

    def check_answer(self, example: Example, text: str) -> bool:
        """Return True when ``text`` answers ``example`` correctly.

        ``text`` has already passed :meth:`is_well_formed` (not truncated, not too long, only ALPHABET
        characters). Surrounding spaces are not yet stripped.
        """
        raise NotImplementedError

    def near_miss(self, example: Example, rng: np.random.Generator) -> str:
        """Return a plausible but incorrect completion for ``example`` (the *rejected* side of a DPO pair)."""
        raise NotImplementedError

    def config(self) -> dict:
        """The constructor arguments of this task, so that ``type(task)(**task.config())`` rebuilds it
        (``length_bonus`` only when it is not 0: most tasks do not take it)."""
        return {
            "correct_reward": self.correct_reward,
            "incorrect_reward": self.incorrect_reward,
            "max_completion_length": self.max_completion_length,
            **({"length_bonus": self.length_bonus} if self.length_bonus else {}),
        }

    # --- shared behaviour ----------------------------------------------------------------------------------

    def split_key(self, example: Example) -> str:
        """The canonical text of a problem, which decides its split: by default the prompt.

        Tasks whose prompts can state one problem in several ways override it (a sum with its operands
        swapped, constraints listed in another order), so that both forms land in the same split.
        """
        return example.prompt

    def split_of(self, example: Example) -> str:
        """``"test"`` for the fixed 10 % of problems whose :func:`split_bucket` is below ``TEST_PERCENT``, else
        ``"train"``: a property of the problem, the same on every machine and for every seed."""
        return "test" if split_bucket(self.split_key(example)) < TEST_PERCENT else "train"

    def in_split(self, example: Example, split: str) -> bool:
        """Whether ``example`` belongs to ``split`` (one of :data:`SPLITS`): ``"train"`` and ``"test"`` as
        :meth:`split_of` says; ``"validation"``, the next ``VALIDATION_PERCENT`` of buckets, a part of
        ``"train"``; ``"train_without_validation"``, the rest of ``"train"``."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
        bucket = split_bucket(self.split_key(example))
        return {"all": True, "test": bucket < TEST_PERCENT, "train": bucket >= TEST_PERCENT,
                "validation": TEST_PERCENT <= bucket < TEST_PERCENT + VALIDATION_PERCENT,
                "train_without_validation": bucket >= TEST_PERCENT + VALIDATION_PERCENT}[split]

    def sample(self, n: int, seed, split: str = "all") -> list[Example]:
        """Draw ``n`` problems; the same ``seed`` (an int, or a numpy Generator) always gives the same list.

        ``split`` chooses where the problems come from:

        - ``"all"`` (the default): any problem, as drawn by :meth:`sample_one`;
        - ``"train"``: only problems whose :meth:`split_of` is ``"train"`` (about 90 % of them);
        - ``"test"``: only the held-out ~10 %; a model trained on ``"train"`` never saw any of them;
        - ``"validation"``: another ~10 %, inside ``"train"``, for choosing settings; a run that does so trains
          on ``"train_without_validation"`` (the remaining ~80 %), so that it never saw these either.

        ``"train"`` and ``"test"`` draw from ``sample_one`` and drop the problems of the other split, so they
        are disjoint, and each follows ``sample_one``'s distribution restricted to its split (problems may
        repeat, as with ``"all"``). Raises ValueError for another ``split``, and when a split is (nearly)
        empty because the task has too few distinct problems: no draw of it among
        ``MAX_CONSECUTIVE_REJECTIONS`` in a row.
        """
        n = check_int(n, "n", minimum=1)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
        rng = np.random.default_rng(seed)
        if split == "all":
            return [self.sample_one(rng) for _ in range(n)]
        examples, misses = [], 0
        while len(examples) < n:
            example = self.sample_one(rng)
            if self.in_split(example, split):
                examples.append(example)
                misses = 0
                continue
            misses += 1
            if misses >= MAX_CONSECUTIVE_REJECTIONS:
                raise ValueError(f"{self!r} has too few distinct problems for a {split!r} split: "
                                 f"{MAX_CONSECUTIVE_REJECTIONS} draws in a row all fell in the other split; "
                                 f"widen the task's ranges or use split='all'")
        return examples

    def demonstration(self, example: Example) -> str:
        """The target completion for SFT (EOS not included): by default the reference answer."""
        return example.answer

    def is_well_formed(self, completion: str, truncated: bool = False) -> bool:
        """The checks shared by all tasks: False if truncated, longer than ``max_completion_length``, or holding
        a character outside ALPHABET. Raises TypeError if ``completion`` is not a ``str``.
        """
        if not isinstance(completion, str):
            raise TypeError(f"completion must be a str, got {type(completion).__name__}")
        if truncated:
            return False
        if len(completion) > self.max_completion_length:
            return False
        return uses_only_alphabet(completion)

    def is_correct(self, example: Example, completion: str, truncated: bool = False) -> bool:
        """Return True when ``completion`` is well formed (:meth:`is_well_formed`) and answers ``example``."""
        return self.is_well_formed(completion, truncated) and self.check_answer(example, completion)

    def score(self, example: Example, completion: str, truncated: bool = False) -> float:
        """The fraction of the task that ``completion`` gets right, in [0, 1]: here 1.0 if correct, else 0.0."""
        return 1.0 if self.is_correct(example, completion, truncated) else 0.0

    def reward(self, example: Example, completion: str, truncated: bool = False) -> float:
        """The scalar reward of one completion: ``correct_reward`` if correct, else
        ``incorrect_reward``.

        With partial credit, ``incorrect_reward + score * (correct_reward - incorrect_reward)``;
        with a ``length_bonus``, plus ``length_bonus * len(completion)`` whatever the verdict.
        """
        score = self.score(example, completion, truncated)
        gap = self.correct_reward - self.incorrect_reward
        reward = self.incorrect_reward + score * gap
        if self.length_bonus:  # the proxy's flaw, paid on every completion
            reward += self.length_bonus * len(completion)
        return reward

    def rewards(self, examples, completions, truncated=None) -> np.ndarray:
        """Rewards of a batch: ``examples[i]`` with ``completions[i]``; returns float64 of shape ``(B,)``.

        ``truncated`` is None (nothing truncated) or a sequence of ``B`` booleans.
        """
        examples, completions = list(examples), list(completions)
        if len(examples) != len(completions):
            raise ValueError(f"got {len(examples)} examples but {len(completions)} completions")
        if truncated is None:
            truncated = [False] * len(completions)
        truncated = list(truncated)
        if len(truncated) != len(completions):
            raise ValueError(f"got {len(completions)} completions but {len(truncated)} truncated flags")
        rewards = [self.reward(example, completion, bool(is_truncated))
                   for example, completion, is_truncated in zip(examples, completions, truncated)]
        return np.asarray(rewards, dtype=np.float64).reshape(len(completions))

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.config().items())
        return f"{type(self).__name__}({arguments})"
