"""The checkers of the chapter "The policy-gradient theorem" accept the references and reject typical mistakes."""

import pytest
import torch

from rlbook.exercises import check_discounted_pg_weights, check_leave_one_out_advantages
from rlbook.exercises._compare import CheckFailed
from rlbook.exercises.pg import (
    check_reinforce_step,
    reference_discounted_pg_weights,
    reference_leave_one_out_advantages,
    reference_reinforce_step,
)
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


# ---------------------------------------------------------------- the whole REINFORCE step
def _step_pieces(logits, tokens, mask, rewards, G, baseline):
    logp = logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0] * mask
    groups = rewards.view(-1, G)
    rloo = (groups - (groups.sum(-1, keepdim=True) - groups) / (G - 1)).flatten()
    return logp, rewards if baseline == "none" else rloo


def test_reinforce_step_reference_by_hand():
    """Two completions of one prompt (G = 2), rewards 1 and 0, one token each over two symbols with logits 0:
    log pi = log 1/2 for both; RLOO's advantages are +1 and -1, so the loss -(1/(B L)) sum A log pi is 0 and the
    gradient pushes the first token up, the second down."""
    logits = torch.zeros(2, 1, 2, requires_grad=True)
    tokens, mask, rewards = torch.tensor([[0], [1]]), torch.ones(2, 1), torch.tensor([1.0, 0.0])
    loss = reference_reinforce_step(logits, tokens, mask, rewards, 2, 2, "rloo")
    assert abs(loss.item()) < 1e-7
    # d/dz of -(1/4) [log softmax(z1)[0] - log softmax(z2)[1]]: row 1 -(1/4)(e_0 - 1/2), row 2 +(1/4)(e_1 - 1/2)
    expected = torch.tensor([[[-0.125, 0.125]], [[-0.125, 0.125]]])
    assert torch.allclose(logits.grad, expected, atol=1e-7)


def test_reinforce_step_checker_accepts_both_forms_of_the_loss(capsys):
    def ratio_form(logits, tokens, mask, rewards, G, L, baseline):  # -rho A with rho = pi / sg(pi)
        logp, adv = _step_pieces(logits, tokens, mask, rewards, G, baseline)
        loss = -(torch.exp(logp - logp.detach()) * adv[:, None] * mask).sum() / (len(adv) * L)
        loss.backward()
        return loss

    check_reinforce_step(reference_reinforce_step)
    check_reinforce_step(ratio_form)
    assert capsys.readouterr().out.split() == ["ok", "ok"]


def test_reinforce_step_checker_names_the_planted_bugs():
    def token_mean(logits, tokens, mask, rewards, G, L, baseline):  # the planted bug: a mean over real tokens
        logp, adv = _step_pieces(logits, tokens, mask, rewards, G, baseline)
        loss = -(adv[:, None] * logp).sum() / mask.sum()
        loss.backward()
        return loss

    def no_backward(logits, tokens, mask, rewards, G, L, baseline):
        return reference_reinforce_step(logits.detach(), tokens, mask, rewards, G, L, baseline)

    def group_mean(logits, tokens, mask, rewards, G, L, baseline):
        logp, _ = _step_pieces(logits, tokens, mask, rewards, G, baseline)
        groups = rewards.view(-1, G)
        adv = (groups - groups.mean(-1, keepdim=True)).flatten() if baseline == "rloo" else rewards
        loss = -(adv[:, None] * logp).sum() / (len(adv) * L)
        loss.backward()
        return loss

    def ascent_sign(logits, tokens, mask, rewards, G, L, baseline):
        loss = -reference_reinforce_step(logits, tokens, mask, rewards, G, L, baseline)
        logits.grad.neg_()
        return loss

    def padding_scored(logits, tokens, mask, rewards, G, L, baseline):
        return reference_reinforce_step(logits, tokens, torch.ones_like(mask), rewards, G, L, baseline)

    for bug, pattern in ((token_mean, "number of real tokens"), (no_backward, "backward"),
                         (group_mean, "G - 1"), (ascent_sign, "wrong sign"), (padding_scored, "padding")):
        with pytest.raises(CheckFailed, match=pattern):
            check_reinforce_step(bug)


def test_reinforce_step_checker_gives_verdicts_on_wrong_kinds():
    """The cases of tests/test_exercise_checkers_robust.py, for a checker the package does not re-export yet."""
    def returning(change):
        def answer(*args):
            return change(reference_reinforce_step(*args))
        return answer

    for answer, pattern in ((lambda *a: None, "None"), (lambda *a: 1 / 0, "ZeroDivisionError"),
                            (returning(lambda loss: loss.detach().numpy()), "ndarray"),
                            (returning(lambda loss: torch.stack([loss, loss])), "shape"),
                            (returning(lambda loss: loss * float("nan")), "finite")):
        with pytest.raises(CheckFailed, match=pattern):
            check_reinforce_step(answer)
