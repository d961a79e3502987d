"""The one training loop of the book: every policy-gradient algorithm for language models is a configuration of it.

    sample N prompts, G completions each, and reward them      sample_rollout  -> Rollout
    old and reference log-probs, values, advantages            score           -> ScoredRollout
    num_iterations passes of minibatch updates                 update          (_micro_batch_backward)
    metrics, callbacks, the adaptive KL coefficient            train_step

What makes an algorithm lives elsewhere: its settings in :mod:`rlbook.presets`, its advantage estimator in
:mod:`rlbook.advantages`, its loss in :mod:`rlbook.losses` (ratio, surrogate, aggregation), the coefficients that
move as it runs (the KL penalty's, the entropy bonus's) and the early stop in :mod:`rlbook.controllers`; the
models' side (one module per forward, the optimizer, the old policy's numbers) in :mod:`rlbook.lm.learner`.
Experiments watch or extend the loop through callbacks (:mod:`rlbook.callbacks`), never by overriding this class.

Randomness comes from ``(seed, step)`` alone (prompts, sampling, minibatch order), so a run that is saved and
resumed continues exactly as one that was not, on the same machine, and the arms of an experiment that share a
seed see the same prompts.

Under ``torchrun`` the same loop runs on every process: each samples its share of the step's groups, the
advantages are computed on the gathered batch, the models are wrapped in ``DistributedDataParallel`` and every
loss is divided by counts of the whole batch, so that the config means the same algorithm on any number of
processes (:mod:`rlbook.distributed` says how). One code path serves both: on one process every loss's share
of the whole batch is exactly 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rlbook.advantages import ESTIMATORS, AdvantageInputs
from rlbook.callbacks import MetricsLogger, ProgressBar, TrainerCallback
from rlbook.controllers import EntropyController, KLController, moved_too_far
from rlbook.distributed import (World, average_grad, current_world, gather_rows, kept_rows, mean_over_ranks,
                                micro_batch_shares, micro_batches, reduce_metrics, row_offsets, rows_of_rank,
                                shard_groups, share_of)
from rlbook.checkpointing import read_checkpoint, restore_trainer_state, trainer_state, write_checkpoint
from rlbook.lm import autocast
from rlbook.lm.device import synchronized_clock
from rlbook.lm.learner import (Learner, check_routing, empty_backward, frozen_copy, lambda_parameter,
                               learner_optimizer, old_numbers, value_model_for)
from rlbook.lm.moe import is_moe
from rlbook.losses import LossBatch, aggregation_of, policy_loss, sampler_correction
from rlbook.metrics import explained_variance, rollout_metrics, update_summary
from rlbook.nonfinite import require_finite
from rlbook.objectives import high_entropy_mask, lambda_grpo_weights, positive_example_nll, value_loss
from rlbook.presets import RLConfig
from rlbook.presets import preset  # noqa: F401  (re-exported: rlbook.trainer.preset)
from rlbook.rollout import Rollout, ScoredRollout, sample_groups, step_seed, verdicts
from rlbook.sft import sampled_accuracy
from rlbook.tasks import Task
from rlbook.tasks.shaping import shape_rewards

# Seed streams apart from the training steps' (a step's prompts come from [seed, step], its sampling from
# step_seed(seed, step, round) for generation rounds 0, 1, ...):
HELD_OUT_SEED = 10**6  # the held-out problems: [seed, 10**6] over the test split (which no prompt comes from)
PRETRAIN_STEPS = 10**6  # value pretraining's round k samples as step 10**6 + k, past any run's training steps
COVARIANCE_ROUND = 10**6  # Clip-Cov's draw in a step's update: round 10**6 of the step, no generation round's


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
        check_routing(policy, config)
        self.reference = frozen_copy(policy) if config.beta > 0 else None
        self.value_model = value_model_for(policy, config, value_model)
        # the trained models as one module, one forward per micro-batch: what DDP wraps
        self._learner = Learner(policy, self.value_model)
        if self.world.distributed:
            self._learner = torch.nn.parallel.DistributedDataParallel(
                self._learner,
                find_unused_parameters=self.value_model is not None or is_moe(policy))
        self.optimizer = learner_optimizer(policy, self.value_model, config)
        # λ-GRPO's learnable λ: its own parameter group, outside the clipping
        self.response_weight_lambda = lambda_parameter(config, self.optimizer, self.device)
        self.kl_control = KLController(config)  # β, which moves when adaptive_kl_target is set
        self.entropy_control = EntropyController(config)  # the entropy bonus and its coefficient
        self._covariance_generator = None  # Clip-Cov's draw, seeded per step in update()
        logger = [MetricsLogger(log_file)] if log_file and self.world.is_main else []
        self.callbacks = list(callbacks) + logger
        self.value_pretrain_history: list[dict] = []
        self.step = 0
        self.history: list[dict] = []
        self._held_out = task.sample(config.eval_size, split="test",
                                     seed=np.random.default_rng([config.seed, HELD_OUT_SEED]))

    # the controllers' state as the trainer's attributes (a checkpoint saves and restores them)
    kl_coef = property(lambda self: self.kl_control.coef,
                       lambda self, value: setattr(self.kl_control, "coef", value))
    entropy_coef = property(lambda self: self.entropy_control.coef,
                            lambda self, value: setattr(self.entropy_control, "coef", value))
    last_entropy = property(lambda self: self.entropy_control.last_entropy,
                            lambda self, value: setattr(self.entropy_control, "last_entropy", value))

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
        timer = synchronized_clock(self.device)
        rollout = self.sample_rollout(self.step)
        time_reward = rollout.metrics.pop("time/reward")
        time_generate = synchronized_clock(self.device) - timer - time_reward
        extra = self._notify("on_rollout_end", rollout)

        timer = synchronized_clock(self.device)
        scored = self.score(rollout)
        time_score = synchronized_clock(self.device) - timer
        extra.update(self._notify("on_score_end", scored))

        timer = synchronized_clock(self.device)
        update_metrics = self.update(scored)
        time_update = synchronized_clock(self.device) - timer
        extra.update(self._notify("on_update_end", scored))

        metrics = {
            "step": self.step + 1,
            **rollout_metrics(rollout, scored),
            **rollout.metrics,
            **scored.metrics,
            **update_metrics,
            **extra,
            **self.kl_control.metrics(),  # the β this step used
            **({"lambda_grpo/lambda": float(self.response_weight_lambda.detach())}
               if self.response_weight_lambda is not None else {}),
            "time/generate": time_generate,
            "time/score": time_reward + time_score,
            "time/update": time_update,
        }
        metrics = reduce_metrics(metrics, self.world)  # the same numbers on every process
        self.kl_control.update(metrics)  # the adaptive KL controller (Ziegler et al. 2019)
        self.step += 1
        if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.max_steps):
            metrics["eval_accuracy"] = self.evaluate()
        self.history.append(metrics)
        self._notify("on_step_end", metrics)
        return metrics

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
        ``torchrun`` (:func:`rlbook.rollout.sample_groups`)."""
        return sample_groups(self.policy, self.tokenizer, self.task, self.config, step, self._prompt_shard,
                             self.world.rank, self.device, self.reward_fn)

    @torch.no_grad()
    def evaluate(self, examples=None) -> float:
        """Sampled accuracy (one completion each, at ``config.temperature``) on held-out test problems (under
        ``torchrun``, each process samples a share of them)."""
        world = self.world
        examples = share_of(self._held_out if examples is None else examples, world)
        accuracy = sampled_accuracy(self.policy, self.tokenizer, self.task, examples,
                                    self.config.max_completion_length,
                                    seed=step_seed(self.config.seed, -1, 0, world.rank),
                                    temperature=self.config.temperature) if examples else 0.0
        return mean_over_ranks(accuracy, len(examples), world, self.device)

    # --- scoring: the old policy's numbers and the advantages ------------------------------------------------

    @torch.no_grad()
    def score(self, rollout: Rollout) -> ScoredRollout:
        """Old log-probs (and the reference's and the critic's), the rewards after shaping, the
        task's verdict, and the advantages of ``ESTIMATORS[config.advantage_estimator]``."""
        config, batch, world, metrics = self.config, rollout.batch, self.world, {}
        mask = batch.completion_mask.float()
        correct = verdicts(self.task, rollout, config.num_generations, self.device)
        # DAPO's soft overlong punishment, added to the reward
        rewards = shape_rewards(rollout, config)
        # Overlong filtering (DAPO): a completion cut off at the budget gets no loss; its reward
        # still counts in its group's mean and std.
        loss_mask = (mask * (~batch.truncated)[:, None] if config.mask_truncated_completions
                     else mask)
        models = self.policy, self.reference, self.value_model
        old_logp, ref_logp, old_values, routes = old_numbers(
            *models, batch, mask, config, self.device, metrics)
        # Where the KL penalty goes: into the per-token reward (PPO-RLHF: -beta k1 at every token),
        # or into the loss (GRPO: + beta k3 per token, in policy_loss).
        scores = torch.as_tensor(rewards, dtype=torch.float32, device=self.device)
        token_rewards, sequence_rewards = self.kl_control.rewards(scores, old_logp, ref_logp, mask)
        # The estimator sees the whole step's batch: under torchrun, every process's rows
        # gathered (batch-level scaling, whitening and filters then equal one process's), and
        # this process's rows taken back.
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
        is_ratio, sampling = sampler_correction(old_logp, batch.logprobs, mask, config)
        metrics.update(sampling)
        return ScoredRollout(rollout, batch.input_ids, batch.attention_mask, mask, loss_mask,
                             mask.sum(-1), rewards, correct, old_logp, estimate.advantages,
                             ref_logp, old_values, estimate.returns, metrics, routes,
                             sampler_logp=batch.logprobs, importance_sampling_ratio=is_ratio)

    # --- the update -----------------------------------------------------------------------------------------

    def update(self, scored: ScoredRollout, value_only: bool = False) -> dict:
        """``num_iterations`` passes over the rollout in shuffled minibatches, one optimizer step
        per ``gradient_accumulation_steps`` micro-batches; stops early once ``approx_kl`` passes
        1.5 · ``early_stop_kl`` (Spinning Up's rule)."""
        config = self.config
        # Minibatches are drawn from one permutation of the step's global rows (B of them; under
        # torchrun each process computes the rows of a minibatch that it holds: _micro_batches).
        offsets = row_offsets(scored.mask.shape[0], self.world)
        B = offsets[-1]
        rows_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
        generator = torch.Generator().manual_seed(step_seed(config.seed, self.step))
        # Clip-Cov's random draw: its own stream
        self._covariance_generator = torch.Generator().manual_seed(
            step_seed(config.seed, self.step, COVARIANCE_ROUND))
        sums: dict[str, list[float]] = {}
        models = [m for m in (self.policy, self.value_model) if m is not None]
        for model in models:
            model.train()
        optimizer_steps, stopped = 0, False
        for _ in range(config.num_iterations):
            order = torch.randperm(B, generator=generator).to(self.device)
            for start in range(0, B, rows_per_step):
                batches, counts, tokens_of_step = micro_batches(
                    scored, order[start : start + rows_per_step], offsets,
                    config.per_device_train_batch_size, self.world, self.value_model is not None)
                step_kl = self._accumulate_gradients(scored, batches, counts, tokens_of_step,
                                                     value_only, sums)
                optimizer_steps += self._optimizer_step(sums)
                if self.entropy_control.on and not value_only:
                    self.entropy_control.end_window(self.world, self.device)
                    # logged after the update, as TRL does
                    sums.setdefault("entropy_coef", []).append(self.entropy_coef)
                if moved_too_far(step_kl, config.early_stop_kl, self.world, self.device):
                    stopped = True  # the policy has moved far enough from the one that sampled
                    break
            if stopped:
                break
        for model in models:
            model.eval()
        return update_summary(sums, optimizer_steps,
                              stopped if config.early_stop_kl is not None else None)

    def _accumulate_gradients(self, scored, batches, counts, tokens_of_step, value_only, sums) -> list:
        """One optimizer step's micro-batches backpropagated into zeroed gradients, their metrics appended to
        ``sums``; returns their ``approx_kl`` values (for the early stop)."""
        self.optimizer.zero_grad(set_to_none=True)
        step_kl = []
        for rows, count in zip(batches, counts):
            metrics = self._micro_batch_backward(scored, rows, tokens_of_step, value_only, count)
            for key, value in metrics.items():
                sums.setdefault(key, []).append(value)
            step_kl += [metrics["approx_kl"]] if "approx_kl" in metrics else []
        return step_kl

    def _optimizer_step(self, sums: dict) -> int:
        """λ's gradient averaged by hand under torchrun (it is trained outside DDP's module); the other gradients'
        norm clipped at ``max_grad_norm`` and checked; one AdamW step. Returns the steps taken (0 when no
        parameter has a gradient)."""
        if self.world.distributed and self.response_weight_lambda is not None:
            average_grad(self.response_weight_lambda, self.world)
        params = [p for group in self.optimizer.param_groups if group.get("name") != "lambda"
                  for p in group["params"] if p.grad is not None]
        if not params:
            return 0
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        require_finite("the gradient norm", grad_norm, self.step)
        sums.setdefault("grad_norm", []).append(grad_norm.item())
        self.optimizer.step()
        return 1

    def _micro_batch_backward(self, scored: ScoredRollout, rows, tokens_of_step,
                              value_only=False, counts=None) -> dict:
        """The loss of one micro-batch (policy loss, entropy bonus, VAPO's NLL, the value loss),
        backpropagated; its metrics. Each loss is multiplied by its share of the whole batch's
        (:func:`rlbook.distributed.micro_batch_shares`): exactly 1 on one process; under
        torchrun ``counts`` holds the micro-batch's counts over all processes
        (:func:`rlbook.distributed.micro_batches`), and the share rescales the loss from this
        process's count to them."""
        config, accumulate = self.config, self.config.gradient_accumulation_steps
        rows = kept_rows(scored, rows, self.value_model is not None)
        if counts is not None:
            if counts[0] == 0:  # no process has a row to learn from: no backward anywhere
                return {}
            if len(rows) == 0:  # others have: a forward DDP can wait on, whose gradient is 0
                return empty_backward(self._learner, scored, config.temperature, value_only,
                                      self.device)
        mask, loss_mask = scored.mask[rows], scored.loss_mask[rows]
        shares = micro_batch_shares(aggregation_of(config).divides_by, loss_mask,
                                    scored.correct[rows], mask, counts, self.world)
        # no policy loss when every completion here was filtered out
        with_policy = not value_only and bool(loss_mask.any())
        with_entropy = with_policy and (config.top_entropy_quantile < 1.0
                                        or self.entropy_control.on)
        metrics, loss = {}, torch.zeros((), device=self.device)
        with autocast(self.device):
            routes = None if scored.routes is None else scored.routes[:, rows]
            logp, values, entropies = self._learner(
                scored.input_ids[rows], scored.attention_mask[rows], mask, config.temperature,
                with_policy=with_policy, routes=routes, with_entropy=with_entropy)
            if with_policy:
                # λ-GRPO: the weights of whole groups, then these rows'
                weights = (None if self.response_weight_lambda is None else lambda_grpo_weights(
                    scored.lengths, config.num_generations, self.response_weight_lambda,
                    config.lambda_grpo_r)[rows])
                loss, metrics = self._policy_terms(scored, rows, logp, entropies, weights,
                                                   tokens_of_step, shares.policy)
                nll = (positive_example_nll(logp, loss_mask, scored.correct[rows])
                       if config.nll_coef > 0 else None)
                if nll is not None:  # VAPO: imitate the correct completions too
                    metrics["loss/nll"] = nll.item()
                    loss = loss + config.nll_coef * (nll * shares.nll) / accumulate
            if values is not None:
                v_loss = self._value_loss(scored, rows, values, metrics) * shares.value
                loss = loss + config.vf_coef * v_loss / accumulate
        if loss.requires_grad:
            loss.backward()
        return metrics

    def _policy_terms(self, scored, rows, logp, entropies, weights, tokens_of_step, share) -> tuple:
        """The family's policy loss of a micro-batch (:func:`rlbook.losses.policy_loss`, its KL term included
        when ``kl_placement="loss"``, on the high-entropy tokens alone when ``top_entropy_quantile < 1``) times
        its ``share``, plus the entropy bonus over the tokens that loss uses (as TRL); and the loss's metrics."""
        config, loss_mask = self.config, scored.loss_mask[rows]
        require_finite("the policy's log-probs (logp)", logp[loss_mask.bool()], self.step)
        # the high-entropy minority: the tokens that keep their policy loss
        entropy_mask = (high_entropy_mask(entropies, loss_mask, config.top_entropy_quantile)
                        if config.top_entropy_quantile < 1.0 else None)
        kl_in_loss = self.kl_control.in_loss
        batch = LossBatch(
            logp, scored.old_logp[rows], scored.advantages[rows], loss_mask,
            ref_logp=scored.ref_logp[rows] if kl_in_loss else None,
            sampler_logp=scored.sampler_logp[rows] if config.off_policy_mask_threshold is not None else None,
            importance_sampling_ratio=(None if scored.importance_sampling_ratio is None
                                       else scored.importance_sampling_ratio[rows]),
            entropy_mask=entropy_mask, response_weights=weights,
            num_items_in_batch=tokens_of_step, generator=self._covariance_generator)
        loss, metrics = policy_loss(batch, config, kl_in_loss)
        require_finite("the policy loss", loss, self.step)
        metrics["loss/policy"] = loss.item()
        loss = loss * share  # this process's share of the loss over all processes' rows
        if self.entropy_control.on:  # over the tokens the policy loss uses, as TRL
            tokens = loss_mask.bool() if entropy_mask is None else entropy_mask
            loss = loss + self.entropy_control.bonus(entropies, tokens, config.gradient_accumulation_steps)
        return loss, metrics

    def _value_loss(self, scored, rows, values, metrics: dict) -> torch.Tensor:
        """The value loss of a micro-batch, clipped by ``cliprange_value``; ``loss/value`` into ``metrics``."""
        v_loss = value_loss(values, scored.old_values[rows], scored.returns[rows], scored.mask[rows],
                            self.config.cliprange_value)
        require_finite("the value loss", v_loss, self.step)
        metrics["loss/value"] = v_loss.item()
        return v_loss

    def pretrain_value(self, steps: int) -> list[dict]:
        """VAPO's value pretraining: ``steps`` rounds of sampling from the (frozen) current policy
        and fitting only the value model, so that the first advantages do not come from an untrained
        critic. Each round's entry also holds ``time/pretrain``, its seconds."""
        if self.value_model is None:
            raise ValueError("pretrain_value needs a value model (an advantage estimator that "
                             "reads one: gae, vapo)")
        for k in range(steps):
            timer = synchronized_clock(self.device)
            # its own seed stream, apart from training steps'
            scored = self.score(self.sample_rollout(PRETRAIN_STEPS + k))
            metrics = {"step": k + 1, **scored.metrics, **self.update(scored, True)}
            metrics["time/pretrain"] = synchronized_clock(self.device) - timer
            metrics = reduce_metrics(metrics, self.world)
            self.value_pretrain_history.append(metrics)
        return self.value_pretrain_history

    # --- saving and resuming --------------------------------------------------------------------------------

    def save_checkpoint(self, path: str | Path) -> Path:
        """Everything needed to continue, as data, in the folder ``path`` (:func:`rlbook.checkpointing.write_checkpoint`
        says what it holds; :func:`rlbook.lm.load_policy` reads its policy). The folder appears complete or not at
        all; a failure raises :class:`rlbook.checkpointing.CheckpointError`. Under torchrun only rank 0 writes."""
        path = Path(path)
        if not self.world.is_main:
            return path
        return write_checkpoint(trainer_state(self), path, policy=self.policy, tokenizer=self.tokenizer)

    def resume(self, path: str | Path) -> Trainer:
        """Load a :meth:`save_checkpoint` folder into this trainer (built with the same config, ``max_steps``
        aside: a run may be extended) and continue (:func:`rlbook.checkpointing.restore_trainer_state` raises)."""
        restore_trainer_state(self, read_checkpoint(path, self.device))
        return self
