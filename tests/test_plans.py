"""rlbook.plans and the harness's confirmatory mode: the refusals (dirty tree, uncommitted plan, reserved seeds, a run
that is not the plan's), the plan record a run stores, and scripts/check_plans.py's verdicts, in a temporary git
repository; then every stored results file of this repository that carries a plan record."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlbook.plans as plans
from rlbook.experiment import run_experiment
from rlbook.plans import PlanError, check_pilot, confirm, read_plan, verify

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_plans  # noqa: E402

REGISTRATION = {"experiment": "demo", "results": "experiments/results/demo.json", "seeds": [100, 101],
                "arms": ["a", "b"], "command": "python experiments/demo.py --plan experiments/plans/demo.md"}


def plan_text(registration=REGISTRATION, claim="arm b beats arm a"):
    return (f"# Plan: demo\n\nClaim: {claim}.\n\n## Registration\n\n```json\n{json.dumps(registration)}\n```\n\n"
            "## Verdict rule\n\nb - a, 95 % t-interval above 0.\n")


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo, message="commit", when=None):
    git(repo, "add", "-A")
    env = {**os.environ, **({"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when} if when else {})}
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", message], check=True, capture_output=True, env=env)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with a package folder (the imported rlbook is pointed there), a plan and a results
    folder, all committed."""
    repo = tmp_path / "repo"
    (repo / "src" / "rlbook").mkdir(parents=True)
    (repo / "src" / "rlbook" / "__init__.py").write_text("x = 1\n")
    (repo / "experiments" / "plans").mkdir(parents=True)
    (repo / "experiments" / "results").mkdir()
    (repo / "experiments" / "plans" / "demo.md").write_text(plan_text())
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.org")
    git(repo, "config", "user.name", "t")
    commit_all(repo, "plan", when="2026-01-01T00:00:00+00:00")
    monkeypatch.setattr(plans, "package_dir", lambda: repo / "src" / "rlbook")
    return repo


def run_one(arm_name, arm, seed):
    return {"value": seed + (1.0 if arm_name == "b" else 0.0)}


def demo_run(repo, arms=("a", "b"), seeds=(100, 101), plan="experiments/plans/demo.md", **kwargs):
    kwargs.setdefault("out", repo / "experiments" / "results" / "demo.json")
    return run_experiment("demo", run_one, {a: {} for a in arms}, seeds, processes=1, progress=False,
                          plan=None if plan is None else repo / plan, **kwargs)


def test_a_confirmatory_run_records_its_plan_and_verifies(repo):
    result = demo_run(repo)
    record = result["provenance"]
    data = (repo / "experiments" / "plans" / "demo.md").read_bytes()
    assert record["plan"] == {"path": "experiments/plans/demo.md", "sha256": plans.sha256(data),
                              "commit": git(repo, "rev-parse", "HEAD")}
    assert record["git_dirty"] is False and record["git_commit"] == git(repo, "rev-parse", "HEAD")
    assert record["started_at"].endswith("+00:00")
    assert all("cpu_seconds" in r for runs in result["runs"].values() for r in runs)
    # no absolute path of the repository in the stored file
    assert str(repo) not in (repo / "experiments" / "results" / "demo.json").read_text()
    commit_all(repo, "results")
    verdict = verify(repo / "experiments" / "results" / "demo.json")
    assert verdict.status == "verified", verdict.line()
    # an amendment appended keeps it verified, and says so
    with open(repo / "experiments" / "plans" / "demo.md", "a") as f:
        f.write("\n## Amendment, 2026-01-02\n\nAlso report c.\n")
    commit_all(repo, "amend")
    verdict = verify(repo / "experiments" / "results" / "demo.json")
    assert verdict.status == "verified" and "amended since" in verdict.reason
    # an edit of what was there is found
    path = repo / "experiments" / "plans" / "demo.md"
    path.write_text(path.read_text().replace("beats", "ties"))
    commit_all(repo, "edit")
    verdict = verify(repo / "experiments" / "results" / "demo.json")
    assert verdict.status == "not verifiable" and "edited after the run" in verdict.reason


def test_the_refusals_name_the_problem(repo):
    plan = repo / "experiments" / "plans" / "demo.md"
    kwargs = dict(experiment="demo", seeds=[100, 101], arms=["a", "b"])
    confirm(plan, **kwargs)  # clean: allowed
    cases = [(dict(seeds=[100, 102]), "registers seeds"), (dict(experiment="other"), "registers experiment"),
             (dict(arms=["a", "c"]), r"arms \['c'\] are not in"),
             (dict(out=repo / "elsewhere.json"), "registers its results at")]
    for change, message in cases:
        with pytest.raises(PlanError, match=message):
            confirm(plan, **{**kwargs, **change})
    (repo / "src" / "rlbook" / "__init__.py").write_text("x = 2\n")  # a tracked file changed
    with pytest.raises(PlanError, match=r"uncommitted changes in src/rlbook/__init__.py"):
        demo_run(repo)
    git(repo, "checkout", "--", "src/rlbook/__init__.py")
    (repo / "src" / "rlbook" / "new.py").write_text("y = 1\n")  # untracked code a run could import
    with pytest.raises(PlanError, match="src/rlbook/new.py"):
        confirm(plan, **kwargs)
    (repo / "src" / "rlbook" / "new.py").unlink()
    plan.write_text(plan_text(claim="changed after the commit"))  # the plan itself changed
    with pytest.raises(PlanError, match="demo.md has uncommitted changes"):
        confirm(plan, **kwargs)
    git(repo, "checkout", "--", "experiments/plans/demo.md")
    fresh = repo / "experiments" / "plans" / "fresh.md"  # a plan never committed
    fresh.write_text(plan_text({**REGISTRATION, "experiment": "fresh"}))
    with pytest.raises(PlanError, match="fresh.md is not committed"):
        confirm(fresh, **{**kwargs, "experiment": "fresh"})
    git(repo, "add", "experiments/plans/fresh.md")  # staged, still not committed
    with pytest.raises(PlanError, match="fresh.md has uncommitted changes"):
        confirm(fresh, **{**kwargs, "experiment": "fresh"})
    with pytest.raises(PlanError, match="no registration"):
        plans.parse_registration("# a plan without its json block\n", "x.md")
    with pytest.raises(PlanError, match="'seeds' must be distinct integers"):
        plans.parse_registration(plan_text({**REGISTRATION, "seeds": [1, 1]}), "x.md")


def test_the_package_must_run_from_the_plans_repository(repo, tmp_path, monkeypatch):
    monkeypatch.setattr(plans, "package_dir", lambda: tmp_path)  # not a repository
    with pytest.raises(PlanError, match="not from the plan's repository"):
        confirm(repo / "experiments" / "plans" / "demo.md", experiment="demo", seeds=[100, 101], arms=["a"])


def test_a_pilot_may_not_use_reserved_seeds(repo):
    with pytest.raises(PlanError, match=r"seeds \[101\] of 'demo' are reserved by experiments/plans/demo.md"):
        demo_run(repo, seeds=(0, 101), plan=None)
    with pytest.raises(PlanError, match="reserved"):
        check_pilot("demo", [100], root=repo)
    check_pilot("demo", [0, 1], root=repo)  # other seeds: a pilot
    check_pilot("other", [100], root=repo)  # another experiment's seeds are its own
    result = demo_run(repo, seeds=(0, 1), plan=None, out=None)
    assert "plan" not in result["provenance"] and result["provenance"]["started_at"]


def test_check_plans_finds_a_plan_committed_after_the_run_began_and_a_dirty_run(repo):
    demo_run(repo)
    out = repo / "experiments" / "results" / "demo.json"
    commit_all(repo, "results")
    stored = json.loads(out.read_text())
    early = dict(stored, provenance={**stored["provenance"], "started_at": "2025-12-31T23:59:00.000+00:00"})
    out.write_text(json.dumps(early))
    verdict = verify(out)
    assert verdict.status == "not verifiable" and "not before the run started" in verdict.reason
    dirty = dict(stored, provenance={**stored["provenance"], "git_dirty": True})
    out.write_text(json.dumps(dirty))
    assert "uncommitted changes" in verify(out).reason
    other = dict(stored, seeds=[100, 102])
    out.write_text(json.dumps(other))
    assert "registers seeds" in verify(out).reason
    forged = dict(stored, provenance={**stored["provenance"], "plan": {**stored["provenance"]["plan"],
                                                                       "sha256": "0" * 64}})
    out.write_text(json.dumps(forged))
    assert "does not hash" in verify(out).reason


def test_arms_added_later_under_the_plan_verify_and_a_pilot_cannot_be_merged_in(repo):
    demo_run(repo, arms=("a",))
    commit_all(repo, "arm a")
    with pytest.raises(ValueError, match="a confirmatory file takes only arms run under its plan"):
        run_experiment("demo", run_one, {"b": {}}, (0, 1), processes=1, progress=False, merge=True,
                       out=repo / "experiments" / "results" / "demo.json")
    demo_run(repo, arms=("b",), merge=True)
    commit_all(repo, "arm b")
    verdict = verify(repo / "experiments" / "results" / "demo.json")
    assert verdict.status == "verified" and verdict.reason.count("committed") == 2


def test_check_plans_script_lines_and_exit_code(repo, capsys):
    demo_run(repo)
    (repo / "experiments" / "results" / "pilot.json").write_text(json.dumps({"provenance": {}}))
    (repo / "experiments" / "results" / "derived.json").write_text(json.dumps([{"verdict": "supported"}]))
    table = {"entries": [{"results": "experiments/results/demo.json"}]}
    (repo / "experiments" / "results" / "phenomena.json").write_text(json.dumps(table))
    commit_all(repo, "results")
    assert check_plans.main(["--root", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "verified        experiments/results/demo.json" in out and "no plan         experiments/results/pilot.json" in out
    assert "no plan         experiments/results/derived.json: not a run's record" in out  # a list made from a run
    table["entries"].append({"results": "experiments/results/pilot.json"})  # presented as confirmatory: fails
    (repo / "experiments" / "results" / "phenomena.json").write_text(json.dumps(table))
    assert check_plans.main(["--root", str(repo)]) == 1
    assert "presents experiments/results/pilot.json as confirmatory" in capsys.readouterr().err


def test_a_shallow_clone_skips_the_history_and_says_so(repo, tmp_path):
    demo_run(repo)
    commit_all(repo, "results")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    verdict = verify(shallow / "experiments" / "results" / "demo.json")
    assert verdict.status == "skipped" and "shallow clone" in verdict.reason


def test_every_plan_in_this_repository_parses_and_reserves_distinct_seeds():
    found = plans.all_plans(ROOT)
    for plan in found:
        assert plan.path.startswith("experiments/plans/") and plan.results.startswith("experiments/results/")
        assert f"--plan {plan.path}" in plan.command, f"{plan.path}: its command must pass the plan"
    results = [p.results for p in found]
    assert len(results) == len(set(results)), "two plans register the same results file"


def test_every_stored_results_file_with_a_plan_record_verifies():
    """make check-plans over this repository (the history part skipped in a shallow clone)."""
    if plans.git(ROOT, "rev-parse", "--is-shallow-repository", check=False) == "true":
        pytest.skip("a shallow clone: the plans' history cannot be checked (git fetch --unshallow)")
    for path in sorted((ROOT / "experiments" / "results").rglob("*.json")):
        verdict = verify(path, ROOT)
        assert verdict.status in ("verified", "no plan"), verdict.line()
    assert check_plans.main(["--root", str(ROOT)]) == 0
