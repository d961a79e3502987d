"""Reduced runs of experiments/ppo_compare (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import dataclasses
import json
import math

import pytest
from experiment_scripts import assert_same_layout, comparable_config, load_script, load_stored

from rlbook.presets import preset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ppo_compare_reduced_run():
    script = load_script("ppo_compare")
    for name, arm in script.ARMS.items():
        record = script.run_one(name, arm, 0, steps=2, eval_every=1, eval_size=8, num_generations=4,
                                per_device_train_batch_size=8)
        metrics = record["metrics"]
        assert list(metrics) == list(script.LOGGED)
        assert record["eval_steps"] == [0, 1, 2] and all(0.0 <= a <= 1.0 for a in record["eval_accuracy"])
        assert len(metrics["reward"]) == 2 and all(math.isfinite(x) for x in metrics["approx_kl"])
        if arm.preset == "ppo":  # a value model and four epochs: value metrics exist and the ratio moved
            assert all(math.isfinite(x) for x in metrics["loss/value"])
            assert max(metrics["ratio/max"]) > 1.0
        else:  # one on-policy update: the ratio is 1, nothing is clipped, and there is no critic
            assert metrics["clip_ratio/region_mean"] == [0.0, 0.0]
            assert metrics["loss/value"] == [None, None]


def test_ppo_compare_writes_the_stored_layout(tmp_path):
    """A tiny run of the script's main writes the layout of the stored file, key for key."""
    script = load_script("ppo_compare")
    out = tmp_path / "ppo_compare.json"
    script.main(["--algorithms", "reinforce_baseline", "--seeds", "1", "--steps", "1", "--eval-every", "1",
                 "--eval-size", "8", "--processes", "1", "--out", str(out)])
    assert_same_layout(json.loads(out.read_text()), load_stored("ppo_compare"), "reinforce_baseline")


def test_ppo_compare_stored_results_match_the_script():
    """The stored comparison (the PPO chapter's) has >= 5 seeds per arm, made with the script's current arms and
    settings: every stored config is the one the script builds for that arm and seed."""
    script = load_script("ppo_compare")
    stored = load_stored("ppo_compare")
    assert stored["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    common = stored["common"]
    for name, arm in script.ARMS.items():
        runs = stored["runs"][name]
        assert len({r["seed"] for r in runs}) >= 5, name
        for run in runs:
            expected = preset(arm.preset, max_completion_length=8, max_steps=common["steps"],
                              eval_every=common["eval_every"], eval_size=common["eval_size"],
                              **{**script.COMMON, **arm.overrides}, seed=run["seed"])
            assert comparable_config(run["config"]) == comparable_config(dataclasses.asdict(expected)), (name, run["seed"])
            assert run["eval_steps"][-1] == run["config"]["max_steps"]
            assert list(run["metrics"]) == list(script.LOGGED)
            assert all(len(v) == common["steps"] for v in run["metrics"].values())
