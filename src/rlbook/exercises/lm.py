"""Exercises of the chapter "Language models as policies": the completion mask, sequence log-probs, entropy.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random torch tensors (seeded, so
a failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it,
and prints ``ok`` when everything agrees.

- :func:`check_completion_mask_from_ids`: ``fn(completion_ids, eos_id) -> (B, T)`` long mask, 1 up to *and
  including* the first EOS, 0 after it, all ones when a row has no EOS (equation ``eq-lm-mask``).
- :func:`check_sequence_logprob`: ``fn(token_logprobs, completion_mask) -> (B,)``, the masked sum
  ``log pi(o | q) = sum_t m_t log pi(o_t | q, o_<t)`` (equation ``eq-lm-log-chain``). Where the mask is 0 the
  log-probs hold garbage, often NaN or infinite, so multiplying by the mask (``0 * nan = nan``) fails.
- :func:`check_mean_token_logprob`: ``fn(token_logprobs, completion_mask) -> (B,)``, the masked sum divided by the
  number of completion tokens ``sum_t m_t``.
- :func:`check_entropy_at_temperature`: ``fn(logits, temperature) -> (...)``, the entropy in nats of
  ``softmax(logits / temperature)`` over the last axis (equation ``eq-lm-entropy``).

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from rlbook.exercises._compare import as_tensor, assert_close, call_reader, checker

if TYPE_CHECKING:
    import torch

_SEED = 20240607
NUM_TRIALS = 200
VOCAB_SIZE = 62  # the character vocabulary of rlbook.lm
EOS_ID, PAD_ID = 2, 0


# ---------------------------------------------------------------------------------------------- references
def reference_completion_mask_from_ids(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) long: 1 up to and including the first ``eos_id`` of each row, 0 after it; all ones without EOS.

    A token is kept when no EOS comes strictly before it: ``cumsum(is_eos) - is_eos == 0``.
    """
    is_eos = (completion_ids == eos_id).long()
    eos_before = is_eos.cumsum(-1) - is_eos  # (B, T): number of EOS strictly before position t
    return (eos_before == 0).long()


def reference_sequence_logprob(token_logprobs: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(B,) ``sum_t m_t * token_logprobs[:, t]``: the log-probability of each whole completion (eq-lm-log-chain)."""
    return token_logprobs.where(completion_mask.bool(), 0.0).sum(-1)


def reference_mean_token_logprob(token_logprobs: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(B,) the masked sum divided by the number of completion tokens ``sum_t m_t`` (at least 1 per row)."""
    return reference_sequence_logprob(token_logprobs, completion_mask) / completion_mask.sum(-1)


def reference_entropy_at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(...) entropy in nats of ``softmax(logits / temperature)`` over the last axis (eq-lm-entropy).

    ``-sum_v p_v log p_v`` with ``log p`` from ``log_softmax``: a probability that underflows to 0 has a finite
    log-probability, so its term is ``0 * finite = 0``, never ``0 * -inf = nan``. The input is not modified.
    """
    log_p = (logits / temperature).log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


# ---------------------------------------------------------------------------------------------- random inputs
def _random_completion_ids(rng: np.random.Generator) -> tuple[torch.Tensor, int]:
    """(B, T) token ids whose rows end in every way a sampled batch can: EOS early, late, at position 0, at the
    last position, twice, or not at all (truncated); after the first EOS either padding or arbitrary tokens."""
    import torch

    B, T = int(rng.integers(1, 7)), int(rng.integers(1, 9))
    eos_id = int(rng.choice([EOS_ID, int(rng.integers(0, VOCAB_SIZE))]))
    others = np.array([v for v in range(VOCAB_SIZE) if v != eos_id])
    ids = rng.choice(others, size=(B, T))
    for row in range(B):
        kind = rng.choice(["none", "one", "two", "first", "last"])
        if kind == "one":
            ids[row, int(rng.integers(0, T))] = eos_id
        elif kind == "two":
            ids[row, rng.choice(T, size=min(2, T), replace=False)] = eos_id
        elif kind == "first":
            ids[row, 0] = eos_id
        elif kind == "last":
            ids[row, T - 1] = eos_id
        hits = np.flatnonzero(ids[row] == eos_id)
        if len(hits) and rng.random() < 0.5 and eos_id != PAD_ID:  # pad after the first EOS, as a sampler writes
            ids[row, hits[0] + 1 :] = PAD_ID
    return torch.as_tensor(ids, dtype=torch.long), eos_id


def _random_logprob_batch(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) float32 token log-probs and a (B, T) long completion mask with at least one token per row.

    The entries where the mask is 0 hold garbage, as after the first EOS of a batch: arbitrary finite numbers, and
    in about two trials out of three also NaN, -inf or +inf (what a masked-out or overflowing logit produces), so
    that ``(token_logprobs * mask).sum(-1)`` is NaN there: ``0 * nan = nan`` and ``0 * inf = nan``.
    """
    import torch

    B, T = int(rng.integers(1, 7)), int(rng.integers(2, 10))
    token_logprobs = -rng.exponential(2.0, size=(B, T))
    lengths = rng.integers(1, T + 1, size=B)
    lengths[int(rng.integers(B))] = int(rng.integers(1, T))  # at least one row ends before the last column
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    garbage = rng.normal(0.0, 20.0, size=(B, T))
    if rng.random() < 2 / 3:
        non_finite = rng.choice([np.nan, -np.inf, np.inf], size=(B, T))
        garbage = np.where(rng.random((B, T)) < 0.5, non_finite, garbage)
        garbage[np.argmin(mask.sum(-1)), -1] = non_finite[0, 0]  # at least one non-finite entry past the EOS
    token_logprobs = np.where(mask == 1, token_logprobs, garbage)
    return torch.as_tensor(token_logprobs, dtype=torch.float32), torch.as_tensor(mask, dtype=torch.long)


def _random_logits(rng: np.random.Generator) -> tuple[torch.Tensor, float]:
    """Logits of shape (V,), (B, V) or (B, T, V), some of them huge (probabilities that underflow), and a
    temperature between 0.05 and 100."""
    import torch

    V = int(rng.integers(2, 70))
    shapes = [(V,), (int(rng.integers(1, 5)), V), (int(rng.integers(1, 4)), int(rng.integers(1, 5)), V)]
    shape = shapes[int(rng.integers(0, 3))]
    scale = float(rng.choice([0.1, 1.0, 3.0, 10.0, 100.0]))
    logits = torch.as_tensor(rng.normal(0.0, scale, size=shape), dtype=torch.float32)
    temperature = float(rng.choice([0.05, 0.3, 0.7, 1.0, 1.5, 4.0, 100.0]))
    return logits, temperature


# ---------------------------------------------------------------------------------------------- helpers
def _compare(got: torch.Tensor, expected: torch.Tensor, what: str, inputs: str, atol: float, rtol: float,
             nan_hint: str = "", hint: str = "") -> None:
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}\n{inputs}")
    if got.double().isnan().any():
        raise AssertionError(f"{what}: your result contains NaN{nan_hint}\n{inputs}")
    assert_close(got.double().numpy(), expected.double().numpy(), what, atol=atol, rtol=rtol, hint=hint,
                 inputs=inputs)


def _reduction_hint(got: torch.Tensor, token_logprobs: torch.Tensor, mask: torch.Tensor,
                    expected: torch.Tensor) -> str:
    """Name the usual mix-ups of a masked sum and a masked mean over each row's tokens."""
    kept = token_logprobs.double().where(mask.bool(), 0.0)
    total, count = kept.sum(-1), mask.double().sum(-1)
    candidates = {
        "a sum over the tokens where a mean was asked for": total,
        "a mean over the tokens where a sum was asked for": total / count,
        "divided by the padded length T, not by each row's own token count": total / mask.shape[-1],
        "divided by the batch's token count, not by each row's own": total / count.sum(),
    }
    mine = got.double().numpy()
    for what, candidate in candidates.items():
        if not np.allclose(candidate.numpy(), expected.double().numpy(), atol=1e-4, rtol=1e-5) \
                and np.allclose(mine, candidate.numpy(), atol=1e-4, rtol=1e-5):
            return f" (yours is {what})"
    return ""


def _unchanged(before: torch.Tensor, after: torch.Tensor, name: str, inputs: str) -> None:
    """Raise unless ``after`` holds exactly the values of ``before`` (NaN where ``before`` has NaN)."""
    if before.is_floating_point():
        nan = before.isnan()
        same = nan.equal(after.isnan()) and before.masked_fill(nan, 0.0).equal(after.masked_fill(nan, 0.0))
    else:
        same = before.equal(after)
    if not same:
        raise AssertionError(f"your function changed {name} in place; work on a copy (x / t, not x.div_(t))\n{inputs}")


# ---------------------------------------------------------------------------------------------- checkers
@checker
def check_completion_mask_from_ids(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(completion_ids, eos_id) -> (B, T) long mask`` with the reference on random batches."""
    import torch

    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        ids, eos_id = _random_completion_ids(rng)
        original = ids.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed}): eos_id={eos_id}, completion_ids of shape "
                  f"{tuple(ids.shape)} =\n{ids}")
        got = as_tensor(call_reader(fn, (ids, eos_id), inputs), "a (B, T) torch.long tensor", inputs)
        _unchanged(original, ids, "completion_ids", inputs)
        expected = reference_completion_mask_from_ids(original, eos_id)
        if tuple(got.shape) != tuple(expected.shape):
            raise AssertionError(f"mask: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}\n{inputs}")
        if got.dtype != torch.long:
            raise AssertionError(f"mask: expected dtype torch.long (as RolloutBatch.completion_mask), got {got.dtype}; "
                                 f"convert with .long()\n{inputs}")
        wrong_rows = (got != expected).any(-1).nonzero().flatten()
        if len(wrong_rows):
            row = int(wrong_rows[0])
            raise AssertionError(
                f"mask of row {row}: expected {expected[row].tolist()}, got {got[row].tolist()} for the ids "
                f"{original[row].tolist()} (1 up to and including the first EOS, 0 after it, all ones without EOS)"
                f"\n{inputs}"
            )
    print("ok")


def _check_masked_reduction(fn: Callable, reference: Callable, what: str, num_trials: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        token_logprobs, mask = _random_logprob_batch(rng)
        originals = token_logprobs.clone(), mask.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed}): token_logprobs and completion_mask of shape "
                  f"{tuple(mask.shape)}\n  token_logprobs =\n{token_logprobs}\n  completion_mask =\n{mask}")
        got = as_tensor(call_reader(fn, (token_logprobs, mask), inputs), "a (B,) torch tensor", inputs)
        _unchanged(originals[0], token_logprobs, "token_logprobs", inputs)
        _unchanged(originals[1], mask, "completion_mask", inputs)
        expected = reference(*originals)
        hint = _reduction_hint(got, originals[0], originals[1], expected) if got.shape == expected.shape else ""
        _compare(got, expected, what, inputs, atol=1e-4, rtol=1e-5, hint=hint,
                 nan_hint=" (the log-probs past the mask hold NaN or inf: leave them out with "
                          "token_logprobs.where(mask.bool(), 0.0); multiplying by the mask is not enough, "
                          "0 * nan = 0 * inf = nan)")
    print("ok")


@checker
def check_sequence_logprob(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(token_logprobs, completion_mask) -> (B,)`` (masked sum) with the reference.

    Entries of ``token_logprobs`` where the mask is 0 hold garbage, as in a real batch after the first EOS.
    """
    _check_masked_reduction(fn, reference_sequence_logprob, "sequence log-prob (masked sum)", num_trials, seed)


@checker
def check_mean_token_logprob(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(token_logprobs, completion_mask) -> (B,)`` (masked mean over each row's tokens) with the
    reference. Every row has at least one completion token."""
    _check_masked_reduction(fn, reference_mean_token_logprob, "mean token log-prob (masked mean per row)",
                            num_trials, seed + 1)


@checker
def check_entropy_at_temperature(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(logits, temperature) -> (...)`` (entropy in nats over the last axis) with the reference.

    The logits are float32 of shape (V,), (B, V) or (B, T, V); some are so large that probabilities underflow to
    0, where ``p * log(p)`` must count as 0. The temperature is a Python float in [0.05, 100].
    """
    rng = np.random.default_rng(seed + 2)
    for trial in range(num_trials):
        logits, temperature = _random_logits(rng)
        original = logits.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed + 2}): temperature={temperature}, logits of shape "
                  f"{tuple(logits.shape)} =\n{logits}")
        got = as_tensor(call_reader(fn, (logits, temperature), inputs), "a torch tensor of shape logits.shape[:-1]",
                         inputs)
        _unchanged(original, logits, "logits", inputs)
        _compare(got, reference_entropy_at_temperature(original.double(), temperature),
                 f"entropy at temperature {temperature}", inputs, atol=2e-4, rtol=1e-4,
                 nan_hint=" (a probability that underflows to 0 gives 0 * log(0) = 0 * -inf = nan; "
                          "take log p from log_softmax, which stays finite)")
    print("ok")
