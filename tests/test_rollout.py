"""Tests for rlbook.rollout: batched sampling with a KV cache, and recomputed log-probs."""

import copy

import pytest
import torch

from rlbook.lm import build_model
from rlbook.rollout import (
    RolloutBatch,
    _exponentials,
    _filter_top_k_top_p,
    _sample,
    encode_completions,
    generate_rollouts,
    sequence_logprobs,
)

# Prompts of unequal lengths, so that the batch is left-padded.
PROMPTS = ["12+3=", "a", "hello world, 7*8=", "(x)"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    return {arch: build_model("tiny", arch=arch, seed=0) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def eos_model(tokenizer):
    """A tiny model whose EOS logit is scaled up: completions end at varied lengths, some never (truncated)."""
    model = build_model("tiny", seed=1)
    with torch.no_grad():
        model.get_output_embeddings().weight[tokenizer.eos_token_id] *= 20.0
    return model


def recompute(model, batch, **kwargs):
    return sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                             temperature=batch.temperature, **kwargs)


# ---------------------------------------------------------------- log-probs: sampling == recomputation


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_recomputed(models, tokenizer, arch, temperature):
    model = models[arch]
    batch = generate_rollouts(model, tokenizer, PROMPTS, num_generations=3, max_new_tokens=12,
                              temperature=temperature, seed=0)
    with torch.no_grad():
        again = recompute(model, batch)
    assert batch.logprobs.dtype == again.dtype == torch.float32
    torch.testing.assert_close(again, batch.logprobs, atol=1e-5, rtol=0)


def test_logprobs_match_when_rows_end_at_different_times(eos_model, tokenizer):
    # Rows finish at different steps, so finished rows are dropped from the batch and cache mid-way.
    batch = generate_rollouts(eos_model, tokenizer, PROMPTS, num_generations=8, max_new_tokens=12,
                              temperature=0.7, seed=1)
    assert 0 < int(batch.truncated.sum()) < len(batch) and len(set(batch.lengths.tolist())) > 3
    with torch.no_grad():
        torch.testing.assert_close(recompute(eos_model, batch), batch.logprobs, atol=1e-5, rtol=0)
    padding = batch.logprobs[batch.completion_mask == 0]
    torch.testing.assert_close(padding, torch.zeros_like(padding), atol=0, rtol=0)  # zero by construction (masked)
    assert torch.all(batch.logprobs[batch.completion_mask == 1] < 0)


def test_shrinking_the_batch_changes_nothing_but_speed(eos_model, tokenizer):
    prompts = list("abcdefghijklmnop")
    kwargs = dict(max_new_tokens=12, greedy=True, temperature=0.7)  # greedy: no random stream to realign
    shrunk = generate_rollouts(eos_model, tokenizer, prompts, **kwargs)
    full = generate_rollouts(eos_model, tokenizer, prompts, shrink_batch=False, **kwargs)
    assert int((shrunk.lengths < 8).sum()) >= 8  # half the rows ended early: the batch was halved
    for name in ("completion_ids", "completion_mask", "lengths", "truncated"):
        assert torch.equal(getattr(shrunk, name), getattr(full, name)), name
    torch.testing.assert_close(shrunk.logprobs, full.logprobs, atol=1e-5, rtol=0)


def test_logprobs_are_at_the_sampling_temperature(models, tokenizer):
    model = models["llama"]
    batch = generate_rollouts(model, tokenizer, PROMPTS, max_new_tokens=6, temperature=0.5, seed=0)
    with torch.no_grad():
        at_one = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask)
        ids = batch.input_ids
        logits = model(ids, attention_mask=batch.attention_mask,
                       position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits.float()
    T = batch.completion_ids.shape[1]
    by_hand = (logits[:, -T - 1 : -1] / 0.5).log_softmax(-1).gather(-1, ids[:, -T:, None]).squeeze(-1)
    torch.testing.assert_close(batch.logprobs, by_hand * batch.completion_mask, atol=1e-5, rtol=0)
    assert not torch.allclose(at_one, batch.logprobs, atol=1e-3)


# ---------------------------------------------------------------- masks, lengths, truncation, grouping


def test_completion_mask_runs_up_to_and_including_the_first_eos(eos_model, tokenizer):
    T = 12
    batch = generate_rollouts(eos_model, tokenizer, PROMPTS, num_generations=8, max_new_tokens=T, seed=2)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ids, mask = batch.completion_ids, batch.completion_mask
    for row in range(len(batch)):  # a plain loop over rows: the reference for the vectorised sampler
        tokens = ids[row].tolist()
        first_eos = tokens.index(eos) if eos in tokens else None
        expected_len = T if first_eos is None else first_eos + 1
        assert mask[row].tolist() == [1] * expected_len + [0] * (ids.shape[1] - expected_len)
        assert tokens[expected_len:] == [pad] * (ids.shape[1] - expected_len)
        assert batch.lengths[row] == expected_len
        assert bool(batch.truncated[row]) == (first_eos is None)
    assert batch.truncated.any() and not batch.truncated.all()
    assert ids.shape[1] == T  # some row was truncated, so all T steps ran


def test_stops_early_when_every_row_has_ended(eos_model, tokenizer):
    batch = generate_rollouts(eos_model, tokenizer, ["a"], num_generations=4, max_new_tokens=200, seed=0)
    assert not batch.truncated.any()
    assert batch.completion_ids.shape[1] == int(batch.lengths.max()) < 200


def test_grouping_and_helpers(models, tokenizer):
    G = 3
    batch = generate_rollouts(models["llama"], tokenizer, PROMPTS, num_generations=G, max_new_tokens=5, seed=0)
    N, B = len(PROMPTS), len(PROMPTS) * G
    assert len(batch) == B and batch.num_prompts == N and batch.num_generations == G and batch.prompts == PROMPTS
    assert batch.prompt_index.tolist() == [i for i in range(N) for _ in range(G)]
    encoded = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    assert torch.equal(batch.prompt_ids, encoded["input_ids"].repeat_interleave(G, dim=0))
    assert torch.equal(batch.prompt_mask, encoded["attention_mask"].repeat_interleave(G, dim=0))
    P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    assert batch.input_ids.shape == batch.attention_mask.shape == (B, P + T)
    assert torch.equal(batch.attention_mask[:, P:], batch.completion_mask)
    assert batch.logprobs.shape == (B, T) and batch.lengths.shape == batch.truncated.shape == (B,)
    assert torch.equal(batch.lengths, batch.completion_mask.sum(-1))
    moved = batch.to("cpu")
    assert isinstance(moved, RolloutBatch) and torch.equal(moved.completion_ids, batch.completion_ids)


def test_decode_strips_eos_and_padding(eos_model, tokenizer):
    batch = generate_rollouts(eos_model, tokenizer, PROMPTS, num_generations=2, max_new_tokens=10, seed=3)
    texts = batch.decode_completions(tokenizer)
    specials = set(tokenizer.all_special_ids)
    for row, text in enumerate(texts):
        kept = [t for t in batch.completion_ids[row, : batch.lengths[row]].tolist() if t not in specials]
        assert text == "".join(tokenizer.convert_ids_to_tokens(kept))
        assert "<eos>" not in text and "<pad>" not in text


def test_encode_completions_reproduces_a_sampled_batch(eos_model, tokenizer):
    """Re-encoding the decoded text of finished completions gives back the batch's tokens and masks."""
    batch = generate_rollouts(eos_model, tokenizer, PROMPTS, num_generations=8, max_new_tokens=12, seed=5)
    texts = batch.decode_completions(tokenizer)
    prompts = [batch.prompts[i] for i in batch.prompt_index.tolist()]
    input_ids, attention_mask, completion_mask = encode_completions(tokenizer, prompts, texts)
    P, T = batch.prompt_ids.shape[1], completion_mask.shape[1]
    # Rows that ended with EOS and hold no other special token (decoding drops those, so they cannot come back).
    specials = set(tokenizer.all_special_ids)
    clean = [r for r in range(len(batch)) if not batch.truncated[r]
             and not specials & set(batch.completion_ids[r, : batch.lengths[r] - 1].tolist())]
    assert len(clean) >= 8
    width = min(T, batch.completion_ids.shape[1])
    for r in clean:
        assert torch.equal(input_ids[r, :P], batch.prompt_ids[r])
        assert torch.equal(attention_mask[r, :P], batch.prompt_mask[r])
        assert torch.equal(input_ids[r, P : P + width], batch.completion_ids[r, :width])
        assert torch.equal(completion_mask[r, :width], batch.completion_mask[r, :width])
        assert completion_mask[r].sum() == batch.lengths[r]
    with torch.no_grad():
        again = sequence_logprobs(eos_model, input_ids, attention_mask, completion_mask)
    torch.testing.assert_close(again[clean, :width], batch.logprobs[clean, :width], atol=1e-5, rtol=0)


def test_encode_completions_layout(tokenizer):
    ids, attn, mask = encode_completions(tokenizer, ["1+1=", "12+13="], ["2", "25"])
    eos, pad, bos = tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id
    tok = lambda text: [tokenizer.convert_tokens_to_ids(c) for c in text]  # noqa: E731
    assert ids.tolist() == [[pad, pad, bos, *tok("1+1="), *tok("2"), eos, pad],
                            [bos, *tok("12+13="), *tok("25"), eos]]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert attn.tolist() == [[0, 0, 1, 1, 1, 1, 1, 1, 1, 0], [1] * 10]
    _, _, no_eos = encode_completions(tokenizer, ["a"], ["bc"], add_eos=False)
    assert no_eos.tolist() == [[1, 1]]
    with pytest.raises(ValueError, match="as many completions as prompts"):
        encode_completions(tokenizer, ["a", "b"], ["c"])
    with pytest.raises(ValueError, match="as many completions as prompts"):
        encode_completions(tokenizer, [], [])
    with pytest.raises(TypeError):
        encode_completions(tokenizer, "a", "b")
    with pytest.raises(ValueError, match="every completion is empty"):
        encode_completions(tokenizer, ["a"], [""], add_eos=False)


def test_encode_completions_defaults_to_the_cpu_where_models_default(models, tokenizer, monkeypatch):
    """On a machine with a GPU, build_model and load_base_policy still put a model on the CPU unless asked, and so
    does encode_completions with its tensors (it took CUDA, so the chapters' cells that call it without device=
    failed there with a device mismatch); every function given a model computes where the model is."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    ids, attn, mask = encode_completions(tokenizer, ["1+1=", "12+13="], ["2", "25"])
    assert ids.device.type == attn.device.type == mask.device.type == "cpu"
    model = models["llama"]
    assert sequence_logprobs(model, ids, attn, mask).device.type == "cpu"
    batch = generate_rollouts(model, tokenizer, ["1+1="], max_new_tokens=2, seed=0)
    assert batch.completion_ids.device.type == batch.logprobs.device.type == "cpu"


# ---------------------------------------------------------------- greedy == generate, reproducibility


@pytest.mark.parametrize("which", ["llama", "qwen2", "eos"])
def test_greedy_equals_hf_generate(models, eos_model, tokenizer, which):
    model = eos_model if which == "eos" else models[which]
    prompts = PROMPTS + ["1", "22", "333", "4444"]
    ours = generate_rollouts(model, tokenizer, prompts, max_new_tokens=10, greedy=True)
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = model.generate(**encoded, do_sample=False, max_new_tokens=10, pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id)
    theirs = theirs[:, encoded["input_ids"].shape[1] :]
    assert torch.equal(ours.completion_ids, theirs)
    if which == "eos":
        assert ours.truncated.any() and not ours.truncated.all()


def test_reproducible_given_a_seed(models, tokenizer):
    model = models["llama"]
    kwargs = dict(num_generations=4, max_new_tokens=8, top_k=20, top_p=0.9)
    a = generate_rollouts(model, tokenizer, PROMPTS, seed=7, **kwargs)
    b = generate_rollouts(model, tokenizer, PROMPTS, seed=7, **kwargs)
    c = generate_rollouts(model, tokenizer, PROMPTS, seed=torch.Generator().manual_seed(7), **kwargs)
    d = generate_rollouts(model, tokenizer, PROMPTS, seed=8, **kwargs)
    assert torch.equal(a.completion_ids, b.completion_ids)  # token ids: integers
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
    assert torch.equal(a.completion_ids, c.completion_ids)
    assert not torch.equal(a.completion_ids, d.completion_ids)


def test_sampling_leaves_the_training_flag_as_it_was(models, tokenizer):
    model = models["llama"]
    model.train()
    try:
        generate_rollouts(model, tokenizer, ["a"], max_new_tokens=2, seed=0)
        assert model.training
    finally:
        model.eval()


# ---------------------------------------------------------------- left padding and position ids


def test_left_padding_does_not_change_a_row(models, tokenizer):
    """A short prompt, left-padded next to a long one, gives what it gives alone (position ids, attention mask)."""
    model = models["qwen2"]
    short, long = "ab", "a much longer prompt, 123+456="
    together = generate_rollouts(model, tokenizer, [short, long], max_new_tokens=8, greedy=True)
    alone = generate_rollouts(model, tokenizer, [short], max_new_tokens=8, greedy=True)
    assert together.prompt_mask[0].sum() < together.prompt_mask.shape[1]  # really padded
    assert torch.equal(together.completion_ids[0], alone.completion_ids[0])
    torch.testing.assert_close(together.logprobs[0], alone.logprobs[0], atol=1e-5, rtol=0)
    # ... and so does the recomputation, on the padded and the unpadded sequence.
    with torch.no_grad():
        padded = recompute(model, together)[0]
        unpadded = recompute(model, alone)[0]
    torch.testing.assert_close(padded, unpadded, atol=1e-5, rtol=0)


def test_sequence_logprobs_equal_a_plain_forward_on_the_unpadded_row(models, tokenizer):
    model = models["llama"]
    batch = generate_rollouts(model, tokenizer, ["7", "a longer prompt"], max_new_tokens=6, seed=0)
    with torch.no_grad():
        padded = recompute(model, batch)[0]
        ids = batch.input_ids[0][batch.attention_mask[0].bool()][None]  # row 0 without its padding
        logits = model(ids).logits[0].float()  # default positions 0, 1, 2, ...
    n = int(batch.lengths[0])
    by_hand = logits[-n - 1 : -1].log_softmax(-1).gather(-1, ids[0, -n:, None]).squeeze(-1)
    torch.testing.assert_close(padded[:n], by_hand, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- sequence_logprobs: chunks and gradients


def test_chunked_equals_unchunked(models, tokenizer):
    model = models["llama"]
    batch = generate_rollouts(model, tokenizer, PROMPTS, num_generations=2, max_new_tokens=9, seed=0)
    with torch.no_grad():
        whole = recompute(model, batch, chunk_size=10**6)
        for chunk_size in (None, 1, 5, 512):
            torch.testing.assert_close(recompute(model, batch, chunk_size=chunk_size), whole, atol=1e-6, rtol=0)


def test_gradient_flows_and_chunking_does_not_change_it(tokenizer):
    model = build_model("tiny", seed=4)
    batch = generate_rollouts(model, tokenizer, PROMPTS, num_generations=2, max_new_tokens=8, seed=0)
    grads = []
    for chunk_size in (10**6, 3):
        model.zero_grad()
        logprobs = recompute(model, batch, chunk_size=chunk_size)
        assert logprobs.requires_grad
        (logprobs * batch.completion_mask).sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name, grad in grads[0].items():
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grads[1][name], grad, atol=1e-5, rtol=1e-4)
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):  # embedding = tied head
        assert grads[0][name].abs().sum() > 0, name


def test_no_grad_for_a_reference_model(models, tokenizer):
    batch = generate_rollouts(models["llama"], tokenizer, PROMPTS, max_new_tokens=4, seed=0)
    with torch.no_grad():
        assert not recompute(models["llama"], batch).requires_grad


# ---------------------------------------------------------------- top-k / top-p and the sampler


def test_top_k_and_top_p_filters():
    scores = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda s: torch.isfinite(s)[0].tolist()  # noqa: E731
    assert kept(_filter_top_k_top_p(scores, 2, None)) == [True, True, False, False, False]
    assert kept(_filter_top_k_top_p(scores, None, 0.5)) == [True, False, False, False, False]
    assert kept(_filter_top_k_top_p(scores, None, 0.6)) == [True, True, False, False, False]
    assert kept(_filter_top_k_top_p(scores, None, 0.8)) == [True, True, True, False, False]
    assert kept(_filter_top_k_top_p(scores, None, 1.0)) == [True] * 5
    assert kept(_filter_top_k_top_p(scores[:, [3, 0, 4, 1, 2]], None, 0.6)) == [False, True, False, True, False]


def test_top_k_1_and_tiny_top_p_are_greedy(models, tokenizer):
    model = models["llama"]
    greedy = generate_rollouts(model, tokenizer, PROMPTS, max_new_tokens=6, greedy=True)
    for kwargs in ({"top_k": 1}, {"top_p": 1e-6}):
        sampled = generate_rollouts(model, tokenizer, PROMPTS, max_new_tokens=6, seed=0, **kwargs)
        assert torch.equal(sampled.completion_ids, greedy.completion_ids)
        torch.testing.assert_close(sampled.logprobs, greedy.logprobs)  # untruncated log-probs in both


def test_exponential_race_samples_the_categorical_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    draws = _sample(probs.expand(40_000, -1), torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)  # 4 standard errors is about 0.01
    assert int((draws == 4).sum()) == 0  # a probability-0 token is never drawn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(128, 62), (3, 5), (1, 1)])
def test_exponentials_are_the_numbers_of_torch_exponential(shape, dtype):
    """On a CPU our draw over a whole tensor gives what Tensor.exponential_ gives from the same generator state,
    number for number (so every seed samples the tokens it sampled before), and leaves the generator where
    exponential_ leaves it; in every dtype (float64 goes to exponential_ itself: its kernel draws otherwise)."""
    ours, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    like = torch.empty(shape, dtype=dtype)
    for _ in range(3):  # consecutive draws: the generator advances alike
        assert torch.equal(_exponentials(like, ours), torch.empty_like(like).exponential_(1.0, generator=theirs))
    assert torch.equal(ours.get_state(), theirs.get_state())


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, error, message", [
    ({"prompts": []}, ValueError, "prompts is empty"),
    ({"prompts": "12+3="}, TypeError, "list of strings"),
    ({"prompts": ["a", 3]}, TypeError, "list of strings"),
    ({"num_generations": 0}, ValueError, "num_generations"),
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
    ({"temperature": 0.0}, ValueError, "greedy=True"),
    ({"temperature": -1.0}, ValueError, "temperature"),
    ({"top_k": 0}, ValueError, "top_k"),
    ({"top_p": 0.0}, ValueError, "top_p"),
    ({"top_p": 1.5}, ValueError, "top_p"),
])
def test_bad_sampling_arguments(models, tokenizer, kwargs, error, message):
    args = {"prompts": ["a"], **kwargs}
    with pytest.raises(error, match=message):
        generate_rollouts(models["llama"], tokenizer, **args)


def test_prompt_too_long_for_the_context(tokenizer):
    model = build_model("tiny", max_position_embeddings=16)
    generate_rollouts(model, tokenizer, ["1234567"], max_new_tokens=8)  # 8 prompt tokens (BOS) + 8 = 16: fits
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        generate_rollouts(model, tokenizer, ["12345678"], max_new_tokens=8)


def test_prompt_of_zero_tokens(models, tokenizer):
    no_bos = copy.deepcopy(tokenizer)
    no_bos.backend_tokenizer.post_processor = None  # encodes "" to no token at all
    with pytest.raises(ValueError, match="zero tokens"):
        generate_rollouts(models["llama"], no_bos, ["", "a"])


def test_tokenizer_without_pad_or_eos(models, tokenizer):
    for attribute in ("pad_token", "eos_token"):
        broken = copy.deepcopy(tokenizer)
        setattr(broken, attribute, None)
        with pytest.raises(ValueError, match="pad token" if attribute == "pad_token" else "EOS token"):
            generate_rollouts(models["llama"], broken, ["a"])


def test_bad_sequence_logprobs_arguments(models, tokenizer):
    model = models["llama"]
    batch = generate_rollouts(model, tokenizer, PROMPTS, max_new_tokens=4, seed=0)
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.completion_mask
    cases = [
        ((ids, attn[:, 1:], mask), {}, "attention_mask"),
        ((ids, attn[:2], mask), {}, "attention_mask"),
        ((ids, attn, mask[:2]), {}, "completion_mask"),
        ((ids, attn, mask[0]), {}, "completion_mask"),
        ((ids, attn, torch.ones_like(ids)), {}, "1 <= T < L"),
        ((ids[0], attn[0], mask), {}, "input_ids"),
        ((ids, attn, mask), {"temperature": 0.0}, "temperature"),
        ((ids, attn, mask), {"chunk_size": 0}, "chunk_size"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            sequence_logprobs(model, *args, **kwargs)


# ---------------------------------------------------------------- CUDA (skipped without a GPU)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_on_cuda_float32(tokenizer):
    model = build_model("tiny", arch="qwen2", device="cuda")
    batch = generate_rollouts(model, tokenizer, PROMPTS, num_generations=4, max_new_tokens=12, temperature=0.7, seed=0)
    assert batch.completion_ids.device.type == "cuda" and batch.logprobs.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(recompute(model, batch), batch.logprobs, atol=1e-4, rtol=0)
    again = generate_rollouts(model, tokenizer, PROMPTS, num_generations=4, max_new_tokens=12, temperature=0.7, seed=0)
    assert torch.equal(again.completion_ids, batch.completion_ids)
    with pytest.raises(ValueError, match="generator is on cpu"):
        generate_rollouts(model, tokenizer, PROMPTS, max_new_tokens=2, seed=torch.Generator())
    greedy = generate_rollouts(model, tokenizer, PROMPTS, max_new_tokens=10, greedy=True)
    encoded = tokenizer(PROMPTS, padding=True, return_tensors="pt").to("cuda")
    with torch.no_grad():
        theirs = model.generate(**encoded, do_sample=False, max_new_tokens=10, pad_token_id=0, eos_token_id=2)
    assert torch.equal(greedy.completion_ids, theirs[:, encoded["input_ids"].shape[1] :])


@cuda
def test_on_cuda_bf16_autocast(tokenizer):
    """Under bf16 autocast the cached decode rounds as the full forward does (rlbook.lm.lean), so sampled and
    recomputed log-probs agree, the log-softmax in float32. CPU emulation (tests/test_bf16_emulation.py) gives
    2.6e-7 on average and 7e-7 at most; CUDA chooses a product's kernel, hence the order of its sums, by its
    shape (a decode step has other shapes than the full forward), so we bound the mean and a quantile with room
    for that: still 100x below the 3e-3 of a decoder that rounded its residual stream to bf16."""
    from rlbook.lm import autocast

    model = build_model("small", device="cuda")
    with autocast("cuda"):
        batch = generate_rollouts(model, tokenizer, PROMPTS, num_generations=4, max_new_tokens=16, seed=0)
        with torch.no_grad():
            again = recompute(model, batch)
    gap = (again - batch.logprobs).abs()[batch.completion_mask.bool()]
    print(f"bf16 autocast: |sampled - recomputed| log-prob: mean {gap.mean():.2e}, max {gap.max():.2e}")
    assert again.dtype == torch.float32
    assert gap.mean() < 2e-5 and gap.quantile(0.99) < 2e-4


def test_select_groups_and_concat_rollouts_keep_groups_whole(tokenizer):
    from rlbook.rollout import concat_rollouts

    model = build_model("tiny", seed=0)
    a = generate_rollouts(model, tokenizer, ["1+2=", "33+44="], num_generations=3, max_new_tokens=5, seed=0)
    b = generate_rollouts(model, tokenizer, ["7="], num_generations=3, max_new_tokens=9, seed=1)
    picked = a.select_groups([1])
    assert picked.prompts == ["33+44="] and len(picked) == 3
    assert torch.equal(picked.completion_ids, a.completion_ids[3:6])
    both = concat_rollouts([picked, b], tokenizer.pad_token_id)
    assert both.prompts == ["33+44=", "7="] and len(both) == 6 and both.num_prompts == 2
    assert both.completion_ids.shape[1] == max(a.completion_ids.shape[1], b.completion_ids.shape[1])
    # every row decodes to the same text, and its log-probs recompute the same, after re-padding
    assert both.decode_completions(tokenizer) == picked.decode_completions(tokenizer) + b.decode_completions(tokenizer)
    recomputed = sequence_logprobs(model, both.input_ids, both.attention_mask, both.completion_mask)
    torch.testing.assert_close(recomputed, both.logprobs, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="group indices"):
        a.select_groups([2])
    with pytest.raises(ValueError, match="at least one batch"):
        concat_rollouts([], tokenizer.pad_token_id)


def test_informative_groups_compares_rewards_exactly():
    """A group of equal float rewards is not informative, even where its std is a rounding error above 0."""
    from rlbook.rollout import informative_groups

    # np.std([0.1, 0.1, 0.1]) is about 1.4e-17 here, so "std > 0" would call the first group informative
    rewards = [0.1, 0.1, 0.1, 0.0, 1.0, 1.0, -1.0, -1.0, -1.0]
    assert informative_groups(rewards, 3).tolist() == [False, True, False]
