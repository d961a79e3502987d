"""Reduced runs of experiments/dpo_sweep (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import json

import pytest
from experiment_scripts import load_script, load_stored, provenance_keys, record_keys

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_dpo_sweep_reduced_run(tmp_path):
    script = load_script("dpo_sweep")
    result = script.run([0], ("sigmoid_0.5", "ipo_0.5"), processes=1, progress=False, out=tmp_path / "dpo.json",
                        steps=4, eval_every=2, num_train_pairs=64, num_test_pairs=32, num_eval_problems=16)
    assert list(result["runs"]) == ["sigmoid_0.5", "ipo_0.5"] and result["seeds"] == [0]
    assert result["common"]["steps"] == 4 and result["arms"]["ipo_0.5"] == script.ARMS["ipo_0.5"]
    (sigmoid,), (ipo,) = result["runs"].values()
    for run in (sigmoid, ipo):
        assert run["seed"] == 0 and run["eval_steps"] == [2, 4]
        assert list(run["eval"]) == list(script.KEEP) and all(len(v) == 2 for v in run["eval"].values())
        assert 0.0 <= run["accuracy_before"] <= 1.0 and 0.0 <= run["accuracy_after"] <= 1.0
        assert all(0.0 <= a <= 1.0 for a in run["eval"]["rewards/accuracies"])
    # paired by seed: the same base policy, problems and sampling seed before training; the losses differ after
    assert sigmoid["accuracy_before"] == ipo["accuracy_before"]
    assert sigmoid["eval"]["loss"] != pytest.approx(ipo["eval"]["loss"])
    # what it writes has the stored file's layout, key for key
    written, stored = json.loads((tmp_path / "dpo.json").read_text()), load_stored("dpo_sweep")
    assert list(written) == list(stored) and provenance_keys(written) <= set(stored["provenance"])
    assert record_keys(written["runs"]["ipo_0.5"][0]) == record_keys(stored["runs"]["ipo_0.5"][0])


def test_dpo_stored_results_match_the_script():
    """The stored sweep (the DPO chapter's) has >= 5 seeds per arm, in seed order, made with the script's current
    arms and settings, with the metrics the chapter plots at every eval step."""
    script = load_script("dpo_sweep")
    stored = load_stored("dpo_sweep")
    assert stored["experiment"] == "dpo_sweep" and stored["arms"] == script.ARMS and stored["common"] == script.COMMON
    assert list(stored["runs"]) == list(script.ARMS) and len(stored["seeds"]) >= 5
    steps = list(range(script.COMMON["eval_every"], script.COMMON["steps"] + 1, script.COMMON["eval_every"]))
    for arm, runs in stored["runs"].items():
        assert [r["seed"] for r in runs] == stored["seeds"], arm
        for run in runs:
            assert run["eval_steps"] == steps and list(run["eval"]) == list(script.KEEP)
            assert all(len(v) == len(steps) for v in run["eval"].values())
