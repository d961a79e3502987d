"""The models a :class:`rlbook.trainer.Trainer` trains, as one module (what ``DistributedDataParallel`` wraps), its
optimizer, the frozen reference copy of a policy, and what the models say about a rollout before any update (the
numbers every update compares against)."""

from __future__ import annotations

import contextlib
import copy

import torch

from rlbook.advantages import VALUE_MODEL_ESTIMATORS
from rlbook.lm.device import adamw, autocast, low_precision
from rlbook.lm.moe import expert_choices, is_moe, replay_routes, routers
from rlbook.lm.value import build_value_model, token_values
from rlbook.metrics import reference_kl_metrics
from rlbook.rollout import sequence_logprobs


class Learner(torch.nn.Module):
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


def frozen_copy(model):
    """A deep copy of ``model`` in eval mode whose parameters need no gradient (the KL's reference)."""
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


def check_routing(policy, config) -> None:
    """The settings about routers (``routing_replay``, ``router_learning_rate``) need a mixture-of-experts
    policy."""
    for name in ("routing_replay", "router_learning_rate"):
        if getattr(config, name) not in (None, False) and not is_moe(policy):
            raise ValueError(f"{name} needs a mixture-of-experts policy, but "
                             f"{type(policy).__name__} has no router; leave {name} unset")


def value_model_for(policy, config, value_model=None):
    """The value model the advantage estimator needs: the one given, or one built like ``policy``
    (``value_init``); None when the estimator uses none (and then none may be given)."""
    if value_model is not None and not config.needs_value_model:
        raise ValueError(f"a value_model was given, but advantage_estimator="
                         f"{config.advantage_estimator!r} uses none; drop value_model or use "
                         f"an estimator that learns values {sorted(VALUE_MODEL_ESTIMATORS)}")
    if config.needs_value_model and value_model is None:
        value_model = build_value_model(policy, init=config.value_init, seed=config.seed)
    return value_model


def learner_optimizer(policy, value_model, config) -> torch.optim.Optimizer:
    """AdamW over the policy's (and the value model's) parameters; a MoE's routers in their own group when
    they learn at their own rate (``router_learning_rate``)."""
    params = list(policy.parameters()) + (list(value_model.parameters()) if value_model else [])
    gates = [gate.weight for gate in routers(policy)] if config.router_learning_rate is not None else []
    groups = [{"params": [p for p in params if all(p is not g for g in gates)]}]
    if gates:
        groups.append({"params": gates, "lr": config.router_learning_rate, "name": "router"})
    return adamw(groups, lr=config.learning_rate, weight_decay=config.weight_decay)


def lambda_parameter(config, optimizer: torch.optim.Optimizer, device):
    """λ-GRPO's learnable λ (starting at ``lambda_grpo_init``) in its own parameter group of ``optimizer``, at
    its own rate, without weight decay and outside the gradient clipping; None unless ``lambda_grpo``."""
    if not config.lambda_grpo:
        return None
    lam = torch.nn.Parameter(torch.tensor(config.lambda_grpo_init, device=device))
    optimizer.add_param_group({"params": [lam], "weight_decay": 0.0, "lr": config.lambda_grpo_learning_rate,
                               "name": "lambda"})
    return lam


@torch.no_grad()
def old_numbers(policy, reference, value_model, batch, mask, config, device, metrics: dict) -> tuple:
    """What the updates compare against, in the training forward's precision: pi_old's log-probs, the
    reference's (the KL to it into ``metrics``), the critic's values, and the experts pi_old routes every token
    to (Routing Replay: the updates reuse them).

    The sampler's log-probs are the behaviour policy's; with several updates per rollout, a sampler at another
    temperature, or arithmetic below float32 (bf16 autocast on a GPU: the cached decode and the training
    forward round differently) we recompute them with the training forward pass, so that the first ratio is
    exactly 1 (as TRL does), unless old_logprobs="sampler". The sampler-mismatch correction compares the two,
    so it always recomputes (as TRL does with vLLM)."""
    c, input_ids, attention_mask = config, batch.input_ids, batch.attention_mask
    with autocast(device):  # (low_precision reads it)
        if c.old_logprobs == "learner" and (
                c.num_iterations > 1 or c.steps_per_generation > c.gradient_accumulation_steps
                or c.sampling_temperature != c.temperature or c.vllm_importance_sampling_correction
                or low_precision(policy)):
            old_logp = sequence_logprobs(policy, input_ids, attention_mask, mask, temperature=c.temperature)
        else:
            old_logp = batch.logprobs
        ref_logp = None
        if reference is not None:
            ref_logp = sequence_logprobs(reference, input_ids, attention_mask, mask, temperature=c.temperature)
            metrics.update(reference_kl_metrics(old_logp, ref_logp, mask))
        old_values = token_values(value_model, input_ids, attention_mask, mask) if value_model else None
        routes = expert_choices(policy, input_ids, attention_mask) if c.routing_replay else None
    return old_logp, ref_logp, old_values, routes


def empty_backward(learner, scored, temperature: float, value_only: bool, device) -> dict:
    """Under torchrun, a micro-batch that holds none of this process's rows while others' hold some: DDP
    averages gradients over every process, so this one runs a forward on one of its rows and backpropagates
    zero times its output."""
    row = torch.zeros(1, dtype=torch.long, device=device)
    with autocast(device):
        outputs = learner(scored.input_ids[row], scored.attention_mask[row], scored.mask[row], temperature,
                          with_policy=not value_only,
                          routes=None if scored.routes is None else scored.routes[:, row])
    sum(0.0 * out.sum() for out in outputs if out is not None).backward()
    return {}
