"""The numbers the loop adjusts as it runs: the KL penalty's coefficient β, the entropy bonus's c, and the early stop.

:class:`rlbook.trainer.Trainer` holds one :class:`KLController` and one :class:`EntropyController`
(``trainer.kl_control``, ``trainer.entropy_control``); its ``kl_coef``, ``entropy_coef`` and ``last_entropy`` read
and set their state, the three numbers a checkpoint keeps (:func:`rlbook.checkpointing.trainer_state`). The rules are
:mod:`rlbook.objectives`' (:func:`~rlbook.objectives.adaptive_kl_coef`,
:func:`~rlbook.objectives.adaptive_entropy_coef`); these objects say when each applies and what it adds to the
reward or the loss.
"""

from __future__ import annotations

import numpy as np
import torch

from rlbook.distributed import World, all_reduce_sum
from rlbook.objectives import adaptive_entropy_coef, adaptive_kl_coef, entropy_bonus_loss, rlhf_token_rewards
from rlbook.presets import RLConfig


class KLController:
    """The coefficient β of the KL penalty to the reference policy: ``config.beta``, or with
    ``adaptive_kl_target`` moved after every step toward that KL per completion by the adaptive controller of
    Ziegler et al. 2019 (eq-rlhf-akl, :func:`rlbook.objectives.adaptive_kl_coef`). ``kl_placement`` says where
    the penalty goes: into the per-token reward (PPO-RLHF: −β k1 at every token, eq-rlhf-token-reward), or into
    the loss (GRPO: +β k3 per token, eq-grpo-objective, in :func:`rlbook.losses.policy_loss`)."""

    def __init__(self, config: RLConfig):
        self.config, self.coef = config, config.beta

    @property
    def in_loss(self) -> float:
        """β when the KL is in the loss, else 0."""
        return self.coef if self.config.kl_placement == "loss" else 0.0

    @property
    def in_reward(self) -> float:
        """β when the KL is in the reward, else 0."""
        return self.coef if self.config.kl_placement == "reward" else 0.0

    def rewards(self, scores: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The (B, T) per-token rewards (:func:`rlbook.objectives.rlhf_token_rewards`: each completion's score
        at its last token, −β k1 at every token when the KL is in the reward) and the (B,) sequence rewards the
        advantage estimator reads (the scores themselves when the KL is not in the reward)."""
        coef = self.in_reward
        token_rewards = rlhf_token_rewards(scores, old_logp, old_logp if ref_logp is None else ref_logp, mask,
                                           coef)
        return token_rewards, token_rewards.sum(-1) if coef else scores

    def metrics(self) -> dict:
        """``beta``, the coefficient this step used, when there is a reference (``beta > 0``)."""
        return {"beta": self.coef} if self.config.beta > 0 else {}

    def update(self, metrics: dict) -> None:
        """After a step, with ``adaptive_kl_target``: the next β from the step's KL per completion
        (``objective/kl``) and its ``num_completions`` (the same metrics on every process)."""
        c = self.config
        if c.adaptive_kl_target is not None:
            self.coef = adaptive_kl_coef(self.coef, metrics["objective/kl"], c.adaptive_kl_target,
                                         metrics["num_completions"], c.adaptive_kl_horizon)


class EntropyController:
    """The entropy bonus −c · mean_t H_t (eq-after-entropy-bonus) and, with ``use_adaptive_entropy``, Skywork-OR1's
    control of c (eq-after-adaptive-entropy, :func:`rlbook.objectives.adaptive_entropy_coef`).

    ``coef`` is c (it moves when ``use_adaptive_entropy``); ``last_entropy`` the mean token entropy of the last
    optimizer step over every process, which decides whether the adaptive bonus applies (inf: not before the
    first step); ``window`` this optimizer step's entropy sum and token count so far."""

    def __init__(self, config: RLConfig):
        self.config = config
        self.coef, self.last_entropy = config.entropy_coef, float("inf")
        self.window = [0.0, 0.0]

    @property
    def on(self) -> bool:
        """Whether the loss has the bonus: a coefficient, or adaptive control (which may raise it from 0)."""
        return self.config.entropy_coef != 0.0 or self.config.use_adaptive_entropy

    @property
    def applied(self) -> float:
        """The coefficient of this optimizer step's bonus: c; under adaptive control 0 unless the previous step's
        entropy was at or below ``entropy_target`` (as TRL)."""
        c = self.config
        return self.coef if not c.use_adaptive_entropy or self.last_entropy <= c.entropy_target else 0.0

    def bonus(self, entropies: torch.Tensor, tokens: torch.Tensor, accumulate: int) -> torch.Tensor:
        """One micro-batch's bonus term over ``tokens`` (bool, those the policy loss uses, as TRL;
        :func:`rlbook.objectives.entropy_bonus_loss`, divided by ``accumulate``); their entropies are counted
        into the window."""
        term = entropy_bonus_loss(entropies, tokens, self.applied, accumulate)
        self.window[0] += float((entropies.detach() * tokens).sum())
        self.window[1] += float(tokens.sum())
        return term

    def end_window(self, world: World, device: torch.device) -> None:
        """At an optimizer step's end: the step's mean token entropy (over every process) and, with
        ``use_adaptive_entropy``, the next step's coefficient."""
        c = self.config
        window = torch.tensor(self.window, dtype=torch.float64, device=device)
        if world.distributed:
            window = all_reduce_sum(window, world)
        self.window = [0.0, 0.0]
        if window[1] == 0:
            return
        self.last_entropy = float(window[0] / window[1])
        if c.use_adaptive_entropy:
            self.coef = adaptive_entropy_coef(
                self.coef, self.last_entropy, entropy_target=c.entropy_target,
                entropy_coef_delta=c.entropy_coef_delta, entropy_coef_min=c.entropy_coef_min,
                entropy_coef_max=c.entropy_coef_max)


def moved_too_far(step_kl: list[float], early_stop_kl: float | None, world: World, device: torch.device) -> bool:
    """Spinning Up's early stop (CleanRL's ``target_kl``): whether an optimizer step's mean ``approx_kl`` (one per
    micro-batch in ``step_kl``) passed 1.5 · ``early_stop_kl``, so that the policy has moved far enough from the
    one that sampled; never when ``early_stop_kl`` is None. Under torchrun every process decides on the mean over
    all of them."""
    if early_stop_kl is None:
        return False
    if world.distributed:
        kl = torch.tensor([sum(step_kl), len(step_kl)], dtype=torch.float64, device=device)
        kl = all_reduce_sum(kl, world).tolist()
        step_kl = [kl[0] / kl[1]] if kl[1] else []
    return bool(step_kl) and bool(np.mean(step_kl) > 1.5 * early_stop_kl)
