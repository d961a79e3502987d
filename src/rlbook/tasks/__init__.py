"""Verifiable-reward tasks for the small character-level LMs: sample prompts, demonstrate, score.

Every task is a :class:`Task`: ``sample(n, seed)`` draws :class:`Example` s, ``demonstration(example)`` is
the SFT target, and ``reward(example, completion, truncated)`` scores what a model wrote after the prompt.
``sample(n, seed, split="train")`` and ``split="test"`` draw from a fixed 90/10 split of the problems (a hash of
each problem's canonical prompt, :meth:`Task.split_key`, so the split is the same on every machine and for every
seed); the default ``split="all"`` draws any problem. Train on ``"train"``, measure on ``"test"``.
``max_prompt_length`` and ``max_demonstration_length`` (characters, EOS not counted) size a model's context.

Reward convention (all tasks): ``correct_reward`` (1.0) for a correct completion, ``incorrect_reward`` (0.0)
for anything else; pass ``incorrect_reward=-1.0`` for DAPO's +-1 rewards. Truncated completions, completions
longer than ``max_completion_length`` characters, and completions with characters outside
:data:`rlbook.vocab.ALPHABET` are incorrect; surrounding spaces are stripped, nothing else is forgiven.
Garbage never raises; a completion that is not a ``str`` (e.g. ``None``) raises TypeError.

Tasks (see :data:`TASKS` and :func:`get_task`):

- ``"arithmetic"``, :class:`Arithmetic`: ``"23+58="`` -> ``"81"``;
- ``"addition_scratchpad"``, :class:`ScratchpadAddition`: ``"472+385="`` -> ``"857"`` or ``"7,5,8|857"``;
- ``"sort_digits"``, :class:`SortDigits`: ``"sort:3142="`` -> ``"1234"`` (scratchpad ``"3,13,134,1234|1234"``);
- ``"reverse_digits"``, :class:`ReverseDigits`: ``"rev:3142="`` -> ``"2413"`` (scratchpad ``"3,13,413,2413|2413"``);
- ``"constraint_string"``, :class:`ConstraintString`: ``"len=7 x=3:"`` -> any 7 letters with exactly three ``x``;
- ``"lagged_sum"``, :class:`LaggedSum`: ``"lag:24:3,23:1,22:4,21:1,20:5,"`` -> ``"19:8,18:9,...,00:4|4"`` (each
  digit the previous one plus the one five back, mod 10: answers of 101 tokens whose steps depend on each other).

Also: :func:`build_preference_pairs` (DPO pairs), :func:`evaluate` and :func:`pass_at_k` (accuracy, unbiased
pass@k, lengths), :func:`soft_overlong_penalty` (DAPO's length shaping).
"""

from rlbook.tasks.arithmetic import Arithmetic, ScratchpadAddition
from rlbook.tasks.base import Example, Task, uses_only_alphabet
from rlbook.tasks.chain import LaggedSum
from rlbook.tasks.constraints import ConstraintString, check_constraints, parse_constraint_prompt
from rlbook.tasks.digits import DigitTransformTask, ReverseDigits, SortDigits, corrupt_digits, final_answer
from rlbook.tasks.evaluate import EvaluationResult, evaluate, pass_at_k
from rlbook.tasks.preferences import PreferencePair, build_preference_pairs
from rlbook.tasks.registry import TASKS, get_task
from rlbook.tasks.shaping import soft_overlong_penalty

__all__ = [
    "Arithmetic",
    "ScratchpadAddition",
    "ConstraintString",
    "DigitTransformTask",
    "EvaluationResult",
    "Example",
    "PreferencePair",
    "ReverseDigits",
    "LaggedSum",
    "SortDigits",
    "TASKS",
    "Task",
    "build_preference_pairs",
    "check_constraints",
    "corrupt_digits",
    "evaluate",
    "final_answer",
    "get_task",
    "parse_constraint_prompt",
    "pass_at_k",
    "soft_overlong_penalty",
    "uses_only_alphabet",
]
