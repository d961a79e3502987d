"""A lean forward pass over a Hugging Face Llama / Qwen2 model's own weights, for speed at the book's sizes.

At 0.1M-10M parameters a forward through ``LlamaForCausalLM`` spends most of its time in Python, not in
arithmetic: output dataclasses, decorators that capture outputs, mask builders that inspect their inputs,
cache objects, ~20 module calls per layer. ``bench/grpo_bench.py`` measured it: the arithmetic matrices of a
decode step take a fraction of its wall time. This module computes *the same function* with a dozen tensor
operations per layer, reading the parameters of the Hugging Face model it is given (so the model stays the
interface: its ``state_dict``, optimizer, ``save_pretrained`` are untouched, and gradients flow into its
parameters). Rotary cos/sin come from the model's own ``rotary_emb`` module, so every RoPE variant it knows is
handled.

:func:`supports` says whether a model is one this forward reproduces exactly (plain Llama or Qwen2 decoder
layers, SiLU MLP, no attention dropout, no sliding window, logits = lm_head(hidden)); for anything else the
callers (:mod:`rlbook.rollout`) use the Hugging Face forward. tests/test_lean.py checks both give the same
hidden states, logits, cached decoding and gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # the two architectures of rlbook.lm.model
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    _CLASSES: tuple = (LlamaForCausalLM, Qwen2ForCausalLM)
except ImportError:  # pragma: no cover
    _CLASSES = ()


ENABLED = True  # False: rlbook.rollout uses the Hugging Face forward everywhere (to compare; bench/grpo_bench.py)


def supports(model) -> bool:
    """True when :func:`hidden_states` computes exactly what ``model.base_model`` computes (and ``ENABLED``)."""
    if not ENABLED or type(model) not in _CLASSES:
        return False
    config = model.config
    return (
        getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "attention_dropout", 0.0)
        and getattr(config, "pretraining_tp", 1) in (None, 1)
        and not getattr(config, "use_sliding_window", False)
        and not getattr(config, "final_logit_softcapping", None)
        and not getattr(config, "logit_scale", None)
        and not getattr(config, "output_attentions", False)
    )


class LeanCache:
    """Keys and values of every layer, (B, kv_heads, S, head_dim) each, grown by concatenation."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keys = [k[indices] for k in self.keys]
        self.values = [v[indices] for v in self.values]


def _rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    # LlamaRMSNorm / Qwen2RMSNorm: normalise in float32, cast back, then scale.
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
    return module.weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                  cache: LeanCache | None = None) -> torch.Tensor:
    """The last hidden states (B, L, H) of ``model.base_model`` for ``input_ids`` (B, L).

    ``attention_mask`` (B, S) covers every position the queries may see: the cached ones, then these ``L``
    (S = cached length + L). ``position_ids`` (B, L) are the rotary positions. Queries attend causally to the
    positions whose mask is 1; a query that would see none (a left-padding position) attends to itself, so
    that no NaN appears (its output is never used).
    """
    body = model.base_model
    B, L = input_ids.shape
    x = body.embed_tokens(input_ids)
    cos, sin = body.rotary_emb(x, position_ids)  # (B, L, head_dim)
    cos, sin = cos[:, None], sin[:, None]
    S = attention_mask.shape[1]
    visible = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S)
    if L > 1:  # causal within the new positions (query i sits at column S - L + i)
        columns = torch.arange(S, device=input_ids.device)
        rows = torch.arange(S - L, S, device=input_ids.device)
        causal = columns[None, :] <= rows[:, None]  # (L, S)
        visible = (visible & causal) | (columns[None, :] == rows[:, None])
    for index, layer in enumerate(body.layers):
        attn = layer.self_attn
        h = _rms_norm(layer.input_layernorm, x)
        q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(B, L, -1, attn.head_dim).transpose(1, 2)
        k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(B, L, -1, attn.head_dim).transpose(1, 2)
        v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(B, L, -1, attn.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(index, k, v)
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)) * attn.scaling  # (B, heads, L, S)
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        out = scores.softmax(-1, dtype=torch.float32).to(q.dtype) @ v  # (B, heads, L, head_dim)
        out = out.transpose(1, 2).reshape(B, L, -1)
        x = x + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
        mlp = layer.mlp
        h = _rms_norm(layer.post_attention_layernorm, x)
        gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
        up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
        x = x + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
    return _rms_norm(body.norm, x)
