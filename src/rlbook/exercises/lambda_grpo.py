"""Exercise of the chapter "λ-GRPO: learning the aggregation": the learnable response weights.

Within each group of ``num_generations`` completion lengths, λ-GRPO weighs the tokens of completion i by

    z_i = (|o_i| − mean|o|) / (std|o| + 1e-4)     (std unbiased, n − 1)
    h_i = max(1 + r z_i, 1e-3)
    f_i = G · softmax_i(h_i^λ)                    (sum_i f_i = G in every group)

:func:`check_lambda_grpo_weights` compares the reader's ``fn(lengths, num_generations, lam, r) -> (N*G,)`` with
:func:`rlbook.objectives.lambda_grpo_weights` on random groups, and names the usual mix-ups: the softmax weights w
(summing to 1, not G), the population standard deviation, a softmax over the whole batch instead of each group.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, checker

_SEED = 20251008
NUM_TRIALS = 200


def _random_trial(rng: np.random.Generator):
    """(N*G,) long lengths >= 1 in N groups of G, and scalars lam in [-3, 3], r in (0, sqrt(G)/(G-1))."""
    import torch

    G, N = int(rng.integers(2, 9)), int(rng.integers(1, 4))
    lengths = rng.integers(1, 40, size=N * G)
    if rng.random() < 0.2:  # now and then a group of equal lengths
        lengths[:G] = lengths[0]
    lam = float(np.round(rng.uniform(-3, 3), 3))
    r = float(np.round(rng.uniform(0.05, 0.95) * np.sqrt(G) / (G - 1), 3))
    return torch.as_tensor(lengths, dtype=torch.long), G, lam, r


def _hint(got: np.ndarray, lengths: np.ndarray, G: int, lam: float, r: float) -> str:
    groups = lengths.reshape(-1, G).astype(float)
    expected = _numpy_weights(groups, lam, r, ddof=1)
    if np.allclose(got, expected.flatten() / G, atol=1e-4, rtol=1e-4):
        return " (these are the softmax weights w, which sum to 1 per group; f = G * w sums to G)"
    if np.allclose(got, _numpy_weights(groups, lam, r, ddof=0).flatten(), atol=1e-4, rtol=1e-4):
        return " (this is the population std; use the unbiased one, n - 1, as group_advantages does)"
    return ""


def _numpy_weights(groups: np.ndarray, lam: float, r: float, ddof: int) -> np.ndarray:
    z = (groups - groups.mean(-1, keepdims=True)) / (groups.std(-1, ddof=ddof, keepdims=True) + 1e-4)
    g = np.maximum(1 + r * z, 1e-3) ** lam
    e = np.exp(g - g.max(-1, keepdims=True))
    return groups.shape[1] * e / e.sum(-1, keepdims=True)


@checker
def check_lambda_grpo_weights(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(lengths, num_generations, lam, r) -> (N*G,)`` with λ-GRPO's weights f on random groups."""
    import torch

    from rlbook.objectives import lambda_grpo_weights

    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        lengths, G, lam, r = _random_trial(rng)
        original = lengths.clone()
        inputs = f"  inputs of trial {trial} (seed {seed}): num_generations={G}, lam={lam}, r={r}, lengths={lengths.tolist()}"
        got = call_reader(fn, (lengths, G, lam, r), inputs)
        if got is None or not hasattr(got, "shape"):
            raise AssertionError(f"your function returned {type(got).__name__}; it must return an (N*G,) tensor\n"
                                 f"{inputs}")
        if not lengths.equal(original):
            raise AssertionError(f"your function changed its inputs in place; work on a copy\n{inputs}")
        got = np.asarray(got.detach().cpu().double() if hasattr(got, "detach") else got, dtype=float)
        expected = lambda_grpo_weights(lengths, G, lam, r).double().numpy()
        hint = _hint(got, lengths.numpy(), G, lam, r) if got.shape == expected.shape else ""
        assert_close(got, expected, "lambda-GRPO weights f", atol=1e-4, rtol=1e-4, hint=hint, inputs=inputs)
    print("ok")


def reference_lambda_grpo_weights(*args, **kwargs):
    """The package's :func:`rlbook.objectives.lambda_grpo_weights` (the reference of the checker)."""
    from rlbook.objectives import lambda_grpo_weights

    return lambda_grpo_weights(*args, **kwargs)
