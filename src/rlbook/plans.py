"""Pre-registration that git can check: a plan file committed before its confirmatory run.

A plan is one Markdown file under ``experiments/plans/``: the claim, the metric, the criterion, the arms, the seeds,
the verdict rule and the analysis, in words, and one fenced ``json`` block, the *registration*, which the harness
reads::

    {"experiment": "organism_shifted_rewards", "results": "experiments/results/organism_shifted_rewards.json",
     "seeds": [100, 101, 102, 103, 104, 105, 106, 107], "arms": ["reinforce", "reinforce_baseline", "rloo"],
     "command": "python experiments/organisms.py shifted_rewards --plan experiments/plans/shifted_rewards.md"}

An amendment is a dated section appended at the end of the file; what was there is never edited (the check below
finds an edit). Two modes of :func:`rlbook.experiment.run_experiment`:

- **confirmatory** (``plan=``): :func:`confirm` refuses to start, with one line saying why, unless the plan file is
  committed and unchanged, no tracked file has uncommitted changes, no untracked Python file lies where code is
  imported from, the rlbook package runs from the plan's repository, and the experiment, seeds and arms are the
  plan's. The results record the plan (path, SHA-256 of its bytes, the last commit that changed it) and when the
  run started;
- **pilot** (no plan): :func:`check_pilot` refuses seeds that a plan reserves for the same experiment.

:func:`verify` checks a stored results file against git: the plan's bytes at the recorded commit hash to the
recorded SHA-256, that commit is the last one to touch the plan before the run's commit and an ancestor of HEAD,
it was committed before the run started, the run's tree was clean, and the plan at HEAD still begins with the
recorded bytes (amendments only appended). ``make check-plans`` runs it on every stored results file
(``scripts/check_plans.py``). Commit times are the committer's clock: the check shows the order git records, which
is what a reader can verify without trusting the author's headings.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

PLANS_DIR = "experiments/plans"
# where an untracked Python file could be imported by a run (src/rlbook, experiments/*.py)
CODE_DIRS = ("src", "experiments")
REGISTRATION_KEYS = {"experiment": str, "results": str, "seeds": list, "arms": list, "command": str}


class PlanError(RuntimeError):
    """A confirmatory run refused, a pilot on reserved seeds, or a malformed plan: the message says which."""


@dataclass(frozen=True)
class Plan:
    """A plan file's registration; ``path`` is relative to the repository ``root``."""

    root: Path
    path: str
    experiment: str
    results: str
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    command: str


# --- git ----------------------------------------------------------------------------------------------------------


def git(root: Path, *args: str, check: bool = True) -> str:
    """``git -C root args`` and its output, stripped; a failed command raises PlanError when ``check``, else gives
    ``""``."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise PlanError(f"git {' '.join(args)} could not run: {error}") from None
    if done.returncode != 0:
        if check:
            raise PlanError(f"git {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")
        return ""
    return done.stdout.strip()


def repository_root(path: Path) -> Path | None:
    """The root of the git work tree holding ``path`` (a file or a folder), or None outside one."""
    path = Path(path).resolve()
    folder = path if path.is_dir() else path.parent
    top = git(folder, "rev-parse", "--show-toplevel", check=False) if folder.exists() else ""
    return Path(top).resolve() if top else None


def package_dir() -> Path:
    """The folder of the imported rlbook package (tests point it into a temporary repository)."""
    return Path(__file__).resolve().parent


def package_root() -> Path | None:
    """The repository the imported rlbook package runs from (None for an installed copy)."""
    return repository_root(package_dir())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def utc_now() -> str:
    """Now in UTC, ISO 8601 with milliseconds (a run's ``started_at``)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


# --- plan files ---------------------------------------------------------------------------------------------------


def parse_registration(text: str, where: str) -> dict:
    """The registration of a plan's text: its first fenced ``json`` block, with every key of
    :data:`REGISTRATION_KEYS`; PlanError naming ``where`` otherwise."""
    match = re.search(r"^```json[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)
    if match is None:
        raise PlanError(f"{where}: no registration (a fenced ```json block)")
    try:
        registration = json.loads(match[1])
    except json.JSONDecodeError as error:
        raise PlanError(f"{where}: the registration is not valid JSON: {error}") from None
    if not isinstance(registration, dict):
        raise PlanError(f"{where}: the registration must be a JSON object")
    for key, kind in REGISTRATION_KEYS.items():
        if not isinstance(registration.get(key), kind):
            raise PlanError(f"{where}: the registration needs {key!r} ({kind.__name__}), got "
                            f"{registration.get(key)!r}")
    seeds = registration["seeds"]
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) or len(set(seeds)) != len(seeds):
        raise PlanError(f"{where}: 'seeds' must be distinct integers, got {seeds!r}")
    if not registration["arms"] or not all(isinstance(a, str) for a in registration["arms"]):
        raise PlanError(f"{where}: 'arms' must be a non-empty list of arm names, got {registration['arms']!r}")
    return registration


def read_plan(path: str | Path) -> Plan:
    """The plan file at ``path`` (absolute, or relative to the current folder) and its registration."""
    path = Path(path).resolve()
    if not path.is_file():
        raise PlanError(f"plan file {path} does not exist")
    root = repository_root(path)
    if root is None:
        raise PlanError(f"plan file {path} is not inside a git repository: a plan must be committed")
    relative = path.relative_to(root).as_posix()
    registration = parse_registration(path.read_text(encoding="utf-8"), relative)
    return Plan(root=root, path=relative, experiment=registration["experiment"], results=registration["results"],
                seeds=tuple(registration["seeds"]), arms=tuple(registration["arms"]),
                command=registration["command"])


def all_plans(root: Path) -> list[Plan]:
    """Every plan under ``root/experiments/plans``."""
    folder = Path(root) / PLANS_DIR
    return [read_plan(p) for p in sorted(folder.glob("*.md"))] if folder.is_dir() else []


def reserved_seeds(experiment: str, root: Path | None = None) -> dict[int, str]:
    """``{seed: plan path}`` for every seed a plan reserves for ``experiment`` (default root: the package's
    repository; none outside one)."""
    root = package_root() if root is None else root
    if root is None:
        return {}
    return {seed: plan.path for plan in all_plans(root) if plan.experiment == experiment for seed in plan.seeds}


# --- the two modes --------------------------------------------------------------------------------------------------


def check_pilot(experiment: str, seeds, root: Path | None = None) -> None:
    """Refuse a run without a plan on seeds a plan reserves for the same experiment."""
    taken = reserved_seeds(experiment, root)
    clash = sorted(set(seeds) & set(taken))
    if clash:
        raise PlanError(f"seeds {clash} of {experiment!r} are reserved by {taken[clash[0]]} for its confirmatory "
                        f"run: a pilot uses other seeds (or pass the plan to run it as planned)")


def _uncommitted(root: Path) -> list[str]:
    """Tracked files with changes (staged or not), and untracked Python files under :data:`CODE_DIRS`."""
    changed = git(root, "diff", "--name-only", "HEAD").splitlines()  # staged or not, against the last commit
    untracked = git(root, "ls-files", "--others", "--exclude-standard", "--", *CODE_DIRS).splitlines()
    return changed + [f for f in untracked if f.endswith(".py")]


def confirm(plan_path: str | Path, *, experiment: str, seeds, arms, out: str | Path | None = None) -> dict:
    """Check that a confirmatory run of ``plan_path`` may start and return its record for the results'
    provenance: ``{"plan": {"path", "sha256", "commit"}, "started_at"}``. Raises PlanError, one line saying why,
    when the plan or the tree is not committed, the package is not the plan's repository's, or the run is not the
    one the plan registers (experiment, seeds, arms, results file)."""
    plan = read_plan(plan_path)
    root = plan.root
    code = package_root()
    if code != root:
        raise PlanError(f"the rlbook package runs from {package_dir()}, not from the plan's repository {root}: "
                        f"run with PYTHONPATH={root / 'src'}")
    if not git(root, "ls-files", "--", plan.path):
        raise PlanError(f"{plan.path} is not committed: commit the plan before its confirmatory run")
    dirty = _uncommitted(root)
    if plan.path in dirty:
        raise PlanError(f"{plan.path} has uncommitted changes: commit the plan (amendments appended) before the run")
    if dirty:
        more = f" and {len(dirty) - 3} more" if len(dirty) > 3 else ""
        raise PlanError(f"uncommitted changes in {', '.join(dirty[:3])}{more}: a confirmatory run starts from a "
                        f"committed tree")
    if experiment != plan.experiment:
        raise PlanError(f"{plan.path} registers experiment {plan.experiment!r}, not {experiment!r}")
    if list(seeds) != list(plan.seeds):
        raise PlanError(f"{plan.path} registers seeds {list(plan.seeds)}, this run has {list(seeds)}")
    extra = [a for a in arms if a not in plan.arms]
    if extra:
        raise PlanError(f"arms {extra} are not in {plan.path} (it registers {list(plan.arms)})")
    if out is not None and Path(out).resolve() != (root / plan.results).resolve():
        raise PlanError(f"{plan.path} registers its results at {plan.results}, this run writes {out}")
    data = (root / plan.path).read_bytes()
    return {"plan": {"path": plan.path, "sha256": sha256(data), "commit": git(root, "log", "-1", "--format=%H", "--",
                                                                                plan.path)},
            "started_at": utc_now()}


# --- the check anyone can run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What :func:`verify` found for one results file: ``status`` is "verified", "not verifiable", "skipped"
    (a shallow clone lacks the history) or "no plan" (a pilot, exploratory)."""

    results: str
    status: str
    reason: str

    def line(self) -> str:
        return f"{self.status:<15} {self.results}: {self.reason}"


def _timestamp(iso: str) -> float:
    moment = datetime.datetime.fromisoformat(iso)
    if moment.tzinfo is None:
        raise ValueError(f"started_at {iso!r} has no time zone")
    return moment.timestamp()


def verify(results_path: str | Path, root: Path | None = None) -> Verdict:
    """Check one results file's plan record against the git history of ``root`` (default: the repository holding
    the file). A file whose arms were run at different times (``merge``) keeps each run's provenance under
    ``earlier``; every one of them must verify."""
    results_path = Path(results_path).resolve()
    root = Path(root).resolve() if root is not None else repository_root(results_path)
    if root is None:
        return Verdict(str(results_path), "not verifiable", "not inside a git repository")
    name = results_path.relative_to(root).as_posix() if results_path.is_relative_to(root) else str(results_path)
    results = json.loads(results_path.read_text())
    if not isinstance(results, dict):  # e.g. the head-to-head's verdicts, a list computed from a verified run
        return Verdict(name, "no plan", "not a run's record (derived by code from one)")
    provenance = results.get("provenance") or {}
    if not provenance.get("plan"):
        return Verdict(name, "no plan", "no plan record: a pilot or an exploratory run")
    if git(root, "rev-parse", "--is-shallow-repository", check=False) == "true":
        return Verdict(name, "skipped", "a shallow clone lacks the history to check (git fetch --unshallow)")
    details = []
    while provenance:
        outcome = _verify_run(root, provenance, results)
        if not outcome.startswith("ok: "):
            return Verdict(name, "not verifiable", outcome)
        details.append(outcome[4:])
        provenance = provenance.get("earlier")
    path = results["provenance"]["plan"]["path"]
    now, recorded = _blob(root, "HEAD", path), _blob(root, results["provenance"]["plan"]["commit"], path)
    amended = " (amended since, by appending)" if now is not None and recorded is not None and len(now) > len(
        recorded) else ""
    return Verdict(name, "verified", "; ".join(details) + amended)


def _verify_run(root: Path, provenance: dict, results: dict) -> str:
    """"ok: <what was shown>" for one run's provenance, or the reason it cannot be verified."""
    record, started_at = provenance.get("plan"), provenance.get("started_at")
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("path", "sha256", "commit")):
        return f"malformed or missing plan record {record!r}"
    if not isinstance(started_at, str):
        return "no started_at in the provenance"
    try:
        started = _timestamp(started_at)
    except ValueError as error:
        return str(error)
    path, commit, run_commit = record["path"], record["commit"], provenance.get("git_commit")
    if provenance.get("git_dirty") is not False:
        return "the run's tree had uncommitted changes (git_dirty is not false)"
    for label, sha in (("plan", commit), ("run", run_commit)):
        if not isinstance(sha, str) or not git(root, "cat-file", "-t", f"{sha}^{{commit}}", check=False):
            return f"the {label} commit {sha} is not in this repository"
        if not _is_ancestor(root, sha, "HEAD"):
            return f"the {label} commit {sha[:10]} is not an ancestor of HEAD"
    if git(root, "log", "-1", "--format=%H", run_commit, "--", path) != commit:
        return f"{commit[:10]} is not the last commit to change {path} before the run's commit {run_commit[:10]}"
    data = _blob(root, commit, path)
    if data is None or sha256(data) != record["sha256"]:
        return f"{path} at {commit[:10]} does not hash to the recorded sha256"
    committed = int(git(root, "show", "-s", "--format=%ct", commit))
    if not committed < started:
        return f"{path} was committed at {_iso(committed)}, not before the run started ({started_at})"
    try:
        registration = parse_registration(data.decode("utf-8"), path)
    except PlanError as error:
        return str(error)
    if results.get("experiment") != registration["experiment"]:
        return f"the plan registers {registration['experiment']!r}, the results are {results.get('experiment')!r}"
    if results.get("seeds") != registration["seeds"]:
        return f"the plan registers seeds {registration['seeds']}, the results have {results.get('seeds')}"
    extra = sorted(set(results.get("runs", {})) - set(registration["arms"]))
    if extra:
        return f"arms {extra} are not in the plan"
    now = _blob(root, "HEAD", path)
    if now is None or not now.startswith(data):
        return f"{path} was edited after the run (an amendment must be appended, leaving the text before it)"
    return f"ok: {path} committed {_iso(committed)} as {commit[:10]}, before the run started ({started_at})"


def _is_ancestor(root: Path, older: str, newer: str) -> bool:
    try:
        subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", older, newer], check=True,
                       capture_output=True, timeout=60)
        return True
    except (subprocess.CalledProcessError, OSError, subprocess.SubprocessError):
        return False


def _blob(root: Path, commit: str, path: str) -> bytes | None:
    done = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{path}"], capture_output=True, timeout=60)
    return done.stdout if done.returncode == 0 else None


def _iso(timestamp: int) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")
