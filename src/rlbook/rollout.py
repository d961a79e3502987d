"""Rollouts: sample completions from a policy, and recompute the log-probabilities of given completions.

Every policy-gradient method for language models starts the same way: for each prompt ``q`` draw ``G``
completions ``o ~ pi(. | q)`` and remember, token by token, ``log pi(o_t | q, o_<t)``. Later, the loss recomputes
those log-probs under the current (or a reference) model. This module does both:

- :func:`generate_rollouts` samples all ``N * G`` completions in one batch with a KV cache and returns a
  :class:`RolloutBatch`;
- :func:`sequence_logprobs` recomputes per-token log-probs of the completions, differentiably, without ever
  holding the full ``(B, T, V)`` float32 logits at once;
- :func:`encode_completions` puts given texts (SFT demonstrations, DPO pairs) in the same layout.

Conventions (the same as TRL's GRPOTrainer, so numbers can be compared with it):

- prompts are left-padded, completions right-padded: every row's completion starts in the same column;
- ``completion_mask`` runs up to *and including* the first EOS, and is all ones when there is none;
- log-probs are taken from ``log_softmax(logits / temperature)`` in float32, at the sampling temperature.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rlbook.lm import lean
from rlbook.lm.device import resolve_device
from rlbook.lm.model import position_ids_from_mask
from rlbook.lm.tokenizer import check_tokenizer
from rlbook.metrics import entropy_from_log_probs


@dataclass
class RolloutBatch:
    """``G = num_generations`` completions for each of ``N`` prompts, as one batch of ``B = N * G``
    rows.

    Grouping: rows ``i*G, ..., i*G + G - 1`` are the completions of prompt ``i`` (see
    :attr:`prompt_index`), so a per-row quantity of shape ``(B,)`` is grouped by ``x.view(N, G)``.

    Shapes (``P`` = longest prompt in tokens, ``T`` = decode steps run, ``T <= max_new_tokens``):

    - ``prompt_ids`` (B, P) long: the prompt tokens, left-padded with the pad id;
    - ``prompt_mask`` (B, P) long: 1 on real prompt tokens, 0 on padding;
    - ``completion_ids`` (B, T) long: the sampled tokens, the pad id after the first EOS;
    - ``completion_mask`` (B, T) long: 1 up to and including the first EOS, 0 after it; all ones if
      no EOS;
    - ``logprobs`` (B, T) float32: ``log pi(o_t | q, o_<t)`` of each sampled token under the
      sampling policy at the sampling temperature, ``log_softmax(logits / temperature)``; 0 where
      ``completion_mask`` is 0;
    - ``entropies`` (B, T) float32: the entropy (nats) of that whole next-token distribution at each
      step, the ``entropy`` metric TRL logs; 0 where ``completion_mask`` is 0;
    - ``lengths`` (B,) long: ``completion_mask.sum(-1)``, the number of completion tokens, EOS
      included;
    - ``truncated`` (B,) bool: no EOS within ``max_new_tokens`` (TRL logs their fraction as
      ``clipped_ratio``).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    entropies: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    num_generations: int
    temperature: float
    prompts: list[str] = field(default_factory=list)  # the N prompt strings, before repetition

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_prompts(self) -> int:
        """``N``, the number of distinct prompts."""
        return len(self) // self.num_generations

    @property
    def prompt_index(self) -> torch.Tensor:
        """(B,) long: the prompt each row answers, ``[0]*G + [1]*G + ...``."""
        return torch.arange(len(self), device=self.completion_ids.device) // self.num_generations

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + T) long: prompt and completion side by side, the input of a training forward
        pass."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P + T) long: ``prompt_mask`` then ``completion_mask`` (tokens after the first EOS are
        padding)."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    def decode_completions(self, tokenizer: PreTrainedTokenizerBase) -> list[str]:
        """The B completions as text, EOS and padding stripped.

        Like TRL, we decode with ``skip_special_tokens=True``, so a special token sampled *inside* a
        completion (a stray ``<bos>`` or ``<pad>``) is dropped from the text too; it still counts in
        ``lengths``.
        """
        ids = self.completion_ids.masked_fill(self.completion_mask == 0, tokenizer.pad_token_id)
        return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)

    def to(self, device: str | torch.device) -> RolloutBatch:
        """A copy with every tensor moved to ``device``."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                 for k, v in vars(self).items()}
        return RolloutBatch(**moved)

    def select_groups(self, groups) -> RolloutBatch:
        """The batch of the prompts ``groups`` (indices into ``prompts``), each with all its G
        completions."""
        groups = torch.as_tensor(groups, dtype=torch.long).reshape(-1)
        if groups.numel() and not (0 <= int(groups.min()) and int(groups.max()) < self.num_prompts):
            raise ValueError(f"group indices must lie in [0, {self.num_prompts}), "
                             f"got {groups.tolist()}")
        G = self.num_generations
        rows = (groups[:, None] * G + torch.arange(G)).reshape(-1).to(self.completion_ids.device)
        picked = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        picked["prompts"] = [self.prompts[i] for i in groups.tolist()]
        return RolloutBatch(**picked)


def concat_rollouts(batches: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """One :class:`RolloutBatch` from several with the same G and temperature (e.g. dynamic sampling's extra
    rounds): prompts left-padded and completions right-padded to the widest, groups kept whole and in order."""
    if not batches:
        raise ValueError("concat_rollouts needs at least one batch")
    if len({(b.num_generations, b.temperature) for b in batches}) != 1:
        raise ValueError("batches to concatenate must share num_generations and temperature")
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.completion_ids.shape[1] for b in batches)

    def pad(x, width, value, left):
        extra = width - x.shape[1]
        return F.pad(x, (extra, 0) if left else (0, extra), value=value)

    return RolloutBatch(
        prompt_ids=torch.cat([pad(b.prompt_ids, P, pad_token_id, True) for b in batches]),
        prompt_mask=torch.cat([pad(b.prompt_mask, P, 0, True) for b in batches]),
        completion_ids=torch.cat([pad(b.completion_ids, T, pad_token_id, False) for b in batches]),
        completion_mask=torch.cat([pad(b.completion_mask, T, 0, False) for b in batches]),
        logprobs=torch.cat([pad(b.logprobs, T, 0.0, False) for b in batches]),
        entropies=torch.cat([pad(b.entropies, T, 0.0, False) for b in batches]),
        lengths=torch.cat([b.lengths for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]),
        num_generations=batches[0].num_generations,
        temperature=batches[0].temperature,
        prompts=[p for b in batches for p in b.prompts],
    )


@dataclass
class Rollout:
    """One step's samples, rewarded: the batch, the N task examples (one per prompt), the B decoded completions,
    the reward function's B rewards (before any shaping), and the sampling phase's metrics."""

    batch: RolloutBatch
    examples: list
    completions: list[str]
    rewards: np.ndarray
    metrics: dict = field(default_factory=dict)

    def select_groups(self, groups) -> Rollout:
        """The rollout of the prompts ``groups`` (indices), each with all its G completions."""
        G = self.batch.num_generations
        rows = [g * G + j for g in groups for j in range(G)]
        return Rollout(self.batch.select_groups(groups), [self.examples[g] for g in groups],
                       [self.completions[r] for r in rows], self.rewards[rows], dict(self.metrics))


@dataclass
class ScoredRollout:
    """What an update needs from a :class:`Rollout`, on the trainer's device: ``mask`` (B, T) marks completion
    tokens and ``loss_mask`` the ones that enter the loss; ``lengths`` (B,) their count; ``rewards`` (B,) after
    shaping; ``correct`` (B,) bool by the task's rule; ``old_logp``, ``ref_logp``, ``old_values`` (B, T);
    ``advantages`` (B,) or (B, T); ``returns`` (B, T), the value targets; ``metrics`` of the scoring phase;
    ``routes`` (layers, B, L, k), the experts the old policy routed every token to (Routing Replay only);
    ``sampler_logp`` (B, T), the sampler's log-probs of the tokens (the behaviour policy's);
    ``importance_sampling_ratio`` (B, T), the sampler-mismatch correction's weight on each token's loss (when
    configured)."""

    rollout: Rollout
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    loss_mask: torch.Tensor
    lengths: torch.Tensor
    rewards: np.ndarray
    correct: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    metrics: dict = field(default_factory=dict)
    routes: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    importance_sampling_ratio: torch.Tensor | None = None


def informative_groups(rewards, num_generations: int) -> np.ndarray:
    """(N,) bool: True for the groups whose ``num_generations`` contiguous rewards are not all equal (exactly, as
    floats), the groups a group baseline gives a nonzero advantage."""
    groups = np.asarray(rewards, dtype=np.float64).reshape(-1, num_generations)
    return groups.max(-1) > groups.min(-1)


def dynamic_sampling(sample_round: Callable[[int], Rollout], num_prompts: int, max_rounds: int,
                     pad_token_id: int) -> Rollout:
    """DAPO's dynamic sampling: keep only the groups whose rewards differ, and sample more until
    ``num_prompts`` such groups are found or ``max_rounds`` rounds of ``sample_round(round_)`` are
    spent.

    A group whose G rewards are all equal (all right or all wrong) has advantage 0 under a group
    baseline: it teaches nothing and only shrinks the batch. If the rounds run out, the step trains
    on the groups it has (fewer; the first round whole if no round found any). Metrics:
    ``frac_reward_zero_std`` of the first round (before any filtering), ``dynamic_sampling/rounds``
    and ``dynamic_sampling/groups`` (the groups kept).
    """
    kept = []
    for round_ in range(max_rounds):
        rollout = sample_round(round_)
        informative = informative_groups(rollout.rewards, rollout.batch.num_generations)
        if round_ == 0:
            first = rollout
            first.metrics["frac_reward_zero_std"] = float(np.mean(~informative))
        have = sum(len(r.examples) for r in kept)
        kept.append(
            rollout.select_groups(np.flatnonzero(informative)[: num_prompts - have].tolist()))
        if have + len(kept[-1].examples) == num_prompts:
            break
    parts = [r for r in kept if r.examples]
    if parts:
        first = Rollout(concat_rollouts([r.batch for r in parts], pad_token_id),
                        [e for r in parts for e in r.examples],
                        [c for r in parts for c in r.completions],
                        np.concatenate([r.rewards for r in parts]), first.metrics)
    first.metrics.update({"dynamic_sampling/rounds": round_ + 1,
                          "dynamic_sampling/groups": sum(len(r.examples) for r in parts)})
    return first


# not inference_mode: the tensors we return are used as inputs of a training forward pass later
@torch.no_grad()
def generate_rollouts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    num_generations: int = 1,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    seed: int | torch.Generator | None = None,
    device: str | torch.device | None = None,
    shrink_batch: bool = True,
) -> RolloutBatch:
    """Sample ``num_generations`` completions for every prompt, all ``B = N * G`` rows in one batch.

    The procedure, written out instead of calling ``model.generate``:

    1. tokenize the ``N`` prompts, left-padded to a common length ``P``;
    2. *prefill*: one forward pass over the ``N`` prompts fills the KV cache and gives the first
       next-token logits; both are then repeated ``G`` times (``repeat_interleave``), so each prompt
       is processed once, not ``G`` times as when ``generate`` is given the repeated prompts;
    3. *decode*: each step samples one token per row, records its log-prob, and feeds only that
       token (the cache holds the rest). A row that has emitted EOS is finished; once a quarter of
       the rows in the model's batch have finished they leave it and the cache (``generate`` keeps
       decoding finished rows to the end), and the loop stops when every row is done;
    4. lay the recorded steps out as (B, T) tensors, masking every position after a row's first EOS.

    Position ids count real tokens only (``cumsum`` of the attention mask), so a left-padded prompt
    is processed exactly as the same prompt unpadded; the attention mask hides the padding.

    Sampling: ``token ~ softmax(filter(logits / temperature))`` where ``filter`` keeps the ``top_k``
    most likely tokens and/or the smallest set whose probability reaches ``top_p``; ``greedy=True``
    takes the argmax instead. The recorded ``logprobs`` are ``log_softmax(logits / temperature)`` of
    the chosen token over the *whole* vocabulary: top-k/top-p truncation is not reflected (as in TRL
    and verl). The reason: the training side recomputes log-probs with :func:`sequence_logprobs`,
    which knows nothing of the truncation, and the importance ratio ``pi_theta / pi_old`` must
    compare like with like (it must be exactly 1 before the first update). The price is that with
    truncation the samples come from a slightly different distribution than the one whose log-probs
    we record; at ``top_k=None, top_p=None`` (the RL default) the two agree exactly.

    ``seed`` (an int, or a ``torch.Generator`` on ``device``) makes the draw reproducible; ``None``
    uses torch's global random stream. The model is put in eval mode while sampling and restored
    afterwards.

    ``shrink_batch=False`` keeps every row in the batch to the end, as ``generate`` does: one batch
    shape throughout, which may suit a device where each new shape has a cost (a GPU may prepare
    kernels per shape; not measured: no GPU has run this code). On a CPU shrinking saves the
    finished rows' work at no such cost. Which rows the model's batch holds changes no token: the
    random draws keep the layout of a draw batch that is only ever halved (see the loop).
    With ``shrink_batch=False`` that batch is not halved either, so the draws differ.
    """
    _check_sampling_args(prompts, num_generations, max_new_tokens, temperature, top_k, top_p)
    check_tokenizer(tokenizer)
    device = resolve_device(device, model)
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id

    # 1. Prompts: left-padded, (N, P).
    encoded = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
    prompt_ids, prompt_mask = encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
    _check_prompt_lengths(model, prompt_mask, max_new_tokens)
    G, T = num_generations, max_new_tokens
    B, P = len(prompts) * G, prompt_ids.shape[1]

    generator = _generator(seed, device)
    # Llama/Qwen2 decode through rlbook.lm.lean (the Hugging Face function over the same weights,
    # without the per-call overhead of its modules, which dominates at these sizes); any other
    # model through its own forward.
    decoder = lean.Decoder(model, P + T) if lean.decodes(model) else _HFDecoder(model)
    was_training = model.training
    model.eval()
    try:
        # 2. Prefill each prompt once, then repeat its cache and its logits G times: rows i*G ..
        #    i*G+G-1 continue prompt i (generate() repeats the prompts, prefilling each G times).
        next_logits = decoder.prefill(prompt_ids, prompt_mask).repeat_interleave(G, dim=0)  # (B, V)
        decoder.repeat_interleave(G)

        # 3. Decode: the only Python loop, one iteration per generated token, over two batches:
        #    - the *draw* batch, `rows` of the full batch: each step draws a token for each of its
        #      rows. Once half of it has finished it is halved (unfinished rows first), so its sizes
        #      are B, B/2, B/4, ...: a seed's draws do not depend on what the decoder holds;
        #    - the *decoder* batch, the positions `live` of the draw batch that the model runs on.
        #      Finished rows leave it once they are a quarter of it: decoding finished rows is
        #      wasted work, which generate() does until the last row ends.
        #    Each step's tokens, log-probs and entropies are kept as they come, laid out at the end.
        rows = torch.arange(B, device=device)
        live = held = rows  # held = rows[live]: the decoder's rows, as rows of the full batch
        ended = torch.zeros(B, dtype=torch.bool, device=device)  # (n,): has the row ended yet?
        steps = []  # per step: (held, token, log-prob, entropy), each (n,), n = len(live)
        for t in range(T):
            scores = next_logits.float() / temperature  # (n, V) float32
            if greedy:
                token = scores.argmax(-1)
            else:
                probs = F.softmax(_filter_top_k_top_p(scores, top_k, top_p), dim=-1)
                token = _sample_rows(probs, live, len(rows), generator)  # (n,)
            log_probs = scores.log_softmax(-1)  # (n, V), untruncated: see above
            token_logprob = log_probs.gather(-1, token[:, None]).squeeze(-1)
            steps.append((held, token, token_logprob, entropy_from_log_probs(log_probs)))
            ended = ended | (token == eos_id)
            num_alive = len(live) - int(ended.sum())  # one host-device sync a step, as generate()
            if t + 1 == T or num_alive == 0:  # stop early once every row has ended
                break
            size = len(rows)
            while shrink_batch and num_alive <= size // 2:
                size //= 2
            if size < len(rows) or (shrink_batch and 4 * (len(live) - num_alive) >= len(live)):
                kept = (~ended).nonzero().squeeze(1)  # the decoder keeps its unfinished rows
                decoder.select(kept)
                live, token, ended = live[kept], token[kept], ended[kept]
                if size < len(rows):  # halve the draw batch, its unfinished rows first, in order
                    done = torch.ones(len(rows), dtype=torch.bool, device=device).index_fill_(
                        0, live, False)
                    rows = rows[done.to(torch.int8).argsort(stable=True)[:size]]
                    live = torch.arange(num_alive, device=device)
                held = rows[live]
            # a finished row still in the decoder is fed its own draws: nothing of it is kept
            next_logits = decoder.step(token)
    finally:
        model.train(was_training)

    # 4. The steps as (B, T) tensors. A completion runs to its first EOS, included; every later
    #    position gets the pad token, mask 0, log-prob and entropy 0.
    completion_ids, completion_mask, logprobs, entropies = _layout(steps, B, pad_id, eos_id)
    return RolloutBatch(
        prompt_ids=prompt_ids.repeat_interleave(G, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(G, dim=0),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=logprobs,
        entropies=entropies,
        lengths=completion_mask.sum(-1),
        truncated=~(completion_ids == eos_id).any(-1),
        num_generations=num_generations,
        temperature=float(temperature),
        prompts=list(prompts),
    )


def _layout(steps, B: int, pad_id: int, eos_id: int):
    """The decode steps' ``(rows, token, log-prob, entropy)`` as (B, T) tensors: completion ids,
    mask, log-probs, entropies. A run of steps over the same rows is stacked and written with one
    indexed copy per tensor. Every position after a row's first EOS is masked; that covers the steps
    after a row left the batch, since only ended rows leave it."""
    T, device = len(steps), steps[0][1].device
    ids = torch.full((B, T), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((B, T), dtype=torch.float32, device=device)
    entropies = torch.zeros((B, T), dtype=torch.float32, device=device)
    start = 0
    for end in range(1, T + 1):
        if end < T and steps[end][0] is steps[start][0]:
            continue  # the same rows: one stack for the whole run of steps
        rows, run = steps[start][0], list(zip(*steps[start:end]))  # run: rows, tokens, ...
        for out, values in zip((ids, logprobs, entropies), run[1:]):
            out[rows, start:end] = torch.stack(values, dim=1)
        start = end
    is_eos = ids == eos_id
    ended_before = (is_eos.cumsum(-1) - is_eos.long()) > 0  # an EOS sits strictly before
    mask = ~ended_before
    return (ids.masked_fill(~mask, pad_id), mask.long(), logprobs.masked_fill(~mask, 0.0),
            entropies.masked_fill(~mask, 0.0))


class _HFDecoder:
    """:class:`rlbook.lm.lean.Decoder`'s interface over the Hugging Face forward and its ``DynamicCache``, for the
    models the lean forward does not reproduce (a mixture of experts, for one)."""

    def __init__(self, model: PreTrainedModel):
        self.model, self.cache = model, DynamicCache(config=model.config)
        self.cache_kwarg = _cache_kwarg(model)

    def _logits(self, input_ids, position_ids):
        with torch.no_grad():
            out = self.model(input_ids=input_ids, attention_mask=self.attention_mask, position_ids=position_ids,
                             use_cache=True, logits_to_keep=1, **{self.cache_kwarg: self.cache})
        return out.logits[:, -1]

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.attention_mask, self.positions = attention_mask, attention_mask.sum(-1)
        return self._logits(input_ids, position_ids_from_mask(attention_mask))

    def repeat_interleave(self, repeats: int) -> None:
        self.cache.batch_repeat_interleave(repeats)
        self.attention_mask = self.attention_mask.repeat_interleave(repeats, dim=0)
        self.positions = self.positions.repeat_interleave(repeats, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention_mask, self.positions = self.attention_mask[rows], self.positions[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones((len(tokens), 1))], 1)
        logits = self._logits(tokens[:, None], self.positions[:, None])
        self.positions = self.positions + 1
        return logits


def encode_completions(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    completions: list[str],
    device: str | torch.device | None = None,
    add_eos: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokenize given (prompt, completion) texts in the layout of a :class:`RolloutBatch`, for teacher forcing.

    Returns ``input_ids`` (B, P + T), ``attention_mask`` (B, P + T) and ``completion_mask`` (B, T): the prompts
    left-padded (as the tokenizer encodes them, BOS included), then the completions right-padded, each followed by
    EOS when ``add_eos`` (so the model learns to stop), exactly what :func:`sequence_logprobs` takes. This is how
    SFT demonstrations and DPO's chosen/rejected answers enter the same log-prob path as sampled completions.

    The prompt and the completion are tokenized separately. With a character tokenizer that is the same as
    tokenizing their concatenation; with a BPE tokenizer the tokens at the seam can differ (TRL checks for this).

    ``device``: where the tensors go. ``None`` is the CPU, where :func:`rlbook.lm.build_model` and
    :func:`rlbook.checkpoints.load_base_policy` put a model unless asked otherwise (pass ``device=model.device``
    for a model elsewhere); :func:`sequence_logprobs` moves its inputs to its model's device in any case.
    """
    if isinstance(prompts, str) or isinstance(completions, str):
        raise TypeError("prompts and completions must be lists of strings")
    if len(prompts) == 0 or len(prompts) != len(completions):
        raise ValueError(f"need as many completions as prompts, at least one: got {len(prompts)} prompts and "
                         f"{len(completions)} completions")
    check_tokenizer(tokenizer)
    device = torch.device("cpu" if device is None else device)
    prompt = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
    completion = tokenizer(list(completions), add_special_tokens=False, padding=True, padding_side="right",
                           return_tensors="pt")
    completion_ids, completion_mask = completion["input_ids"], completion["attention_mask"]
    if add_eos:  # write EOS just after each completion's last token, in one extra column
        B = len(prompts)
        completion_ids = torch.cat([completion_ids, completion_ids.new_full((B, 1), tokenizer.pad_token_id)], dim=1)
        completion_mask = torch.cat([completion_mask, completion_mask.new_zeros((B, 1))], dim=1)
        end = completion_mask.sum(-1, keepdim=True)  # (B, 1): the first free column of each row
        completion_ids.scatter_(1, end, tokenizer.eos_token_id)
        completion_mask.scatter_(1, end, 1)
    if completion_ids.shape[1] == 0:
        raise ValueError("every completion is empty and add_eos=False: there is no token to score")
    input_ids = torch.cat([prompt["input_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([prompt["attention_mask"], completion_mask], dim=1)
    return input_ids.to(device), attention_mask.to(device), completion_mask.to(device)


def sequence_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of the completions in ``input_ids``, shape (B, T) float32, 0 where the
    mask is 0; with ``with_entropy`` also the entropy (nats) of each whole next-token distribution
    softmax(z / temperature), (B, T), as ``(logp, entropy)``, differentiable too (an entropy bonus
    needs its gradient).

    ``input_ids`` (B, L) holds prompt then completion (e.g. :attr:`RolloutBatch.input_ids`),
    ``attention_mask`` (B, L) marks real tokens, and ``completion_mask`` (B, T) says which of the
    *last* ``T`` columns are completion tokens to score. For each of them, with ``z`` the logits at
    the position before,

        log pi(o_t | q, o_<t) = z[o_t] / temperature - logsumexp(z / temperature)

    computed in float32 (bf16 logits lose about two decimal digits, too many for a probability
    ratio).

    Memory, written for the real case of a 150k-token vocabulary: one forward pass through the
    transformer body gives hidden states (B, L, H); only the ones that predict a scored token
    (completion_mask == 1) go through the output layer, ``chunk_size`` tokens at a time, so at most
    ``chunk_size x V`` float32 logits exist at once. ``None`` picks ``chunk_size = 2**26 // V`` (256
    MiB of logits): 441 tokens for Qwen2.5's 151,936-token vocabulary, every token at once for our
    62. When gradients are needed each chunk is checkpointed: backward recomputes its logits rather
        than keeping all of them alive until the loss is done.

    Differentiable (use it inside a loss), and cheap under ``torch.no_grad()`` (the reference
    model). Assumes the logits are ``lm_head(last hidden state)``, true of Llama, Qwen2/2.5/3,
    Mistral; models that soft-cap or scale their logits (Gemma 2, Cohere) are refused.

    Computed on the model's device, where the inputs are moved if they are elsewhere (e.g. the CPU
    tensors of :func:`encode_completions` for a model on a GPU); the result is there too.
    """
    _check_logprob_args(input_ids, attention_mask, completion_mask, temperature, chunk_size)
    device = resolve_device(None, model)
    input_ids, attention_mask, completion_mask = (t.to(device) for t in (input_ids, attention_mask,
                                                                         completion_mask))
    if (getattr(model.config, "final_logit_softcapping", None)
            or getattr(model.config, "logit_scale", None)):
        raise NotImplementedError("sequence_logprobs assumes logits = lm_head(hidden); "
                                  "this model rescales them")
    (B, L), T = input_ids.shape, completion_mask.shape[1]
    body, head = model.base_model, model.get_output_embeddings()

    # as during sampling: padding does not count
    position_ids = position_ids_from_mask(attention_mask)
    # the same function, without padding and without the HF modules' per-call overhead
    if lean.supports(model):
        # the positions that predict a scored token
        wanted = torch.zeros_like(attention_mask, dtype=torch.bool)
        wanted[:, L - T - 1 : L - 1] = completion_mask.bool()
        # Rows that share their prompt (a group's G completions) run it once: shared_prefix = the
        # prompt columns.
        hidden = lean.hidden_states(model, input_ids, attention_mask, position_ids, wanted=wanted,
                                    shared_prefix=L - T)  # (B, L, H)
    else:
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state  # (B, L, H)
    # The hidden state at column j predicts the token at column j + 1: the completion's T tokens
    # (columns L-T .. L-1) are predicted from columns L-T-1 .. L-2.
    hidden = hidden[:, L - T - 1 : L - 1]  # (B, T, H)
    targets = input_ids[:, L - T :]  # (B, T)
    scored = completion_mask.bool()
    hidden, targets = hidden[scored], targets[scored]  # (n, H), (n,): only the tokens we score

    chunk_size = chunk_size or max(1, _LOGITS_PER_CHUNK // head.weight.shape[0])
    pieces = []
    for start in range(0, len(targets), chunk_size):
        h, y = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            pieces.append(checkpoint(_token_logprobs, head, h, y, temperature, with_entropy,
                                     use_reentrant=False))
        else:
            pieces.append(_token_logprobs(head, h, y, temperature, with_entropy))
    columns = 2 if with_entropy else 1  # each piece: (n, columns), log-prob then entropy
    values = torch.cat(pieces) if pieces else hidden.new_zeros((0, columns), dtype=torch.float32)
    # Scatter back into (B, T); masked_scatter is differentiable with respect to `values`.
    outputs = tuple(torch.zeros((B, T), dtype=torch.float32, device=input_ids.device)
                    .masked_scatter(scored, values[:, k]) for k in range(columns))
    return outputs if with_entropy else outputs[0]


_LOGITS_PER_CHUNK = 2**26  # float32 logits per chunk in sequence_logprobs by default: 256 MiB


def _token_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float, with_entropy: bool = False):
    """(n, H) hidden states, (n,) targets -> (n, 1) float32
    ``log softmax(head(hidden) / temperature)[targets]``; (n, 2) with the distribution's entropy
    beside it when ``with_entropy``."""
    logits = head(hidden).float() / temperature  # (n, V) float32
    normaliser = logits.logsumexp(-1)
    # gather - logsumexp gives the same number as log_softmax(...).gather(...) without a second
    # (n, V) tensor.
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser
    if not with_entropy:
        return logp[:, None]
    return torch.stack([logp, entropy_from_log_probs(logits - normaliser[:, None])], dim=-1)


def _filter_top_k_top_p(scores: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """(B, V) scores with every token outside the top-k / top-p (nucleus) set set to ``-inf``.

    Top-p keeps, per row, the most likely tokens until their probability reaches ``top_p`` (the token that
    crosses the threshold is kept, so the set is never empty), as ``transformers``' TopPLogitsWarper.
    """
    if top_k is not None and top_k < scores.shape[-1]:
        kth_best = scores.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # probability of the strictly better tokens
        drop_sorted = mass_before >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from (B, V) probabilities: ``argmax_v probs[v] / E_v`` with ``E_v ~ Exponential(1)``.

    An exact draw from the categorical distribution (the "exponential race", equivalent to the Gumbel-max trick):
    ``E_v / probs[v]`` is exponential with rate ``probs[v]``, and the smallest of independent exponentials is
    ``v`` with probability ``probs[v] / sum(probs)``. ``torch.multinomial(probs, 1)`` draws the same way (on a
    CPU it gives the very same tokens from the same generator); written out here so that the trick is visible.
    """
    return (probs / _exponentials(probs, generator)).argmax(dim=-1)


def _exponentials(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Exponential(1) draws shaped and typed as ``like``: ``like.exponential_(1.0, generator=generator)``'s numbers.

    For float32, float16 and bfloat16 on a CPU torch draws them as ``-log(1 - U)``, ``U`` uniform in float64,
    one element at a time; the same formula over a whole tensor of uniforms gives the same numbers from the same
    generator, 2-3x faster for a decode step's (128, 62) (tests/test_rollout.py checks that they agree). Other
    devices and float64 (whose kernel draws differently) call ``exponential_`` itself.
    """
    if like.device.type != "cpu" or like.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return torch.empty_like(like).exponential_(1.0, generator=generator)
    uniform = torch.rand(like.shape, dtype=torch.float64, generator=generator)
    return uniform.neg_().log1p_().neg_().to(like.dtype)


def _sample_rows(probs: torch.Tensor, live: torch.Tensor, size: int,
                 generator: torch.Generator | None) -> torch.Tensor:
    """:func:`_sample` for the rows ``live`` of a draw batch of ``size`` rows whose other rows have ended: the
    draw is made for the whole batch (the ended rows draw from zeros and are thrown away), so that which rows the
    decoder still holds changes no row's token."""
    if len(live) == size:
        return _sample(probs, generator)
    whole = probs.new_zeros((size, probs.shape[1])).index_copy_(0, live, probs)
    return _sample(whole, generator)[live]


def _generator(seed: int | torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """The random stream for sampling: a new generator seeded with ``seed``, the one given, or None (global)."""
    if seed is None:
        return None
    if isinstance(seed, torch.Generator):
        if seed.device.type != device.type:
            raise ValueError(f"the generator is on {seed.device.type} but sampling runs on {device}; "
                             f"create it with torch.Generator(device={str(device)!r})")
        return seed
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))
    return generator


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5 renamed the forward argument `past_key_values` to `cache` (the old name warns until 5.40).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _check_sampling_args(prompts, num_generations, max_new_tokens, temperature, top_k, top_p) -> None:
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: nothing to sample")
    if not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a list of strings")
    if not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be an integer >= 1, got {num_generations!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature} (for argmax decoding pass greedy=True)")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p}")


def _check_prompt_lengths(model: PreTrainedModel, prompt_mask: torch.Tensor, max_new_tokens: int) -> None:
    lengths = prompt_mask.sum(-1)
    if bool((lengths == 0).any()):
        raise ValueError("a prompt encodes to zero tokens; the model needs at least one token to condition on")
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = prompt_mask.shape[1]
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"the longest prompt has {longest} tokens; with max_new_tokens={max_new_tokens} a sequence would need "
            f"{longest + max_new_tokens} positions, more than the model's max_position_embeddings={limit}"
        )


def _check_logprob_args(input_ids, attention_mask, completion_mask, temperature, chunk_size) -> None:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (B, L), got {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids {tuple(input_ids.shape)}"
        )
    if completion_mask.ndim != 2 or completion_mask.shape[0] != input_ids.shape[0]:
        raise ValueError(
            f"completion_mask must have shape (B, T) with B = {input_ids.shape[0]} rows like input_ids, "
            f"got {tuple(completion_mask.shape)}"
        )
    if not 1 <= completion_mask.shape[1] < input_ids.shape[1]:
        raise ValueError(
            f"completion_mask covers the last T = {completion_mask.shape[1]} columns of input_ids; need "
            f"1 <= T < L = {input_ids.shape[1]} (at least one prompt token comes first)"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or an integer >= 1, got {chunk_size!r}")


# --- a training step's sampling (rlbook.trainer.Trainer.sample_rollout) ------------------------------------------


def step_seed(seed: int, step: int, round_: int = 0, rank: int = 0) -> int:
    """A distinct, reproducible seed for each (run seed, step, generation round, process)."""
    return int(np.random.default_rng([seed, step + 1, round_] + ([rank] if rank else [])).integers(2**62))


def per_completion(examples, num_generations: int) -> list:
    """The prompts' examples repeated once per completion, in the rollout's row order (B,)."""
    return [e for e in examples for _ in range(num_generations)]


def verdicts(task, rollout: Rollout, num_generations: int, device) -> torch.Tensor:
    """The task's rule decides what is correct (the gold metric), also when a reward model or a proxy with a
    bonus (Task.length_bonus) gives the reward: (B,) bool."""
    examples = per_completion(rollout.examples, num_generations)
    return torch.as_tensor([task.is_correct(e, c, t) for e, c, t in zip(
        examples, rollout.completions, rollout.batch.truncated.tolist())], device=device)


def completion_rewards(reward_fn, examples, completions: list[str], batch: RolloutBatch, step: int,
                       num_generations: int, nonfinite_rewards: str) -> np.ndarray:
    """The reward of every completion by ``reward_fn``, (B,) float64; a wrong shape is an error, and so is a
    non-finite reward unless ``nonfinite_rewards="skip_group"`` (then the caller drops its group): it names the
    step (as metrics.jsonl counts them, from 1: the step being sampled is ``step + 1``) and the completion."""
    from rlbook.nonfinite import require_finite_rewards

    repeated = per_completion(examples, num_generations)
    rewards = np.asarray(reward_fn(repeated, completions, batch.truncated.tolist()), dtype=np.float64)
    if rewards.shape != (len(batch),):
        raise ValueError(f"step {step + 1}: the reward function must return {len(batch)} finite "
                         f"rewards, got shape {rewards.shape}")
    if nonfinite_rewards == "raise":
        require_finite_rewards(rewards, completions, step)
    return rewards


def sample_groups(policy, tokenizer, task, config, step: int, shard: slice, rank: int, device,
                  reward_fn) -> Rollout:
    """Step ``step``'s groups ``shard`` of ``config.num_prompts`` (this process's share), ``num_generations``
    completions each, rewarded by ``reward_fn`` (DAPO: only groups whose rewards differ, see
    :func:`dynamic_sampling`); ``metrics`` holds ``time/reward``, ``num_completions`` and the groups skipped."""
    import time

    from rlbook.lm import autocast
    from rlbook.nonfinite import skip_nonfinite_groups

    G = config.num_generations
    time_reward, num_completions, groups_skipped = 0.0, 0, 0

    def sample_round(round_: int) -> Rollout:
        nonlocal time_reward, num_completions, groups_skipped
        prompt_seed = [config.seed, step] + ([round_] if round_ else [])
        examples = task.sample(config.num_prompts, split=config.train_split,
                               seed=np.random.default_rng(prompt_seed))[shard]
        with autocast(device):
            batch = generate_rollouts(policy, tokenizer, [e.prompt for e in examples],
                                      num_generations=G, max_new_tokens=config.max_completion_length,
                                      temperature=config.sampling_temperature,
                                      seed=step_seed(config.seed, step, round_, rank), device=device)
        timer = time.perf_counter()
        num_completions += len(batch)
        completions = batch.decode_completions(tokenizer)
        rewards = completion_rewards(reward_fn, examples, completions, batch, step, G, config.nonfinite_rewards)
        rollout = Rollout(batch, examples, completions, rewards)
        time_reward += time.perf_counter() - timer
        if config.nonfinite_rewards == "skip_group":
            rollout, skipped = skip_nonfinite_groups(rollout, G, step)
            groups_skipped += skipped
        return rollout

    if config.dynamic_sampling:
        rollout = dynamic_sampling(sample_round, shard.stop - shard.start, config.max_num_gen_batches,
                                   tokenizer.pad_token_id)
    else:
        rollout = sample_round(0)
        rollout.metrics["frac_reward_zero_std"] = float(np.mean(~informative_groups(rollout.rewards, G)))
    rollout.metrics["time/reward"] = time_reward
    rollout.metrics["num_completions"] = num_completions
    if config.nonfinite_rewards == "skip_group":
        rollout.metrics["nonfinite_rewards/groups_skipped"] = groups_skipped
    return rollout
