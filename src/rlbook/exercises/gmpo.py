"""Exercise of the chapter "GMPO": the geometric-mean loss with its sign-dependent log-space clip.

:func:`check_gmpo_loss` compares the reader's ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high) ->
scalar tensor`` with GMPO's loss on random inputs (seeded, so a failure is reproducible), in value **and** in its
gradient with respect to ``logp``. Shapes: ``logp``, ``old_logp``, ``mask`` (B, T) (right-padded completions, every
row at least one token; padding may hold any number), ``advantages`` (B,). With Delta = logp - old_logp,

    Delta~_t = min(Delta_t, clip(Delta_t, -epsilon, epsilon_high))   if A_i > 0,
    Delta~_t = max(Delta_t, clip(Delta_t, -epsilon, epsilon_high))   if A_i <= 0,
    loss = -(1/B) sum_i A_i exp( sum_t m_{i,t} Delta~_{i,t} / |o_i| ),

the reference being the package's ``policy_loss(..., loss_type="gmpo")``.

The usual mistakes it names: GRPO's arithmetic mean of the clipped token ratios, a clip in ratio space
(1 - epsilon, 1 + epsilon_high) instead of log space, a two-sided clip that ignores the sign of the advantage, and
padding counted in the length.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from rlbook.exercises._compare import as_tensor, assert_close, call_reader
from rlbook.objectives import policy_loss

_SEED = 20250727
NUM_TRIALS = 150


# ---------------------------------------------------------------------------------------------- reference
def reference_gmpo_loss(logp, old_logp, advantages, mask, epsilon: float = 0.4,
                        epsilon_high: float = 0.4) -> torch.Tensor:
    """GMPO's loss (a scalar tensor, differentiable in ``logp``): the package's ``policy_loss(loss_type="gmpo")``."""
    return policy_loss(logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
                       loss_type="gmpo")[0]


def _variant(name: str, logp, old_logp, advantages, mask, epsilon, epsilon_high) -> torch.Tensor:
    """One of the usual mistakes, as a loss (for the hints)."""
    m = mask.bool()
    delta = torch.where(m, logp - old_logp, torch.zeros_like(logp))
    positive = (advantages > 0)[:, None]
    lengths = m.sum(-1)
    if name == "arithmetic":
        ratio, clipped = torch.exp(delta), torch.exp(delta.clamp(-epsilon, epsilon_high))
        per_token = torch.where(positive, torch.minimum(ratio, clipped), torch.maximum(ratio, clipped))
        return -(advantages * (per_token * m).sum(-1) / lengths).mean()
    if name == "ratio_space":
        clipped = torch.log(torch.exp(delta).clamp(1 - min(epsilon, 0.999), 1 + epsilon_high))
    else:
        clipped = delta.clamp(-epsilon, epsilon_high)
    if name == "two_sided":
        tilde = clipped
    else:
        tilde = torch.where(positive, torch.minimum(delta, clipped), torch.maximum(delta, clipped))
    length = logp.shape[1] if name == "padded" else lengths
    return -(advantages * torch.exp((tilde * m).sum(-1) / length)).mean()


_HINTS = {
    "arithmetic": " (you averaged the clipped token ratios arithmetically, as GRPO does; GMPO takes their geometric "
                  "mean, exp of the mean log-ratio)",
    "ratio_space": " (you clipped the ratio to (1 - epsilon, 1 + epsilon_high); GMPO clips the log-ratio to "
                   "(-epsilon, epsilon_high))",
    "two_sided": " (you clipped the log-ratio on both sides whatever the advantage; like PPO, GMPO clips only the "
                 "side the advantage pushes towards: min(.) for A > 0, max(.) for A <= 0)",
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
def check_gmpo_loss(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high)`` with GMPO's loss and its gradient
    in ``logp``, on random batches: one-token and long completions, log-ratios inside and far outside the clip
    range, GMPO's symmetric 0.4 and an asymmetric range, positive and negative advantages, garbage on the padding."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        lengths = rng.integers(1, T + 1, size=B)
        mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float32)
        old_logp = torch.as_tensor(-rng.exponential(1.0, size=(B, T)), dtype=torch.float32)
        spread = (0.05, 0.5, 1.5)[trial % 3]  # log-ratios inside, around and far outside the clip range
        logp = old_logp + torch.as_tensor(rng.normal(0.0, spread, size=(B, T)), dtype=torch.float32)
        padding = torch.as_tensor(rng.normal(0.0, 50.0, size=(B, T)), dtype=torch.float32)
        logp, old_logp = torch.where(mask.bool(), logp, padding), torch.where(mask.bool(), old_logp, -padding)
        advantages = torch.as_tensor(rng.normal(size=B), dtype=torch.float32)
        epsilon, epsilon_high = ((0.4, 0.4), (0.2, 0.3), (0.4, 0.4))[trial % 3]
        args = (logp, old_logp, advantages, mask, epsilon, epsilon_high)
        shown = (f"  inputs of trial {trial} (seed {seed}): epsilon={epsilon}, epsilon_high={epsilon_high},\n"
                 f"  lengths |o_i| = {lengths.tolist()}, advantages = {np.round(advantages.numpy(), 4).tolist()},\n"
                 f"  logp - old_logp on the completion tokens = "
                 f"{[np.round((logp - old_logp)[i, :n].numpy(), 5).tolist() for i, n in enumerate(lengths)]}")
        value, grad = _value_and_grad(fn, args, shown)
        ref_value, ref_grad = _value_and_grad(reference_gmpo_loss, args, shown)
        masked = mask.bool()
        hint = ""
        if not (_close(value, ref_value) and _close(grad[masked], ref_grad[masked])):
            for name in _HINTS:
                v_value, v_grad = _value_and_grad(lambda *a, name=name: _variant(name, *a), args, shown)
                if _close(value, v_value) and _close(grad[masked], v_grad[masked]):
                    hint = _HINTS[name]
                    break
        assert_close(value, ref_value, "GMPO loss", atol=1e-6, rtol=1e-4, hint=hint, inputs=shown)
        assert_close(grad[masked], ref_grad[masked], "gradient of the GMPO loss in logp (completion tokens)",
                     atol=1e-6, rtol=1e-4,
                     hint=hint or " (the value agrees: check what the gradient flows through)", inputs=shown)
        if not bool((grad[~masked] == 0).all()):
            raise AssertionError(f"your loss has a gradient on padding positions; mask them out\n{shown}")
    print("ok")
