"""Exercises of the chapter "Bradley–Terry and DPO": the per-pair DPO loss and the whole DPO step.

- :func:`check_dpo_loss`: ``fn(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta) -> (N,)``,
  the per-pair loss ``-log sigmoid(beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps -
  ref_rejected_logps)))`` (the DPO loss equation of the chapter, β once), and its gradient in the policy's
  log-probs, checked with autograd (the reference log-probs may be detached, as TRL does);
  large margins (±800) catch ``log(sigmoid(.))`` written naively. The reference is
  :func:`rlbook.objectives.dpo_loss` with ``loss_type="sigmoid"``.
- :func:`check_dpo_step`: ``fn(policy, reference, tokenizer, pairs, optimizer, beta) -> loss``, one whole DPO
  step on a batch of preference pairs (sequence log-probs of both answers under the policy and the frozen
  reference, the mean sigmoid DPO loss, one optimizer step), compared over two steps with the package's step
  (:func:`rlbook.dpo.dpo_batch` and the same optimizer): the returned loss, the policy's weights after each step,
  and a reference left untouched. Batches mix answers of different lengths, so padding counted in a sequence
  log-prob is caught; the policy starts away from the reference, so β applied twice is caught. Used by the
  chapter's "write the whole step" and find-the-bug exercises.

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


def reference_dpo_step(policy, reference, tokenizer, pairs, optimizer, beta: float) -> float:
    """One DPO step with the package's pieces (the checker's reference): :func:`rlbook.dpo.dpo_batch` with the
    sigmoid loss, the reference's log-probs under ``no_grad``, then ``optimizer``'s step. Returns the loss."""
    import torch

    from rlbook.dpo import DPOConfig, dpo_batch, pair_logps

    with torch.no_grad():
        ref = pair_logps(reference, tokenizer, pairs)
    loss, _ = dpo_batch(policy, tokenizer, pairs, ref, DPOConfig(beta=beta))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _step_batches():
    """Two batches of (prompt, chosen, rejected) pairs whose answers have different lengths (1 to 4 characters)."""
    from rlbook.tasks.preferences import PreferencePair

    rows = [[("12+5=", "17", "170"), ("3+4=", "7", "17"), ("40+2=", "42", "4"), ("9+9=", "18", "1800")],
            [("61+7=", "68", "6"), ("5+5=", "10", "100"), ("77+1=", "78", "87"), ("2+3=", "5", "55")]]
    return [[PreferencePair(prompt=q, chosen=w, rejected=l) for q, w, l in batch] for batch in rows]


@checker
def check_dpo_step(fn: Callable) -> None:
    """Run ``fn(policy, reference, tokenizer, pairs, optimizer, beta)`` for two steps on a copy of the arithmetic
    policy (moved a little away from its reference) and compare the returned losses and the weights after each
    step with :func:`reference_dpo_step` on another copy, for β = 0.1 and 0.5; SGD, so that every weight moves by
    exactly its gradient times the learning rate."""
    import copy

    import torch

    from rlbook.checkpoints import load_base_policy

    base, tokenizer = load_base_policy("arithmetic")
    reference = copy.deepcopy(base).eval()
    start = copy.deepcopy(base)
    generator = torch.Generator().manual_seed(_SEED)
    with torch.no_grad():  # a policy that has already moved: Delta differs from pair to pair
        for p in start.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    frozen = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    for beta in (0.1, 0.5):
        mine, theirs = copy.deepcopy(start), copy.deepcopy(start)
        mine_opt = torch.optim.SGD(mine.parameters(), lr=0.02)
        theirs_opt = torch.optim.SGD(theirs.parameters(), lr=0.02)
        for step, pairs in enumerate(_step_batches()):
            def shown():
                return (f"beta={beta}, step {step + 1} of 2, pairs (prompt, chosen, rejected): "
                        f"{[(p.prompt, p.chosen, p.rejected) for p in pairs]}")

            got = call_reader(fn, (mine, reference, tokenizer, pairs, mine_opt, beta), shown)
            expected = reference_dpo_step(theirs, reference, tokenizer, pairs, theirs_opt, beta)
            try:
                got = float(got)
            except (TypeError, ValueError):
                raise AssertionError(f"return the batch's loss (a float or a 0-dim tensor); got {got!r} "
                                     f"({shown()})") from None
            assert_close(got, expected, f"the loss of the batch, the mean over its pairs ({shown()})",
                         atol=1e-5, rtol=1e-5)
            for (name, p), q in zip(mine.named_parameters(), theirs.parameters()):
                assert_close(p.detach(), q.detach(), f"the policy's weight {name} after the optimizer step; "
                             f"the loss matched, so look at the gradient: zero it before backward, and step "
                             f"once ({shown()})", atol=1e-5, rtol=1e-4)
            for name, value in reference.state_dict().items():
                if not torch.equal(value, frozen[name]):
                    raise AssertionError(f"the reference changed ({name}): it is frozen, only the policy "
                                         f"is trained ({shown()})")
            if any(p.grad is not None for p in reference.parameters()):
                raise AssertionError("the reference's weights received gradients: compute its log-probs "
                                     f"under torch.no_grad() (it is frozen) ({shown()})")
    print("ok")
