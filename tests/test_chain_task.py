"""rlbook.tasks.chain: the lagged-sum task of 71-143 token answers whose steps depend on each other."""

import numpy as np
import pytest

from rlbook.tasks import get_task
from rlbook.tasks.chain import lagged_sums, step_bodies, write_steps
from rlbook.vocab import ALPHABET


def test_lagged_sums_and_the_demonstration_by_hand():
    assert lagged_sums("3141", 3, 4) == "459"  # 1 + 3, 4 + 1, 5 + 4
    assert lagged_sums("314", 4, 3) == "7829"  # 4 + 3, 7 + 1, 8 + 4 = 12, 2 + 7
    assert write_steps("35", "86", 1) == "01:38,00:56" and step_bodies("01:38,00:56") == ["38", "56"]
    task = get_task("lagged_sum", min_steps=3, max_steps=3)
    (example,) = task.sample(1, seed=0)
    seed = example.meta["seed"]
    assert example.prompt == "lag:" + write_steps("000", seed, 5) + ","
    x = seed + lagged_sums(seed, 3, 3)
    assert task.demonstration(example) == write_steps(x[:3], x[3:], 2)
    assert example.answer == task.demonstration(example)[-1] and task.num_steps(example) == 3


def test_demonstrations_are_long_correct_and_in_the_alphabet():
    task = get_task("lagged_sum")
    examples = task.sample(300, seed=1)
    lengths = {len(task.demonstration(e)) for e in examples}
    assert lengths == {6 * n - 1 for n in range(12, 25)} and max(lengths) == task.max_demonstration_length == 143
    assert {len(e.prompt) for e in examples} == {task.max_prompt_length}  # the same prompt shape for every length
    for e in examples:
        demo = task.demonstration(e)
        assert set(demo + e.prompt) <= set(ALPHABET) and task.is_correct(e, demo)
        assert task.first_wrong_step(e, demo) is None and task.num_steps(e) == e.meta["steps"]


def test_a_near_miss_slips_once_and_carries_the_mistake():
    task = get_task("lagged_sum", min_steps=6, max_steps=12)
    rng = np.random.default_rng(0)
    for e in task.sample(200, seed=2):
        wrong, right = task.near_miss(e, rng), task.right_steps(e)
        assert not task.is_correct(e, wrong) and len(wrong) == len(task.demonstration(e))
        i, written = task.first_wrong_step(e, wrong), step_bodies(wrong)
        assert i is not None and written[:i] == right[:i]
        full = [int(d) for d in e.meta["seed"] + "".join(b[1] for b in written)]
        # each step copies the digit three back of the chain as written, and after the slip the recurrence runs on
        # from it (the last digit may have been changed again so that the answer is wrong)
        assert all(int(b[0]) == full[t] for t, b in enumerate(written))
        assert all(full[t] == (full[t - 1] + full[t - 3]) % 10 for t in range(3 + i + 1, len(full) - 1))


def test_only_the_last_step_is_scored_and_first_wrong_step_counts_missing_steps():
    task = get_task("lagged_sum", min_steps=4, max_steps=4)
    example = task.sample(1, seed=3)[0]
    demo, answer = task.demonstration(example), example.answer
    assert task.is_correct(example, "00:7" + answer)  # only the last digit of the step labelled 00 is checked
    assert not task.is_correct(example, demo[:-1] + str((int(answer) + 1) % 10))
    assert not task.is_correct(example, demo.replace("00:", "01:")) and not task.is_correct(example, answer)
    assert not task.is_correct(example, "00:" + answer) and not task.is_correct(example, "00:x" + answer)
    assert task.first_wrong_step(example, demo[:11]) == 2 and task.first_wrong_step(example, "") == 0
    assert task.first_wrong_step(example, "03:xx" + demo[5:]) == 0


@pytest.mark.parametrize("kwargs, match", [({"min_steps": 0}, "min_steps"),
                                           ({"min_steps": 9, "max_steps": 5}, "min_steps"),
                                           ({"max_steps": 98}, "max_steps"),
                                           ({"lag": 0}, "lag"),
                                           ({"max_completion_length": 50}, "max_completion_length")])
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_task("lagged_sum", **kwargs)


def test_a_malformed_prompt_is_named():
    task = get_task("lagged_sum")
    example = task.sample(1, seed=4)[0]
    with pytest.raises(ValueError, match="prompt"):
        task.demonstration(type(example)(prompt="sum:1,2=", answer="3"))
