"""rlbook.organisms, experiments/organisms.py and experiments/phenomena.py: the gate and the paired difference
against scipy on hand-made results, a reduced run of each organism, and the stored results (made with the
organisms' current settings, at least 5 paired seeds) against experiments/results/phenomena.json entry by entry."""

import json

import numpy as np
import pytest
from experiment_scripts import EXPERIMENTS, load_script, load_stored
from scipy import stats

from rlbook.experiment import Arm
from rlbook.organisms import ORGANISMS, Organism, get_organism, phenomenon
from rlbook.stats import baseline_change, gate_holds, metric_at_budget

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fake_result(start, base_end, fix_end, metric="entropy", failure="down"):
    """An organism experiment's stored layout with one held-out value per seed at the start and the end."""
    def runs(end):
        return [{"seed": s, "evals": [{"step": 0, metric: a}, {"step": 9, metric: b}]}
                for s, (a, b) in enumerate(zip(start, end))]
    return {"experiment": "organism_fake", "organism": {"name": "fake", "metric": metric, "failure": failure},
            "arms": {"base": {}, "fix": {}}, "runs": {"base": runs(base_end), "fix": runs(fix_end)}}


def t_interval(values):
    values = np.asarray(values, dtype=float)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    return values.mean(), low, high


def test_phenomenon_by_hand():
    start, base_end, fix_end = [2.5, 2.5, 2.5, 2.5], [1.0, 1.4, 0.8, 1.2], [1.5, 1.3, 1.6, 2.0]
    entry = phenomenon(fake_result(start, base_end, fix_end), chapter="dapo", phenomenon="collapse", fix="fix",
                       script="x.py")
    assert entry["baseline"] == "base" and entry["direction"] == "up" and entry["seeds"] == 4
    np.testing.assert_allclose(entry["baseline_change"], t_interval(np.subtract(base_end, start)), atol=1e-6)
    np.testing.assert_allclose(entry["fix_minus_baseline"], t_interval(np.subtract(fix_end, base_end)), atol=1e-6)
    assert entry["gate_holds"] is True  # the entropy fell, its interval below 0


def test_gate_fails_when_the_interval_straddles_zero_or_points_the_other_way():
    assert not gate_holds((-0.1, -0.3, 0.1), "down") and not gate_holds((0.5, 0.2, 0.8), "down")
    assert gate_holds((0.5, 0.2, 0.8), "up") and not gate_holds((0.5, -0.2, 1.2), "up")
    entry = phenomenon(fake_result([1.0] * 3, [1.1, 0.9, 1.05], [1.0] * 3), chapter="c", phenomenon="p",
                       fix="fix", script="x.py")
    assert entry["gate_holds"] is False
    # another metric than the organism's: its failure is against the direction given
    result = fake_result([20.0] * 3, [22.0, 23.0, 24.0], [19.0] * 3, metric="mean_length_wrong", failure="down")
    entry = phenomenon(result, chapter="c", phenomenon="p", fix="fix", metric="mean_length_wrong", direction="down",
                       script="x.py")
    assert entry["gate_holds"] is True and entry["fix_minus_baseline"][0] == pytest.approx(-4.0)


def test_a_fix_judged_as_a_change_a_control_beside_it_and_more_metrics():
    """DPO's shape (the fix judged on the growth the gate measures, the gold beside it) and GMPO's (a control arm
    that isolates part of the fix: the entry carries control - baseline and fix - control)."""
    start, base_end, fix_end = [1.0, 2.0, 3.0], [4.0, 5.5, 6.0], [1.2, 2.1, 3.3]
    result = fake_result(start, base_end, fix_end, metric="margin", failure="up")
    for arm, golds in (("base", (0.1, 0.2, 0.15)), ("fix", (0.3, 0.25, 0.35))):
        for run, gold in zip(result["runs"][arm], golds):
            run["evals"][-1]["expected_accuracy"], run["evals"][0]["expected_accuracy"] = gold, 0.5
    entry = phenomenon(result, chapter="dpo", phenomenon="p", fix="fix", compared_at="change",
                       beside=("expected_accuracy",), script="x.py")
    growth = {a: np.subtract(e, start) for a, e in (("base", base_end), ("fix", fix_end))}
    np.testing.assert_allclose(entry["fix_minus_baseline"], t_interval(growth["fix"] - growth["base"]), atol=1e-6)
    np.testing.assert_allclose(entry["beside"]["expected_accuracy"],
                               t_interval(np.subtract((0.3, 0.25, 0.35), (0.1, 0.2, 0.15))), atol=1e-6)
    assert entry["direction"] == "down" and entry["compared_at"] == "change" and "control" not in entry
    # a control: three arms on the same seeds
    result = fake_result([0.5] * 3, [0.0, 0.02, 0.01], [0.45, 0.5, 0.42], metric="expected_accuracy")
    result["arms"]["wide"] = {}
    result["runs"]["wide"] = [{"seed": s, "evals": [{"step": 0, "expected_accuracy": 0.5},
                                                    {"step": 9, "expected_accuracy": a}]}
                              for s, a in enumerate((0.4, 0.43, 0.38))]
    entry = phenomenon(result, chapter="gmpo", phenomenon="p", fix="fix", control="wide", script="x.py")
    np.testing.assert_allclose(entry["control_minus_baseline"],
                               t_interval(np.subtract((0.4, 0.43, 0.38), (0.0, 0.02, 0.01))), atol=1e-6)
    np.testing.assert_allclose(entry["fix_minus_control"],
                               t_interval(np.subtract((0.45, 0.5, 0.42), (0.4, 0.43, 0.38))), atol=1e-6)
    result["runs"]["wide"] = result["runs"]["wide"][:2]  # not on the same seeds: refused
    with pytest.raises(ValueError, match="same seeds"):
        phenomenon(result, chapter="gmpo", phenomenon="p", fix="fix", control="wide", script="x.py")
    with pytest.raises(ValueError, match="no arm 'missing'"):
        phenomenon(result, chapter="gmpo", phenomenon="p", fix="fix", control="missing", script="x.py")


def test_a_level_gate_and_a_comparison_at_equal_completions():
    """zero_gradient's shape: the failure is a level (most groups without spread) and the fix, which samples more
    per step, is read off its curve at the completions the baseline sampled (linear interpolation)."""
    def runs(levels, accuracies, per_step):
        return [{"seed": s, "evals": [{"step": t, "num_completions": per_step * t, "frac_reward_zero_std": f,
                                       "expected_accuracy": a} for t, f, a in zip((0, 10, 20), fs, accs)]}
                for s, (fs, accs) in enumerate(zip(levels, accuracies))]
    base = runs([(0.8, 0.7, 0.75), (0.8, 0.8, 0.7), (0.8, 0.75, 0.8)],
                [(0.9, 0.9, 0.88), (0.9, 0.89, 0.9), (0.9, 0.9, 0.91)], per_step=64)
    fix = runs([(0.8, 0.8, 0.9)] * 3, [(0.9, 0.94, 0.95), (0.9, 0.92, 0.97), (0.9, 0.93, 0.93)], per_step=256)
    result = {"experiment": "organism_fake", "arms": {"base": {}, "fix": {}}, "runs": {"base": base, "fix": fix},
              "organism": {"name": "fake", "metric": "frac_reward_zero_std", "failure": "up",
                           "failure_threshold": 0.5}}
    entry = phenomenon(result, chapter="dapo", phenomenon="p", fix="fix", fix_metric="expected_accuracy",
                       fix_direction="up", compared_at="num_completions", script="x.py")
    levels = [np.mean(x) for x in [(0.8, 0.7, 0.75), (0.8, 0.8, 0.7), (0.8, 0.75, 0.8)]]
    np.testing.assert_allclose(entry["baseline_level"], t_interval(levels), atol=1e-6)
    assert entry["gate_holds"] is True and entry["failure_threshold"] == 0.5 and entry["direction"] == "down"
    # the baseline sampled 64 * 20 = 1280 completions; the fix had sampled 256 * 5 = 1280 halfway to its step 10
    at_budget = [0.9 + (a - 0.9) / 2 for a in (0.94, 0.92, 0.93)]
    np.testing.assert_allclose(entry["fix_minus_baseline"],
                               t_interval(np.subtract(at_budget, (0.88, 0.9, 0.91))), atol=1e-6)
    assert gate_holds(entry["baseline_level"], "up", threshold=0.8) is False
    result["organism"]["failure_threshold"] = 0.9  # the level does not reach the threshold: the gate fails
    assert phenomenon(result, chapter="dapo", phenomenon="p", fix="fix", script="x.py")["gate_holds"] is False
    base[0]["evals"][-1]["num_completions"] = 10**6  # the fix never sampled that many
    with pytest.raises(ValueError, match="less than"):
        phenomenon(result, chapter="dapo", phenomenon="p", fix="fix", compared_at="num_completions", script="x.py")
    with pytest.raises(ValueError, match="compared_at must be one of"):
        phenomenon(result, chapter="dapo", phenomenon="p", fix="fix", compared_at="wall_time", script="x.py")


def test_metric_at_budget_reads_any_recorded_cost():
    """The head-to-head's reading: a metric at equal seconds (or samples), interpolated per seed along that axis."""
    runs = [{"seed": s, "evals": [{"seconds": t, "samples": 64 * k, "expected_accuracy": a}
                                  for k, (t, a) in enumerate(zip(times, accs))]}
            for s, (times, accs) in enumerate([((0.0, 2.0, 4.0), (0.5, 0.6, 0.8)), ((0.0, 1.0, 3.0), (0.5, 0.7, 0.9))])]
    np.testing.assert_allclose(metric_at_budget(runs, "expected_accuracy", 2.0, axis="seconds"), [0.6, 0.8])
    np.testing.assert_allclose(metric_at_budget(runs, "expected_accuracy", [96, 32], axis="samples"), [0.7, 0.6])
    with pytest.raises(ValueError, match="less than the 3.5"):
        metric_at_budget(runs, "expected_accuracy", 3.5, axis="seconds")
    with pytest.raises(ValueError, match="'cpu_seconds' is missing"):
        metric_at_budget(runs, "expected_accuracy", 1.0, axis="cpu_seconds")


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="failure must be one of"):
        Organism("x", "d", "arithmetic", {}, {}, {"a": Arm("grpo")}, failure="sideways")
    with pytest.raises(ValueError, match="at least one arm"):
        Organism("x", "d", "arithmetic", {}, {})
    with pytest.raises(ValueError, match="unknown organism"):
        get_organism("fruit_fly")
    with pytest.raises(ValueError, match="has no arm"):
        ORGANISMS["length_inflation"].arm("ppo")
    result = fake_result([1.0, 1.0], [0.5, 0.4], [0.9, 0.8])
    with pytest.raises(ValueError, match="no arm 'nope'"):
        phenomenon(result, chapter="c", phenomenon="p", fix="nope", script="x.py")
    result["runs"]["fix"][1]["evals"][-1]["entropy"] = float("nan")
    with pytest.raises(ValueError, match="missing or NaN"):
        phenomenon(result, chapter="c", phenomenon="p", fix="fix", script="x.py")
    result["runs"]["fix"] = result["runs"]["fix"][:1]
    with pytest.raises(ValueError, match="same seeds"):
        phenomenon(result, chapter="c", phenomenon="p", fix="fix", script="x.py")
    with pytest.raises(ValueError, match="no held-out evaluations"):
        baseline_change([{"seed": 0}], "entropy")


def test_an_organism_arm_carries_the_task_setting():
    spec = ORGANISMS["length_inflation"]
    assert spec.baseline == "grpo"
    assert all(spec.arm(name).task_kwargs["incorrect_reward"] == -1.0 for name in spec.arms)
    assert spec.arm("gfpo").overrides["num_generations"] == 16


@pytest.mark.parametrize("name", sorted(ORGANISMS))
def test_organism_reduced_run(name):
    script = load_script("organisms")
    spec = ORGANISMS[name]
    arms = list(spec.arms)[:2]
    result = script.run(name, arms, seeds=(0,), processes=1, max_steps=2, per_device_train_batch_size=32,
                        evaluation={"num_prompts": 4, "num_samples": 2, "every": 0})
    assert result["organism"]["name"] == name and list(result["runs"]) == arms
    for arm in arms:
        (run,) = result["runs"][arm]
        assert [e["step"] for e in run["evals"]] == [0, 2]
        assert run["evals"][0]["num_completions"] == 0  # the completions sampled for training so far
        assert run["evals"][-1]["num_completions"] == sum(run["metrics"]["num_completions"]) > 0
        assert run["config"]["max_steps"] == 2 and len(run["metrics"]["entropy"]) == 2
        assert 0.0 <= run["evals"][-1]["expected_accuracy"] <= 1.0 and run["evals"][-1][spec.metric] >= 0.0
    # the same start for every arm: the same base policy, prompts and sampling stream (NaN, e.g. the length of the
    # wrong answers where every answer was right, compared as equal)
    first = [json.dumps(result["runs"][arm][0]["evals"][0], sort_keys=True) for arm in arms[:2]]
    assert first[0] == first[1]


@pytest.mark.parametrize("name", sorted(ORGANISMS))
def test_stored_organism_results_match_the_organism(name):
    """The confirmatory results match the organism as it is now; until an organism's confirmatory run is made, its
    earlier exploratory results (in results/exploratory) must match it but for the settings added since (the
    held-out evaluations ``eval_at``, and arms the plan added)."""
    spec = ORGANISMS[name]
    confirmatory = (EXPERIMENTS / "results" / f"organism_{name}.json").exists()
    stored = load_stored(f"organism_{name}" if confirmatory else f"exploratory/organism_{name}")
    now = json.loads(json.dumps(spec.to_json()))
    if confirmatory:
        assert stored["organism"] == now
        evaluated = sorted(set(range(0, spec.settings["max_steps"] + 1, spec.eval_every)) | set(spec.eval_at))
    else:
        assert stored["provenance"].get("plan") is None, "an exploratory file records no plan"
        assert {k: v for k, v in stored["organism"].items() if k not in ("eval_at", "arms")} == {
            k: v for k, v in now.items() if k not in ("eval_at", "arms")}
        assert stored["organism"]["arms"].items() <= now["arms"].items()
        evaluated = sorted(set(range(0, spec.settings["max_steps"] + 1, spec.eval_every)) | set(
            stored["organism"].get("eval_at", ())))
    assert stored["common"] == spec.settings and stored["arms"].items() <= spec.to_json()["arms"].items()
    assert len(stored["seeds"]) >= 5
    for arm, runs in stored["runs"].items():
        assert [r["seed"] for r in runs] == stored["seeds"], arm
        for run in runs:
            assert [e["step"] for e in run["evals"]] == evaluated, arm


def test_phenomena_json_is_computed_from_the_stored_results():
    script = load_script("phenomena")
    stored = json.loads((EXPERIMENTS / "results" / "phenomena.json").read_text())
    computed, pending = script.entries(with_plans=False)
    assert [{k: v for k, v in e.items() if k != "plan"} for e in stored["entries"]] == computed
    assert stored["pending"] == pending
    for entry in pending:  # only an exploratory file may lack the fix's arm: a confirmatory run has every arm
        assert entry["results"].startswith("experiments/results/exploratory/"), entry
        assert (EXPERIMENTS.parent / entry["plan"]).is_file()
    keys = {"chapter", "phenomenon", "organism", "baseline", "fix", "metric", "direction", "seeds",
            "baseline_change", "fix_minus_baseline", "gate_holds", "script", "results", "plan",
            "failure_threshold", "baseline_level", "fix_metric", "fix_direction", "compared_at"}
    optional = {"control", "control_minus_baseline", "fix_minus_control", "beside"}
    for entry in stored["entries"]:
        assert keys <= set(entry) <= keys | optional and entry["direction"] in ("up", "down") and entry["seeds"] >= 5
        assert entry["fix_direction"] in ("up", "down") and entry["compared_at"] in ("step", "num_completions",
                                                                                    "change")
        assert (EXPERIMENTS.parent / entry["results"]).is_file(), entry["results"]
        assert (entry["failure_threshold"] is None) == (entry["baseline_level"] is None)
        assert any((EXPERIMENTS.parent / "book").glob(f"*/{entry['chapter']}.md")), entry["chapter"]
        mean, low, high = entry["baseline_change"]
        assert low <= mean <= high


def test_the_plan_status_in_phenomena_json_is_what_check_plans_finds_now():
    """Every row read from a confirmatory results file was run under a plan that verifies (the family table's "plan"
    column); a row read from an exploratory file (its confirmatory run not made yet) records no plan, and its
    organism's plan is registered. The stored status is the check's, recomputed here (skipped in a shallow clone,
    which lacks the history)."""
    from rlbook.plans import git, verify

    if git(EXPERIMENTS.parent, "rev-parse", "--is-shallow-repository", check=False) == "true":
        pytest.skip("a shallow clone: the plans' history cannot be checked (git fetch --unshallow)")
    stored = json.loads((EXPERIMENTS / "results" / "phenomena.json").read_text())
    for entry in stored["entries"]:
        verdict = verify(EXPERIMENTS.parent / entry["results"])
        assert entry["plan"]["status"] == verdict.status, verdict.line()
        if entry["results"].startswith("experiments/results/exploratory/"):
            assert verdict.status == "no plan" and entry["plan"]["path"] is None, verdict.line()
            assert (EXPERIMENTS / "plans" / f"{entry['organism']}.md").is_file(), entry["organism"]
        else:
            assert verdict.status == "verified", verdict.line()
            assert (EXPERIMENTS / "plans").joinpath(entry["plan"]["path"].removeprefix("experiments/plans/")).is_file()


def test_critic_explained_variance_is_nan_where_no_answer_was_right_and_empty_without_pretraining():
    from rlbook.organisms import critic_explained_variance

    runs = [{"metrics": {"explained_variance": [0.1, 0.2, 0.3], "accuracy": [0.5, 0.0, 0.25]},
             "value_pretrain": {"explained_variance": [0.0, 0.05]}},
            {"metrics": {"explained_variance": [0.4, 0.5, 0.6], "accuracy": [0.0, 0.5, 0.5]},
             "value_pretrain": {"explained_variance": [0.01, 0.02]}}]
    pretrain, train = critic_explained_variance(runs)
    np.testing.assert_array_equal(pretrain, [[0.0, 0.05], [0.01, 0.02]])
    np.testing.assert_array_equal(train, [[0.1, np.nan, 0.3], [np.nan, 0.5, 0.6]])
    for run in runs:
        del run["value_pretrain"]
    pretrain, train = critic_explained_variance(runs)
    assert pretrain.shape == (2, 0) and train.shape == (2, 3)
