"""Exercise of the chapter "Dr. GRPO": the per-token weight of each loss aggregation.

At the on-policy point (ratio 1, no KL), the gradient of every clipped loss of :func:`rlbook.objectives.policy_loss`
is a weighted sum of the tokens' score functions, ``-grad loss = sum_{i,t} w_{i,t} grad log pi(o_{i,t})``, and
the aggregations differ only in the weight:

- ``"grpo"``: ``w_{i,t} = A_i / (B |o_i|)`` (each completion's token mean, averaged over the B rows);
- ``"dapo"``: ``w_{i,t} = A_i / sum_j |o_j|`` (one token mean over the whole batch);
- ``"dr_grpo"``: ``w_{i,t} = A_i / (B L_max)`` with ``L_max = max_completion_length`` (a constant);

and ``w = 0`` on padding. :func:`check_token_weights` compares the reader's
``fn(advantages, mask, loss_type, max_completion_length) -> (B, T)`` with these weights on random batches.
The reference is the autograd gradient of the package's ``policy_loss`` itself, so the checker also confirms
that the formulas above are what the code computes.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, checker

if TYPE_CHECKING:
    import torch

_SEED = 20250325
NUM_TRIALS = 200
LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


# ---------------------------------------------------------------------------------------------- reference
def reference_token_weights(advantages: torch.Tensor, mask: torch.Tensor, loss_type: str,
                            max_completion_length: int) -> torch.Tensor:
    """(B, T) weight of ``grad log pi(o_{i,t})`` in ``-grad policy_loss`` at ratio 1, from autograd."""
    import torch

    from rlbook.objectives import policy_loss

    logp = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), advantages.double(), mask.bool(), loss_type=loss_type,
                          max_completion_length=max_completion_length)
    (grad,) = torch.autograd.grad(loss, logp)
    return (-grad).where(mask.bool(), 0.0).to(advantages.dtype)


# ---------------------------------------------------------------------------------------------- random inputs
def _random_batch(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, str, int]:
    """(B,) float32 advantages, a right-padded (B, T) long mask (every row at least one token), a loss type and
    a budget ``max_completion_length >= T``."""
    import torch

    B, T = int(rng.integers(1, 7)), int(rng.integers(1, 10))
    lengths = rng.integers(1, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    advantages = rng.normal(0.0, 1.0, size=B)
    loss_type = str(rng.choice(LOSS_TYPES))
    max_completion_length = T + int(rng.integers(0, 4))
    return (torch.as_tensor(advantages, dtype=torch.float32), torch.as_tensor(mask, dtype=torch.long), loss_type,
            max_completion_length)


def _hint(got: np.ndarray, advantages: np.ndarray, mask: np.ndarray, loss_type: str, L: int) -> str:
    """Name the usual mix-up: the weight of another aggregation than the one asked for."""
    B, lengths = mask.shape[0], mask.sum(-1)
    candidates = {"grpo": advantages / (B * lengths), "dapo": advantages / lengths.sum(),
                  "dr_grpo": advantages / (B * L)}
    for name, per_row in candidates.items():
        if name != loss_type and np.allclose(got, per_row[:, None] * mask, atol=1e-4, rtol=1e-4):
            return f" (these are the weights of loss_type={name!r}, not {loss_type!r})"
    return ""


# ---------------------------------------------------------------------------------------------- checker
@checker
def check_token_weights(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(advantages, mask, loss_type, max_completion_length) -> (B, T)`` with the per-token weights
    of ``"grpo"``, ``"dapo"`` and ``"dr_grpo"`` on random batches."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        advantages, mask, loss_type, L = _random_batch(rng)
        originals = advantages.clone(), mask.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed}): loss_type={loss_type!r}, max_completion_length={L}, "
                  f"advantages = {advantages.tolist()}\n  mask =\n{mask}")
        got = call_reader(fn, (advantages, mask, loss_type, L), inputs)
        if got is None or not hasattr(got, "shape"):
            raise AssertionError(f"your function returned {type(got).__name__}; it must return a (B, T) tensor\n"
                                 f"{inputs}")
        if not (advantages.equal(originals[0]) and mask.equal(originals[1])):
            raise AssertionError(f"your function changed its inputs in place; work on a copy\n{inputs}")
        got = np.asarray(got.detach().cpu().double() if hasattr(got, "detach") else got, dtype=float)
        expected = reference_token_weights(advantages, mask, loss_type, L).double().numpy()
        if got.shape != expected.shape:
            raise AssertionError(f"per-token weights: expected shape {expected.shape}, got {got.shape}\n{inputs}")
        try:
            assert_close(got, expected, f"per-token weights of {loss_type!r}", atol=1e-5, rtol=1e-4)
        except AssertionError as error:
            hint = _hint(got, advantages.double().numpy(), mask.double().numpy(), loss_type, L)
            raise AssertionError(f"{error}{hint}\n{inputs}") from None
    print("ok")
