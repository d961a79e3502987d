"""Reduced runs of experiments/pg (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import math

import numpy as np
import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_pg_gradient_variance_reduced_run():
    script = load_script("pg_gradient_variance")
    result = script.run(group_sizes=(4,), seeds=(0,), num_batches=3, batch_size=16, processes=1, progress=False)
    (record,) = result["runs"]["G=4"]
    variance = record["total_variance"]
    assert set(variance) == set(record["mean_sq_norm"]) == set(script.ESTIMATORS)
    assert all(math.isfinite(v) and v >= 0 for v in variance.values())
    # the group-mean advantage is (G - 1)/G times RLOO's on every batch, so its variance is ((G - 1)/G)^2 times
    assert variance["group_mean"] == pytest.approx((3 / 4) ** 2 * variance["rloo"], rel=1e-4)


def test_pg_gradient_variance_shifted_rewards():
    """Shifted rewards, on the same rollouts: the group baselines' gradients are those of 0/1 rewards (the shift
    cancels), no baseline's variance grows."""
    script = load_script("pg_gradient_variance")
    reduced = dict(group_sizes=(2,), seeds=(0,), num_batches=3, batch_size=8, processes=1, progress=False)
    plain = script.run(**reduced)["runs"]["G=2"][0]["total_variance"]
    result = script.run(**reduced, task_kwargs=script.SHIFTED)
    assert result["common"] == {**script.SETTINGS, "num_batches": 3, "batch_size": 8, "task_kwargs": script.SHIFTED}
    shifted = result["runs"]["G=2"][0]["total_variance"]
    for estimator in ("group_mean", "rloo"):
        assert shifted[estimator] == pytest.approx(plain[estimator], rel=1e-4)
    assert shifted["reinforce"] > 4 * plain["reinforce"]


def test_pg_gradient_variance_estimators_are_the_trainers():
    """The script's advantages are those of the trainer's registry (rlbook.advantages) under the same names."""
    import torch

    from rlbook.advantages import ESTIMATORS, AdvantageInputs
    from rlbook.presets import RLConfig

    script = load_script("pg_gradient_variance")
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    mask = torch.ones(8, 3)
    inputs = AdvantageInputs(rewards, rewards[:, None] * mask, mask, mask.sum(-1), num_generations=4)
    for name in script.ESTIMATORS:
        expected = ESTIMATORS[name](inputs, RLConfig(num_generations=4)).advantages
        # exact: both run the same rlbook.objectives code on the same 8 rewards (no kernel choice between them)
        assert torch.equal(script.advantages(rewards, name, 4), expected), name
    with pytest.raises(ValueError, match="unknown estimator"):
        script.advantages(torch.zeros(4), "a2c", 2)


def test_pg_training_reduced_run():
    script = load_script("pg_training")
    arms = {name: script.ARMS[name] for name in ("reinforce", "rloo")}
    result = script.run(arms, seeds=(0,), processes=1, progress=False, max_steps=2, eval_every=2, eval_size=8,
                        num_generations=4, per_device_train_batch_size=8)
    for name in ("reinforce", "rloo"):
        (run,) = result["runs"][name]
        assert run["config"]["advantage_estimator"] == {"reinforce": "reinforce", "rloo": "rloo"}[name]
        assert run["eval_steps"] == [0, 2] and set(run["metrics"]) == set(script.LOGGED)
        assert len(run["metrics"]["reward"]) == 2 and np.isfinite(run["metrics"]["grad_norm"]).all()
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"])


def test_pg_stored_results_match_the_scripts():
    """The stored results the chapter plots were made by the current scripts' settings, >= 5 seeds."""
    variance = load_stored("pg_gradient_variance")
    script = load_script("pg_gradient_variance")
    assert variance["common"] == script.SETTINGS and len(variance["seeds"]) >= 5
    assert list(variance["arms"]) == [f"G={G}" for G in script.GROUP_SIZES]
    assert all(len(runs) == len(variance["seeds"]) for runs in variance["runs"].values())

    shifted = load_stored("pg_gradient_variance_shifted")
    assert shifted["common"] == {**script.SETTINGS, "task_kwargs": script.SHIFTED}
    assert shifted["seeds"] == variance["seeds"] and list(shifted["arms"]) == list(variance["arms"])
    assert all(len(runs) == len(shifted["seeds"]) for runs in shifted["runs"].values())

    training = load_stored("pg_training")
    script = load_script("pg_training")
    assert training["common"] == script.SETTINGS and len(training["seeds"]) >= 5
    assert training["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    steps = script.SETTINGS["max_steps"]
    for runs in training["runs"].values():
        for run in runs:
            assert run["eval_steps"][-1] == steps and len(run["metrics"]["reward"]) == steps
