"""The "After the note" chapter's exercise checkers accept correct answers and reject the usual mistakes with a
helpful message."""

import math

import pytest
import torch

from rlbook.exercises.after_the_note import (
    check_cispo_loss,
    check_sampler_weights,
    reference_cispo_loss,
    reference_sampler_weights,
)


# ---------------------------------------------------------------------------------------------- CISPO
def _cispo_loop(logp, old_logp, advantages, mask, max_weight, *, mistake=None):
    """CISPO's token-level loss one completion at a time; ``mistake`` builds one of the usual wrong versions."""
    terms, per_row, count = [], [], 0
    for i in range(logp.shape[0]):
        n, a = int(mask[i].sum()), advantages[i]
        lp = logp[i, :n]
        ratio = torch.exp(lp - old_logp[i, :n])
        capped = torch.clamp(ratio, max=max_weight)
        if mistake == "not_detached":
            row = -capped * a * lp
        elif mistake == "clipped_ratio":
            row = -capped * a
        elif mistake == "ppo_min":
            row = -torch.minimum(ratio * a, capped * a)
        elif mistake == "surrogate_value":  # CISPO's gradient, another value: -w A rho / sg(rho)
            row = -capped.detach() * a * ratio / ratio.detach()
        else:
            row = -capped.detach() * a * lp
        terms.append(row.sum())
        per_row.append(row.mean())
        count += n
    if mistake == "per_completion":
        return torch.stack(per_row).mean()
    return torch.stack(terms).sum() / (logp.numel() if mistake == "padded" else count)


def test_cispo_accepts_the_reference_and_a_plain_loop(capsys):
    check_cispo_loss(reference_cispo_loss, num_trials=60)
    check_cispo_loss(_cispo_loop, num_trials=60)
    assert capsys.readouterr().out.strip() == "ok\nok"


def test_cispo_reference_on_a_hand_example():
    # ratios [0.5, 1, 10] with cap 5 and A = +1: weights [0.5, 1, 5], every token keeps a gradient -w / 3
    old = torch.log(torch.tensor([[0.2, 0.3, 0.01]]))
    logp = (old + torch.log(torch.tensor([[0.5, 1.0, 10.0]]))).requires_grad_(True)
    loss = reference_cispo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 3), max_weight=5.0)
    weights = torch.tensor([0.5, 1.0, 5.0])
    assert math.isclose(loss.item(), -(weights * logp.detach()[0]).sum().item() / 3, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad[0], -weights / 3)


@pytest.mark.parametrize("mistake, message", [
    ("not_detached", "detach the clipped weight"),
    ("clipped_ratio", "PPO's clipped surrogate"),
    ("ppo_min", "PPO's clipped surrogate"),
    ("per_completion", "as GRPO does"),
    ("padded", r"B \* T"),
    ("surrogate_value", "gradient is CISPO's but the value is not"),
])
def test_cispo_names_the_usual_mistakes(mistake, message):
    with pytest.raises(AssertionError, match=message):
        check_cispo_loss(lambda *args: _cispo_loop(*args, mistake=mistake))


def test_cispo_reports_padding_crash_none_shape_and_in_place_changes():
    def padding_in_loss(logp, old_logp, advantages, mask, max_weight):
        weight = torch.clamp(torch.exp(logp - old_logp), max=max_weight).detach()
        return -(weight * advantages[:, None] * logp).sum() / mask.sum()

    with pytest.raises(AssertionError, match="CISPO loss|padding"):
        check_cispo_loss(padding_in_loss)
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_cispo_loss(lambda *args: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_cispo_loss(lambda *args: None)
    with pytest.raises(AssertionError, match="scalar"):
        check_cispo_loss(lambda logp, *args: torch.stack([logp.sum(), logp.sum()]))

    def in_place(logp, old_logp, advantages, mask, max_weight):
        out = reference_cispo_loss(logp, old_logp, advantages, mask, max_weight)
        advantages.zero_()
        return out

    with pytest.raises(AssertionError, match="in place"):
        check_cispo_loss(in_place)


# ---------------------------------------------------------------------------------------------- sampler weights
def _weights_loop(old_logp, sampler_logp, mask, mode, clip_min, clip_max, *, mistake=None):
    """The weights one completion at a time, the sequence ratio as a product of token ratios; ``mistake`` builds
    one of the usual wrong versions."""
    weights = torch.zeros_like(old_logp)
    low = 0.0 if clip_min is None else clip_min
    for i in range(old_logp.shape[0]):
        n = int(mask[i].sum())
        upto = old_logp.shape[1] if mistake == "padding" else n
        ratio = torch.exp(old_logp[i, :upto] - sampler_logp[i, :upto])
        if mistake == "upside_down":
            ratio = 1 / ratio
        if mode.startswith("sequence"):
            whole = torch.prod(ratio) ** (1 / n) if mistake == "sequence_mean" else torch.prod(ratio)
            ratio = whole.expand(n)
        ratio = ratio[:n]
        truncate = {"truncated_mask": True, "masked_truncate": False}.get(mistake, mode.endswith("truncate"))
        if truncate:
            row = torch.clamp(ratio, min=clip_min, max=clip_max)
        else:
            inside = (ratio >= low) & (ratio <= clip_max)
            row = torch.where(inside, torch.ones_like(ratio) if mistake == "indicator" else ratio, 0.0)
        weights[i, :n] = row
    return weights


def test_sampler_weights_accept_the_reference_and_a_loop_with_products(capsys):
    check_sampler_weights(reference_sampler_weights, num_trials=80)
    check_sampler_weights(_weights_loop)
    assert capsys.readouterr().out.strip() == "ok\nok"


def test_sampler_weights_reference_on_the_chapter_example():
    # token ratios [0.5, 1, 4] and [1.25] (then padding): the chapter's hand-made batch
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    log_r = torch.tensor([[math.log(0.5), 0.0, math.log(4.0)], [math.log(1.25), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    expected = {("token_truncate", 0.8, 3.0): [[0.8, 1.0, 3.0], [1.25, 0.0, 0.0]],
                ("token_mask", 0.8, 3.0): [[0.0, 1.0, 0.0], [1.25, 0.0, 0.0]],
                ("sequence_truncate", None, 1.5): [[1.5, 1.5, 1.5], [1.25, 0.0, 0.0]],
                ("sequence_mask", None, 3.0): [[2.0, 2.0, 2.0], [1.25, 0.0, 0.0]]}
    for (mode, low, high), want in expected.items():
        got = reference_sampler_weights(old, old - log_r, mask, mode, low, high)
        assert torch.allclose(got, torch.tensor(want), atol=1e-6), mode


@pytest.mark.parametrize("mistake, message", [
    ("sequence_mean", "geometric mean"),
    ("padding", "includes the padding"),
    ("truncated_mask", "truncated the weight in a '_mask' mode"),
    ("masked_truncate", "masked the weight in a '_truncate' mode"),
    ("indicator", "r itself, not 1"),
    ("upside_down", "wrong way up"),
])
def test_sampler_weights_name_the_usual_mistakes(mistake, message):
    with pytest.raises(AssertionError, match=message):
        check_sampler_weights(lambda *args: _weights_loop(*args, mistake=mistake))


def test_sampler_weights_report_padding_shape_nan_crash_none_and_in_place_changes():
    def not_zero_on_padding(old_logp, sampler_logp, mask, mode, clip_min, clip_max):
        return reference_sampler_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max) + (1 - mask)

    with pytest.raises(AssertionError, match="0 on padding"):
        check_sampler_weights(not_zero_on_padding)
    with pytest.raises(AssertionError, match="shape"):
        check_sampler_weights(lambda old_logp, *args: old_logp[0] * 0 + 1)
    with pytest.raises(AssertionError, match="finite"):
        check_sampler_weights(lambda old_logp, *args: old_logp * float("nan"))
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_sampler_weights(lambda *args: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_sampler_weights(lambda *args: None)

    def in_place(old_logp, sampler_logp, mask, mode, clip_min, clip_max):
        out = reference_sampler_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max)
        sampler_logp.zero_()
        return out

    with pytest.raises(AssertionError, match="in place"):
        check_sampler_weights(in_place)
