"""Reduced runs of experiments/lambda_grpo (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import math

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_lambda_grpo_compare_reduced_run():
    script = load_script("lambda_grpo_compare")
    result = script.run(seeds=(0,), processes=1, max_steps=2, eval_every=2, eval_size=8,
                        per_device_train_batch_size=16)
    assert set(result["runs"]) == set(script.ARMS) and result["common"]["max_steps"] == 2
    for name in script.ARMS:
        (run,) = result["runs"][name]
        assert run["seed"] == 0 and run["eval_steps"] == [0, 2] and all(0.0 <= a <= 1.0 for a in run["eval_accuracy"])
        assert set(run["metrics"]) == set(script.LOGGED)
        assert all(1 <= n <= run["config"]["max_completion_length"] for n in run["metrics"]["completions/mean_length"])
        learned = name == "lambda_grpo"
        assert all((x is not None) == learned for x in run["metrics"]["lambda_grpo/lambda"]), \
            "lambda logged by lambda_grpo only"
        assert run["config"]["loss_type"] == {"grpo": "grpo", "dr_grpo": "dr_grpo"}.get(name, "dapo")
        assert run["config"]["lambda_grpo"] == learned


def test_lambda_grpo_stored_results_match_the_script():
    """The stored results the chapter plots: >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("lambda_grpo_compare")
    stored = load_stored("lambda_grpo_compare")
    assert stored["experiment"] == "lambda_grpo_compare" and stored["policy"] == script.POLICY
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON
    assert stored["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    assert stored["provenance"]["checkpoint_sha256"][script.POLICY]
    for name in script.ARMS:
        assert [run["seed"] for run in stored["runs"][name]] == stored["seeds"]
        for run in stored["runs"][name]:
            assert set(run["metrics"]) == set(script.LOGGED)
            assert len(run["metrics"]["accuracy"]) == script.COMMON["max_steps"]
            assert run["config"]["loss_type"] == script.ARMS[name].overrides.get("loss_type", "dapo")
            if name == "lambda_grpo":
                assert all(math.isfinite(x) for x in run["metrics"]["lambda_grpo/lambda"])
