"""The checkers of the chapter "PPO" accept correct solutions and reject typical mistakes."""

import pytest
import torch

from rlbook.exercises import check_clipped_objective, check_gae_loop
from rlbook.exercises.ppo import reference_clipped_objective, reference_gae


def gae_loop(rewards, values, mask, gamma, lam):
    """The backward recursion A_t = delta_t + gamma lam A_{t+1}, one row and one step at a time."""
    B, T = rewards.shape
    advantages = torch.zeros(B, T, dtype=rewards.dtype)
    for b in range(B):
        length = int(mask[b].sum())
        running = 0.0
        for t in reversed(range(length)):
            next_value = values[b, t + 1] if t + 1 < length else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            running = delta + gamma * lam * running
            advantages[b, t] = running
    return advantages


def test_gae_checker_accepts_the_loop_and_the_reference(capsys):
    check_gae_loop(gae_loop)
    check_gae_loop(reference_gae)
    assert capsys.readouterr().out == "ok\nok\n"


def test_gae_reference_by_hand():
    """One row of three tokens, reward 1 at the end, V = 0: A_t = (gamma lam)^(2 - t)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    got = reference_gae(rewards, torch.zeros_like(rewards), mask, gamma=1.0, lam=0.5)
    torch.testing.assert_close(got, torch.tensor([[0.25, 0.5, 1.0, 0.0]], dtype=torch.float64))


def test_gae_checker_rejects_typical_mistakes():
    def bootstraps_from_padding(rewards, values, mask, gamma, lam):  # reads V past the last real token
        v = values.nan_to_num(0.0)
        next_values = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], 1)
        deltas = (rewards.nan_to_num(0.0) + gamma * next_values - v) * mask
        out, running = torch.zeros_like(deltas), torch.zeros(rewards.shape[0], dtype=rewards.dtype)
        for t in reversed(range(rewards.shape[1])):
            running = deltas[:, t] + gamma * lam * running
            out[:, t] = running
        return out * mask

    def forgets_gamma_in_the_trace(rewards, values, mask, gamma, lam):
        return gae_loop(rewards, values, mask, 1.0, lam) if gamma != 1.0 else gae_loop(rewards, values, mask,
                                                                                         0.5, lam)

    def nan_on_padding(rewards, values, mask, gamma, lam):
        out = gae_loop(rewards, values, mask, gamma, lam)
        return torch.where(mask.bool(), out, torch.nan)

    for wrong in (bootstraps_from_padding, forgets_gamma_in_the_trace, nan_on_padding):
        with pytest.raises(AssertionError):
            check_gae_loop(wrong)


def test_clipped_checker_accepts_the_reference_and_rejects_mistakes(capsys):
    check_clipped_objective(reference_clipped_objective)
    assert capsys.readouterr().out == "ok\n"

    def clip_only(ratio, advantages, epsilon):  # no min: the clip also stops the gradient when A < 0, rho > 1 + eps
        return ratio.clamp(1 - epsilon, 1 + epsilon) * advantages

    def min_of_ratios(ratio, advantages, epsilon):  # the study note's min(rho, 1 + eps): right only for A > 0
        return torch.minimum(ratio, torch.full_like(ratio, 1 + epsilon)) * advantages

    def detached(ratio, advantages, epsilon):  # right values, no gradient
        return reference_clipped_objective(ratio.detach(), advantages, epsilon) + 0 * ratio

    for wrong in (clip_only, min_of_ratios, detached):
        with pytest.raises(AssertionError):
            check_clipped_objective(wrong)


def test_stub_errors_pass_through():
    def stub(*args):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_gae_loop(stub)
    with pytest.raises(NotImplementedError):
        check_clipped_objective(stub)


# --- "write the whole step": the loss of one PPO update on a rollout ---------------------------------------------

def ppo_loss(logp, old_logp, values, old_values, rewards, mask, gamma=1.0, lam=0.95, epsilon=0.2,
             value_clip=0.2, vf_coef=0.1, *, advantages_from=None, whiten=True):
    """A from-scratch solution, with two switches that plant the classic bugs."""
    B, T = mask.shape
    zero = torch.zeros((), dtype=logp.dtype)
    source = old_values if advantages_from is None else advantages_from
    source = torch.where(mask.bool(), source, zero)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(B), mask.sum(-1).long() - 1] = rewards
    advantages, running = [], torch.zeros(B, dtype=mask.dtype)
    for t in reversed(range(T)):
        next_value = source[:, t + 1] if t + 1 < T else 0.0
        running = token_rewards[:, t] + gamma * next_value - source[:, t] + gamma * lam * running
        advantages.insert(0, running * mask[:, t])
    advantages = torch.stack(advantages, 1)
    returns = (advantages + source) * mask
    if whiten:
        n = mask.sum()
        mean = advantages.sum() / n
        advantages = (advantages - mean) / (((advantages - mean) * mask).pow(2).sum() / (n - 1) + 1e-8).sqrt()
    ratio = torch.exp(torch.where(mask.bool(), logp - old_logp, zero))
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - epsilon, 1 + epsilon) * advantages)
    policy = -(torch.where(mask.bool(), surrogate, zero)).sum() / mask.sum()
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    error = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return policy + vf_coef * 0.5 * torch.where(mask.bool(), error, zero).sum() / mask.sum()


def test_ppo_loss_checker_accepts_a_solution_and_the_reference(capsys):
    from rlbook.exercises.ppo import check_ppo_loss, reference_ppo_loss

    check_ppo_loss(ppo_loss)
    check_ppo_loss(reference_ppo_loss)
    assert capsys.readouterr().out == "ok\nok\n"


def test_ppo_loss_checker_rejects_planted_bugs():
    from rlbook.exercises.ppo import check_ppo_loss

    def live_advantages(logp, old_logp, values, old_values, rewards, mask, **settings):
        # GAE over the current values: the advantages then carry a gradient into the critic
        return ppo_loss(logp, old_logp, values, old_values, rewards, mask, advantages_from=values, **settings)

    def unwhitened(*args, **settings):
        return ppo_loss(*args, whiten=False, **settings)

    def no_value_clip(*args, **settings):
        return ppo_loss(*args, **{**settings, "value_clip": 1e9})

    for wrong, message in ((live_advantages, "the loss|the gradient"), (unwhitened, "the loss"),
                           (no_value_clip, "value_clip")):
        with pytest.raises(AssertionError, match=message):
            check_ppo_loss(wrong)
