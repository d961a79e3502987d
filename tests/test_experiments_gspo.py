"""Reduced runs of experiments/gspo (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import math

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_gspo_moe_reduced_run():
    script = load_script("gspo_moe")
    result = script.run(seeds=(0,), steps=2, moe_sft_steps=3, processes=1)
    assert result["moe_sft"]["sft_steps"] == 3 and result["moe_sft"]["parameters"] > 0
    for arm in script.ARMS:
        (run,) = result["runs"][arm]
        m = run["metrics"]
        assert set(m) == set(script.LOGGED) and len(m["reward"]) == 2 and run["eval_steps"][0] == 0
        spread = m["post_update/log_ratio_sequence_var"] + m["post_update/log_ratio_token_var"]
        assert all(math.isfinite(v) and v >= 0 for v in spread)
        if script.POLICIES[arm] == "moe":
            assert all(0.0 <= f <= 1.0 for f in m["moe/route_changed"])
        else:
            assert m["moe/route_changed"] == [None, None]
    assert result["runs"]["moe_gspo"][0]["config"]["importance_sampling_level"] == "sequence"


def test_gspo_moe_stored_results_match_the_script():
    """The stored runs have >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("gspo_moe")
    stored = load_stored("gspo_moe")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON
    assert stored["arms"] == {arm: spec.to_json() for arm, spec in script.ARMS.items()}
    assert stored["policies"] == script.POLICIES and stored["moe"] == script.MOE and stored["steps"] == script.STEPS
    for arm in script.ARMS:
        assert [run["seed"] for run in stored["runs"][arm]] == stored["seeds"]
        for run in stored["runs"][arm]:
            assert set(run["metrics"]) == set(script.LOGGED)
            assert all(len(values) == script.STEPS for values in run["metrics"].values())
