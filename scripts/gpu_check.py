"""The GPU path, checked by one command: the CUDA tests, then a short GRPO run with its speed and memory.

    make gpu-check                                         # the same as: .venv/bin/python scripts/gpu_check.py
    .venv/bin/python scripts/gpu_check.py --steps 50       # a longer run
    .venv/bin/python scripts/gpu_check.py --device cpu --smoke   # the same code, tiny, on the CPU (a unit test)

Three parts:

1. the CUDA tests (``pytest -k "cuda and not smoke"`` over tests/test_cuda.py, test_rollout.py and
   test_trainer.py); on a CPU they would only skip, so ``--device cpu`` leaves them out;
2. sampling throughput: completion tokens per second of :func:`rlbook.rollout.generate_rollouts` from the
   arithmetic base policy, under :func:`rlbook.lm.autocast` (bf16 on a recent GPU, float32 on the CPU);
3. a short run of the preset ``"grpo"`` on the arithmetic task (20 steps), timed per phase with the trainer's
   ``time/generate``, ``time/score`` and ``time/update`` (means over the steps after the first, which pays for
   CUDA's warm-up), the wall time per step with the device synchronised, the peak GPU memory
   (``torch.cuda.max_memory_allocated``), the last step's reward and the held-out accuracy after the run.

It prints a small table and writes the numbers to a JSON file (``--out``, default ``_build/gpu_check.json``).
Exit status 0 when the tests passed and every metric of the run is finite, else 1; 1 at once, with the reason,
when no CUDA GPU is visible and ``--device cpu`` was not given (a CPU-only torch build prints the pip command
that installs a CUDA build of the same torch version).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: the shipped base policy and the tasks
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEST_FILES = ["tests/test_cuda.py", "tests/test_rollout.py", "tests/test_trainer.py"]
TEST_SELECTION = "cuda and not smoke"  # test_cuda.py's CPU smoke test runs this script: leave it out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps (default 20)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and 2 steps (the CPU unit test)")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the CUDA tests")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "gpu_check.json", help="the JSON file")
    return parser.parse_args(argv)


def cuda_install_command() -> str:
    """The pip command that replaces a CPU-only torch with a CUDA build of the same version (PyPI's Linux x86_64
    wheels of torch are CUDA builds; the requirements pin a CPU wheel)."""
    version = torch.__version__.split("+")[0]
    python = sys.executable
    return (f"{python} -m pip uninstall -y torch && "
            f"{python} -m pip install torch=={version} --index-url https://pypi.org/simple")


def no_cuda_reason() -> str | None:
    """Why CUDA cannot be used here, in a sentence or two; None when it can."""
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None), as requirements.txt "
                f"pins it. On a machine with an NVIDIA GPU, install a CUDA build of the same version:\n"
                f"    {cuda_install_command()}")
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, but no CUDA GPU is visible "
                f"(torch.cuda.is_available() is False: no GPU, no driver, or CUDA_VISIBLE_DEVICES hides it).")
    return None


def environment(device: torch.device) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "transformers": transformers.__version__, "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version(),
                   native_bf16=props.major >= 8)
    else:
        env.update(device_name=platform.processor() or platform.machine(), torch_threads=torch.get_num_threads())
    return env


def run_cuda_tests() -> dict:
    """The CUDA tests in a fresh process; their outcome counts and exit status."""
    command = [sys.executable, "-m", "pytest", *TEST_FILES, "-k", TEST_SELECTION, "-q", "-rs", "-p",
               "no:cacheprovider"]
    print("$", " ".join(command[2:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    print(done.stdout[-4000:], done.stderr[-2000:], sep="", flush=True)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)",
                                                     done.stdout)}
    return {"command": " ".join(command[2:]), "returncode": done.returncode, "seconds": time.perf_counter() - start,
            **counts}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precision(device: torch.device) -> str:
    """What :func:`rlbook.lm.autocast` runs the forward passes in on ``device``."""
    from rlbook.lm import autocast

    with autocast(device):
        if device.type == "cuda" and torch.is_autocast_enabled("cuda"):
            return f"{str(torch.get_autocast_dtype('cuda')).removeprefix('torch.')} autocast"
    return "float32" + (" (this GPU has no native bf16)" if device.type == "cuda" else "")


def sampling_throughput(model, tokenizer, task, device, num_prompts: int, num_generations: int,
                        max_new_tokens: int, repeats: int) -> dict:
    """Completion tokens (EOS included, padding not) sampled per second, after one warm-up call."""
    from rlbook.lm import autocast
    from rlbook.rollout import generate_rollouts

    prompts = [e.prompt for e in task.sample(num_prompts, split="train", seed=np.random.default_rng(0))]

    def sample(seed):
        with autocast(device):
            return generate_rollouts(model, tokenizer, prompts, num_generations=num_generations,
                                     max_new_tokens=max_new_tokens, seed=seed, device=device)

    sample(0)  # warm-up: CUDA context, kernels, allocator
    synchronize(device)
    start, tokens = time.perf_counter(), 0
    for seed in range(1, repeats + 1):
        tokens += int(sample(seed).completion_mask.sum())
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"rows": num_prompts * num_generations, "max_new_tokens": max_new_tokens, "calls": repeats,
            "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds}


def grpo_run(model, tokenizer, task, device, steps: int, batch_size: int, num_generations: int,
             max_completion_length: int, eval_size: int) -> dict:
    """``steps`` steps of the preset "grpo"; per-phase seconds, wall seconds per step, peak memory, reward."""
    from rlbook.callbacks import TrainerCallback
    from rlbook.presets import preset
    from rlbook.trainer import Trainer

    class StepClock(TrainerCallback):  # wall time of each step, the device's queue drained
        def __init__(self):
            self.ends = []

        def on_step_end(self, trainer, metrics):
            synchronize(device)
            self.ends.append(time.perf_counter())

    config = preset("grpo", per_device_train_batch_size=batch_size, num_generations=num_generations,
                    max_completion_length=max_completion_length, max_steps=steps, eval_size=eval_size, seed=0)
    clock = StepClock()
    trainer = Trainer(model, tokenizer, task, config, callbacks=[clock])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    history = trainer.train(progress=False)
    eval_accuracy = trainer.evaluate()
    synchronize(device)
    wall = np.diff([start, *clock.ends])
    timed = history[1:] if len(history) > 1 else history  # the first step pays for the warm-up
    numbers = [v for m in history for v in m.values() if isinstance(v, (int, float))]
    on_device = all(p.device.type == device.type for p in model.parameters())
    return {
        "preset": "grpo", "steps": steps, "per_device_train_batch_size": batch_size,
        "num_generations": num_generations, "max_completion_length": max_completion_length,
        "precision": precision(device),
        **{f"seconds_{phase}": float(np.mean([m[f"time/{phase}"] for m in timed]))
           for phase in ("generate", "score", "update")},
        "seconds_per_step": float(np.mean(wall[1:] if len(wall) > 1 else wall)),
        "seconds_first_step": float(wall[0]),
        "seconds_total": time.perf_counter() - start,
        "peak_memory_mib": (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None),
        "first_reward": history[0]["reward"], "final_reward": history[-1]["reward"],
        "eval_accuracy": eval_accuracy,
        "all_metrics_finite": all(math.isfinite(v) for v in numbers),
        "parameters_on_device": on_device,
    }


def table(report: dict) -> str:
    env, sampling, run = report["environment"], report.get("sampling", {}), report.get("grpo", {})
    tests = report.get("tests")
    peak = run.get("peak_memory_mib")
    rows = [
        ("device", f"{env['device_name']} ({env['device']})"),
        ("torch / CUDA / transformers", f"{env['torch']} / {env['torch_cuda']} / {env['transformers']}"),
        ("CUDA tests", "not run" if tests is None else
         f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, {tests.get('skipped', 0)} skipped"
         f" (exit {tests['returncode']})"),
        ("sampling, tokens/s", f"{sampling['tokens_per_second']:,.0f}  ({sampling['rows']} rows, "
                               f"{sampling['max_new_tokens']} new tokens at most, {run['precision']})"),
        ("GRPO s/step: generate", f"{run['seconds_generate']:.3f}"),
        ("GRPO s/step: score", f"{run['seconds_score']:.3f}"),
        ("GRPO s/step: update", f"{run['seconds_update']:.3f}"),
        ("GRPO s/step: wall", f"{run['seconds_per_step']:.3f}  (first step {run['seconds_first_step']:.2f})"),
        ("peak GPU memory", "n/a on the CPU" if peak is None else f"{peak:,.0f} MiB"),
        ("reward: first -> last step", f"{run['first_reward']:.3f} -> {run['final_reward']:.3f}  "
                                       f"({run['steps']} steps)"),
        ("held-out accuracy after", f"{run['eval_accuracy']:.3f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type not in ("cuda", "cpu"):
        print(f"gpu_check: --device must be cuda or cpu, got {args.device!r}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        reason = no_cuda_reason()
        if reason is not None:
            print(f"gpu_check: no CUDA GPU to check. {reason}\n"
                  f"(`--device cpu` runs the same checks on the CPU.)", file=sys.stderr)
            return 1
    else:
        torch.set_num_threads(1)  # the book's tiny models run fastest on one CPU thread

    from rlbook.checkpoints import RECIPES, load_base_policy

    report = {"environment": environment(device), "tests": None}
    if device.type == "cuda" and not args.skip_tests:
        report["tests"] = run_cuda_tests()
    recipe = RECIPES["arithmetic"]
    task = recipe.make_task()
    model, tokenizer = load_base_policy("arithmetic", device=device)
    max_new_tokens = recipe.sft.max_new_tokens
    if args.smoke:
        report["sampling"] = sampling_throughput(model, tokenizer, task, device, 4, 2, max_new_tokens, 1)
        report["grpo"] = grpo_run(model, tokenizer, task, device, steps=2, batch_size=8, num_generations=4,
                                  max_completion_length=max_new_tokens, eval_size=8)
    else:
        report["sampling"] = sampling_throughput(model, tokenizer, task, device, 64, 8, max_new_tokens, 3)
        report["grpo"] = grpo_run(model, tokenizer, task, device, steps=args.steps, batch_size=64,
                                  num_generations=8, max_completion_length=max_new_tokens, eval_size=256)
    tests_ok = report["tests"] is None or report["tests"]["returncode"] == 0
    run_ok = report["grpo"]["all_metrics_finite"] and report["grpo"]["parameters_on_device"]
    report["ok"] = bool(tests_ok and run_ok)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(f"written to {args.out}; {'OK' if report['ok'] else 'FAILED'}"
          + ("" if tests_ok else ": the CUDA tests failed") + ("" if run_ok else ": the run is not finite/on device"))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
