"""Check every stored results file against git: was its plan committed before the run? (`make check-plans`)

For each ``experiments/results/**/*.json`` with a plan record (a confirmatory run, :mod:`rlbook.plans`), verify
that the plan's bytes at the recorded commit hash to the recorded SHA-256, that the commit is the last to change
the plan before the run's commit and an ancestor of HEAD, that it was committed before the run started, that the
run's tree was clean, and that the plan at HEAD begins with the recorded bytes (amendments appended). One line per
file: verified, not verifiable (and why), no plan (a pilot or exploratory run), or skipped (a shallow clone).

Exits 1 when a file with a plan record is not verifiable, or when a results file that the family table presents
as confirmatory (``experiments/results/phenomena.json``, outside ``exploratory/``) is not verified. A shallow clone
cannot show the history: every check is then skipped, said so, and the exit is 0.

    python scripts/check_plans.py [--root .]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlbook.plans import repository_root, verify


def confirmatory_files(root: Path) -> set[str]:
    """The results files the family table presents as confirmatory (each phenomena.json entry's ``results``, but for
    those in ``experiments/results/exploratory/``, which the table labels exploratory: their organisms' confirmatory
    runs are not made yet)."""
    table = root / "experiments" / "results" / "phenomena.json"
    if not table.exists():
        return set()
    return {e["results"] for e in json.loads(table.read_text())["entries"]
            if "results" in e and not e["results"].startswith("experiments/results/exploratory/")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="the repository (default: the one holding this script)")
    args = parser.parse_args(argv)
    root = (args.root or repository_root(Path(__file__))).resolve()
    results = sorted(p for p in (root / "experiments" / "results").rglob("*.json") if p.name != "phenomena.json")
    required = confirmatory_files(root)
    verdicts = {v.results: v for v in (verify(p, root) for p in results)}
    for verdict in verdicts.values():
        tag = " [confirmatory in the family table]" if verdict.results in required else ""
        print(verdict.line() + tag)
    failed = [v for v in verdicts.values() if v.status == "not verifiable"]
    missing = sorted(r for r in required if r not in verdicts or verdicts[r].status not in ("verified", "skipped"))
    for name in missing:
        print(f"the family table presents {name} as confirmatory, but it is not verified", file=sys.stderr)
    skipped = sum(v.status == "skipped" for v in verdicts.values())
    counts = {s: sum(v.status == s for v in verdicts.values()) for s in ("verified", "not verifiable", "no plan")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()) + (f", {skipped} skipped (shallow clone)" if skipped else ""))
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
