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

import torch

from rlbook.exercises._compare import checker
from rlbook.exercises._ratio_loss import check_ratio_loss
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


# ---------------------------------------------------------------------------------------------- checker
@checker
def check_gmpo_loss(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high)`` with GMPO's loss and its gradient
    in ``logp``, on random batches: one-token and long completions, log-ratios inside and far outside the clip
    range, GMPO's symmetric 0.4 and an asymmetric range, positive and negative advantages, garbage on the padding."""
    check_ratio_loss(fn, reference_gmpo_loss, _variant, _HINTS, "GMPO",
                     spreads=(0.05, 0.5, 1.5), clip_ranges=((0.4, 0.4), (0.2, 0.3), (0.4, 0.4)),
                     num_trials=num_trials, seed=seed)
