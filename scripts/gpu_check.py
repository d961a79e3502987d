"""The GPU path, checked by one command: the CUDA tests, then a short GRPO run with its speed and memory.

    make gpu-check                                         # the same as: .venv/bin/python scripts/gpu_check.py
    .venv/bin/python scripts/gpu_check.py --steps 50       # a longer run
    .venv/bin/python scripts/gpu_check.py --device cpu --smoke   # the same code, tiny, on the CPU (a unit test)
    .venv/bin/python scripts/gpu_check.py --device cpu --smoke --cpu-bf16   # ... under CUDA's bf16, emulated

Three parts:

1. the CUDA tests (``pytest -k "cuda and not smoke"`` over tests/test_cuda.py, test_rollout.py and
   test_trainer.py); on a CPU they would only skip, so ``--device cpu`` leaves them out;
2. sampling throughput: completion tokens per second of :func:`rlbook.rollout.generate_rollouts` from the
   arithmetic base policy, under :func:`rlbook.lm.autocast` (bf16 on a recent GPU, float32 on the CPU), and how
   far the sampler's log-probs are from the learner's (:func:`rlbook.rollout.sequence_logprobs` under the same
   autocast) for the tokens it drew;
3. a short run of the preset ``"grpo"`` on the arithmetic task (20 steps), timed per phase with the trainer's
   ``time/generate``, ``time/score`` and ``time/update`` (means over the steps after the first, which pays for
   CUDA's warm-up), the wall time per step with the device synchronised, the peak GPU memory
   (``torch.cuda.max_memory_allocated``), the update's achieved TFLOP/s (:func:`update_flops` over
   ``time/update``) beside the GPU's bf16 peak (:data:`PEAK_BF16_TFLOPS`, or ``--peak-tflops``), the first step's
   ratios, the last step's reward and the held-out accuracy after the run.

The first step's ratios are all taken before its one optimizer step (the preset takes one per rollout), so they
must be 1: the trainer recomputes the old log-probs with the learner's forward whenever it rounds below float32
(:func:`rlbook.lm.device.low_precision`). The check asserts 1 within ``RATIO_TOLERANCE`` = 1e-3. Before that
recompute, when the sampler's bf16 log-probs were the old ones, this run's first step gave ratios in
[0.944, 1.030] under the CPU emulation of bf16 (``--device cpu --cpu-bf16``).

It prints a small table and writes the numbers to a JSON file (``--out``, default ``_build/gpu_check.json``).
Exit status 0 when the tests passed, every metric of the run is finite and the first step's ratios are 1 within
1e-3, else 1; 1 at once, with the reason, when no CUDA GPU is visible and ``--device cpu`` was not given (a
CPU-only torch build prints the pip command that installs a CUDA build of the same torch version).
"""

from __future__ import annotations

import argparse
import contextlib
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
RATIO_TOLERANCE = 1e-3  # the first on-policy step's ratios: 1 within this
# Dense bf16 tensor-core peaks (without sparsity) from NVIDIA's data sheets, TFLOP/s, by a piece of the name torch
# reports; the first piece found names the GPU (so "H200 NVL" before "H200", "GH200" before both).
PEAK_BF16_TFLOPS = (
    ("GH200", "GH200 (H100 GPU)", 989.0), ("H200 NVL", "H200 NVL", 835.0), ("H200", "H200 SXM", 989.0),
    ("H100 NVL", "H100 NVL", 835.0), ("H100 PCIe", "H100 PCIe", 756.0), ("H100", "H100 SXM", 989.0),
    ("A100", "A100", 312.0), ("L40S", "L40S", 362.0), ("L4", "L4", 121.0),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps (default 20)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and 2 steps (the CPU unit test)")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the CUDA tests")
    parser.add_argument("--cpu-bf16", action="store_true",
                        help="with --device cpu: run under torch.autocast('cpu', dtype=torch.bfloat16), CUDA's bf16 "
                             "autocast emulated on the CPU")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's bf16 peak in TFLOP/s, for a GPU the table does not name")
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
    """What :func:`rlbook.lm.autocast` (and ``--cpu-bf16``) runs the forward passes in on ``device``."""
    from rlbook.lm import autocast

    with autocast(device):
        if torch.is_autocast_enabled(device.type):
            emulated = " (CUDA's, emulated on the CPU)" if device.type == "cpu" else ""
            return f"{str(torch.get_autocast_dtype(device.type)).removeprefix('torch.')} autocast{emulated}"
    return "float32" + (" (this GPU has no native bf16)" if device.type == "cuda" else "")


def peak_tflops(device: torch.device, given: float | None) -> tuple[float | None, str]:
    """The GPU's dense bf16 peak in TFLOP/s and what it is (``--peak-tflops``, else :data:`PEAK_BF16_TFLOPS`)."""
    if device.type != "cuda":
        return None, "n/a on the CPU"
    if given is not None:
        return given, f"{given:g} TFLOP/s (--peak-tflops)"
    name = torch.cuda.get_device_name(device)
    for piece, model, peak in PEAK_BF16_TFLOPS:
        if piece in name:
            return peak, f"{model}: {peak:g} TFLOP/s dense bf16 (NVIDIA data sheet)"
    return None, f"unknown for {name} (pass --peak-tflops)"


def update_flops(policy, scored, num_iterations: int) -> float:
    """Model FLOPs of one step's update, the usual estimate of 6 per parameter and token (2 forward, 4 backward):
    the transformer body's parameters (embedding excluded) over every token its forward runs, each distinct
    prompt once (the learner's shared-prompt forward; a prompt split over micro-batches runs once in each, so this
    is a lower bound then) and every completion token, plus the output layer over the scored tokens; times
    ``num_iterations``. The attention's products over the context and the logits recomputed by checkpointing are
    left out, as in the usual model-FLOPs utilisation."""
    body = sum(p.numel() for name, p in policy.base_model.named_parameters() if "embed_tokens" not in name)
    head = policy.get_output_embeddings().weight.numel()
    batch = scored.rollout.batch
    prompts = int(batch.prompt_mask[:: batch.num_generations].sum())
    completions = int(scored.mask.sum())
    return 6.0 * num_iterations * (body * (prompts + completions) + head * completions)


def sampling_throughput(model, tokenizer, task, device, num_prompts: int, num_generations: int,
                        max_new_tokens: int, repeats: int) -> dict:
    """Completion tokens (EOS included, padding not) sampled per second, after one warm-up call."""
    from rlbook.lm import autocast
    from rlbook.rollout import generate_rollouts, sequence_logprobs

    prompts = [e.prompt for e in task.sample(num_prompts, split="train", seed=np.random.default_rng(0))]

    def sample(seed):
        with autocast(device):
            return generate_rollouts(model, tokenizer, prompts, num_generations=num_generations,
                                     max_new_tokens=max_new_tokens, seed=seed, device=device)

    batch = sample(0)  # warm-up: CUDA context, kernels, allocator
    with autocast(device), torch.no_grad():  # the learner's log-probs of the tokens the sampler drew
        learner = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                    temperature=batch.temperature)
    gap = (learner - batch.logprobs).abs()[batch.completion_mask.bool()].double()
    synchronize(device)
    start, tokens = time.perf_counter(), 0
    for seed in range(1, repeats + 1):
        tokens += int(sample(seed).completion_mask.sum())
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"rows": num_prompts * num_generations, "max_new_tokens": max_new_tokens, "calls": repeats,
            "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "sampler_learner_gap_mean": float(gap.mean()), "sampler_learner_gap_q99": float(gap.quantile(0.99)),
            "sampler_learner_gap_max": float(gap.max())}


def grpo_run(model, tokenizer, task, device, steps: int, batch_size: int, num_generations: int,
             max_completion_length: int, eval_size: int, peak: float | None = None) -> dict:
    """``steps`` steps of the preset "grpo"; per-phase seconds, wall seconds per step, peak memory, the update's
    TFLOP/s (and its fraction of the GPU's ``peak``), the first step's ratios, reward."""
    from rlbook.callbacks import TrainerCallback
    from rlbook.presets import preset
    from rlbook.trainer import Trainer

    class StepClock(TrainerCallback):  # wall time of each step, the device's queue drained; each update's FLOPs
        def __init__(self):
            self.ends, self.flops = [], []

        def on_update_end(self, trainer, scored):
            self.flops.append(update_flops(trainer.policy, scored, trainer.config.num_iterations))

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
    first = (history[0]["ratio/min"], history[0]["ratio/max"])
    per_step = [flops / m["time/update"] for flops, m in zip(clock.flops, history)]
    tflops = float(np.mean(per_step[1:] if len(per_step) > 1 else per_step)) / 1e12  # after the warm-up step
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
        "update_flops_per_step": float(np.mean(clock.flops)), "update_tflops": tflops,
        "update_fraction_of_peak": None if peak is None else tflops / peak,
        "first_step_ratio_min": first[0], "first_step_ratio_max": first[1],
        "first_step_ratio_ok": bool(max(abs(r - 1) for r in first) <= RATIO_TOLERANCE),
        "first_reward": history[0]["reward"], "final_reward": history[-1]["reward"],
        "eval_accuracy": eval_accuracy,
        "all_metrics_finite": all(math.isfinite(v) for v in numbers),
        "parameters_on_device": on_device,
    }


def table(report: dict) -> str:
    env, sampling, run = report["environment"], report.get("sampling", {}), report.get("grpo", {})
    tests = report.get("tests")
    peak = run.get("peak_memory_mib")
    fraction = run.get("update_fraction_of_peak")
    rows = [
        ("device", f"{env['device_name']} ({env['device']})"),
        ("torch / CUDA / transformers", f"{env['torch']} / {env['torch_cuda']} / {env['transformers']}"),
        ("CUDA tests", "not run" if tests is None else
         f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, {tests.get('skipped', 0)} skipped"
         f" (exit {tests['returncode']})"),
        ("sampling, tokens/s", f"{sampling['tokens_per_second']:,.0f}  ({sampling['rows']} rows, "
                               f"{sampling['max_new_tokens']} new tokens at most, {run['precision']})"),
        ("sampler vs learner log-prob", f"mean {sampling['sampler_learner_gap_mean']:.1e}, "
                                        f"99th percentile {sampling['sampler_learner_gap_q99']:.1e}, "
                                        f"max {sampling['sampler_learner_gap_max']:.1e}"),
        ("first step's ratios", f"[{run['first_step_ratio_min']:.6f}, {run['first_step_ratio_max']:.6f}]  "
                                f"({'OK' if run['first_step_ratio_ok'] else 'FAILED'}: 1 within {RATIO_TOLERANCE:g})"),
        ("GRPO s/step: generate", f"{run['seconds_generate']:.3f}"),
        ("GRPO s/step: score", f"{run['seconds_score']:.3f}"),
        ("GRPO s/step: update", f"{run['seconds_update']:.3f}"),
        ("GRPO s/step: wall", f"{run['seconds_per_step']:.3f}  (first step {run['seconds_first_step']:.2f})"),
        ("peak GPU memory", "n/a on the CPU" if peak is None else f"{peak:,.0f} MiB"),
        ("update, TFLOP/s", f"{run['update_tflops']:.4g}" + ("" if fraction is None else
                                                             f"  ({100 * fraction:.2g} % of the peak)")),
        ("GPU peak", report["peak"]),
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
    if args.cpu_bf16 and device.type != "cpu":
        print("gpu_check: --cpu-bf16 emulates CUDA's bf16 on the CPU; it needs --device cpu", file=sys.stderr)
        return 2

    from rlbook.checkpoints import RECIPES, load_base_policy

    report = {"environment": environment(device), "tests": None}
    if device.type == "cuda" and not args.skip_tests:
        report["tests"] = run_cuda_tests()
    recipe = RECIPES["arithmetic"]
    task = recipe.make_task()
    model, tokenizer = load_base_policy("arithmetic", device=device)
    max_new_tokens = recipe.sft.max_new_tokens
    peak, report["peak"] = peak_tflops(device, args.peak_tflops)
    emulation = torch.autocast("cpu", dtype=torch.bfloat16) if args.cpu_bf16 else contextlib.nullcontext()
    with emulation:
        if args.smoke:
            report["sampling"] = sampling_throughput(model, tokenizer, task, device, 4, 2, max_new_tokens, 1)
            report["grpo"] = grpo_run(model, tokenizer, task, device, steps=2, batch_size=8, num_generations=4,
                                      max_completion_length=max_new_tokens, eval_size=8, peak=peak)
        else:
            report["sampling"] = sampling_throughput(model, tokenizer, task, device, 64, 8, max_new_tokens, 3)
            report["grpo"] = grpo_run(model, tokenizer, task, device, steps=args.steps, batch_size=64,
                                      num_generations=8, max_completion_length=max_new_tokens, eval_size=256,
                                      peak=peak)
    tests_ok = report["tests"] is None or report["tests"]["returncode"] == 0
    run_ok = report["grpo"]["all_metrics_finite"] and report["grpo"]["parameters_on_device"]
    ratio_ok = report["grpo"]["first_step_ratio_ok"]
    report["ok"] = bool(tests_ok and run_ok and ratio_ok)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(f"written to {args.out}; {'OK' if report['ok'] else 'FAILED'}"
          + ("" if tests_ok else ": the CUDA tests failed") + ("" if run_ok else ": the run is not finite/on device")
          + ("" if ratio_ok else f": the first step's ratios are not 1 within {RATIO_TOLERANCE:g}"))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
