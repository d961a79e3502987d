"""Exercises of the chapter "GRPO": the group-normalised advantage.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random torch tensors (seeded, so
a failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it,
and prints ``ok`` when everything agrees.

- :func:`check_grpo_advantages`: ``fn(rewards, num_generations) -> (N*G,)``, GRPO's advantage
  ``(r_i - mean) / (std + 1e-4)`` inside each contiguous group of ``num_generations`` completions, with the
  *sample* standard deviation (divide by G - 1, as ``torch.std``, TRL and verl do). A group whose rewards are all
  equal must get advantage 0, never NaN. The usual mistakes are the population std (erratum E8) and a division
  without the small constant, which gives 0/0 on such a group (erratum E11).

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from rlbook.exercises._compare import checker
from rlbook.exercises.pg import _compare, _group_trials

if TYPE_CHECKING:
    import torch

_SEED = 20240612
NUM_TRIALS = 200
EPS = 1e-4


def reference_grpo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(N*G,) ``(r_i - mean_G) / (std_G + 1e-4)`` per contiguous group, std with G - 1 in the denominator."""
    groups = rewards.double().view(-1, num_generations)
    centred = groups - groups.mean(-1, keepdim=True)
    std = (centred.pow(2).sum(-1, keepdim=True) / (num_generations - 1)).sqrt()
    return (centred / (std + EPS)).flatten().to(rewards.dtype)


@checker
def check_grpo_advantages(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, num_generations) -> (N*G,)`` with GRPO's group-normalised advantage on random groups."""
    for original, G, got, inputs in _group_trials(fn, num_trials, seed):
        expected = reference_grpo_advantages(original, G)
        if got.shape == expected.shape and not bool(got.isfinite().all()):
            raise AssertionError("your advantages contain NaN or inf: a group whose rewards are all equal has std 0, "
                                 f"so divide by (std + 1e-4), as in erratum E11\n{inputs}")
        hint = ""
        if got.shape == expected.shape:
            groups = original.double().view(-1, G)
            centred = groups - groups.mean(-1, keepdim=True)
            population = (centred / (groups.std(-1, unbiased=False, keepdim=True) + EPS)).flatten()
            with np.errstate(invalid="ignore", divide="ignore"):
                bare = (centred / groups.std(-1, keepdim=True)).flatten()
            flat = original.double()
            batch_z = [(flat - flat.mean()) / (flat.std(unbiased=unbiased) + EPS) for unbiased in (True, False)]
            batch_std = (centred / (flat.std() + EPS)).flatten()
            mine = got.double().numpy()

            def matches(candidate, atol=1e-4):
                return np.allclose(mine, candidate.numpy(), atol=atol, rtol=1e-4)

            if np.allclose(mine, population.numpy(), atol=1e-4, rtol=1e-4):
                hint = (" (you divided by the population std, 1/G inside the square root; GRPO's code uses the "
                        "sample std, 1/(G - 1): see erratum E8)")
            elif np.allclose(mine, bare.numpy(), atol=1e-6, rtol=1e-6, equal_nan=True):
                hint = " (you divided by the std alone; the code divides by (std + 1e-4): see erratum E11)"
            elif any(matches(z) for z in batch_z):
                hint = (" (you normalised over the whole batch: one mean and one std for all N*G rewards; GRPO "
                        "takes both inside each group of num_generations, e.g. rewards.view(-1, G).mean(-1))")
            elif matches(batch_std):
                hint = (" (you centred per group but divided by the batch's std, TRL's scale_rewards='batch'; "
                        "here each group's own std is wanted)")
            elif matches(centred.flatten()):
                hint = " (you only centred the rewards, as Dr. GRPO does; GRPO also divides by the group's std + 1e-4)"
        _compare(got, expected, "GRPO advantage", inputs, hint)
    print("ok")
