"""A test of the test suite: plant known bugs, one at a time, and check that the tests catch each of them.

Tolerant comparisons (tests/nbval_numbers.py, portable checkpoint checks) must not become blind ones. Each bug
below is a plausible slip that changes results by a little; for each, this script copies the package and the
tests into a temporary folder, plants the bug, runs the tests that should catch it, and expects them to FAIL.

    python scripts/check_planted_bugs.py            # all bugs (about 2 minutes on 2 cores)
    python scripts/check_planted_bugs.py sft_lr     # one of them

Run by `make test-planted-bugs`; exits non-zero if a planted bug goes unnoticed, or if a bug's code is no longer
where this script looks (then update the bug, not the tests).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PlantedBug:
    name: str
    what: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments that must fail with the bug in place


BUGS = [
    PlantedBug(
        "q_target_mean",
        "Q-learning target bootstraps from the mean of Q(s', .) instead of the max",
        "src/rlbook/tabular/td.py",
        "Q[s_next].max()",
        "Q[s_next].mean()",
        ("tests/test_tabular.py",),
    ),
    PlantedBug(
        "temperature_after_log_softmax",
        "log-probs divide by the temperature after the log-softmax instead of before it",
        "src/rlbook/rollout.py",
        "    logits = head(hidden).float() / temperature  # (n, V) float32\n"
        "    # gather - logsumexp gives the same number as log_softmax(...).gather(...) without a second\n"
        "    # (n, V) tensor.\n"
        "    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)\n",
        "    logits = head(hidden).float()\n"
        "    return (logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)) / temperature\n",
        ("tests/test_rollout.py",),
    ),
    PlantedBug(
        "sft_lr",
        "the SFT learning rate of every recipe 2% higher (3e-3 -> 3.06e-3)",
        "src/rlbook/sft.py",
        "lr: float = 3e-3",
        "lr: float = 3.06e-3",
        ("tests/test_sft.py",),
    ),
    PlantedBug(
        "gspo_sum_not_mean",
        "GSPO's sequence ratio from the sum of token log-ratios instead of their mean (no 1/|o_i|)",
        "src/rlbook/objectives.py",
        "    sequence = masked_sum(token, mask, dim=-1) / lengths  # log s_i, (B,)",
        "    sequence = masked_sum(token, mask, dim=-1)  # log s_i, (B,)",
        ("tests/test_objectives.py", "-k", "sequence or gspo"),
    ),
    PlantedBug(
        "gfpo_mean_over_all",
        "GFPO's baseline is the mean of the whole group instead of the kept completions' mean",
        "src/rlbook/objectives.py",
        "    mean = (groups * kept).sum(-1, keepdim=True) / count.clamp(min=1)",
        "    mean = groups.mean(-1, keepdim=True)",
        ("tests/test_objectives.py", "-k", "gfpo or keep"),
    ),
    PlantedBug(
        "plan_dirty_tree_allowed",
        "a confirmatory run starts although tracked files have uncommitted changes",
        "src/rlbook/plans.py",
        "    if dirty:\n        more =",
        "    if False:\n        more =",
        ("tests/test_plans.py",),
    ),
    PlantedBug(
        "plan_order_unchecked",
        "make check-plans accepts a plan committed after the run started",
        "src/rlbook/plans.py",
        "    if not committed < started:",
        "    if committed < 0:",
        ("tests/test_plans.py",),
    ),
    PlantedBug(
        "power_normal_approximation",
        "power from the normal distribution instead of the noncentral t (overstates it with few seeds)",
        "src/rlbook/evaluation.py",
        "    critical = stats.t.ppf(1 - alpha / 2, df)",
        "    critical, df = stats.norm.ppf(1 - alpha / 2), 10**9",
        ("tests/test_evaluation.py", "-k", "power or seeds or detectable"),
    ),
]


def run_tests(bug: PlantedBug, planted: bool) -> tuple[int, list[str], str]:
    """Run ``bug.tests`` on a copy of src/, tests/ and scripts/, with or without the bug: (exit code, failures, last line)."""
    source = (ROOT / bug.path).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for folder in ("src", "tests", "scripts"):
            shutil.copytree(ROOT / folder, tmp / folder, ignore=shutil.ignore_patterns("__pycache__"))
        if planted:
            (tmp / bug.path).write_text(source.replace(bug.old, bug.new))
        env = dict(os.environ, PYTHONPATH=str(tmp / "src"), PYTHONDONTWRITEBYTECODE="1")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", *bug.tests, "-q", "-p", "no:cacheprovider", "--no-header", "-rf"],
            cwd=tmp, env=env, capture_output=True, text=True,
        )
    failures = [line.split(" - ")[0] for line in result.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr.strip()[-200:]
    return result.returncode, failures, last


def plant_and_test(bug: PlantedBug) -> tuple[bool, str]:
    """(caught, summary): the tests pass as they are and fail with the bug planted."""
    if (ROOT / bug.path).read_text().count(bug.old) != 1:
        return False, f"the code to mutate was not found exactly once in {bug.path}: update this script"
    code, _, last = run_tests(bug, planted=False)
    if code != 0:
        return False, f"the tests fail even without the bug, so they prove nothing: {last}"
    code, failures, last = run_tests(bug, planted=True)
    summary = f"{len(failures)} failing: " + ", ".join(f.removeprefix("FAILED ") for f in failures[:3]) if failures else last
    return code == 1 and bool(failures), summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"default: all of {[b.name for b in BUGS]}")
    names = parser.parse_args(argv).names or [b.name for b in BUGS]
    unknown = set(names) - {b.name for b in BUGS}
    if unknown:
        parser.error(f"unknown planted bug(s) {sorted(unknown)}; choose from {[b.name for b in BUGS]}")
    missed = 0
    for bug in (b for b in BUGS if b.name in names):
        start = time.perf_counter()
        caught, summary = plant_and_test(bug)
        missed += not caught
        print(f"{'caught' if caught else 'MISSED'}  {bug.name}: {bug.what}  [{time.perf_counter() - start:.0f} s]")
        print(f"        {summary}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
