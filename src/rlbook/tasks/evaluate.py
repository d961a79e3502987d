"""Evaluate sampled completions: accuracy, pass@k, reward, completion length, truncation.

pass@k is the probability that at least one of ``k`` samples, drawn without replacement from the ``n``
generated for a problem, is correct. With ``c`` correct among ``n``, the unbiased estimator of Chen et al.
(2021, "Evaluating Large Language Models Trained on Code") is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i),

and the product form avoids the huge binomial coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlbook.tasks.base import Task, check_int


def pass_at_k(num_samples, num_correct, k: int) -> np.ndarray:
    """The unbiased pass@k estimate per problem, ``1 - C(n-c, k) / C(n, k)``.

    Args:
        num_samples: ``n``, samples per problem, int or int array of shape ``(P,)``.
        num_correct: ``c``, correct samples per problem, same shape, ``0 <= c <= n``.
        k: samples allowed per problem, ``1 <= k <= n``.

    Returns:
        float64 array of shape ``(P,)`` (or ``()`` for scalar input), each value in [0, 1].
    """
    k = check_int(k, "k", minimum=1)
    n = np.asarray(num_samples)
    c = np.asarray(num_correct)
    if n.shape != c.shape:
        raise ValueError(f"num_samples has shape {n.shape} but num_correct has shape {c.shape}")
    if not (np.issubdtype(n.dtype, np.integer) and np.issubdtype(c.dtype, np.integer)):
        raise ValueError("num_samples and num_correct must be integers")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError("num_correct must lie in [0, num_samples] for every problem")
    if np.any(n < k):
        raise ValueError(f"k={k} is larger than the number of samples of a problem (min {int(n.min())})")
    flat_n, flat_c = n.reshape(-1), c.reshape(-1)
    estimates = np.empty(flat_n.shape, dtype=np.float64)
    for index, (samples, correct) in enumerate(zip(flat_n, flat_c)):
        if samples - correct < k:  # every k-subset holds a correct sample
            estimates[index] = 1.0
        else:
            i = np.arange(samples - correct + 1, samples + 1, dtype=np.float64)
            estimates[index] = 1.0 - np.prod(1.0 - k / i)
    return estimates.reshape(n.shape)


@dataclass(frozen=True)
class EvaluationResult:
    """Summary of ``evaluate``.

    Attributes:
        accuracy: fraction of all samples that are correct (``Task.is_correct``).
        pass_at_k: ``{k: mean over problems of the unbiased pass@k}``.
        mean_reward: mean reward over all samples (under the task's reward convention).
        mean_length: mean completion length in characters over all samples.
        max_length: longest completion in characters.
        truncated_fraction: fraction of samples that hit the token budget.
        num_problems: number of examples.
        num_samples: total number of completions.
    """

    accuracy: float
    pass_at_k: dict
    mean_reward: float
    mean_length: float
    max_length: int
    truncated_fraction: float
    num_problems: int
    num_samples: int


def evaluate(task: Task, examples, completions, truncated=None, k=1) -> EvaluationResult:
    """Score several samples per problem.

    Args:
        task: the task that scores the completions.
        examples: ``P`` examples.
        completions: ``P`` lists of strings; ``completions[p]`` are the samples for ``examples[p]`` (at least
            one each, and at least ``max(k)``).
        truncated: None (nothing truncated) or ``P`` lists of booleans shaped like ``completions``.
        k: an int or a sequence of ints, the ``k`` of pass@k.

    Returns:
        an :class:`EvaluationResult`.
    """
    examples, completions = list(examples), [list(samples) for samples in completions]
    if len(examples) == 0:
        raise ValueError("evaluate needs at least one example")
    if len(completions) != len(examples):
        raise ValueError(f"got {len(examples)} examples but {len(completions)} lists of completions")
    if truncated is None:
        truncated = [[False] * len(samples) for samples in completions]
    truncated = [list(flags) for flags in truncated]
    if len(truncated) != len(completions):
        raise ValueError(f"got {len(completions)} lists of completions but {len(truncated)} lists of flags")
    ks = [k] if isinstance(k, (int, np.integer)) else list(k)
    if len(ks) == 0:
        raise ValueError("k must be an int or a non-empty sequence of ints")

    num_samples, num_correct, rewards, lengths, flags = [], [], [], [], []
    for problem, (example, samples, sample_flags) in enumerate(zip(examples, completions, truncated)):
        if len(samples) == 0:
            raise ValueError(f"example {problem} has no completions")
        if len(sample_flags) != len(samples):
            raise ValueError(f"example {problem} has {len(samples)} completions but {len(sample_flags)} flags")
        correct = [task.is_correct(example, text, bool(flag)) for text, flag in zip(samples, sample_flags)]
        num_samples.append(len(samples))
        num_correct.append(sum(correct))
        rewards += [task.reward(example, text, bool(flag)) for text, flag in zip(samples, sample_flags)]
        lengths += [len(text) for text in samples]
        flags += [bool(flag) for flag in sample_flags]

    num_samples, num_correct = np.array(num_samples), np.array(num_correct)
    return EvaluationResult(
        accuracy=float(num_correct.sum() / num_samples.sum()),
        pass_at_k={int(kk): float(pass_at_k(num_samples, num_correct, kk).mean()) for kk in ks},
        mean_reward=float(np.mean(rewards)),
        mean_length=float(np.mean(lengths)),
        max_length=int(np.max(lengths)),
        truncated_fraction=float(np.mean(flags)),
        num_problems=len(examples),
        num_samples=int(num_samples.sum()),
    )
