"""The checker of the chapter "Dr. GRPO" accepts the closed-form weights and rejects the usual mix-ups."""

import pytest
import torch

from rlbook.exercises import check_token_weights
from rlbook.exercises.drgrpo import reference_token_weights


def closed_form(advantages, mask, loss_type, max_completion_length):
    """The weights of the chapter's table, written out."""
    m = mask.to(advantages.dtype)
    B, lengths = m.shape[0], m.sum(-1)
    if loss_type == "grpo":
        per_row = advantages / (B * lengths)
    elif loss_type == "dapo":
        per_row = advantages / lengths.sum()
    else:
        per_row = advantages / (B * max_completion_length)
    return per_row[:, None] * m


def test_reference_by_hand():
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])  # lengths 2 and 4
    grpo = reference_token_weights(advantages, mask, "grpo", 4)
    assert torch.allclose(grpo, torch.tensor([[0.25, 0.25, 0, 0], [-0.125] * 4]), atol=1e-6)
    dapo = reference_token_weights(advantages, mask, "dapo", 4)
    assert torch.allclose(dapo, torch.tensor([[1 / 6, 1 / 6, 0, 0], [-1 / 6] * 4]), atol=1e-6)
    dr = reference_token_weights(advantages, mask, "dr_grpo", 8)
    assert torch.allclose(dr, torch.tensor([[1 / 16, 1 / 16, 0, 0], [-1 / 16] * 4]), atol=1e-6)


def test_checker_accepts_the_reference_and_the_closed_form(capsys):
    check_token_weights(reference_token_weights)
    check_token_weights(closed_form)
    assert capsys.readouterr().out.split() == ["ok", "ok"]


def test_checker_names_the_wrong_aggregation():
    def always_grpo(advantages, mask, loss_type, max_completion_length):
        return closed_form(advantages, mask, "grpo", max_completion_length)

    with pytest.raises(AssertionError, match="weights of loss_type='grpo'"):
        check_token_weights(always_grpo)


def test_checker_rejects_padding_weights_and_none():
    def leaks(advantages, mask, loss_type, max_completion_length):
        return closed_form(advantages, torch.ones_like(mask), loss_type, max_completion_length)

    with pytest.raises(AssertionError, match="per-token weights"):
        check_token_weights(leaks)
    with pytest.raises(AssertionError, match="returned NoneType"):
        check_token_weights(lambda *args: None)


def test_checker_rejects_in_place_changes():
    def in_place(advantages, mask, loss_type, max_completion_length):
        out = closed_form(advantages, mask, loss_type, max_completion_length)
        advantages.zero_()
        return out

    with pytest.raises(AssertionError, match="in place"):
        check_token_weights(in_place)


def test_stub_passes_through():
    def stub(*args):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_token_weights(stub)
