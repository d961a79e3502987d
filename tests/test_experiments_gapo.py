"""Reduced runs of experiments/gapo_compare (a few seconds each): they run, and their results have the shape and
the properties the chapter relies on; the stored results were made by the script's current settings."""

import json
import math

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_gapo_compare_reduced_run(tmp_path):
    script = load_script("gapo_compare")
    arms = {**script.ARMS, "gapo": dict(method="gapo", encoder_steps=1),
            "gapo_more_encoder": dict(method="gapo", encoder_steps=2)}
    result = script.run([0], arms, processes=1, progress=False, out=tmp_path / "gapo.json", rounds=1,
                        generator_steps=1, gapo={**script.COMMON["gapo"], "warmup_steps": 2})
    assert result["updates"] == [0, 1] and list(result["runs"]) == list(script.ARMS)
    for name, (run,) in result["runs"].items():
        assert run["seed"] == 0 and len(run["gold"]) == 2 and all(0.0 <= g <= 1.0 for g in run["gold"])
        if name != "dpo":
            assert set(script.KEEP) | {"warmup_accuracy"} <= set(run)
            assert run["objective/kl_per_token"][0] == 0.0 and math.isfinite(run["objective/kl_per_token"][1])
    runs = {name: run for name, (run,) in result["runs"].items()}
    assert runs["gapo"]["gold"][0] == pytest.approx(runs["dpo"]["gold"][0])  # the same start
    frozen = runs["ppo_frozen"]["pair_accuracy"]
    assert frozen[0] == pytest.approx(frozen[1])  # the frozen encoder does not move
    # what it writes has the stored file's layout, key for key
    written, stored = json.loads((tmp_path / "gapo.json").read_text()), load_stored("gapo_compare")
    assert list(written) == list(stored) and set(written["provenance"]) <= set(stored["provenance"])
    assert all(list(written["runs"][name][0]) == list(stored["runs"][name][0]) for name in stored["runs"])


def test_gapo_compare_stored_results_match_the_script():
    """The stored runs have >= 5 seeds per arm, in seed order, made with the script's current settings."""
    script = load_script("gapo_compare")
    stored = load_stored("gapo_compare")
    assert stored["experiment"] == "gapo_compare" and len(stored["seeds"]) >= 5
    assert stored["common"] == script.COMMON and stored["arms"] == script.ARMS
    rounds = script.COMMON["rounds"]
    assert stored["updates"] == [r * script.COMMON["generator_steps"] for r in range(rounds + 1)]
    for name, runs in stored["runs"].items():
        assert [r["seed"] for r in runs] == stored["seeds"], name
        keys = ("gold",) if name == "dpo" else script.KEEP
        assert all(len(r[key]) == rounds + 1 for r in runs for key in keys), name
