"""The entropy methods of rlbook.objectives: the high-entropy minority filter, the entropy bonus and its adaptive
coefficient (Skywork-OR1), and the covariance methods Clip-Cov and KL-Cov (Cui et al.), each by hand, against a
plain loop, and on bad input. (TRL's filter and bonus are cross-checked in test_trl_crosscheck.py.)"""

import math

import numpy as np
import pytest
import torch

from rlbook.objectives import (
    adaptive_entropy_coef,
    clip_cov_mask,
    entropy_bonus_loss,
    high_entropy_mask,
    kl_cov_mask,
    policy_loss,
    token_covariance,
)


def ragged_mask(lengths, T):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()


def random_batch(seed=0, B=6, T=9, lengths=(9, 1, 5, 3, 8, 2)):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old_logp = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    entropies = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    return logp, old_logp, advantages, entropies, ragged_mask(lengths, T)


# --- the high-entropy minority ----------------------------------------------------------------------------------


def test_high_entropy_mask_by_hand():
    """Entropies 0.1 … 1.0 on ten real tokens; two padding columns with large entropy must never count."""
    entropies = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 9.0], [0.6, 0.7, 0.8, 0.9, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]])
    # ρ = 0.2: τ = the 0.8 quantile of 0.1..1.0 = 0.82 (linear interpolation): 0.9 and 1.0 are kept
    assert high_entropy_mask(entropies, mask, 0.2).tolist() == [[False] * 6, [False] * 3 + [True, True, False]]
    assert high_entropy_mask(entropies, mask, 1.0).tolist() == mask.bool().tolist()
    assert high_entropy_mask(entropies, mask, 0.0).sum() == 1  # the highest only
    assert high_entropy_mask(entropies, torch.zeros_like(mask), 0.2).sum() == 0


@pytest.mark.parametrize("rho", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_high_entropy_mask_equals_numpys_quantile(rho):
    _, _, _, entropies, mask = random_batch(seed=1)
    real = entropies[mask.bool()].numpy()
    threshold = np.quantile(real, 1 - rho)  # numpy's default is linear interpolation, as torch's
    want = (entropies.numpy() >= threshold) & mask.bool().numpy()
    assert (high_entropy_mask(entropies, mask, rho).numpy() == want).all()
    kept = high_entropy_mask(entropies, mask, rho).sum().item()
    assert kept >= math.floor(rho * len(real))  # about the top ρ share, never fewer


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_high_entropy_mask_refuses_a_quantile_outside_0_1(bad):
    _, _, _, entropies, mask = random_batch()
    with pytest.raises(ValueError, match="top_entropy_quantile must be in"):
        high_entropy_mask(entropies, mask, bad)


def test_high_entropy_mask_refuses_nan_entropies_on_the_mask():
    _, _, _, entropies, mask = random_batch()
    entropies[0, 0] = float("nan")
    with pytest.raises(ValueError, match="entropies"):
        high_entropy_mask(entropies, mask, 0.2)


def test_the_entropy_mask_keeps_only_those_tokens_surrogate_not_the_kl():
    logp, old_logp, advantages, entropies, mask = random_batch(seed=2)
    keep = high_entropy_mask(entropies, mask, 0.3)
    ref_logp = logp + 0.1
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, loss_type="dapo", entropy_mask=keep,
                                beta=0.04, ref_logp=ref_logp)
    # the same as the surrogate on the kept tokens only (a dapo sum over every token's count) plus the full KL
    surrogate, _ = policy_loss(logp, old_logp, advantages, mask * keep, loss_type="dapo",
                               num_items_in_batch=mask.sum())
    kl, _ = policy_loss(logp, logp.detach(), torch.zeros_like(advantages), mask, loss_type="dapo", beta=0.04,
                        ref_logp=ref_logp)
    assert loss.item() == pytest.approx(surrogate.item() + kl.item(), rel=1e-12)
    assert metrics["entropy_mask/kept_mean"] == pytest.approx((keep.sum() / mask.sum()).item())
    with pytest.raises(ValueError, match="one loss per completion"):
        policy_loss(logp, old_logp, advantages, mask, loss_type="gmpo", entropy_mask=keep)


# --- the bonus and its adaptive coefficient ---------------------------------------------------------------------


def test_entropy_bonus_is_minus_the_coefficient_times_the_token_mean_entropy():
    _, _, _, entropies, mask = random_batch(seed=3)
    entropies.requires_grad_(True)
    loss = entropy_bonus_loss(entropies, mask, entropy_coef=0.01, gradient_accumulation_steps=2)
    want = -0.01 * (entropies * mask).sum() / mask.sum() / 2
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    loss.backward()
    # minimising it raises every real token's entropy equally, and pads get no gradient
    grad = entropies.grad
    assert torch.allclose(grad[mask.bool()], torch.full_like(grad[mask.bool()], -0.01 / mask.sum() / 2))
    assert (grad[~mask.bool()] == 0).all()
    with pytest.raises(ValueError, match="entropy_coef must be finite"):
        entropy_bonus_loss(entropies, mask, float("inf"))


def test_adaptive_entropy_coef_rises_below_the_target_falls_above_and_stays_in_bounds():
    step = dict(entropy_target=0.5, entropy_coef_delta=0.1, entropy_coef_min=0.0, entropy_coef_max=0.25)
    assert adaptive_entropy_coef(0.0, 0.4, **step) == pytest.approx(0.1)  # below the target: up
    assert adaptive_entropy_coef(0.0, 0.5, **step) == pytest.approx(0.1)  # at it: up (H <= target)
    assert adaptive_entropy_coef(0.2, 0.4, **step) == pytest.approx(0.25)  # capped at the max
    assert adaptive_entropy_coef(0.15, 0.9, **step) == pytest.approx(0.05)  # above: down
    assert adaptive_entropy_coef(0.05, 0.9, **step) == 0.0  # floored at the min
    # a trajectory: entropy that stays low drives the coefficient to its max
    coef = 0.0
    for _ in range(10):
        coef = adaptive_entropy_coef(coef, 0.1, **step)
    assert coef == pytest.approx(0.25)
    with pytest.raises(ValueError, match="entropy_coef_min <= entropy_coef_max"):
        adaptive_entropy_coef(0.0, 0.1, entropy_target=0.5, entropy_coef_delta=0.1, entropy_coef_min=0.3,
                              entropy_coef_max=0.2)
    with pytest.raises(ValueError, match="entropy must be finite"):
        adaptive_entropy_coef(0.0, float("nan"), **step)


# --- Clip-Cov and KL-Cov ----------------------------------------------------------------------------------------


def covariance_loop(logp, advantages, mask):
    tokens = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    mean_logp = sum(float(logp[i, t]) for i, t in tokens) / len(tokens)
    mean_adv = sum(float(advantages[i]) for i, t in tokens) / len(tokens)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i, t in tokens:
        out[i, t] = (float(logp[i, t]) - mean_logp) * (float(advantages[i]) - mean_adv)
    return out


def test_token_covariance_equals_the_plain_loop_and_sums_to_n_times_the_covariance():
    logp, _, advantages, _, mask = random_batch(seed=4)
    got = token_covariance(logp, advantages, mask)
    torch.testing.assert_close(got, covariance_loop(logp, advantages, mask), rtol=1e-12, atol=1e-12)
    real = mask.bool()
    x, y = logp[real].numpy(), advantages[:, None].expand_as(logp)[real].numpy()
    assert got.sum().item() == pytest.approx(len(x) * np.cov(x, y, bias=True)[0, 1], rel=1e-10)
    with pytest.raises(ValueError, match="all zero"):
        token_covariance(logp, advantages, torch.zeros_like(mask))


def test_kl_cov_mask_picks_the_largest_covariances():
    covariance = torch.tensor([[3.0, -1.0, 7.0, 0.5], [2.0, 9.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1]])  # the 9.0 is padding
    assert kl_cov_mask(covariance, mask, kl_cov_ratio=2 / 7).tolist() == [[True, False, True, False],
                                                                          [False, False, False, False]]
    assert kl_cov_mask(covariance, mask, kl_cov_ratio=1e-4).sum() == 1  # at least one token
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        kl_cov_mask(covariance, mask, 0.0)


def test_clip_cov_mask_draws_only_in_the_band_and_not_where_the_clip_acts():
    covariance = torch.tensor([[3.0, 0.5, 4.0, 2.0], [2.5, 9.0, 1.5, 6.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1]])
    clipped = torch.tensor([[False, False, True, False], [False, False, False, False]])
    band = [(0, 0), (0, 3), (1, 0), (1, 2)]  # 1 < cov < 5, real, not clipped
    seen = set()
    for seed in range(40):
        chosen = clip_cov_mask(covariance, mask, clip_cov_ratio=2 / 7, already_clipped=clipped,
                               generator=torch.Generator().manual_seed(seed))
        picked = [tuple(x) for x in chosen.nonzero().tolist()]
        assert len(picked) == 2 and set(picked) <= set(band)
        seen |= set(picked)
    assert seen == set(band)  # every candidate can be drawn
    again = [clip_cov_mask(covariance, mask, 2 / 7, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(*again)  # reproducible from the generator
    nothing = clip_cov_mask(covariance, mask, clip_cov_lb=10.0, clip_cov_ub=20.0)
    assert nothing.sum() == 0
    with pytest.raises(ValueError, match="clip_cov_lb < clip_cov_ub"):
        clip_cov_mask(covariance, mask, clip_cov_lb=5.0, clip_cov_ub=1.0)


def test_clip_cov_loss_is_ppo_clip_without_the_chosen_tokens():
    logp, old_logp, advantages, _, mask = random_batch(seed=5)
    kwargs = dict(loss_type="dapo", covariance_method="clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-10.0,
                  clip_cov_ub=10.0)
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, **kwargs,
                                generator=torch.Generator().manual_seed(0))
    ratio = (logp - old_logp).exp()
    low = (ratio < 0.8) & (advantages[:, None] < 0)
    high = (ratio > 1.2) & (advantages[:, None] > 0)
    chosen = clip_cov_mask(token_covariance(logp, advantages, mask), mask, 0.2, -10.0, 10.0,
                           already_clipped=(low | high) & mask.bool(), generator=torch.Generator().manual_seed(0))
    plain, _ = policy_loss(logp, old_logp, advantages, mask * ~chosen, loss_type="dapo",
                           num_items_in_batch=mask.sum())
    assert loss.item() == pytest.approx(plain.item(), rel=1e-12)
    assert metrics["covariance/selected_mean"] == pytest.approx((chosen.sum() / mask.sum()).item())
    assert chosen.sum() == int(0.2 * mask.sum())


def test_kl_cov_loss_is_unclipped_with_an_abs_log_ratio_penalty_on_the_chosen_tokens():
    logp, old_logp, advantages, _, mask = random_batch(seed=6)
    logp.requires_grad_(True)
    loss, _ = policy_loss(logp, old_logp, advantages, mask, loss_type="bnpo", covariance_method="kl_cov",
                          kl_cov_ratio=0.1, ppo_kl_coef=2.0)
    chosen = kl_cov_mask(token_covariance(logp, advantages, mask), mask, 0.1)
    tokens = [(i, t) for i in range(6) for t in range(9) if mask[i, t]]
    want = 0.0
    for i, t in tokens:
        log_rho = float(logp.detach()[i, t] - old_logp[i, t])
        want += -math.exp(log_rho) * float(advantages[i]) + (2.0 * abs(log_rho) if chosen[i, t] else 0.0)
    assert loss.item() == pytest.approx(want / len(tokens), rel=1e-12)
    loss.backward()
    assert torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("loss_type, level", [("gmpo", "token"), ("cispo", "token"), ("grpo", "sequence")])
def test_covariance_methods_refuse_what_they_do_not_change(loss_type, level):
    logp, old_logp, advantages, _, mask = random_batch(seed=7)
    with pytest.raises(ValueError, match="covariance_method(='clip_cov' acts on PPO-Clip's token loss| weigh or choose token losses)"):
        policy_loss(logp, old_logp, advantages, mask, loss_type=loss_type, importance_sampling_level=level,
                    epsilon_high=5.0 if loss_type == "cispo" else None, covariance_method="clip_cov")
    with pytest.raises(ValueError, match="unknown covariance_method"):
        policy_loss(logp, old_logp, advantages, mask, covariance_method="cov")
