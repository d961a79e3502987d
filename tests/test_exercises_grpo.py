"""The checker of the chapter "GRPO" accepts the reference and the package, and names the typical mistakes."""

import pytest
import torch

from rlbook.exercises import check_grpo_advantages
from rlbook.exercises.grpo import reference_grpo_advantages
from rlbook.objectives import group_advantages


def test_reference_on_the_study_notes_example():
    # [0.2, 0.8, 0.4, 0.6]: mean 0.5, sample std sqrt(0.2/3) = 0.2582, advantages +-1.1619 and +-0.3873 (E8)
    got = reference_grpo_advantages(torch.tensor([0.2, 0.8, 0.4, 0.6]), 4)
    expected = torch.tensor([-0.3, 0.3, -0.1, 0.1]) / (torch.tensor(0.2 / 3).sqrt() + 1e-4)
    assert torch.allclose(got, expected, atol=1e-5)


def test_reference_equals_the_package_and_an_all_equal_group_gives_zeros():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.allclose(reference_grpo_advantages(rewards, 4), group_advantages(rewards, 4), atol=1e-6)
    assert torch.allclose(reference_grpo_advantages(rewards, 4)[4:], torch.zeros(4), atol=0)


def test_checker_accepts_the_reference_and_the_package(capsys):
    check_grpo_advantages(reference_grpo_advantages)
    check_grpo_advantages(lambda r, g: group_advantages(r, g, scale_rewards="group"))
    assert capsys.readouterr().out.split() == ["ok", "ok"]


def test_population_std_is_named():
    def population(rewards, G):
        groups = rewards.view(-1, G)
        return ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, unbiased=False, keepdim=True) + 1e-4)).flatten()

    with pytest.raises(AssertionError, match="E8"):
        check_grpo_advantages(population)


def test_missing_epsilon_is_named():
    def no_epsilon(rewards, G):
        groups = rewards.view(-1, G)
        return ((groups - groups.mean(-1, keepdim=True)) / groups.std(-1, keepdim=True)).flatten()

    with pytest.raises(AssertionError, match="E11"):
        check_grpo_advantages(no_epsilon)


def test_group_mean_only_fails_and_a_crash_is_reported():
    with pytest.raises(AssertionError, match="GRPO advantage"):
        check_grpo_advantages(lambda r, G: group_advantages(r, G, scale_rewards="none"))
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        check_grpo_advantages(lambda r, G: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_grpo_advantages(lambda r, G: None)
