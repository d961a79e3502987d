"""Advantage estimators, slot 1 of the family's objective: one small function per algorithm.

``RLConfig.advantage_estimator`` names one of :data:`ESTIMATORS`. Each estimator takes the scored rollout's
numbers (:class:`AdvantageInputs`) and the config and returns :class:`Advantages`: the advantages and, where the
algorithm has them, the value model's targets (``returns``) and the completions kept for the loss (``keep``). The
maths lives in :mod:`rlbook.objectives`; an estimator only says which of it applies. The trainer calls
``ESTIMATORS[config.advantage_estimator](inputs, config)`` and nothing else.

To add an estimator, decorate a function ``(inputs, config) -> Advantages`` with ``@estimator("name")`` (and
``needs_value_model=True`` if it reads ``inputs.values``); the config accepts the new name at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from rlbook.objectives import (
    gae,
    gfpo_adaptive_k,
    gfpo_keep_mask,
    group_advantages,
    leave_one_out_advantages,
    length_adaptive_lam,
    masked_whiten,
)

# ``RLConfig`` in the annotations is :class:`rlbook.presets.RLConfig`, named but not imported (not even for type
# checkers): the presets import this module to check ``advantage_estimator``. Annotations are never evaluated
# (``from __future__ import annotations``), so the name needs no import.


@dataclass
class AdvantageInputs:
    """What an estimator may read, for ``B = N·G`` completions in contiguous groups of ``num_generations``.

    - ``rewards`` (B,): each completion's reward after shaping (DAPO's overlong penalty), minus β Σ_t k1_t when
      the KL penalty is placed in the reward;
    - ``token_rewards`` (B, T): the same as a per-token reward (eq-rlhf-token-reward): the score at the last real
      token, −β k1_t at every token when the KL is in the reward (else 0 there); what GAE discounts;
    - ``mask`` (B, T) float: 1 on completion tokens; ``lengths`` (B,): their number;
    - ``values`` (B, T) or None: the value model's V(s_t) at each completion token (the estimators that need one).
    """

    rewards: torch.Tensor
    token_rewards: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    num_generations: int
    values: torch.Tensor | None = None


@dataclass
class Advantages:
    """An estimator's output: ``advantages`` (B,) per completion or (B, T) per token; ``returns`` (B, T), the value
    targets of a critic; ``keep`` (B,) bool, the completions that stay in the loss (None: all); ``metrics``, floats
    to log."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


ESTIMATORS: dict[str, Callable[[AdvantageInputs, RLConfig], Advantages]] = {}
VALUE_MODEL_ESTIMATORS: set[str] = set()


def estimator(name: str, needs_value_model: bool = False):
    """Register the decorated function as ``ESTIMATORS[name]``."""
    def register(fn):
        ESTIMATORS[name] = fn
        if needs_value_model:
            VALUE_MODEL_ESTIMATORS.add(name)
        return fn
    return register


@estimator("reinforce")
def reinforce(inputs: AdvantageInputs, config: RLConfig) -> Advantages:
    """REINFORCE without a baseline: each completion's reward is its advantage, A_i = r_i
    (eq-pg-trajectory)."""
    return Advantages(inputs.rewards)


@estimator("group_mean")
def group_mean(inputs: AdvantageInputs, config: RLConfig) -> Advantages:
    """REINFORCE with the group's mean reward as the baseline: A_i = r_i − mean_j r_j
    (eq-pg-group-baselines)."""
    return Advantages(
        group_advantages(inputs.rewards, inputs.num_generations, scale_rewards="none"))


@estimator("rloo")
def rloo(inputs: AdvantageInputs, config: RLConfig) -> Advantages:
    """RLOO: the mean of the *other* G − 1 rewards as the baseline,
    A_i = G/(G − 1)·(r_i − mean_j r_j) (eq-pg-group-baselines); unbiased, because the baseline does
    not depend on r_i."""
    return Advantages(leave_one_out_advantages(inputs.rewards, inputs.num_generations))


@estimator("grpo")
def grpo(inputs: AdvantageInputs, config: RLConfig) -> Advantages:
    """GRPO: the group z-score, A_i = (r_i − mean) / (std + eps) (eq-grpo-advantage);
    ``scale_rewards="none"`` is Dr. GRPO's r_i − mean, ``"batch"`` divides by the whole batch's
    std."""
    return Advantages(group_advantages(inputs.rewards, inputs.num_generations,
                                       scale_rewards=config.scale_rewards))


@estimator("gfpo")
def gfpo(inputs: AdvantageInputs, config: RLConfig) -> Advantages:
    """GFPO: keep ``gfpo_k`` of each group's G completions (the shortest, or the most reward per
    token; with ``gfpo_adaptive`` more for harder prompts), z-scores over the kept ones, 0 for the
    others, which leave the loss (eq-gfpo-advantage)."""
    rewards, lengths, G = (inputs.rewards, inputs.lengths.to(inputs.rewards.device),
                           inputs.num_generations)
    k = gfpo_adaptive_k(rewards, G) if config.gfpo_adaptive else config.gfpo_k
    keep = gfpo_keep_mask(rewards, lengths, G, k, config.gfpo_metric)
    advantages = group_advantages(rewards, G, scale_rewards=config.scale_rewards, keep_mask=keep)
    return Advantages(advantages, keep=keep,
                      metrics={"gfpo/kept_mean_length": float(lengths[keep].float().mean())})


@estimator("gae", needs_value_model=True)
def ppo_gae(inputs: AdvantageInputs, config: RLConfig) -> Advantages:
    """PPO: GAE(γ, λ) over the value model's estimates (eq-ppo-gae), whitened over the batch's
    tokens; the value targets are A + V with the same λ."""
    advantages, returns = gae(inputs.token_rewards, inputs.values, inputs.mask, config.gamma,
                              config.lam)
    return Advantages(_whiten(advantages, inputs.mask, config), returns=returns)


@estimator("vapo", needs_value_model=True)
def vapo_gae(inputs: AdvantageInputs, config: RLConfig) -> Advantages:
    """VAPO: decoupled GAE. The policy's advantages use the length-adaptive λ = 1 − 1/(α·|o_i|)
    (eq-vapo-lambda; ``lam`` when ``lam_alpha`` is None); the value targets use ``lam_critic`` (1 in
    the paper: Monte Carlo returns, eq-vapo-mc-target), or the policy's λ when ``lam_critic`` is
    None (one coupled GAE pass)."""
    lam_policy = (config.lam if config.lam_alpha is None
                  else length_adaptive_lam(inputs.lengths, config.lam_alpha))
    lam_critic = lam_policy if config.lam_critic is None else config.lam_critic
    advantages, returns = gae(inputs.token_rewards, inputs.values, inputs.mask, config.gamma,
                              lam_policy)
    if config.lam_critic is not None:  # decoupled: the critic's targets from their own λ
        _, returns = gae(inputs.token_rewards, inputs.values, inputs.mask, config.gamma, lam_critic)
    metrics = {"vapo/lam_policy": float(torch.as_tensor(lam_policy, dtype=torch.float32).mean())}
    return Advantages(_whiten(advantages, inputs.mask, config), returns=returns, metrics=metrics)


def _whiten(advantages: torch.Tensor, mask: torch.Tensor, config: RLConfig) -> torch.Tensor:
    return masked_whiten(advantages, mask) if config.whiten_advantages else advantages
