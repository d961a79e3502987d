"""Exercises of the chapter "Bradley–Terry and DPO": the per-pair DPO loss.

- :func:`check_dpo_loss`: ``fn(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta) -> (N,)``,
  the per-pair loss ``-log sigmoid(beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps -
  ref_rejected_logps)))`` (the DPO loss equation of the chapter, β once), and its gradient in the policy's
  log-probs, checked with autograd (the reference log-probs may be detached, as TRL does);
  large margins (±800) catch ``log(sigmoid(.))`` written naively. The reference is
  :func:`rlbook.objectives.dpo_loss` with ``loss_type="sigmoid"``.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, checker

_SEED = 20251010
NUM_TRIALS = 200


def reference_dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float):
    """(N,) per-pair sigmoid DPO losses."""
    from rlbook.objectives import dpo_loss

    return dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=beta)[0]


def _random_logps(rng: np.random.Generator):
    """Four (N,) float64 tensors of sequence log-probs (negative), sometimes with a huge log-ratio, and a beta."""
    import torch

    n = int(rng.integers(1, 9))
    logps = [-rng.exponential(5.0, size=n) for _ in range(4)]
    if rng.uniform() < 0.3:  # a log-ratio margin of about ±800 / beta: log(sigmoid(.)) underflows
        logps[0][rng.integers(n)] = -4000.0 if rng.uniform() < 0.5 else 0.0
        logps[2][:] = -rng.exponential(5.0, size=n) if rng.uniform() < 0.5 else logps[2] - 2000.0
    beta = float(rng.choice([0.1, 0.5, rng.uniform(0.01, 2.0)]))
    return [torch.as_tensor(x) for x in logps], beta


@checker
def check_dpo_loss(fn: Callable) -> None:
    """Compare ``fn(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)`` and its gradients
    with :func:`rlbook.objectives.dpo_loss` (``loss_type="sigmoid"``)."""
    import torch

    rng = np.random.default_rng(_SEED)
    names = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps")
    for trial in range(NUM_TRIALS):
        logps, beta = _random_logps(rng)

        def shown():
            return f"trial {trial}: beta={beta}\n" + "\n".join(f"{n}={x}" for n, x in zip(names, logps))

        mine = [x.clone().requires_grad_(True) for x in logps]
        got = call_reader(fn, (*mine, beta), shown)
        if not isinstance(got, torch.Tensor) or got.shape != logps[0].shape or not got.requires_grad:
            raise AssertionError(f"return one loss per pair, a torch tensor of shape {tuple(logps[0].shape)} computed "
                                 f"with torch operations from the log-probs, so that autograd can check its gradient "
                                 f"({shown()})")
        if not bool(torch.isfinite(got).all()):
            raise AssertionError(f"the losses must be finite; got {got.detach()} (hint: log(sigmoid(x)) underflows "
                                 f"for very negative x: torch.nn.functional.logsigmoid does not) ({shown()})")
        theirs = [x.clone().requires_grad_(True) for x in logps]
        expected = reference_dpo_loss(*theirs, beta)
        assert_close(got.detach(), expected.detach(), f"per-pair DPO losses ({shown()})", atol=1e-9, rtol=1e-7)
        # Gradients in the policy's log-probs only: the reference log-probs come from the frozen reference model,
        # so a solution may detach them (as TRL does) or not.
        grads = torch.autograd.grad(got.sum(), mine[:2], allow_unused=True)
        expected_grads = torch.autograd.grad(expected.sum(), theirs[:2])
        for name, g, e in zip(names[:2], grads, expected_grads):
            g = torch.zeros_like(e) if g is None else g
            assert_close(g, e, f"gradient in {name} ({shown()})", atol=1e-9, rtol=1e-7)
    print("ok")
