"""Value models: a causal LM's transformer body with a scalar head, one value per token.

PPO's critic estimates V(q, o_<t), the expected final reward from the state "prompt plus the first t tokens". On a
language model that is a token-classification model with one label: the same transformer as the policy, and a
linear head ``score`` that maps each position's hidden state to a number (verl builds its critic the same way,
with ``AutoModelForTokenClassification(num_labels=1)``).

Initialisation (choose with ``init``):

- ``"policy"`` (our default): copy the policy's transformer body, so the critic starts from features that already
  read the task, and set the head to zero, so every first value is 0 and the first advantages are the plain
  rewards. verl's examples do this when the critic path is the actor's checkpoint.
- ``"random"``: a fresh model of the same shape (seeded), for comparison.

- ``"reward_model"``: copy the body *and* the head of a reward model (``reward_model=``), as InstructGPT and TRL
  do: the critic then starts out predicting the final score from every prefix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AutoModelForTokenClassification, PreTrainedModel

from rlbook.lm.device import resolve_device
from rlbook.lm.model import position_ids_from_mask


def scalar_head_model(policy: PreTrainedModel, auto_class, seed: int = 0) -> PreTrainedModel:
    """A fresh ``auto_class`` model (``AutoModelFor{Token,Sequence}Classification``) with ``policy``'s config, one
    label and no dropout (transformers' default is 0.1; RLHF implementations turn dropout off), seeded."""
    config = policy.config.__class__.from_dict(policy.config.to_dict())
    config.num_labels = 1
    config.classifier_dropout = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return auto_class.from_config(config)


def build_value_model(policy: PreTrainedModel, init: str = "policy", seed: int = 0,
                      reward_model: PreTrainedModel | None = None) -> PreTrainedModel:
    """A value model shaped like ``policy`` (``…ForTokenClassification``, one label, no dropout), on its device."""
    if init not in ("policy", "random", "reward_model"):
        raise ValueError(f"unknown value-model init {init!r}; choose 'policy', 'random' or 'reward_model'")
    if (init == "reward_model") != (reward_model is not None):
        raise ValueError("pass reward_model= exactly when init='reward_model'")
    value_model = scalar_head_model(policy, AutoModelForTokenClassification, seed)
    if init in ("policy", "reward_model"):
        source = policy if init == "policy" else reward_model
        value_model.base_model.load_state_dict(source.base_model.state_dict())
        with torch.no_grad():
            if init == "policy":
                value_model.score.weight.zero_()
            else:
                value_model.score.weight.copy_(reward_model.score.weight)
            source_bias = reward_model.score.bias if init == "reward_model" else None
            if value_model.score.bias is not None and source_bias is not None:
                value_model.score.bias.copy_(source_bias)
            elif value_model.score.bias is not None:
                value_model.score.bias.zero_()
    return value_model.to(resolve_device(None, policy)).eval()


def token_values(
    value_model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    """V at each completion token, (B, T) float32, 0 where ``completion_mask`` is 0.

    The value of token t is read at the position *before* it, the state from which o_t is chosen: the same
    columns as :func:`rlbook.rollout.sequence_logprobs` reads its logits from (``L − T − 1 .. L − 2``). The head
    runs in float32 also under autocast (:func:`float32_head`); the inputs move to the model's device.
    """
    device = resolve_device(None, value_model)
    input_ids, attention_mask, completion_mask = (t.to(device) for t in (input_ids, attention_mask, completion_mask))
    (B, L), T = input_ids.shape, completion_mask.shape[1]
    position_ids = position_ids_from_mask(attention_mask)
    hidden = value_model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids).last_hidden_state  # (B, L, H)
    values = float32_head(value_model.score, hidden)[:, L - T - 1 : L - 1, 0]  # (B, T)
    return values * completion_mask.to(values.dtype)


def float32_head(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` computed in float32, also under autocast and for 16-bit weights (gradients flow as usual).

    A scalar head (H -> 1) costs nothing next to the transformer body, and bf16 would round every value or reward
    to about 3 significant digits, while what the algorithms use are their small differences (a TD error, a
    reward margin). What the head reads, the body's last hidden state, is float32 already (the final RMSNorm
    computes in float32). In float32 this is ``head(hidden)`` exactly."""
    bias = None if head.bias is None else head.bias.float()
    with torch.autocast(hidden.device.type, enabled=False):
        return F.linear(hidden.float(), head.weight.float(), bias)
