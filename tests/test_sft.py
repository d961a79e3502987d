"""Tests for rlbook.sft and the shipped base policies (rlbook.checkpoints).

Other CPUs run other float kernels, so nothing here compares trained weights or losses byte for byte: a run is
compared with a tolerance, a fresh run with the manifest only over its first SFT steps (where every CPU tried
agrees to ~3e-7), and a shipped policy by its hashes and its re-measured accuracy.
"""

import dataclasses

import numpy as np
import pytest
import torch

from rlbook.checkpoints import (
    LOSS_HEAD_RTOL,
    LOSS_HEAD_STEPS,
    RECIPES,
    ROUTING_HEAD_MIN_STEPS,
    check_shipped,
    first_routing_difference,
    load_base_policy,
    load_manifest,
    loss_head_mismatches,
    sft_head,
)
from rlbook.checkpoints.__main__ import main as checkpoints_main
from rlbook.lm import build_model, build_tokenizer
from rlbook.rollout import encode_completions, generate_rollouts
from rlbook.sft import SFTConfig, SFTHistory, reached_target, sampled_accuracy, sft_loss, train_sft
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
    # the same machine runs the same kernels; the tolerances only keep float equality out of the tests
    np.testing.assert_allclose(h1.losses, h2.losses, rtol=1e-6, atol=0)
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], rtol=1e-6, atol=1e-8, msg=name)
    assert np.mean(h1.losses[-10:]) < 0.7 * np.mean(h1.losses[:10])
    assert h1.eval_steps == [30, 60] and len(h1.eval_accuracy) == 2


def test_train_sft_stops_after_patience_passing_evaluations():
    task = get_task("sort_digits", min_length=3, max_length=3)
    config = SFTConfig(max_steps=400, eval_every=20, eval_size=32, max_new_tokens=6, stop_at_accuracy=0.3,
                       stop_patience=2, seed=0)
    history = train_sft(build_model("tiny", seed=0), build_tokenizer(), task, config)
    passed = [accuracy >= 0.3 for accuracy in history.eval_accuracy]
    assert passed[-2:] == [True, True], "stops only after two passing evaluations in a row"
    assert not any(a and b for a, b in zip(passed[:-2], passed[1:-1])), "and at the first such pair"
    assert history.steps == history.eval_steps[-1] < 400


def test_reached_target_needs_patience_passing_evaluations_in_a_row():
    config = SFTConfig(stop_at_accuracy=0.5, stop_patience=2)
    assert reached_target(SFTHistory(eval_accuracy=[0.6, 0.4, 0.5, 0.7]), config)
    assert not reached_target(SFTHistory(eval_accuracy=[0.6, 0.4, 0.5]), config)
    assert not reached_target(SFTHistory(eval_accuracy=[0.9]), config)
    assert not reached_target(SFTHistory(eval_accuracy=[0.9, 0.9]), SFTConfig())  # no target: never stops


def test_train_sft_trains_on_train_problems_only(monkeypatch):
    task = get_task("arithmetic", num_digits=1)
    seen = []
    original = task.sample
    monkeypatch.setattr(task, "sample", lambda n, seed, split="all": seen.append(split) or original(n, seed, split))
    train_sft(build_model("tiny", seed=0), build_tokenizer(), task,
              SFTConfig(max_steps=3, batch_size=8, eval_every=3, eval_size=8, max_new_tokens=3))
    assert seen == ["test", "train", "train", "train"]  # the held-out set first, then one batch a step


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(max_steps=0), "max_steps"), (dict(lr=0.0), "lr must be positive"),
     (dict(stop_at_accuracy=1.5), "stop_at_accuracy"), (dict(batch_size=0), "batch_size"),
     (dict(stop_patience=0), "stop_patience")],
)
def test_sft_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SFTConfig(**kwargs)


def test_sampled_accuracy_is_the_tasks_verdict_also_under_a_length_bonus():
    """The accuracy counts :meth:`Task.is_correct`, not ``reward == correct_reward``: under a proxy's
    ``length_bonus`` every reward is off ``correct_reward`` and that count read 0 (issue 56)."""
    model, tokenizer = load_base_policy("arithmetic")
    recipe = RECIPES["arithmetic"]
    plain = get_task(recipe.task, **recipe.task_kwargs)
    proxy = get_task(recipe.task, **recipe.task_kwargs, length_bonus=0.05)
    examples = plain.sample(64, seed=0, split="test")
    tokens = recipe.sft.max_new_tokens
    batch = generate_rollouts(model, tokenizer, [e.prompt for e in examples], max_new_tokens=tokens,
                              temperature=1.0, seed=3)  # the samples sampled_accuracy draws with this seed
    verdicts = [proxy.is_correct(e, c, t) for e, c, t in zip(examples, batch.decode_completions(tokenizer),
                                                               batch.truncated.tolist())]
    accuracy = sampled_accuracy(model, tokenizer, proxy, examples, tokens, seed=3)
    assert accuracy == np.mean(verdicts) > 0
    assert accuracy == sampled_accuracy(model, tokenizer, plain, examples, tokens, seed=3)  # the bonus changes nothing


# --- the shipped base policies ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_shipped_base_policy_matches_its_manifest_and_has_headroom(name):
    manifest = load_manifest(name)
    assert check_shipped(name) == []  # sha256 of every file, and the recorded accuracy re-measured (+-0.02)
    assert manifest["reached_target"] and manifest["sft_steps"] < RECIPES[name].sft.max_steps
    low, high = RECIPES[name].accuracy_band
    assert low <= manifest["final_sampled_accuracy"] <= high, "a base policy needs headroom for RL"
    assert manifest["targets"]["accuracy_band"] == [low, high]
    assert manifest["recipe"]["sft"] == dataclasses.asdict(RECIPES[name].sft), "the recipe changed: rebuild"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_fresh_run_repeats_the_recorded_first_sft_losses(name):
    """Cheap and portable check of the whole recipe (task, split, model, optimiser, seeds): LOSS_HEAD_STEPS steps.

    A dense policy's losses must agree to LOSS_HEAD_RTOL at every step. A mixture of experts' are compared only
    before the first step whose routing differs from the recorded run's (a near-tied top-k choice that another
    CPU's rounding flips makes the loss jump), and that step must come after ROUTING_HEAD_MIN_STEPS: under torch's
    portable kernels it is step 38 (ROUTING_HEAD_MIN_STEPS says what was measured), under a changed recipe step 2."""
    manifest = load_manifest(name)
    recorded = manifest["sft_loss_head"]
    assert len(recorded) == LOSS_HEAD_STEPS
    losses, routes = sft_head(RECIPES[name])
    assert bool(routes) == ("sft_routing_head" in manifest) == (RECIPES[name].arch == "qwen3_moe")
    mismatches = loss_head_mismatches(losses, recorded, routes=routes or None,
                                      recorded_routes=manifest.get("sft_routing_head"))
    first = first_routing_difference(routes, manifest["sft_routing_head"]) if routes else None
    compared = f" (routing first differs at step {first}, losses compared before it)" if first else ""
    assert mismatches == [], (f"SFT losses differ by more than {LOSS_HEAD_RTOL:g} relative, or the routing differs "
                              f"within the first {ROUTING_HEAD_MIN_STEPS} steps, at steps {mismatches}{compared}")


@pytest.mark.parametrize("name", ["arithmetic", "sort_scratchpad_moe"])
def test_the_loss_head_check_catches_a_two_percent_learning_rate_change(name):
    recipe, manifest = RECIPES[name], load_manifest(name)
    planted = dataclasses.replace(recipe, sft=dataclasses.replace(recipe.sft, lr=recipe.sft.lr * 1.02))
    losses, routes = sft_head(planted)
    assert loss_head_mismatches(losses, manifest["sft_loss_head"], routes=routes or None,
                                recorded_routes=manifest.get("sft_routing_head")) != []


def test_an_moe_routing_difference_limits_the_compared_losses():
    recorded, routes = ["a"] * 30, ["a"] * 25 + ["b"] * 5
    losses, stored = [1.0] * 30, [1.0] * 26 + [2.0] * 4  # the losses differ only after routing did
    assert loss_head_mismatches(losses, stored) == [27, 28, 29, 30]
    assert loss_head_mismatches(losses, stored, routes=routes, recorded_routes=recorded) == []
    assert first_routing_difference(routes, recorded) == 26
    early = ["a"] * 10 + ["b"] * 20  # a routing difference within the first ROUTING_HEAD_MIN_STEPS is a mismatch
    assert loss_head_mismatches(losses, [1.0] * 30, routes=early, recorded_routes=recorded) == [11]
    assert first_routing_difference(recorded, recorded) is None


def test_loss_head_mismatches():
    assert loss_head_mismatches([1.0, 2.0], [1.0 + 1e-7, 2.0]) == []
    assert loss_head_mismatches([1.0, 2.0], [1.0, 2.001]) == [2]
    assert loss_head_mismatches([1.0], [1.0, 2.0]) == [1, 2]


def test_unknown_base_policy():
    with pytest.raises(ValueError, match="unknown base policy"):
        load_base_policy("chess")
    with pytest.raises(SystemExit):
        checkpoints_main(["verify", "chess"])


def test_the_command_line_says_what_it_checks(capsys):
    with pytest.raises(SystemExit):
        checkpoints_main(["--help"])
    text = capsys.readouterr().out
    for phrase in ("sha256", "first SFT losses", "target", "band", "does not"):
        assert phrase in text, phrase
