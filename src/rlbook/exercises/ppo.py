"""Exercises of the chapter "PPO": GAE as a backward loop, the clipped surrogate per token, and the loss of a whole
PPO update.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random torch tensors (seeded, so
a failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it,
and prints ``ok`` when everything agrees.

- :func:`check_gae_loop`: ``fn(rewards, values, mask, gamma, lam) -> (B, T)`` advantages, computed with the
  backward recursion ``A_t = delta_t + gamma * lam * A_{t+1}`` over right-padded rows (equation ``eq-ppo-gae``);
  ``V`` after a row's last real token is 0 and the outputs are 0 on padding. The reference is the loop-free
  :func:`rlbook.objectives.gae`.
- :func:`check_clipped_objective`: ``fn(ratio, advantages, epsilon) -> (B, T)``, the per-token clipped surrogate
  ``min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` (equation ``eq-ppo-clip``, the quantity PPO *maximises*), and its
  gradient with respect to the ratio, checked with autograd: zero exactly where the clip binds.
- :func:`check_ppo_loss`: ``fn(logp, old_logp, values, old_values, rewards, mask, gamma, lam, epsilon, value_clip,
  vf_coef) -> ()``, the loss of one PPO update on a rollout ("write the whole step"): each completion's reward on
  its last token, GAE over the *old* values (eq-ppo-gae), advantages whitened over the batch's tokens, the clipped
  surrogate's token mean (eq-ppo-clip) plus ``vf_coef`` times the clipped value loss (eq-ppo-value-loss). Its value
  and its gradients in ``logp`` and ``values`` are compared with the package's pieces.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, check_against_reference, checker

if TYPE_CHECKING:
    import torch

_SEED = 20250805
NUM_TRIALS = 200


# ---------------------------------------------------------------------------------------------- references
def reference_gae(rewards, values, mask, gamma: float, lam: float):
    """(B, T) GAE advantages: the first output of :func:`rlbook.objectives.gae`."""
    from rlbook.objectives import gae

    return gae(rewards, values, mask, gamma, lam)[0]


def reference_clipped_objective(ratio, advantages, epsilon: float):
    """(B, T) ``min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` per token (eq-ppo-clip), to be maximised."""
    import torch

    return torch.minimum(ratio * advantages, ratio.clamp(1 - epsilon, 1 + epsilon) * advantages)


def reference_ppo_loss(logp, old_logp, values, old_values, rewards, mask, gamma: float = 1.0, lam: float = 0.95,
                       epsilon: float = 0.2, value_clip: float = 0.2, vf_coef: float = 0.1):
    """() the loss of one PPO update (eq-ppo-total with the clipped value loss), from rlbook's own pieces."""
    import torch

    from rlbook.objectives import clipped_surrogate, gae, masked_whiten, token_mean, value_loss

    rows = torch.arange(mask.shape[0])
    token_rewards = torch.zeros_like(mask)
    token_rewards[rows, mask.sum(-1).long() - 1] = rewards
    with torch.no_grad():  # the advantages and the returns are constants of the update
        advantages, returns = gae(token_rewards, old_values, mask, gamma, lam)
        advantages = masked_whiten(advantages, mask)
    zero = torch.zeros((), dtype=logp.dtype)
    ratio = torch.exp(torch.where(mask.bool(), logp - old_logp, zero))
    per_token, _, _ = clipped_surrogate(ratio, advantages, epsilon, epsilon)
    return token_mean(per_token, mask) + vf_coef * value_loss(values, old_values, returns, mask, value_clip)


# ---------------------------------------------------------------------------------------------- random inputs
def _random_gae_inputs(rng: np.random.Generator):
    """Right-padded rows of random lengths (a row may fill all columns), random rewards and values (NaN or
    finite garbage on padding, which a correct implementation never reads), gamma and lambda including the ends 0 and 1."""
    import torch

    B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    lengths = rng.integers(1, T + 1, size=B)
    mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float64)
    rewards = torch.as_tensor(rng.normal(size=(B, T)))
    values = torch.as_tensor(rng.normal(size=(B, T)))
    if rng.uniform() < 0.5:  # padding holds NaN, or finite garbage that a correct solution never reads
        rewards[mask == 0], values[mask == 0] = float("nan"), float("nan")
    else:
        values[mask == 0] = 10.0 + 5.0 * torch.as_tensor(rng.normal(size=(B, T)))[mask == 0]
    gamma = float(rng.choice([0.0, 1.0, rng.uniform()]))
    lam = float(rng.choice([0.0, 1.0, 0.95, rng.uniform()]))
    return rewards, values, mask, gamma, lam


def _random_ratio_inputs(rng: np.random.Generator):
    """Ratios in (0, 3) with some exactly at 1, advantages of both signs (and some 0), epsilon in (0.05, 0.5)."""
    import torch

    B, T = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    ratio = rng.uniform(0.05, 3.0, size=(B, T))
    ratio[rng.uniform(size=(B, T)) < 0.15] = 1.0
    advantages = rng.normal(size=(B, T))
    advantages[rng.uniform(size=(B, T)) < 0.1] = 0.0
    epsilon = float(rng.uniform(0.05, 0.5))
    # keep ratios away from the clip's kinks 1 ± eps, where the gradient is not defined
    near = np.abs(np.abs(ratio - 1) - epsilon) < 1e-3
    ratio[near] += 5e-3
    return torch.as_tensor(ratio), torch.as_tensor(advantages), epsilon


def _random_rollout(rng: np.random.Generator):
    """A right-padded rollout (at least two tokens in all), its old log-probs and values, the current ones moved
    enough that some ratios and values leave their clip ranges, finite garbage on padding, and the settings."""
    import torch

    B, T = int(rng.integers(2, 6)), int(rng.integers(1, 7))
    lengths = rng.integers(1, T + 1, size=B)
    mask = torch.as_tensor(np.arange(T)[None, :] < lengths[:, None], dtype=torch.float64)
    old_logp = torch.as_tensor(-rng.uniform(0.05, 3.0, size=(B, T)))
    logp = old_logp + torch.as_tensor(rng.normal(scale=0.3, size=(B, T)))
    old_values = torch.as_tensor(rng.uniform(0.0, 1.0, size=(B, T)))
    values = old_values + torch.as_tensor(rng.normal(scale=0.3, size=(B, T)))
    for x in (logp, old_logp, values, old_values):  # what a correct solution never reads
        x[mask == 0] = 5.0 + torch.as_tensor(rng.normal(size=(B, T)))[mask == 0]
    rewards = torch.as_tensor(rng.choice([0.0, 1.0], size=B))
    settings = dict(gamma=float(rng.choice([1.0, 0.9])), lam=float(rng.choice([0.95, 0.5, 1.0, 0.0])),
                    epsilon=0.2, value_clip=0.2, vf_coef=float(rng.choice([0.1, 0.5])))
    return logp, old_logp, values, old_values, rewards, mask, settings


def _ppo_loss_hint(got: float, logp, old_logp, values, old_values, rewards, mask, settings) -> str:
    """The likely mistake when ``got`` matches a known wrong variant of the loss (else "")."""
    import torch

    variants = {"the value loss without its clip (value_clip bounds how far a value may move from old_values, as "
                "epsilon bounds the ratio)": dict(value_clip=1e9),
                "the policy loss without the clip (take the minimum of rho A and clip(rho) A)": dict(epsilon=1e9),
                "no value loss (add vf_coef times the clipped value loss)": dict(vf_coef=0.0)}
    with torch.no_grad():
        for hint, change in variants.items():
            wrong = reference_ppo_loss(logp, old_logp, values, old_values, rewards, mask, **{**settings, **change})
            if np.isclose(got, float(wrong), atol=1e-9, rtol=1e-7):
                return hint
    return ""


# ---------------------------------------------------------------------------------------------- checkers
@checker
def check_gae_loop(fn: Callable) -> None:
    """Compare ``fn(rewards, values, mask, gamma, lam)`` with :func:`rlbook.objectives.gae` on random batches."""
    rng = np.random.default_rng(_SEED)

    def trials():
        for trial in range(NUM_TRIALS):
            rewards, values, mask, gamma, lam = _random_gae_inputs(rng)
            yield (dict(rewards=rewards, values=values, mask=mask, gamma=gamma, lam=lam),
                   lambda: (f"trial {trial}: gamma={gamma}, lam={lam}\nmask=\n{mask}\nrewards=\n{rewards}\n"
                            f"values=\n{values}"))

    check_against_reference(fn, trials(), reference_gae, "the GAE advantages", atol=1e-9, rtol=1e-7)


@checker
def check_clipped_objective(fn: Callable) -> None:
    """Compare ``fn(ratio, advantages, epsilon)`` and its gradient in the ratio with the reference."""
    import torch

    rng = np.random.default_rng(_SEED + 1)
    for trial in range(NUM_TRIALS):
        ratio, advantages, epsilon = _random_ratio_inputs(rng)

        def shown():
            return f"trial {trial}: epsilon={epsilon}\nratio=\n{ratio}\nadvantages=\n{advantages}"

        mine = ratio.clone().requires_grad_(True)
        got = call_reader(fn, (mine, advantages, epsilon), shown)
        if not isinstance(got, torch.Tensor) or not got.requires_grad:
            raise AssertionError("return a torch tensor computed from `ratio` with torch operations, so that "
                                 f"autograd can check its gradient ({shown()})")
        (grad,) = torch.autograd.grad(got.sum(), mine, allow_unused=True)
        grad = torch.zeros_like(ratio) if grad is None else grad
        theirs = ratio.clone().requires_grad_(True)
        expected = reference_clipped_objective(theirs, advantages, epsilon)
        (expected_grad,) = torch.autograd.grad(expected.sum(), theirs)
        assert_close(got.detach(), expected.detach(), f"clipped objective ({shown()})", atol=1e-12, rtol=1e-9)
        assert_close(grad, expected_grad, f"gradient of the clipped objective in the ratio ({shown()})",
                     atol=1e-12, rtol=1e-9)
    print("ok")


@checker
def check_ppo_loss(fn: Callable) -> None:
    """Compare ``fn(logp, old_logp, values, old_values, rewards, mask, gamma, lam, epsilon, value_clip, vf_coef)``
    and its gradients in ``logp`` and ``values`` with :func:`reference_ppo_loss` on random rollouts."""
    import torch

    rng = np.random.default_rng(_SEED + 2)
    for trial in range(NUM_TRIALS // 2):
        logp, old_logp, values, old_values, rewards, mask, settings = _random_rollout(rng)

        def shown():
            return (f"trial {trial}: {settings}\nmask=\n{mask}\nrewards={rewards}\nlogp=\n{logp}\n"
                    f"old_logp=\n{old_logp}\nvalues=\n{values}\nold_values=\n{old_values}")

        mine_logp, mine_values = logp.clone().requires_grad_(True), values.clone().requires_grad_(True)
        got = call_reader(fn, (mine_logp, old_logp.clone(), mine_values, old_values.clone(), rewards.clone(),
                               mask.clone()), shown, settings)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            raise AssertionError("return the loss as a 0-dimensional torch tensor (one number for the whole "
                                 f"batch), computed with torch operations from logp and values ({shown()})")
        if not got.requires_grad:
            raise AssertionError(f"the loss has no gradient: compute it from logp and values with torch "
                                 f"operations ({shown()})")
        grads = torch.autograd.grad(got, (mine_logp, mine_values), allow_unused=True)
        grads = [torch.zeros_like(logp) if g is None else g for g in grads]
        theirs_logp, theirs_values = logp.clone().requires_grad_(True), values.clone().requires_grad_(True)
        expected = reference_ppo_loss(theirs_logp, old_logp, theirs_values, old_values, rewards, mask, **settings)
        expected_grads = torch.autograd.grad(expected, (theirs_logp, theirs_values))
        right = np.isclose(float(got.detach()), float(expected.detach()), atol=1e-9, rtol=1e-7)
        hint = "" if right else _ppo_loss_hint(float(got.detach()), logp, old_logp, values, old_values, rewards,
                                               mask, settings)
        assert_close(got.detach(), expected.detach(), "the loss", atol=1e-9, rtol=1e-7, hint=hint, inputs=shown())
        for name, g, e in zip(("logp", "values"), grads, expected_grads):
            assert_close(g, e, f"the gradient of the loss in {name}", atol=1e-9, rtol=1e-7, hint=hint,
                         inputs=shown())
    print("ok")


reference_gae_loop = reference_gae  # the reference under the checker's name (used by ``checker``)
