"""Reduced runs of experiments/grpo_training (a few seconds each): they run, and their results have the shape and
the properties the chapter relies on; the stored results were made by the script's current settings."""

import dataclasses
import json
import math

import pytest
from experiment_scripts import assert_same_layout, comparable_config, load_script, load_stored

from rlbook.presets import preset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_grpo_training_stored_results_match_the_script():
    """The stored comparison (the GRPO chapter's) has >= 5 seeds per arm, paired by seed, made with the script's
    current arms and settings: every stored config is the one the script builds for that arm and seed."""
    script = load_script("grpo_training")
    stored = load_stored("grpo_training")
    assert stored["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    common = stored["common"]
    for name, arm in script.ARMS.items():
        runs = stored["runs"][name]
        assert [r["seed"] for r in runs] == stored["seeds"] and len(stored["seeds"]) >= 5, name
        for run in runs:
            expected = preset(arm.preset, max_completion_length=8, max_steps=common["steps"],
                              eval_every=common["eval_every"], eval_size=common["eval_size"],
                              **{**script.COMMON, **arm.overrides}, seed=run["seed"])
            assert comparable_config(run["config"]) == comparable_config(dataclasses.asdict(expected)), (name, run["seed"])
            assert run["eval_steps"][-1] == run["config"]["max_steps"]
            assert list(run["metrics"]) == list(script.LOGGED)
    # the KL in GRPO's loss starts at 0 (the policy is the reference) and is logged only where beta > 0
    assert all(r["metrics"]["kl"][0] < 1e-6 for r in stored["runs"]["grpo"])
    assert all(x is None for r in stored["runs"]["ppo"] for x in r["metrics"]["kl"])


def test_grpo_training_reduced_run():
    script = load_script("grpo_training")
    for name, arm in script.ARMS.items():
        record = script.run_one(name, arm, 0, steps=2, eval_every=1, eval_size=8, num_generations=4,
                                per_device_train_batch_size=8)
        metrics = record["metrics"]
        assert list(metrics) == list(script.LOGGED)
        assert record["eval_steps"] == [0, 1, 2] and all(0.0 <= a <= 1.0 for a in record["eval_accuracy"])
        assert len(metrics["reward"]) == 2
        if name == "grpo":  # one on-policy update with k3 in the loss: nothing clipped, KL to the reference logged
            assert metrics["clip_ratio/region_mean"] == [0.0, 0.0]
            assert all(math.isfinite(x) and x >= 0.0 for x in metrics["kl"])
        else:
            assert all(math.isfinite(x) for x in metrics["loss/value"])


def test_grpo_training_writes_the_stored_layout(tmp_path):
    """A tiny run of the script's main writes the layout of the stored file, key for key."""
    script = load_script("grpo_training")
    out = tmp_path / "grpo_training.json"
    script.main(["--algorithms", "grpo", "--seeds", "1", "--steps", "1", "--eval-every", "1", "--eval-size", "8",
                 "--processes", "1", "--out", str(out)])
    assert_same_layout(json.loads(out.read_text()), load_stored("grpo_training"), "grpo")
