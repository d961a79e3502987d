"""Reduced runs of experiments/gmpo (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_gmpo_stability_reduced_run():
    script = load_script("gmpo_stability")
    result = script.run(arms=("grpo", "gmpo_fast"), seeds=(0,), steps=2, processes=1, eval_every=2, eval_size=8)
    assert result["arms"] == {arm: script.ARMS[arm].to_json() for arm in ("grpo", "gmpo_fast")}
    for arm in ("grpo", "gmpo_fast"):
        (run,) = result["runs"][arm]
        m = run["metrics"]
        assert run["seed"] == 0 and set(m) == set(script.LOGGED)
        assert len(m["reward"]) == 2 and run["eval_steps"] == [0, 2]
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"])
        assert all(0 < lo <= 1 <= hi for lo, hi in zip(m["ratio/min"], m["ratio/max"]))
        # the largest |mean log-ratio| of a completion cannot exceed the largest |token log-ratio|
        token, sequence = m["post_update/max_abs_log_ratio_token"], m["post_update/max_abs_log_ratio_sequence"]
        assert all(0 < t and s <= t + 1e-6 for s, t in zip(sequence, token))
    assert result["runs"]["gmpo_fast"][0]["config"]["loss_type"] == "gmpo"
    assert result["runs"]["gmpo_fast"][0]["config"]["learning_rate"] == 5e-4


def test_gmpo_stability_stored_results_match_the_script():
    """The stored runs have >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("gmpo_stability")
    stored = load_stored("gmpo_stability")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON
    assert stored["arms"] == {arm: spec.to_json() for arm, spec in script.ARMS.items()}
    assert stored["steps"] == script.STEPS
    for arm in script.ARMS:
        assert [run["seed"] for run in stored["runs"][arm]] == stored["seeds"]
        for run in stored["runs"][arm]:
            assert set(run["metrics"]) == set(script.LOGGED)
            assert all(len(values) == script.STEPS for values in run["metrics"].values())
