"""Mixture-of-experts helpers: which experts the router picks for every token (chapter "GSPO").

A tiny mixture-of-experts policy is ``build_model("tiny", arch="qwen3_moe")`` (:mod:`rlbook.lm.model`): in each
layer a linear router scores ``num_experts`` SwiGLU experts for every token and sends the token to its
``num_experts_per_tok`` best ones, whose outputs are mixed with the renormalised router probabilities. The lean
forward (:mod:`rlbook.lm.lean`) does not support it, so :mod:`rlbook.rollout` uses the Hugging Face forward.

The choice is discrete: a small change of the weights can swap a token's experts, and then the token's log-prob
jumps. GSPO's paper names this as the reason token-level ratios fluctuate on MoE models. :func:`expert_choices`
records the choice; :func:`routing_changed` compares two policies' choices token by token; :func:`replay_routes`
makes a forward pass use recorded choices (Routing Replay, the GSPO paper's fix for GRPO on MoE models).

    choices_old = expert_choices(old_model, input_ids, attention_mask)     # (layers, B, L, k)
    choices_new = expert_choices(new_model, input_ids, attention_mask)
    changed = routing_changed(choices_old, choices_new)                    # (B, L) bool: any layer's set differs
"""

from __future__ import annotations

import contextlib

import torch

from rlbook.lm.model import position_ids_from_mask


def routers(model) -> list[torch.nn.Module]:
    """The router module of every MoE layer of ``model``, in layer order (an empty list for a dense model).

    A router is a module with a ``top_k`` attribute whose output is ``(logits, scores, indices)`` (transformers'
    ``*TopKRouter`` classes of Qwen2-MoE, Qwen3-MoE and Mixtral)."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k")]


def is_moe(model) -> bool:
    """True when ``model`` has at least one routed (mixture-of-experts) layer."""
    return bool(routers(model))


@torch.no_grad()
def expert_choices(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The experts every token is routed to: a (layers, B, L, k) long tensor, each token's k indices
    sorted.

    ``input_ids`` and ``attention_mask`` are (B, L), prompt and completion together (as in
    :func:`rlbook.rollout.sequence_logprobs`); padded positions get indices too, mask them out
    yourself. Raises ``ValueError`` for a model without routed layers."""
    gates = routers(model)
    if not gates:
        raise ValueError(f"{type(model).__name__} has no mixture-of-experts router: expert_choices "
                         "needs a MoE model such as build_model('tiny', arch='qwen3_moe')")
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(f"input_ids and attention_mask must both be (B, L), got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    recorded: list[torch.Tensor] = []
    hooks = [gate.register_forward_hook(lambda module, args, output: recorded.append(output[2]))
             for gate in gates]
    try:
        position_ids = position_ids_from_mask(attention_mask)  # left padding, as in rollout
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
              use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    B, L = input_ids.shape
    return torch.stack([indices.reshape(B, L, -1).sort(-1).values for indices in recorded])


@contextlib.contextmanager
def training_route_digests(model):
    """While active, one short SHA-256 digest of the experts chosen for every token in every layer per forward pass
    of ``model`` in training mode (evaluation passes in eval mode are skipped), appended to the list it yields; an
    empty list for a dense model. Two runs routed every token alike exactly when their digests are equal: the SFT
    loss-head check uses this to tell a routing flip (float rounding near a tie) from a changed recipe."""
    import hashlib

    digests: list[str] = []
    gates = routers(model)
    step: list[torch.Tensor] = []

    def record(module, args, output):  # the routers run in layer order, once each per forward pass
        if module.training:
            step.append(output[2].sort(-1).values.to(torch.int64).cpu())
            if len(step) == len(gates):
                digests.append(hashlib.sha256(b"".join(t.numpy().tobytes() for t in step)).hexdigest()[:16])
                step.clear()

    hooks = [gate.register_forward_hook(record) for gate in gates]
    try:
        yield digests
    finally:
        for hook in hooks:
            hook.remove()


def routing_changed(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: True where a token's set of experts differs between ``old`` and ``new`` in any layer.

    Both are (layers, B, L, k) from :func:`expert_choices` (indices sorted, so equal sets compare equal)."""
    if old.shape != new.shape:
        raise ValueError(f"expert choices of different shapes: {tuple(old.shape)} and {tuple(new.shape)}")
    return (old != new).any(-1).any(0)


def completion_routing_changed(old: torch.Tensor, new: torch.Tensor, completion_length: int) -> torch.Tensor:
    """(B, T) bool for ``T = completion_length`` completion tokens: True where the experts changed, in any layer,
    at the position whose output predicts that token. A token's log-prob is read off the hidden state of the
    position *before* it, so the routing that moves log pi(o_t) is that of position t - 1 (the last prompt token
    for o_1); a token's own routing acts only on the tokens after it.

    ``old`` and ``new`` are (layers, B, L, k) from :func:`expert_choices` over prompt and completion (L > T)."""
    if not 0 < completion_length < old.shape[2]:
        raise ValueError(f"completion_length must lie in [1, L - 1] for L = {old.shape[2]} positions, got "
                         f"{completion_length}")
    return routing_changed(old, new)[:, -completion_length - 1:-1]


def routed_scores(logits: torch.Tensor, indices: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """The router's mixing weights of the experts ``indices`` (N, k), from its ``logits`` (N, E): the softmax
    probabilities gathered at those experts, renormalised to sum to 1 when ``normalize`` (the router's
    ``norm_topk_prob``), in the logits' dtype. With ``indices`` the top-k of ``logits`` this is what the router
    itself returns; differentiable in ``logits``."""
    scores = logits.softmax(-1, dtype=torch.float).gather(-1, indices)
    if normalize:
        scores = scores / scores.sum(-1, keepdim=True)
    return scores.to(logits.dtype)


@contextlib.contextmanager
def replay_routes(model, choices: torch.Tensor):
    """Routing Replay (GSPO paper, its GRPO baseline on MoE models): while active, every router of ``model`` sends
    each token to the experts recorded in ``choices`` instead of its own top-k.

    ``choices`` is (layers, B, L, k) as :func:`expert_choices` returns for the old policy; every forward pass inside
    the block must be over the same (B, L) tokens. The routers still compute their logits, and the mixing weights
    are the current softmax probabilities at the recorded experts (:func:`routed_scores`), so gradients reach the
    routers through the weights; only the discrete choice is frozen. Raises ``ValueError`` for a dense model or
    ``choices`` of the wrong shape.

        routes = expert_choices(policy, input_ids, attention_mask)        # pi_old's experts, before the updates
        with replay_routes(policy, routes):
            logp = sequence_logprobs(policy, input_ids, attention_mask, mask)  # pi_theta on pi_old's routes
    """
    gates = routers(model)
    if not gates:
        raise ValueError(f"{type(model).__name__} has no mixture-of-experts router: replay_routes needs a MoE model")
    if choices.dim() != 4 or choices.shape[0] != len(gates) or choices.shape[-1] != gates[0].top_k:
        raise ValueError(f"choices must be (layers={len(gates)}, B, L, k={gates[0].top_k}) as expert_choices "
                         f"returns, got {tuple(choices.shape)}")

    def replace(layer: int):
        def hook(module, args, output):
            logits = output[0]
            indices = choices[layer].reshape(-1, choices.shape[-1]).to(logits.device)
            if indices.shape[0] != logits.shape[0]:
                raise ValueError(f"replay_routes: the forward pass has {logits.shape[0]} tokens, the recorded "
                                 f"routes {indices.shape[0]} (B x L = {tuple(choices.shape[1:3])})")
            return logits, routed_scores(logits, indices, getattr(module, "norm_topk_prob", True)), indices
        return hook

    hooks = [gate.register_forward_hook(replace(layer)) for layer, gate in enumerate(gates)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
