"""Exercises of the chapter "PPO for RLHF": the per-token RLHF reward, and the Bradley–Terry loss.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random torch tensors (seeded, so
a failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it,
and prints ``ok`` when everything agrees.

- :func:`check_rlhf_token_rewards`: ``fn(scores, logp, ref_logp, mask, beta) -> (B, T)``, the per-token reward
  ``-beta * (logp - ref_logp)`` on every completion token (the k1 estimate of the KL to the reference) plus the
  sequence's score at its last real token, 0 on padding (equation ``eq-rlhf-token-reward``). The reference is
  :func:`rlbook.objectives.rlhf_token_rewards` with ``kl_kind="k1"``.
- :func:`check_bradley_terry_loss`: ``fn(chosen_rewards, rejected_rewards) -> scalar``, the mean over pairs of
  ``-log sigmoid(r_w - r_l)`` (equation ``eq-rlhf-bt-loss``), and its gradient, checked with autograd; large
  reward gaps (±800) catch the overflow of ``log(sigmoid(.))`` written naively. The reference is
  :func:`rlbook.reward_model.bradley_terry_loss`.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, check_against_reference, checker

_SEED = 20250909
NUM_TRIALS = 200


# ---------------------------------------------------------------------------------------------- references
def reference_rlhf_token_rewards(scores, logp, ref_logp, mask, beta: float):
    """(B, T) ``-beta * k1`` at each completion token plus ``scores`` at the last one; 0 on padding."""
    from rlbook.objectives import rlhf_token_rewards

    return rlhf_token_rewards(scores, logp, ref_logp, mask, beta, kl_kind="k1")


def reference_bradley_terry_loss(chosen_rewards, rejected_rewards):
    """Mean over pairs of ``-log sigmoid(r_w - r_l)``."""
    from rlbook.reward_model import bradley_terry_loss

    return bradley_terry_loss(chosen_rewards, rejected_rewards)


# ---------------------------------------------------------------------------------------------- random inputs
def _random_token_reward_inputs(rng: np.random.Generator):
    """Right-padded rows (lengths 1..T, a row may fill all columns), log-probs with NaN or garbage on padding,
    scores of both signs, beta including 0."""
    import torch

    B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    lengths = rng.integers(1, T + 1, size=B)
    mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float64)
    logp = torch.as_tensor(-rng.exponential(1.0, size=(B, T)))
    ref_logp = torch.as_tensor(-rng.exponential(1.0, size=(B, T)))
    if rng.uniform() < 0.5:  # padding holds NaN, or finite garbage that a correct solution never reads
        logp[mask == 0], ref_logp[mask == 0] = float("nan"), float("nan")
    else:
        logp[mask == 0] = -50.0
    scores = torch.as_tensor(rng.normal(scale=2.0, size=B))
    beta = float(rng.choice([0.0, 0.05, rng.uniform(0.0, 1.0)]))
    return scores, logp, ref_logp, mask, beta


def _random_pairs(rng: np.random.Generator):
    """Reward pairs (N,), some with gaps of ±800, where log(sigmoid(.)) underflows to -inf even in float64."""
    import torch

    n = int(rng.integers(1, 9))
    chosen = rng.normal(scale=2.0, size=n)
    rejected = rng.normal(scale=2.0, size=n)
    if rng.uniform() < 0.3:
        chosen[rng.integers(n)] = -800.0 if rng.uniform() < 0.5 else 800.0
    return torch.as_tensor(chosen), torch.as_tensor(rejected)


# ---------------------------------------------------------------------------------------------- checkers
@checker
def check_rlhf_token_rewards(fn: Callable) -> None:
    """Compare ``fn(scores, logp, ref_logp, mask, beta)`` with :func:`rlbook.objectives.rlhf_token_rewards`."""
    rng = np.random.default_rng(_SEED)

    def trials():
        for trial in range(NUM_TRIALS):
            scores, logp, ref_logp, mask, beta = _random_token_reward_inputs(rng)
            yield (dict(scores=scores, logp=logp, ref_logp=ref_logp, mask=mask, beta=beta),
                   lambda: (f"trial {trial}: beta={beta}\nscores={scores}\nmask=\n{mask}\nlogp=\n{logp}\n"
                            f"ref_logp=\n{ref_logp}"))

    check_against_reference(fn, trials(), reference_rlhf_token_rewards, "the per-token rewards", atol=1e-9,
                            rtol=1e-7)


@checker
def check_bradley_terry_loss(fn: Callable) -> None:
    """Compare ``fn(chosen_rewards, rejected_rewards)`` and its gradients with the reference."""
    import torch

    rng = np.random.default_rng(_SEED + 1)
    for trial in range(NUM_TRIALS):
        chosen, rejected = _random_pairs(rng)

        def shown():
            return f"trial {trial}:\nchosen_rewards={chosen}\nrejected_rewards={rejected}"

        mine = (chosen.clone().requires_grad_(True), rejected.clone().requires_grad_(True))
        got = call_reader(fn, mine, shown)
        if not isinstance(got, torch.Tensor) or got.dim() != 0 or not got.requires_grad:
            raise AssertionError("return a scalar torch tensor computed with torch operations from the rewards, so "
                                 f"that autograd can check its gradient ({shown()})")
        if not bool(torch.isfinite(got)):
            raise AssertionError(f"the loss must be finite; got {got.item()} (hint: log(sigmoid(x)) underflows for "
                                 f"very negative x: torch.nn.functional.logsigmoid does not) ({shown()})")
        grads = torch.autograd.grad(got, mine, allow_unused=True)
        theirs = (chosen.clone().requires_grad_(True), rejected.clone().requires_grad_(True))
        expected = reference_bradley_terry_loss(*theirs)
        expected_grads = torch.autograd.grad(expected, theirs)
        assert_close(got.detach(), expected.detach(), f"Bradley-Terry loss ({shown()})", atol=1e-10, rtol=1e-8)
        for name, g, e in zip(("chosen", "rejected"), grads, expected_grads):
            g = torch.zeros_like(e) if g is None else g
            assert_close(g, e, f"gradient in the {name} rewards ({shown()})", atol=1e-10, rtol=1e-8)
    print("ok")
