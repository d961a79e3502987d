"""Reward models: a language model with a scalar head, trained on preference pairs with the Bradley–Terry loss.

RLHF replaces a rule that checks answers with a *learned* judge. Given pairs (x, y_w, y_l), where a person (here:
the task's rule) preferred y_w, the Bradley–Terry model says

    P(y_w ≻ y_l | x) = σ(r(x, y_w) − r(x, y_l)),

and fitting r by maximum likelihood is minimising :func:`bradley_terry_loss`. The model is a Hugging Face
``…ForSequenceClassification`` with one label: the transformer body, and a linear head ``score`` read at the last
real token of prompt + completion (as TRL's RewardTrainer does). Only differences of r are learned, so its offset
is arbitrary; :class:`RewardModelScorer` can centre and scale it (with statistics of the reference policy's
completions) and clip it, as OpenRLHF does with its ``[-10, 10]`` clip.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from rlbook.lm import adamw, autocast
from rlbook.lm.model import position_ids_from_mask
from rlbook.lm.device import resolve_device
from rlbook.lm.value import float32_head, scalar_head_model
from rlbook.rollout import encode_completions
from rlbook.tasks.preferences import PreferencePair


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                       margin: torch.Tensor | float | None = None) -> torch.Tensor:
    """Mean over pairs of −log σ(r_w − r_l − margin), the negative log-likelihood of the Bradley–Terry model.

    ``chosen_rewards`` and ``rejected_rewards`` are (N,); ``margin`` (N,) or a float (Llama 2's margin loss) asks
    the chosen side to win by at least that much.
    """
    if chosen_rewards.shape != rejected_rewards.shape or chosen_rewards.dim() != 1:
        raise ValueError(f"chosen and rejected rewards must both be (N,), got {tuple(chosen_rewards.shape)} and "
                         f"{tuple(rejected_rewards.shape)}")
    if chosen_rewards.numel() == 0:
        raise ValueError("bradley_terry_loss needs at least one pair")
    if not bool(torch.isfinite(chosen_rewards).all() and torch.isfinite(rejected_rewards).all()):
        raise ValueError("chosen and rejected rewards must be finite")
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference - torch.as_tensor(margin, dtype=difference.dtype, device=difference.device)
    return -F.logsigmoid(difference).mean()


def build_reward_model(policy: PreTrainedModel, init: str = "policy", seed: int = 0) -> PreTrainedModel:
    """A reward model shaped like ``policy``: ``…ForSequenceClassification`` with one label and no dropout.

    ``init="policy"`` copies the policy's transformer body (InstructGPT starts its reward model from the SFT model)
    and zeroes the head; ``"random"`` gives a fresh, seeded model of the same shape.
    """
    if init not in ("policy", "random"):
        raise ValueError(f"unknown reward-model init {init!r}; choose 'policy' or 'random'")
    model = scalar_head_model(policy, AutoModelForSequenceClassification, seed)
    if init == "policy":
        model.base_model.load_state_dict(policy.base_model.state_dict())
        torch.nn.init.zeros_(model.score.weight)
        if getattr(model.score, "bias", None) is not None:
            torch.nn.init.zeros_(model.score.bias)
    return model.to(next(policy.parameters()).device).eval()


def sequence_scores(model: PreTrainedModel, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> torch.Tensor:
    """r(x, y) for each row of prompt + completion, (B,) float32: the head ``score`` at the last
    real token.

    Works with left- and right-padding: the last real token is the rightmost column whose mask is 1.
    The head runs in float32, also under autocast (:func:`rlbook.lm.value.float32_head`); the inputs
    move to the model's device.
    """
    device = resolve_device(None, model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = position_ids_from_mask(attention_mask)
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids).last_hidden_state  # (B, L, H)
    columns = torch.arange(attention_mask.shape[1], device=device)
    last = (attention_mask.bool() * columns).argmax(-1)  # (B,)
    at_last = hidden[torch.arange(len(last), device=device), last]  # (B, H)
    return float32_head(model.score, at_last).squeeze(-1)


def pair_scores(model, tokenizer, pairs: list[PreferencePair],
                score_fn=sequence_scores) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen_rewards, rejected_rewards)``, each (N,), for preference pairs (EOS appended to both sides).

    ``score_fn(model, input_ids, attention_mask) -> (B,)`` reads the reward off the model: the last real token of a
    causal LM (:func:`sequence_scores`), or another reading (GAPO's encoder, :func:`rlbook.gapo.encoder_scores`)."""
    if not pairs:
        raise ValueError("need at least one pair")
    device = next(model.parameters()).device
    prompts = [p.prompt for p in pairs]
    chosen = encode_completions(tokenizer, prompts, [p.chosen for p in pairs], device=device)
    rejected = encode_completions(tokenizer, prompts, [p.rejected for p in pairs], device=device)
    with autocast(device):
        return score_fn(model, *chosen[:2]), score_fn(model, *rejected[:2])


@dataclass
class RewardModelConfig:
    """Hyper-parameters of :func:`train_reward_model` (AdamW, constant learning rate)."""

    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-3
    margin: float | None = None
    eval_every: int = 50
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass
class RewardModelHistory:
    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)  # held-out pairs ranked correctly


@torch.no_grad()
def pair_accuracy(model, tokenizer, pairs: list[PreferencePair], score_fn=sequence_scores) -> float:
    """Fraction of pairs whose chosen side scores higher than the rejected one."""
    chosen, rejected = pair_scores(model, tokenizer, pairs, score_fn)
    return float((chosen > rejected).float().mean())


def bradley_terry_step(model, optimizer, tokenizer, pairs: list[PreferencePair], score_fn=sequence_scores,
                       margin: float | None = None) -> float:
    """One optimizer step of the Bradley–Terry loss on ``pairs``; returns the loss."""
    model.train()
    loss = bradley_terry_loss(*pair_scores(model, tokenizer, pairs, score_fn), margin)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    model.eval()
    return loss.item()


def train_reward_model(model, tokenizer, train_pairs: list[PreferencePair], test_pairs: list[PreferencePair],
                       config: RewardModelConfig | None = None, score_fn=sequence_scores) -> RewardModelHistory:
    """Fit ``model`` in place with the Bradley–Terry loss on minibatches of ``train_pairs`` (drawn with
    replacement, seeded); held-out pair accuracy on ``test_pairs`` every ``eval_every`` steps. ``score_fn`` as
    for :func:`pair_scores`."""
    config = config or RewardModelConfig()
    if not train_pairs or not test_pairs:
        raise ValueError("train_reward_model needs training and test pairs")
    rng = np.random.default_rng(config.seed)
    optimizer = adamw(model.parameters(), lr=config.lr)
    history = RewardModelHistory()
    for step in range(1, config.steps + 1):
        batch = [train_pairs[i] for i in rng.integers(len(train_pairs), size=config.batch_size)]
        history.losses.append(bradley_terry_step(model, optimizer, tokenizer, batch, score_fn, config.margin))
        if step % config.eval_every == 0 or step == config.steps:
            history.eval_steps.append(step)
            history.eval_accuracy.append(pair_accuracy(model, tokenizer, test_pairs, score_fn))
    return history


class RewardModelScorer:
    """A ``reward_fn`` for :class:`rlbook.trainer.Trainer` that scores completions with a reward model.

    Completions arrive as text and are re-encoded with EOS appended, as the preference pairs were.

    The score is ``clip((r − mean) / std, −clip, clip)``, with ``mean``/``std`` given (e.g. measured on the
    reference policy's completions, so that the starting policy scores about 0 ± 1) or 0/1; a completion without
    EOS (cut off at the budget) gets ``missing_eos_penalty`` subtracted, as TRL's PPO offers.
    """

    def __init__(self, model, tokenizer, mean: float = 0.0, std: float = 1.0, clip: float | None = 10.0,
                 missing_eos_penalty: float | None = None, score_fn=sequence_scores):
        if not std > 0:
            raise ValueError(f"std must be positive, got {std}")
        if clip is not None and not clip > 0:
            raise ValueError(f"clip must be positive or None, got {clip}")
        self.model, self.tokenizer = model, tokenizer
        self.mean, self.std, self.clip, self.missing_eos_penalty = mean, std, clip, missing_eos_penalty
        self.score_fn = score_fn  # see pair_scores

    @torch.no_grad()
    def raw_scores(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        device = next(self.model.parameters()).device
        input_ids, attention_mask, _ = encode_completions(self.tokenizer, prompts, completions, device=device)
        with autocast(device):
            return self.score_fn(self.model, input_ids, attention_mask).double().cpu().numpy()

    def __call__(self, examples, completions, truncated=None) -> np.ndarray:
        scores = (self.raw_scores([e.prompt for e in examples], list(completions)) - self.mean) / self.std
        if self.clip is not None:
            scores = np.clip(scores, -self.clip, self.clip)
        if self.missing_eos_penalty is not None and truncated is not None:
            scores = scores - self.missing_eos_penalty * np.asarray(truncated, dtype=np.float64)
        return scores
