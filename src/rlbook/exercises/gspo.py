"""Exercise of the chapter "GSPO": the sequence-level clipped loss.

:func:`check_gspo_loss` compares the reader's ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high) ->
scalar tensor`` with GSPO's loss on random inputs (seeded, so a failure is reproducible), in value **and** in its
gradient with respect to ``logp``. Shapes: ``logp``, ``old_logp``, ``mask`` (B, T) (right-padded completions, every
row at least one token; padding may hold any number), ``advantages`` (B,). The loss is

    s_i = exp( sum_t m_{i,t} (logp - old_logp)_{i,t} / |o_i| ),
    loss = -(1/B) sum_i min( s_i A_i, clip(s_i, 1 - epsilon, 1 + epsilon_high) A_i ),

the reference being the package's ``policy_loss(..., loss_type="grpo", importance_sampling_level="sequence")``.

The usual mistakes it names: token-level ratios (GRPO's), the whole-sequence ratio pi(o)/pi_old(o) without the
power 1/|o_i|, and padding counted in the length.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from rlbook.exercises._compare import as_tensor, assert_close, call_reader
from rlbook.objectives import policy_loss

_SEED = 20250724
NUM_TRIALS = 150


# ---------------------------------------------------------------------------------------------- reference
def reference_gspo_loss(logp, old_logp, advantages, mask, epsilon: float = 3e-4,
                        epsilon_high: float = 4e-4) -> torch.Tensor:
    """GSPO's loss (a scalar tensor, differentiable in ``logp``): the package's sequence-level ``policy_loss``."""
    return policy_loss(logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
                       loss_type="grpo", importance_sampling_level="sequence")[0]


def _variant(name: str, logp, old_logp, advantages, mask, epsilon, epsilon_high) -> torch.Tensor:
    """One of the usual mistakes, as a loss (for the hints)."""
    if name == "token":
        return policy_loss(logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
                           loss_type="grpo")[0]
    m = mask.bool()
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp)).sum(-1)
    log_s = log_ratio.clamp(max=30) if name == "product" else log_ratio / logp.shape[1]  # "padded"
    s = torch.exp(log_s)
    return -torch.minimum(s * advantages, s.clamp(1 - epsilon, 1 + epsilon_high) * advantages).mean()


_HINTS = {
    "token": " (this is GRPO's loss with one ratio per token; GSPO uses one ratio s_i per completion)",
    "product": " (you used the whole-sequence ratio pi(o)/pi_old(o); GSPO takes its |o_i|-th root, the geometric "
               "mean of the token ratios)",
    "padded": " (you divided by the padded length T; |o_i| counts only the completion's own tokens, sum_t m)",
}


def _value_and_grad(fn, args: tuple, shown: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss ``fn(*args)`` and its gradient in ``args[0]`` (logp); ``AssertionError`` if ``fn`` changed any
    tensor argument in place or returned no differentiable scalar."""
    logp = args[0].clone().requires_grad_(True)
    copies = [t.clone() for t in args[1:4]]
    before = [t.clone() for t in (logp.detach(),) + tuple(copies)]
    got = call_reader(fn, (logp, *copies) + args[4:], shown)
    for name, original, now in zip(("logp", "old_logp", "advantages", "mask"), before, (logp.detach(), *copies)):
        if not torch.allclose(original, now, rtol=0, atol=0, equal_nan=True):
            raise AssertionError(f"your function changed {name} in place; work on a copy\n{shown}")
    got = got if isinstance(got, torch.Tensor) else as_tensor(got, "a scalar tensor", shown)
    if got.numel() != 1:
        raise AssertionError(f"your function returned shape {tuple(got.shape)}; it must return a scalar\n{shown}")
    if not got.requires_grad:
        raise AssertionError(f"your loss does not depend on logp differentiably (no gradient flows)\n{shown}")
    (grad,) = torch.autograd.grad(got.reshape(()), logp, allow_unused=True)
    grad = torch.zeros_like(logp) if grad is None else grad
    return got.detach().reshape(()), grad.detach()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-6))


# ---------------------------------------------------------------------------------------------- checker
def check_gspo_loss(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high)`` with GSPO's loss and its gradient
    in ``logp``, on random batches: one-token and long completions, ratios inside and outside GSPO's tiny clip
    range (3e-4 / 4e-4) and a GRPO-sized one (0.2), positive and negative advantages, garbage on the padding."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        lengths = rng.integers(1, T + 1, size=B)
        mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float32)
        old_logp = torch.as_tensor(-rng.exponential(1.0, size=(B, T)), dtype=torch.float32)
        spread = (1e-4, 1e-3, 0.3)[trial % 3]  # log-ratios inside, around and far outside GSPO's clip range
        logp = old_logp + torch.as_tensor(rng.normal(0.0, spread, size=(B, T)), dtype=torch.float32)
        padding = torch.as_tensor(rng.normal(0.0, 50.0, size=(B, T)), dtype=torch.float32)
        logp, old_logp = torch.where(mask.bool(), logp, padding), torch.where(mask.bool(), old_logp, -padding)
        advantages = torch.as_tensor(rng.normal(size=B), dtype=torch.float32)
        epsilon, epsilon_high = ((3e-4, 4e-4), (0.2, 0.2), (0.2, 0.28))[trial % 3]
        args = (logp, old_logp, advantages, mask, epsilon, epsilon_high)
        shown = (f"  inputs of trial {trial} (seed {seed}): epsilon={epsilon}, epsilon_high={epsilon_high},\n"
                 f"  lengths |o_i| = {lengths.tolist()}, advantages = {np.round(advantages.numpy(), 4).tolist()},\n"
                 f"  logp - old_logp on the completion tokens = "
                 f"{[np.round((logp - old_logp)[i, :n].numpy(), 5).tolist() for i, n in enumerate(lengths)]}")
        value, grad = _value_and_grad(fn, args, shown)
        ref_value, ref_grad = _value_and_grad(reference_gspo_loss, args, shown)
        masked = mask.bool()
        hint = ""
        if not (_close(value, ref_value) and _close(grad[masked], ref_grad[masked])):
            for name in _HINTS:
                v_value, v_grad = _value_and_grad(lambda *a, name=name: _variant(name, *a), args, shown)
                if _close(value, v_value) and _close(grad[masked], v_grad[masked]):
                    hint = _HINTS[name]
                    break
        assert_close(value, ref_value, "GSPO loss", atol=1e-6, rtol=1e-4, hint=hint, inputs=shown)
        assert_close(grad[masked], ref_grad[masked], "gradient of the GSPO loss in logp (completion tokens)",
                     atol=1e-6, rtol=1e-4,
                     hint=hint or " (the value agrees: check what the gradient flows through)", inputs=shown)
        if not bool((grad[~masked] == 0).all()):
            raise AssertionError(f"your loss has a gradient on padding positions; mask them out\n{shown}")
    print("ok")
