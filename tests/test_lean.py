"""rlbook.lm.lean computes what the Hugging Face forward computes: hidden states, gradients, cached decoding."""

import pytest
import torch

from rlbook.lm import build_model, build_tokenizer, lean
from rlbook.rollout import generate_rollouts, sequence_logprobs

AGREE = 1e-5  # float32: the two forwards order a few reductions differently


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _batch(tokenizer):
    enc = tokenizer(["1+2=", "33+44=", "q7: 9*10="], padding=True, padding_side="left", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hidden_states_and_gradients_equal_the_hf_forward(tokenizer, arch):
    model = build_model("tiny", arch=arch, seed=3)
    assert lean.supports(model)
    ids, mask, positions = _batch(tokenizer)
    ref = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    ref = ref.last_hidden_state
    got = lean.hidden_states(model, ids, mask, positions)
    real = mask.bool()  # padding positions are never read
    assert torch.allclose(got[real], ref[real], atol=AGREE, rtol=0)
    assert torch.isfinite(got).all()
    grads = []
    for hidden in (ref, got):
        model.zero_grad()
        hidden[real].square().sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decoder_logits_equal_a_full_forward(tokenizer, arch):
    """Prefill left-padded prompts, repeat the rows, drop some, then feed tokens one at a time: every step's
    logits are those of the Hugging Face model run over the whole sequence so far."""
    model = build_model("tiny", arch=arch, seed=4)
    assert lean.decodes(model)
    ids, mask, _ = _batch(tokenizer)
    fed = torch.randint(4, len(tokenizer), (6, 5), generator=torch.Generator().manual_seed(0))  # (rows, steps)
    decoder = lean.Decoder(model, ids.shape[1] + fed.shape[1])
    logits = [decoder.prefill(ids, mask).repeat_interleave(2, dim=0)]
    decoder.repeat_interleave(2)
    rows = torch.arange(6)
    for t in range(fed.shape[1]):
        if t == 2:  # keep rows 5, 0, 3 (in that order), as the sampler does when rows finish
            keep = torch.tensor([5, 0, 3])
            decoder.select(keep)
            rows = rows[keep]
        logits.append(decoder.step(fed[rows, t]))
    full_ids = torch.cat([ids.repeat_interleave(2, dim=0), fed], dim=1)
    full_mask = torch.cat([mask.repeat_interleave(2, dim=0), torch.ones_like(fed)], dim=1)
    with torch.no_grad():
        ref = model(input_ids=full_ids, attention_mask=full_mask,
                    position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits
    P, kept = ids.shape[1], torch.arange(6)
    for t, got in enumerate(logits):  # logits[t] predicts the token at column P + t
        kept = kept if t <= 2 else torch.tensor([5, 0, 3])
        assert torch.allclose(got, ref[kept, P + t - 1], atol=AGREE, rtol=0), t


def test_decoder_names_what_it_cannot_do(tokenizer):
    with pytest.raises(ValueError, match="does not reproduce"):
        lean.Decoder(build_model("tiny", seed=0, attention_dropout=0.1), 8)
    ids, mask, _ = _batch(tokenizer)
    decoder = lean.Decoder(build_model("tiny", seed=0), ids.shape[1] + 1)
    with pytest.raises(ValueError, match="do not fit"):
        lean.Decoder(build_model("tiny", seed=0), 2).prefill(ids, mask)
    decoder.prefill(ids, mask)
    decoder.step(ids[:, -1])
    with pytest.raises(ValueError, match="full"):
        decoder.step(ids[:, -1])


def test_rollouts_and_logprobs_agree_with_the_hf_path(tokenizer):
    model = build_model("tiny", seed=5)
    prompts = ["1+2=", "33+44=", "q7: 9*10="]
    fast = generate_rollouts(model, tokenizer, prompts, num_generations=4, max_new_tokens=6, seed=0)
    lean.ENABLED = False
    try:
        assert not lean.supports(model)
        slow = generate_rollouts(model, tokenizer, prompts, num_generations=4, max_new_tokens=6, seed=0)
        slow_logp = sequence_logprobs(model, fast.input_ids, fast.attention_mask, fast.completion_mask)
    finally:
        lean.ENABLED = True
    assert torch.equal(fast.completion_ids, slow.completion_ids)  # integer tokens: the same draw
    assert torch.allclose(fast.logprobs, slow.logprobs, atol=AGREE, rtol=0)
    assert torch.allclose(fast.logprobs, slow_logp, atol=AGREE, rtol=0)


def test_other_models_use_the_hf_forward():
    model = build_model("tiny", seed=0, attention_dropout=0.1)
    assert not lean.supports(model)
    assert not lean.supports(torch.nn.Linear(2, 2))


def test_wanted_positions_equal_the_hf_forward(tokenizer):
    model = build_model("tiny", arch="qwen2", seed=6)
    ids, mask, positions = _batch(tokenizer)
    wanted = torch.zeros_like(mask, dtype=torch.bool)
    wanted[:, -3:] = True  # as sequence_logprobs asks: the positions that predict a completion token
    ref = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
    got = lean.hidden_states(model, ids, mask, positions, wanted=wanted)
    assert torch.allclose(got[wanted], ref[wanted], atol=AGREE, rtol=0)
    assert torch.count_nonzero(got[~wanted]) == 0  # the rest is not computed


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prompts_run_once_with_the_same_result_and_gradient(tokenizer, arch):
    model = build_model("tiny", arch=arch, seed=7)
    prompts = tokenizer(["1+2=", "33+44=", "q7: 9*10="], padding=True, padding_side="left", return_tensors="pt")
    completions = tokenizer(["3", "77", "90", "4", "7x"], padding=True, padding_side="right", add_special_tokens=False,
                            return_tensors="pt")
    rows = torch.tensor([0, 0, 1, 2, 2])  # prompt of each row: groups of 2, 1 and 2
    ids = torch.cat([prompts["input_ids"][rows], completions["input_ids"]], dim=1)
    mask = torch.cat([prompts["attention_mask"][rows], completions["attention_mask"]], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    P = prompts["input_ids"].shape[1]
    wanted = torch.zeros_like(mask, dtype=torch.bool)
    wanted[:, P - 1 : -1] = completions["attention_mask"].bool()
    results = []
    for shared in (None, P):
        model.zero_grad()
        hidden = lean.hidden_states(model, ids, mask, positions, wanted=wanted, shared_prefix=shared)
        hidden[wanted].square().sum().backward()
        results.append((hidden[wanted].detach(), [p.grad.clone() for p in model.parameters()]))
    (h0, g0), (h1, g1) = results
    assert torch.allclose(h0, h1, atol=AGREE, rtol=0)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


# The tokens the float32 decoder draws (seed 0), stored: the CPU path of every stored experiment and notebook, which
# a change meant for another precision (bf16 autocast: tests/test_bf16_emulation.py) must leave as it is. Token ids
# are integers, compared exactly; the same under the kernel settings of make test-portability (default, AVX2).
SNAPSHOT_PROMPTS = ["12+3=", "a", "hello world, 7*8=", "(x)"]
SNAPSHOT = {
    "llama": [[58, 3, 40, 27, 12, 39], [12, 31, 22, 51, 17, 14], [44, 7, 39, 52, 52, 58], [7, 17, 50, 17, 44, 12],
              [3, 17, 28, 26, 6, 52], [44, 4, 33, 39, 34, 32], [4, 39, 13, 3, 10, 0], [2, 0, 0, 0, 0, 0]],
    "qwen2": [[58, 3, 40, 27, 12, 39], [12, 31, 22, 51, 17, 14], [44, 20, 39, 52, 52, 41], [44, 17, 50, 16, 44, 12],
              [3, 17, 28, 31, 6, 52], [44, 4, 33, 39, 34, 32], [30, 39, 21, 3, 10, 0], [2, 0, 0, 0, 0, 0]],
}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_float32_sampling_draws_the_stored_tokens(tokenizer, one_torch_thread, arch):
    model = build_model("tiny", arch=arch, seed=0)
    batch = generate_rollouts(model, tokenizer, SNAPSHOT_PROMPTS, num_generations=2, max_new_tokens=6, seed=0)
    assert batch.completion_ids.tolist() == SNAPSHOT[arch]


@pytest.mark.parametrize("columns", [1, 7, 15, 16, 40])
def test_softmax_padding_gives_the_softmax_and_its_gradient(columns):
    """lean._softmax pads short rows to 16 columns on a CPU (speed); values and gradients are torch's."""
    scores = torch.randn(6, 3, columns, generator=torch.Generator().manual_seed(columns))
    scores[0, 0, 0] = torch.finfo(torch.float32).min  # a masked position
    ours, ref = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    out, expected = lean._softmax(ours), ref.softmax(-1)
    assert out.shape == expected.shape and torch.allclose(out, expected, atol=1e-6, rtol=0)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward(), (expected * weights).sum().backward()
    assert torch.allclose(ours.grad, ref.grad, atol=1e-6, rtol=0)
