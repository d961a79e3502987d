"""Exercise of the chapter "GSPO": the sequence-level clipped loss.

:func:`check_gspo_loss` compares the reader's ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high) ->
scalar tensor`` with GSPO's loss on random inputs (seeded, so a failure is reproducible), in value **and** in its
gradient with respect to ``logp``. Shapes: ``logp``, ``old_logp``, ``mask`` (B, T) (right-padded completions, every
row at least one token; padding may hold any number), ``advantages`` (B,). The loss is

    s_i = exp( sum_t m_{i,t} (logp - old_logp)_{i,t} / |o_i| ),
    loss = -(1/B) sum_i min( s_i A_i, clip(s_i, 1 - epsilon, 1 + epsilon_high) A_i ),

the reference being the package's ``policy_loss(..., loss_type="grpo", importance_sampling_level="sequence")``.

The usual mistakes it names: token-level ratios (GRPO's), the whole-sequence ratio pi(o)/pi_old(o) without the
power 1/|o_i|, and padding counted in the length.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlbook.exercises._compare import checker
from rlbook.exercises._ratio_loss import check_ratio_loss
from rlbook.objectives import policy_loss

_SEED = 20250724
NUM_TRIALS = 150


# ---------------------------------------------------------------------------------------------- reference
def reference_gspo_loss(logp, old_logp, advantages, mask, epsilon: float = 3e-4,
                        epsilon_high: float = 4e-4) -> torch.Tensor:
    """GSPO's loss (a scalar tensor, differentiable in ``logp``): the package's sequence-level ``policy_loss``."""
    return policy_loss(logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
                       loss_type="grpo", importance_sampling_level="sequence")[0]


def _variant(name: str, logp, old_logp, advantages, mask, epsilon, epsilon_high) -> torch.Tensor:
    """One of the usual mistakes, as a loss (for the hints)."""
    if name == "token":
        return policy_loss(logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
                           loss_type="grpo")[0]
    m = mask.bool()
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp)).sum(-1)
    log_s = log_ratio.clamp(max=30) if name == "product" else log_ratio / logp.shape[1]  # "padded"
    s = torch.exp(log_s)
    return -torch.minimum(s * advantages, s.clamp(1 - epsilon, 1 + epsilon_high) * advantages).mean()


_HINTS = {
    "token": " (this is GRPO's loss with one ratio per token; GSPO uses one ratio s_i per completion)",
    "product": " (you used the whole-sequence ratio pi(o)/pi_old(o); GSPO takes its |o_i|-th root, the geometric "
               "mean of the token ratios)",
    "padded": " (you divided by the padded length T; |o_i| counts only the completion's own tokens, sum_t m)",
}


# ---------------------------------------------------------------------------------------------- checker
@checker
def check_gspo_loss(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(logp, old_logp, advantages, mask, epsilon, epsilon_high)`` with GSPO's loss and its gradient
    in ``logp``, on random batches: one-token and long completions, ratios inside and outside GSPO's tiny clip
    range (3e-4 / 4e-4) and a GRPO-sized one (0.2), positive and negative advantages, garbage on the padding."""
    check_ratio_loss(fn, reference_gspo_loss, _variant, _HINTS, "GSPO",
                     spreads=(1e-4, 1e-3, 0.3), clip_ranges=((3e-4, 4e-4), (0.2, 0.2), (0.2, 0.28)),
                     num_trials=num_trials, seed=seed)
