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


def test_cached_decoding_equals_a_full_forward(tokenizer):
    model = build_model("tiny", seed=4)
    ids, mask, positions = _batch(tokenizer)
    cache = lean.LeanCache()
    lean.hidden_states(model, ids[:, :-2], mask[:, :-2], positions[:, :-2], cache)
    lean.hidden_states(model, ids[:, -2:-1], mask[:, :-1], positions[:, -2:-1], cache)
    step = lean.hidden_states(model, ids[:, -1:], mask, positions[:, -1:], cache)
    full = lean.hidden_states(model, ids, mask, positions)
    assert torch.allclose(step[:, -1], full[:, -1], atol=AGREE, rtol=0)


@pytest.mark.parametrize("capacity", [None, 3, 64])
def test_the_cache_gives_the_same_numbers_preallocated_or_grown(tokenizer, capacity):
    """Keys and values written in place into preallocated buffers (capacity 64) or into buffers that grow past
    their room (capacity 3, then None) give, step after step, the hidden states of a cache that concatenates,
    bit for bit."""
    model = build_model("tiny", seed=4)
    ids, mask, positions = _batch(tokenizer)

    class Concatenating(lean.LeanCache):
        def update(self, layer, k, v):
            if layer == len(self.keys):
                self.keys.append(k), self.values.append(v)
            else:
                self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
                self.values[layer] = torch.cat([self.values[layer], v], dim=2)
            return self.keys[layer], self.values[layer]

    runs = []
    for cache in (lean.LeanCache(capacity), Concatenating()):
        steps = [lean.hidden_states(model, ids[:, :-3], mask[:, :-3], positions[:, :-3], cache)]
        for t in (-3, -2, -1):
            end = None if t == -1 else t + 1
            steps.append(lean.hidden_states(model, ids[:, t:end], mask[:, :end], positions[:, t:end], cache))
        runs.append(steps)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


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
