"""The GPU's bf16 path on the CPU: CUDA's bf16 autocast emulated by ``torch.autocast("cpu", dtype=torch.bfloat16)``.

PyTorch's CPU autocast lists the same matrix products as bf16 as CUDA's (addmm, mm, bmm, baddbmm, linear, matmul),
so these tests meet the roundings a GPU run meets, on any CPU and in CI; other kernels may order a product's sums
otherwise, which moves a bf16 result by one unit in rare elements. Each test failed before the fix it names:

1. the sampler's cached decode rounds as the learner's forward does, its residual stream kept in float32
   (``rlbook.lm.lean``): sampled and recomputed log-probs agree to 1e-5 (were 3e-3 apart on average), or, on
   CPUs whose bf16 products depend on the batch's shape (Intel AMX), as well as the learner agrees with itself;
2. the trainer recomputes the old log-probs whenever the forward rounds below float32
   (``rlbook.lm.device.low_precision``), so that the first on-policy step's ratios are 1;
3. a decode step casts no weight, key cache or mask (was 16 weights a step for ``small``, and the cache per layer);
4. the value and reward heads compute in float32.

The float32 CPU path, which every stored experiment and notebook used, is unchanged: its arithmetic is chosen
only where autocast or 16-bit weights are active (tests/test_lean.py keeps a snapshot of its sampled tokens).
"""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.lm import build_model, lean
from rlbook.lm.device import low_precision
from rlbook.lm.value import build_value_model, token_values
from rlbook.presets import preset
from rlbook.reward_model import build_reward_model, sequence_scores
from rlbook.rollout import encode_completions, generate_rollouts, sequence_logprobs
from rlbook.trainer import Trainer

AGREE = 1e-5  # sampler against learner under bf16 autocast, per token (measured: 7e-7 at most, 2.6e-7 on average)
RATIO = 1e-3  # the first on-policy step's ratios: 1 within this (measured: 1 within 1e-6)
PROMPTS = ["12+3=", "a", "hello world, 7*8=", "(x)", "99-1=", "xyz"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def bf16():
    """CUDA's bf16 autocast (``rlbook.lm.autocast("cuda")``), on the CPU."""
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def arithmetic():
    model, tokenizer = load_base_policy("arithmetic", device="cpu")
    return model, tokenizer, RECIPES["arithmetic"].make_task()


def sampled_and_recomputed(model, tokenizer, prompts, **kwargs):
    with bf16():
        batch = generate_rollouts(model, tokenizer, prompts, **kwargs)
        with torch.no_grad():
            again = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                      temperature=batch.temperature)
    return batch, again


def assert_sampler_agrees_with_learner(model, batch, again):
    """Sampled and recomputed log-probs agree to AGREE, or, on a CPU whose bf16 matrix products depend on the
    batch's shape, as closely as the learner agrees with itself. Intel's AMX tiles (oneDNN's AVX512_CORE_AMX,
    e.g. Sapphire Rapids) accumulate in another order when a product has fewer rows: there the learner's own
    log-probs of the same completions, recomputed four rows at a time, differ from the full batch's by up to
    about 2e-3, and the sampler's decode steps (a few rows each) meet the same roundings. The floor keeps the
    test as strict as before wherever the learner agrees with itself exactly (AMD EPYC, AVX2, AVX-512 without
    AMX: 0 there); before the fix the gap was 3e-3 on average, far above either bound."""
    mask = batch.completion_mask.bool()
    gap = (again - batch.logprobs).abs()[mask]
    with bf16(), torch.no_grad():
        by_four = torch.cat([sequence_logprobs(model, batch.input_ids[i:i + 4], batch.attention_mask[i:i + 4],
                                               batch.completion_mask[i:i + 4], temperature=batch.temperature)
                             for i in range(0, len(batch.input_ids), 4)])
    itself = (again - by_four).abs()[mask]
    bound_max, bound_mean = max(AGREE, 2 * itself.max().item()), max(AGREE / 10, 2 * itself.mean().item())
    assert gap.max() < bound_max and gap.mean() < bound_mean, (gap.mean(), gap.max(), itself.mean(), itself.max())


# ---------------------------------------------------------------- 1. the sampler rounds as the learner


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sampled_logprobs_equal_the_learners_under_bf16_autocast(tokenizer, arch):
    """``small`` (head dim 32: the attention scale 1/sqrt(32) is not a power of two, so scaling inside the score
    product rounds otherwise than scaling after it) with biases (qwen2) and without (llama). Before the fix the
    decode step's ``addmm(x, h, W)`` returned the residual stream rounded to bf16 after every block."""
    model = build_model("small", arch=arch, seed=1)
    batch, again = sampled_and_recomputed(model, tokenizer, PROMPTS * 4, num_generations=4, max_new_tokens=16,
                                          temperature=0.9, seed=0)
    assert batch.logprobs.dtype == again.dtype == torch.float32
    assert batch.completion_mask.sum() > 1000
    assert_sampler_agrees_with_learner(model, batch, again)


def test_the_arithmetic_policy_samples_what_the_learner_scores_under_bf16(arithmetic):
    """The measurement that found the defect, smaller: the arithmetic base policy's completions (before the fix
    2.9e-3 on average, 6.4e-2 at most over 512 completions)."""
    model, tokenizer, task = arithmetic
    prompts = [e.prompt for e in task.sample(64, split="train", seed=np.random.default_rng(0))]
    batch, again = sampled_and_recomputed(model, tokenizer, prompts, num_generations=4,
                                          max_new_tokens=RECIPES["arithmetic"].sft.max_new_tokens, seed=0)
    assert_sampler_agrees_with_learner(model, batch, again)


def test_decoder_logits_equal_the_learners_under_bf16_autocast(tokenizer):
    """A decode step's logits are the full forward's (the learner's, :func:`lean.hidden_states`) under the same
    autocast, to float32 rounding: no bf16 residual."""
    model = build_model("small", arch="qwen2", seed=2)
    enc = tokenizer(PROMPTS, padding=True, padding_side="left", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    fed = torch.randint(4, len(tokenizer), (len(PROMPTS), 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), bf16():
        decoder = lean.Decoder(model, ids.shape[1] + fed.shape[1])
        logits = [decoder.prefill(ids, mask)] + [decoder.step(fed[:, t]) for t in range(fed.shape[1] - 1)]
        full_ids, full_mask = torch.cat([ids, fed], 1), torch.cat([mask, torch.ones_like(fed)], 1)
        hidden = lean.hidden_states(model, full_ids, full_mask, (full_mask.cumsum(-1) - 1).clamp(min=0))
        reference = model.get_output_embeddings()(hidden)
    P = ids.shape[1]
    for t, got in enumerate(logits):  # logits[t] predicts column P + t
        torch.testing.assert_close(got.float(), reference[:, P + t - 1].float(), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- 2. the trainer recomputes pi_old


def test_low_precision_names_autocast_and_16_bit_weights():
    model = build_model("tiny", seed=0)
    assert not low_precision(model)
    with bf16():
        assert low_precision(model)
    assert low_precision(build_model("tiny", seed=0).to(torch.bfloat16))


def test_the_trainer_recomputes_old_logprobs_whenever_autocast_is_on(arithmetic):
    """A sampler whose kernels round otherwise (an inference engine, another GPU) is played by moving the
    sampler's log-probs by 0.01: under autocast the old log-probs are the learner's all the same; in float32 on
    the CPU the sampler's numbers are used, as in every stored run (the two agree to 1e-6 there)."""
    model, tokenizer, task = arithmetic
    config = preset("grpo", per_device_train_batch_size=16, num_generations=4, max_steps=1,
                    max_completion_length=RECIPES["arithmetic"].sft.max_new_tokens)
    trainer = Trainer(model, tokenizer, task, config)
    with bf16():
        rollout = trainer.sample_rollout(0)
    batch = rollout.batch
    batch.logprobs = batch.logprobs + 0.01 * batch.completion_mask
    with bf16():
        scored = trainer.score(rollout)
        with torch.no_grad():
            learner = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask)
    torch.testing.assert_close(scored.old_logp, learner, atol=1e-6, rtol=0)
    # k1 to the reference (a copy of the same weights) is 0 on the first step, not the sampler's mismatch
    assert abs(scored.metrics["objective/kl_per_token"]) < 1e-6
    in_float32 = trainer.score(rollout)
    torch.testing.assert_close(in_float32.old_logp, batch.logprobs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_the_first_on_policy_step_has_ratios_of_one_under_bf16(arithmetic, name):
    """One optimizer step per rollout (GSPO's four minibatches made one), so every ratio of the first step is
    pi_theta / pi_old at theta = theta_old: 1. Before the fix the grpo preset's spanned [0.944, 1.030] and GSPO's
    clip (3e-4 / 4e-4) cut 14 % of the completions on this purely on-policy step."""
    _, tokenizer, task = arithmetic
    model = load_base_policy("arithmetic", device="cpu")[0]  # the update changes the weights: a fresh copy
    config = preset(name, per_device_train_batch_size=32, num_generations=8, max_steps=1, steps_per_generation=1,
                    max_completion_length=RECIPES["arithmetic"].sft.max_new_tokens)
    trainer = Trainer(model, tokenizer, task, config)
    with bf16():
        metrics = trainer.train(progress=False)[0]
    assert abs(metrics["ratio/min"] - 1) < RATIO and abs(metrics["ratio/max"] - 1) < RATIO, metrics
    # a fraction of clipped tokens, not a rounded value: 0 while rounding (1e-6) stays inside the clip (3e-4 at most)
    assert metrics["clip_ratio/region_mean"] == 0


# ---------------------------------------------------------------- 3. no per-step casts


class _Casts(TorchDispatchMode):
    """Counts the casts to bf16 whose source shares storage with the tensors ``watched()`` names."""

    def __init__(self, watched):
        super().__init__()
        self.watched, self.counts = watched, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            storage = args[0].untyped_storage().data_ptr()
            for name, tensors in self.watched().items():
                if storage in {t.untyped_storage().data_ptr() for t in tensors}:
                    self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **kwargs)


def test_decode_steps_cast_no_weight_and_no_cache(tokenizer):
    """The prefill and 10 steps of ``small`` cast nothing they keep: the Decoder cast its weights once, when it
    was built. Before the fix autocast cast the 4 fused weights of each of its 4 layers at every step (160 casts;
    they are not parameters, so its cast cache skips them), and the whole float32 key cache and mask once per
    layer per step (40 each)."""
    model = build_model("small", seed=1)
    enc = tokenizer(PROMPTS, padding=True, padding_side="left", return_tensors="pt")
    with torch.no_grad(), bf16():
        decoder = lean.Decoder(model, enc["input_ids"].shape[1] + 10)

        def watched():
            weights = [t for _, fused in decoder.layers for t in vars(fused).values() if isinstance(t, torch.Tensor)]
            return {"weights": weights + list(model.parameters()), "keys": decoder.keys, "values": decoder.values,
                    "mask": [decoder.bias]}

        with _Casts(watched) as casts:
            tokens = decoder.prefill(enc["input_ids"], enc["attention_mask"]).argmax(-1)
            for _ in range(10):
                tokens = decoder.step(tokens).argmax(-1)
    assert casts.counts == {}
    assert all(k.dtype == torch.bfloat16 for k in decoder.keys) and decoder.bias.dtype == torch.bfloat16


# ---------------------------------------------------------------- 4. float32 heads


def test_value_and_reward_heads_compute_in_float32_under_bf16(arithmetic):
    """The body runs in bf16 autocast, the scalar head (H -> 1) in float32: its output equals the head applied in
    float64 to the body's (float32) last hidden state. Under autocast it was rounded to bf16 (3 digits)."""
    model, tokenizer, _ = arithmetic
    ids, attn, mask = encode_completions(tokenizer, ["12+3=", "7*8=", "40+2="], ["15", "56", "4"])
    value_model = build_value_model(model, init="random", seed=0)
    reward_model = build_reward_model(model, init="random", seed=0)
    (B, L), T = ids.shape, mask.shape[1]
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), bf16():
        values = token_values(value_model, ids, attn, mask)
        hidden = value_model.base_model(input_ids=ids, attention_mask=attn, position_ids=positions).last_hidden_state
        rewards = sequence_scores(reward_model, ids, attn)
        reward_hidden = reward_model.base_model(input_ids=ids, attention_mask=attn,
                                                position_ids=positions).last_hidden_state
    last = (attn.bool() * torch.arange(L)).argmax(-1)  # the last real token of each row, where r is read
    reward_hidden = reward_hidden[torch.arange(B), last]
    assert values.dtype == rewards.dtype == hidden.dtype == torch.float32

    def head64(head, h):
        return h.double() @ head.weight.double().T + (0 if head.bias is None else head.bias.double())

    expected = head64(value_model.score, hidden)[:, L - T - 1 : L - 1, 0] * mask
    torch.testing.assert_close(values.double(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rewards.double(), head64(reward_model.score, reward_hidden)[:, 0], atol=1e-6,
                               rtol=1e-5)
