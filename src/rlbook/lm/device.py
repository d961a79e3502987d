"""Where tensors live, and in which precision the forward passes run.

Everything in :mod:`rlbook.lm` and :mod:`rlbook.rollout` takes a ``device`` argument; ``None`` means "where the
model already is" (the CPU for a function given no model, :func:`rlbook.rollout.encode_completions`; loading,
:func:`rlbook.lm.load_policy`, takes :func:`default_device`). The book runs on a CPU; the same code runs on a CUDA
GPU under bf16 autocast, which should save memory and time there (not measured: no GPU has run this code), and
:func:`low_precision` says when a forward rounds below float32.
"""

from __future__ import annotations

import contextlib
import functools
import time

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


def low_precision(model: torch.nn.Module) -> bool:
    """Do ``model``'s forward passes round below float32 here: autocast on its device (bf16 under :func:`autocast`
    on a GPU, or ``torch.autocast("cpu", dtype=torch.bfloat16)``), or 16-bit weights?

    Then the sampler's log-probs and the learner's can differ for the same tokens: two ways of computing the same
    function (a cached decode step, a full forward) round differently, and bf16 keeps 8 bits of mantissa. The
    trainer recomputes the old log-probs with the learner's forward whenever this is True
    (``old_logprobs="learner"``). In float32 the two agree to about 1e-6, and the sampler's numbers are used."""
    device = resolve_device(None, model)
    return torch.is_autocast_enabled(device.type) or any(p.dtype in (torch.float16, torch.bfloat16)
                                                         for p in model.parameters())


def synchronized_clock(device: torch.device) -> float:
    """Seconds, for timing phases; on a GPU after waiting for the work queued so far (CUDA runs asynchronously,
    so an unsynchronised clock charges one phase's kernels to the next)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


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
