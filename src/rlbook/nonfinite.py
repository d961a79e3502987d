"""Non-finite numbers (NaN, ±inf): refused where they appear, before they reach the weights.

One NaN in a loss spreads through the backward pass to every weight, and the run trains on nothing from then on;
one in a reward does the same through the advantages. So every place where one could enter is checked, and the
error names the place, the step and the value:

    require_finite(source, x, step, mask)    a loss, log-prob, gradient norm or tensor of the objectives
    require_finite_rewards(rewards, ...)     the reward function's output (``nonfinite_rewards="raise"``)
    skip_nonfinite_groups(rollout, G, step)  or drop the groups that hold one (``nonfinite_rewards="skip_group"``)

Steps are named as ``metrics.jsonl`` counts them, from 1: while the trainer's ``step`` (steps taken) is ``s``, the
step being taken is ``s + 1``.
"""

from __future__ import annotations

import numpy as np
import torch


def require_finite(source: str, x: torch.Tensor, step: int | None = None, mask: torch.Tensor | None = None) -> None:
    """Raise ``ValueError("<source> is not finite ...")`` unless every entry of ``x`` (any shape) is finite.

    ``mask`` (broadcastable to ``x``, usually (B, T)) limits the check to its nonzero entries, and the message
    counts them and gives the first one's place (row and token for (B, T)) and value: what the functions of
    :mod:`rlbook.objectives` check their inputs with. Without a mask the message gives the first non-finite value.
    With ``step`` (the trainer's count of steps taken) the message starts with the step being taken and says that
    the optimizer step was not taken: the trainer checks its losses, log-probs and gradient norm so, before the
    optimizer can write a NaN into the weights."""
    finite = torch.isfinite(x)
    bad = ~finite if mask is None else ~finite & mask.bool()
    if not bool(bad.any()):
        return
    if mask is None:
        message = f"{source} is not finite ({x.detach().flatten()[bad.flatten()][0].item()})"
    else:
        place = [int(i) for i in bad.nonzero()[0]]
        where = f"row {place[0]}, token {place[1]}" if len(place) == 2 else f"index {place}"
        message = (f"{source} is not finite at {int(bad.sum())} masked entries (first at {where}: "
                   f"{x[tuple(place)].item()})")
    if step is not None:
        message = (f"step {step + 1}: {message}; the optimizer step was not taken, so the weights are unchanged "
                   "by it")
    raise ValueError(message)


def require_finite_rewards(rewards: np.ndarray, completions: list[str], step: int) -> None:
    """Raise ``ValueError`` if a reward (B,) is not finite, naming the step being taken (``step + 1``), the first
    such completion (its index and text), how many there are, and the two fixes."""
    bad = np.flatnonzero(~np.isfinite(rewards)).tolist()
    if bad:
        raise ValueError(f"step {step + 1}: the reward function must return finite rewards; it "
                         f"returned {rewards[bad[0]]} for completion {bad[0]} "
                         f"({completions[bad[0]]!r}), {len(bad)} non-finite of {len(rewards)} in "
                         "all. Fix the reward function, or pass nonfinite_rewards="
                         "'skip_group' to drop the groups that hold them")


def skip_nonfinite_groups(rollout, num_generations: int, step: int) -> tuple:
    """``nonfinite_rewards="skip_group"``: ``(rollout, skipped)``, the :class:`rlbook.rollout.Rollout` without
    the groups (of ``num_generations`` contiguous completions) that hold a non-finite reward, and their number.
    ``ValueError`` naming the step being taken (``step + 1``) when no group is left."""
    finite = np.isfinite(rollout.rewards).reshape(-1, num_generations).all(-1)
    if finite.all():
        return rollout, 0
    if not finite.any():
        raise ValueError(f"step {step + 1}: the reward function returned a non-finite reward in "
                         f"every one of the {len(finite)} groups; nonfinite_rewards="
                         "'skip_group' left nothing to train on")
    return rollout.select_groups(np.flatnonzero(finite).tolist()), int((~finite).sum())
