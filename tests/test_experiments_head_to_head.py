"""A reduced run of experiments/head_to_head (every algorithm, one organism, two steps): each arm runs, its
evaluations carry the costs the chapter reads (samples, training seconds, CPU seconds), the memory pass measures
what it says, and the stored results were made by the script's current settings."""

import importlib
import json
import math

import numpy as np
import pytest
from experiment_scripts import EXPERIMENTS, load_script, load_stored, record_keys

from rlbook.organisms import metric_at_budget

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    script = load_script("head_to_head")
    out = tmp_path_factory.mktemp("h2h") / "head_to_head.json"
    result = script.run(["short"], seeds=[0], out=out, processes=1, progress=False, max_steps=2,
                        evaluation={"num_prompts": 16, "num_samples": 4, "every": 1})
    return script, result, out


def test_every_algorithm_runs_and_records_its_costs(reduced):
    script, result, _ = reduced
    runs = result["organisms"]["short"]["runs"]
    assert list(runs) == list(script.ALGORITHMS)
    starts = {name: run["evals"][0]["expected_accuracy"] for name, (run,) in runs.items()}
    assert len(set(starts.values())) == 1, starts  # the same policy, prompts and sampling stream for every arm
    for name, (run,) in runs.items():
        evals = run["evals"]
        samples, seconds = [e["samples"] for e in evals], [e["seconds"] for e in evals]
        assert samples == sorted(samples) and seconds == sorted(seconds), name  # cumulative costs
        assert all(e["cpu_seconds"] >= 0 and math.isfinite(e["cpu_seconds"]) for e in evals), name
        assert all(0.0 <= e["expected_accuracy"] <= 1.0 for e in evals), name
        assert {"pass@4", "mean_length_wrong", "entropy", "kl_to_base"} <= set(evals[-1]), name
        assert evals[-1]["samples"] >= 2 * script.BATCH, name  # the budget the chapter reads every arm at


def test_equal_budgets(reduced):
    script, result, _ = reduced
    runs = result["organisms"]["short"]["runs"]
    batch = script.BATCH
    # every plain RL arm samples BATCH completions per step; GSPO in four minibatches, GFPO 16 per prompt
    for name in ("reinforce", "rloo", "ppo", "grpo", "gspo", "gfpo", "lambda_grpo"):
        assert [e["samples"] for e in runs[name][0]["evals"]] == [0, batch, 2 * batch], name
    # VAPO's value pretraining is charged in samples and seconds from its first evaluation on
    vapo = runs["vapo"][0]
    assert vapo["pretrain"]["samples"] == script.VALUE_PRETRAIN_STEPS * batch
    assert vapo["evals"][0]["samples"] == vapo["pretrain"]["samples"] and vapo["evals"][0]["seconds"] > 0
    assert vapo["config"]["lam_alpha"] == script.SETTINGS["short"]["vapo_alpha"]
    # DAPO's dynamic sampling draws at least as many; DPO samples whole rounds
    assert runs["dapo"][0]["evals"][-1]["samples"] >= 2 * batch
    round_samples = script.DPO_ROUND["prompts"] * script.DPO_ROUND["num_generations"]
    for name in ("dpo", "dpo_nll"):
        assert runs[name][0]["evals"][-1]["samples"] == round_samples, name
    assert runs["dpo"][0]["config"]["rpo_alpha"] is None and runs["dpo_nll"][0]["config"]["rpo_alpha"] == 1.0
    # every arm can be read at the equal-samples budget, which is what the chapter does
    for name, arm_runs in runs.items():
        value = metric_at_budget(arm_runs, "expected_accuracy", 2 * batch, axis="samples")
        assert np.isfinite(value).all(), name


def test_the_written_file_has_the_stored_layout(reduced):
    script, _, out = reduced
    written, stored = json.loads(out.read_text()), load_stored("head_to_head")
    assert set(written) <= set(stored)
    new, old = written["organisms"]["short"], stored["organisms"]["short"]
    assert list(new) == list(old)
    for name in old["runs"]:
        assert record_keys(new["runs"][name][0]) == record_keys(old["runs"][name][0]), name
        assert list(new["runs"][name][0]["evals"][-1]) == list(old["runs"][name][0]["evals"][-1]), name


def test_memory_pass_measures_the_models_held(monkeypatch):
    # the spawned workers import the script by name, as they do when it runs from experiments/
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    script = importlib.import_module("head_to_head")
    # each in a fresh process, as the script runs them (a long-lived process reuses memory it freed)
    rows = {row["algorithm"]: row for row in script.run_memory(["short"], ["grpo", "ppo_kl", "dr_grpo"],
                                                              processes=2, steps=1)}
    assert set(rows["grpo"]["models"]) == {"policy", "reference"}  # GRPO's KL 0.04 holds the start
    assert set(rows["ppo_kl"]["models"]) == {"policy", "reference", "value model"}
    assert set(rows["dr_grpo"]["models"]) == {"policy"}
    assert all(row["peak_added_mib"] > 0 for row in rows.values())


def test_stored_results_match_the_script():
    """Every organism of the stored file: >= 5 paired seeds per arm, in seed order, every arm of the script, its
    current settings; and a memory pass for every arm and organism."""
    script = load_script("head_to_head")
    stored = load_stored("head_to_head")
    assert list(stored["organisms"]) == list(script.SETTINGS) and stored["batch"] == script.BATCH
    for name, result in stored["organisms"].items():
        spec = script.SETTINGS[name]
        assert result["common"] == spec["settings"], name
        assert result["arms"] == {a: script.arm_for(a, name).to_json() if not isinstance(arm, dict) else arm
                                  for a, arm in script.ALGORITHMS.items()}, name
        assert len(result["seeds"]) >= 5 and result["eval_every"] == spec["eval_every"], name
        for arm, runs in result["runs"].items():
            assert [r["seed"] for r in runs] == result["seeds"], (name, arm)
    memory = {(row["organism"], row["algorithm"]) for row in stored["memory"]["rows"]}
    assert memory == {(o, a) for o in script.SETTINGS for a in script.ALGORITHMS}
