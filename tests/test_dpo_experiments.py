"""Reduced runs of experiments/dpo_ipo and experiments/dpo_onpolicy (seconds each), the pieces of rlbook.dpo they
use (on-policy pairs, the per-step hook), and their stored results: made by the scripts' current settings, >= 5
paired seeds, in the organisms' layout that rlbook.organisms.phenomenon reads."""

import json

import numpy as np
import pytest
from experiment_scripts import load_script, load_stored, provenance_keys, record_keys

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, on_policy_pairs, train_dpo
from rlbook.organisms import phenomenon
from rlbook.tasks.preferences import build_preference_pairs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_on_policy_pairs_are_the_policys_own_right_and_wrong_answers():
    policy, tokenizer = load_base_policy("arithmetic")
    task = RECIPES["arithmetic"].make_task()
    examples = task.sample(16, np.random.default_rng(0), split="train")
    pairs = on_policy_pairs(policy, tokenizer, task, examples, num_generations=8, max_new_tokens=8, seed=3)
    assert 0 < len(pairs) <= len(examples)
    by_prompt = {e.prompt: e for e in examples}
    for pair in pairs:
        example = by_prompt[pair.prompt]
        assert task.is_correct(example, pair.chosen) and not task.is_correct(example, pair.rejected)
    again = on_policy_pairs(policy, tokenizer, task, examples, num_generations=8, max_new_tokens=8, seed=3)
    assert again == pairs, "seeded"


def test_train_dpo_calls_on_step_after_every_step():
    policy, tokenizer = load_base_policy("arithmetic")
    pairs = build_preference_pairs(RECIPES["arithmetic"].make_task(), 8, seed=0, split="train")
    seen = []
    history = train_dpo(policy, tokenizer, pairs, config=DPOConfig(max_steps=3, per_device_train_batch_size=4),
                        on_step=lambda step, model: seen.append((step, model is policy)))
    assert seen == [(1, True), (2, True), (3, True)] and len(history) == 3


def test_dpo_ipo_reduced_run(tmp_path):
    script = load_script("dpo_ipo")
    result = script.run([0], processes=1, progress=False, out=tmp_path / "ipo.json", steps=6, eval_every=2,
                        num_train_pairs=8, num_test_pairs=8, num_prompts=8, num_samples=2,
                        train=dict(beta=0.5, learning_rate=1e-3, per_device_train_batch_size=4))
    assert list(result["runs"]) == ["dpo", "ipo"] and result["organism"]["metric"] == "margin"
    for runs in result["runs"].values():
        (run,) = runs
        assert [e["step"] for e in run["curve"]] == [0, 2, 4, 6] and [e["step"] for e in run["evals"]] == [4, 6]
        assert run["curve"][0]["margin"] == pytest.approx(0.0, abs=1e-5), "the policy starts as the reference"
        assert run["curve"][-1]["margin"] > 0.0, "both losses widen the margin on their training pairs"
        assert 0.0 <= run["evals"][-1]["expected_accuracy"] <= 1.0
    # paired: the same pairs, prompts and sampling stream at step 0
    assert result["runs"]["dpo"][0]["curve"][0] == result["runs"]["ipo"][0]["curve"][0]
    entry = phenomenon(result, chapter="dpo", phenomenon="t", fix="ipo", fix_metric="expected_accuracy",
                       fix_direction="up", script="experiments/dpo_ipo.py")
    assert entry["baseline"] == "dpo" and entry["seeds"] == 1
    written, stored = json.loads((tmp_path / "ipo.json").read_text()), load_stored("dpo_ipo")
    assert list(written) == list(stored)
    assert record_keys(written["runs"]["ipo"][0]) == record_keys(stored["runs"]["ipo"][0])
    assert list(written["runs"]["ipo"][0]["evals"][0]) == list(stored["runs"]["ipo"][0]["evals"][0])


def test_dpo_onpolicy_reduced_run(tmp_path):
    script = load_script("dpo_onpolicy")
    result = script.run([0], ("offline", "on_policy"), processes=1, progress=False, out=tmp_path / "onp.json",
                        rounds=2, steps_per_round=2, pairs_per_round=8, prompts_per_round=16, num_prompts=8,
                        num_samples=2)
    assert list(result["runs"]) == ["offline", "on_policy"] and result["organism"]["failure"] == "down"
    (offline,), (on_policy,) = result["runs"].values()
    for run in (offline, on_policy):
        assert [e["step"] for e in run["evals"]] == [0, 2, 4]
        assert all(0 < r["num_pairs"] <= 8 for r in run["rounds"])
    assert offline["evals"][0] == on_policy["evals"][0], "paired: the same policy, prompts and stream at step 0"
    assert offline["rounds"][0]["examples"] != on_policy["rounds"][0]["examples"], "the pairs differ"
    written, stored = json.loads((tmp_path / "onp.json").read_text()), load_stored("dpo_onpolicy")
    assert list(written) == list(stored)
    assert record_keys(written["runs"]["offline"][0]) == record_keys(stored["runs"]["offline"][0])


@pytest.mark.parametrize("name", ["dpo_ipo", "dpo_onpolicy"])
def test_stored_results_match_the_scripts(name):
    """>= 5 seeds per arm in seed order, made with the script's current arms and settings, evaluations at the
    steps the script makes, and a PHENOMENA-ready layout."""
    script, stored = load_script(name), load_stored(name)
    assert stored["experiment"] == name and stored["arms"] == script.ARMS and stored["common"] == script.COMMON
    assert list(stored["runs"]) == list(script.ARMS) and len(stored["seeds"]) >= 5
    common = script.COMMON
    if name == "dpo_ipo":
        curve = list(range(0, common["steps"] + 1, common["eval_every"]))
        evals = [s for s in curve if s >= common["steps"] // 2]
    else:
        curve = evals = list(range(0, common["rounds"] * common["steps_per_round"] + 1, common["steps_per_round"]))
    for arm, runs in stored["runs"].items():
        assert [r["seed"] for r in runs] == stored["seeds"], arm
        for run in runs:
            assert [e["step"] for e in run["evals"]] == evals
            if name == "dpo_ipo":
                assert [e["step"] for e in run["curve"]] == curve
    assert stored["organism"]["name"] == script.ORGANISM["name"]
