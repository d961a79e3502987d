"""Rerun stored organism runs and check that training still gives the stored metrics, value for value.

A refactor of the loss or the trainer must leave training unchanged. This script shows it the direct way: it reruns
runs stored in ``experiments/results/organism_<name>.json`` through ``experiments/organisms.py``'s ``run_one``, with
exactly the settings the stored run used (the file's ``common`` settings, the arm's stored settings and the
organism's stored held-out evaluation sizes, not whatever ``rlbook.organisms`` says today), and compares the fresh
record with the stored one: every per-step metric series (``metrics``), every field of every held-out evaluation
(``evals``), ``eval_steps``, ``eval_accuracy`` and ``value_pretrain`` where the stored record has them. Timing
(``seconds``, ``cpu_seconds``, ``time/*``, ``wall``) and provenance are not compared. The fresh record goes through
JSON as a stored one did, so a value is compared exactly as it would have been stored.

The config is checked too: a field both configs hold must agree (otherwise the rerun is not the stored run, and
the check fails); fields added since the run was stored are listed. The run's base-policy checkpoint hash is
compared with the stored provenance's, and the current CPU with the one that made the run.

What "unchanged" can mean here: the runs depend on the CPU's floating-point kernels (torch picks them by the CPU's
instruction set), so identical values are expected only on the kind of machine that made the stored runs. The
default runs were made on the project's 2-core AMD EPYC machines (torch 2.13.0+cpu, one thread), the kind this
check is run on; on another CPU a difference says nothing about the code.

Per run it prints the number of values compared, how many are bitwise identical, the largest absolute difference,
and the first value that differs (the earliest step; a step's metrics before the evaluation after it). It exits 1
when any value differs by more than ``--atol`` (default 0: every value equal) or is missing, or the configs
disagree.

    python scripts/check_unchanged.py                                  # the default four runs
    python scripts/check_unchanged.py many_updates:ppo:100 outlier_ratios:grpo:105 --atol 1e-6

Runs are ``organism:arm:seed``. The defaults are the cheapest PPO arm and GRPO-family arm made on an AMD EPYC
machine, two seeds each: ``ppo`` of ``many_updates`` (PPO with a critic, 16 optimiser steps a rollout; 23-30 CPU
seconds a run) and ``no_dynamic_sampling`` of ``zero_gradient`` (the DAPO preset without dynamic sampling: GRPO's
group advantages with DAPO's token-level loss and asymmetric clip; 10-12 CPU seconds a run), seeds 100 and 101.
``rlbook`` is whichever the interpreter imports (the script prints its path), and ``experiments/organisms.py`` is taken from the
same tree unless ``--root`` says otherwise: run it from another checkout with that checkout's ``src`` on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_RUNS = ("many_updates:ppo:100", "many_updates:ppo:101",
                "zero_gradient:no_dynamic_sampling:100", "zero_gradient:no_dynamic_sampling:101")
SKIPPED = {"seed", "seconds", "cpu_seconds", "wall", "config", "provenance"}  # not training results, or checked apart


def timing(key: str) -> bool:
    return key in SKIPPED or key.startswith("time/") or key == "wall"


def load_script(path: Path):
    """``experiments/organisms.py`` as a module (the experiment scripts are not a package)."""
    spec = importlib.util.spec_from_file_location("organisms_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flatten(record: dict) -> list[tuple[tuple, str, object]]:
    """``(order, key, value)`` for every compared value of a run record; ``order`` sorts by training step (a step's
    metrics before the held-out evaluation after it), then by the record's own key order."""
    out = []
    for i, (name, series) in enumerate((record.get("metrics") or {}).items()):
        if timing(name):
            continue
        for t, value in enumerate(series):  # history entry t is step t + 1
            out.append(((t + 1, 0, i), f"metrics/{name} at step {t + 1}", value))
    for j, evaluation in enumerate(record.get("evals") or []):
        step = evaluation.get("step", j)
        for i, (name, value) in enumerate(evaluation.items()):
            if not timing(name):
                out.append(((step, 1, i), f"evals[{j}]/{name} (step {step})", value))
    for name in ("eval_steps", "eval_accuracy"):
        for j, value in enumerate(record.get(name) or []):
            step = (record.get("eval_steps") or [j] * (j + 1))[j]
            out.append(((step if isinstance(step, int) else j, 2, j), f"{name}[{j}]", value))
    for name, series in (record.get("value_pretrain") or {}).items():
        if timing(name):
            continue
        for t, value in enumerate(series):  # before training: order them first
            out.append(((-1, t, 0), f"value_pretrain/{name}[{t}]", value))
    known = {"metrics", "evals", "eval_steps", "eval_accuracy", "value_pretrain"}
    for name, value in record.items():  # anything else a record holds, compared whole
        if name not in known and not timing(name):
            out.append(((10**9, 0, 0), name, value))
    return out


def identical(a, b) -> bool:
    """Bitwise equality for floats (NaN equals NaN, 0.0 is not -0.0), plain equality otherwise."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def difference(a, b) -> float:
    """|a - b| for numbers (0 for two NaNs or two Nones, inf when only one is NaN or None); 0 or inf otherwise."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
        if math.isinf(a) or math.isinf(b):
            return 0.0 if a == b else math.inf
        return abs(a - b)
    return 0.0 if a == b else math.inf


def compare(stored: dict, fresh: dict) -> dict:
    fresh_values = {k: v for _, k, v in flatten(fresh)}
    rows = sorted(flatten(stored), key=lambda row: row[0])
    result = {"compared": 0, "identical": 0, "max_diff": 0.0, "max_key": None, "first": None, "missing": 0,
              "differing": 0, "by_metric": {}}
    for order, key, old in rows:
        result["compared"] += 1
        if key not in fresh_values:
            result["missing"] += 1
            diff, new = math.inf, "<missing>"
        else:
            new = fresh_values[key]
            if identical(old, new):
                result["identical"] += 1
                continue
            diff = difference(old, new)
        result["differing"] += 1
        name = key.split(" ")[0]
        name = "evals/" + name.split("/", 1)[1] if name.startswith("evals[") else name.split("[")[0]
        result["by_metric"].setdefault(name, key)  # the first differing value of each metric
        if result["first"] is None:
            result["first"] = (key, old, new, diff)
        if diff > result["max_diff"] or result["max_key"] is None:
            result["max_diff"], result["max_key"] = diff, key
    result["extra"] = sorted(set(fresh_values) - {k for _, k, _ in rows})
    return result


def config_check(stored: dict, fresh: dict) -> tuple[dict, dict]:
    """The config fields both hold with different values, and those only the fresh config has."""
    differing = {k: (v, fresh[k]) for k, v in stored.items() if k in fresh and fresh[k] != v}
    added = {k: fresh[k] for k in fresh if k not in stored}
    missing = {k: v for k, v in stored.items() if k not in fresh}
    differing.update({k: (v, "<missing>") for k, v in missing.items()})
    return differing, added


def git_state(root: Path) -> str:
    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "?"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}{' with uncommitted changes' if dirty else ' (clean)'}"


def fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", default=list(DEFAULT_RUNS),
                        help=f"organism:arm:seed (default: {' '.join(DEFAULT_RUNS)})")
    parser.add_argument("--atol", type=float, default=0.0,
                        help="largest absolute difference allowed (default 0: identical values)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout whose experiments/ to use (default: the one rlbook is imported from)")
    args = parser.parse_args(argv)

    import rlbook
    from rlbook.checkpoints import load_manifest
    from rlbook.experiment import Arm, _cpu_name

    root = (args.root or Path(rlbook.__file__).resolve().parents[2]).resolve()
    script = root / "experiments" / "organisms.py"
    print(f"rlbook from {rlbook.__file__}")
    print(f"experiments/organisms.py from {script}; tree {git_state(root)}")
    print(f"CPU {_cpu_name()}, python {platform.python_version()}, atol {args.atol:g}")
    organisms = load_script(script)

    failed = False
    files: dict[str, dict] = {}
    total_cpu = 0.0
    for run in args.runs:
        try:
            organism, arm_name, seed = run.rsplit(":", 2)
            seed = int(seed)
        except ValueError:
            parser.error(f"a run is organism:arm:seed, got {run!r}")
        path = root / "experiments" / "results" / f"organism_{organism}.json"
        if path not in files:
            files[path] = json.loads(path.read_text())
        stored_file = files[path]
        records = [r for r in stored_file["runs"].get(arm_name, []) if r["seed"] == seed]
        if not records:
            parser.error(f"{path.name} has no run of arm {arm_name!r} with seed {seed}")
        stored = records[0]
        arm_json = dict(stored_file["arms"][arm_name])
        arm = Arm(arm_json.pop("preset"), task=arm_json.pop("task", None),
                  task_kwargs=arm_json.pop("task_kwargs", None), **arm_json)
        common = stored_file["common"]
        spec_json = stored_file["organism"]
        evaluation = {"num_prompts": spec_json["num_prompts"], "num_samples": spec_json["num_samples"],
                      "every": spec_json["eval_every"], "at_steps": spec_json.get("eval_at", [])}
        provenance = stored_file["provenance"]

        print(f"\n{organism}:{arm_name}:{seed} (stored at {provenance.get('git_commit', '?')[:8]} on "
              f"{provenance.get('cpu')}, {stored.get('cpu_seconds')} CPU s)")
        notes = []
        spec = organisms.get_organism(organism)
        if spec.arm(arm_name).to_json() != stored_file["arms"][arm_name]:
            notes.append(f"rlbook.organisms's arm is now {spec.arm(arm_name).to_json()} (the stored one is used)")
        if {**spec.settings, **common} != common:
            notes.append(f"rlbook.organisms adds settings {sorted(set(spec.settings) - set(common))} "
                         f"(the stored run had none of them)")
        for name, digest in (provenance.get("checkpoint_sha256") or {}).items():
            now = load_manifest(name)["sha256"]["model.safetensors"]
            if now != digest:
                notes.append(f"base policy {name}'s checkpoint changed ({digest[:12]} stored, {now[:12]} now)")
        if provenance.get("cpu") != _cpu_name():
            notes.append(f"made on {provenance.get('cpu')}, checked on {_cpu_name()}: identical values are not "
                         f"expected")
        for note in notes:
            print(f"  note: {note}")

        cpu_start = time.process_time()
        fresh = organisms.run_one(arm_name, arm, seed, organism=organism, evaluation=evaluation, **common)
        cpu = time.process_time() - cpu_start
        total_cpu += cpu
        fresh = json.loads(json.dumps(fresh))  # as it would be stored

        differing, added = config_check(stored["config"], fresh["config"])
        result = compare(stored, fresh)
        order_of = {k: o for o, k, _ in flatten(stored)}
        bad = result["max_diff"] > args.atol or result["missing"] or differing
        failed |= bool(bad)
        print(f"  {result['compared']} values compared, {result['identical']} bitwise identical, "
              f"{result['differing']} differ ({result['missing']} missing); largest |difference| "
              f"{fmt(result['max_diff'])}{' at ' + result['max_key'] if result['max_key'] else ''}; "
              f"{cpu:.1f} CPU s")
        if result["first"] is not None:
            key, old, new, diff = result["first"]
            print(f"  first difference: {key}: stored {fmt(old)}, fresh {fmt(new)} (|difference| {fmt(diff)})")
            firsts = sorted(result["by_metric"].values(), key=lambda k: order_of[k])
            print(f"  {len(firsts)} keys differ; where each first does: " + "; ".join(firsts[:10])
                  + ("; ..." if len(firsts) > 10 else ""))
        for key, (old, new) in differing.items():
            print(f"  config {key}: stored {old!r}, fresh {new!r}")
        if added:
            print(f"  config fields added since: {', '.join(f'{k}={v!r}' for k, v in added.items())}")
        if result["extra"]:
            print(f"  the fresh record also has {len(result['extra'])} values the stored one lacks (not compared), "
                  f"e.g. {result['extra'][0]}")
        same = result["identical"] == result["compared"]
        print(f"  {'DIFFERS' if bad else 'IDENTICAL' if same else 'WITHIN ATOL'}")
    print(f"\n{len(args.runs)} runs, {total_cpu:.1f} CPU s: "
          f"{'some differ beyond atol ' + format(args.atol, 'g') if failed else 'all unchanged'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
