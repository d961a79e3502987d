"""The checkers of the chapter "The policy-gradient theorem" accept the references and reject typical mistakes."""

import pytest
import torch

from rlbook.exercises import check_discounted_pg_weights, check_leave_one_out_advantages
from rlbook.exercises.pg import reference_discounted_pg_weights, reference_leave_one_out_advantages
from rlbook.objectives import leave_one_out_advantages


# ---------------------------------------------------------------- references on hand-computed cases
def test_discounted_pg_weights_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 4.0], [0.0, 1.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # row 0: G = [1 + 0.5*2 + 0.25*4, 2 + 0.5*4, 4] = [3, 4, 4]; times gamma^t = [1, 0.5, 0.25]
    # row 1: G = [0 + 0.5*1, 1] (the 99 is padding); times gamma^t = [0.5, 0.5], then 0
    expected = torch.tensor([[3.0, 2.0, 1.0], [0.5, 0.5, 0.0]])
    assert torch.allclose(reference_discounted_pg_weights(rewards, mask, 0.5), expected, atol=1e-6)
    # gamma = 1: every step of a terminal-reward episode carries the final reward
    assert torch.allclose(reference_discounted_pg_weights(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), 1.0),
                          torch.ones(1, 3), atol=1e-6)


def test_leave_one_out_reference_equals_the_package():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1 / 3, 1 / 3, -1.0, 1 / 3])
    assert torch.allclose(reference_leave_one_out_advantages(rewards, 4), expected, atol=1e-6)
    assert torch.allclose(leave_one_out_advantages(rewards, 4), expected, atol=1e-6)


# ---------------------------------------------------------------- checkers accept right answers
def test_checkers_accept_the_references(capsys):
    check_discounted_pg_weights(reference_discounted_pg_weights)
    check_leave_one_out_advantages(reference_leave_one_out_advantages)
    check_leave_one_out_advantages(leave_one_out_advantages)
    assert capsys.readouterr().out.split() == ["ok", "ok", "ok"]


def test_a_vectorised_discounted_weight_passes():
    def vectorised(rewards, mask, gamma):
        T = rewards.shape[1]
        t = torch.arange(T, dtype=torch.float64)
        lag = t[None, :] - t[:, None]  # lag[s, k] = k - s
        discount = torch.where(lag >= 0, gamma ** lag.clamp(min=0), torch.zeros(()))
        kept = rewards.double().where(mask.bool(), 0.0)
        return ((kept @ discount.T) * gamma**t).where(mask.bool(), 0.0).float()

    check_discounted_pg_weights(vectorised)


# ---------------------------------------------------------------- checkers reject typical mistakes
def test_forgetting_gamma_t_is_named():
    def without_gamma_t(rewards, mask, gamma):
        return reference_discounted_pg_weights(rewards, mask, gamma) / torch.tensor(
            [gamma**t if gamma > 0 else 1.0 for t in range(rewards.shape[1])])

    with pytest.raises(AssertionError, match="E4"):
        check_discounted_pg_weights(without_gamma_t)


def test_padding_leaking_into_the_reward_to_go_fails():
    def leaky(rewards, mask, gamma):
        return reference_discounted_pg_weights(rewards, torch.ones_like(mask), gamma) * mask

    with pytest.raises(AssertionError, match="gamma\\^t \\* G_t"):
        check_discounted_pg_weights(leaky)


def test_group_mean_instead_of_leave_one_out_is_named():
    def group_mean(rewards, num_generations):
        groups = rewards.view(-1, num_generations)
        return (groups - groups.mean(-1, keepdim=True)).flatten()

    with pytest.raises(AssertionError, match="G - 1"):
        check_leave_one_out_advantages(group_mean)


def test_a_crash_and_a_wrong_type_are_reported_with_the_inputs():
    with pytest.raises(AssertionError, match="(?s)raised ZeroDivisionError.*inputs of trial 0"):
        check_leave_one_out_advantages(lambda rewards, G: 1 / 0)
    with pytest.raises(AssertionError, match="returned a list"):
        check_discounted_pg_weights(lambda rewards, mask, gamma: rewards.tolist())


def test_in_place_changes_are_caught():
    def in_place(rewards, num_generations):
        expected = reference_leave_one_out_advantages(rewards, num_generations)
        rewards.zero_()
        return expected

    with pytest.raises(AssertionError, match="in place"):
        check_leave_one_out_advantages(in_place)
