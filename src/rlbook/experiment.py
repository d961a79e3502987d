"""One experiment harness: arms × seeds, run in parallel processes, one progress bar, a summary table, and one
results layout with a provenance record.

An experiment is a function ``run_one(arm_name, arm, seed) -> dict`` (one run, JSON-able) and a dict of arms. For
the trainer, an arm is an :class:`Arm`, a preset plus overrides, and :func:`train_run` is the usual ``run_one``::

    from rlbook.experiment import Arm, run_experiment, train_run

    ARMS = {"grpo": Arm("grpo", learning_rate=2e-4), "ppo": Arm("ppo", learning_rate=1e-4)}

    def run_one(name, arm, seed):
        return train_run("arithmetic", arm, seed, max_steps=300, eval_every=25)

    if __name__ == "__main__":
        run_experiment("grpo_training", run_one, ARMS, seeds=range(5), out="experiments/results/grpo_training.json")

Seeds are paired: the trainer draws prompts, samples and minibatch order from ``(seed, step)`` only, so every arm of
a seed sees the same prompts, the same held-out problems, and the same sampling stream until the policies differ.
Runs are independent, so the result does not depend on how they were spread over processes.

The results layout (every ``experiments/results/*.json``)::

    {"experiment": name, "description": ..., "common": {...settings shared by all arms},
     "arms": {name: arm settings}, "seeds": [...],
     "runs": {arm name: [one record per seed, in seed order: {"seed": s, "seconds": t, ...}]},
     "provenance": {command, arguments, git commit and whether the tree was dirty as the run started, started_at,
                    plan (a confirmatory run's: path, sha256, commit), date written, python and package versions, CPU,
                    threads, processes, load average, checkpoint hashes}, "seconds": wall time, ...extras}

Each run's record holds ``seconds`` (wall) and ``cpu_seconds`` (its process's CPU time, one torch thread: the cost
that does not grow when the machine is loaded). A run with ``plan=`` is confirmatory (:mod:`rlbook.plans`).

A trainer run's record (:func:`train_run`) holds ``config``, ``eval_steps``, ``eval_accuracy`` and ``metrics``
(key -> one value per step; keys of :data:`rlbook.metrics.METRICS` or of the callbacks used).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import multiprocessing
import os
import platform
import queue
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from rlbook.callbacks import TrainerCallback
from rlbook.stats import mean_interval  # re-exported: the old home


class Arm:
    """One arm: a preset plus overrides, and optionally the task (a base policy's name) and task settings (e.g.
    ``task_kwargs={"incorrect_reward": -1.0}`` for ±1 rewards)::

        Arm("dapo", learning_rate=3e-4, epsilon_high=0.2)
    """

    def __init__(self, preset: str, *, task: str | None = None, task_kwargs: dict | None = None, **overrides):
        from rlbook.presets import PRESETS, check_keys

        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        check_keys(overrides)
        self.preset, self.task, self.task_kwargs, self.overrides = preset, task, dict(task_kwargs or {}), overrides

    def to_json(self) -> dict:
        out = {"preset": self.preset, **self.overrides}
        out.update({"task": self.task} if self.task else {})
        out.update({"task_kwargs": self.task_kwargs} if self.task_kwargs else {})
        return out

    def __eq__(self, other) -> bool:
        return isinstance(other, Arm) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"Arm({', '.join(f'{k}={v!r}' for k, v in self.to_json().items())})"


# --- one trainer run ---------------------------------------------------------------------------------------------


def train_run(task: str, arm: Arm, seed: int, *, callbacks: Iterable[TrainerCallback] = (), logged=None,
              policy=None, reward_fn=None, value_model=None, **settings) -> dict:
    """One training run of ``arm`` from the shipped base policy of ``task`` (or from ``policy = (model,
    tokenizer)``), recorded as the experiments store it.

    ``settings`` are overrides shared by every arm (the arm's own override them); the completion budget defaults to
    the base policy's SFT budget. Returns ``{"config", "eval_steps", "eval_accuracy", "metrics", "seconds"}``, with
    ``metrics`` holding one value per step (None where a step did not log it) of the keys in ``logged`` (default:
    every key logged)."""
    import copy

    import torch

    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.presets import preset
    from rlbook.trainer import Trainer

    torch.set_num_threads(1)
    task = arm.task or task
    recipe = RECIPES[task]
    model, tokenizer = load_base_policy(task) if policy is None else (copy.deepcopy(policy[0]), policy[1])
    config = preset(arm.preset, **{"max_completion_length": recipe.sft.max_new_tokens, **settings, **arm.overrides},
                    seed=seed)
    task_object = recipe.make_task(**arm.task_kwargs)
    trainer = Trainer(model, tokenizer, task_object, config, callbacks=[*callbacks, StepReporter()],
                      reward_fn=reward_fn, value_model=value_model)
    start = time.perf_counter()
    eval_steps, eval_accuracy = trainer.train_with_eval_curve()
    history = trainer.history
    keys = logged if logged is not None else list(dict.fromkeys(k for m in history for k in m if k != "step"))
    return {"config": dataclasses.asdict(config), "eval_steps": eval_steps, "eval_accuracy": eval_accuracy,
            "metrics": {key: [m.get(key) for m in history] for key in keys},
            "seconds": round(time.perf_counter() - start, 1)}


# --- progress across processes ------------------------------------------------------------------------------------

_report: Callable[[int], None] | None = None  # set by run_experiment (in this process) or by a worker's initializer


def report_progress(steps: int = 1) -> None:
    """Count ``steps`` done towards the experiment's progress bar (a no-op outside :func:`run_experiment`)."""
    if _report is not None:
        _report(steps)


class StepReporter(TrainerCallback):
    """Reports every trainer step to the experiment's progress bar."""

    def on_step_end(self, trainer, metrics):
        report_progress(1)


def _init_worker(progress_queue) -> None:
    global _report
    import torch

    torch.set_num_threads(1)
    _report = progress_queue.put if progress_queue is not None else None


def _run_job(run_one, name, arm, seed) -> dict:
    start, cpu_start = time.perf_counter(), time.process_time()
    record = run_one(name, arm, seed)
    record.setdefault("seconds", round(time.perf_counter() - start, 1))
    # the CPU time of this process (one torch thread): the cost that does not depend on the machine's load
    record.setdefault("cpu_seconds", round(time.process_time() - cpu_start, 1))
    return {"seed": seed, **record}


# --- the harness --------------------------------------------------------------------------------------------------


def run_experiment(name: str, run_one: Callable[[str, object, int], dict], arms: dict, seeds: Iterable[int], *,
                   out: str | Path | None = None, common: dict | None = None, extra: dict | None = None,
                   processes: int | None = None, steps_per_run: Callable[[str, object], int] | int | None = None,
                   summary: dict[str, Callable[[dict], float]] | None = None, arguments: dict | None = None,
                   checkpoints: Iterable[str] = (), merge: bool = False, progress: bool = True,
                   description: str | None = None, plan: str | Path | None = None) -> dict:
    """Run ``run_one(arm_name, arm, seed)`` for every arm and seed; store and return the results (layout above).

    - ``processes``: worker processes (default: as many as the machine has cores, at most one per run); 1 runs
      everything in this process, in order (what the tests use). Each worker uses one torch thread.
    - ``steps_per_run``: the steps of one run (a number, or a function of ``(arm_name, arm)``), for a progress bar
      counted in steps (the trainer's :class:`StepReporter` reports them); without it the bar counts runs.
    - ``summary``: ``{column: f(record) -> float}`` printed per arm as mean and 95 % t-interval over seeds (default:
      the last held-out accuracy, when the records have ``eval_accuracy``).
    - ``common``, ``extra``: settings shared by every arm, and more top-level entries, stored as given.
    - ``arguments``: the script's parsed arguments, for the provenance record.
    - ``checkpoints``: base-policy names whose file hashes go into the provenance record.
    - ``merge``: keep the stored file's other arms (``common`` and ``seeds`` must match): rerun only some arms.
    - ``plan``: a plan file (``experiments/plans/<name>.md``, :mod:`rlbook.plans`) for a *confirmatory* run. It
      refuses to start, with one line saying why, unless the plan and every tracked file are committed and the
      experiment, seeds, arms and ``out`` are the plan's; the provenance then records the plan (path, SHA-256,
      commit) and ``started_at``. Without a plan the run is a pilot, refused on seeds a plan reserves.
    """
    from rlbook import plans
    global _report
    seeds = list(seeds)
    arms_json = {arm_name: arm.to_json() if isinstance(arm, Arm) else arm for arm_name, arm in arms.items()}
    jobs = [(arm_name, seed) for arm_name in arms for seed in seeds]
    if not jobs:
        raise ValueError("no runs: give at least one arm and one seed")
    if processes is not None and processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    workers = min(len(jobs), processes or _usable_cores())
    if plan is not None:
        started = plans.confirm(plan, experiment=name, seeds=seeds, arms=list(arms), out=out)
        root = plans.read_plan(plan).root
    else:
        plans.check_pilot(name, seeds)
        started, root = {"started_at": plans.utc_now()}, plans.package_root()
    commit = _git_state(root)  # the code as the run starts
    count_steps = steps_per_run is not None
    per_run = (lambda a: 1) if not count_steps else (
        (lambda a: steps_per_run(a, arms[a])) if callable(steps_per_run) else (lambda a: int(steps_per_run)))
    total = sum(per_run(arm_name) for arm_name, _ in jobs)
    start = time.perf_counter()
    bar = _bar(total, f"{name}: {len(jobs)} runs, {workers} process{'es' * (workers > 1)}", progress)
    records: dict[tuple[str, int], dict] = {}
    try:
        if workers == 1:
            _report = bar.update if (bar is not None and count_steps) else None
            for arm_name, seed in jobs:
                records[(arm_name, seed)] = _run_job(run_one, arm_name, arms[arm_name], seed)
                if bar is not None and not count_steps:
                    bar.update(1)
        else:
            records = _run_parallel(run_one, arms, jobs, workers, bar, count_steps)
        if bar is not None and bar.n < total:  # runs that took fewer steps than announced
            bar.update(total - bar.n)
    finally:
        _report = None
        if bar is not None:
            bar.close()

    result = {"experiment": name, "description": description, "common": common or {}, "arms": arms_json,
              "seeds": seeds, "runs": {arm_name: [records[(arm_name, s)] for s in seeds] for arm_name in arms},
              **(extra or {})}
    result["provenance"] = provenance(arguments=arguments, checkpoints=checkpoints, processes=workers,
                                      root=root, git_state=commit, started=started)
    result["seconds"] = round(time.perf_counter() - start, 1)
    if merge and out is not None and Path(out).exists():
        stored = json.loads(Path(out).read_text())
        stored_plan = (stored.get("provenance") or {}).get("plan")
        if (stored_plan or {}).get("path") != (result["provenance"].get("plan") or {}).get("path"):
            raise ValueError(f"merge: {out} was made {'under ' + stored_plan['path'] if stored_plan else 'without a plan'}"
                             f", this run {'under ' + str(plan) if plan is not None else 'without one'}: a "
                             f"confirmatory file takes only arms run under its plan")
        result = _merged(stored, result)
    print_summary(result, summary)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out} in {result['seconds']} s")
    return result


def _run_parallel(run_one, arms, jobs, workers, bar, count_steps) -> dict:
    context = multiprocessing.get_context("spawn")  # not fork: torch's thread pools do not survive a fork
    progress_queue = context.Queue() if count_steps else None
    done = threading.Event()

    def drain():  # move the workers' step reports onto the bar
        while not (done.is_set() and progress_queue.empty()):
            try:
                steps = progress_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if bar is not None:
                bar.update(steps)

    reader = threading.Thread(target=drain, daemon=True) if count_steps else None
    if reader is not None:
        reader.start()
    records = {}
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                                 initargs=(progress_queue,)) as pool:
            futures = {pool.submit(_run_job, run_one, arm_name, arms[arm_name], seed): (arm_name, seed)
                       for arm_name, seed in jobs}
            for future in as_completed(futures):
                records[futures[future]] = future.result()
                if bar is not None and not count_steps:
                    bar.update(1)
    finally:
        done.set()
        if reader is not None:
            reader.join()
    return records


def _bar(total: int, desc: str, progress: bool):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, mininterval=1.0, file=sys.stderr)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _merged(stored: dict, new: dict) -> dict:
    """``new`` with the stored file's other arms kept; the settings both share must agree."""
    for key in ("experiment", "common", "seeds"):
        if stored.get(key) != new.get(key):
            raise ValueError(f"merge: the stored {key} {stored.get(key)!r} differs from this run's {new.get(key)!r}")
    merged = dict(new)
    merged["arms"] = {**stored["arms"], **new["arms"]}
    merged["runs"] = {**stored["runs"], **new["runs"]}
    merged["provenance"] = {**new["provenance"], "arms_rerun": sorted(new["runs"]),
                            "earlier": stored.get("provenance")}
    merged["seconds"] = round(stored.get("seconds", 0.0) + new["seconds"], 1)
    return merged


def add_plan_arguments(parser) -> None:
    """``--first-seed`` and ``--plan`` for an experiment script whose parser has ``--seeds`` (a count): seeds
    ``first_seed .. first_seed + seeds - 1``, and the plan file of a confirmatory run (:mod:`rlbook.plans`)."""
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (a plan reserves its own)")
    parser.add_argument("--plan", type=Path, default=None,
                        help="the committed plan file of a confirmatory run (experiments/plans/<name>.md)")


def seeds_of(args) -> range:
    """The seeds of a script's parsed ``--seeds`` and ``--first-seed``."""
    return range(args.first_seed, args.first_seed + args.seeds)


# --- provenance and the summary -----------------------------------------------------------------------------------


def _git_state(root: Path | None) -> dict:
    """``{"git_commit", "git_dirty"}`` of the repository ``root`` (None for both outside one)."""
    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    if root is None:
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": git("rev-parse", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def _relative(value, root: Path | None):
    """``value`` with every path inside ``root`` written relative to it (strings, lists and dicts within)."""
    if root is None:
        return value
    if isinstance(value, dict):
        return {k: _relative(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_relative(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(f"{root}/", "")
    return value


def provenance(*, arguments: dict | None = None, checkpoints: Iterable[str] = (), processes: int = 1,
               root: Path | None = None, git_state: dict | None = None, started: dict | None = None) -> dict:
    """Where a result came from: the command and its parsed arguments (paths relative to the repository), the git
    commit as the run started (and whether the tree had uncommitted changes), when it started and was written, the
    plan of a confirmatory run (:func:`rlbook.plans.confirm`), Python and package versions, the CPU, torch threads,
    worker processes, the load average when it was written, and the SHA-256 of each base policy used."""
    import torch
    import transformers

    import rlbook
    from rlbook import plans
    from rlbook.checkpoints import load_manifest

    root = plans.package_root() if root is None else root
    git_state = _git_state(root) if git_state is None else git_state
    started = started or {}
    return {
        "command": _relative(shlex.join(["python", *sys.argv]), root),
        "arguments": _relative(arguments or {}, root),
        **git_state,
        **({"plan": started["plan"]} if "plan" in started else {}),
        "started_at": started.get("started_at"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "packages": {"rlbook": rlbook.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     "transformers": transformers.__version__},
        "cpu": _cpu_name(),
        "cores": _usable_cores(),
        "torch_threads": 1,
        "processes": processes,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "checkpoint_sha256": {c: load_manifest(c)["sha256"]["model.safetensors"] for c in checkpoints},
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def print_summary(result: dict, summary: dict[str, Callable[[dict], float]] | None = None) -> None:
    """Per arm: the number of seeds, each summary column as mean [95 % interval], and seconds per run."""
    if summary is None:
        first = next(iter(result["runs"].values()))[0]
        summary = {"last eval_accuracy": lambda r: r["eval_accuracy"][-1]} if "eval_accuracy" in first else {}
    header = f"{'arm':<24} {'seeds':>5} " + " ".join(f"{c:>26}" for c in summary) + f" {'s/run':>7}"
    print(header)
    for arm_name, runs in result["runs"].items():
        cells = []
        for f in summary.values():
            mean, low, high = mean_interval([f(r) for r in runs])
            cells.append(f"{mean:.4g} [{low:.4g}, {high:.4g}]")
        timed = [r["seconds"] for r in runs if r.get("seconds") is not None]  # converted old records have none
        seconds = np.mean(timed) if timed else np.nan
        print(f"{arm_name:<24} {len(runs):>5} " + " ".join(f"{c:>26}" for c in cells) + f" {seconds:>7.1f}")


def load_results(name: str) -> dict:
    """The stored results ``experiments/results/<name>.json`` of this checkout (see :mod:`rlbook.paths`)."""
    from rlbook.paths import experiment_results_dir

    path = experiment_results_dir() / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run experiments/{name}.py to make it")
    return json.loads(path.read_text())
