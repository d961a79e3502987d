"""The one training loop of the book: every policy-gradient algorithm for language models is a configuration of it.

    sample prompts -> generate G completions each -> score them -> advantages
        -> num_iterations passes of minibatch updates (gradient accumulation, gradient clipping) -> metrics

What changes between algorithms is small and lives elsewhere: the advantage (``advantage_estimator``: a
group baseline, leave-one-out, or GAE with a value model) and the loss's aggregation and clipping
(:func:`rlbook.objectives.policy_loss`). :func:`preset` names the combinations the chapters use.

Batch layout, with TRL's names: each step samples ``generation_batch_size = per_device_train_batch_size *
steps_per_generation`` completions (``/ num_generations`` prompts). A pass over them is ``steps_per_generation``
micro-batches of ``per_device_train_batch_size`` rows; the optimizer steps after every
``gradient_accumulation_steps`` micro-batches. ``steps_per_generation`` defaults to
``gradient_accumulation_steps`` (one optimizer step per pass, as in TRL); more gives PPO's several minibatch
updates per epoch. ``num_iterations`` passes reuse each rollout (PPO's epochs; TRL's mu).

Randomness comes from ``(seed, step)`` alone (prompts, sampling, minibatch order), so a run that is saved and
resumed continues exactly as one that was not, on the same machine.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rlbook.lm import autocast
from rlbook.lm.value import build_value_model, token_values
from rlbook.objectives import (
    adaptive_kl_coef,
    gae,
    gfpo_adaptive_k,
    gfpo_keep_mask,
    group_advantages,
    kl_estimate,
    lambda_grpo_weights,
    leave_one_out_advantages,
    length_adaptive_lam,
    masked_mean,
    masked_whiten,
    policy_loss,
    rlhf_token_rewards,
    value_loss,
)
from rlbook.rollout import RolloutBatch, concat_rollouts, generate_rollouts, sequence_logprobs
from rlbook.sft import sampled_accuracy
from rlbook.tasks import Task
from rlbook.tasks.shaping import soft_overlong_penalty

ADVANTAGE_ESTIMATORS = ("reinforce", "group_mean", "rloo", "grpo", "gae")


@dataclass
class RLConfig:
    """Every knob of :class:`Trainer`; names are TRL's where the concept is the same."""

    # sampling
    num_generations: int = 8  # G completions per prompt
    max_completion_length: int = 16
    temperature: float = 1.0
    # batch layout (see the module docstring)
    per_device_train_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    steps_per_generation: int | None = None  # None: gradient_accumulation_steps
    num_iterations: int = 1
    # optimisation
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # advantages and loss
    advantage_estimator: str = "grpo"
    scale_rewards: str = "group"  # for "grpo": "group", "batch" or "none"
    loss_type: str = "bnpo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0  # KL to the reference: in the loss (k3), or in the reward (k1) for "gae"
    importance_sampling_level: str = "token"  # "sequence": GSPO's sequence ratio; "sequence_token": GSPO-token
    # GFPO: sample num_generations, keep gfpo_k per prompt (shortest, or most reward per token), advantages over those
    gfpo_k: int | None = None
    gfpo_metric: str = "length"
    gfpo_adaptive: bool = False  # Adaptive Difficulty: k per prompt from its difficulty (see gfpo_adaptive_k)
    # λ-GRPO: token losses weighted by f_i = G softmax_i(h_i^λ) of the standardised lengths (lambda_grpo_weights),
    # with λ a parameter learned by its own AdamW group from the same loss (0: a fixed λ); r is fixed
    lambda_grpo: bool = False
    lambda_init: float = 0.0  # λ = 0 starts as DAPO's token mean
    lambda_learning_rate: float = 1e-2
    lambda_r: float = 0.3  # h_i = 1 + r z_i; r < sqrt(G)/(G - 1) keeps h > 0 in every group
    # DAPO's techniques (each off by default)
    mask_truncated_completions: bool = False  # overlong filtering: no loss on completions cut at the budget
    overlong_buffer_length: int | None = None  # soft overlong punishment: L_cache of the ramp before the budget
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal and sample new ones in their place
    max_num_gen_batches: int = 4  # dynamic sampling: generation rounds per step at most (the first included)
    # PPO (advantage_estimator="gae")
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.1
    cliprange_value: float | None = 0.2
    whiten_advantages: bool = True
    value_init: str = "policy"
    # KL control (implementation practice, not the PPO paper: erratum E3)
    kl_target: float | None = None  # adaptive KL controller (Ziegler et al. 2019): beta adapts toward this KL
    kl_horizon: int = 10_000  # ... by at most 20 % per kl_horizon completions
    target_kl: float | None = None  # early stop: end this rollout's updates once approx_kl > 1.5 * target_kl
    # VAPO (advantage_estimator="gae")
    lam_critic: float | None = None  # decoupled GAE: the value targets' lambda (VAPO: 1.0); None: lam
    lam_alpha: float | None = None  # length-adaptive lambda for the policy, 1 - 1/(alpha * l) (VAPO: 0.05)
    nll_coef: float = 0.0  # VAPO's mu: + mu * token-mean NLL of the correct completions
    value_pretrain_steps: int = 0  # VAPO: fit the value model alone on the initial policy's rollouts first
    # the run
    max_steps: int = 100
    seed: int = 0
    eval_every: int = 0  # 0: never; else held-out sampled accuracy every eval_every steps
    eval_size: int = 128

    def __post_init__(self):
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        for name in ("num_generations", "max_completion_length", "per_device_train_batch_size",
                     "gradient_accumulation_steps", "steps_per_generation", "num_iterations", "max_steps",
                     "eval_size", "max_num_gen_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown advantage_estimator {self.advantage_estimator!r}; "
                             f"choose one of {ADVANTAGE_ESTIMATORS}")
        if self.generation_batch_size % self.num_generations:
            raise ValueError(f"the generation batch (per_device_train_batch_size * steps_per_generation = "
                             f"{self.generation_batch_size}) must be a multiple of num_generations "
                             f"({self.num_generations})")
        if self.steps_per_generation % self.gradient_accumulation_steps:
            raise ValueError(f"steps_per_generation ({self.steps_per_generation}) must be a multiple of "
                             f"gradient_accumulation_steps ({self.gradient_accumulation_steps})")
        if self.advantage_estimator in ("rloo", "grpo") and self.num_generations < 2:
            raise ValueError(f"advantage_estimator={self.advantage_estimator!r} needs num_generations >= 2")
        if not self.learning_rate > 0 or not self.temperature > 0:
            raise ValueError(f"learning_rate and temperature must be positive, got {self.learning_rate} and "
                             f"{self.temperature}")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"gamma and lam must lie in [0, 1], got {self.gamma} and {self.lam}")
        if not self.epsilon > 0 or (self.epsilon_high is not None and not self.epsilon_high > 0):
            raise ValueError(f"epsilon and epsilon_high must be positive, got {self.epsilon} and {self.epsilon_high}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.overlong_buffer_length is not None and not 1 <= self.overlong_buffer_length <= self.max_completion_length:
            raise ValueError(f"overlong_buffer_length must lie in [1, max_completion_length = "
                             f"{self.max_completion_length}], got {self.overlong_buffer_length}")
        if self.lam_critic is not None and not 0 <= self.lam_critic <= 1:
            raise ValueError(f"lam_critic must lie in [0, 1], got {self.lam_critic}")
        if self.lam_alpha is not None and not self.lam_alpha > 0:
            raise ValueError(f"lam_alpha must be positive, got {self.lam_alpha}")
        for name in ("kl_target", "target_kl"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive or None, got {getattr(self, name)}")
        if self.nll_coef < 0 or self.value_pretrain_steps < 0 or self.kl_horizon < 1:
            raise ValueError(f"nll_coef and value_pretrain_steps must be >= 0 and kl_horizon >= 1, got "
                             f"{self.nll_coef}, {self.value_pretrain_steps}, {self.kl_horizon}")
        if self.advantage_estimator != "gae" and (self.lam_critic is not None or self.lam_alpha is not None
                                                  or self.value_pretrain_steps):
            raise ValueError("lam_critic, lam_alpha and value_pretrain_steps need advantage_estimator='gae'")
        if self.gfpo_k is not None and not 1 <= self.gfpo_k <= self.num_generations:
            raise ValueError(f"gfpo_k must lie in [1, num_generations = {self.num_generations}], got {self.gfpo_k}")
        if (self.gfpo_k is not None or self.gfpo_adaptive) and self.advantage_estimator != "grpo":
            raise ValueError("GFPO filtering (gfpo_k, gfpo_adaptive) needs advantage_estimator='grpo'")
        if self.lambda_grpo:
            if self.advantage_estimator != "grpo" or self.loss_type == "gmpo" or self.num_generations < 2:
                raise ValueError("lambda_grpo needs advantage_estimator='grpo', a token-level loss_type (not 'gmpo') "
                                 "and num_generations >= 2")
            for name in ("lambda_init", "lambda_learning_rate", "lambda_r"):
                if not np.isfinite(getattr(self, name)):
                    raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
            if self.lambda_learning_rate < 0 or not self.lambda_r > 0:
                raise ValueError(f"lambda_learning_rate must be >= 0 (0: a fixed lambda) and lambda_r positive, got "
                                 f"{self.lambda_learning_rate} and {self.lambda_r}")
        if self.dynamic_sampling and self.num_generations < 2:
            raise ValueError("dynamic_sampling needs num_generations >= 2 (a group of one always has equal rewards)")

    @property
    def generation_batch_size(self) -> int:
        """Completions sampled per step."""
        return self.per_device_train_batch_size * self.steps_per_generation

    @property
    def num_prompts(self) -> int:
        """Prompts per step."""
        return self.generation_batch_size // self.num_generations


PRESETS: dict[str, dict] = {
    # REINFORCE: the policy gradient itself. One on-policy update per rollout (the ratio is 1 and the clip never
    # acts), summed over tokens (dr_grpo's constant denominator keeps the sum's direction), no baseline.
    "reinforce": dict(advantage_estimator="reinforce", loss_type="dr_grpo", num_iterations=1),
    "reinforce_baseline": dict(advantage_estimator="group_mean", loss_type="dr_grpo", num_iterations=1),
    "rloo": dict(advantage_estimator="rloo", loss_type="dr_grpo", num_iterations=1),
    # PPO-Clip with GAE and a value model; TRL's PPO defaults: 4 epochs, gamma 1, lambda 0.95, vf_coef 0.1,
    # value clip 0.2, whitened advantages, token-mean loss.
    "ppo": dict(advantage_estimator="gae", loss_type="bnpo", num_iterations=4, gamma=1.0, lam=0.95, vf_coef=0.1,
                cliprange_value=0.2, whiten_advantages=True),
    # GRPO as in DeepSeekMath: group z-scores, per-completion token means averaged over the group, k3 KL in the
    # loss with beta 0.04, one update per rollout. TRL's GRPOConfig defaults differ: loss_type "dapo", beta 0.
    "grpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="grpo", beta=0.04, epsilon=0.2),
    # Dr. GRPO: no std scaling, and a constant normaliser (B * max_completion_length) instead of |o_i|.
    "dr_grpo": dict(advantage_estimator="grpo", scale_rewards="none", loss_type="dr_grpo", beta=0.0, epsilon=0.2),
    # DAPO: clip-higher (0.2 / 0.28), token-level loss, no KL, dynamic sampling, overlong filtering and soft
    # overlong punishment (the paper's buffer is 4,096 of 20,480 tokens; here a quarter of the budget).
    "dapo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="dapo", beta=0.0, epsilon=0.2,
                 epsilon_high=0.28, dynamic_sampling=True, mask_truncated_completions=True),
    # VAPO's seven techniques: value pretraining, decoupled GAE (critic lambda 1), length-adaptive policy lambda
    # (alpha 0.05), token-level loss, clip-higher (0.2 / 0.28), NLL on correct completions (mu 0.1), and group
    # sampling (several completions per prompt: num_generations). Paper: 50 value-pretraining steps.
    "vapo": dict(advantage_estimator="gae", loss_type="dapo", epsilon=0.2, epsilon_high=0.28, gamma=1.0,
                 lam=0.95, lam_critic=1.0, lam_alpha=0.05, nll_coef=0.1, value_pretrain_steps=50,
                 whiten_advantages=True, num_iterations=1),
    # GSPO: one ratio per completion (the geometric mean of its token ratios), clipped in a tiny range (3e-4 / 4e-4),
    # no KL, and four minibatch updates per rollout so that the ratio is not trivially 1 (TRL's documented recipe).
    "gspo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="grpo", beta=0.0, epsilon=3e-4,
                 epsilon_high=4e-4, importance_sampling_level="sequence", gradient_accumulation_steps=1,
                 steps_per_generation=4),
    # GMPO: the geometric mean of token ratios clipped in log space (epsilon 0.4: ratios in (0.67, 1.49)), no KL.
    "gmpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="gmpo", beta=0.0, epsilon=0.4,
                 epsilon_high=0.4),
    # GFPO: sample 16, keep the 8 shortest per prompt, advantages over the kept ones, DAPO's token-level loss.
    "gfpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="dapo", beta=0.0, num_generations=16,
                 gfpo_k=8, gfpo_metric="length"),
    # λ-GRPO: DAPO's token-level loss with learnable length-based response weights. The paper does not give (in
    # what we could read) λ's start, its learning rate, r or the clip; our assumptions: λ starts at 0 (DAPO), AdamW
    # with lr 1e-2 on λ alone (no weight decay, no gradient clipping), r = 0.3 fixed, ε = 0.2, no KL.
    "lambda_grpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="dapo", beta=0.0, epsilon=0.2,
                        lambda_grpo=True, lambda_init=0.0, lambda_learning_rate=1e-2, lambda_r=0.3),
}


def preset(name: str, **overrides) -> RLConfig:
    """An :class:`RLConfig` with the named algorithm's settings (see :data:`PRESETS`), then ``overrides``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    settings = {**PRESETS[name], **overrides}
    if name == "dapo" and "overlong_buffer_length" not in overrides:
        settings["overlong_buffer_length"] = max(1, settings.get("max_completion_length", 16) // 4)
    return RLConfig(**settings)


class Trainer:
    """Trains ``policy`` on ``task``'s rule-based reward (or ``reward_fn``) with the algorithm in ``config``.

    ``reward_fn(examples, completions, truncated) -> (B,) array`` replaces the task's reward (e.g. a reward model).
    A frozen copy of the initial policy is the reference when ``beta > 0``; a value model is built when the
    advantage estimator is ``"gae"`` (or pass one). Metrics of every step are kept in ``history`` and, with
    ``log_file``, written as JSON lines.
    """

    def __init__(self, policy, tokenizer, task: Task, config: RLConfig, *, value_model=None, reward_fn=None,
                 log_file: str | Path | None = None):
        self.policy, self.tokenizer, self.task, self.config = policy, tokenizer, task, config
        self.device = next(policy.parameters()).device
        self.reward_fn = reward_fn or task.rewards
        self.reference = _frozen_copy(policy) if config.beta > 0 else None
        if config.advantage_estimator == "gae" and value_model is None:
            value_model = build_value_model(policy, init=config.value_init, seed=config.seed)
        self.value_model = value_model if config.advantage_estimator == "gae" else None
        params = list(policy.parameters()) + (list(self.value_model.parameters()) if self.value_model else [])
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.lam = None  # λ-GRPO's learnable λ: its own parameter group, outside the gradient clipping
        if config.lambda_grpo:
            self.lam = torch.nn.Parameter(torch.tensor(config.lambda_init, device=self.device))
            self.optimizer.add_param_group({"params": [self.lam], "lr": config.lambda_learning_rate,
                                            "weight_decay": 0.0, "name": "lambda"})
        self.kl_coef = config.beta  # moves when kl_target is set (adaptive KL controller)
        self.value_pretrain_history: list[dict] = []
        self.step = 0
        self.history: list[dict] = []
        self.log_file = Path(log_file) if log_file else None
        self._held_out = task.sample(config.eval_size, seed=np.random.default_rng([config.seed, 10**6]), split="test")

    # --- one step -------------------------------------------------------------------------------------------

    def train(self, steps: int | None = None, progress: bool = True) -> list[dict]:
        """Run ``steps`` more steps (default: up to ``config.max_steps``); returns the whole ``history``."""
        steps = self.config.max_steps - self.step if steps is None else steps
        if self.step == 0 and self.config.value_pretrain_steps and not self.value_pretrain_history:
            self.pretrain_value(self.config.value_pretrain_steps)
        bar = tqdm(range(steps), desc="RL", disable=not progress, mininterval=1.0)
        for _ in bar:
            metrics = self.train_step()
            bar.set_postfix(reward=f"{metrics['reward']:.3f}", kl=f"{metrics.get('kl_ref', 0.0):.4f}",
                            gen=f"{metrics['time_generate']:.2f}s", upd=f"{metrics['time_update']:.2f}s")
        return self.history

    def train_with_eval_curve(self) -> tuple[list[int], list[float]]:
        """Measure held-out accuracy, train up to ``max_steps``, and return the accuracy curve ``(steps,
        accuracies)``, its first point at the starting step: what the experiments store and the chapters plot.
        Needs ``eval_every`` for points after the first."""
        first = len(self.history)
        steps, accuracies = [self.step], [self.evaluate()]
        self.train(progress=False)
        for metrics in self.history[first:]:
            if "eval_accuracy" in metrics:
                steps.append(metrics["step"])
                accuracies.append(metrics["eval_accuracy"])
        return steps, accuracies

    def train_step(self) -> dict:
        """Sample, score, compute advantages, update; returns this step's metrics."""
        config = self.config
        timer = time.perf_counter()
        batch, examples, rewards, round_metrics = self._sample_groups(self.step)
        time_generate = time.perf_counter() - timer - round_metrics.pop("time_score")

        timer = time.perf_counter()
        rollout = self._score(batch, examples, rewards)
        time_score = time.perf_counter() - timer

        timer = time.perf_counter()
        update_metrics = self._update(rollout)
        time_update = time.perf_counter() - timer

        beta_used = self.kl_coef
        if config.kl_target is not None and "kl_ref_sequence" in rollout["metrics"]:
            self.kl_coef = adaptive_kl_coef(self.kl_coef, rollout["metrics"]["kl_ref_sequence"], config.kl_target,
                                            len(batch), config.kl_horizon)
        rewards = rollout["rewards"]

        metrics = {
            "step": self.step + 1,
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "accuracy": float(rollout["correct"].float().mean()),  # the task's rule, whatever reward_fn is
            "completion_length": float(batch.lengths.float().mean()),
            "truncated_frac": float(batch.truncated.float().mean()),
            **round_metrics,
            **rollout["metrics"],
            **update_metrics,
            **({"beta": beta_used} if config.beta > 0 else {}),
            **({"lambda": float(self.lam.detach())} if self.lam is not None else {}),
            "time_generate": time_generate,
            "time_score": time_score,
            "time_update": time_update,
        }
        self.step += 1
        if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.max_steps):
            metrics["eval_accuracy"] = self.evaluate()
        self.history.append(metrics)
        if self.log_file:
            with self.log_file.open("a") as f:
                f.write(json.dumps(metrics) + "\n")
        return metrics

    def _sample_groups(self, step: int):
        """``(batch, examples, task rewards, metrics)`` for this step's ``num_prompts`` groups.

        With ``dynamic_sampling`` (DAPO), groups whose rewards are all equal (all right or all wrong: their
        advantages are 0, they teach nothing) are dropped and new prompts are sampled in their place, for at most
        ``max_num_gen_batches`` rounds; if the rounds run out, the step trains on the groups it has (fewer, but
        never an all-equal one unless no round found any other). ``frac_reward_zero_std`` is measured on the first
        round, before any filtering.
        """
        config, G = self.config, self.config.num_generations
        kept_batches, kept_examples, kept_rewards, time_score = [], [], [], 0.0
        for round_ in range(config.max_num_gen_batches if config.dynamic_sampling else 1):
            prompt_seed = [config.seed, step] + ([round_] if round_ else [])
            examples = self.task.sample(config.num_prompts, split="train", seed=np.random.default_rng(prompt_seed))
            with autocast(self.device):
                batch = generate_rollouts(self.policy, self.tokenizer, [e.prompt for e in examples],
                                          num_generations=G, max_new_tokens=config.max_completion_length,
                                          temperature=config.temperature,
                                          seed=_seed(config.seed, step, round_), device=self.device)
            timer = time.perf_counter()
            rewards = self._rewards(examples, batch)
            time_score += time.perf_counter() - timer
            informative = rewards.reshape(-1, G).std(-1) > 0
            if round_ == 0:
                first = (batch, examples, rewards)
                metrics = {"frac_reward_zero_std": float(np.mean(~informative))}
            if not config.dynamic_sampling:
                break
            keep = np.flatnonzero(informative)[: config.num_prompts - sum(len(e) for e in kept_examples)]
            kept_batches.append(batch.select_groups(keep))
            kept_examples.append([examples[i] for i in keep])
            kept_rewards.append(rewards.reshape(-1, G)[keep].reshape(-1))
            if sum(len(e) for e in kept_examples) == config.num_prompts:
                break
        metrics["time_score"] = time_score
        if not config.dynamic_sampling or not sum(len(e) for e in kept_examples):
            if config.dynamic_sampling:
                metrics.update(gen_rounds=round_ + 1, num_groups=0)
            return (*first, metrics)
        metrics.update(gen_rounds=round_ + 1, num_groups=sum(len(e) for e in kept_examples))
        batch = concat_rollouts([b for b in kept_batches if len(b)], self.tokenizer.pad_token_id)
        return batch, [e for part in kept_examples for e in part], np.concatenate(kept_rewards), metrics

    def _rewards(self, examples, batch: RolloutBatch, reward_fn=None) -> np.ndarray:
        """``reward_fn``'s (default: the trainer's) reward of every completion, (B,) float64; non-finite rewards
        are an error."""
        repeated = [e for e in examples for _ in range(self.config.num_generations)]
        reward_fn = reward_fn or self.reward_fn
        rewards = np.asarray(reward_fn(repeated, batch.decode_completions(self.tokenizer), batch.truncated.tolist()),
                             dtype=np.float64)
        if rewards.shape != (len(batch),) or not np.isfinite(rewards).all():
            raise ValueError(f"the reward function must return {len(batch)} finite rewards, got shape "
                             f"{rewards.shape} with {int((~np.isfinite(rewards)).sum())} non-finite")
        return rewards

    @torch.no_grad()
    def evaluate(self, examples=None) -> float:
        """Sampled accuracy (one completion each, at the training temperature) on held-out test problems."""
        examples = self._held_out if examples is None else examples
        accuracy = sampled_accuracy(self.policy, self.tokenizer, self.task, examples,
                                    self.config.max_completion_length, seed=_seed(self.config.seed, -1, 0))
        return accuracy

    # --- scoring: advantages and the old policy's numbers ---------------------------------------------------

    @torch.no_grad()
    def _score(self, batch: RolloutBatch, examples, rewards: np.ndarray) -> dict:
        """Everything the update needs from one rollout: old log-probs (and the reference's and the critic's),
        the rewards after shaping, the task's verdict, and the advantages."""
        config = self.config
        mask = batch.completion_mask.float()
        input_ids, attention_mask = batch.input_ids, batch.attention_mask
        out = {"input_ids": input_ids, "attention_mask": attention_mask, "mask": mask, "metrics": {},
               "lengths": mask.sum(-1)}
        # The task's rule decides what is correct, also when a reward model gives the reward (the gold metric).
        gold = rewards if self.reward_fn == self.task.rewards else self._rewards(examples, batch, self.task.rewards)
        out["correct"] = torch.as_tensor(gold == self.task.correct_reward, device=self.device)
        if config.overlong_buffer_length is not None:  # DAPO's soft overlong punishment, added to the reward
            rewards = rewards + soft_overlong_penalty(batch.lengths.cpu().numpy(), config.max_completion_length,
                                                      config.overlong_buffer_length)
        out["rewards"] = rewards
        scores = torch.as_tensor(rewards, dtype=torch.float32, device=self.device)
        # Overlong filtering (DAPO): a completion cut off at the budget gets no loss; its reward still counts in
        # its group's mean and std.
        out["loss_mask"] = mask * (~batch.truncated)[:, None] if config.mask_truncated_completions else mask
        with autocast(self.device):
            # The sampler's log-probs are the behaviour policy's; with several passes we recompute them with the
            # training forward pass, so that the first ratio is exactly 1 (as TRL does).
            if config.num_iterations > 1 or config.steps_per_generation > config.gradient_accumulation_steps:
                out["old_logp"] = sequence_logprobs(self.policy, input_ids, attention_mask, mask,
                                                    temperature=config.temperature)
            else:
                out["old_logp"] = batch.logprobs
            if self.reference is not None:
                out["ref_logp"] = sequence_logprobs(self.reference, input_ids, attention_mask, mask,
                                                    temperature=config.temperature)
                kl = kl_estimate(out["old_logp"], out["ref_logp"], "k1") * mask
                out["metrics"]["kl_ref"] = masked_mean(kl, mask).item()  # per token (k1)
                out["metrics"]["kl_ref_sequence"] = kl.sum(-1).mean().item()  # per completion: what kl_target aims at
            if self.value_model is not None:
                out["old_values"] = token_values(self.value_model, input_ids, attention_mask, mask)

        G = config.num_generations
        if config.advantage_estimator == "gae":
            # The score arrives at the last real token; with beta > 0, -beta * k1 at every token (InstructGPT and
            # TRL's PPO put the KL in the reward, GRPO puts it in the loss).
            ref_logp = out.get("ref_logp", out["old_logp"])
            token_rewards = rlhf_token_rewards(scores, out["old_logp"], ref_logp, mask, self.kl_coef)
            lam_policy = config.lam if config.lam_alpha is None else length_adaptive_lam(batch.lengths, config.lam_alpha)
            lam_critic = config.lam if config.lam_critic is None else config.lam_critic
            advantages, returns = gae(token_rewards, out["old_values"], mask, config.gamma, lam_policy)
            if config.lam_critic is not None or config.lam_alpha is not None:  # decoupled GAE (VAPO)
                _, returns = gae(token_rewards, out["old_values"], mask, config.gamma, lam_critic)
            out["returns"] = returns
            out["metrics"].update(_explained_variance(out["old_values"], returns, mask))
            if config.whiten_advantages:
                advantages = masked_whiten(advantages, mask)
        elif config.advantage_estimator == "reinforce":
            advantages = scores
        elif config.advantage_estimator == "group_mean":
            advantages = group_advantages(scores, G, scale_rewards="none")
        elif config.advantage_estimator == "rloo":
            advantages = leave_one_out_advantages(scores, G)
        elif config.gfpo_k is not None or config.gfpo_adaptive:
            lengths = batch.lengths.to(scores.device)
            k = gfpo_adaptive_k(scores, G) if config.gfpo_adaptive else config.gfpo_k
            keep = gfpo_keep_mask(scores, lengths, G, k, config.gfpo_metric)
            advantages = group_advantages(scores, G, scale_rewards=config.scale_rewards, keep_mask=keep)
            out["loss_mask"] = out["loss_mask"] * keep[:, None]  # the filtered-out completions are not trained on
            out["metrics"]["gfpo_kept_length"] = float(lengths[keep].float().mean())
        else:
            advantages = group_advantages(scores, G, scale_rewards=config.scale_rewards)
        out["advantages"] = advantages
        return out

    # --- the update -----------------------------------------------------------------------------------------

    def _update(self, rollout: dict, value_only: bool = False) -> dict:
        """``num_iterations`` passes over the rollout in shuffled minibatches, one optimizer step per
        ``gradient_accumulation_steps`` micro-batches; stops early once ``approx_kl`` passes 1.5 · ``target_kl``."""
        config = self.config
        B = rollout["mask"].shape[0]
        micro = config.per_device_train_batch_size
        accumulate = config.gradient_accumulation_steps
        generator = torch.Generator().manual_seed(_seed(config.seed, self.step))
        sums: dict[str, list[float]] = {}
        self.policy.train()
        if self.value_model is not None:
            self.value_model.train()
        optimizer_steps, stopped = 0, False
        for _ in range(config.num_iterations):
            order = torch.randperm(B, generator=generator).to(self.device)
            for start in range(0, B, micro * accumulate):
                rows_of_step = order[start : start + micro * accumulate]
                tokens_of_step = rollout["loss_mask"][rows_of_step].sum()  # dapo's num_items_in_batch
                self.optimizer.zero_grad(set_to_none=True)
                step_kl = []
                for micro_start in range(0, len(rows_of_step), micro):
                    rows = rows_of_step[micro_start : micro_start + micro]
                    metrics = self._micro_batch_backward(rollout, rows, tokens_of_step, accumulate, value_only)
                    for key, value in metrics.items():
                        sums.setdefault(key, []).append(value)
                    step_kl += [metrics["approx_kl"]] if "approx_kl" in metrics else []
                params = [p for group in self.optimizer.param_groups if group.get("name") != "lambda"
                          for p in group["params"] if p.grad is not None]
                if params:
                    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                    sums.setdefault("grad_norm", []).append(grad_norm.item())
                    self.optimizer.step()
                    optimizer_steps += 1
                # Early stopping on KL (Spinning Up's PPO): the policy has moved far enough from the one that sampled.
                if config.target_kl is not None and step_kl and np.mean(step_kl) > 1.5 * config.target_kl:
                    stopped = True
                    break
            if stopped:
                break
        self.policy.eval()
        if self.value_model is not None:
            self.value_model.eval()
        reduced = {key: float(np.mean(values)) for key, values in sums.items()}
        for key in ("ratio_min", "ratio_max"):  # extremes over the whole update, not means of extremes
            if key in sums:
                reduced[key] = float((np.min if key == "ratio_min" else np.max)(sums[key]))
        reduced["optimizer_steps"] = optimizer_steps
        if config.target_kl is not None:
            reduced["early_stopped"] = float(stopped)
        return reduced

    def _micro_batch_backward(self, rollout, rows, tokens_of_step, accumulate, value_only=False) -> dict:
        config = self.config
        if self.value_model is None:  # rows without a loss token (GFPO's filtered-out, DAPO's overlong) add nothing
            rows = rows[rollout["loss_mask"][rows].any(-1)]
        mask, loss_mask = rollout["mask"][rows], rollout["loss_mask"][rows]
        input_ids, attention_mask = rollout["input_ids"][rows], rollout["attention_mask"][rows]
        metrics, loss = {}, torch.zeros((), device=self.device)
        with autocast(self.device):
            if not value_only and bool(loss_mask.any()):  # else every completion here was filtered out
                logp = sequence_logprobs(self.policy, input_ids, attention_mask, mask, temperature=config.temperature)
                kl_in_loss = self.kl_coef if config.advantage_estimator != "gae" else 0.0
                weights = None
                if self.lam is not None:  # λ-GRPO: weights of whole groups (all rows), then this micro-batch's
                    weights = lambda_grpo_weights(rollout["lengths"], config.num_generations, self.lam,
                                                  config.lambda_r)[rows]
                loss, metrics = policy_loss(
                    logp, rollout["old_logp"][rows], rollout["advantages"][rows], loss_mask,
                    epsilon=config.epsilon, epsilon_high=config.epsilon_high, loss_type=config.loss_type,
                    max_completion_length=config.max_completion_length, num_items_in_batch=tokens_of_step,
                    beta=kl_in_loss, ref_logp=rollout["ref_logp"][rows] if kl_in_loss else None,
                    importance_sampling_level=config.importance_sampling_level, response_weights=weights,
                )
                if config.loss_type != "dapo":  # dapo's denominator already counts the accumulated batch
                    loss = loss / accumulate
                metrics["policy_loss"] = loss.item()
                correct_tokens = loss_mask * rollout["correct"][rows, None]
                if config.nll_coef > 0 and bool(correct_tokens.any()):
                    # VAPO: imitate the correct completions too (a token-mean NLL over them only)
                    nll = -masked_mean(logp, correct_tokens)
                    loss = loss + config.nll_coef * nll / accumulate
                    metrics["nll_loss"] = nll.item()
            if self.value_model is not None:
                values = token_values(self.value_model, input_ids, attention_mask, mask)
                v_loss = value_loss(values, rollout["old_values"][rows], rollout["returns"][rows], mask,
                                    config.cliprange_value)
                loss = loss + config.vf_coef * v_loss / accumulate
                metrics["value_loss"] = v_loss.item()
        if loss.requires_grad:
            loss.backward()
        return metrics

    def pretrain_value(self, steps: int) -> list[dict]:
        """VAPO's value pretraining: ``steps`` rounds of sampling from the (frozen) current policy and fitting
        only the value model, to the targets of ``lam_critic`` (Monte Carlo returns at 1), so that PPO starts from
        a critic that already knows the task instead of one whose errors bias the first advantages."""
        if self.value_model is None:
            raise ValueError("pretrain_value needs a value model (advantage_estimator='gae')")
        for k in range(steps):
            pretrain_step = 10**6 + k  # its own seed stream, apart from the training steps'
            batch, examples, rewards, _ = self._sample_groups(pretrain_step)
            rollout = self._score(batch, examples, rewards)
            metrics = self._update(rollout, value_only=True)
            self.value_pretrain_history.append({"step": k + 1, **rollout["metrics"], **metrics})
        return self.value_pretrain_history

    # --- saving and resuming --------------------------------------------------------------------------------

    def save_checkpoint(self, path: str | Path) -> Path:
        """Everything needed to continue: weights, optimizer state, step, history and config."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "policy": self.policy.state_dict(),
            "value_model": self.value_model.state_dict() if self.value_model is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "history": self.history,
            "kl_coef": self.kl_coef,
            "lambda": self.lam.detach().clone() if self.lam is not None else None,
            "value_pretrain_history": self.value_pretrain_history,
            "config": dataclasses.asdict(self.config),
        }
        torch.save(state, path / "trainer_state.pt")
        return path

    def resume(self, path: str | Path) -> Trainer:
        """Load a :meth:`save_checkpoint` folder into this trainer (built with the same config) and continue."""
        state = torch.load(Path(path) / "trainer_state.pt", map_location=self.device, weights_only=False)
        if state["config"] != dataclasses.asdict(self.config):
            changed = sorted(k for k in state["config"] if state["config"][k] != dataclasses.asdict(self.config)[k])
            raise ValueError(f"the checkpoint was made with another config (differs in {changed})")
        self.policy.load_state_dict(state["policy"])
        if self.value_model is not None:
            self.value_model.load_state_dict(state["value_model"])
        if self.lam is not None:
            with torch.no_grad():
                self.lam.copy_(state["lambda"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.history, self.kl_coef = state["step"], state["history"], state["kl_coef"]
        self.value_pretrain_history = state["value_pretrain_history"]
        return self


def run_from_base_policy(task_name: str, preset_name: str, *, seed: int, max_steps: int, eval_every: int,
                         eval_size: int, logged: tuple[str, ...], **settings) -> dict:
    """One training run of preset ``preset_name`` (with ``settings``) from the shipped base policy of
    ``task_name``, recorded as the experiments store it: the config, the held-out accuracy curve, the per-step
    values of ``logged`` and the wall time. The completion budget defaults to the base policy's SFT budget."""
    from rlbook.checkpoints import RECIPES, load_base_policy  # imported here: the checkpoints need no trainer

    policy, tokenizer = load_base_policy(task_name)
    recipe = RECIPES[task_name]
    config = preset(preset_name, **{"max_completion_length": recipe.sft.max_new_tokens, **settings},
                    max_steps=max_steps, seed=seed, eval_every=eval_every, eval_size=eval_size)
    trainer = Trainer(policy, tokenizer, recipe.make_task(), config)
    start = time.perf_counter()
    eval_steps, eval_accuracy = trainer.train_with_eval_curve()
    return {
        "task": task_name, "seed": seed, "config": dict(vars(config)),
        "eval_steps": eval_steps, "eval_accuracy": eval_accuracy,
        "metrics": {key: [m.get(key) for m in trainer.history] for key in logged},
        "seconds": time.perf_counter() - start,
    }


def _seed(seed: int, step: int, round_: int = 0) -> int:
    """A distinct, reproducible seed for each (run seed, step, generation round)."""
    return int(np.random.default_rng([seed, step + 1, round_]).integers(2**62))


def _frozen_copy(model):
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict:
    """``{"explained_variance": 1 − Var(R − V) / Var(R)}`` over the masked tokens: 1 is a perfect critic, 0 no
    better than a constant. Empty when every return is the same (the ratio is undefined then)."""
    variance = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    if not variance > 0:
        return {}
    residual = returns - values
    residual_variance = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return {"explained_variance": float(1 - residual_variance / variance)}
