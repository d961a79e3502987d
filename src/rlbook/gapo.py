"""GAPO: a generator (the policy, trained with PPO) against an encoder-only reward model that is also trained.

Generative Adversarial Policy Optimization (Gu et al., 2025) makes the reward model a GAN discriminator:

1. **Warm-up.** A small *bidirectional* encoder (BERT- or ModernBERT-style, built here from a local
   ``transformers`` config, no download) is fitted with the Bradley–Terry loss
   (:func:`rlbook.reward_model.train_reward_model` with :func:`encoder_scores`) on preference pairs: a
   constraint-satisfying response against a violating one (:func:`rlbook.tasks.preferences.build_preference_pairs`).
2. **Adversarial phase.** Rounds alternate ``generator_steps`` PPO steps of the policy
   (:class:`rlbook.trainer.Trainer`, preset ``"ppo"``, the encoder as ``reward_fn``, an ordinary value model as the
   critic, a KL penalty to the reference with coefficient 0.01 as in the released code) with ``encoder_steps``
   Bradley–Terry steps of the encoder on a mix of the existing pairs and fresh pairs built from the generator's
   latest samples.

What the paper's text leaves open, and what we assume: a fresh pair puts the task's reference response (the "real"
data) as chosen against a generator sample (the "fake") as rejected, as in a GAN; a sample identical to the
reference is skipped, and the encoder never sees the task's rule during the adversarial phase
(``negatives="non_reference"``). ``negatives="rule"`` rejects only the samples the task's rule marks wrong, so a
correct sample is never pushed down (the rule then labels the judge's fresh data).

Roles (erratum E29): the encoder is the reward/discriminator; the PPO critic is a separate value model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

from rlbook.lm import adamw
from rlbook.lm.value import build_value_model
from rlbook.reward_model import (
    RewardModelConfig,
    RewardModelScorer,
    bradley_terry_step,
    pair_accuracy,
    train_reward_model,
)
from rlbook.tasks.preferences import PreferencePair, build_preference_pairs
from rlbook.presets import preset
from rlbook.trainer import Trainer

ENCODER_SIZES = {  # hidden size, layers, heads, feed-forward size
    "tiny": (32, 1, 2, 64),
    "small": (64, 2, 2, 128),
    "base": (128, 2, 4, 256),
}
ARCHS = ("bert", "modernbert")


def build_encoder_reward_model(tokenizer, size: str = "small", arch: str = "bert", seed: int = 0,
                               max_length: int = 64, device=None):
    """A seeded bidirectional encoder with a one-number head (``…ForSequenceClassification``,
    ``num_labels=1``, no dropout) over the character vocabulary of ``tokenizer``; ``arch`` is
    ``"bert"`` or ``"modernbert"``.

    The score is read at the first token (BOS plays BERT's [CLS]) after :func:`compact_left`, so
    that every position attends to the whole prompt + response in both directions."""
    if size not in ENCODER_SIZES:
        raise ValueError(f"unknown encoder size {size!r}; choose one of {sorted(ENCODER_SIZES)}")
    if arch not in ARCHS:
        raise ValueError(f"unknown encoder arch {arch!r}; choose one of {ARCHS}")
    if max_length < 8:
        raise ValueError(f"max_length must be at least 8, got {max_length}")
    hidden, layers, heads, ffn = ENCODER_SIZES[size]
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, intermediate_size=ffn,
                  max_position_embeddings=max_length, pad_token_id=tokenizer.pad_token_id,
                  num_labels=1)
    torch.manual_seed(seed)
    if arch == "bert":
        config = BertConfig(**common, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = BertForSequenceClassification(config)
    else:
        from transformers import ModernBertConfig, ModernBertForSequenceClassification
        config = ModernBertConfig(**common, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id,
                                  cls_token_id=tokenizer.bos_token_id,
                                  sep_token_id=tokenizer.eos_token_id,
                                  global_attn_every_n_layers=1, local_attention=max_length,
                                  attention_dropout=0.0, mlp_dropout=0.0, embedding_dropout=0.0,
                                  classifier_dropout=0.0, classifier_pooling="cls")
        config._attn_implementation = "eager"
        model = ModernBertForSequenceClassification(config)
    if device is not None:
        model = model.to(device)
    return model.eval()


def compact_left(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's real tokens to the front, in order (the rollout layout pads prompts on the left and
    completions on the right); padding follows."""
    order = torch.sort((attention_mask == 0).to(torch.int8), dim=1, stable=True).indices
    return input_ids.gather(1, order), attention_mask.gather(1, order)


def encoder_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """r(x, y), (B,) float32, for rows of prompt + response laid out as :func:`encode_completions` does."""
    if input_ids.shape[1] > model.config.max_position_embeddings:
        raise ValueError(f"sequences of {input_ids.shape[1]} tokens exceed the encoder's "
                         f"{model.config.max_position_embeddings} positions")
    ids, mask = compact_left(input_ids, attention_mask)
    return model(input_ids=ids, attention_mask=mask).logits.squeeze(-1).float()


class EncoderScorer(RewardModelScorer):
    """The encoder as the Trainer's ``reward_fn(examples, completions, truncated) -> (B,)`` (scores
    read by :func:`encoder_scores`); it remembers the ``(example, completion)`` pairs it scored in
    ``seen`` so that the adversarial loop can build fresh pairs without a change to the trainer."""

    def __init__(self, model, tokenizer, **kwargs):
        super().__init__(model, tokenizer, score_fn=encoder_scores, **kwargs)
        self.seen: list[tuple] = []

    def __call__(self, examples, completions, truncated=None) -> np.ndarray:
        if len(examples) != len(completions):
            raise ValueError(f"got {len(examples)} examples and {len(completions)} completions")
        self.seen.extend(zip(examples, completions))
        return super().__call__(examples, completions, truncated)


def warmup_encoder(model, tokenizer, train_pairs, test_pairs, steps: int = 100, batch_size: int = 64,
                   lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Phase 1: fit the encoder on existing pairs; returns the held-out pair accuracy before and after."""
    if not train_pairs or not test_pairs:
        raise ValueError("warmup_encoder needs training and test pairs")
    if steps < 0 or batch_size < 1 or not lr > 0:
        raise ValueError(f"need steps >= 0, batch_size >= 1, lr > 0; got {steps}, {batch_size}, {lr}")
    before = pair_accuracy(model, tokenizer, test_pairs, encoder_scores)
    if steps == 0:
        return [before, before]
    config = RewardModelConfig(steps=steps, batch_size=batch_size, lr=lr, eval_every=steps, seed=seed)
    history = train_reward_model(model, tokenizer, train_pairs, test_pairs, config, score_fn=encoder_scores)
    return [before, history.eval_accuracy[-1]]


NEGATIVES = ("non_reference", "rule")


def check_negatives(negatives: str) -> str:
    """``negatives`` if it names one of :data:`NEGATIVES`; otherwise a ValueError that lists them."""
    if negatives not in NEGATIVES:
        raise ValueError(f"negatives must be one of {NEGATIVES}, got {negatives!r}")
    return negatives


def fresh_pairs(task, seen, negatives: str = "non_reference") -> list[PreferencePair]:
    """Pairs from generator samples: the task's reference response (chosen, "real") against a sample
    (rejected).

    ``negatives="non_reference"`` (the GAN reading): every sample that differs from the reference is
    "fake", even a correct one. ``negatives="rule"``: only samples the task's rule marks wrong are
    rejected; a correct sample is never pushed down."""
    check_negatives(negatives)
    pairs = []
    for example, completion in seen:
        reference, sample = task.demonstration(example), completion.strip()
        fake = (sample != reference if negatives == "non_reference"
                else not task.is_correct(example, completion))
        if fake:
            pairs.append(PreferencePair(prompt=example.prompt, chosen=reference, rejected=sample))
    return pairs


@dataclass
class GAPOConfig:
    """Knobs of :func:`train_gapo`. ``encoder_steps=0`` gives the baseline: PPO against the frozen warmed-up
    encoder. ``negatives`` picks which samples the fresh pairs reject (:func:`fresh_pairs`). ``rl`` overrides
    the ``"ppo"`` preset (TRL names); ``beta`` is its KL coefficient (in the reward, as PPO's)."""

    rounds: int = 4
    generator_steps: int = 5  # PPO steps per round
    encoder_steps: int = 5  # Bradley–Terry steps per round (0: frozen reward model)
    encoder_batch_size: int = 64
    fresh_fraction: float = 0.5  # share of fresh (reference vs sample) pairs in each encoder batch
    negatives: str = "non_reference"  # which samples a fresh pair rejects (see fresh_pairs)
    encoder_lr: float = 1e-3
    warmup_steps: int = 100
    num_train_pairs: int = 1000
    num_test_pairs: int = 256
    encoder_size: str = "small"
    encoder_arch: str = "bert"
    beta: float = 0.01  # the KL penalty's coefficient, in the per-token reward (OpenRLHF's init_kl_coef)
    # PPO at the learning rate the PPO chapter found safe with its four updates per rollout
    rl: dict = field(default_factory=lambda: dict(learning_rate=1e-4, num_generations=4,
                                                  per_device_train_batch_size=64, max_completion_length=16))
    seed: int = 0

    def __post_init__(self):
        for name in ("rounds", "generator_steps", "encoder_batch_size", "num_train_pairs", "num_test_pairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("encoder_steps", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        check_negatives(self.negatives)
        if not 0.0 <= self.fresh_fraction <= 1.0:
            raise ValueError(f"fresh_fraction must lie in [0, 1], got {self.fresh_fraction}")
        if not self.encoder_lr > 0 or self.beta < 0:
            raise ValueError(f"encoder_lr must be positive and beta >= 0, got {self.encoder_lr} and {self.beta}")


def train_gapo(policy, tokenizer, task, config: GAPOConfig | None = None, *, encoder=None,
               device=None, evaluate=None) -> dict:
    """Warm up an encoder reward model, then alternate PPO on the policy (in place) with encoder
    updates.

    Returns ``{"history": [...], "warmup_accuracy": [before, after], "encoder": model, "trainer":
    trainer}``; the history holds one dict per round (round 0: before any PPO step) with the
    encoder's held-out pair accuracy (``pair_accuracy``), the mean encoder ``reward`` and gold rate
    on training samples (``train_gold``), the gold constraint-satisfaction rate on held-out prompts
    by the task's rule (``gold``) and ``objective/kl_per_token``, the round's mean of the trainer's
    metric of that name (the per-token k1 to the reference of the samples; 0 in round 0).

    ``evaluate(policy, encoder) -> dict``, if given, runs after the warm-up and after every round;
    its entries join that round's history (an experiment's own held-out measurements)."""
    config = config or GAPOConfig()
    device = device if device is not None else next(policy.parameters()).device
    train_pairs = build_preference_pairs(task, config.num_train_pairs, seed=[config.seed, 1],
                                         split="train")
    test_pairs = build_preference_pairs(task, config.num_test_pairs, seed=[config.seed, 2],
                                        split="test")
    if encoder is None:
        encoder = build_encoder_reward_model(tokenizer, config.encoder_size, config.encoder_arch,
                                             seed=config.seed, device=device)
        warmup = warmup_encoder(encoder, tokenizer, train_pairs, test_pairs, config.warmup_steps,
                                config.encoder_batch_size, config.encoder_lr, seed=config.seed)
    else:
        warmup = [pair_accuracy(encoder, tokenizer, test_pairs, encoder_scores)] * 2
    scorer = EncoderScorer(encoder, tokenizer)
    rl = preset("ppo", beta=config.beta, seed=config.seed, **config.rl)
    trainer = Trainer(policy, tokenizer, task, rl, reward_fn=scorer,
                      value_model=build_value_model(policy, seed=config.seed))
    optimizer = adamw(encoder.parameters(), lr=config.encoder_lr)
    rng = np.random.default_rng([config.seed, 3])
    history = [{"round": 0, "pair_accuracy": warmup[1], "gold": trainer.evaluate(),
                "reward": float("nan"), "train_gold": float("nan"), "objective/kl_per_token": 0.0,
                "encoder_loss": float("nan"), "num_fresh_pairs": 0}]
    if evaluate is not None:
        history[0].update(evaluate(policy, encoder))
    for round_ in range(1, config.rounds + 1):
        scorer.seen.clear()
        steps = trainer.train(config.generator_steps, progress=False)[-config.generator_steps:]
        fresh = fresh_pairs(task, scorer.seen, config.negatives)
        losses = []
        for _ in range(config.encoder_steps):
            n_fresh = int(round(config.fresh_fraction * config.encoder_batch_size)) if fresh else 0
            batch = [fresh[i] for i in rng.integers(len(fresh), size=n_fresh)] if n_fresh else []
            batch += [train_pairs[i] for i in rng.integers(
                len(train_pairs), size=config.encoder_batch_size - n_fresh)]
            losses.append(bradley_terry_step(encoder, optimizer, tokenizer, batch, encoder_scores))
        history.append({"round": round_,
                        "pair_accuracy": pair_accuracy(encoder, tokenizer, test_pairs,
                                                       encoder_scores),
                        "gold": trainer.evaluate(),
                        "reward": float(np.mean([s["reward"] for s in steps])),
                        "train_gold": float(np.mean([s["accuracy"] for s in steps])),
                        "objective/kl_per_token": float(np.mean(
                            [s.get("objective/kl_per_token", 0.0) for s in steps])),
                        "encoder_loss": float(np.mean(losses)) if losses else float("nan"),
                        "num_fresh_pairs": len(fresh)})
        if evaluate is not None:
            history[-1].update(evaluate(policy, encoder))
    return {"history": history, "warmup_accuracy": warmup, "encoder": encoder, "trainer": trainer}
