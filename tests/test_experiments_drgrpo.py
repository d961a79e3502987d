"""Reduced runs of experiments/drgrpo (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_drgrpo_length_stats_by_hand():
    script = load_script("drgrpo_length")
    from rlbook.checkpoints import RECIPES

    task = RECIPES[script.POLICY].make_task()
    examples = task.sample(2, seed=0, split="test")
    reference = [task.demonstration(e) for e in examples]
    completions = [reference[0], reference[1] + "|123"]  # the first right, the second 4 characters too long
    stats = script.length_stats(task, examples, completions, task.rewards(examples, completions, [False, False]))
    assert stats["excess_correct"] == pytest.approx(0.0) and stats["length_correct"] == len(reference[0])
    assert stats["excess_wrong"] == pytest.approx(4.0) and stats["length_wrong"] == len(reference[1]) + 4


def test_drgrpo_length_reduced_run():
    script = load_script("drgrpo_length")
    result = script.run(seeds=(0,), processes=1, max_steps=2, eval_every=2, eval_size=8, num_generations=4,
                        per_device_train_batch_size=8)
    assert set(result["runs"]) == set(script.ARMS) and result["common"]["beta"] == pytest.approx(0.0)
    for name in script.ARMS:
        (run,) = result["runs"][name]
        metrics = run["metrics"]
        assert run["config"]["loss_type"] == name and run["config"]["num_generations"] == 4
        assert run["eval_steps"] == [0, 2] and list(metrics) == list(script.LOGGED)
        assert len(metrics["accuracy"]) == len(metrics["excess_wrong"]) == 2
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"] + metrics["completions/clipped_ratio"])
        for step in range(2):  # the callback's wrong and correct lengths are those of the step's completions
            lengths = [metrics["length_wrong"][step], metrics["length_correct"][step]]
            assert any(x == x for x in lengths) and all(x != x or 0 <= x <= 40 for x in lengths)


def test_drgrpo_stored_results_match_the_script():
    """The stored results the chapter plots: >= 5 seeds per preset, made with the script's current settings."""
    script = load_script("drgrpo_length")
    stored = load_stored("drgrpo_length")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.SETTINGS
    assert stored["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    for name in script.ARMS:
        runs = stored["runs"][name]
        assert [run["seed"] for run in runs] == stored["seeds"]
        assert all(run["config"]["loss_type"] == name for run in runs)
        assert all(list(run["metrics"]) == list(script.LOGGED) for run in runs)
        assert all(len(values) == script.SETTINGS["max_steps"] for run in runs for values in run["metrics"].values())
        assert all(run["eval_steps"] == [0, 50, 100, 150, 200] for run in runs)
