"""Tests for rlbook.lm: the character tokenizer, the tiny Llama/Qwen2 models, saving/loading, devices."""

import copy
import random

import pytest
import torch

from rlbook.lm import (
    MODEL_SIZES,
    VOCAB,
    autocast,
    build_model,
    check_tokenizer,
    count_parameters,
    default_device,
    load_policy,
    save_policy,
)
from rlbook.vocab import ALPHABET, BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, UNK_TOKEN


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- tokenizer


def test_token_ids_are_positions_in_the_shared_vocabulary(tokenizer):
    assert len(tokenizer) == len(VOCAB) == len(SPECIAL_TOKENS) + len(ALPHABET) == 62
    assert tokenizer.convert_ids_to_tokens(list(range(len(VOCAB)))) == list(VOCAB)
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
    ids = (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id)
    assert ids == (0, 1, 2, 3)
    assert tokenizer.padding_side == "left"


def test_encode_is_bos_then_one_token_per_character(tokenizer):
    assert tokenizer("12+3=")["input_ids"] == [1] + [VOCAB.index(c) for c in "12+3="]
    assert tokenizer("")["input_ids"] == [tokenizer.bos_token_id]
    assert tokenizer("aZb")["input_ids"] == [1, VOCAB.index("a"), tokenizer.unk_token_id, VOCAB.index("b")]


@pytest.mark.parametrize("text", [ALPHABET, "a , b . c ? d ! e", "<eos><pad>", "  12 + 3 = 15  ", "it's (x)"])
def test_round_trip_on_tricky_strings(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text) + 1  # "<eos>" in the text stays five characters
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_round_trip_on_random_strings(tokenizer):
    rng = random.Random(0)
    texts = ["".join(rng.choices(ALPHABET, k=rng.randint(0, 40))) for _ in range(200)]
    encoded = tokenizer(texts)["input_ids"]
    assert tokenizer.batch_decode(encoded, skip_special_tokens=True) == texts


def test_batch_is_left_padded(tokenizer):
    batch = tokenizer(["ab", "abcd"], padding=True, return_tensors="pt")
    a, b = VOCAB.index("a"), VOCAB.index("b")
    assert batch["input_ids"][0].tolist() == [0, 0, 1, a, b]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]


def test_tokenizer_without_pad_or_eos_is_refused(tokenizer):
    check_tokenizer(tokenizer)
    no_pad = copy.deepcopy(tokenizer)
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        check_tokenizer(no_pad)
    no_eos = copy.deepcopy(tokenizer)
    no_eos.eos_token = None
    with pytest.raises(ValueError, match="no EOS token"):
        check_tokenizer(no_eos)
    with pytest.raises(ValueError, match="no pad token"):
        build_model("tiny", tokenizer=no_pad)


# ---------------------------------------------------------------- models

# The exact counts quoted in rlbook/lm/model.py and the book.
PARAMETER_COUNTS = {
    ("tiny", "llama"): 102_592, ("tiny", "qwen2"): 102_848,
    ("small", "llama"): 992_128, ("small", "qwen2"): 993_152,
    ("base", "llama"): 10_350_720, ("base", "qwen2"): 10_354_560,
}


@pytest.mark.parametrize("size, arch", sorted(PARAMETER_COUNTS))
def test_parameter_counts(size, arch):
    model = build_model(size, arch=arch)
    assert count_parameters(model) == PARAMETER_COUNTS[size, arch]
    assert type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]


def test_sizes_are_about_a_tenth_one_and_ten_million():
    assert set(MODEL_SIZES) == {"tiny", "small", "base"}
    for (size, _), count in PARAMETER_COUNTS.items():
        target = {"tiny": 1e5, "small": 1e6, "base": 1e7}[size]
        assert 0.9 * target < count < 1.1 * target


def test_config_carries_the_tokenizer_ids(tokenizer):
    model = build_model("tiny", arch="qwen2")
    cfg = model.config
    assert (cfg.vocab_size, cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (62, 0, 1, 2)
    assert cfg.max_position_embeddings == MODEL_SIZES["tiny"].max_position_embeddings
    assert cfg.tie_word_embeddings and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert not model.training


def test_init_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = build_model("tiny", seed=0), build_model("tiny", seed=0), build_model("tiny", seed=1)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=1e-7)  # the global stream was not advanced
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-8, msg=name)
    assert not torch.allclose(a.model.embed_tokens.weight, c.model.embed_tokens.weight, rtol=1e-3, atol=1e-3)


def test_overrides_reach_the_config():
    model = build_model("tiny", num_hidden_layers=1, max_position_embeddings=64, attn_implementation="eager")
    assert model.config.num_hidden_layers == 1 and len(model.model.layers) == 1
    assert model.config.max_position_embeddings == 64
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("kwargs, message", [
    ({"size": "huge"}, "unknown model size"),
    ({"arch": "gpt2"}, "unknown architecture"),
    ({"num_attention_heads": 3}, "divisible"),
    ({"num_key_value_heads": 3}, "divisible"),
])
def test_bad_model_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_model(**kwargs)


# ---------------------------------------------------------------- save / load


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3_moe"])
def test_save_and_load_round_trip(tmp_path, tokenizer, arch):
    model = build_model("tiny", arch=arch, seed=3)
    save_policy(model, tokenizer, tmp_path / "policy")
    assert (tmp_path / "policy" / "model.safetensors").exists()
    loaded, loaded_tok = load_policy(tmp_path / "policy", device="cpu")
    assert type(loaded) is type(model) and loaded_tok.padding_side == "left"
    # Regression: AutoTokenizer would wrap our tokenizer in a Qwen2Tokenizer next to a qwen2 model and drop spaces.
    ids = loaded_tok(["12+3=", "a"], padding=True, return_tensors="pt")
    assert ids["input_ids"].tolist() == tokenizer(["12+3=", "a"], padding=True)["input_ids"]
    assert loaded_tok.decode(loaded_tok("a , b")["input_ids"], skip_special_tokens=True) == "a , b"
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, loaded(**ids).logits, rtol=1e-6, atol=1e-6)


def test_load_with_dtype(tmp_path, tokenizer):
    save_policy(build_model("tiny"), tokenizer, tmp_path)
    model, _ = load_policy(str(tmp_path), dtype=torch.bfloat16, device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_load_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved policy"):
        load_policy(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match="no saved policy"):
        load_policy("./checkpoints/nothing/here")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(NotADirectoryError):
        load_policy(tmp_path / "file.txt")


def test_load_refuses_a_tokenizer_without_pad(tmp_path, tokenizer):
    no_pad = copy.deepcopy(tokenizer)
    no_pad.pad_token = None
    save_policy(build_model("tiny"), no_pad, tmp_path)
    with pytest.raises(ValueError, match="no pad token"):
        load_policy(tmp_path)


# ---------------------------------------------------------------- devices


def test_default_device_and_autocast():
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model("tiny", device="cpu")
    assert next(model.parameters()).device.type == "cpu"
    with autocast("cpu"):  # a no-op on CPU: float32 logits
        logits = model(torch.tensor([[1, 5, 6]])).logits
    assert logits.dtype == torch.float32


# ---------------------------------------------------------------- mixture of experts (chapter "GSPO")


def test_moe_model_routes_each_token_to_its_top_k_experts(tokenizer):
    from rlbook.lm import lean
    from rlbook.lm.moe import expert_choices, is_moe, routers, routing_changed

    model = build_model("tiny", arch="qwen3_moe", seed=0)
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and is_moe(model) and not is_moe(build_model("tiny"))
    assert not lean.supports(model)  # rlbook.rollout falls back to the Hugging Face forward
    cfg = model.config
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (4, 2, 96)
    assert count_parameters(model) == 176_896
    batch = tokenizer(["12+34=", "7+5=", "99+1="], return_tensors="pt", padding=True)
    ids, attn = batch["input_ids"], batch["attention_mask"]
    choices = expert_choices(model, ids, attn)
    assert choices.shape == (cfg.num_hidden_layers, 3, ids.shape[1], 2)
    # top-k: the recorded experts are the k largest router logits of the token's hidden state in that layer
    captured = []
    hooks = [gate.register_forward_hook(lambda m, args, out: captured.append(args[0])) for gate in routers(model)]
    with torch.no_grad():
        expert_choices(model, ids, attn)
    for hook in hooks:
        hook.remove()
    for layer, (gate, hidden) in enumerate(zip(routers(model), captured)):
        logits = hidden @ gate.weight.T  # (B*L, num_experts)
        top = logits.topk(2, dim=-1).indices.sort(-1).values.reshape(3, ids.shape[1], 2)
        assert torch.equal(top, choices[layer])  # integer indices compare exactly
    assert ((choices[..., 0] != choices[..., 1])).all()  # two distinct experts per token
    assert not routing_changed(choices, choices).any()
    moved = choices.clone()
    moved[1, 0, -1] = torch.tensor([0, 3]) if moved[1, 0, -1].tolist() != [0, 3] else torch.tensor([1, 2])
    changed = routing_changed(choices, moved)
    assert changed[0, -1] and int(changed.sum()) == 1
    with pytest.raises(ValueError, match="no mixture-of-experts router"):
        expert_choices(build_model("tiny"), ids, attn)
    with pytest.raises(ValueError, match="different shapes"):
        routing_changed(choices, choices[:, :1])


def test_moe_model_samples_scores_and_trains(tokenizer):
    """Rollout and log-probs agree on the MoE model, and SFT and one GSPO step work on it."""
    from rlbook.rollout import generate_rollouts, sequence_logprobs
    from rlbook.sft import SFTConfig, train_sft
    from rlbook.tasks import get_task
    from rlbook.trainer import Trainer, preset

    model = build_model("tiny", arch="qwen3_moe", seed=0)
    batch = generate_rollouts(model, tokenizer, ["12+34=", "7+5="], num_generations=3, max_new_tokens=5, seed=0)
    mask = batch.completion_mask.float()
    logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, mask)
    torch.testing.assert_close(logp * mask, batch.logprobs * mask, rtol=1e-4, atol=1e-5)

    task = get_task("arithmetic", num_digits=1, operations="+")
    config = SFTConfig(max_steps=60, batch_size=32, lr=3e-3, warmup_steps=5, eval_every=60, eval_size=8,
                       max_new_tokens=3)
    history = train_sft(model, tokenizer, task, config)
    assert sum(history.losses[-10:]) / 10 < 0.6 * history.losses[0]  # it learns: the loss falls by far

    before = [p.detach().clone() for p in model.parameters()]
    rl = preset("gspo", num_generations=4, per_device_train_batch_size=8, max_completion_length=3, max_steps=1,
                learning_rate=3e-4)
    metrics = Trainer(model, tokenizer, task, rl).train_step()
    assert metrics["optimizer_steps"] == 4
    assert any(not torch.allclose(a, b, rtol=0, atol=1e-9) for a, b in zip(before, model.parameters()))


# ---------------------------------------------------------------- the optimizer

def test_adamw_is_fused_on_cpu_and_takes_the_unfused_update():
    """rlbook.lm.adamw picks torch's fused kernel for CPU parameters (param groups too), keeps an explicit choice,
    and its steps are AdamW's: a fused and a plain optimizer from the same start stay within rounding."""
    from rlbook.lm import adamw

    torch.manual_seed(0)
    model = build_model("tiny")
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    fused = adamw(model.parameters(), lr=1e-2, weight_decay=0.1)
    plain = adamw(twin.parameters(), lr=1e-2, weight_decay=0.1, fused=False)
    assert fused.defaults["fused"] is True and not plain.defaults["fused"]
    groups = adamw([{"params": list(model.parameters())[:2]}, {"params": list(model.parameters())[2:], "lr": 0.1}])
    assert groups.defaults["fused"] is True and len(groups.param_groups) == 2
    ids = torch.randint(4, 60, (4, 12))
    for _ in range(5):
        for net, opt in ((model, fused), (twin, plain)):
            opt.zero_grad()
            net(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    moved = max((p - q).abs().max().item() for p, q in zip(model.parameters(), start.parameters()))
    assert moved > 1e-3  # the steps did something
