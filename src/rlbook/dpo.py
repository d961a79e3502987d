"""Direct Preference Optimization: fit the policy to preference pairs with no reward model and no sampling.

A small training loop around :func:`rlbook.objectives.dpo_loss` (chapter "Bradley–Terry and DPO"). Each pair
``(x, y_w, y_l)`` (a :class:`~rlbook.tasks.preferences.PreferencePair`) is laid out by
:func:`~rlbook.rollout.encode_completions` (EOS appended to both sides, as for SFT and the reward model); chosen and
rejected go through the policy in one forward (as TRL concatenates them), and
:func:`~rlbook.rollout.sequence_logprobs` summed over each completion gives log π(y | x). The frozen reference
is the policy as it was before training; its log-probs are computed **once**, before the first step (TRL's
``precompute_ref_log_probs``), so no second model is kept in memory during training (erratum E14: DPO still needs
π_ref, but only its numbers).

Names follow TRL's ``DPOConfig`` (``beta``, ``loss_type``, ``label_smoothing``, ``learning_rate``,
``per_device_train_batch_size``, ``max_steps``, ``seed``, ``max_grad_norm``) and the history holds the metrics
TRL logs: ``rewards/chosen``, ``rewards/rejected`` (the mean implicit rewards β·log π_θ/π_ref), ``rewards/accuracies``
(the fraction of pairs whose chosen reward is the larger), ``rewards/margins`` (their mean difference),
``logps/chosen`` and ``logps/rejected`` (the mean sequence log-probs under the policy). ``rpo_alpha`` adds
α·(mean token NLL of the chosen completions), the RPO remedy (TRL ≤ 0.28's ``rpo_alpha``, OpenRLHF's
``nll_loss_coef``) for the drift in which both log-probs fall.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from rlbook.lm import adamw, autocast
from rlbook.objectives import DPO_LOSS_TYPES, dpo_loss
from rlbook.rollout import encode_completions, sequence_logprobs
from rlbook.tasks.preferences import PreferencePair

METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")


@dataclass
class DPOConfig:
    """Hyper-parameters of :func:`train_dpo` (AdamW with weight decay 0, constant learning rate, TRL's names).

    ``learning_rate`` defaults higher than TRL's 1e-6 (written for billion-parameter models): our policies have a
    few hundred thousand parameters. ``eval_every`` (0: never) measures the held-out metrics (prefixed
    ``eval_``, as TRL does) every that many steps and after the last one.
    """

    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    learning_rate: float = 1e-4
    per_device_train_batch_size: int = 32
    max_steps: int = 100
    max_grad_norm: float | None = 1.0
    rpo_alpha: float | None = None
    eval_every: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"unknown DPO loss_type {self.loss_type!r}; choose one of {DPO_LOSS_TYPES}")
        if not self.beta > 0:
            raise ValueError(f"beta must be positive, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must lie in [0, 0.5), got {self.label_smoothing}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        for name in ("per_device_train_batch_size", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.rpo_alpha is not None and self.rpo_alpha < 0:
            raise ValueError(f"rpo_alpha must be >= 0, got {self.rpo_alpha}")


def pair_logps(model, tokenizer, pairs: list[PreferencePair]) -> dict[str, torch.Tensor]:
    """Sequence log-probs of both sides of ``pairs`` in one forward: ``chosen``, ``rejected`` (N,) sums of
    log π(y_t | x, y_<t) over each completion (EOS included), and their token counts ``chosen_len``,
    ``rejected_len`` (N,). Differentiable; wrap in ``torch.no_grad()`` for the reference."""
    if not pairs:
        raise ValueError("pair_logps needs at least one pair")
    device = next(model.parameters()).device
    prompts = [p.prompt for p in pairs]
    input_ids, attention_mask, completion_mask = encode_completions(
        tokenizer, prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs], device=device)
    with autocast(device):
        per_token = sequence_logprobs(model, input_ids, attention_mask, completion_mask)  # (2N, T), 0 off-mask
    logps, lengths = per_token.sum(-1), completion_mask.sum(-1).float()
    n = len(pairs)
    return {"chosen": logps[:n], "rejected": logps[n:], "chosen_len": lengths[:n], "rejected_len": lengths[n:],
            "chosen_token_logps": per_token[:n], "chosen_mask": completion_mask[:n]}


@torch.no_grad()
def reference_logps(model, tokenizer, pairs: list[PreferencePair], batch_size: int = 256) -> dict[str, torch.Tensor]:
    """:func:`pair_logps` of the (frozen) ``model`` over all ``pairs``, in batches: computed once, before training."""
    was_training = model.training
    model.eval()
    parts = [pair_logps(model, tokenizer, pairs[i : i + batch_size]) for i in range(0, len(pairs), batch_size)]
    model.train(was_training)
    return {k: torch.cat([p[k] for p in parts]) for k in ("chosen", "rejected", "chosen_len", "rejected_len")}


def log_ratio_margins(model, tokenizer, pairs: list[PreferencePair], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """How far ``model`` has moved on ``pairs`` from the reference whose :func:`reference_logps` are ``ref``:
    ``margin``, the mean of h = log π/π_ref(y_w) − log π/π_ref(y_l) (sequence sums, no β: what the sigmoid loss
    sees); ``margin_per_token``, the same with each log-prob divided by its completion's token count (what the IPO
    loss sees; its optimum is 1/(2β)); ``chosen_logratio`` and ``rejected_logratio``, the means of the two
    log-ratios (sums). No gradient."""
    cur = reference_logps(model, tokenizer, pairs)  # the current policy's log-probs, in eval mode
    chosen, rejected = cur["chosen"] - ref["chosen"], cur["rejected"] - ref["rejected"]
    per_token = chosen / cur["chosen_len"] - rejected / cur["rejected_len"]
    return {"margin": (chosen - rejected).mean().item(), "margin_per_token": per_token.mean().item(),
            "chosen_logratio": chosen.mean().item(), "rejected_logratio": rejected.mean().item()}

def dpo_batch(model, tokenizer, pairs: list[PreferencePair], ref: dict[str, torch.Tensor],
              config: DPOConfig):
    """``(loss, metrics)`` of one batch: the mean of :func:`dpo_loss` (plus ``rpo_alpha`` x chosen
    NLL) and the TRL metrics. ``ref`` holds the reference's :func:`pair_logps` of the same pairs, in
    order. IPO receives length-averaged log-probs (each sum divided by its completion's token
    count), as the IPO paper and TRL do."""
    cur = pair_logps(model, tokenizer, pairs)
    chosen, rejected = cur["chosen"], cur["rejected"]
    ref_chosen, ref_rejected = ref["chosen"].to(chosen.device), ref["rejected"].to(chosen.device)
    if config.loss_type == "ipo":
        chosen, ref_chosen = chosen / cur["chosen_len"], ref_chosen / cur["chosen_len"]
        rejected, ref_rejected = rejected / cur["rejected_len"], ref_rejected / cur["rejected_len"]
    losses, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, ref_chosen, ref_rejected,
                                                        beta=config.beta,
                                                        loss_type=config.loss_type,
                                                        label_smoothing=config.label_smoothing)
    loss = losses.mean()
    metrics = {"loss": loss.item()}
    if config.rpo_alpha is not None:
        # mean token NLL of the chosen sides
        nll = -cur["chosen_token_logps"].sum() / cur["chosen_mask"].sum()
        loss = loss + config.rpo_alpha * nll
        metrics["nll_loss"] = nll.item()
    metrics.update({
        "rewards/chosen": chosen_rewards.mean().item(),
        "rewards/rejected": rejected_rewards.mean().item(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
        # summed log-probs, whatever the loss type
        "logps/chosen": cur["chosen"].detach().mean().item(),
        "logps/rejected": cur["rejected"].detach().mean().item(),
    })
    return loss, metrics


@torch.no_grad()
def evaluate_dpo(model, tokenizer, pairs: list[PreferencePair], ref: dict[str, torch.Tensor], config: DPOConfig,
                 batch_size: int = 256) -> dict[str, float]:
    """The TRL metrics (and the loss) over all ``pairs``, prefixed ``eval_``, pair-weighted across batches."""
    was_training = model.training
    model.eval()
    totals, n = {}, len(pairs)
    for i in range(0, n, batch_size):
        part = {k: v[i : i + batch_size] for k, v in ref.items()}
        _, metrics = dpo_batch(model, tokenizer, pairs[i : i + batch_size], part, config)
        weight = len(pairs[i : i + batch_size]) / n
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + weight * v
    model.train(was_training)
    return {f"eval_{k}": v for k, v in totals.items()}


def train_dpo(model, tokenizer, train_pairs: list[PreferencePair], test_pairs: list[PreferencePair] | None = None,
              config: DPOConfig | None = None, ref_model=None, on_step=None) -> list[dict]:
    """Train ``model`` in place with DPO on ``train_pairs``; returns the history, one dict per step.

    Each step takes ``per_device_train_batch_size`` pairs from a seeded shuffle of ``train_pairs`` (epochs
    without replacement), computes :func:`dpo_batch` and takes an AdamW step. The reference is ``ref_model``, or
    a frozen copy of ``model`` as it is now; its log-probs of every train and test pair are computed once, before
    the first step, and the copy is then dropped. Each step's dict has ``step``, ``loss``, the six TRL metrics
    (:data:`METRICS`) and, every ``config.eval_every`` steps and after the last, the same over ``test_pairs``
    prefixed ``eval_``. ``on_step(step, model)``, if given, is called after every optimizer step (for measurements
    the history does not hold, e.g. sampled accuracy; it must leave the model's weights alone).
    """
    config = config or DPOConfig()
    if not train_pairs:
        raise ValueError("train_dpo needs at least one training pair")
    if config.eval_every and not test_pairs:
        raise ValueError("eval_every > 0 needs test_pairs")
    reference = ref_model if ref_model is not None else copy.deepcopy(model)
    ref_train = reference_logps(reference, tokenizer, train_pairs)
    ref_test = reference_logps(reference, tokenizer, test_pairs) if test_pairs else None
    del reference  # only its numbers are needed from here on (erratum E14)

    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    optimizer = adamw(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    order, position = rng.permutation(len(train_pairs)), 0
    history = []
    model.train()
    for step in range(1, config.max_steps + 1):
        index = []
        while len(index) < min(config.per_device_train_batch_size, len(train_pairs)):
            if position == len(order):
                order, position = rng.permutation(len(train_pairs)), 0
            index.append(int(order[position]))
            position += 1
        batch = [train_pairs[i] for i in index]
        loss, metrics = dpo_batch(model, tokenizer, batch, {k: v[index] for k, v in ref_train.items()}, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.max_grad_norm is not None:
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        optimizer.step()
        record = {"step": step, **metrics}
        if config.eval_every and (step % config.eval_every == 0 or step == config.max_steps):
            record.update(evaluate_dpo(model, tokenizer, test_pairs, ref_test, config))
        history.append(record)
        if on_step is not None:
            on_step(step, model)
    model.eval()
    return history


@torch.no_grad()
def on_policy_pairs(model, tokenizer, task, examples, *, num_generations: int = 8,
                    max_new_tokens: int, temperature: float = 1.0, seed: int = 0,
                    rng=None) -> list[PreferencePair]:
    """Preference pairs from the policy's own samples, labelled by the task's rule (the data of
    on-policy, iterated DPO).

    For each example, ``num_generations`` completions are sampled from ``model`` (seeded by
    ``seed``); if at least one is right and one (untruncated) is wrong, one right and one wrong
    completion, drawn uniformly by ``rng`` (a numpy Generator, default from ``seed``), make the
    pair ``(prompt, right, wrong)``. Prompts whose samples are all right or all wrong give no
    pair, so the result can be shorter than ``examples``.
    """
    from rlbook.rollout import generate_rollouts

    rng = rng if rng is not None else np.random.default_rng(seed)
    examples = list(examples)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        generator = torch.Generator(device=device).manual_seed(int(seed))
        with autocast(device):
            batch = generate_rollouts(model, tokenizer, [e.prompt for e in examples],
                                      num_generations=num_generations,
                                      max_new_tokens=max_new_tokens, temperature=temperature,
                                      seed=generator)
    finally:
        model.train(was_training)
    texts, truncated = batch.decode_completions(tokenizer), batch.truncated.cpu().numpy()
    pairs = []
    for i, example in enumerate(examples):
        rows = range(i * num_generations, (i + 1) * num_generations)  # prompt-major rows
        right = [texts[j] for j in rows
                 if task.is_correct(example, texts[j], bool(truncated[j]))]
        wrong = [texts[j] for j in rows
                 if not truncated[j] and not task.is_correct(example, texts[j], False)]
        if right and wrong:
            pairs.append(PreferencePair(prompt=example.prompt,
                                        chosen=right[rng.integers(len(right))],
                                        rejected=wrong[rng.integers(len(wrong))]))
    return pairs
