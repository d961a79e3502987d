"""Reduced runs of experiments/gfpo (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import numpy as np
import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_gfpo_length_excess_by_hand():
    script = load_script("gfpo_length")
    from rlbook.checkpoints import RECIPES

    task = RECIPES[script.POLICY].make_task()
    examples = task.sample(2, seed=0, split="test")
    reference = [task.demonstration(e) for e in examples]
    got = script.excess_lengths(task, examples, [reference[0], reference[1] + "|123"])
    np.testing.assert_allclose(got, [0.0, 4.0], atol=1e-12)


def test_gfpo_length_reduced_run():
    script = load_script("gfpo_length")
    result = script.run(seeds=(0,), held_out_size=8, processes=1, max_steps=2, eval_every=2, eval_size=8)
    assert set(result["runs"]) == set(script.ARMS) and result["held_out_size"] == 8
    for name in script.ARMS:
        (run,) = result["runs"][name]
        metrics = run["metrics"]
        assert run["eval_steps"] == [0, 2] and len(metrics["excess_length"]) == len(metrics["time/step"]) == 2
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"] + [run["start"]["accuracy"], run["end"]["accuracy"]])
        assert all(0 < g < s for g, s in zip(metrics["time/generate"], metrics["time/step"]))
        filtered = name != "grpo"
        assert all((k is not None) == filtered for k in metrics["gfpo/kept_mean_length"]), \
            "survivors' length logged by GFPO only"
        assert run["config"]["advantage_estimator"] == ("gfpo" if filtered else "grpo")
    starts = [result["runs"][name][0]["start"] for name in script.ARMS]
    assert all(s == starts[0] for s in starts), "every arm starts from the same weights and held-out prompts"


def test_gfpo_stored_results_match_the_script():
    """The stored results the chapter plots: >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("gfpo_length")
    stored = load_stored("gfpo_length")
    assert stored["experiment"] == "gfpo_length" and stored["policy"] == script.POLICY
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON
    assert stored["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    for name in script.ARMS:
        assert [run["seed"] for run in stored["runs"][name]] == stored["seeds"]
        for run in stored["runs"][name]:
            assert set(run["metrics"]) == {"excess_length", "accuracy", "gfpo/kept_mean_length", "time/generate",
                                           "time/step"}
            assert all(len(v) == script.COMMON["max_steps"] for v in run["metrics"].values())
            assert set(run["start"]) == set(run["end"]) == {"accuracy", "excess_length"}
