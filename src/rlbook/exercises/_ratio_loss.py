"""The shared trial loop of the checkers for sequence-ratio losses (GMPO, GSPO): the reader's loss and its
gradient in ``logp`` against the package's, with a hint when the answer matches a known mistake."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from rlbook.exercises._compare import as_tensor, assert_close, call_reader


def loss_value_and_grad(fn, args: tuple, shown: str) -> tuple[torch.Tensor, torch.Tensor]:
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


def check_ratio_loss(fn: Callable, reference: Callable, variant: Callable, hints: dict[str, str], what: str,
                     spreads: tuple[float, float, float], clip_ranges: tuple[tuple[float, float], ...],
                     num_trials: int, seed: int) -> None:
    """Compare ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high)`` and its gradient in ``logp`` with
    ``reference`` on random right-padded batches (one-token and long completions, garbage on the padding), the
    log-ratios drawn with the standard deviations ``spreads`` (inside, around and far outside the clip range) and
    the clip ranges cycling through ``clip_ranges``. A wrong answer that equals ``variant(name, *args)`` gets
    ``hints[name]``."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        lengths = rng.integers(1, T + 1, size=B)
        mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float32)
        old_logp = torch.as_tensor(-rng.exponential(1.0, size=(B, T)), dtype=torch.float32)
        spread = spreads[trial % len(spreads)]
        logp = old_logp + torch.as_tensor(rng.normal(0.0, spread, size=(B, T)), dtype=torch.float32)
        padding = torch.as_tensor(rng.normal(0.0, 50.0, size=(B, T)), dtype=torch.float32)
        logp, old_logp = torch.where(mask.bool(), logp, padding), torch.where(mask.bool(), old_logp, -padding)
        advantages = torch.as_tensor(rng.normal(size=B), dtype=torch.float32)
        epsilon, epsilon_high = clip_ranges[trial % len(clip_ranges)]
        args = (logp, old_logp, advantages, mask, epsilon, epsilon_high)
        shown = (f"  inputs of trial {trial} (seed {seed}): epsilon={epsilon}, epsilon_high={epsilon_high},\n"
                 f"  lengths |o_i| = {lengths.tolist()}, advantages = {np.round(advantages.numpy(), 4).tolist()},\n"
                 f"  logp - old_logp on the completion tokens = "
                 f"{[np.round((logp - old_logp)[i, :n].numpy(), 5).tolist() for i, n in enumerate(lengths)]}")
        value, grad = loss_value_and_grad(fn, args, shown)
        ref_value, ref_grad = loss_value_and_grad(reference, args, shown)
        masked = mask.bool()
        hint = ""
        if not (_close(value, ref_value) and _close(grad[masked], ref_grad[masked])):
            for name in hints:
                v_value, v_grad = loss_value_and_grad(lambda *a, name=name: variant(name, *a), args, shown)
                if _close(value, v_value) and _close(grad[masked], v_grad[masked]):
                    hint = hints[name]
                    break
        assert_close(value, ref_value, f"{what} loss", atol=1e-6, rtol=1e-4, hint=hint, inputs=shown)
        assert_close(grad[masked], ref_grad[masked], f"gradient of the {what} loss in logp (completion tokens)",
                     atol=1e-6, rtol=1e-4,
                     hint=hint or " (the value agrees: check what the gradient flows through)", inputs=shown)
        if not bool((grad[~masked] == 0).all()):
            raise AssertionError(f"your loss has a gradient on padding positions; mask them out\n{shown}")
    print("ok")
