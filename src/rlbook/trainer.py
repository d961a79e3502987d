"""The one training loop of the book: every policy-gradient algorithm for language models is a configuration of it.

    sample N prompts, G completions each, and reward them      sample_rollout  -> Rollout
    old and reference log-probs, values, advantages            score           -> ScoredRollout
    num_iterations passes of minibatch updates                 update
    metrics, callbacks                                         train_step

What makes an algorithm lives elsewhere: its settings in :mod:`rlbook.presets`, its advantage estimator in
:mod:`rlbook.advantages`, its loss in :mod:`rlbook.objectives` (ratio, surrogate, aggregation). Experiments watch
or extend the loop through callbacks (:mod:`rlbook.callbacks`), never by overriding this class.

Randomness comes from ``(seed, step)`` alone (prompts, sampling, minibatch order), so a run that is saved and
resumed continues exactly as one that was not, on the same machine, and the arms of an experiment that share a
seed see the same prompts.

Under ``torchrun`` the same loop runs on every process: each samples its share of the step's groups, the
advantages are computed on the gathered batch, the models are wrapped in ``DistributedDataParallel`` and every
loss is divided by counts of the whole batch, so that the config means the same algorithm on any number of
processes (:mod:`rlbook.distributed` says how).
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path

import numpy as np
import torch

from rlbook.advantages import ESTIMATORS, VALUE_MODEL_ESTIMATORS, AdvantageInputs
from rlbook.callbacks import MetricsLogger, ProgressBar, TrainerCallback
from rlbook.distributed import (
    World,
    all_reduce_sum,
    average_grad,
    current_world,
    gather_rows,
    global_counts,
    global_share,
    loss_share,
    reduce_metrics,
    row_offsets,
    rows_of_rank,
    shard_groups,
)
from rlbook.files import read_checkpoint, restore_trainer_state, trainer_state, write_checkpoint
from rlbook.lm import adamw, autocast
from rlbook.losses import LossBatch, aggregation_of, policy_loss
from rlbook.lm.device import low_precision
from rlbook.lm.moe import expert_choices, is_moe, replay_routes, routers
from rlbook.lm.value import build_value_model, token_values
from rlbook.metrics import explained_variance, rollout_metrics
from rlbook.nonfinite import require_finite, require_finite_rewards, skip_nonfinite_groups
from rlbook.objectives import (
    adaptive_entropy_coef,
    adaptive_kl_coef,
    entropy_bonus_loss,
    high_entropy_mask,
    kl_estimate,
    lambda_grpo_weights,
    masked_mean,
    positive_example_nll,
    rlhf_token_rewards,
    sampler_importance_weights,
    value_loss,
)
from rlbook.presets import PRESETS, RLConfig, preset  # noqa: F401  (re-exported: rlbook.trainer.preset)
from rlbook.rollout import (
    Rollout,
    RolloutBatch,
    ScoredRollout,
    dynamic_sampling,
    generate_rollouts,
    informative_groups,
    sequence_logprobs,
)
from rlbook.sft import sampled_accuracy
from rlbook.tasks import Task
from rlbook.tasks.shaping import soft_overlong_penalty


class Trainer:
    """Trains ``policy`` on ``task``'s rule-based reward (or ``reward_fn``) with the algorithm in ``config``.

    ``reward_fn(examples, completions, truncated) -> (B,) array`` replaces the task's reward (e.g. a reward model);
    ``accuracy`` is still the task's rule. A frozen copy of the initial policy is the reference when ``beta > 0``;
    a value model is built when the advantage estimator needs one (or pass one). ``callbacks`` watch the loop
    (:class:`rlbook.callbacks.TrainerCallback`); ``log_file`` appends every step's metrics as a JSON line. The
    metrics of every step are kept in ``history``; :data:`rlbook.metrics.METRICS` explains each key.

    In a process group (``torchrun``; ``world`` defaults to :func:`rlbook.distributed.current_world`) every
    process builds the same trainer; only rank 0 writes logs and checkpoints.
    """

    def __init__(self, policy, tokenizer, task: Task, config: RLConfig, *, value_model=None,
                 reward_fn=None, callbacks: list[TrainerCallback] | tuple = (),
                 log_file: str | Path | None = None, world: World | None = None):
        self.policy, self.tokenizer, self.task, self.config = policy, tokenizer, task, config
        self.world = current_world() if world is None else world
        # this rank's groups of a step
        self._prompt_shard = shard_groups(config.num_prompts, self.world)
        self.device = next(policy.parameters()).device
        self.reward_fn = reward_fn or task.rewards
        for name in ("routing_replay", "router_learning_rate"):
            if getattr(config, name) not in (None, False) and not is_moe(policy):
                raise ValueError(f"{name} needs a mixture-of-experts policy, but "
                                 f"{type(policy).__name__} has no router; leave {name} unset")
        self.reference = _frozen_copy(policy) if config.beta > 0 else None
        if value_model is not None and not config.needs_value_model:
            raise ValueError(f"a value_model was given, but advantage_estimator="
                             f"{config.advantage_estimator!r} uses none; drop value_model or use "
                             f"an estimator that learns values {sorted(VALUE_MODEL_ESTIMATORS)}")
        if config.needs_value_model and value_model is None:
            value_model = build_value_model(policy, init=config.value_init, seed=config.seed)
        self.value_model = value_model
        # the trained models as one module, one forward per micro-batch: what DDP wraps
        self._learner = _Learner(policy, self.value_model)
        if self.world.distributed:
            self._learner = torch.nn.parallel.DistributedDataParallel(
                self._learner,
                find_unused_parameters=self.value_model is not None or is_moe(policy))
        params = list(policy.parameters()) + (list(self.value_model.parameters())
                                              if self.value_model else [])
        # a MoE's routers in their own group when they learn at their own rate
        gates = ([gate.weight for gate in routers(policy)]
                 if config.router_learning_rate is not None else [])
        groups = [{"params": [p for p in params if all(p is not g for g in gates)]}]
        if gates:
            groups.append({"params": gates, "lr": config.router_learning_rate, "name": "router"})
        self.optimizer = adamw(groups, lr=config.learning_rate,
                                           weight_decay=config.weight_decay)
        # λ-GRPO's learnable λ: its own parameter group, outside the clipping
        self.response_weight_lambda = None
        if config.lambda_grpo:
            self.response_weight_lambda = torch.nn.Parameter(
                torch.tensor(config.lambda_grpo_init, device=self.device))
            self.optimizer.add_param_group({"params": [self.response_weight_lambda],
                                            "weight_decay": 0.0,
                                            "lr": config.lambda_grpo_learning_rate,
                                            "name": "lambda"})
        self.kl_coef = config.beta  # moves when adaptive_kl_target is set
        # the entropy bonus's coefficient (moves when use_adaptive_entropy), and the mean token
        # entropy of the last optimizer step, which decides whether the adaptive bonus applies
        # (inf: not before the first step)
        self.entropy_coef, self.last_entropy = config.entropy_coef, float("inf")
        self._entropy_window = [0.0, 0.0]  # this optimizer step's entropy sum and token count
        self._covariance_generator = None  # Clip-Cov's draw, seeded per step in update()
        logger = [MetricsLogger(log_file)] if log_file and self.world.is_main else []
        self.callbacks = list(callbacks) + logger
        self.value_pretrain_history: list[dict] = []
        self.step = 0
        self.history: list[dict] = []
        self._held_out = task.sample(config.eval_size,
                                     seed=np.random.default_rng([config.seed, 10**6]), split="test")

    # --- the loop -------------------------------------------------------------------------------------------

    def train(self, steps: int | None = None, progress: bool = True) -> list[dict]:
        """Run ``steps`` more steps (default: up to ``config.max_steps``); returns the whole ``history``."""
        steps = self.config.max_steps - self.step if steps is None else steps
        if self.step == 0 and self.config.value_pretrain_steps and not self.value_pretrain_history:
            self.pretrain_value(self.config.value_pretrain_steps)
        bar = [ProgressBar(total=steps)] if progress and self.world.is_main else []
        self.callbacks += bar
        try:
            self._notify("on_train_begin")
            for _ in range(steps):
                self.train_step()
            self._notify("on_train_end")
        finally:
            for callback in bar:
                self.callbacks.remove(callback)
        return self.history

    def train_with_eval_curve(self) -> tuple[list[int], list[float]]:
        """Measure held-out accuracy, train up to ``max_steps``, and return the accuracy curve ``(steps,
        accuracies)``, its first point at the starting step. Needs ``eval_every`` for points after the first."""
        first = len(self.history)
        steps, accuracies = [self.step], [self.evaluate()]
        self.train(progress=False)
        for metrics in self.history[first:]:
            if "eval_accuracy" in metrics:
                steps.append(metrics["step"])
                accuracies.append(metrics["eval_accuracy"])
        return steps, accuracies

    def train_step(self) -> dict:
        """Sample, score, update; returns this step's metrics (also appended to ``history``)."""
        config = self.config
        timer = self._clock()
        rollout = self.sample_rollout(self.step)
        time_reward = rollout.metrics.pop("time/reward")
        time_generate = self._clock() - timer - time_reward
        extra = self._notify("on_rollout_end", rollout)

        timer = self._clock()
        scored = self.score(rollout)
        time_score = self._clock() - timer
        extra.update(self._notify("on_score_end", scored))

        timer = self._clock()
        update_metrics = self.update(scored)
        time_update = self._clock() - timer
        extra.update(self._notify("on_update_end", scored))

        beta_used = self.kl_coef
        metrics = {
            "step": self.step + 1,
            **rollout_metrics(rollout, scored),
            **rollout.metrics,
            **scored.metrics,
            **update_metrics,
            **extra,
            **({"beta": beta_used} if config.beta > 0 else {}),
            **({"lambda_grpo/lambda": float(self.response_weight_lambda.detach())}
               if self.response_weight_lambda is not None else {}),
            "time/generate": time_generate,
            "time/score": time_reward + time_score,
            "time/update": time_update,
        }
        metrics = reduce_metrics(metrics, self.world)  # the same numbers on every process
        if config.adaptive_kl_target is not None:  # the adaptive KL controller (Ziegler et al. 2019)
            self.kl_coef = adaptive_kl_coef(self.kl_coef, metrics["objective/kl"], config.adaptive_kl_target,
                                            metrics["num_completions"], config.adaptive_kl_horizon)
        self.step += 1
        if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.max_steps):
            metrics["eval_accuracy"] = self.evaluate()
        self.history.append(metrics)
        self._notify("on_step_end", metrics)
        return metrics

    def _clock(self) -> float:
        """Seconds, for the phases' timings; on a GPU after waiting for the work queued so far (CUDA runs
        asynchronously, so an unsynchronised clock charges one phase's kernels to the next)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _notify(self, hook: str, *args) -> dict:
        """Call ``hook`` of every callback; the metrics they return, merged."""
        merged = {}
        for callback in self.callbacks:
            merged.update(getattr(callback, hook)(self, *args) or {})
        return merged

    # --- sampling -------------------------------------------------------------------------------------------

    def sample_rollout(self, step: int) -> Rollout:
        """This step's ``num_prompts`` groups of ``num_generations`` completions, rewarded (DAPO: only groups whose
        rewards differ, see :func:`rlbook.rollout.dynamic_sampling`); this process's share of them under
        ``torchrun``."""
        config, G, shard = self.config, self.config.num_generations, self._prompt_shard
        time_reward, num_completions, groups_skipped = 0.0, 0, 0

        def sample_round(round_: int) -> Rollout:
            nonlocal time_reward, num_completions, groups_skipped
            prompt_seed = [config.seed, step] + ([round_] if round_ else [])
            examples = self.task.sample(config.num_prompts, split=config.train_split,
                                        seed=np.random.default_rng(prompt_seed))[shard]
            with autocast(self.device):
                batch = generate_rollouts(self.policy, self.tokenizer, [e.prompt for e in examples],
                                          num_generations=G, max_new_tokens=config.max_completion_length,
                                          temperature=config.sampling_temperature,
                                          seed=_seed(config.seed, step, round_, self.world.rank),
                                          device=self.device)
            timer = time.perf_counter()
            num_completions += len(batch)
            completions = batch.decode_completions(self.tokenizer)
            rewards = self._rewards(examples, completions, batch, step=step)
            rollout = Rollout(batch, examples, completions, rewards)
            time_reward += time.perf_counter() - timer
            if config.nonfinite_rewards == "skip_group":
                rollout, skipped = skip_nonfinite_groups(rollout, G, step)
                groups_skipped += skipped
            return rollout

        if config.dynamic_sampling:
            rollout = dynamic_sampling(sample_round, shard.stop - shard.start, config.max_num_gen_batches,
                                       self.tokenizer.pad_token_id)
        else:
            rollout = sample_round(0)
            rollout.metrics["frac_reward_zero_std"] = float(np.mean(~informative_groups(rollout.rewards, G)))
        rollout.metrics["time/reward"] = time_reward
        rollout.metrics["num_completions"] = num_completions
        if config.nonfinite_rewards == "skip_group":
            rollout.metrics["nonfinite_rewards/groups_skipped"] = groups_skipped
        return rollout

    def _per_completion(self, examples) -> list:
        """The prompts' examples repeated once per completion, in the rollout's row order (B,)."""
        return [e for e in examples for _ in range(self.config.num_generations)]

    def _rewards(self, examples, completions: list[str], batch: RolloutBatch, reward_fn=None,
                 step: int | None = None) -> np.ndarray:
        """``reward_fn``'s (default: the trainer's) reward of every completion, (B,) float64; a
        wrong shape is an error, and so is a non-finite reward unless ``nonfinite_rewards=
        "skip_group"`` (then the caller drops its group): it names the step (as metrics.jsonl counts
        them, from 1: the step being sampled is ``step + 1``) and the completion."""
        repeated = self._per_completion(examples)
        reward_fn = reward_fn or self.reward_fn
        rewards = np.asarray(reward_fn(repeated, completions, batch.truncated.tolist()),
                             dtype=np.float64)
        step = self.step if step is None else step
        if rewards.shape != (len(batch),):
            raise ValueError(f"step {step + 1}: the reward function must return {len(batch)} finite "
                             f"rewards, got shape {rewards.shape}")
        if self.config.nonfinite_rewards == "raise":
            require_finite_rewards(rewards, completions, step)
        return rewards

    @torch.no_grad()
    def evaluate(self, examples=None) -> float:
        """Sampled accuracy (one completion each, at ``config.temperature``) on held-out test problems (under
        ``torchrun``, each process samples a share of them)."""
        examples = self._held_out if examples is None else examples
        world = self.world
        if world.distributed:
            examples = examples[world.rank * len(examples) // world.size:
                                (world.rank + 1) * len(examples) // world.size]
        accuracy = sampled_accuracy(self.policy, self.tokenizer, self.task, examples,
                                    self.config.max_completion_length,
                                    seed=_seed(self.config.seed, -1, 0, world.rank),
                                    temperature=self.config.temperature) if examples else 0.0
        if world.distributed:
            correct, total = all_reduce_sum(torch.tensor([accuracy * len(examples), len(examples)],
                                                         dtype=torch.float64, device=self.device), world).tolist()
            accuracy = correct / total
        return accuracy

    # --- scoring: the old policy's numbers and the advantages ------------------------------------------------

    @torch.no_grad()
    def score(self, rollout: Rollout) -> ScoredRollout:
        """Old log-probs (and the reference's and the critic's), the rewards after shaping, the
        task's verdict, and the advantages of ``ESTIMATORS[config.advantage_estimator]``."""
        config, batch = self.config, rollout.batch
        mask = batch.completion_mask.float()
        input_ids, attention_mask = batch.input_ids, batch.attention_mask
        metrics = {}
        # The task's rule decides what is correct (the gold metric), also when a reward model or a
        # proxy with a bonus (Task.length_bonus) gives the reward.
        correct = torch.as_tensor([self.task.is_correct(e, c, t) for e, c, t in zip(
            self._per_completion(rollout.examples), rollout.completions, batch.truncated.tolist())],
            device=self.device)
        rewards = rollout.rewards
        # DAPO's soft overlong punishment, added to the reward
        if config.overlong_buffer_length is not None:
            rewards = rewards + soft_overlong_penalty(batch.lengths.cpu().numpy(),
                                                      config.max_completion_length,
                                                      config.overlong_buffer_length)
        scores = torch.as_tensor(rewards, dtype=torch.float32, device=self.device)
        # Overlong filtering (DAPO): a completion cut off at the budget gets no loss; its reward
        # still counts in its group's mean and std.
        loss_mask = (mask * (~batch.truncated)[:, None] if config.mask_truncated_completions
                     else mask)
        with autocast(self.device):
            # The sampler's log-probs are the behaviour policy's; with several updates per
            # rollout, a sampler at another temperature, or arithmetic below float32 (bf16
            # autocast on a GPU: the cached decode and the training forward round differently)
            # we recompute them with the training forward pass, so that the first ratio is
            # exactly 1 (as TRL does), unless old_logprobs="sampler". The sampler-mismatch
            # correction compares the two, so it always recomputes (as TRL does with vLLM).
            if config.old_logprobs == "learner" and (
                    config.num_iterations > 1
                    or config.steps_per_generation > config.gradient_accumulation_steps
                    or config.sampling_temperature != config.temperature
                    or config.vllm_importance_sampling_correction
                    or low_precision(self.policy)):
                old_logp = sequence_logprobs(self.policy, input_ids, attention_mask, mask,
                                             temperature=config.temperature)
            else:
                old_logp = batch.logprobs
            ref_logp = None
            if self.reference is not None:
                ref_logp = sequence_logprobs(self.reference, input_ids, attention_mask, mask,
                                             temperature=config.temperature)
                k1 = kl_estimate(old_logp, ref_logp, "k1") * mask
                metrics["objective/kl_per_token"] = masked_mean(k1, mask).item()
                # per completion: what the controller aims at
                metrics["objective/kl"] = k1.sum(-1).mean().item()
            old_values = (token_values(self.value_model, input_ids, attention_mask, mask)
                          if self.value_model else None)
            # Routing Replay: the experts pi_old sends every token to, reused by the updates
            routes = (expert_choices(self.policy, input_ids, attention_mask)
                      if config.routing_replay else None)

        # Where the KL penalty goes: into the per-token reward (PPO-RLHF: -beta k1 at every token),
        # or into the loss (GRPO: + beta k3 per token, in policy_loss).
        reward_kl_coef = self.kl_coef if config.kl_placement == "reward" else 0.0
        token_rewards = rlhf_token_rewards(scores, old_logp,
                                           old_logp if ref_logp is None else ref_logp, mask,
                                           reward_kl_coef)
        sequence_rewards = token_rewards.sum(-1) if reward_kl_coef else scores
        # The estimator sees the whole step's batch: under torchrun, every process's rows
        # gathered (batch-level scaling, whitening and filters then equal one process's), and
        # this process's rows taken back.
        world = self.world
        gathered = (gather_rows(x, world)
                    for x in (sequence_rewards, token_rewards, mask, batch.lengths))
        inputs = AdvantageInputs(*gathered, config.num_generations, gather_rows(old_values, world))
        estimate = ESTIMATORS[config.advantage_estimator](inputs, config)
        if estimate.returns is not None:
            variance_explained = explained_variance(inputs.values, estimate.returns, inputs.mask)
            metrics.update({} if variance_explained is None
                           else {"explained_variance": variance_explained})
        if world.distributed:
            estimate = rows_of_rank(estimate, row_offsets(len(batch), world), world, mask.shape[1])
        # the completions the estimator filtered out are not trained on (GFPO)
        if estimate.keep is not None:
            loss_mask = loss_mask * estimate.keep[:, None]
        metrics.update(estimate.metrics)
        # the sampler-mismatch correction: pi_old / pi_sampler per token or completion, truncated or
        # masked, a weight on each token's policy loss (TRL's vllm_importance_sampling_*)
        is_ratio = None
        if config.vllm_importance_sampling_correction:
            is_ratio = sampler_importance_weights(
                old_logp, batch.logprobs, mask, config.vllm_importance_sampling_mode,
                config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max)
            metrics.update(_sampling_metrics(old_logp, batch.logprobs, is_ratio, mask,
                                             config.vllm_importance_sampling_mode))
        return ScoredRollout(rollout, input_ids, attention_mask, mask, loss_mask, mask.sum(-1),
                             rewards, correct, old_logp, estimate.advantages, ref_logp, old_values,
                             estimate.returns, metrics, routes, sampler_logp=batch.logprobs,
                             importance_sampling_ratio=is_ratio)

    # --- the update -----------------------------------------------------------------------------------------

    def update(self, scored: ScoredRollout, value_only: bool = False) -> dict:
        """``num_iterations`` passes over the rollout in shuffled minibatches, one optimizer step
        per ``gradient_accumulation_steps`` micro-batches; stops early once ``approx_kl`` passes
        1.5 · ``early_stop_kl`` (Spinning Up's rule)."""
        config, world = self.config, self.world
        # Minibatches are drawn from one permutation of the step's global rows; under torchrun
        # each process computes the rows of a minibatch that it holds (global rows first ..
        # first + B_local - 1).
        offsets = row_offsets(scored.mask.shape[0], world)
        B, first, B_local = offsets[-1], offsets[world.rank], scored.mask.shape[0]
        micro, accumulate = config.per_device_train_batch_size, config.gradient_accumulation_steps
        generator = torch.Generator().manual_seed(_seed(config.seed, self.step))
        # Clip-Cov's random draw: its own stream (round 10**6 is no generation round's)
        self._covariance_generator = torch.Generator().manual_seed(
            _seed(config.seed, self.step, 10**6))
        sums: dict[str, list[float]] = {}
        models = [m for m in (self.policy, self.value_model) if m is not None]
        for model in models:
            model.train()
        optimizer_steps, stopped = 0, False
        for _ in range(config.num_iterations):
            order = torch.randperm(B, generator=generator).to(self.device)
            for start in range(0, B, micro * accumulate):
                rows_of_step = order[start : start + micro * accumulate]
                micro_batches = [rows_of_step[k : k + micro]
                                 for k in range(0, len(rows_of_step), micro)]
                counts = None
                if world.distributed:
                    micro_batches = [rows[(rows >= first) & (rows < first + B_local)] - first
                                     for rows in micro_batches]
                    counts = self._global_counts(scored, micro_batches)
                    # the "dapo" loss's num_items_in_batch: every process's loss tokens of this step
                    tokens_of_step = counts[:, 1].sum()
                else:
                    tokens_of_step = scored.loss_mask[rows_of_step].sum()
                self.optimizer.zero_grad(set_to_none=True)
                step_kl = []
                for k, rows in enumerate(micro_batches):
                    metrics = self._micro_batch_backward(scored, rows, tokens_of_step, value_only,
                                                         None if counts is None else counts[k])
                    for key, value in metrics.items():
                        sums.setdefault(key, []).append(value)
                    step_kl += [metrics["approx_kl"]] if "approx_kl" in metrics else []
                if world.distributed:
                    if self.response_weight_lambda is not None:  # trained outside DDP's module
                        average_grad(self.response_weight_lambda, world)
                    # every process decides on the mean over all of them
                    if config.early_stop_kl is not None:
                        kl = torch.tensor([sum(step_kl), len(step_kl)], dtype=torch.float64,
                                          device=self.device)
                        kl = all_reduce_sum(kl, world).tolist()
                        step_kl = [kl[0] / kl[1]] if kl[1] else []
                params = [p for group in self.optimizer.param_groups
                          if group.get("name") != "lambda"
                          for p in group["params"] if p.grad is not None]
                if params:
                    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                    require_finite("the gradient norm", grad_norm, self.step)
                    sums.setdefault("grad_norm", []).append(grad_norm.item())
                    self.optimizer.step()
                    optimizer_steps += 1
                if self._entropy_bonus_on and not value_only:
                    self._end_entropy_window()
                    # logged after the update, as TRL does
                    sums.setdefault("entropy_coef", []).append(self.entropy_coef)
                if (config.early_stop_kl is not None and step_kl
                        and np.mean(step_kl) > 1.5 * config.early_stop_kl):
                    stopped = True  # the policy has moved far enough from the one that sampled
                    break
            if stopped:
                break
        for model in models:
            model.eval()
        reduced = {key: float(np.mean(values)) for key, values in sums.items()}
        for key, extreme in (("ratio/min", np.min), ("ratio/max", np.max)):  # over the whole update
            if key in sums:
                reduced[key] = float(extreme(sums[key]))
        reduced["optimizer_steps"] = optimizer_steps
        if config.early_stop_kl is not None:
            reduced["early_stopped"] = float(stopped)
        return reduced

    @property
    def _entropy_bonus_on(self) -> bool:
        return self.config.entropy_coef != 0.0 or self.config.use_adaptive_entropy

    def _end_entropy_window(self) -> None:
        """At an optimizer step's end: the step's mean token entropy (over every process) and, with
        ``use_adaptive_entropy``, the next step's coefficient (:func:`rlbook.objectives.adaptive_entropy_coef`)."""
        config = self.config
        window = torch.tensor(self._entropy_window, dtype=torch.float64, device=self.device)
        if self.world.distributed:
            window = all_reduce_sum(window, self.world)
        self._entropy_window = [0.0, 0.0]
        if window[1] == 0:
            return
        self.last_entropy = float(window[0] / window[1])
        if config.use_adaptive_entropy:
            self.entropy_coef = adaptive_entropy_coef(
                self.entropy_coef, self.last_entropy, entropy_target=config.entropy_target,
                entropy_coef_delta=config.entropy_coef_delta, entropy_coef_min=config.entropy_coef_min,
                entropy_coef_max=config.entropy_coef_max)

    def _kept_rows(self, scored: ScoredRollout, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` without those that have no loss token (GFPO's filtered-out, DAPO's overlong), which add
        nothing, unless a value model still learns from them."""
        return rows if self.value_model is not None else rows[scored.loss_mask[rows].any(-1)]

    def _global_counts(self, scored: ScoredRollout, micro_batches: list[torch.Tensor]) -> torch.Tensor:
        """Under torchrun: the counts each micro-batch's losses divide by, of its kept rows over all processes,
        (k, 4) (:func:`rlbook.distributed.global_counts`)."""
        return global_counts(scored, [self._kept_rows(scored, rows) for rows in micro_batches], self.world)

    def _micro_batch_backward(self, scored: ScoredRollout, rows, tokens_of_step,
                              value_only=False, counts=None) -> dict:
        """The loss of one micro-batch (policy loss, VAPO's NLL, the value loss), backpropagated;
        its metrics. Under torchrun ``counts`` holds the micro-batch's counts over all processes
        (:meth:`_global_counts`), and each loss is rescaled from this process's count to them
        (:func:`rlbook.distributed.global_share`)."""
        config, accumulate, world = self.config, self.config.gradient_accumulation_steps, self.world
        rows = self._kept_rows(scored, rows)
        if counts is not None:
            if counts[0] == 0:  # no process has a row to learn from: no backward anywhere
                return {}
            if len(rows) == 0:  # others have: a forward DDP can wait on, whose gradient is 0
                return self._empty_backward(scored, value_only)
        mask, loss_mask = scored.mask[rows], scored.loss_mask[rows]
        input_ids, attention_mask = scored.input_ids[rows], scored.attention_mask[rows]
        metrics, loss = {}, torch.zeros((), device=self.device)
        # no policy loss when every completion here was filtered out
        with_policy = not value_only and bool(loss_mask.any())
        with_entropy = with_policy and (config.top_entropy_quantile < 1.0 or self._entropy_bonus_on)
        with autocast(self.device):
            routes = None if scored.routes is None else scored.routes[:, rows]
            logp, values, entropies = self._learner(
                input_ids, attention_mask, mask, config.temperature, with_policy=with_policy,
                routes=routes, with_entropy=with_entropy)
            if with_policy:
                require_finite("the policy's log-probs (logp)", logp[loss_mask.bool()], self.step)
                # the high-entropy minority: the tokens that keep their policy loss
                entropy_mask = (high_entropy_mask(entropies, loss_mask, config.top_entropy_quantile)
                                if config.top_entropy_quantile < 1.0 else None)
                kl_in_loss = self.kl_coef if config.kl_placement == "loss" else 0.0
                weights = None
                # λ-GRPO: the weights of whole groups, then these rows'
                if self.response_weight_lambda is not None:
                    weights = lambda_grpo_weights(scored.lengths, config.num_generations,
                                                  self.response_weight_lambda,
                                                  config.lambda_grpo_r)[rows]
                batch = LossBatch(
                    logp, scored.old_logp[rows], scored.advantages[rows], loss_mask,
                    ref_logp=scored.ref_logp[rows] if kl_in_loss else None,
                    sampler_logp=(scored.sampler_logp[rows]
                                  if config.off_policy_mask_threshold is not None else None),
                    importance_sampling_ratio=(None if scored.importance_sampling_ratio is None
                                               else scored.importance_sampling_ratio[rows]),
                    entropy_mask=entropy_mask, response_weights=weights,
                    num_items_in_batch=tokens_of_step, generator=self._covariance_generator)
                loss, metrics = policy_loss(batch, config, kl_in_loss)
                require_finite("the policy loss", loss, self.step)
                metrics["loss/policy"] = loss.item()
                if counts is not None:  # this process's share of the loss over all processes' rows
                    loss = loss * loss_share(aggregation_of(config).divides_by, len(rows),
                                             loss_mask.sum(), counts, world)
                if self._entropy_bonus_on:  # over the tokens the policy loss uses, as TRL
                    tokens = loss_mask.bool() if entropy_mask is None else entropy_mask
                    adaptive = config.use_adaptive_entropy
                    applied = (self.entropy_coef if not adaptive
                               or self.last_entropy <= config.entropy_target else 0.0)
                    loss = loss + entropy_bonus_loss(entropies, tokens, applied, accumulate)
                    self._entropy_window[0] += float((entropies.detach() * tokens).sum())
                    self._entropy_window[1] += float(tokens.sum())
                nll = (positive_example_nll(logp, loss_mask, scored.correct[rows])
                       if config.nll_coef > 0 else None)
                if nll is not None:  # VAPO: imitate the correct completions too
                    metrics["loss/nll"] = nll.item()
                    if counts is not None:
                        correct_tokens = (loss_mask * scored.correct[rows, None]).sum()
                        nll = nll * global_share(correct_tokens, counts[2], world)
                    loss = loss + config.nll_coef * nll / accumulate
            if values is not None:
                v_loss = value_loss(values, scored.old_values[rows], scored.returns[rows], mask,
                                    config.cliprange_value)
                require_finite("the value loss", v_loss, self.step)
                metrics["loss/value"] = v_loss.item()
                if counts is not None:
                    v_loss = v_loss * global_share(mask.sum(), counts[3], world)
                loss = loss + config.vf_coef * v_loss / accumulate
        if loss.requires_grad:
            loss.backward()
        return metrics

    def _empty_backward(self, scored: ScoredRollout, value_only: bool) -> dict:
        """Under torchrun, a micro-batch that holds none of this process's rows while others' hold some: DDP
        averages gradients over every process, so this one runs a forward on one of its rows and backpropagates
        zero times its output."""
        row = torch.zeros(1, dtype=torch.long, device=self.device)
        with autocast(self.device):
            outputs = self._learner(scored.input_ids[row], scored.attention_mask[row], scored.mask[row],
                                    self.config.temperature, with_policy=not value_only,
                                    routes=None if scored.routes is None else scored.routes[:, row])
        sum(0.0 * out.sum() for out in outputs if out is not None).backward()
        return {}

    def pretrain_value(self, steps: int) -> list[dict]:
        """VAPO's value pretraining: ``steps`` rounds of sampling from the (frozen) current policy
        and fitting only the value model, so that the first advantages do not come from an untrained
        critic. Each round's entry also holds ``time/pretrain``, its seconds."""
        if self.value_model is None:
            raise ValueError("pretrain_value needs a value model (an advantage estimator that "
                             "reads one: gae, vapo)")
        for k in range(steps):
            timer = time.perf_counter()
            # its own seed stream, apart from training steps'
            scored = self.score(self.sample_rollout(10**6 + k))
            metrics = {"step": k + 1, **scored.metrics, **self.update(scored, True)}
            metrics["time/pretrain"] = time.perf_counter() - timer
            metrics = reduce_metrics(metrics, self.world)
            self.value_pretrain_history.append(metrics)
        return self.value_pretrain_history

    # --- saving and resuming --------------------------------------------------------------------------------

    def save_checkpoint(self, path: str | Path) -> Path:
        """Everything needed to continue, as data: the policy as ``path/model.safetensors`` with its config and
        tokenizer (a folder :func:`rlbook.lm.load_policy` reads), and in ``path/trainer_state.pt`` the rest
        (:func:`rlbook.files.trainer_state`: the value model's weights, optimizer state, step, history, config,
        ...) as tensors and plain Python values (:func:`rlbook.files.to_plain`). The folder appears complete or
        not at all, even if the process is killed while writing (:func:`rlbook.files.write_checkpoint`); a
        failure raises :class:`rlbook.files.CheckpointError` and leaves earlier checkpoints intact. Under
        torchrun only rank 0 writes (every process holds the same state)."""
        path = Path(path)
        if not self.world.is_main:
            return path
        return write_checkpoint(trainer_state(self), path, policy=self.policy, tokenizer=self.tokenizer)

    def resume(self, path: str | Path) -> Trainer:
        """Load a :meth:`save_checkpoint` folder into this trainer (built with the same config,
        ``max_steps`` aside: a run may be extended; :func:`rlbook.files.restore_trainer_state`) and
        continue. An unreadable checkpoint raises :class:`rlbook.files.CheckpointError`, one that holds
        more than data :class:`rlbook.files.UnsafeCheckpointError` (a ``ValueError``), a checkpoint of
        another config ``ValueError``."""
        restore_trainer_state(self, read_checkpoint(path, self.device))
        return self


def _sampling_metrics(old_logp, sampler_logp, weights, mask, mode: str) -> dict:
    """TRL's ``sampling/*`` metrics of the sampler-mismatch correction: |log pi_old - log pi_sampler| over the
    completion tokens, and the correction's weights (one per completion at the sequence level, as TRL counts)."""
    mask = mask.bool()
    difference = (old_logp - sampler_logp).abs()[mask]
    kept = weights[:, 0] if mode.startswith("sequence") else weights[mask]
    return {"sampling/sampling_logp_difference/mean": difference.mean().item(),
            "sampling/sampling_logp_difference/max": difference.max().item(),
            "sampling/importance_sampling_ratio/min": kept.min().item(),
            "sampling/importance_sampling_ratio/mean": kept.mean().item(),
            "sampling/importance_sampling_ratio/max": kept.max().item()}


def _seed(seed: int, step: int, round_: int = 0, rank: int = 0) -> int:
    """A distinct, reproducible seed for each (run seed, step, generation round, process)."""
    return int(np.random.default_rng([seed, step + 1, round_] + ([rank] if rank else [])).integers(2**62))


class _Learner(torch.nn.Module):
    """The models the update trains, as one module whose forward gives a micro-batch's log-probs (when
    ``with_policy``), values (when there is a value model) and token entropies (when ``with_entropy``): what
    ``DistributedDataParallel`` wraps, since it synchronises the gradients of what ran through its forward."""

    def __init__(self, policy, value_model=None):
        super().__init__()
        self.policy, self.value_model = policy, value_model

    def forward(self, input_ids, attention_mask, mask, temperature, *, with_policy=True, routes=None,
                with_entropy=False):
        logp = values = entropies = None
        if with_policy:
            # Routing Replay: pi_theta's log-probs on the routes pi_old took
            replay = replay_routes(self.policy, routes) if routes is not None else contextlib.nullcontext()
            with replay:
                logp = sequence_logprobs(self.policy, input_ids, attention_mask, mask, temperature=temperature,
                                         with_entropy=with_entropy)
            if with_entropy:
                logp, entropies = logp
        if self.value_model is not None:
            values = token_values(self.value_model, input_ids, attention_mask, mask)
        return logp, values, entropies


def _frozen_copy(model):
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference
