"""Tests for rlbook.objectives: each function against its formula written as a plain loop, invariants, bad input."""

import math

import pytest
import torch

from rlbook.objectives import (
    cispo_surrogate,
    gae,
    kl_estimate,
    lambda_grpo_softmax,
    lambda_grpo_weights,
    masked_mean,
    masked_sum,
    masked_whiten,
    off_policy_sequence_mask,
    policy_loss,
    sampler_importance_weights,
    sapo_surrogate,
    value_loss,
)


def ragged_mask(lengths, T):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()


def random_batch(seed=0, B=6, T=9, lengths=(9, 1, 5, 3, 8, 2)):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    # ratios far outside any clip range, in both directions
    old_logp = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.8
    advantages = torch.randn(B, T, generator=g, dtype=torch.float64)
    ref_logp = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    return logp, old_logp, advantages, ref_logp, ragged_mask(lengths, T).double()


# --- masked reductions ----------------------------------------------------------------------------------------


def test_masked_reductions_ignore_garbage_outside_the_mask():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_sum(x, mask).item() == pytest.approx(6.0)
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    assert torch.allclose(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 3.0]))


def test_masked_mean_of_an_empty_mask_is_zero_not_nan():
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == pytest.approx(0.0, abs=1e-12)
    assert torch.allclose(masked_mean(torch.ones(2, 3), torch.tensor([[0, 0, 0], [1, 1, 0]]), dim=-1),
                          torch.tensor([0.0, 1.0]))


def test_masked_whiten_uses_the_unbiased_variance_over_the_mask():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -7.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    expected = (values - values.mean()) / torch.sqrt(values.var(unbiased=True) + 1e-8)
    out = masked_whiten(x, mask)
    assert torch.allclose(out[mask.bool()], expected)
    assert torch.all(out[~mask.bool()] == 0)
    assert torch.allclose(masked_whiten(x, mask, shift_mean=False)[mask.bool()], expected + values.mean())
    with pytest.raises(ValueError, match="at least 2 masked entries"):
        masked_whiten(x, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]))


# --- KL estimators --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimators_are_zero_at_equal_inputs(kind):
    logp = -torch.rand(4, 5)
    assert torch.all(kl_estimate(logp, logp.clone(), kind) == 0)


def test_kl_estimators_match_their_formulas_and_k3_is_nonnegative():
    logp, ref_logp = -torch.rand(1000, dtype=torch.float64) * 5, -torch.rand(1000, dtype=torch.float64) * 5
    delta = ref_logp - logp
    assert torch.allclose(kl_estimate(logp, ref_logp, "k1"), logp - ref_logp)
    assert torch.allclose(kl_estimate(logp, ref_logp, "k2"), 0.5 * (logp - ref_logp) ** 2)
    assert torch.allclose(kl_estimate(logp, ref_logp, "k3"), torch.exp(delta) - delta - 1)
    assert torch.all(kl_estimate(logp, ref_logp, "k3") >= 0)


def test_k1_and_k3_are_unbiased_estimates_of_the_kl():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()
    for kind in ("k1", "k3"):  # expectation under p, computed exactly over the support
        expectation = (p * kl_estimate(p.log(), q.log(), kind)).sum()
        assert expectation.item() == pytest.approx(exact.item(), rel=1e-12)
    assert (p * kl_estimate(p.log(), q.log(), "k2")).sum().item() != pytest.approx(exact.item(), rel=1e-3)


def test_unknown_kl_estimator():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k4")


# --- GAE --------------------------------------------------------------------------------------------------------


def gae_loop(rewards, values, lengths, gamma, lams):
    """The textbook recursion, one row and one step at a time."""
    B, T = rewards.shape
    advantages = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        running = 0.0
        for t in reversed(range(lengths[i])):
            next_value = values[i, t + 1] if t + 1 < lengths[i] else 0.0
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            running = delta + gamma * lams[i] * running
            advantages[i, t] = running
    returns = (advantages + values) * ragged_mask(lengths, T).double()
    return advantages, returns


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5, 0.0])
@pytest.mark.parametrize("lam", [1.0, 0.95, 0.0, "per-row"])
def test_gae_equals_the_plain_double_loop(gamma, lam):
    g = torch.Generator().manual_seed(1)
    lengths = [7, 1, 4, 0, 6]
    B, T = len(lengths), 7
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    lams = torch.rand(B, generator=g, dtype=torch.float64) if lam == "per-row" else torch.full((B,), float(lam), dtype=torch.float64)
    mask = ragged_mask(lengths, T)
    rewards_padded = torch.where(mask.bool(), rewards, torch.full_like(rewards, float("nan")))  # garbage on padding
    advantages, returns = gae(rewards_padded, values, mask, gamma, lams if lam == "per-row" else float(lam))
    expected_advantages, expected_returns = gae_loop(rewards, values, lengths, gamma, lams)
    torch.testing.assert_close(advantages, expected_advantages, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(returns, expected_returns, rtol=1e-12, atol=1e-12)


def test_gae_special_cases_lambda_zero_is_the_td_residual_and_lambda_one_is_return_minus_value():
    g = torch.Generator().manual_seed(2)
    rewards, values = torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5)
    gamma = 0.9
    td, _ = gae(rewards, values, mask, gamma, 0.0)
    next_values = torch.cat([values[:, 1:], torch.zeros(3, 1, dtype=torch.float64)], 1)
    torch.testing.assert_close(td, rewards + gamma * next_values - values)
    mc, _ = gae(rewards, values, mask, gamma, 1.0)
    discounted_return = torch.stack([sum(gamma**k * rewards[:, t + k] for k in range(5 - t)) for t in range(5)], 1)
    torch.testing.assert_close(mc, discounted_return - values)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(gamma=1.5), "gamma must lie in"),
        (dict(lam=-0.1), "lam must lie in"),
        (dict(lam=torch.ones(2)), r"lam must be a float or a \(B,\)"),
        (dict(mask=torch.tensor([[1, 0, 1], [1, 1, 1], [1, 0, 0]])), "right-padded"),
        (dict(rewards=torch.tensor([[1.0, float("nan"), 0], [0, 0, 0], [0, 0, 0]])), "rewards is not finite"),
        (dict(values=torch.zeros(3, 4)), "shape mismatch"),
    ],
)
def test_gae_bad_input(kwargs, match):
    args = dict(rewards=torch.zeros(3, 3), values=torch.zeros(3, 3), mask=torch.ones(3, 3), gamma=1.0, lam=0.95)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gae(**args)


# --- the policy loss ------------------------------------------------------------------------------------------


def per_token_loss_loop(logp, old_logp, advantages, ref_logp, epsilon, epsilon_high, beta):
    B, T = logp.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            ratio = math.exp(logp[i, t] - old_logp[i, t])
            a = float(advantages[i, t])
            clipped = min(max(ratio, 1 - epsilon), 1 + epsilon_high)
            d = float(ref_logp[i, t] - logp[i, t])
            out[i, t] = -min(ratio * a, clipped * a) + beta * (math.exp(d) - d - 1)
    return out


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("epsilon_high", [None, 0.28])
def test_every_loss_type_equals_its_formula(loss_type, beta, epsilon_high):
    logp, old_logp, advantages, ref_logp, mask = random_batch()
    eps_high = 0.2 if epsilon_high is None else epsilon_high
    ell = per_token_loss_loop(logp, old_logp, advantages, ref_logp, 0.2, eps_high, beta) * mask
    lengths = mask.sum(-1)
    B, T = mask.shape
    expected = {
        "grpo": (ell.sum(-1) / lengths.clamp(min=1)).mean(),
        "bnpo": ell.sum() / mask.sum(),
        "dr_grpo": ell.sum() / (B * 16),
        "dapo": ell.sum() / 100.0,
    }[loss_type]
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, epsilon=0.2, epsilon_high=epsilon_high,
                                loss_type=loss_type, max_completion_length=16, num_items_in_batch=100.0,
                                beta=beta, ref_logp=ref_logp)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert 0 < metrics["clip_ratio/region_mean"] < 1, "the test batch must exercise the clip"
    assert ("kl" in metrics) == (beta > 0)


def test_sequence_level_advantages_broadcast_over_tokens():
    logp, old_logp, _, _, mask = random_batch()
    per_row = torch.randn(logp.shape[0], dtype=torch.float64)
    a, _ = policy_loss(logp, old_logp, per_row, mask, loss_type="grpo")
    b, _ = policy_loss(logp, old_logp, per_row[:, None].expand_as(logp), mask, loss_type="grpo")
    assert a.item() == pytest.approx(b.item(), rel=1e-12)


def test_clipped_loss_has_zero_gradient_exactly_outside_the_trust_region():
    """∂ℓ/∂logp is 0 where A > 0 and ρ > 1 + ε, or A < 0 and ρ < 1 − ε; nonzero everywhere else, including
    A < 0 with ρ > 1 + ε (the clip does not stop a bad action from being pushed down further)."""
    ratios = torch.tensor([0.5, 0.9, 1.1, 1.5, 0.5, 0.9, 1.1, 1.5], dtype=torch.float64)
    advantages = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    old_logp = torch.full((1, 8), -1.0, dtype=torch.float64)
    logp = (old_logp + ratios.log()).requires_grad_()
    loss, metrics = policy_loss(logp, old_logp, advantages[None], torch.ones(1, 8), epsilon=0.2, loss_type="dapo")
    loss.backward()
    zero_gradient = logp.grad[0] == 0
    assert zero_gradient.tolist() == [False, False, False, True, True, False, False, False]
    assert metrics["clip_ratio/high_mean"] == pytest.approx(1 / 8) and metrics["clip_ratio/low_mean"] == pytest.approx(1 / 8)


def test_dapo_micro_batches_with_num_items_in_batch_give_the_whole_batch_gradient():
    logp, old_logp, advantages, _, mask = random_batch(seed=3)
    params = logp.clone().requires_grad_()
    policy_loss(params, old_logp, advantages, mask, loss_type="dapo")[0].backward()
    whole = params.grad.clone()
    params.grad = None
    total_tokens = mask.sum()
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):  # micro-batches of unequal token counts
        loss, _ = policy_loss(params[rows], old_logp[rows], advantages[rows], mask[rows], loss_type="dapo",
                              num_items_in_batch=total_tokens)
        loss.backward()
    torch.testing.assert_close(params.grad, whole, rtol=1e-12, atol=1e-12)
    # bnpo over the same micro-batches is a mean of micro-batch means: a different gradient
    params.grad = None
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):
        (policy_loss(params[rows], old_logp[rows], advantages[rows], mask[rows], loss_type="bnpo")[0] / 3).backward()
    assert not torch.allclose(params.grad, whole, rtol=1e-3)


def test_on_policy_ratio_is_one_and_metrics_say_so():
    logp, _, advantages, _, mask = random_batch()
    _, metrics = policy_loss(logp, logp.clone(), advantages, mask)
    assert metrics["ratio/min"] == pytest.approx(1.0, abs=1e-12) and metrics["ratio/max"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["clip_ratio/region_mean"] == pytest.approx(0.0, abs=1e-12) and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-12)


def test_garbage_on_padding_does_not_leak_into_the_loss():
    logp, old_logp, advantages, _, mask = random_batch()
    loss, _ = policy_loss(logp, old_logp, advantages, mask)
    garbage = torch.where(mask.bool(), logp, torch.full_like(logp, float("-inf")))
    loss_garbage, metrics = policy_loss(garbage, old_logp, advantages, mask)
    assert loss_garbage.item() == pytest.approx(loss.item(), rel=1e-12)
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(epsilon=0.0), "epsilon and epsilon_high must be positive"),
        (dict(epsilon_high=-0.1), "epsilon and epsilon_high must be positive"),
        (dict(epsilon=1.0), "epsilon must be below 1"),
        (dict(loss_type="token"), "unknown loss_type"),
        (dict(beta=0.1), "beta > 0 needs ref_logp"),
        (dict(beta=-0.1), "beta, weight_decay, nll_coef and value_pretrain_steps must be >= 0"),
        (dict(mask=torch.zeros(2, 3)), "mask is all zero"),
        (dict(advantages=torch.zeros(3)), "advantages must be"),
        (dict(old_logp=torch.zeros(2, 4)), "shape mismatch"),
        (dict(logp=torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])), "logp is not finite"),
        (dict(advantages=torch.tensor([float("inf"), 0.0])), "advantages is not finite"),
        (dict(loss_type="dr_grpo", max_completion_length=2), "max_completion_length 2 is shorter"),
        (dict(loss_type="dapo", num_items_in_batch=0), "num_items_in_batch must be positive"),
    ],
)
def test_policy_loss_bad_input(kwargs, match):
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.zeros(2), mask=torch.ones(2, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        policy_loss(**args)


# --- the value loss -------------------------------------------------------------------------------------------


def test_value_loss_formula_with_and_without_clipping():
    values = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 9.0]], dtype=torch.float64)
    old_values = torch.tensor([[0.0, 2.1, 0.0], [0.5, 0.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[0.0, 2.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    plain = 0.5 * torch.tensor([1.0, 0.0, 0.25, 4.0]).mean()
    assert value_loss(values, old_values, returns, mask).item() == pytest.approx(plain.item())
    # clip 0.2: V 1.0 -> 0.2 (err 0.04 vs 1: max 1); 2.0 stays (0); 0.5 stays (0.25); -1.0 -> -0.2 (1.44 vs 4: max 4)
    assert value_loss(values, old_values, returns, mask, 0.2).item() == pytest.approx(plain.item())
    # clipping can only raise the loss: with V far from R and V_old near R, the clipped branch is not smaller
    assert value_loss(values, returns, returns, mask, 0.1).item() >= value_loss(values, returns, returns, mask).item()
    with pytest.raises(ValueError, match="cliprange_value must be positive"):
        value_loss(values, old_values, returns, mask, 0.0)
    with pytest.raises(ValueError, match="all zero"):
        value_loss(values, old_values, returns, torch.zeros(2, 3))


# --- group advantages -----------------------------------------------------------------------------------------


def test_group_advantages_match_the_study_notes_example_and_the_scalings():
    from rlbook.objectives import group_advantages

    rewards = torch.tensor([0.2, 0.8, 0.4, 0.6, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    adv = group_advantages(rewards, 4)
    first = torch.tensor([0.2, 0.8, 0.4, 0.6], dtype=torch.float64)
    torch.testing.assert_close(adv[:4], (first - 0.5) / (first.std() + 1e-4))
    assert torch.all(adv[4:] == 0), "a group of equal rewards has no signal, and no NaN"
    torch.testing.assert_close(group_advantages(rewards, 4, "none")[:4], first - 0.5)
    torch.testing.assert_close(group_advantages(rewards, 4, "batch")[:4], (first - 0.5) / (rewards.std() + 1e-4))
    assert torch.allclose(adv.view(2, 4).sum(-1), torch.zeros(2, dtype=torch.float64), atol=1e-12)


def test_leave_one_out_baseline_excludes_the_completion_itself():
    from rlbook.objectives import leave_one_out_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 5.0])
    expected = torch.tensor([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 3 - 5.0, 5 - 3.0])
    torch.testing.assert_close(leave_one_out_advantages(rewards[:4], 4), expected[:4])
    torch.testing.assert_close(leave_one_out_advantages(rewards[4:], 2), expected[4:])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda f, g: f(torch.zeros(6), 4), "do not split into groups"),
        (lambda f, g: f(torch.zeros(4), 1), "needs num_generations >= 2"),
        (lambda f, g: f(torch.tensor([0.0, float("nan")]), 2), "rewards must be finite"),
        (lambda f, g: f(torch.zeros(2, 2), 2), r"shape \(N\*G,\)"),
        (lambda f, g: f(torch.zeros(4), 2, "z"), "unknown scale_rewards"),
        (lambda f, g: g(torch.zeros(3), 1), "leave-one-out baseline needs"),
        (lambda f, g: f(torch.zeros(0), 2), "do not split"),
    ],
)
def test_group_advantages_bad_input(call, match):
    from rlbook.objectives import group_advantages, leave_one_out_advantages

    with pytest.raises(ValueError, match=match):
        call(group_advantages, leave_one_out_advantages)


def test_group_advantages_with_a_keep_mask_use_only_the_kept_completions():
    from rlbook.objectives import group_advantages

    rewards = torch.tensor([0.2, 0.8, 0.4, 0.6, 9.0, 0.0, 1.0, 5.0], dtype=torch.float64)
    keep = torch.tensor([1, 1, 1, 1, 0, 1, 1, 0], dtype=torch.bool)
    adv = group_advantages(rewards, 4, keep_mask=keep)
    torch.testing.assert_close(adv[:4], group_advantages(rewards[:4], 4))  # a fully kept group is unchanged
    kept = torch.tensor([0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(adv[[5, 6]], (kept - 0.5) / (kept.std() + 1e-4))
    assert adv[4] == 0 and adv[7] == 0
    one_kept = group_advantages(rewards, 4, keep_mask=torch.tensor([1, 0, 0, 0, 0, 0, 0, 0], dtype=torch.bool))
    assert torch.all(one_kept == 0), "a single kept completion (or none) has no baseline to beat"
    with pytest.raises(ValueError, match="keep_mask must have"):
        group_advantages(rewards, 4, keep_mask=keep[:4])


# --- RLHF and VAPO pieces -------------------------------------------------------------------------------------


def test_rlhf_token_rewards_sum_to_score_minus_beta_kl_and_are_zero_on_padding():
    from rlbook.objectives import rlhf_token_rewards

    logp, _, _, ref_logp, mask = random_batch(lengths=(9, 1, 5, 3, 8, 2))
    scores = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0, -1.0], dtype=torch.float64)
    beta = 0.1
    rewards = rlhf_token_rewards(scores, logp, ref_logp, mask, beta)
    k1 = (logp - ref_logp) * mask
    torch.testing.assert_close(rewards.sum(-1), scores - beta * k1.sum(-1))
    assert torch.all(rewards[~mask.bool()] == 0)
    last = mask.sum(-1).long() - 1
    torch.testing.assert_close(rewards[torch.arange(6), last], scores - beta * k1[torch.arange(6), last])
    k3 = rlhf_token_rewards(scores, logp, ref_logp, mask, beta, kl_kind="k3")
    assert torch.all(k3.sum(-1) <= scores + 1e-12), "k3 >= 0: the penalty only lowers the reward"


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(beta=-0.1), "beta must be"), (dict(scores=torch.tensor([float("nan"), 0.0])), "scores must be finite"),
     (dict(scores=torch.zeros(3)), "one per row"), (dict(mask=torch.tensor([[1, 1], [0, 0]])), "at least one")],
)
def test_rlhf_token_rewards_bad_input(kwargs, match):
    from rlbook.objectives import rlhf_token_rewards

    args = dict(scores=torch.zeros(2), logp=torch.zeros(2, 2), ref_logp=torch.zeros(2, 2), mask=torch.ones(2, 2),
                beta=0.1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        rlhf_token_rewards(**args)


def test_adaptive_kl_controller_moves_beta_toward_the_target_by_at_most_20_percent_per_horizon():
    from rlbook.objectives import adaptive_kl_coef

    assert adaptive_kl_coef(0.1, kl=12.0, target=6.0, num_samples=10_000, horizon=10_000) == pytest.approx(0.12)
    assert adaptive_kl_coef(0.1, kl=3.0, target=6.0, num_samples=100, horizon=10_000) == pytest.approx(0.1 * (1 - 0.2 * 0.01))
    assert adaptive_kl_coef(0.1, kl=6.6, target=6.0, num_samples=100, horizon=1000) == pytest.approx(0.1 * (1 + 0.1 * 0.1))
    assert adaptive_kl_coef(0.1, kl=6.0, target=6.0, num_samples=500) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="target and horizon must be positive"):
        adaptive_kl_coef(0.1, 1.0, 0.0, 10)
    with pytest.raises(ValueError, match="must be finite"):
        adaptive_kl_coef(0.1, float("nan"), 1.0, 10)


def test_length_adaptive_lambda_follows_vapo_and_is_clamped_for_short_completions():
    from rlbook.objectives import length_adaptive_lam

    lam = length_adaptive_lam(torch.tensor([10, 20, 40, 200, 1000]), alpha=0.05)
    torch.testing.assert_close(lam, torch.tensor([0.0, 0.0, 0.5, 0.9, 0.98]))
    assert torch.all((lam >= 0) & (lam <= 1))
    with pytest.raises(ValueError, match="alpha must be positive"):
        length_adaptive_lam(torch.tensor([5]), alpha=0.0)
    with pytest.raises(ValueError, match="lengths must be positive"):
        length_adaptive_lam(torch.tensor([0, 5]))


def test_decoupled_gae_with_critic_lambda_one_targets_the_discounted_return():
    """VAPO's value targets: with lambda = 1 the returns are the discounted sums of rewards, whatever V is."""
    g = torch.Generator().manual_seed(5)
    lengths = [6, 2, 4]
    mask = ragged_mask(lengths, 6)
    rewards = torch.randn(3, 6, generator=g, dtype=torch.float64) * mask
    values = torch.randn(3, 6, generator=g, dtype=torch.float64) * mask
    gamma = 0.9
    _, returns = gae(rewards, values, mask, gamma, 1.0)
    expected = torch.zeros(3, 6, dtype=torch.float64)
    for i, n in enumerate(lengths):
        for t in range(n):
            expected[i, t] = sum(gamma**k * rewards[i, t + k] for k in range(n - t))
    torch.testing.assert_close(returns, expected)


# --- GSPO and GMPO --------------------------------------------------------------------------------------------


def test_sequence_level_ratio_is_the_geometric_mean_of_token_ratios():
    logp, old_logp, _, _, mask = random_batch(seed=7)
    advantages = torch.randn(logp.shape[0], dtype=torch.float64)
    lengths = mask.sum(-1)
    s = torch.exp(((logp - old_logp) * mask).sum(-1) / lengths)
    eps, eps_high = 3e-4, 4e-4
    expected = -torch.minimum(s * advantages, s.clamp(1 - eps, 1 + eps_high) * advantages).mean()
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, epsilon=eps, epsilon_high=eps_high,
                                loss_type="grpo", importance_sampling_level="sequence")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert metrics["ratio/max"] == pytest.approx(s.max().item(), rel=1e-12)


def test_sequence_level_with_one_token_completions_equals_token_level():
    logp, old_logp, _, _, _ = random_batch(seed=8)
    mask = ragged_mask([1] * logp.shape[0], logp.shape[1]).double()
    advantages = torch.randn(logp.shape[0], dtype=torch.float64)
    for loss_type in ("grpo", "bnpo", "dapo"):
        token, _ = policy_loss(logp, old_logp, advantages, mask, loss_type=loss_type)
        sequence, _ = policy_loss(logp, old_logp, advantages, mask, loss_type=loss_type,
                                  importance_sampling_level="sequence")
        assert sequence.item() == pytest.approx(token.item(), rel=1e-12)


def test_gspo_token_equals_gspo_in_value_and_gradient_with_per_completion_advantages():
    logp, old_logp, _, _, mask = random_batch(seed=9)
    advantages = torch.randn(logp.shape[0], dtype=torch.float64)
    results = []
    for level in ("sequence", "sequence_token"):
        params = logp.clone().requires_grad_()
        loss, _ = policy_loss(params, old_logp, advantages, mask, epsilon=0.05, loss_type="grpo",
                              importance_sampling_level=level)
        loss.backward()
        results.append((loss.detach(), params.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-10, atol=1e-12)


def gmpo_loop(logp, old_logp, advantages, mask, eps, eps_high):
    B, T = logp.shape
    total = 0.0
    for i in range(B):
        a, deltas = float(advantages[i]), []
        for t in range(T):
            if mask[i, t]:
                d = float(logp[i, t] - old_logp[i, t])
                c = min(max(d, -eps), eps_high)
                deltas.append(min(d, c) if a > 0 else max(d, c))
        total += -a * math.exp(sum(deltas) / len(deltas))
    return total / B


@pytest.mark.parametrize("scale", [0.5, 5.0])  # 5: log-ratios far outside the clip, in both directions
def test_gmpo_loss_equals_its_formula_and_stays_finite(scale):
    g = torch.Generator().manual_seed(10)
    lengths = (9, 1, 5, 3, 8, 2)
    mask = ragged_mask(lengths, 9).double()
    logp = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    old_logp = logp + torch.randn(6, 9, generator=g, dtype=torch.float64) * scale
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.3, 0.0, 2.0], dtype=torch.float64)
    params = logp.clone().requires_grad_()
    loss, metrics = policy_loss(params, old_logp, advantages, mask, epsilon=0.4, epsilon_high=0.4, loss_type="gmpo")
    assert loss.item() == pytest.approx(gmpo_loop(logp, old_logp, advantages, mask, 0.4, 0.4), rel=1e-10)
    loss.backward()
    assert torch.isfinite(loss) and torch.all(torch.isfinite(params.grad))
    assert all(math.isfinite(v) for v in metrics.values())
    if scale > 1:
        assert metrics["clip_ratio/region_mean"] > 0


def test_gmpo_clips_by_the_sign_of_the_advantage_in_log_space():
    """A > 0: a token whose log-ratio is above eps_high gets no gradient; A < 0: one below -eps gets none."""
    old_logp = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor([[0.1, 1.0, -1.0], [0.1, 1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logp, old_logp, torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 3),
                          epsilon=0.4, epsilon_high=0.4, loss_type="gmpo")
    loss.backward()
    assert (logp.grad[0] == 0).tolist() == [False, True, False]
    assert (logp.grad[1] == 0).tolist() == [False, False, True]


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(importance_sampling_level="group"), "unknown importance_sampling_level"),
     (dict(importance_sampling_level="sequence", mask=torch.tensor([[1, 1, 0], [0, 0, 0]])), "no masked token"),
     (dict(loss_type="gmpo", mask=torch.tensor([[0, 0, 0], [1, 0, 0]])), "have no token: GMPO's geometric mean"),
     (dict(loss_type="gmpo", epsilon_high=-0.1), "must be positive")],
)
def test_sequence_level_and_gmpo_bad_input(kwargs, match):
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        policy_loss(**args)


# --- GFPO -----------------------------------------------------------------------------------------------------


def test_gfpo_keeps_the_shortest_or_most_token_efficient_and_zeroes_the_rest():
    from rlbook.objectives import gfpo_keep_mask, group_advantages

    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    lengths = torch.tensor([9, 3, 5, 2, 4, 4, 10, 1])
    keep = gfpo_keep_mask(rewards, lengths, 4, k=2)
    assert keep.view(2, 4).sum(-1).tolist() == [2, 2]
    assert keep[:4].tolist() == [False, True, False, True]  # lengths 3 and 2 are the shortest
    assert keep[4:].tolist() == [True, False, False, True]  # lengths 4 (first of the tie) and 1
    efficient = gfpo_keep_mask(rewards, lengths, 4, k=1, metric="token_efficiency")
    assert efficient.tolist() == [False, False, False, True, False, True, False, False]
    advantages = group_advantages(rewards, 4, keep_mask=keep)
    assert torch.all(advantages[~keep] == 0)
    assert torch.allclose(advantages.view(2, 4).sum(-1), torch.zeros(2), atol=1e-6), "the kept ones' mean is 0"


def test_gfpo_adaptive_k_gives_harder_prompts_more_survivors():
    from rlbook.objectives import gfpo_adaptive_k, gfpo_keep_mask

    means = torch.tensor([0.9, 0.1, 0.5, 0.3])  # easiest: group 0, hardest: group 1
    rewards = means.repeat_interleave(8) + torch.linspace(-0.05, 0.05, 8).repeat(4)
    k = gfpo_adaptive_k(rewards, 8)
    assert k.tolist() == [4, 8, 6, 8]
    keep = gfpo_keep_mask(rewards, torch.arange(32) % 8 + 1, 8, k)
    assert keep.view(4, 8).sum(-1).tolist() == [4, 8, 6, 8]


@pytest.mark.parametrize(
    "call, match",
    [(lambda m, a: m(torch.zeros(8), torch.ones(8), 4, k=5), r"k must lie in \[1, num_generations = 4\]"),
     (lambda m, a: m(torch.zeros(8), torch.ones(8), 4, k=0), "k must lie in"),
     (lambda m, a: m(torch.zeros(8), torch.ones(4), 4, k=2), "lengths must have"),
     (lambda m, a: m(torch.zeros(8), torch.ones(8), 4, k=2, metric="reward"), "unknown GFPO metric"),
     (lambda m, a: a(torch.zeros(8), 4, k_by_difficulty=(2, 6)), "every k must lie in")],
)
def test_gfpo_bad_input(call, match):
    from rlbook.objectives import gfpo_adaptive_k, gfpo_keep_mask

    with pytest.raises(ValueError, match=match):
        call(gfpo_keep_mask, gfpo_adaptive_k)


# --- λ-GRPO: learnable length-based response weights -----------------------------------------------------------


def _lambda_batch(seed=0, G=4, N=2, T=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (N * G,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    logp = (-torch.rand(N * G, T, generator=g) - 0.1).requires_grad_(True)
    old_logp = logp.detach() + 0.05 * torch.randn(N * G, T, generator=g)
    advantages = torch.randn(N * G, generator=g)
    return lengths, mask, logp, old_logp, advantages


def test_lambda_grpo_weights_sum_to_one_per_group_and_f_is_g_times_w():
    lengths = torch.tensor([3, 5, 9, 4, 2, 2, 2, 2, 1, 7, 7, 16])
    for lam in (-2.0, -0.5, 0.0, 0.7, 3.0):
        w = lambda_grpo_softmax(lengths, 4, lam)
        torch.testing.assert_close(w.view(-1, 4).sum(-1), torch.ones(3), atol=1e-6, rtol=0)
        torch.testing.assert_close(lambda_grpo_weights(lengths, 4, lam), 4 * w, atol=1e-6, rtol=0)
        torch.testing.assert_close(w[4:8], torch.full((4,), 0.25), atol=1e-6, rtol=0)  # equal lengths: uniform
    w = lambda_grpo_softmax(lengths, 4, 1.0)
    assert bool((w[:4].argsort() == torch.tensor([0, 3, 1, 2])).all())  # lambda > 0: the longer, the heavier
    w = lambda_grpo_softmax(lengths, 4, -1.0)
    assert bool((w[:4].argsort() == torch.tensor([2, 1, 3, 0])).all())  # lambda < 0: the shorter, the heavier


def test_lambda_zero_is_dapo_in_value_and_gradient():
    lengths, mask, logp, old_logp, advantages = _lambda_batch()
    dapo, _ = policy_loss(logp, old_logp, advantages, mask, loss_type="dapo")
    (grad_dapo,) = torch.autograd.grad(dapo, logp)
    weights = lambda_grpo_weights(lengths, 4, 0.0)
    lam_loss, _ = policy_loss(logp, old_logp, advantages, mask, loss_type="dapo", response_weights=weights)
    (grad_lam,) = torch.autograd.grad(lam_loss, logp)
    torch.testing.assert_close(lam_loss, dapo, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(grad_lam, grad_dapo, atol=1e-7, rtol=1e-6)


def test_grpo_dapo_and_dr_grpo_are_one_formula_with_different_response_weights():
    lengths, mask, logp, old_logp, advantages = _lambda_batch(seed=1, T=11)
    B, T = mask.shape
    n = lengths.float()
    weights = {"grpo": 1 / (B * n), "dapo": torch.full((B,), 1 / n.sum()), "dr_grpo": torch.full((B,), 1 / (B * T))}
    for loss_type, f in weights.items():
        expected, _ = policy_loss(logp, old_logp, advantages, mask, loss_type=loss_type, max_completion_length=T)
        (grad_expected,) = torch.autograd.grad(expected, logp)
        unified, _ = policy_loss(logp, old_logp, advantages, mask, loss_type="dapo", num_items_in_batch=1,
                                 response_weights=f)
        (grad_unified,) = torch.autograd.grad(unified, logp)
        torch.testing.assert_close(unified, expected, atol=1e-7, rtol=1e-5)
        torch.testing.assert_close(grad_unified, grad_expected, atol=1e-7, rtol=1e-5)


def test_the_gradient_in_lambda_raises_lambda_when_the_long_completions_are_the_good_ones():
    # one group; at ratio 1 the loss is -sum_i f_i A_i |o_i| / sum|o|, and at lambda = 0
    # d loss / d lambda = -sum_i (ln h_i - mean ln h) A_i |o_i| / sum|o| (the chapter's derivation)
    lengths = torch.tensor([2, 4, 6, 8])
    mask = (torch.arange(8)[None, :] < lengths[:, None]).float()
    logp = -torch.ones(4, 8)
    for sign in (1.0, -1.0):
        advantages = sign * torch.tensor([-1.5, -0.5, 0.5, 1.5])  # sign > 0: the long ones are right
        lam = torch.zeros((), requires_grad=True)
        loss, _ = policy_loss(logp, logp, advantages, mask, loss_type="dapo",
                              response_weights=lambda_grpo_weights(lengths, 4, lam))
        (grad,) = torch.autograd.grad(loss, lam)
        n = lengths.float()
        z = (n - n.mean()) / (n.std() + 1e-4)
        log_h = torch.log(1 + 0.3 * z)
        expected = -((log_h - log_h.mean()) * advantages * n).sum() / n.sum()
        assert torch.isfinite(grad)
        torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5)
        assert (grad < 0) if sign > 0 else (grad > 0)  # gradient descent moves lambda toward the good lengths


def test_lambda_grpo_floor_keeps_the_weights_finite_and_r_is_differentiable():
    lengths = torch.tensor([1, 1, 1, 1, 1, 1, 1, 40])  # z of the short ones is about -0.35; r = 5 gives h < 0
    r = torch.tensor(5.0, requires_grad=True)
    w = lambda_grpo_softmax(lengths, 8, 0.5, r=r)
    assert bool(torch.isfinite(w).all())
    (grad_r,) = torch.autograd.grad(w[-1], r)
    assert torch.isfinite(grad_r)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: lambda_grpo_weights(torch.tensor([1, 2, 3]), 2, 0.0), "in groups of num_generations"),
        (lambda: lambda_grpo_weights(torch.ones(2, 2), 2, 0.0), "one per completion"),
        (lambda: lambda_grpo_weights(torch.tensor([1, 2]), 1, 0.0), "num_generations >= 2"),
        (lambda: lambda_grpo_weights(torch.tensor([0, 2]), 2, 0.0), "all-masked row"),
        (lambda: lambda_grpo_weights(torch.tensor([1.0, float("nan")]), 2, 0.0), "lengths must be finite"),
        (lambda: lambda_grpo_weights(torch.tensor([1, 2]), 2, float("inf")), "lam and r must be finite"),
        (lambda: lambda_grpo_weights(torch.tensor([1, 2]), 2, torch.zeros(2)), "must be scalars"),
        (lambda: policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3),
                             response_weights=torch.ones(3)), r"response_weights must be \(B,\)"),
        (lambda: policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3),
                             response_weights=torch.tensor([1.0, -1.0])), "finite and >= 0"),
        (lambda: policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3),
                             loss_type="gmpo", response_weights=torch.ones(2)), "one loss per completion"),
    ],
)
def test_lambda_grpo_bad_input_is_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_positive_example_nll_is_the_token_mean_nll_of_the_correct_completions_only():
    from rlbook.objectives import positive_example_nll

    logp = torch.tensor([[-0.5, -1.0, -9.0], [-2.0, -3.0, -4.0], [-7.0, -7.0, -7.0]])
    loss_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    correct = torch.tensor([True, True, False])
    # the correct rows' loss tokens: -0.5, -1.0 (row 0; -9.0 is outside the mask) and -2, -3, -4 (row 1)
    assert positive_example_nll(logp, loss_mask, correct).item() == pytest.approx((0.5 + 1.0 + 2 + 3 + 4) / 5)
    assert positive_example_nll(logp, loss_mask, torch.zeros(3, dtype=torch.bool)) is None
    with pytest.raises(ValueError, match="one entry per row"):
        positive_example_nll(logp, loss_mask, correct[:2])


# --- after the study note: TRL 1.16's variants (CISPO, SAPO, delta, the sampler corrections) -----------------


def test_cispo_keeps_every_tokens_gradient_with_a_capped_stopped_weight():
    """ρ = 0.5, 1, 3, 8 with the cap 5: weights 0.5, 1, 3, 5; ∂ℓ/∂logp = −w·A / N at every token, the capped
    one included, where PPO-Clip's gradient is 0 (A > 0, ρ > 1 + ε_high)."""
    ratios = torch.tensor([0.5, 1.0, 3.0, 8.0], dtype=torch.float64)
    advantages = torch.tensor([[1.0, -1.0, 2.0, 1.0]], dtype=torch.float64)
    old_logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], dtype=torch.float64)
    logp = (old_logp + ratios.log()).requires_grad_()
    loss, metrics = policy_loss(logp, old_logp, advantages, torch.ones(1, 4), loss_type="cispo", epsilon_high=5.0)
    weights = torch.tensor([0.5, 1.0, 3.0, 5.0], dtype=torch.float64)
    assert loss.item() == pytest.approx((-(weights * advantages[0] * logp[0].detach())).sum().item() / 4, rel=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad[0], -weights * advantages[0] / 4, rtol=1e-12, atol=0)
    assert metrics["cispo_clip_ratio"] == pytest.approx(1 / 4)  # ρ = 8 > 5 with A > 0
    assert metrics["clip_ratio/region_mean"] == 0.0  # no gradient removed
    clipped = logp.detach().clone().requires_grad_()
    policy_loss(clipped, old_logp, advantages, torch.ones(1, 4), loss_type="dapo")[0].backward()
    assert clipped.grad[0, 3] == 0 and logp.grad[0, 3] != 0


def cispo_loop(logp, old_logp, advantages, mask, cap):
    total, count = 0.0, 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[i, t]:
                w = min(math.exp(logp[i, t] - old_logp[i, t]), cap)
                total += -w * float(advantages[i, t]) * float(logp[i, t])
                count += 1
    return total / count


def test_cispo_equals_the_plain_loop_and_its_lower_bound_clips_from_below():
    logp, old_logp, advantages, _, mask = random_batch(seed=11)
    loss, _ = policy_loss(logp, old_logp, advantages, mask, loss_type="cispo", epsilon_high=1.5)
    assert loss.item() == pytest.approx(cispo_loop(logp, old_logp, advantages, mask, 1.5), rel=1e-12)
    # MiniMax-M1's range [1 − ε_low, 1 + ε_high]: cispo_surrogate takes both bounds of the weight
    ratio = torch.tensor([[0.5, 1.0, 2.0]], dtype=torch.float64)
    ell, low, high = cispo_surrogate(ratio, torch.ones(1, 3, dtype=torch.float64),
                                     torch.ones(1, 3, dtype=torch.float64), max_weight=1.28, min_weight=0.8)
    torch.testing.assert_close(ell, -torch.tensor([[0.8, 1.0, 1.28]], dtype=torch.float64))
    assert low.tolist() == [[True, False, False]] and high.tolist() == [[False, False, True]]


def sapo_loop(ratio, advantages, tau_pos, tau_neg):
    out = torch.zeros_like(ratio)
    for i in range(ratio.shape[0]):
        for t in range(ratio.shape[1]):
            a, r = float(advantages[i, t]), float(ratio[i, t])
            tau = tau_pos if a > 0 else tau_neg
            out[i, t] = -4 / tau / (1 + math.exp(-tau * (r - 1))) * a
    return out


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (0.5, 4.0)])
def test_sapo_equals_the_plain_loop(tau_pos, tau_neg):
    logp, old_logp, advantages, _, mask = random_batch(seed=12)
    ell = sapo_loop(torch.exp(logp - old_logp), advantages, tau_pos, tau_neg) * mask
    expected = (ell.sum(-1) / mask.sum(-1)).mean()  # aggregated like "grpo", as TRL does
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, loss_type="sapo", sapo_temperature_pos=tau_pos,
                                sapo_temperature_neg=tau_neg, gradient_accumulation_steps=2)
    assert loss.item() == pytest.approx(expected.item() / 2, rel=1e-12)
    assert metrics["clip_ratio/region_mean"] == 0.0


def test_sapos_gate_has_ppos_gradient_on_policy_and_decays_smoothly_off_policy():
    logp, _, advantages, _, mask = random_batch(seed=13)
    grads = {}
    for loss_type in ("sapo", "grpo"):
        params = logp.clone().requires_grad_()
        policy_loss(params, logp, advantages, mask, loss_type=loss_type)[0].backward()
        grads[loss_type] = params.grad
    torch.testing.assert_close(grads["sapo"], grads["grpo"], rtol=1e-12, atol=1e-15)  # ρ = 1: the gate's slope is 1
    # the gate's slope 4σ(1 − σ) = sech²(τ(ρ − 1)/2): 1 at ρ = 1, symmetric, decreasing, never exactly 0
    ratio = torch.tensor([[0.2, 0.6, 1.0, 1.4, 1.8, 10.0]], dtype=torch.float64, requires_grad=True)
    sapo_surrogate(ratio, -torch.ones(1, 6, dtype=torch.float64), 1.0, 2.0).sum().backward()
    slope = ratio.grad[0]
    torch.testing.assert_close(slope, 1 / torch.cosh(2.0 * (ratio.detach()[0] - 1) / 2) ** 2)
    assert slope[2] == 1.0 and slope[1] == pytest.approx(slope[3].item()) and bool((slope > 0).all())
    assert slope[0] < slope[1] < slope[2] > slope[3] > slope[4] > slope[5]


def test_delta_caps_a_negative_advantages_ratio_and_stops_its_gradient():
    """A = −1, ρ = 0.5, 1.1, 3, 5, δ = 4: ℓ = |A|·max(min(ρ, δ), clip(ρ)) = 0.8, 1.1, 3, 4; gradient 0 at
    ρ = 0.5 (the usual clip) and at ρ = 5 (δ), where plain PPO-Clip still pushes with ρ."""
    ratios = torch.tensor([0.5, 1.1, 3.0, 5.0], dtype=torch.float64)
    old_logp = torch.full((1, 4), -1.0, dtype=torch.float64)
    logp = (old_logp + ratios.log()).requires_grad_()
    advantages = -torch.ones(1, 4, dtype=torch.float64)
    loss, metrics = policy_loss(logp, old_logp, advantages, torch.ones(1, 4), loss_type="dapo", delta=4.0)
    assert loss.item() == pytest.approx((0.8 + 1.1 + 3.0 + 4.0) / 4, rel=1e-12)
    loss.backward()
    assert (logp.grad[0] == 0).tolist() == [True, False, False, True]
    assert metrics["clip_ratio/delta_mean"] == pytest.approx(1 / 4) and metrics["clip_ratio/low_mean"] == 0.25
    # A > 0 is untouched by δ > 1 + ε_high
    plain, _ = policy_loss(logp, old_logp, -advantages, torch.ones(1, 4), loss_type="dapo")
    capped, _ = policy_loss(logp, old_logp, -advantages, torch.ones(1, 4), loss_type="dapo", delta=4.0)
    assert capped.item() == plain.item()


def test_delta_equals_the_plain_loop():
    logp, old_logp, advantages, ref_logp, mask = random_batch(seed=14)
    old_logp = logp + torch.randn(logp.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1.5
    delta = 2.5
    ell = torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            r, a = math.exp(logp[i, t] - old_logp[i, t]), float(advantages[i, t])
            ell[i, t] = -min(min(r, delta) * a, min(max(r, 0.8), 1.28) * a)
    ell = ell * mask
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, epsilon_high=0.28, loss_type="grpo", delta=delta)
    assert loss.item() == pytest.approx((ell.sum(-1) / mask.sum(-1)).mean().item(), rel=1e-12)
    assert metrics["clip_ratio/delta_mean"] > 0, "the test batch must exercise delta"


def test_sampler_importance_weights_by_hand():
    """Token log-ratios log π_old/π_sampler = log 0.5, 0, log 4 (row 0) and log 1.25, 0, 0 (row 1, 1 token)."""
    old_logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]], dtype=torch.float64)
    sampler_logp = old_logp - torch.tensor([[math.log(0.5), 0.0, math.log(4.0)], [math.log(1.25), 5.0, 5.0]],
                                           dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    expected = {
        ("token_truncate", 0.8, 3.0): [[0.8, 1.0, 3.0], [1.25, 0.0, 0.0]],
        ("token_mask", 0.8, 3.0): [[0.0, 1.0, 0.0], [1.25, 0.0, 0.0]],
        ("token_truncate", None, 3.0): [[0.5, 1.0, 3.0], [1.25, 0.0, 0.0]],
        ("sequence_truncate", None, 1.5): [[1.5, 1.5, 1.5], [1.25, 0.0, 0.0]],  # row 0: 0.5 · 1 · 4 = 2
        ("sequence_mask", 0.8, 1.5): [[0.0, 0.0, 0.0], [1.25, 0.0, 0.0]],
        ("sequence_mask", None, 3.0): [[2.0, 2.0, 2.0], [1.25, 0.0, 0.0]],
    }
    for (mode, low, high), want in expected.items():
        got = sampler_importance_weights(old_logp, sampler_logp, mask, mode, low, high)
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12,
                                   msg=lambda m, mode=mode: f"{mode}: {m}")
    # IcePop: token_mask with its band [α, β]; a token out of the band leaves the gradient, one inside keeps r_t
    icepop = sampler_importance_weights(old_logp, sampler_logp, mask, "token_mask", clip_min=0.5, clip_max=2.0)
    assert icepop[0].tolist() == pytest.approx([0.5, 1.0, 0.0])


def sampler_weights_loop(old_logp, sampler_logp, mask, mode, low, high):
    B, T = old_logp.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    low = 0.0 if low is None else low
    for i in range(B):
        if mode.startswith("sequence"):
            r = math.exp(sum(float(old_logp[i, t] - sampler_logp[i, t]) for t in range(T) if mask[i, t]))
        for t in range(T):
            if not mask[i, t]:
                continue
            if mode.startswith("token"):
                r = math.exp(float(old_logp[i, t] - sampler_logp[i, t]))
            out[i, t] = min(max(r, low), high) if mode.endswith("truncate") else (r if low <= r <= high else 0.0)
    return out


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("low, high", [(None, 3.0), (0.9, 1.1)])
def test_sampler_importance_weights_equal_the_plain_loop(mode, low, high):
    logp, _, _, _, mask = random_batch(seed=15)
    sampler_logp = logp + 0.05 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1),
                                             dtype=torch.float64)
    got = sampler_importance_weights(logp, sampler_logp, mask, mode, low, high)
    torch.testing.assert_close(got, sampler_weights_loop(logp, sampler_logp, mask, mode, low, high),
                               rtol=1e-12, atol=1e-12)
    assert not got.requires_grad


def test_the_sampler_weight_multiplies_the_surrogate_not_the_kl():
    logp, old_logp, advantages, ref_logp, mask = random_batch(seed=16)
    weights = torch.rand(logp.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2
    surrogate, _ = policy_loss(logp, old_logp, advantages * weights, mask, loss_type="dapo")  # ℓ is linear in A
    kl, _ = policy_loss(logp, logp.detach(), torch.zeros(logp.shape[0], dtype=torch.float64), mask,
                        loss_type="dapo", beta=0.04, ref_logp=ref_logp)
    loss, _ = policy_loss(logp, old_logp, advantages, mask, loss_type="dapo", beta=0.04, ref_logp=ref_logp,
                          importance_sampling_ratio=weights)
    # ρ·(wA) and clip(ρ)·(wA) for w ≥ 0: the clip's min picks the same branch, so w·ℓ(A) = ℓ(wA)
    assert loss.item() == pytest.approx(surrogate.item() + kl.item(), rel=1e-12)


def test_off_policy_sequence_mask_drops_negative_advantage_completions_that_drifted():
    """Row KL_i = mean(sampler_logp − logp): row 0 (A < 0, KL 0.5) is dropped at δ = 0.3; row 1 (A < 0,
    KL 0.1) and row 2 (A > 0, KL 0.5) stay."""
    logp = torch.zeros(3, 2, dtype=torch.float64)
    sampler_logp = torch.tensor([[0.4, 0.6], [0.1, 0.1], [0.5, 0.5]], dtype=torch.float64)
    advantages = torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64)
    keep = off_policy_sequence_mask(logp, sampler_logp, advantages, torch.ones(3, 2), threshold=0.3)
    assert keep.tolist() == [[False, False], [True, True], [True, True]]
    old_logp = torch.log(torch.tensor([[0.5, 0.6], [0.7, 0.8], [0.9, 0.3]], dtype=torch.float64))
    loss, metrics = policy_loss(logp, old_logp, advantages, torch.ones(3, 2), loss_type="grpo",
                                off_policy_mask_threshold=0.3, sampler_logp=sampler_logp)
    rows_kept, _ = policy_loss(logp[1:], old_logp[1:], advantages[1:], torch.ones(2, 2), loss_type="grpo")
    assert loss.item() == pytest.approx(rows_kept.item() * 2 / 3, rel=1e-12)  # row 0 counts 0 in the mean over 3
    assert metrics["off_policy_mask/masked_mean"] == pytest.approx(1 / 3)
    # without sampler_logp the mask compares with old_logp (TRL without vLLM)
    keep_old = off_policy_sequence_mask(logp, old_logp, advantages, torch.ones(3, 2), threshold=0.3)
    _, metrics_old = policy_loss(logp, old_logp, advantages, torch.ones(3, 2), off_policy_mask_threshold=0.3)
    assert metrics_old["off_policy_mask/masked_mean"] == pytest.approx(1 - keep_old.double().mean().item())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(loss_type="cispo"), "loss_type='cispo' caps the importance weight at epsilon_high itself"),
        (dict(loss_type="cispo", epsilon_high=1.0), "set epsilon_high > 1"),
        (dict(loss_type="sapo", sapo_temperature_pos=0.0), "temperature_pos must be a positive"),
        (dict(loss_type="sapo", sapo_temperature_neg=math.inf), "sapo_temperature_neg must be a finite number"),
        (dict(delta=1.1), r"delta must be a finite number above 1 \+ epsilon_high = 1.2"),
        (dict(delta=math.nan), "delta must be a finite number"),
        (dict(loss_type="sapo", delta=3.0), "delta=3.0 acts on PPO-Clip's token loss"),
        (dict(loss_type="gmpo", epsilon=0.4, off_policy_mask_threshold=0.5), "one loss per completion"),
        (dict(importance_sampling_ratio=torch.ones(2, 4)), "shape mismatch"),
        (dict(importance_sampling_ratio=-torch.ones(2, 3)), "importance_sampling_ratio must be >= 0"),
        (dict(importance_sampling_ratio=torch.full((2, 3), math.nan)), "importance_sampling_ratio is not finite"),
        (dict(off_policy_mask_threshold=-0.1), "off_policy_mask_threshold must be a finite number >= 0 or None"),
        (dict(off_policy_mask_threshold=0.1, sampler_logp=torch.zeros(2, 4)), "shape mismatch"),
    ],
)
def test_variant_bad_input(kwargs, match):
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        policy_loss(**args)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, m: sampler_importance_weights(x, x, m, "token_clip"), "unknown mode 'token_clip'"),
        (lambda x, m: sampler_importance_weights(x, x, m, clip_max=None), "clip_max must be a positive finite"),
        (lambda x, m: sampler_importance_weights(x, x, m, clip_max=math.inf), "clip_max must be a positive finite"),
        (lambda x, m: sampler_importance_weights(x, x, m, clip_min=3.0, clip_max=2.0), r"clip_min must be None or"),
        (lambda x, m: sampler_importance_weights(x, x[:, :2], m), "shape mismatch"),
        (lambda x, m: sampler_importance_weights(x, x.masked_fill(m.bool(), math.nan), m), "sampler_logp is not"),
        (lambda x, m: sampler_importance_weights(x[0], x[0], m[0]), r"must be \(B, T\)"),
        (lambda x, m: off_policy_sequence_mask(x, x, torch.ones(2), m, threshold=-1.0), "threshold"),
        (lambda x, m: off_policy_sequence_mask(x, x, torch.ones(3), m, threshold=0.5), "advantages must be"),
        (lambda x, m: cispo_surrogate(x, x, x, max_weight=0.0), "max_weight"),
        (lambda x, m: cispo_surrogate(x, x, x, max_weight=2.0, min_weight=2.0), "min_weight"),
        (lambda x, m: sapo_surrogate(x, x, temperature_pos=-1.0), "temperature_pos"),
    ],
)
def test_variant_functions_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.zeros(2, 3), torch.ones(2, 3))


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "dapo"])
def test_garbage_on_padding_does_not_leak_into_the_variants(loss_type):
    logp, old_logp, advantages, _, mask = random_batch(seed=17)
    sampler_logp = old_logp + 0.1
    kwargs = dict(loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else 0.28,
                  off_policy_mask_threshold=0.05, sampler_logp=sampler_logp,
                  importance_sampling_ratio=sampler_importance_weights(old_logp, sampler_logp, mask, "token_mask",
                                                                       0.85, 1.0))
    if loss_type == "dapo":
        kwargs["delta"] = 3.0
    loss, _ = policy_loss(logp, old_logp, advantages, mask, **kwargs)
    assert loss.item() != 0
    garbage = torch.where(mask.bool(), logp, torch.full_like(logp, float("-inf"))).requires_grad_()
    loss_garbage, metrics = policy_loss(garbage, old_logp, advantages, mask, **kwargs)
    assert loss_garbage.item() == pytest.approx(loss.item(), rel=1e-12)
    loss_garbage.backward()
    assert bool(torch.isfinite(garbage.grad).all()) and bool((garbage.grad[~mask.bool()] == 0).all())
    assert all(math.isfinite(v) for v in metrics.values())
