"""The models a :class:`rlbook.trainer.Trainer` update trains, as one module (what ``DistributedDataParallel``
wraps), and the frozen reference copy of a policy."""

from __future__ import annotations

import contextlib
import copy

import torch

from rlbook.lm.moe import replay_routes
from rlbook.lm.value import token_values
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
