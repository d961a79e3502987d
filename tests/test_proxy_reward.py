"""The proxy reward of the over-optimisation organism: a task's rule plus a spurious bonus per completion character
(``length_bonus``), while the task's verdict, the gold, stays the rule."""

import numpy as np
import pytest

from rlbook.tasks import Arithmetic, SortDigits, get_task
from rlbook.tasks.base import Example


@pytest.mark.parametrize("task", [Arithmetic(length_bonus=0.05), SortDigits(scratchpad=True, length_bonus=0.05),
                                  get_task("sort_digits", scratchpad=True, incorrect_reward=-1.0,
                                           length_bonus=0.05)])
def test_the_bonus_pays_per_character_whatever_the_verdict(task):
    example = task.sample(1, seed=0)[0]
    right, wrong = task.demonstration(example), task.near_miss(example, np.random.default_rng(0))
    plain = type(task)(**{**task.config(), "length_bonus": 0.0})
    for text, truncated in [(right, False), (wrong, False), (right + "7" * 5, False), (right, True)]:
        assert task.is_correct(example, text, truncated) == plain.is_correct(example, text, truncated)
        assert task.reward(example, text, truncated) == pytest.approx(
            plain.reward(example, text, truncated) + 0.05 * len(text))
    # padding a right answer with junk pays per character until the junk breaks it: then the rule's reward is lost
    assert task.reward(example, right + "7", False) < task.reward(example, right, False)
    junk = right + "7" * 60
    assert task.reward(example, junk, False) > task.reward(example, right, False)
    assert not task.is_correct(example, junk, False)


def test_the_bonus_is_stored_and_rebuilt_and_absent_by_default():
    task = Arithmetic(length_bonus=0.02)
    assert task.config()["length_bonus"] == 0.02 and "length_bonus" not in Arithmetic().config()
    assert type(task)(**task.config()).config() == task.config()
    assert Arithmetic().reward(Example("1+2=", "3"), "3 ") == 1.0  # no bonus: the rule alone, spaces forgiven
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="length_bonus"):
            Arithmetic(length_bonus=bad)


def test_the_trainers_accuracy_is_the_verdict_under_a_bonus():
    """The per-step ``accuracy`` is the task's verdict, not ``reward == correct_reward`` (which a bonus breaks)."""
    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.presets import preset
    from rlbook.trainer import Trainer

    model, tokenizer = load_base_policy("arithmetic")
    recipe = RECIPES["arithmetic"]
    config = preset("grpo", max_steps=1, per_device_train_batch_size=32, max_completion_length=8, seed=0)
    accuracies = []
    for bonus in (0.0, 0.05):
        task = get_task(recipe.task, **recipe.task_kwargs, length_bonus=bonus)
        trainer = Trainer(model, tokenizer, task, config)
        scored = trainer.score(trainer.sample_rollout(0))
        rollout = scored.rollout
        repeated = [e for e in rollout.examples for _ in range(config.num_generations)]
        verdicts = [task.is_correct(e, c, t) for e, c, t in
                    zip(repeated, rollout.completions, rollout.batch.truncated.tolist())]
        assert scored.correct.tolist() == verdicts
        accuracies.append(scored.correct.float().mean().item())
    assert accuracies[0] == accuracies[1] > 0  # the same samples (same seed), the same verdicts
