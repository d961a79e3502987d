"""The two benchmarks run end to end at tiny settings and store what they measured, so they cannot rot silently.

These are not timings (nothing here asserts a speed): they check that each script runs, prints its table and
writes a result file with the machine's load recorded, and that a result taken under load is refused unless the
caller accepts it. The real numbers come from running the scripts on an idle machine (bench/results/).
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def load_bench(name):
    sys.path.insert(0, str(BENCH))  # the scripts import bench/benchlib.py as their neighbour
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_rollout_bench_runs_and_stores_its_table(tmp_path, capsys):
    out = tmp_path / "rollout.json"
    load_bench("rollout_bench").main(["--sizes", "tiny", "--scenarios", "random", "trained", "--num-prompts", "2",
                                      "--num-generations", "2", "--max-new-tokens", "4", "--repeats", "1",
                                      "--threads", "1", "--out", str(out), "--store-under-load"])
    assert "speed-up" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert {"load_average_1min_before", "load_average_1min_after", "cores", "threads", "under_load"} <= set(
        result["machine"])
    scenarios = [row["scenario"] for row in result["rows"]]
    assert scenarios[0] == "random" and "trained" in scenarios
    for row in result["rows"]:
        assert row["ours"] > 0 and row["generate"] > 0
        assert row["speedup"] == pytest.approx(row["ours"] / row["generate"])


def test_grpo_bench_runs_both_trainers_and_stores_the_phases(tmp_path, capsys):
    pytest.importorskip("trl")
    load_bench("grpo_bench").main(["speed", "--models", "arithmetic", "--steps", "1", "--warmup", "0",
                                   "--num-prompts", "2", "--num-generations", "2", "--max-completion-length", "4",
                                   "--results-dir", str(tmp_path), "--store-under-load"])
    assert "speed-up (TRL / ours)" in capsys.readouterr().out
    result = json.loads((tmp_path / "grpo_speed.json").read_text())
    assert result["machine"]["threads"] == 1 and "trl" in result["machine"]
    for who in ("ours", "trl"):
        phases = result["speed"]["arithmetic"][who]
        assert set(phases) >= {"time_step", "time_generate", "time_score", "time_update"}
        assert phases["time_step"] > 0
    assert result["speed"]["arithmetic"]["ours"]["update_gflops_per_s"] > 0
    assert result["matmul_peak"]["gflops"] > 0 and result["matmul_peak"]["threads"] == 1


def test_a_result_taken_under_load_is_refused(tmp_path, monkeypatch):
    benchlib = load_bench("benchlib")
    facts = benchlib.machine(1)
    monkeypatch.setattr(benchlib.os, "getloadavg", lambda: (facts["cores"] + 1.0, 0.0, 0.0))
    with pytest.raises(benchlib.LoadError, match="rerun on an idle machine"):
        benchlib.store({"machine": dict(facts)}, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
    benchlib.store({"machine": dict(facts)}, tmp_path / "r.json", store_under_load=True)
    assert json.loads((tmp_path / "r.json").read_text())["machine"]["under_load"] is True
