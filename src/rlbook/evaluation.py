"""Low-noise held-out evaluation: several samples per prompt on many prompts, and intervals from scipy.

One sample per prompt on a few hundred prompts measures accuracy with a standard error of 2-3 points, as large
as most effects the book looks for. :func:`evaluate_policy` instead samples ``k`` completions for each of many
held-out prompts (1,000 or more in an experiment) and keeps every verdict, so that

- the **expected accuracy** (mean correctness over all ``P * k`` samples) has the sampling noise of ``P * k``
  draws, and its interval can be taken over prompts (:func:`rlbook.stats.prompt_interval`, a scipy bootstrap);
- pass@k, the mean length of the correct and of the wrong answers, the token entropy of the sampling
  distribution and the number of *distinct* correct answers per prompt come from the same samples;
- given a base policy, the **KL to the base**, KL(pi || pi_base), estimated on the same samples as the mean over
  completions of sum_t (log pi - log pi_base) (the k1 estimator summed over a completion: nats per completion, the
  x-axis of reward over-optimisation as sqrt(KL)).

Arms of an experiment are compared on **paired seeds**: the same held-out prompts and the same sampling stream
(``seed``) for every arm, so that the difference between two arms is not diluted by which prompts or random
numbers each drew. The statistics of such comparisons live in :mod:`rlbook.stats` (re-exported here, their old
home): :func:`~rlbook.stats.paired_difference` gives the interval of such a difference over training seeds and
:func:`~rlbook.stats.seeds_needed` how many seeds an effect of a given size needs, from a pilot's per-seed spread
(power from the noncentral t, :func:`~rlbook.stats.paired_t_power`); :func:`~rlbook.stats.holm_intervals` corrects
several such differences for multiplicity.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from rlbook.callbacks import TrainerCallback
from rlbook.lm import autocast
from rlbook.rollout import generate_rollouts, sequence_logprobs
from rlbook.stats import (  # noqa: F401  re-exported: the old home of the intervals, differences and power
    detectable_effect, holm_intervals, paired_difference, paired_t_power, prompt_interval, seeds_needed)
from rlbook.tasks.base import Task, check_int
from rlbook.tasks.evaluate import pass_at_k


@dataclass(frozen=True)
class PolicyEvaluation:
    """Every verdict of :func:`evaluate_policy`, one row per prompt and one column per sample.

    Attributes:
        correct: ``(P, k)`` bool, the task's verdict on each sample.
        lengths: ``(P, k)`` int, completion tokens of each sample (up to and including EOS).
        truncated: ``(P, k)`` bool, the sample hit the token budget.
        entropy_sum: ``(P, k)`` float, the sum over the sample's tokens of the entropy (nats) of the sampling
            distribution at that token.
        distinct_correct: ``(P,)`` int, how many different correct completions (as text) each prompt got.
        kl_sum: ``(P, k)`` float or None, the sum over the sample's tokens (EOS included) of ``log pi - log
            pi_base`` (the k1 estimate of the completion's KL to a base policy); None when no base was given.
    """

    correct: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    entropy_sum: np.ndarray
    distinct_correct: np.ndarray
    kl_sum: np.ndarray | None = None

    @property
    def num_prompts(self) -> int:
        return self.correct.shape[0]

    @property
    def samples_per_prompt(self) -> int:
        return self.correct.shape[1]

    def per_prompt_accuracy(self) -> np.ndarray:
        """``(P,)`` fraction of each prompt's samples that are correct."""
        return self.correct.mean(axis=1)

    def expected_accuracy(self) -> float:
        """Mean correctness over all ``P * k`` samples: the expected accuracy of one sample."""
        return float(self.correct.mean())

    def pass_at(self, k: int) -> float:
        """Mean over prompts of the unbiased pass@k (Chen et al., 2021), ``k <= samples_per_prompt``."""
        n = np.full(self.num_prompts, self.samples_per_prompt)
        return float(pass_at_k(n, self.correct.sum(axis=1), k).mean())

    def frac_reward_zero_std(self) -> float:
        """Fraction of prompts whose k samples are all right or all wrong: the groups of k (= G) that would carry no
        signal for a group baseline (TRL's ``frac_reward_zero_std`` for a right/wrong reward)."""
        solved = self.correct.sum(axis=1)
        return float(np.mean((solved == 0) | (solved == self.samples_per_prompt)))

    def mean_length(self, which: str = "all") -> float:
        """Mean completion length in tokens of ``"all"``, the ``"correct"`` or the ``"wrong"`` samples (NaN if
        there are none of that kind)."""
        masks = {"all": np.ones_like(self.correct), "correct": self.correct, "wrong": ~self.correct}
        if which not in masks:
            raise ValueError(f"which must be one of {sorted(masks)}, got {which!r}")
        chosen = self.lengths[masks[which]]
        return float(chosen.mean()) if chosen.size else float("nan")

    def token_entropy(self) -> float:
        """Mean entropy (nats) of the sampling distribution over every sampled token (TRL's ``entropy``)."""
        return float(self.entropy_sum.sum() / max(int(self.lengths.sum()), 1))

    def kl_to_base(self) -> float:
        """KL(pi || pi_base) per completion (nats): the mean over all samples of :attr:`kl_sum`, an unbiased
        estimate (one sample can be negative, the mean cannot be in expectation); NaN without a base."""
        return float(self.kl_sum.mean()) if self.kl_sum is not None else float("nan")

    def summary(self, ks=(1, 8)) -> dict[str, float]:
        """The headline numbers as a flat dict (pass@k for each ``k`` in ``ks`` that the samples allow, and
        ``kl_to_base`` when the evaluation had a base policy)."""
        out = {
            "expected_accuracy": self.expected_accuracy(),
            "mean_length": self.mean_length("all"),
            "mean_length_correct": self.mean_length("correct"),
            "mean_length_wrong": self.mean_length("wrong"),
            "truncated_fraction": float(self.truncated.mean()),
            "entropy": self.token_entropy(),
            "distinct_correct": float(self.distinct_correct.mean()),
            "frac_reward_zero_std": self.frac_reward_zero_std(),
        }
        for k in ks:
            if k <= self.samples_per_prompt:
                out[f"pass@{k}"] = self.pass_at(k)
        if self.kl_sum is not None:
            out["kl_to_base"] = self.kl_to_base()
        return out


@torch.no_grad()
def evaluate_policy(model, tokenizer, task: Task, examples, *, num_samples: int = 8, max_new_tokens: int,
                    temperature: float = 1.0, seed: int = 0, prompts_per_batch: int = 64,
                    base_model=None) -> PolicyEvaluation:
    """Sample ``num_samples`` completions for each example and score them with the task's rule.

    Deterministic given ``seed`` on a given machine: chunk ``j`` of ``prompts_per_batch`` prompts is sampled with
    the stream ``(seed, j)``, so two policies evaluated with the same examples and seed see the same prompts and
    the same random numbers (paired evaluation). Runs where the model is, under bf16 autocast on a CUDA GPU.

    Args:
        examples: the held-out examples (``task.sample(n, seed=..., split="test")``), at least one.
        num_samples: ``k``, samples per prompt (8 gives pass@8 and cuts the sampling noise of the accuracy by
            up to sqrt(8)).
        max_new_tokens: the completion budget.
        base_model: a policy to measure the KL to (e.g. the one training started from), or None. Its log-probs
            of the sampled tokens (at ``temperature``) are taken with one forward pass per chunk; the samples and
            every other number are the same with or without it.
    Returns a :class:`PolicyEvaluation`.
    """
    examples = list(examples)
    if not examples:
        raise ValueError("evaluate_policy needs at least one example")
    k = check_int(num_samples, "num_samples", minimum=1)
    chunk = check_int(prompts_per_batch, "prompts_per_batch", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct, lengths, truncated, entropy_sum, distinct, kl_sum = [], [], [], [], [], []
    try:
        for j, start in enumerate(range(0, len(examples), chunk)):
            part = examples[start:start + chunk]
            generator = torch.Generator(device=device).manual_seed(int(np.random.SeedSequence((seed, j))
                                                                       .generate_state(1)[0]))
            with autocast(device):
                batch = generate_rollouts(model, tokenizer, [e.prompt for e in part], num_generations=k,
                                          max_new_tokens=max_new_tokens, temperature=temperature,
                                          seed=generator)
            texts = batch.decode_completions(tokenizer)
            flags = batch.truncated.cpu().numpy()
            repeated = [e for e in part for _ in range(k)]  # rows are prompt-major: G rows per prompt
            verdicts = np.array([task.is_correct(e, t, bool(f)) for e, t, f in zip(repeated, texts, flags)])
            correct.append(verdicts.reshape(len(part), k))
            lengths.append(batch.lengths.cpu().numpy().reshape(len(part), k))
            truncated.append(flags.reshape(len(part), k))
            entropy_sum.append(batch.entropies.float().sum(-1).cpu().numpy().reshape(len(part), k))
            distinct += [len({t for t, ok in zip(texts[i * k:(i + 1) * k], verdicts[i * k:(i + 1) * k]) if ok})
                         for i in range(len(part))]
            if base_model is not None:  # k1 summed over the completion: log pi (the sampler's) - log pi_base
                mask = batch.completion_mask.float()
                with autocast(device):
                    base_logp = sequence_logprobs(base_model, batch.input_ids, batch.attention_mask, mask,
                                                  temperature=temperature)
                kl = ((batch.logprobs.float() - base_logp) * mask).sum(-1)
                kl_sum.append(kl.cpu().numpy().reshape(len(part), k))
    finally:
        model.train(was_training)
    return PolicyEvaluation(correct=np.concatenate(correct).astype(bool), lengths=np.concatenate(lengths),
                            truncated=np.concatenate(truncated).astype(bool),
                            entropy_sum=np.concatenate(entropy_sum), distinct_correct=np.array(distinct),
                            kl_sum=np.concatenate(kl_sum) if base_model is not None else None)


class HeldOutEvaluation(TrainerCallback):
    """A trainer callback: :func:`evaluate_policy` on fixed held-out prompts at the start, every ``every`` steps,
    at each step of ``at_steps`` (a denser look where the policy moves fast) and at the end, keeping each
    :meth:`PolicyEvaluation.summary` in ``self.records`` as ``{"step": s, "num_completions": n, ...}``, ``n`` the
    completions sampled for training so far (the cost in samples).

    The prompts are ``num_prompts`` draws of the task's ``split`` (``"test"``; ``"validation"`` where settings are
    chosen, with the run trained on ``train_split="train_without_validation"``) from ``prompt_seed`` and the sampling
    stream is ``seed``, the same for every arm and training seed of an experiment: every policy is measured on
    the same problems with the same random numbers (paired evaluation). With ``kl_to_base`` (the default) a frozen
    copy of the policy as training begins is kept, and each record also holds ``kl_to_base``, the KL of the
    current policy to it per completion (:meth:`PolicyEvaluation.kl_to_base`; 0 at the first evaluation)::

        evaluation = HeldOutEvaluation(num_prompts=1024, num_samples=8, every=100)
        train_run("sort_scratchpad", Arm("grpo"), seed, callbacks=[evaluation])
        evaluation.records  # [{"step": 0, "expected_accuracy": ..., "mean_length_wrong": ...}, ...]
    """

    def __init__(self, num_prompts: int = 1024, num_samples: int = 8, every: int = 0, *, prompt_seed: int = 2024,
                 seed: int = 0, ks=(1, 8), kl_to_base: bool = True, at_steps=(), split: str = "test"):
        self.num_prompts = check_int(num_prompts, "num_prompts", minimum=1)
        self.num_samples = check_int(num_samples, "num_samples", minimum=1)
        self.every = check_int(every, "every", minimum=0)
        self.at_steps = frozenset(check_int(s, "at_steps", minimum=1) for s in at_steps)
        self.prompt_seed, self.seed, self.ks = prompt_seed, seed, tuple(ks)
        if split not in ("test", "validation"):
            raise ValueError(f"split must be 'test' or 'validation' (held-out problems), got {split!r}")
        self.split = split
        self.kl_to_base = bool(kl_to_base)
        self.base = None  # the frozen policy training started from (kl_to_base), copied at on_train_begin
        self.records: list[dict] = []

    def measure(self, trainer) -> dict:
        """Evaluate the trainer's current policy and append the summary to :attr:`records`."""
        examples = trainer.task.sample(self.num_prompts, seed=np.random.default_rng(self.prompt_seed),
                                       split=self.split)
        if self.kl_to_base and self.base is None:
            self.base = copy.deepcopy(trainer.policy).eval().requires_grad_(False)
        result = evaluate_policy(trainer.policy, trainer.tokenizer, trainer.task, examples,
                                 num_samples=self.num_samples, max_new_tokens=trainer.config.max_completion_length,
                                 temperature=trainer.config.temperature, seed=self.seed, base_model=self.base)
        record = {"step": trainer.step,
                  "num_completions": sum(m.get("num_completions", 0) for m in trainer.history),
                  **{k: round(v, 6) for k, v in result.summary(self.ks).items()}}
        self.records.append(record)
        return record

    def on_train_begin(self, trainer) -> None:
        if not self.records or self.records[-1]["step"] != trainer.step:
            self.measure(trainer)

    def on_step_end(self, trainer, metrics) -> None:
        if (self.every and trainer.step % self.every == 0) or trainer.step in self.at_steps:
            self.measure(trainer)

    def on_train_end(self, trainer) -> None:
        if self.records[-1]["step"] != trainer.step:
            self.measure(trainer)
