"""Look tasks up by name, so a notebook can write ``get_task("arithmetic", num_digits=3)``."""

from __future__ import annotations

from rlbook.tasks.arithmetic import Arithmetic, ScratchpadAddition
from rlbook.tasks.base import Task
from rlbook.tasks.chain import LaggedSum
from rlbook.tasks.constraints import ConstraintString
from rlbook.tasks.digits import ReverseDigits, SortDigits

TASKS = {
    Arithmetic.name: Arithmetic,
    SortDigits.name: SortDigits,
    ReverseDigits.name: ReverseDigits,
    ConstraintString.name: ConstraintString,
    LaggedSum.name: LaggedSum,
    ScratchpadAddition.name: ScratchpadAddition,
}


def get_task(name: str, **kwargs) -> Task:
    """Build the task registered under ``name`` (a key of ``TASKS``) with the constructor arguments ``kwargs``."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    return TASKS[name](**kwargs)
