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

from rlbook.lm.model import position_ids_from_mask

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


def decodes(model) -> bool:
    """True when :class:`Decoder` can sample from ``model``: :func:`supports`, and a rotary embedding whose
    frequencies do not depend on the sequence length (so that one table of cos/sin serves every step)."""
    rope = getattr(getattr(model, "base_model", None), "rotary_emb", None)
    return supports(model) and "dynamic" not in str(getattr(rope, "rope_type", "default"))


class Decoder:
    """Cached decoding of a Llama / Qwen2 model: prefill the prompts once, then one new token per row per step.

    Built once per sampling call, so that a decode step does only the work that changes from step to step:

    - keys and values go into buffers preallocated for ``capacity`` positions (prompt length + token budget),
      written in place: a step copies one position per layer, not the whole cache;
    - each layer's query/key/value and gate/up projections are concatenated into one matrix each (5 matrix
      products per layer instead of 7); the weights do not change during one sampling call;
    - the rotary cos/sin of every position come from one call of the model's ``rotary_emb`` (a table indexed by
      position), and the attention mask is kept as an additive bias, so neither is rebuilt per step;
    - grouped-query attention stacks the query heads that share a key/value head as rows of one product, instead
      of repeating the cache to every query head (:func:`_attend_cached`), and in float32 the residual additions
      go into the output products (``addmm``);
    - built under autocast (bf16 on a GPU), it casts those weights once, keeps the key cache and the mask in
      autocast's dtype, and rounds as the learner's autocast forward does (:func:`_residual_linear`,
      :func:`_attend_cached`, :func:`_rotary`): the residual stream stays float32 and the sampled tokens'
      log-probs equal :func:`rlbook.rollout.sequence_logprobs` under the same autocast to about 1e-6
      (tests/test_bf16_emulation.py). Use it under the autocast it was built under.

    ``prefill(ids, mask)`` takes left-padded prompts (N, P) and returns the next-token logits (N, V);
    ``repeat_interleave(G)`` repeats every row G times (G completions per prompt); ``select(rows)`` keeps those
    rows of the batch; ``step(tokens)`` feeds one token per row and returns the next logits (b, V).
    tests/test_lean.py checks the logits against a full forward of the Hugging Face model.
    """

    def __init__(self, model, capacity: int):
        if not decodes(model):
            raise ValueError(f"lean.Decoder does not reproduce {type(model).__name__} with this config; "
                             "use the Hugging Face forward (lean.decodes(model) is False)")
        self.capacity = capacity
        self.body, self.head = model.base_model, model.get_output_embeddings()
        config = model.config
        self.kv_heads = config.num_key_value_heads
        self.groups = config.num_attention_heads // config.num_key_value_heads
        self.embedding = self.body.embed_tokens.weight
        # Under autocast (bf16 on a GPU) the products' weights are cast once, here, not at every step (autocast
        # caches the casts of parameters only, and these are new tensors), and the cache holds keys in that dtype.
        self.cast_to = _autocast_dtype(self.embedding.device)
        # addmm's one rounding of x + h @ W only where the learner's forward is float32 too (see _residual_linear)
        self.float32 = self.cast_to is None and self.embedding.dtype in (torch.float32, torch.float64)
        self.layers = [(layer, _FusedLayer(layer, self.cast_to, self.float32)) for layer in self.body.layers]
        self.head_weight, self.head_bias = _cast(self.head.weight, self.cast_to), _cast(self.head.bias, self.cast_to)
        self.final_norm = self.body.norm.weight, self.body.norm.variance_epsilon
        # per layer: keys (b, kv_heads, d, capacity), stored transposed (the score product then reads them in
        # the layout it wants: 1.5-1.8x faster), values (b, kv_heads, capacity, d); positions < length are filled
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        body, (N, P) = self.body, input_ids.shape
        if P > self.capacity:
            raise ValueError(f"{P} prompt positions do not fit a Decoder of capacity {self.capacity}")
        x = body.embed_tokens(input_ids)
        cos, sin = body.rotary_emb(x, torch.arange(self.capacity, device=x.device)[None])  # (1, capacity, d)
        half = cos.shape[-1] // 2
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # rotate_half(t) * sin = roll(t) * this
        self.rope = torch.stack([cos[0], sin[0]], dim=1)[:, :, None]  # (capacity, 2, 1, d): one lookup a step
        self.positions = attention_mask.sum(-1)  # (N,): the position id of each row's next token
        # the mask as a bias added to the scores, one row per (row, kv head); the positions after the prompt are
        # visible (a finished row attends to what it is fed after its end: harmless, nothing after it is kept)
        visible = torch.ones((N, self.capacity), dtype=torch.bool, device=x.device)
        visible[:, :P] = attention_mask.bool()
        dtype = self.cast_to or x.dtype  # the scores' dtype
        self.bias = _mask_bias(visible[:, None, None, :], self.kv_heads, 1, dtype)  # (N * kv_heads, 1, capacity)
        self.bias = self.bias.view(N, self.kv_heads, 1, self.capacity)
        prompt_bias = _mask_bias(_causal(visible[:, None, None, :P], P, P, x.device), self.kv_heads, self.groups,
                                 dtype)  # causal within the prompt: (N * kv_heads, groups * P, P)
        rope = self.rope[position_ids_from_mask(attention_mask)]  # (N, P, 2, 1, d): 1 broadcasts over heads
        cos, sin = rope[:, :, 0], rope[:, :, 1]
        for layer, fused in self.layers:
            q, k, v = (t.transpose(1, 2) for t in _rotated_qkv(layer, x, cos, sin, fused))  # (N, heads, P, d)
            # under autocast the cache holds what the score product reads, cast once as it is written
            keys = k.new_empty((N, self.kv_heads, k.shape[-1], self.capacity), dtype=self.cast_to or k.dtype)
            values = v.new_empty((N, self.kv_heads, self.capacity, v.shape[-1]), dtype=self.cast_to or v.dtype)
            keys[..., :P], values[:, :, :P] = k.transpose(2, 3), v
            self.keys.append(keys), self.values.append(values)
            out = _attend_cached(fused.scaling, q, keys[..., :P], v, prompt_bias, self.float32)
            out = out.transpose(1, 2).reshape(N, P, -1)
            x = _attention_output_and_mlp(layer, x, out, fused)
        self.length = P
        return F.linear(_rms_norm(body.norm, x[:, -1]), self.head_weight, self.head_bias)

    def repeat_interleave(self, repeats: int) -> None:
        """Every row ``repeats`` times in a row (rows i*G .. i*G + G - 1 continue prompt i)."""
        self.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]
        self.bias = self.bias.repeat_interleave(repeats, dim=0)
        self.positions = self.positions.repeat_interleave(repeats, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows of the batch (indices into the current batch)."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.bias, self.positions = self.bias[rows], self.positions[rows]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` (b,), one per row, at the next position; return the next-token logits (b, V).
        The layer of :func:`_rotated_qkv`, :func:`_attend_cached` and :func:`_attention_output_and_mlp`, written
        out over the plain tensors of :class:`_FusedLayer` for one position per row."""
        t, b = self.length, len(tokens)
        if t >= self.capacity:
            raise ValueError(f"the Decoder is full: it has room for {self.capacity} positions")
        x = F.embedding(tokens, self.embedding)  # (b, H)
        rope = self.rope[self.positions]  # (b, 2, 1, d)
        cos, sin = rope[:, 0], rope[:, 1]
        bias = self.bias.view(b * self.kv_heads, 1, self.capacity)[:, :, : t + 1]
        for (_, w), keys, values in zip(self.layers, self.keys, self.values):
            qkv = F.linear(_rms(x, *w.input_norm), w.qkv_weight, w.qkv_bias).view(b, -1, w.head_dim)
            qk = qkv[:, : w.num_qk_heads]
            qk = _rotary(qk, cos, sin, self.float32)  # sin pre-signed, see prefill
            keys[..., t], values[:, :, t] = qk[:, w.num_heads :], qkv[:, w.num_qk_heads :]
            out = _attend_cached(w.scaling, qk[:, : w.num_heads, None], keys[..., : t + 1], values[:, :, : t + 1],
                                 bias, self.float32)
            x = _residual_linear(x, out.view(b, -1), w.o_weight_t, w.o_bias, self.float32)
            gate, up = F.linear(_rms(x, *w.post_norm), w.gate_up_weight, w.gate_up_bias).chunk(2, dim=-1)
            x = _residual_linear(x, F.silu(gate).mul_(up), w.down_weight_t, w.down_bias, self.float32)
        self.length, self.positions = t + 1, self.positions + 1
        return F.linear(_rms(x, *self.final_norm), self.head_weight, self.head_bias)


def _mask_bias(visible: torch.Tensor, kv_heads: int, groups: int, dtype) -> torch.Tensor:
    """``visible`` (B, 1, L, S) as an additive bias laid out as :func:`_attend_cached`'s scores,
    (B * kv_heads, groups * L, S): 0 where visible, the dtype's minimum elsewhere."""
    B, _, L, S = visible.shape
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)
    return bias[:, :, None].expand(B, kv_heads, groups, L, S).reshape(B * kv_heads, groups * L, S)


def _residual_linear(x: torch.Tensor, h: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None,
                     float32: bool = True):
    """``x + h @ weight_t (+ bias)`` for (b, in) ``h``, the residual ``x`` kept in its dtype.

    In float32 one ``addmm`` when there is no bias. Otherwise (``float32=False``: under autocast, or weights in
    bf16/fp16) the product is rounded to its dtype before the addition, as the learner's ``x + F.linear(h, W)``
    does: under autocast ``addmm`` would cast the float32 residual itself to bf16 and return it rounded, after
    every block (the log-probs then differed from the learner's by 3e-3 on average, against 3e-7)."""
    if bias is not None:
        return x + F.linear(h, weight_t.t(), bias)
    if float32:
        return torch.addmm(x, h, weight_t)
    return x + torch.mm(h, weight_t)


class _FusedLayer:
    """A decoder layer's weights for cached decoding: [q; k; v] and [gate; up] concatenated (with their biases),
    the output and down projections transposed for ``addmm``, the norms' scales and epsilons, as plain tensors
    and numbers (reading them off the modules at every step costs more than the arithmetic, at these sizes).

    ``cast_to`` (autocast's dtype, or None): the products' weights and biases are cast to it here, once; autocast
    would cast them at every step, since it caches the casts of parameters only. The norms' scales stay as they
    are (the norms run in float32)."""

    def __init__(self, layer, cast_to: torch.dtype | None = None, float32: bool = True):
        attn, mlp = layer.self_attn, layer.mlp
        self.float32 = float32  # the forward's arithmetic: float32 (or float64), or rounded as the learner's
        with torch.no_grad():
            self.qkv_weight, self.qkv_bias = _concatenated(attn.q_proj, attn.k_proj, attn.v_proj, cast_to=cast_to)
            self.gate_up_weight, self.gate_up_bias = _concatenated(mlp.gate_proj, mlp.up_proj, cast_to=cast_to)
            self.o_weight_t, self.o_bias = _cast(attn.o_proj.weight, cast_to).t(), _cast(attn.o_proj.bias, cast_to)
            self.down_weight_t = _cast(mlp.down_proj.weight, cast_to).t()
            self.down_bias = _cast(mlp.down_proj.bias, cast_to)
        self.input_norm = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.post_norm = layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.num_heads = attn.q_proj.out_features // attn.head_dim
        self.num_qk_heads = self.num_heads + attn.k_proj.out_features // attn.head_dim


def _concatenated(*projections, cast_to: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = _cast(torch.cat([p.weight for p in projections]), cast_to)
    if all(p.bias is None for p in projections):
        return weight, None
    return weight, _cast(torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features)
                                    for p in projections]), cast_to)


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """``t`` in ``dtype`` (a floating-point ``t`` only; None stays None, and so does ``dtype=None``)."""
    if t is None or dtype is None or not t.is_floating_point():
        return t
    return t.detach().to(dtype)


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes products in on ``device`` (bf16 under :func:`rlbook.lm.autocast` on a GPU),
    or None when autocast is off there."""
    if not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def _rotary(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, float32: bool = True) -> torch.Tensor:
    """The rotary embedding of ``qk`` (..., heads, d) with ``sin`` pre-signed (``-sin`` on the first half): then
    ``rotate_half(qk) * sin`` of :func:`_rotated_qkv` is ``qk.roll(d / 2) * sin``. In float32 one ``addcmul``;
    otherwise a product and a sum, each rounded as the learner's ``q * cos + rotate_half(q) * sin``."""
    rolled = qk.roll(qk.shape[-1] // 2, dims=-1)
    if float32:
        return torch.addcmul(qk * cos, rolled, sin)
    return qk * cos + rolled * sin


def _rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    return _rms(x, module.weight, module.variance_epsilon)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # LlamaRMSNorm / Qwen2RMSNorm: normalise in float32, cast back, then scale; in float32, torch's fused kernel.
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                  wanted: torch.Tensor | None = None, shared_prefix: int | None = None) -> torch.Tensor:
    """The last hidden states (B, L, H) of ``model.base_model`` for ``input_ids`` (B, L), without a cache (the
    training forward, a reference model; cached decoding is :class:`Decoder`).

    ``attention_mask`` (B, L) marks the real tokens; ``position_ids`` (B, L) are the rotary positions. Queries
    attend causally to the positions whose mask is 1; a query that would see none (a left-padding position)
    attends to itself, so that no NaN appears.

    Only the real tokens go through the per-token layers (norms, projections, MLP), packed into one (n, H)
    matrix; the (B, L) layout is rebuilt only for the attention scores. Padding is skipped, not computed and
    discarded, and padding positions come back as zeros. ``wanted`` (B, L) bool, optional, names the positions
    whose output the caller reads (those that predict a scored token): the last layer's output projection and MLP
    run on those alone, since nothing else reads them.

    ``shared_prefix`` = P: the first P columns are a prompt that several rows share (GRPO's G completions of one
    prompt). Each distinct prompt then runs once, and the rows' completion tokens attend to its keys and values,
    as sampling with a prefilled cache does; gradients from all G rows meet in the one prompt computation. The
    returned prompt positions are those of the shared computation.
    """
    if shared_prefix:
        return _grouped_hidden_states(model, input_ids, attention_mask, position_ids, wanted, shared_prefix)
    return _packed_hidden_states(model, input_ids, attention_mask, position_ids, wanted)


def _attend_cached(scaling: float, q, keys, values, bias, float32: bool = True):
    """Attention for cached decoding: queries (B, heads, L, d) over the cache's keys, transposed (B, kv_heads, d,
    S), and values (B, kv_heads, S, d); ``bias`` (B * kv_heads, groups * L, S) holds 0 where visible and the
    dtype's minimum elsewhere.

    Grouped-query attention without repeating the cache: the query heads that share a key/value head are stacked
    as more query rows, so each product is one matrix per key/value head, and a decode step (L = 1) multiplies
    ``groups`` rows at a time. In float32 scaling and mask go into the product itself (``baddbmm``); otherwise
    (``float32=False``: autocast, bf16 weights) the product is rounded first and then scaled, as :func:`_attend`
    does, so that the sampler's scores round as the learner's."""
    B, H, L, d = q.shape
    kv_heads, S = keys.shape[1], keys.shape[3]
    groups = H // kv_heads
    q, keys = q.reshape(B * kv_heads, groups * L, d), keys.reshape(B * kv_heads, d, S)
    if float32:
        scores = torch.baddbmm(bias, q, keys, alpha=scaling)
    else:
        scores = torch.bmm(q, keys).mul_(scaling).add_(bias)
    probs = _softmax(scores).to(q.dtype)
    return torch.bmm(probs, values.reshape(B * kv_heads, S, d)).view(B, H, L, d)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """``scores.softmax(-1)`` in float32. On a CPU, rows shorter than 16 are first padded with ``-inf`` to 16
    columns (the padding gets probability 0): torch's CPU kernel goes element by element below 16 columns (one
    AVX-512 vector of float32), 10-15x slower than at 16, and our prompts plus completions are often shorter."""
    columns = scores.shape[-1]
    if columns < 16 and scores.device.type == "cpu":
        padded = F.pad(scores, (0, 16 - columns), value=float("-inf"))
        return padded.softmax(-1, dtype=torch.float32)[..., :columns]
    return scores.softmax(-1, dtype=torch.float32)


def _causal(visible: torch.Tensor, S: int, L: int, device) -> torch.Tensor:
    columns = torch.arange(S, device=device)
    rows = torch.arange(S - L, S, device=device)
    causal = columns[None, :] <= rows[:, None]  # (L, S)
    return (visible & causal) | (columns[None, :] == rows[:, None])


def _attend(attn, q, k, v, visible):
    """Softmax attention of queries (B, heads, L, d) over keys (B, kv_heads, S, d), hiding where not ``visible``.

    Grouped-query attention: each key/value head serves ``heads / kv_heads`` query heads; the keys and values are
    repeated to the query heads. (Cached decoding stacks the query heads instead, :func:`_attend_cached`; in the
    training forward that saved no time and autograd kept more memory.)"""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = _repeat_heads(k, groups), _repeat_heads(v, groups)
    scores = (q @ k.transpose(-1, -2)) * attn.scaling  # (B, heads, L, S)
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    return _softmax(scores).to(q.dtype) @ v


def _repeat_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """``t.repeat_interleave(groups, dim=1)`` for (B, kv_heads, S, d), as a strided copy (half the time)."""
    B, kv_heads, S, d = t.shape
    return t[:, :, None].expand(B, kv_heads, groups, S, d).reshape(B, kv_heads * groups, S, d)


def _rotated_qkv(layer, x, cos, sin, fused: _FusedLayer | None = None):
    """Queries and keys (rotated by the rotary embedding) and values of ``x`` (..., H), each (..., heads, d);
    with ``fused``, one product for all three and one rotation for queries and keys together."""
    attn = layer.self_attn
    h = _rms_norm(layer.input_layernorm, x)
    if fused is not None:
        qkv = F.linear(h, fused.qkv_weight, fused.qkv_bias).unflatten(-1, (-1, attn.head_dim))
        qk = qkv[..., : fused.num_qk_heads, :]  # here `sin` is signed for the roll (see Decoder.prefill)
        qk = _rotary(qk, cos, sin, fused.float32)
        return qk[..., : fused.num_heads, :], qk[..., fused.num_heads :, :], qkv[..., fused.num_qk_heads :, :]
    q, k, v = (F.linear(h, proj.weight, proj.bias).unflatten(-1, (-1, attn.head_dim))
               for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def _attention_output_and_mlp(layer, x, attention_out, fused: _FusedLayer | None = None):
    """The rest of a decoder layer: the residual of the attention's output projection, then of the MLP."""
    attn = layer.self_attn
    if fused is None:
        x = x + F.linear(attention_out, attn.o_proj.weight, attn.o_proj.bias)
    else:  # the same weights, cast once under autocast
        x = x + F.linear(attention_out, fused.o_weight_t.t(), fused.o_bias)
    return x + _mlp(layer, x, fused)


def _mlp(layer, x, fused: _FusedLayer | None = None):
    mlp = layer.mlp
    h = _rms_norm(layer.post_attention_layernorm, x)
    if fused is not None:
        gate, up = F.linear(h, fused.gate_up_weight, fused.gate_up_bias).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, fused.down_weight_t.t(), fused.down_bias)
    gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
    up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
    return F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)


def _packed_hidden_states(model, input_ids, attention_mask, position_ids, wanted):
    body = model.base_model
    B, L = input_ids.shape
    real = attention_mask.bool()
    flat = real.reshape(-1).nonzero().squeeze(1)  # (n,): the real tokens, row-major
    if wanted is None:
        last = None
    else:  # where the wanted positions sit among the real tokens
        slot = torch.full((B * L,), -1, dtype=torch.long, device=input_ids.device)
        slot[flat] = torch.arange(len(flat), device=input_ids.device)
        last = slot[(wanted & real).reshape(-1).nonzero().squeeze(1)]
    x = body.embed_tokens(input_ids.reshape(-1)[flat])  # (n, H)
    cos, sin = body.rotary_emb(x[None], position_ids.reshape(1, -1)[:, flat])  # (1, n, head_dim)
    cos, sin = cos[0, :, None], sin[0, :, None]  # (n, 1, head_dim)
    visible = _causal(real[:, None, None, :], L, L, input_ids.device)  # (B, 1, L, L)
    n_layers = len(body.layers)

    def unpack(t):  # (n, heads, d) -> (B, heads, L, d), zeros at padding
        full = t.new_zeros((B * L, *t.shape[1:])).index_copy(0, flat, t)
        return full.view(B, L, *t.shape[1:]).transpose(1, 2)

    for index, layer in enumerate(body.layers):
        q, k, v = _rotated_qkv(layer, x, cos, sin)  # (n, heads, d)
        out = _attend(layer.self_attn, unpack(q), unpack(k), unpack(v), visible)  # (B, heads, L, d)
        out = out.transpose(1, 2).reshape(B * L, -1)[flat]  # (n, heads * d)
        if last is not None and index == n_layers - 1:  # nothing reads the other positions' last-layer output
            out, x = out[last], x[last]
        x = _attention_output_and_mlp(layer, x, out)
    x = _rms_norm(body.norm, x)
    where = flat if last is None else flat[last]
    return x.new_zeros((B * L, x.shape[-1])).index_copy(0, where, x).view(B, L, -1)


def _grouped_hidden_states(model, input_ids, attention_mask, position_ids, wanted, P):
    body = model.base_model
    B, L = input_ids.shape
    T, device = L - P, input_ids.device
    prompts = torch.cat([input_ids[:, :P], attention_mask[:, :P]], dim=1)
    unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)  # (U, 2P), (B,)
    U = len(unique)
    rep = torch.empty(U, dtype=torch.long, device=device).scatter_(0, inverse, torch.arange(B, device=device))
    p_real, c_real = attention_mask[rep, :P].bool(), attention_mask[:, P:].bool()  # (U, P), (B, T)
    p_flat, c_flat = p_real.reshape(-1).nonzero().squeeze(1), c_real.reshape(-1).nonzero().squeeze(1)
    n_p = len(p_flat)
    if wanted is None:
        sel_p, sel_c = None, None
    else:  # the last layer's output is needed only where some row reads it
        need_p = torch.zeros((U, P), dtype=torch.int32, device=device).index_add_(0, inverse, wanted[:, :P].int())
        sel_p = (need_p.reshape(-1)[p_flat] > 0).nonzero().squeeze(1)
        sel_c = wanted[:, P:].reshape(-1)[c_flat].nonzero().squeeze(1)
    ids = torch.cat([input_ids[rep, :P].reshape(-1)[p_flat], input_ids[:, P:].reshape(-1)[c_flat]])
    positions = torch.cat([position_ids[rep, :P].reshape(-1)[p_flat], position_ids[:, P:].reshape(-1)[c_flat]])
    x = body.embed_tokens(ids)  # (n_p + n_c, H): the distinct prompts' real tokens, then every completion token
    cos, sin = body.rotary_emb(x[None], positions[None])
    cos, sin = cos[0, :, None], sin[0, :, None]
    visible_p = _causal(p_real[:, None, None, :], P, P, device)  # (U, 1, P, P)
    visible_c = _causal(attention_mask[:, None, None, :].bool(), L, T, device)  # (B, 1, T, L)
    n_layers = len(body.layers)

    def unpack(t, flat, rows, width):  # (n, heads, d) -> (rows, heads, width, d), zeros at padding
        full = t.new_zeros((rows * width, *t.shape[1:])).index_copy(0, flat, t)
        return full.view(rows, width, *t.shape[1:]).transpose(1, 2)

    for index, layer in enumerate(body.layers):
        attn = layer.self_attn
        q, k, v = _rotated_qkv(layer, x, cos, sin)  # (n_p + n_c, heads, d)
        kp, vp = unpack(k[:n_p], p_flat, U, P), unpack(v[:n_p], p_flat, U, P)  # (U, kv_heads, P, d)
        out_p = _attend(attn, unpack(q[:n_p], p_flat, U, P), kp, vp, visible_p)
        keys = torch.cat([kp[inverse], unpack(k[n_p:], c_flat, B, T)], dim=2)  # (B, kv_heads, L, d)
        values = torch.cat([vp[inverse], unpack(v[n_p:], c_flat, B, T)], dim=2)
        out_c = _attend(attn, unpack(q[n_p:], c_flat, B, T), keys, values, visible_c)
        out_p = out_p.transpose(1, 2).reshape(U * P, -1)[p_flat]
        out_c = out_c.transpose(1, 2).reshape(B * T, -1)[c_flat]
        x_p, x_c = x[:n_p], x[n_p:]
        if sel_p is not None and index == n_layers - 1:  # nothing reads the other positions' last-layer output
            out_p, x_p, out_c, x_c = out_p[sel_p], x_p[sel_p], out_c[sel_c], x_c[sel_c]
        x = _attention_output_and_mlp(layer, torch.cat([x_p, x_c]), torch.cat([out_p, out_c]))
    x = _rms_norm(body.norm, x)
    where_p = p_flat if sel_p is None else p_flat[sel_p]
    where_c = c_flat if sel_c is None else c_flat[sel_c]
    H = x.shape[-1]
    prompt_part = x.new_zeros((U * P, H)).index_copy(0, where_p, x[: len(where_p)]).view(U, P, H)[inverse]
    completion_part = x.new_zeros((B * T, H)).index_copy(0, where_c, x[len(where_p):]).view(B, T, H)
    return torch.cat([prompt_part, completion_part], dim=1)
