"""Exercises of the chapter "The policy-gradient theorem": discounted reward-to-go and the leave-one-out baseline.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random torch tensors (seeded, so
a failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it,
and prints ``ok`` when everything agrees.

- :func:`check_discounted_pg_weights`: ``fn(rewards, mask, gamma) -> (B, T)``, the weight that multiplies
  ``grad log pi(a_t | s_t)`` in the gradient of the *discounted* objective: ``gamma^t * G_t`` with the reward-to-go
  ``G_t = sum_{k >= t} gamma^(k - t) r_k`` over the row's real steps (t counted from 0), and 0 on padding. The
  usual mistake is to forget the ``gamma^t`` (erratum E4); the second is to let padding leak into ``G_t``.
- :func:`check_leave_one_out_advantages`: ``fn(rewards, num_generations) -> (N*G,)``, RLOO's advantage
  ``r_i - mean_{j != i} r_j`` inside each contiguous group of ``num_generations`` completions.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from rlbook.exercises._compare import as_tensor, assert_close, call_reader, checker, show

if TYPE_CHECKING:
    import torch

_SEED = 20240611
NUM_TRIALS = 200


# ---------------------------------------------------------------------------------------------- references
def reference_discounted_pg_weights(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T) ``gamma^t * G_t`` with ``G_t = sum_{k >= t} gamma^(k - t) r_k`` over the mask; 0 on padding.

    Written as a loop over time (backwards: ``G_t = r_t + gamma G_{t+1}``), the way the definition reads.
    """
    import torch

    kept = rewards.double().where(mask.bool(), 0.0)
    B, T = kept.shape
    weights = torch.zeros(B, T, dtype=torch.float64)
    to_go = torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        to_go = kept[:, t] + gamma * to_go
        weights[:, t] = gamma**t * to_go
    return weights.where(mask.bool(), 0.0).to(rewards.dtype)


def reference_leave_one_out_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(N*G,) ``r_i - (sum of the group's rewards - r_i) / (G - 1)`` for contiguous groups of ``G``."""
    G = num_generations
    groups = rewards.double().view(-1, G)
    others = (groups.sum(-1, keepdim=True) - groups) / (G - 1)
    return (groups - others).flatten().to(rewards.dtype)


# ---------------------------------------------------------------------------------------------- random inputs
def _random_episodes(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(B, T) float32 rewards, a right-padded (B, T) long mask with at least one real step per row, and gamma.

    Rewards are dense in some trials and only on each row's last real step (as for a language model) in others;
    padding holds large numbers, so a reward-to-go that sums past the end of a row is visibly wrong.
    """
    import torch

    B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    lengths = rng.integers(1, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    if rng.random() < 0.5:
        rewards = rng.normal(0.0, 1.0, size=(B, T))
    else:
        rewards = np.zeros((B, T))
        rewards[np.arange(B), lengths - 1] = rng.integers(0, 2, size=B)
    rewards = np.where(mask == 1, rewards, rng.normal(0.0, 100.0, size=(B, T)))
    gamma = float(rng.choice([0.0, 0.5, 0.9, 0.99, 1.0, float(rng.uniform(0.0, 1.0))]))
    return torch.as_tensor(rewards, dtype=torch.float32), torch.as_tensor(mask, dtype=torch.long), gamma


def _random_groups(rng: np.random.Generator) -> tuple[torch.Tensor, int]:
    """(N*G,) float32 rewards in N contiguous groups of G >= 2: 0/1 rewards (with ties), groups that are all
    equal (where a division by the std needs its small constant), or reals."""
    import torch

    N, G = int(rng.integers(1, 5)), int(rng.integers(2, 9))
    kind = rng.random()
    if kind < 0.4:
        rewards = rng.integers(0, 2, size=N * G).astype(float)
    elif kind < 0.55:
        rewards = np.repeat(rng.integers(0, 2, size=N).astype(float), G)
    else:
        rewards = rng.normal(0.0, 2.0, size=N * G)
    return torch.as_tensor(rewards, dtype=torch.float32), G


def _group_trials(fn: Callable, num_trials: int, seed: int):
    """For each random trial of a group-advantage exercise: ``(rewards, G, the reader's (N*G,) result, a
    description of the inputs)``; a crash or an in-place change of the rewards is reported with the inputs."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        rewards, G = _random_groups(rng)
        original = rewards.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed}): num_generations={G}, rewards in {len(rewards) // G} "
                  f"group(s) of {G} =\n{show(rewards.view(-1, G), limit=64)}")
        got = as_tensor(call_reader(fn, (rewards, G), inputs), "a (N*G,) float tensor", inputs)
        if not rewards.equal(original):
            raise AssertionError(f"your function changed rewards in place; work on a copy\n{inputs}")
        yield original, G, got, inputs


# ---------------------------------------------------------------------------------------------- helpers
def _compare(got: torch.Tensor, expected: torch.Tensor, what: str, inputs: str, hint: str = "") -> None:
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}\n{inputs}")
    assert_close(got.double().numpy(), expected.double().numpy(), what, atol=1e-4, rtol=1e-4, hint=hint, inputs=inputs)


# ---------------------------------------------------------------------------------------------- checkers
@checker
def check_discounted_pg_weights(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, mask, gamma) -> (B, T)`` with ``gamma^t G_t`` (0 on padding) on random episodes."""
    import torch

    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        rewards, mask, gamma = _random_episodes(rng)
        originals = rewards.clone(), mask.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed}): gamma={gamma}, rewards =\n{rewards}\n"
                  f"  mask =\n{mask}")
        got = as_tensor(call_reader(fn, (rewards, mask, gamma), inputs), "a (B, T) float tensor", inputs)
        if not (rewards.equal(originals[0]) and mask.equal(originals[1])):
            raise AssertionError(f"your function changed its inputs in place; work on a copy\n{inputs}")
        expected = reference_discounted_pg_weights(rewards, mask, gamma)
        hint = ""
        if 0.0 < gamma < 1.0 and got.shape == expected.shape:  # the common mistake: G_t without gamma^t
            powers = torch.as_tensor(gamma ** np.arange(rewards.shape[1], dtype=float))
            if np.allclose(got.double().numpy(), (expected.double() / powers).numpy(), atol=1e-4, rtol=1e-4):
                hint = " (your weights are G_t without the gamma^t in front: see erratum E4)"
        _compare(got, expected, "gamma^t * G_t", inputs, hint)
    print("ok")


@checker
def check_leave_one_out_advantages(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, num_generations) -> (N*G,)`` with the leave-one-out advantage on random groups."""
    for original, G, got, inputs in _group_trials(fn, num_trials, seed):
        expected = reference_leave_one_out_advantages(original, G)
        hint = ""
        centred = (original.double().view(-1, G) - original.double().view(-1, G).mean(-1, keepdim=True)).flatten()
        if got.shape == expected.shape and np.allclose(got.double().numpy(), centred.numpy(), atol=1e-4, rtol=1e-4) \
                and not np.allclose(centred.numpy(), expected.double().numpy(), atol=1e-4, rtol=1e-4):
            hint = " (you subtracted the mean of the whole group, r_i included: that is (G - 1)/G times RLOO)"
        _compare(got, expected, "leave-one-out advantage", inputs, hint)
    print("ok")
