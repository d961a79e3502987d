"""The checkers of the chapter "PPO for RLHF" accept correct solutions and reject typical mistakes."""

import pytest
import torch
import torch.nn.functional as F

from rlbook.exercises import check_bradley_terry_loss, check_rlhf_token_rewards
from rlbook.exercises.rlhf import reference_bradley_terry_loss, reference_rlhf_token_rewards


def token_rewards_loop(scores, logp, ref_logp, mask, beta):
    """-beta * (logp - ref_logp) on each real token, plus the score at the last one; one row at a time."""
    rewards = torch.zeros(logp.shape, dtype=logp.dtype)
    for b in range(logp.shape[0]):
        length = int(mask[b].sum())
        for t in range(length):
            rewards[b, t] = -beta * (logp[b, t] - ref_logp[b, t])
        rewards[b, length - 1] += scores[b]
    return rewards


def bt_loss(chosen, rejected):
    return -F.logsigmoid(chosen - rejected).mean()


def test_token_reward_checker_accepts_the_loop_and_the_reference(capsys):
    check_rlhf_token_rewards(token_rewards_loop)
    check_rlhf_token_rewards(reference_rlhf_token_rewards)
    assert capsys.readouterr().out == "ok\nok\n"


def test_token_reward_rows_sum_to_score_minus_beta_kl():
    scores = torch.tensor([2.0, -1.0], dtype=torch.float64)
    logp = torch.tensor([[-0.5, -1.0, -0.2], [-0.3, -9.0, -9.0]], dtype=torch.float64)
    ref_logp = torch.tensor([[-0.7, -0.8, -0.2], [-0.6, -9.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    got = reference_rlhf_token_rewards(scores, logp, ref_logp, mask, 0.5)
    kl = ((logp - ref_logp) * mask).sum(-1)
    torch.testing.assert_close(got.sum(-1), scores - 0.5 * kl)
    assert float(got[1, 1:].abs().sum()) == pytest.approx(0.0, abs=1e-12)


def test_token_reward_checker_rejects_typical_mistakes():
    def score_in_last_column(scores, logp, ref_logp, mask, beta):  # ignores right padding
        rewards = (-beta * (logp - ref_logp) * mask).nan_to_num(0.0)
        rewards[:, -1] += scores
        return rewards

    def kl_sign_flipped(scores, logp, ref_logp, mask, beta):  # rewards drifting away from the reference
        return token_rewards_loop(scores, ref_logp, logp, mask, beta)

    def kl_on_padding(scores, logp, ref_logp, mask, beta):  # reads the padding's log-probs
        rewards = -beta * (logp - ref_logp)
        rewards[torch.arange(len(scores)), mask.sum(-1).long() - 1] += scores
        return rewards

    for wrong in (score_in_last_column, kl_sign_flipped, kl_on_padding):
        with pytest.raises(AssertionError):
            check_rlhf_token_rewards(wrong)


def test_bt_checker_accepts_a_correct_loss(capsys):
    check_bradley_terry_loss(bt_loss)
    check_bradley_terry_loss(reference_bradley_terry_loss)
    assert capsys.readouterr().out == "ok\nok\n"


def test_bt_checker_rejects_typical_mistakes():
    def naive_log_sigmoid(chosen, rejected):  # sigmoid(-800) underflows to 0, and its log to -inf
        return -torch.log(torch.sigmoid(chosen - rejected)).mean()

    def swapped(chosen, rejected):  # prefers the rejected side
        return -F.logsigmoid(rejected - chosen).mean()

    def summed(chosen, rejected):  # a sum over pairs, not a mean
        return -F.logsigmoid(chosen - rejected).sum()

    def no_log(chosen, rejected):  # 1 - sigmoid: bounded, with vanishing gradients far from 0
        return (1 - torch.sigmoid(chosen - rejected)).mean()

    for wrong in (swapped, summed, no_log, naive_log_sigmoid):
        with pytest.raises(AssertionError):
            check_bradley_terry_loss(wrong)


def test_bt_reference_by_hand():
    chosen = torch.tensor([1.0, 0.0], dtype=torch.float64)
    rejected = torch.tensor([0.0, 0.0], dtype=torch.float64)
    expected = (torch.log1p(torch.exp(torch.tensor(-1.0, dtype=torch.float64))) + torch.log(torch.tensor(2.0, dtype=torch.float64))) / 2
    torch.testing.assert_close(reference_bradley_terry_loss(chosen, rejected), expected)
