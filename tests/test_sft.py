"""Tests for rlbook.sft and the shipped base policies (rlbook.checkpoints)."""

import tempfile

import numpy as np
import pytest
import torch

from rlbook.checkpoints import (
    RECIPES,
    build_checkpoint,
    checkpoint_dir,
    file_hashes,
    final_sampled_accuracy,
    load_base_policy,
    load_manifest,
)
from rlbook.lm import build_model, build_tokenizer
from rlbook.rollout import encode_completions, sequence_logprobs
from rlbook.sft import SFTConfig, sft_loss, train_sft
from rlbook.tasks import get_task


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_sft_loss_is_the_token_averaged_nll_of_the_demonstrations():
    tokenizer, model = build_tokenizer(), build_model("tiny", seed=0)
    input_ids, attention_mask, completion_mask = encode_completions(tokenizer, ["1+2=", "10+20="], ["3", "30"])
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0)).logits
    T = completion_mask.shape[1]
    token_logprobs = logits[:, -T - 1 : -1].log_softmax(-1).gather(-1, input_ids[:, -T:, None]).squeeze(-1)
    expected = -(token_logprobs * completion_mask).sum() / completion_mask.sum()
    assert sft_loss(model, input_ids, attention_mask, completion_mask).item() == pytest.approx(expected.item(), rel=1e-5)
    # "3<eos>" and "30<eos>": 2 + 3 scored tokens
    assert completion_mask.sum().item() == 5


def test_train_sft_learns_and_is_deterministic():
    task = get_task("arithmetic", num_digits=1)
    config = SFTConfig(max_steps=60, batch_size=32, eval_every=30, eval_size=32, max_new_tokens=4, seed=1)
    runs = []
    for _ in range(2):
        model = build_model("tiny", seed=0)
        history = train_sft(model, build_tokenizer(), task, config)
        runs.append((history, model.state_dict()))
    (h1, w1), (h2, w2) = runs
    assert h1.losses == h2.losses and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert np.mean(h1.losses[-10:]) < 0.7 * np.mean(h1.losses[:10])
    assert h1.eval_steps == [30, 60] and len(h1.eval_accuracy) == 2


def test_train_sft_stops_at_the_target_accuracy():
    task = get_task("sort_digits", min_length=3, max_length=3)
    config = SFTConfig(max_steps=400, eval_every=20, eval_size=32, max_new_tokens=6, stop_at_accuracy=0.3, seed=0)
    history = train_sft(build_model("tiny", seed=0), build_tokenizer(), task, config)
    assert history.eval_accuracy[-1] >= 0.3 and all(a < 0.3 for a in history.eval_accuracy[:-1])
    assert history.steps == history.eval_steps[-1] < 400


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(max_steps=0), "max_steps"), (dict(lr=0.0), "lr must be positive"),
     (dict(stop_at_accuracy=1.5), "stop_at_accuracy"), (dict(batch_size=0), "batch_size")],
)
def test_sft_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SFTConfig(**kwargs)


# --- the shipped base policies ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_shipped_base_policy_loads_and_has_headroom(name):
    manifest = load_manifest(name)
    assert manifest["sha256"] == file_hashes(checkpoint_dir(name)), "shipped files differ from their manifest"
    assert 0.3 <= manifest["final_sampled_accuracy"] <= 0.6, "a base policy needs headroom for RL"
    model, tokenizer = load_base_policy(name)
    accuracy = final_sampled_accuracy(RECIPES[name], model, tokenizer)
    assert accuracy == pytest.approx(manifest["final_sampled_accuracy"], abs=1e-9)


def test_unknown_base_policy():
    with pytest.raises(ValueError, match="unknown base policy"):
        load_base_policy("chess")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_base_policy_rebuilds_bit_for_bit(name):
    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint(name, tmp)
        assert file_hashes(tmp) == load_manifest(name)["sha256"]
