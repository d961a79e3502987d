"""Exercise of the chapter "GAPO": the discriminator's fresh pairs.

- :func:`check_gan_pairs`: ``fn(prompts, references, samples) -> list[(prompt, chosen, rejected)]``, the pairs the
  encoder trains on in GAPO's adversarial phase (as :func:`rlbook.gapo.fresh_pairs` builds them): for each
  generator sample, in order, the task's reference response is *chosen* ("real") and the sample, stripped of
  surrounding spaces, is *rejected* ("fake"); a sample that equals its reference after stripping gives no pair
  (a pair of two equal responses would only teach the encoder noise).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import call_reader, checker

_SEED = 20251130
NUM_TRIALS = 200
_LETTERS = list("abcxyz")


def reference_gan_pairs(prompts, references, samples) -> list[tuple[str, str, str]]:
    """The pairs in order: (prompt, reference, stripped sample), skipping samples equal to their reference."""
    if not len(prompts) == len(references) == len(samples):
        raise ValueError("prompts, references and samples must have the same length")
    return [(p, r, s.strip()) for p, r, s in zip(prompts, references, samples) if s.strip() != r]


def _case(rng: np.random.Generator):
    n = int(rng.integers(0, 7))
    prompts = [f"len={int(rng.integers(3, 6))} x=1:" for _ in range(n)]
    references = ["".join(rng.choice(_LETTERS, size=int(rng.integers(3, 6)))) for _ in range(n)]
    samples = []
    for ref in references:
        kind = rng.integers(4)
        samples.append(ref if kind == 0 else f" {ref} " if kind == 1 else
                       "".join(rng.choice(_LETTERS, size=int(rng.integers(0, 6)))) + (" " if kind == 3 else ""))
    return prompts, references, samples


@checker
def check_gan_pairs(fn: Callable) -> None:
    """Compare ``fn(prompts, references, samples)`` with :func:`reference_gan_pairs` on random cases."""
    rng = np.random.default_rng(_SEED)
    for trial in range(NUM_TRIALS):
        prompts, references, samples = _case(rng)

        def shown():
            return f"trial {trial}: prompts={prompts}, references={references}, samples={samples}"

        got = call_reader(fn, (list(prompts), list(references), list(samples)), shown)
        expected = reference_gan_pairs(prompts, references, samples)
        got = [tuple(p) for p in got] if isinstance(got, (list, tuple)) else got
        if got != expected:
            raise AssertionError(f"expected the pairs {expected}, got {got} (chosen = the reference, rejected = the "
                                 f"stripped sample; skip samples equal to their reference) ({shown()})")
    print("ok")
