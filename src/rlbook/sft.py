"""Supervised fine-tuning (SFT): teach a small LM a task from demonstrations, to get a base (reference) policy.

RL needs a starting policy that already solves a task *sometimes*: with accuracy near 0 every group of samples is
all wrong and the reward carries no signal; near 1 there is nothing left to learn. SFT on the task's
demonstrations gets there, and :func:`train_sft` stops once the sampled accuracy on held-out problems has reached a
target, which leaves the headroom RL is meant to close. It trains on the task's ``"train"`` split and measures
accuracy on its ``"test"`` split (see :meth:`rlbook.tasks.Task.sample`), so the target is met on problems the
model never saw.

The loss is the negative log-likelihood of the demonstration tokens (EOS included), averaged over tokens:

    L_SFT(theta) = - (1 / sum_{i,t} m_{i,t}) * sum_{i,t} m_{i,t} log pi_theta(o_{i,t} | q_i, o_{i,<t}),

with ``m`` the completion mask. It is computed by :func:`rlbook.rollout.sequence_logprobs`, the same log-prob path
the RL losses use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rlbook.lm import adamw, autocast
from rlbook.rollout import encode_completions, generate_rollouts, sequence_logprobs
from rlbook.tasks import Task


def sft_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             completion_mask: torch.Tensor) -> torch.Tensor:
    """Token-averaged NLL of the completion tokens; ``input_ids`` (B, L), ``completion_mask`` (B,
    T)."""
    logprobs = sequence_logprobs(model, input_ids, attention_mask, completion_mask)
    return -(logprobs * completion_mask).sum() / completion_mask.sum().clamp(min=1)


@dataclass
class SFTConfig:
    """Hyper-parameters of :func:`train_sft` (AdamW with linear warm-up, then a constant learning rate)."""

    max_steps: int = 3000
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 50
    eval_every: int = 100
    eval_size: int = 256  # held-out ("test" split) prompts, one sample each at temperature 1
    max_new_tokens: int = 16
    stop_at_accuracy: float | None = None  # stop once `stop_patience` evaluations in a row reach this accuracy
    stop_patience: int = 2  # more than one: a single lucky evaluation (or float rounding) cannot decide the stop
    seed: int = 0

    def __post_init__(self):
        for name in ("max_steps", "batch_size", "eval_every", "eval_size", "max_new_tokens", "stop_patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise ValueError(f"stop_at_accuracy must lie in (0, 1], got {self.stop_at_accuracy}")


@dataclass
class SFTHistory:
    """What :func:`train_sft` measured: the loss of every step, and the sampled accuracy at every evaluation."""

    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.losses)


def reached_target(history: SFTHistory, config: SFTConfig) -> bool:
    """The stop rule: the last ``stop_patience`` evaluations all reach ``stop_at_accuracy`` (never, if it is None)."""
    recent = history.eval_accuracy[-config.stop_patience:]
    return (config.stop_at_accuracy is not None and len(recent) == config.stop_patience
            and min(recent) >= config.stop_at_accuracy)


@torch.no_grad()
def sampled_accuracy(model, tokenizer, task: Task, examples, max_new_tokens: int, seed: int,
                     temperature: float = 1.0) -> float:
    """Fraction of ``examples`` answered correctly by one sample each at ``temperature`` (default 1, the RL
    behaviour policy's). Correct is the task's verdict, :meth:`rlbook.tasks.base.Task.is_correct`, as everywhere
    in the book: not the reward, which a proxy's ``length_bonus`` moves off ``correct_reward``."""
    with autocast(next(model.parameters()).device):
        batch = generate_rollouts(model, tokenizer, [e.prompt for e in examples], max_new_tokens=max_new_tokens,
                                  temperature=temperature, seed=seed)
    completions = batch.decode_completions(tokenizer)
    return float(np.mean([task.is_correct(e, c, t) for e, c, t in zip(examples, completions,
                                                                        batch.truncated.tolist())]))


def train_sft(model, tokenizer, task: Task, config: SFTConfig | None = None) -> SFTHistory:
    """Fine-tune ``model`` in place on fresh demonstrations of ``task``; returns the :class:`SFTHistory`.

    Every step draws a new batch of ``"train"`` problems (the tasks are generators, so there is no epoch); every
    ``eval_every`` steps the sampled accuracy on ``eval_size`` fixed ``"test"`` problems is measured, and training
    stops once ``stop_patience`` evaluations in a row reach ``stop_at_accuracy``. Deterministic given
    ``config.seed`` on a given machine; on another CPU the losses agree to float rounding for the first few dozen
    steps and then drift apart (the kernels round differently), so compare runs with tolerances. Runs where the
    model is (move it first: ``model.to(device)``), under bf16 autocast on a CUDA GPU.
    """
    config = config or SFTConfig()
    device = next(model.parameters()).device
    rng = np.random.default_rng(config.seed)  # the training batches; the held-out set has its own stream
    held_out = task.sample(config.eval_size, seed=np.random.default_rng((config.seed, 1)), split="test")
    optimizer = adamw(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps))
    history = SFTHistory()

    model.train()
    for step in range(1, config.max_steps + 1):
        examples = task.sample(config.batch_size, seed=rng, split="train")
        input_ids, attention_mask, completion_mask = encode_completions(
            tokenizer, [e.prompt for e in examples], [task.demonstration(e) for e in examples], device=device
        )
        with autocast(device):  # bf16 on CUDA, float32 elsewhere
            loss = sft_loss(model, input_ids, attention_mask, completion_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        warmup.step()
        history.losses.append(loss.item())

        if step % config.eval_every == 0 or step == config.max_steps:
            accuracy = sampled_accuracy(model, tokenizer, task, held_out, config.max_new_tokens, seed=config.seed)
            model.train()
            history.eval_steps.append(step)
            history.eval_accuracy.append(accuracy)
            if reached_target(history, config):
                break
    model.eval()
    return history
