"""Reduced runs of experiments/gapo_compare (a few seconds each): they run, and their results have the shape and
the properties the chapter relies on; the stored results were made by the script's current settings."""

import json
import math

import pytest
from experiment_scripts import load_script, load_stored, provenance_keys, record_keys

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_gapo_compare_reduced_run(tmp_path):
    script = load_script("gapo_compare")
    gapo = {**script.COMMON["gapo"], "warmup_steps": 2, "num_train_pairs": 32, "num_test_pairs": 16,
            "encoder_steps": 1, "encoder_batch_size": 16,
            "rl": {**script.COMMON["gapo"]["rl"], "per_device_train_batch_size": 16, "eval_size": 16}}
    result = script.run([0], processes=1, progress=False, out=tmp_path / "gapo.json", rounds=1, generator_steps=1,
                        num_prompts=16, num_samples=1, gapo=gapo,
                        dpo={**script.COMMON["dpo"], "per_device_train_batch_size": 16})
    assert list(result["runs"]) == list(script.ARMS) and result["organism"]["name"] == "frozen_judge"
    runs = {name: run for name, (run,) in result["runs"].items()}
    for name, run in runs.items():
        assert [e["step"] for e in run["evals"]] == [0, 1], name
        assert all(0.0 <= e["expected_accuracy"] <= 1.0 for e in run["evals"]), name
    starts = {run["evals"][0]["expected_accuracy"] for run in runs.values()}
    assert len(starts) == 1  # every arm starts from the same policy, measured on the same prompts and stream
    for name in ("ppo_frozen", "gapo", "gapo_non_reference"):
        first, last = runs[name]["evals"]
        assert {"pair_accuracy_length", "pair_accuracy_count", "num_fresh_pairs"} <= set(last), name
        # exact: round 0 is written before any step (rlbook.gapo), a 0.0 that no kernel computes
        assert math.isfinite(last["objective/kl_per_token"]) and first["objective/kl_per_token"] == 0.0
    frozen = runs["ppo_frozen"]["evals"]
    assert frozen[0]["pair_accuracy"] == frozen[1]["pair_accuracy"]  # the frozen judge does not move
    # rule negatives reject only wrong samples, the GAN reading every non-reference sample: never fewer
    assert runs["gapo"]["evals"][1]["num_fresh_pairs"] <= runs["gapo_non_reference"]["evals"][1]["num_fresh_pairs"]
    # what it writes has the stored file's layout, key for key
    written, stored = json.loads((tmp_path / "gapo.json").read_text()), load_stored("gapo_compare")
    assert list(written) == list(stored) and provenance_keys(written) <= set(stored["provenance"])
    for name in stored["runs"]:
        assert record_keys(written["runs"][name][0]) == record_keys(stored["runs"][name][0])
        assert list(written["runs"][name][0]["evals"][-1]) == list(stored["runs"][name][0]["evals"][-1])


def test_gapo_compare_stored_results_match_the_script():
    """The stored runs have >= 5 seeds per arm, in seed order, made with the script's current settings."""
    script = load_script("gapo_compare")
    stored = load_stored("gapo_compare")
    assert stored["experiment"] == "gapo_compare" and len(stored["seeds"]) >= 5
    assert stored["common"] == script.COMMON and stored["arms"] == script.ARMS
    steps = [r * script.COMMON["generator_steps"] for r in range(script.COMMON["rounds"] + 1)]
    for name, runs in stored["runs"].items():
        assert [r["seed"] for r in runs] == stored["seeds"], name
        assert all([e["step"] for e in r["evals"]] == steps for r in runs), name
