"""Reduced runs of experiments/dapo (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import math

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_dapo_ablations_reduced_run():
    script = load_script("dapo_ablations")
    result = script.run(seeds=(0,), steps=2, processes=1)
    ablations = {f"{ablation}/{arm}" for ablation, (_, _, arms) in script.ABLATIONS.items() for arm in arms}
    assert set(result["runs"]) == set(script.ARMS) == ablations | {"overlong_pm1/off", "overlong_pm1/on"}
    for name, (record,) in result["runs"].items():
        metrics = record["metrics"]
        assert record["config"]["max_steps"] == 2 and len(metrics["reward"]) == 2
        assert all(0.0 <= f <= 1.0 for f in metrics["completions/clipped_ratio"])
        assert all(math.isfinite(x) and x >= 0 for x in metrics["entropy"])
        assert all(None not in values for values in metrics.values())
    dynamic = result["runs"]["dynamic/on"][0]["metrics"]
    prompts = script.COMMON["per_device_train_batch_size"] // script.COMMON["num_generations"]
    rounds = script.ARMS["dynamic/on"].overrides["max_num_gen_batches"]
    for groups, used in zip(dynamic["dynamic_sampling/groups"], dynamic["dynamic_sampling/rounds"]):
        assert 1 <= used <= rounds and (groups == prompts or used == rounds)  # full batch unless out of rounds
    assert "dynamic_sampling/rounds" not in result["runs"]["dynamic/off"][0]["metrics"]
    # the +-1 arms are the overlong arms with incorrect_reward = -1
    for arm in ("off", "on"):
        assert result["runs"][f"overlong_pm1/{arm}"][0]["config"] == result["runs"][f"overlong/{arm}"][0]["config"]
        assert script.ARMS[f"overlong_pm1/{arm}"].task_kwargs == {"incorrect_reward": -1.0}
    assert min(result["runs"]["overlong/off"][0]["metrics"]["reward"]) >= 0  # unshaped 0/1 rewards
    assert min(result["runs"]["overlong_pm1/off"][0]["metrics"]["reward"]) < 0  # unshaped +-1 rewards
    # the arms differ only where the ablation says: the clip arms in epsilon_high
    configs = {name: result["runs"][name][0]["config"] for name in ("clip/symmetric", "clip/clip_higher")}
    assert {k for k in configs["clip/symmetric"] if configs["clip/symmetric"][k] != configs["clip/clip_higher"][k]} \
        == {"epsilon_high"}


def test_dapo_stored_results_match_the_script():
    """The stored ablations have >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("dapo_ablations")
    stored = load_stored("dapo_ablations")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON
    assert stored["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    for name, arm in script.ARMS.items():
        runs = stored["runs"][name]
        assert [run["seed"] for run in runs] == stored["seeds"]
        for run in runs:
            assert set(run["metrics"]) <= set(script.LOGGED) and "entropy" in run["metrics"]
            assert all(len(values) == arm.overrides["max_steps"] for values in run["metrics"].values())
