"""Where tensors live, and in which precision the forward passes run.

Everything in :mod:`rlbook.lm` and :mod:`rlbook.rollout` takes a ``device`` argument; ``None`` means "where the
model already is". The book runs on a CPU; the same code runs on a CUDA GPU, where bf16 autocast roughly halves
memory and time.
"""

from __future__ import annotations

import contextlib
import functools

import torch


def default_device() -> torch.device:
    """``cuda`` if a CUDA GPU is visible, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None, model: torch.nn.Module | None = None) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` means where ``model``'s parameters are (else ``default_device()``)."""
    if device is not None:
        return torch.device(device)
    if model is not None:
        return next(model.parameters()).device
    return default_device()


def autocast(device: str | torch.device | None = None):
    """A context manager for the forward passes: bf16 autocast on a CUDA GPU with native bf16, a no-op elsewhere.

    On CPU we stay in float32 on purpose: bf16 matmuls are slow on most CPUs, and the tests compare log-probs
    to 1e-5, which bf16 (8 bits of mantissa) cannot meet. Log-softmax is always taken in float32 anyway
    (see :func:`rlbook.rollout.sequence_logprobs`). GPUs older than compute capability 8.0 (T4, V100, P100) have
    no bf16 arithmetic: torch emulates it slowly, or refuses bf16 autocast with an error, so they stay in
    float32 too.

        with autocast(device):
            batch = generate_rollouts(model, tokenizer, prompts, device=device)
    """
    device = resolve_device(device)
    if device.type == "cuda" and _native_bf16(device.index):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@functools.cache
def _native_bf16(index: int | None) -> bool:
    """Does CUDA GPU ``index`` (None: the current one) compute in bf16 natively (compute capability >= 8.0)?"""
    return torch.cuda.get_device_capability(index)[0] >= 8


def adamw(params, **kwargs) -> torch.optim.AdamW:
    """``torch.optim.AdamW(params, **kwargs)``, fused where torch has a fused kernel for the parameters' device.

    The fused kernel updates every parameter in one call instead of a dozen tensor operations per parameter: on
    one CPU thread, a step of the ``small`` model takes 1.0 ms instead of 3.6, of ``base`` 14 ms instead of 54.
    The same update up to rounding. It is also the default of ``transformers.Trainer`` (``adamw_torch_fused``),
    hence of TRL's trainers. Pass ``fused=False`` (or ``foreach=...``) to choose otherwise.
    """
    params = list(params)
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    if "fused" not in kwargs and "foreach" not in kwargs:
        kwargs["fused"] = bool(tensors) and all(
            p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in tensors)
    return torch.optim.AdamW(params, **kwargs)
