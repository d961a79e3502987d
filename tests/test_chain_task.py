"""rlbook.tasks.chain: the running-sum task of 100+ token answers whose steps depend on each other."""

import numpy as np
import pytest

from rlbook.tasks import get_task
from rlbook.tasks.chain import first_wrong_step, running_sums, write_steps
from rlbook.vocab import ALPHABET


def test_running_sums_and_the_demonstration_by_hand():
    assert running_sums("3142") == [3, 4, 8, 0]
    task = get_task("running_sum", min_length=4, max_length=4)
    (example,) = task.sample(1, seed=0)
    digits = task.input_digits(example)
    assert example.prompt == "sum:" + ", ".join(digits) + "=" and example.answer == str(sum(map(int, digits)) % 10)
    assert task.demonstration(example) == write_steps(digits, running_sums(digits))
    assert write_steps("3142", [3, 4, 8, 0]) == "33,14,48,20|0"


def test_demonstrations_are_long_correct_and_in_the_alphabet():
    task = get_task("running_sum")
    examples = task.sample(100, seed=1)
    assert {len(task.demonstration(e)) for e in examples} == {task.max_demonstration_length} == {106}
    assert {len(e.prompt) for e in examples} == {task.max_prompt_length}  # the same shape for every prompt
    for e in examples:
        demo = task.demonstration(e)
        assert set(demo + e.prompt) <= set(ALPHABET) and task.is_correct(e, demo)
        assert first_wrong_step(task.input_digits(e), demo) is None


def test_a_near_miss_slips_once_and_carries_the_mistake():
    task = get_task("running_sum", min_length=6, max_length=8)
    rng = np.random.default_rng(0)
    for e in task.sample(100, seed=2):
        wrong, digits = task.near_miss(e, rng), task.input_digits(e)
        assert not task.is_correct(e, wrong) and len(wrong) == len(task.demonstration(e))
        i = first_wrong_step(digits, wrong)
        sums = [int(step[1]) for step in wrong.split("|")[0].split(",")]
        assert i is not None and sums[:i] == running_sums(digits)[:i]
        assert all((a - b) % 10 == (sums[i] - running_sums(digits)[i]) % 10
                   for a, b in zip(sums[i:], running_sums(digits)[i:]))


def test_first_wrong_step_counts_missing_sums_and_only_the_answer_is_scored():
    task = get_task("running_sum", min_length=4, max_length=4)
    assert first_wrong_step("3142", "33,14,49,21|1") == 2 and first_wrong_step("3142", "33,15,49,20|0") == 1
    assert first_wrong_step("3142", "33,14|0") == 2 and first_wrong_step("3142", "") == 0
    example = task.sample(1, seed=3)[0]
    assert task.is_correct(example, "|" + example.answer)  # only the answer after "|" is checked
    assert not task.is_correct(example, example.answer)  # no "|": incorrect


@pytest.mark.parametrize("kwargs, match", [({"min_length": 0}, "min_length"),
                                           ({"min_length": 9, "max_length": 5}, "min_length"),
                                           ({"max_completion_length": 50}, "max_completion_length")])
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_task("running_sum", **kwargs)
