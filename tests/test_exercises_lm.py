"""The checkers of the chapter "Language models as policies" accept the references and reject typical mistakes."""

import math

import pytest
import torch

from rlbook.exercises import (
    check_completion_mask_from_ids,
    check_entropy_at_temperature,
    check_mean_token_logprob,
    check_sequence_logprob,
)
from rlbook.exercises.lm import (
    reference_completion_mask_from_ids,
    reference_entropy_at_temperature,
    reference_mean_token_logprob,
    reference_sequence_logprob,
)
from rlbook.lm import build_model, build_tokenizer
from rlbook.rollout import generate_rollouts

EOS = 2


# ---------------------------------------------------------------- references on hand-computed cases
def test_completion_mask_reference_by_hand():
    ids = torch.tensor([[5, 6, EOS, 0, 0], [EOS, 7, 7, 7, 7], [5, 5, 5, 5, 5], [5, EOS, 9, EOS, 9], [4, 4, 4, 4, EOS]])
    assert reference_completion_mask_from_ids(ids, EOS).tolist() == [
        [1, 1, 1, 0, 0],  # up to and including the EOS
        [1, 0, 0, 0, 0],  # an immediate EOS is the whole completion
        [1, 1, 1, 1, 1],  # no EOS: truncated, every token counts
        [1, 1, 0, 0, 0],  # only the first EOS ends the completion
        [1, 1, 1, 1, 1],  # EOS in the last column
    ]
    assert reference_completion_mask_from_ids(ids, EOS).dtype == torch.long


def test_completion_mask_reference_equals_the_samplers_mask():
    """The mask the sampler writes (rlbook.rollout) is the reference mask of its own completion ids."""
    tokenizer = build_tokenizer()
    model = build_model("tiny", seed=0)
    with torch.no_grad():  # make EOS likely, so that rows end at different times
        model.lm_head.weight[tokenizer.eos_token_id] *= 4.0
    batch = generate_rollouts(model, tokenizer, ["12+3=", "7*8="], num_generations=8, max_new_tokens=12, seed=0)
    assert 0 < int(batch.truncated.sum()) < len(batch), "want both finished and truncated rows"
    expected = reference_completion_mask_from_ids(batch.completion_ids, tokenizer.eos_token_id)
    assert torch.equal(batch.completion_mask, expected)


def test_sequence_and_mean_logprob_references_by_hand():
    token_logprobs = torch.tensor([[-1.0, -2.0, 99.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.allclose(reference_sequence_logprob(token_logprobs, mask), torch.tensor([-3.0, -1.5]), atol=1e-6)
    assert torch.allclose(reference_mean_token_logprob(token_logprobs, mask), torch.tensor([-1.5, -0.5]), atol=1e-6)
    # Non-finite garbage past the mask is left out, not multiplied by 0 (0 * nan = 0 * inf = nan).
    garbage = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, float("-inf"), float("inf")]])
    ends = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert torch.allclose(reference_sequence_logprob(garbage, ends), torch.tensor([-3.0, -0.5]), atol=1e-6)
    assert torch.allclose(reference_mean_token_logprob(garbage, ends), torch.tensor([-1.5, -0.5]), atol=1e-6)


def test_entropy_reference_limits():
    logits = torch.tensor([1.0, 2.0, 4.0, 0.5], dtype=torch.float64)
    assert reference_entropy_at_temperature(logits, 1e-3).item() == pytest.approx(0.0, abs=1e-12)  # greedy
    assert reference_entropy_at_temperature(logits, 1e6).item() == pytest.approx(math.log(4), abs=1e-6)  # uniform
    p = torch.softmax(logits / 0.7, -1)
    assert reference_entropy_at_temperature(logits, 0.7).item() == pytest.approx(-(p * p.log()).sum().item())
    huge = torch.tensor([[0.0, 1e4, -1e4]])
    assert torch.isfinite(reference_entropy_at_temperature(huge, 0.1)).all()


def test_references_pass_their_checkers(capsys):
    check_completion_mask_from_ids(reference_completion_mask_from_ids)
    check_sequence_logprob(reference_sequence_logprob)
    check_mean_token_logprob(reference_mean_token_logprob)
    check_entropy_at_temperature(reference_entropy_at_temperature)
    assert capsys.readouterr().out == "ok\nok\nok\nok\n"


def test_other_correct_solutions_pass(capsys):
    def mask_by_argmax(ids, eos_id):
        is_eos = ids == eos_id
        first = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), ids.shape[1])
        return (torch.arange(ids.shape[1])[None, :] <= first[:, None]).long()

    def entropy_by_formula(logits, temperature):  # H = logsumexp(z/T) - E_p[z/T]
        scaled = logits / temperature
        return scaled.logsumexp(-1) - (scaled.softmax(-1) * scaled).sum(-1)

    check_completion_mask_from_ids(mask_by_argmax)
    check_sequence_logprob(lambda lp, m: lp.masked_fill(m == 0, 0.0).sum(-1))
    check_sequence_logprob(lambda lp, m: torch.where(m.bool(), lp, torch.zeros_like(lp)).sum(-1))
    check_mean_token_logprob(lambda lp, m: lp.masked_fill(m == 0, 0.0).sum(-1) / m.sum(-1))
    check_entropy_at_temperature(entropy_by_formula)
    assert capsys.readouterr().out == "ok\nok\nok\nok\nok\n"


# ---------------------------------------------------------------- wrong completion masks are caught
def mask_excluding_eos(ids, eos_id):
    """Stops *before* the first EOS: the policy would never be taught to stop."""
    return reference_completion_mask_from_ids(ids, eos_id) * (ids != eos_id).long()


def mask_continuing_after_eos(ids, eos_id):
    """Every non-padding token, so tokens sampled after the EOS count too."""
    return (ids != 0).long()


def mask_all_ones(ids, eos_id):
    return torch.ones_like(ids)


def mask_up_to_last_eos(ids, eos_id):
    """Runs to the *last* EOS of a row instead of the first."""
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    last = torch.where(ids == eos_id, positions, -1).max(-1, keepdim=True).values
    return torch.where(last >= 0, positions <= last, True).long()


def mask_zero_without_eos(ids, eos_id):
    """Treats a truncated row (no EOS) as empty instead of all ones."""
    return reference_completion_mask_from_ids(ids, eos_id) * (ids == eos_id).any(-1, keepdim=True).long()


def mask_as_bool(ids, eos_id):
    return reference_completion_mask_from_ids(ids, eos_id).bool()


def mask_in_place(ids, eos_id):
    mask = reference_completion_mask_from_ids(ids, eos_id)
    ids.mul_(mask)
    return mask


@pytest.mark.parametrize(
    "wrong, message",
    [
        (mask_excluding_eos, "mask of row"),
        (mask_continuing_after_eos, "mask of row"),
        (mask_all_ones, "mask of row"),
        (mask_up_to_last_eos, "mask of row"),
        (mask_zero_without_eos, "mask of row"),
        (mask_as_bool, "dtype torch.long"),
        (mask_in_place, "in place"),
        (lambda ids, eos_id: None, "returned None"),
        (lambda ids, eos_id: reference_completion_mask_from_ids(ids, eos_id).tolist(), "returned a list"),
        (lambda ids, eos_id: reference_completion_mask_from_ids(ids, eos_id)[:, :-1], "expected shape"),
    ],
)
def test_completion_mask_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message) as error:
        check_completion_mask_from_ids(wrong)
    assert "inputs of trial" in str(error.value)
    assert "ok" not in capsys.readouterr().out


# ---------------------------------------------------------------- wrong sequence / mean log-probs are caught
def masked(lp, m):
    """The garbage past the mask left out (selected away, not multiplied by 0)."""
    return lp.where(m.bool(), 0.0)


def sequence_logprob_multiplying_by_the_mask(lp, m):
    """The mistake the chapter warns about: 0 * nan = nan and 0 * inf = nan."""
    return (lp * m).sum(-1)


def mean_token_logprob_multiplying_by_the_mask(lp, m):
    return (lp * m).sum(-1) / m.sum(-1)


def test_the_garbage_past_the_mask_is_often_not_finite():
    batches = []

    def recording(lp, m):
        batches.append((lp.clone(), m.clone()))
        return reference_sequence_logprob(lp, m)

    check_sequence_logprob(recording)
    past_mask = [lp[m == 0] for lp, m in batches]
    assert all(lp[m == 1].isfinite().all() for lp, m in batches)  # the completion's own log-probs are finite
    with_non_finite = sum(bool((~values.isfinite()).any()) for values in past_mask)
    assert with_non_finite >= len(batches) // 2
    assert any(values.isnan().any() for values in past_mask) and any(values.isinf().any() for values in past_mask)
    assert not past_mask[0].isfinite().all()  # already the first trial catches the multiplication


@pytest.mark.parametrize(
    "wrong, message",
    [
        (sequence_logprob_multiplying_by_the_mask, "contains NaN .*multiplying by the mask is not enough"),
        (lambda lp, m: lp.sum(-1), "masked sum"),  # garbage after EOS enters the sum
        (lambda lp, m: masked(lp, m).mean(-1), "masked sum"),  # divides by T
        (lambda lp, m: masked(lp, m).sum(), "expected shape"),  # one number for the batch
        (lambda lp, m: masked(lp, m).sum(0), "expected shape|masked sum"),  # summed over the wrong axis
        (lambda lp, m: masked(lp, m).exp().mul(m).sum(-1).log(), "masked sum"),  # log of a sum of probabilities
    ],
)
def test_sequence_logprob_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message) as error:
        check_sequence_logprob(wrong)
    assert "inputs of trial" in str(error.value)
    assert "ok" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, message",
    [
        (mean_token_logprob_multiplying_by_the_mask, "contains NaN"),
        (lambda lp, m: masked(lp, m).sum(-1) / m.shape[1], "masked mean"),  # divides by the padded length
        (lambda lp, m: masked(lp, m).sum(-1), "masked mean"),  # the sum, not the mean
        (lambda lp, m: masked(lp, m).sum(-1) / m.sum(), "masked mean"),  # divides by the batch's token count
        (lambda lp, m: masked(lp, m).mean(-1), "masked mean"),
    ],
)
def test_mean_token_logprob_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message):
        check_mean_token_logprob(wrong)
    assert "ok" not in capsys.readouterr().out


def sequence_logprob_in_place(lp, m):
    lp.mul_(m)
    return lp.sum(-1)


def test_in_place_reduction_is_rejected():
    with pytest.raises(AssertionError, match="changed token_logprobs in place"):
        check_sequence_logprob(sequence_logprob_in_place)


# ---------------------------------------------------------------- wrong entropies are caught
def entropy_without_temperature(logits, temperature):
    return reference_entropy_at_temperature(logits, 1.0)


def entropy_times_temperature(logits, temperature):
    return reference_entropy_at_temperature(logits * temperature, 1.0)


def entropy_naive_log(logits, temperature):
    p = torch.softmax(logits / temperature, -1)
    return -(p * p.log()).sum(-1)


def entropy_in_base_2(logits, temperature):
    return reference_entropy_at_temperature(logits, temperature) / math.log(2)


def entropy_over_first_axis(logits, temperature):
    log_p = (logits / temperature).log_softmax(0)
    return -(log_p.exp() * log_p).sum(0)


def entropy_in_place(logits, temperature):
    return reference_entropy_at_temperature(logits.div_(temperature), 1.0)


def entropy_without_minus(logits, temperature):
    return -reference_entropy_at_temperature(logits, temperature)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (entropy_without_temperature, "entropy at temperature"),
        (entropy_times_temperature, "entropy at temperature"),
        (entropy_naive_log, "NaN"),
        (entropy_in_base_2, "entropy at temperature"),
        (entropy_over_first_axis, "expected shape|entropy at temperature"),
        (entropy_in_place, "in place"),
        (entropy_without_minus, "entropy at temperature"),
    ],
)
def test_entropy_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message) as error:
        check_entropy_at_temperature(wrong)
    assert "inputs of trial" in str(error.value)
    assert "ok" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "checker, shown",
    [
        (check_completion_mask_from_ids, ["eos_id=", "completion_ids of shape"]),
        (check_sequence_logprob, ["token_logprobs and completion_mask of shape", "completion_mask ="]),
        (check_mean_token_logprob, ["token_logprobs and completion_mask of shape", "completion_mask ="]),
        (check_entropy_at_temperature, ["temperature=", "logits of shape"]),
    ],
)
def test_a_crash_of_the_readers_function_reports_the_inputs(checker, shown):
    def broken(*args):
        raise ValueError("my bug")

    with pytest.raises(AssertionError, match="your function raised ValueError: my bug") as error:
        checker(broken)
    assert isinstance(error.value.__cause__, ValueError)  # the reader's own traceback is chained
    message = str(error.value)
    assert "inputs of trial 0 (seed " in message
    for text in shown:
        assert text in message
