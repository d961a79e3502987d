"""Exercises of the chapter "After the note": CISPO's loss and the sampler-mismatch weights.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random inputs (seeded, so a
failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it, and
prints ``ok`` when everything agrees. Shapes: ``logp``, ``old_logp``, ``sampler_logp``, ``mask`` (B, T)
(right-padded completions, every row at least one token; padding may hold any number), ``advantages`` (B,).

- :func:`check_cispo_loss`: ``fn(logp, old_logp, advantages, mask, max_weight) -> scalar tensor``, CISPO's loss
  (eq-after-cispo) with DAPO's token-level aggregation, compared in value **and** in its gradient in ``logp``.
  With rho = exp(logp - old_logp) and N = sum m the batch's completion tokens,

      w_{i,t} = sg(min(rho_{i,t}, max_weight)),
      loss = -(1/N) sum_{i,t} m_{i,t} w_{i,t} A_i logp_{i,t},

  so that the gradient is -(1/N) w A grad logp at every completion token, none removed. The reference is the
  package's ``policy_loss(..., loss_type="cispo", epsilon_high=max_weight)``, which caps the weight at
  ``epsilon_high`` itself (ScaleRL's epsilon_max, above 1) and ignores ``epsilon`` (CISPO has no lower bound).
  The usual mistakes it names: the weight's gradient not stopped, PPO's clip (the clipped ratio times the
  advantage, whose gradient vanishes above the cap) in place of a clipped weight, GRPO's per-completion mean in
  place of the token-level one, and padding counted in the number of tokens.
- :func:`check_sampler_weights`: ``fn(old_logp, sampler_logp, mask, mode, clip_min, clip_max) -> (B, T)``, the
  importance weight that corrects for the sampler (eq-after-sampler-is), 0 on padding:

      r_{i,t} = exp(old_logp - sampler_logp)_{i,t}               ("token_*" modes)
      r_i     = exp(sum_t m_{i,t} (old_logp - sampler_logp)_{i,t})   ("sequence_*" modes, at every token of i)
      w = clip(r, clip_min, clip_max)                            ("*_truncate", TIS)
      w = r * 1[clip_min <= r <= clip_max]                       ("*_mask", MIS; clip_min None: no lower bound)

  The reference is the package's ``sampler_importance_weights``. The usual mistakes it names: the sequence ratio
  from the mean log-difference (a geometric mean) instead of the sum, padding included in the sum, truncating
  where the mode masks (or the reverse), a mask that keeps 1 instead of r, and the weight the wrong way up
  (sampler / old).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from rlbook.exercises._compare import as_tensor, assert_close, call_reader, checker
from rlbook.exercises._ratio_loss import loss_value_and_grad
from rlbook.objectives import policy_loss, sampler_importance_weights

_SEED = 20251204
NUM_TRIALS = 160
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


# ---------------------------------------------------------------------------------------------- references
def reference_cispo_loss(logp, old_logp, advantages, mask, max_weight: float = 5.0) -> torch.Tensor:
    """CISPO's token-level loss (a scalar tensor, differentiable in ``logp``): the package's
    ``policy_loss(loss_type="cispo")``, whose ``epsilon_high`` is the cap on the weight."""
    return policy_loss(logp, old_logp, advantages, mask, epsilon_high=max_weight, loss_type="cispo")[0]


def reference_sampler_weights(old_logp, sampler_logp, mask, mode: str = "sequence_mask",
                              clip_min: float | None = None, clip_max: float = 3.0) -> torch.Tensor:
    """(B, T) weights, 0 on padding: the package's :func:`~rlbook.objectives.sampler_importance_weights`."""
    return sampler_importance_weights(old_logp, sampler_logp, mask, mode, clip_min=clip_min, clip_max=clip_max)


# ---------------------------------------------------------------------------------------------- CISPO
def _cispo_variant(name: str, logp, old_logp, advantages, mask, max_weight) -> torch.Tensor:
    """One of the usual mistakes, as a loss (for the hints)."""
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    ratio = torch.exp(torch.where(m, logp - old_logp, zero))
    log_pi = torch.where(m, logp, zero)
    a = advantages[:, None]
    capped = torch.clamp(ratio, max=max_weight)
    if name == "not_detached":
        per_token = -capped * a * log_pi
    elif name == "clipped_ratio":
        per_token = -capped * a
    elif name == "ppo_min":
        per_token = -torch.minimum(ratio * a, capped * a)
    else:
        per_token = -capped.detach() * a * log_pi
    per_token = torch.where(m, per_token, zero)
    if name == "per_completion":
        return (per_token.sum(-1) / m.sum(-1)).mean()
    count = m.numel() if name == "padded" else m.sum()
    return per_token.sum() / count


_PPO_HINT = (" (you put the clipped ratio itself in the loss, as PPO's clipped surrogate does (min(rho, max_weight) "
             "* A, alone or in PPO's min): a token above the cap then loses its gradient; CISPO multiplies log pi "
             "by the detached, clipped weight and keeps every token's gradient)")
_CISPO_HINTS = {
    "not_detached": " (the value is right but the gradient also flows through the weight min(rho, max_weight); "
                    "CISPO stops it: detach the clipped weight, so that only log pi carries the gradient)",
    "clipped_ratio": _PPO_HINT,
    "ppo_min": _PPO_HINT,
    "per_completion": " (you averaged each completion's tokens, then the completions, as GRPO does; CISPO's loss "
                      "sums over every completion token of the batch and divides once by their number, DAPO's "
                      "token-level loss)",
    "padded": " (you divided by B * T; only the completion tokens count, sum m)",
}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-6))


@checker
def check_cispo_loss(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(logp, old_logp, advantages, mask, max_weight)`` with CISPO's token-level loss and its gradient
    in ``logp``, on random batches: one-token and long completions, ratios near 1 and far above the cap, ScaleRL's
    cap of 5 and smaller ones, positive and negative advantages, garbage on the padding."""
    rng = np.random.default_rng(seed)
    settings = ((1.0, 2.0), (0.05, 5.0), (0.5, 1.5), (1.5, 5.0))  # (spread of the log-ratio, cap)
    for trial in range(num_trials):
        B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        lengths = rng.integers(1, T + 1, size=B)
        mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float32)
        spread, max_weight = settings[trial % len(settings)]
        log_ratio = rng.normal(0.0, spread, size=(B, T))
        if spread > 0.1:  # one completion token above the cap, so that a clip that removes gradients shows
            i = int(rng.integers(B))
            log_ratio[i, int(rng.integers(lengths[i]))] = math.log(max_weight) + 0.1 + abs(rng.normal(0.0, 0.5))
        # log-probabilities below 0 at both ends: pi_old low enough for the ratio drawn
        old_logp = torch.as_tensor(-rng.exponential(1.0, size=(B, T)) - np.maximum(log_ratio, 0.0) - 0.01,
                                   dtype=torch.float32)
        logp = old_logp + torch.as_tensor(log_ratio, dtype=torch.float32)
        padding = torch.as_tensor(rng.normal(0.0, 50.0, size=(B, T)), dtype=torch.float32)
        logp, old_logp = torch.where(mask.bool(), logp, padding), torch.where(mask.bool(), old_logp, -padding)
        advantages = torch.as_tensor(rng.normal(size=B), dtype=torch.float32)
        args = (logp, old_logp, advantages, mask, max_weight)
        ratios = [np.round(torch.exp(logp - old_logp)[i, :n].numpy(), 4).tolist() for i, n in enumerate(lengths)]
        shown = (f"  inputs of trial {trial} (seed {seed}): max_weight={max_weight},\n"
                 f"  lengths |o_i| = {lengths.tolist()}, advantages = {np.round(advantages.numpy(), 4).tolist()},\n"
                 f"  ratios rho on the completion tokens = {ratios}")
        value, grad = loss_value_and_grad(fn, args, shown)
        ref_value, ref_grad = loss_value_and_grad(reference_cispo_loss, args, shown)
        masked = mask.bool()
        value_ok, grad_ok = _close(value, ref_value), _close(grad[masked], ref_grad[masked])
        hint = ""
        if not (value_ok and grad_ok):
            for name in _CISPO_HINTS:  # a variant's hint when the answer equals it in value and gradient
                v_value, v_grad = loss_value_and_grad(
                    lambda *a, name=name: _cispo_variant(name, *a), args, shown)
                if _close(value, v_value) and _close(grad[masked], v_grad[masked]):
                    hint = _CISPO_HINTS[name]
                    break
            if not hint and grad_ok:
                hint = (" (your gradient is CISPO's but the value is not: write the loss as eq-after-cispo does, "
                        "-sg(min(rho, max_weight)) * A * log pi, averaged over the batch's completion tokens)")
        assert_close(value, ref_value, "CISPO loss", atol=1e-6, rtol=1e-4, hint=hint, inputs=shown)
        assert_close(grad[masked], ref_grad[masked], "gradient of the CISPO loss in logp (completion tokens)",
                     atol=1e-6, rtol=1e-4,
                     hint=hint or " (the value agrees: check what the gradient flows through)", inputs=shown)
        if not bool((grad[~masked] == 0).all()):
            raise AssertionError(f"your loss has a gradient on padding positions; mask them out\n{shown}")
    print("ok")


# ---------------------------------------------------------------------------------------------- sampler weights
def _weights_variant(name: str, old_logp, sampler_logp, mask, mode, clip_min, clip_max) -> torch.Tensor:
    """One of the usual mistakes, as (B, T) weights (for the hints)."""
    m = mask.bool()
    zero = torch.zeros((), dtype=old_logp.dtype)
    difference = old_logp - sampler_logp
    if name == "upside_down":
        difference = -difference
    log_r = difference if name == "padding" else torch.where(m, difference, zero)
    if mode.startswith("sequence"):
        if name == "sequence_mean":  # the mean over the completion's own tokens
            log_r = log_r.sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
        else:
            log_r = log_r.sum(-1, keepdim=True)
        log_r = log_r.expand_as(old_logp)
    r = torch.exp(log_r)
    truncate = {"truncated_mask": True, "masked_truncate": False}.get(name, mode.endswith("truncate"))
    if truncate:
        weight = torch.clamp(r, min=clip_min, max=clip_max)
    else:
        inside = (r <= clip_max) & (r >= (0.0 if clip_min is None else clip_min))
        weight = torch.where(inside, torch.ones_like(r) if name == "indicator" else r, zero)
    return torch.where(m, weight, zero)


_WEIGHT_HINTS = {
    "sequence_mean": " (you took the mean log-difference over the completion, a geometric mean as in GSPO's ratio; "
                     "the sequence weight is the completion's likelihood ratio, the product of its token ratios: "
                     "exp of the sum)",
    "padding": " (your log-ratio includes the padding positions; sum only over the completion's tokens, m = 1)",
    "truncated_mask": " (you truncated the weight in a '_mask' mode; masking keeps r inside [clip_min, clip_max] "
                      "and sets it to 0 outside)",
    "masked_truncate": " (you masked the weight in a '_truncate' mode; truncation clips r into "
                       "[clip_min, clip_max] and drops nothing)",
    "indicator": " (inside [clip_min, clip_max] the masked weight is r itself, not 1)",
    "upside_down": " (your weight is the wrong way up, pi_sampler / pi_old; the samples are reweighed towards the "
                   "learner's pi_old: r = exp(old_logp - sampler_logp))",
}


def _draw_weights_trial(rng: np.random.Generator, trial: int):
    """One trial's inputs: (old_logp, sampler_logp, mask, mode, clip_min, clip_max, lengths), with no ratio within
    a relative 1e-3 of a bound (where float rounding could put a correct answer on the other side)."""
    mode = MODES[trial % len(MODES)]
    bounds = ((None, 3.0), (0.5, 2.0), (0.8, 1.5), (0.5, 5.0), (None, 1.2))
    clip_min, clip_max = bounds[(trial // len(MODES)) % len(bounds)]
    spread = (0.1, 0.4, 1.0)[trial % 3]
    while True:
        B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        lengths = rng.integers(1, T + 1, size=B)
        mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float32)
        old_logp = -rng.exponential(1.0, size=(B, T))
        sampler_logp = old_logp - rng.normal(0.0, spread, size=(B, T))
        padded = ~mask.bool().numpy()
        old_logp[padded] = rng.normal(0.0, 3.0, size=int(padded.sum()))
        sampler_logp[padded] = rng.normal(0.0, 3.0, size=int(padded.sum()))
        log_r = np.where(padded, 0.0, old_logp - sampler_logp)
        if mode.startswith("sequence"):
            log_r = np.broadcast_to(log_r.sum(-1, keepdims=True), log_r.shape)
        edges = [math.log(b) for b in (clip_min, clip_max) if b]
        if all(np.abs(log_r[~padded] - edge).min(initial=1.0) > 1e-3 for edge in edges):
            break
    return (torch.as_tensor(old_logp, dtype=torch.float32), torch.as_tensor(sampler_logp, dtype=torch.float32),
            mask, mode, clip_min, clip_max, lengths)


@checker
def check_sampler_weights(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(old_logp, sampler_logp, mask, mode, clip_min, clip_max) -> (B, T)`` with the sampler-mismatch
    weights of eq-after-sampler-is, on random batches in the four modes: token ratios near 1 and far from it,
    bands with and without a lower bound, one-token and long completions, garbage on the padding."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        old_logp, sampler_logp, mask, mode, clip_min, clip_max, lengths = _draw_weights_trial(rng, trial)
        log_r = [np.round((old_logp - sampler_logp)[i, :n].numpy(), 4).tolist() for i, n in enumerate(lengths)]
        shown = (f"  inputs of trial {trial} (seed {seed}): mode={mode!r}, clip_min={clip_min}, "
                 f"clip_max={clip_max},\n  lengths |o_i| = {lengths.tolist()},\n"
                 f"  old_logp - sampler_logp on the completion tokens = {log_r}")
        args = (old_logp, sampler_logp, mask, mode, clip_min, clip_max)
        before = [t.clone() for t in args[:3]]
        copies = tuple(t.clone() for t in args[:3])
        got = call_reader(fn, copies + args[3:], shown)
        for name, original, now in zip(("old_logp", "sampler_logp", "mask"), before, copies):
            if not torch.equal(original, now):
                raise AssertionError(f"your function changed {name} in place; work on a copy\n{shown}")
        got = as_tensor(got, "a (B, T) tensor of weights", shown).to(torch.float32)
        expected = reference_sampler_weights(*args)
        if got.shape != expected.shape:
            raise AssertionError(f"sampler weights: expected shape {tuple(expected.shape)} (one weight per token, "
                                 f"B x T), got {tuple(got.shape)}\n{shown}")
        if not bool(torch.isfinite(got).all()):
            raise AssertionError(f"sampler weights must be finite everywhere (0 on padding); got NaN or inf at "
                                 f"{int((~torch.isfinite(got)).sum())} places\n{shown}")
        if bool((got[~mask.bool()] != 0).any()):
            raise AssertionError(f"sampler weights must be 0 on padding positions (mask 0); yours are not\n{shown}")
        hint = ""
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
            for name in _WEIGHT_HINTS:
                if torch.allclose(got, _weights_variant(name, *args), rtol=1e-5, atol=1e-6):
                    hint = _WEIGHT_HINTS[name]
                    break
        assert_close(got, expected, f"sampler weights ({mode})", atol=1e-6, rtol=1e-5, hint=hint, inputs=shown)
    print("ok")
