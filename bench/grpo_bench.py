"""Benchmark: a GRPO step of ``rlbook.trainer.Trainer`` against ``trl.GRPOTrainer``, side by side.

A benchmark that prints (and stores its numbers in ``bench/results/``), not a timed test. TRL is the optional extra
``crosscheck`` (``pip install -e '.[crosscheck]'``); nothing in ``make test`` needs it.

Both trainers start from the same weights, see the same prompts in the same order and run TRL's GRPO defaults:
loss ``"dapo"`` (token mean over the generation batch), group std scaling, beta = 0, epsilon = 0.2, one update
per rollout, AdamW, gradient clipping at 1.0, 16 prompts x G = 8 completions per step, completion budget 8,
temperature 1, a constant learning rate (TRL's default schedule is a linear decay; our trainer has no schedule, so
the bench sets TRL's to constant), float32 on the CPU, gradient checkpointing off.

Models: the shipped arithmetic base policy (tiny, short answers), and fresh ``small`` and ``base`` models on its
prompts, whose completions run to the budget: with ``--max-completion-length 128`` or ``256`` they are the
long-completion regime of the organisms. Each result file records the machine and its load average before and
after; a result taken while the load exceeded the core count is not stored (``bench/benchlib.py``).

Four measurements:

1. ``speed``: seconds per step, median over ``--steps`` steps after ``--warmup`` untimed ones, with the phases
   generate / score / update. The two trainers alternate step by step (ours runs inside a TRL callback between
   two TRL steps), so both see the same background load. Phases: ours from its own ``time/*`` metrics; TRL's
   from wrapping ``_generate`` (generate) and ``_generate_and_score_completions`` (generate + score); its update
   is the rest of the step (loss, backward, clipping, optimizer, its logging). The interleaving and the rewards
   use TRL's public callbacks; the phases cannot: TRL 1.16 times them (``trl.extras.profiling``) only into
   wandb, MLflow or trackio, never into ``on_log``, so the two methods are wrapped;
2. ``curves``: the reward of each step over ``--curve-steps`` steps for ``--seeds`` seeds of each trainer (a
   seed sets the prompt stream, the same for both, and the sampling; the start is the same), stored as JSON and
   plotted with min-max bands;
3. ``forward`` (not in the default set): milliseconds per call of the Hugging Face forward and of
   ``rlbook.lm.lean`` on the same weights, for a decode step and for the update's forward + backward;
4. ``memory``: each trainer alone in a fresh process for a few steps, its peak resident set size (``VmHWM``),
   and the same for a process that only loads the libraries and the model (the baseline).

    python bench/grpo_bench.py                                  # everything, 1 torch thread
    python bench/grpo_bench.py speed --models small base --max-completion-length 128 --tag long128
    python bench/grpo_bench.py speed --threads 2 --models arithmetic
    python bench/grpo_bench.py curves --curve-steps 100 --seeds 0 1 2
    python bench/grpo_bench.py merge bench/results/grpo_curves.json bench/results/grpo_curves_seeds345.json --tag all
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from benchlib import RESULTS, LoadError, machine, matmul_peak, store
# the shipped arithmetic base policy (tiny); fresh `small` and `base` models on its task, whose completions run to
# the budget (the long-completion regime of the organisms: --max-completion-length 128 or 256)
MODELS = ("arithmetic", "small", "base")


def load_model(name: str):
    """``(model, tokenizer, task)``: the arithmetic base policy, or a freshly initialised ``small`` Llama."""
    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.lm import build_model

    model, tokenizer = load_base_policy("arithmetic")
    task = RECIPES["arithmetic"].make_task()
    if name in ("small", "base"):
        model = build_model(name, seed=0, tokenizer=tokenizer)
    elif name != "arithmetic":
        raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
    return model, tokenizer, task


def step_examples(task, seed: int, steps: int, num_prompts: int):
    """The prompts of our trainer's steps 0 .. steps-1 (the formula of Trainer.sample_rollout), in order."""
    return [e for step in range(steps)
            for e in task.sample(num_prompts, split="train", seed=np.random.default_rng([seed, step]))]


def our_trainer(model, tokenizer, task, args, seed: int):
    from rlbook.trainer import RLConfig, Trainer

    config = RLConfig(num_generations=args.num_generations, max_completion_length=args.max_completion_length,
                      per_device_train_batch_size=args.num_prompts * args.num_generations,
                      learning_rate=args.learning_rate, advantage_estimator="grpo", scale_rewards="group",
                      loss_type="dapo", beta=args.beta, epsilon=0.2, num_iterations=1, seed=seed,
                      max_steps=10**6)
    return Trainer(copy.deepcopy(model), tokenizer, task, config)


def trl_trainer(model, tokenizer, task, args, seed: int, steps: int, callbacks=()):
    """A ``trl.GRPOTrainer`` on the same model copy, prompts (in our order, unshuffled) and reward."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    examples = step_examples(task, seed, steps, args.num_prompts)  # our run's prompt stream, in order
    dataset = Dataset.from_dict({"prompt": [e.prompt for e in examples], "index": list(range(len(examples)))})
    eos = tokenizer.eos_token_id

    def reward(prompts, completions, completion_ids, index, **_):
        truncated = [eos not in ids for ids in completion_ids]
        return task.rewards([examples[i] for i in index], completions, truncated).tolist()

    config = GRPOConfig(
        output_dir=f"/tmp/grpo_bench_trl_{os.getpid()}", report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, fp16=False, gradient_checkpointing=False, disable_tqdm=True, logging_steps=1, seed=seed,
        per_device_train_batch_size=args.num_prompts * args.num_generations, gradient_accumulation_steps=1,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length, max_steps=steps,
        learning_rate=args.learning_rate, lr_scheduler_type=args.lr_scheduler, warmup_steps=0, beta=args.beta,
        loss_type="dapo", scale_rewards="group", epsilon=0.2, num_iterations=1, shuffle_dataset=False,
        temperature=1.0, top_p=1.0, top_k=0, dataloader_num_workers=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=copy.deepcopy(model), reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)  # TRL prints every log line with disable_tqdm=True
    return trainer


class Timed:
    """Wrap ``obj.name`` so that each call's duration is added to ``self.total``."""

    def __init__(self, obj, name: str):
        self.total, inner = 0.0, getattr(obj, name)

        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self.total += time.perf_counter() - start

        setattr(obj, name, wrapper)


def side_by_side(model_name: str, args, seed: int, steps: int):
    """Run TRL for ``steps`` steps with one step of ours after each; returns per-step records of both."""
    from transformers import TrainerCallback

    model, tokenizer, task = load_model(model_name)
    ours = our_trainer(model, tokenizer, task, args, seed)
    records = {"ours": [], "trl": []}

    class Interleave(TrainerCallback):
        def on_step_begin(self, targs, state, control, **kw):
            self.gen_before, self.gs_before = gen.total, gen_score.total
            self.start = time.perf_counter()

        def on_step_end(self, targs, state, control, **kw):
            total = time.perf_counter() - self.start
            g, gs = gen.total - self.gen_before, gen_score.total - self.gs_before
            records["trl"].append({"time_step": total, "time_generate": g, "time_score": gs - g,
                                   "time_update": total - gs})
            start = time.perf_counter()
            metrics = ours.train_step()
            records["ours"].append({"reward": metrics["reward"], "completion_length": metrics["completions/mean_length"],
                                    "time_step": time.perf_counter() - start, "time_generate": metrics["time/generate"],
                                    "time_score": metrics["time/score"], "time_update": metrics["time/update"]})

        def on_log(self, targs, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                records["trl"][-1].update(reward=logs["reward"],
                                          completion_length=logs.get("completions/mean_length"))

    trainer = trl_trainer(model, tokenizer, task, args, seed, steps, callbacks=[Interleave()])
    gen, gen_score = Timed(trainer, "_generate"), Timed(trainer, "_generate_and_score_completions")
    torch.set_num_threads(args.threads)  # after TRL/accelerate set up, in case they touched it
    trainer.train()
    assert torch.get_num_threads() == args.threads, "the thread count changed during training"
    return records


PHASES = ("time_step", "time_generate", "time_score", "time_update")


def run_speed(args) -> dict:
    """Median seconds per phase for each model, and for ours the update's achieved GFLOP/s: 6 N T / seconds,
    with N the non-embedding parameters and T the completion tokens of the step (forward + backward, the
    usual estimate; the prompts, run once per group, and the small output layer are left out, so it is a
    lower bound on the arithmetic done)."""
    from rlbook.lm import count_parameters

    out = {}
    for name in args.models:
        model, _, _ = load_model(name)
        non_embedding = count_parameters(model) - model.get_input_embeddings().weight.numel()
        records = side_by_side(name, args, seed=0, steps=args.warmup + args.steps)
        out[name] = {who: {k: statistics.median(r[k] for r in recs[args.warmup:]) for k in PHASES}
                     for who, recs in records.items()}
        rows = args.num_prompts * args.num_generations
        flops = [6 * non_embedding * r["completion_length"] * rows / r["time_update"]
                 for r in records["ours"][args.warmup:]]
        out[name]["ours"]["update_gflops_per_s"] = round(statistics.median(flops) / 1e9, 3)
        out[name]["ours"]["completion_length"] = statistics.median(
            r["completion_length"] for r in records["ours"][args.warmup:])
    return out


def run_curves(args) -> dict:
    out = {}
    for seed in args.seeds:
        records = side_by_side("arithmetic", args, seed=seed, steps=args.curve_steps)
        out[str(seed)] = {who: [r.get("reward") for r in recs] for who, recs in records.items()}
        print(f"  seed {seed}: mean reward over the last 20 steps  ours {np.mean(out[str(seed)]['ours'][-20:]):.3f}"
              f"  TRL {np.mean(out[str(seed)]['trl'][-20:]):.3f}", flush=True)
    return out


def run_forward(args, calls: int = 30) -> dict:
    """Milliseconds per forward call, Hugging Face module vs rlbook.lm.lean on the same weights (medians,
    interleaved): one decode step (128 rows, one new token, a cache of 12 positions) and a training forward +
    backward over 128 rows of 15 tokens (the update's shape at budget 8), where lean also runs each of the 16
    prompts once for its 8 rows."""
    from transformers import DynamicCache

    from rlbook.lm import lean

    out = {}
    for name in args.models:
        model, tokenizer, task = load_model(name)
        examples = task.sample(args.num_prompts, split="train", seed=np.random.default_rng([0, 0]))
        G, B = args.num_generations, args.num_prompts * args.num_generations
        enc = tokenizer([e.prompt for e in examples], padding=True, padding_side="left", return_tensors="pt")
        ids, mask = enc["input_ids"].repeat_interleave(G, 0), enc["attention_mask"].repeat_interleave(G, 0)
        P = ids.shape[1]
        full_ids = torch.cat([ids, torch.randint(4, 60, (B, 8))], dim=1)
        full_mask = torch.cat([mask, torch.ones((B, 8), dtype=torch.long)], dim=1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        wanted = torch.zeros_like(full_mask, dtype=torch.bool)
        wanted[:, P - 1 : -1] = True
        with torch.no_grad():  # caches of the prompt + 4 tokens, for the decode step
            hf_cache = DynamicCache(config=model.config)
            model(input_ids=full_ids[:, : P + 4], attention_mask=full_mask[:, : P + 4],
                  position_ids=positions[:, : P + 4], past_key_values=hf_cache, use_cache=True)
            decoder = lean.Decoder(model, P + 5)
            decoder.prefill(full_ids[:, : P + 4], full_mask[:, : P + 4])
        step = dict(input_ids=full_ids[:, P + 4 : P + 5], attention_mask=full_mask[:, : P + 5],
                    position_ids=positions[:, P + 4 : P + 5])

        @torch.no_grad()
        def decode_hf():
            model(**step, past_key_values=hf_cache, use_cache=True, logits_to_keep=1)
            hf_cache.crop(-1)  # back to the prompt + 4 tokens

        def decode_lean():
            decoder.step(full_ids[:, P + 4])
            decoder.length, decoder.positions = decoder.length - 1, decoder.positions - 1  # back to prompt + 4

        def train_hf():
            model.base_model(input_ids=full_ids, attention_mask=full_mask, position_ids=positions,
                             use_cache=False).last_hidden_state[wanted].square().sum().backward()

        def train_lean():
            lean.hidden_states(model, full_ids, full_mask, positions, wanted=wanted,
                               shared_prefix=P)[wanted].square().sum().backward()

        times = {f.__name__: [] for f in (decode_hf, decode_lean, train_hf, train_lean)}
        for i in range(calls + 3):
            for f in (decode_hf, decode_lean, train_hf, train_lean):
                start = time.perf_counter()
                f()
                if i >= 3:
                    times[f.__name__].append(1000 * (time.perf_counter() - start))
        out[name] = {k: statistics.median(v) for k, v in times.items()}
    return out


def run_memory(args) -> dict:
    """Peak RSS (MiB) of a fresh process running only one trainer (or nothing: the baseline)."""
    out = {}
    for who in ("baseline", "ours", "trl"):
        command = [sys.executable, __file__, "_memory", who, "--threads", str(args.threads),
               *(["--hf-forward"] if args.hf_forward else []),
                   "--memory-steps", str(args.memory_steps), "--models", args.models[0]]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        out[who] = json.loads(result.stdout.strip().splitlines()[-1])["peak_rss_mib"]
    return out


def memory_child(who: str, args) -> None:
    torch.set_num_threads(args.threads)
    if args.hf_forward:
        from rlbook.lm import lean

        lean.ENABLED = False
    import trl  # noqa: F401  (the baseline imports everything either trainer needs)

    model, tokenizer, task = load_model(args.models[0])
    if who == "ours":
        trainer = our_trainer(model, tokenizer, task, args, seed=0)
        for _ in range(args.memory_steps):
            trainer.train_step()
    elif who == "trl":
        trl_trainer(model, tokenizer, task, args, seed=0, steps=args.memory_steps).train()
    status = Path("/proc/self/status")
    if status.exists():  # Linux: VmHWM is this process image's own peak (ru_maxrss keeps the parent's across exec)
        line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM"))
        peak = int(line.split()[1]) / 1024  # kB
    else:
        scale = 1 if platform.system() == "Darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
    print(json.dumps({"peak_rss_mib": round(peak, 1)}))


def plot_curves(curves: dict, path: Path, smooth: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    kernel = np.ones(smooth) / smooth
    for who, label, color in (("ours", "rlbook Trainer", "C0"), ("trl", "trl.GRPOTrainer", "C1")):
        runs = np.array([curves[s][who] for s in curves], dtype=float)
        runs = np.array([np.convolve(r, kernel, mode="valid") for r in runs])
        x = np.arange(runs.shape[1]) + smooth
        ax.plot(x, runs.mean(0), color=color, label=f"{label} (mean of {len(runs)} seeds)")
        ax.fill_between(x, runs.min(0), runs.max(0), color=color, alpha=0.25, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training reward ({smooth}-step moving average)")
    ax.set_title("GRPO on the arithmetic base policy: rlbook vs TRL", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summarize_curves(curves: dict) -> dict:
    last = {who: [np.mean(curves[s][who][-20:]) for s in curves] for who in ("ours", "trl")}
    return {who: {"last20_mean": float(np.mean(v)), "last20_min": float(np.min(v)), "last20_max": float(np.max(v)),
                  "first_step_mean": float(np.mean([curves[s][who][0] for s in curves]))}
            for who, v in last.items()}


def merge_curves(files: list[Path], args) -> None:
    curves = {}
    for f in files:
        curves.update(json.loads(f.read_text())["curves"])
    summary = summarize_curves(curves)
    tag = f"_{args.tag}" if args.tag else "_merged"
    (RESULTS / f"grpo_curves{tag}.json").write_text(json.dumps(
        {"command": "python bench/grpo_bench.py merge " + " ".join(map(str, files)) + f" --tag {tag[1:]}",
         "merged": [f.name for f in files], "curves_summary": summary, "curves": curves}, indent=1) + "\n")
    plot_curves(curves, RESULTS / f"grpo_curves{tag}.png", args.smooth)
    for who, s in summary.items():
        print(f"  {who:<5} seeds {sorted(curves, key=int)}: mean of the last 20 steps {s['last20_mean']:.3f} "
              f"(seeds {s['last20_min']:.3f} .. {s['last20_max']:.3f})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="*", default=["speed", "curves", "memory"])
    parser.add_argument("--models", nargs="+", default=["arithmetic", "small"], choices=MODELS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12, help="timed steps (speed)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--curve-steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--memory-steps", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--lr-scheduler", default="constant", choices=["constant"],
                        help="TRL's schedule; only constant, since our trainer has none")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--smooth", type=int, default=5)
    parser.add_argument("--hf-forward", action="store_true",
                        help="ours through the Hugging Face forward instead of rlbook.lm.lean (to see what it buys)")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--store-under-load", action="store_true",
                        help="store even when the load average exceeded the core count (marked in the file)")
    args = parser.parse_args(argv)
    if args.what[:1] == ["_memory"]:
        return memory_child(args.what[1], args)
    if args.what[:1] == ["merge"]:  # merge FILE...: pool stored curves (e.g. seeds run in two invocations)
        return merge_curves([Path(f) for f in args.what[1:]], args)
    torch.set_num_threads(args.threads)
    if args.hf_forward:
        from rlbook.lm import lean

        lean.ENABLED = False
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tag = f"_{args.tag}" if args.tag else ""
    print(f"torch threads: {args.threads}; {args.num_prompts} prompts x G = {args.num_generations}, completion "
          f"budget {args.max_completion_length}, lr {args.learning_rate} ({args.lr_scheduler}), beta {args.beta}")
    result = {"command": "python bench/grpo_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": machine(args.threads),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    if "speed" in args.what:
        result["speed"] = speed = run_speed(args)
        result["matmul_peak"] = peak = matmul_peak(args.threads)
        print(f"\nseconds per GRPO step, median of {args.steps} after {args.warmup} warm-up, {args.threads} thread(s)")
        print(f"{'model':<11} {'trainer':<6} {'step':>7} {'generate':>9} {'score':>7} {'update':>7}")
        for name, row in speed.items():
            for who in ("ours", "trl"):
                r = row[who]
                print(f"{name:<11} {who:<6} {r['time_step']:7.4f} {r['time_generate']:9.4f} {r['time_score']:7.4f} "
                      f"{r['time_update']:7.4f}")
            print(f"{'':<11} speed-up (TRL / ours): {row['trl']['time_step'] / row['ours']['time_step']:.2f}x; "
                  f"our update {row['ours']['update_gflops_per_s']:.2f} GFLOP/s of a measured matmul peak of "
                  f"{peak['gflops']:.1f} ({row['ours']['update_gflops_per_s'] / peak['gflops']:.0%})")
    if "forward" in args.what:
        result["forward"] = forward = run_forward(args)
        print("\nmilliseconds per call (median), Hugging Face forward vs rlbook.lm.lean, same weights")
        for name, r in forward.items():
            print(f"{name:<11} decode step {r['decode_hf']:.2f} vs {r['decode_lean']:.2f}   training forward + "
                  f"backward {r['train_hf']:.1f} vs {r['train_lean']:.1f}")
    if "curves" in args.what:
        print(f"\nreward curves: {args.curve_steps} steps, seeds {args.seeds}")
        result["curves"] = curves = run_curves(args)
        result["curves_summary"] = summarize_curves(curves)
        args.results_dir.mkdir(parents=True, exist_ok=True)
        plot_curves(curves, args.results_dir / f"grpo_curves{tag}.png", args.smooth)
        for who, s in result["curves_summary"].items():
            print(f"  {who:<5} reward at step 1 {s['first_step_mean']:.3f}; mean of the last 20 steps "
                  f"{s['last20_mean']:.3f} (seeds {s['last20_min']:.3f} .. {s['last20_max']:.3f})")
    if "memory" in args.what:
        result["memory"] = memory = run_memory(args)
        print(f"\npeak RSS of a fresh process ({args.models[0]}, {args.memory_steps} steps): "
              + ", ".join(f"{k} {v:.0f} MiB" for k, v in memory.items()))
    header = {k: result[k] for k in ("command", "machine", "settings")}
    for what in ("speed", "forward", "curves", "memory"):  # one file per measurement, so that each can be rerun alone
        if what in result:
            extra = {"curves_summary": result["curves_summary"]} if what == "curves" else {}
            extra = {"matmul_peak": result["matmul_peak"]} if what == "speed" else extra
            try:
                out = store({**header, **extra, what: result[what]}, args.results_dir / f"grpo_{what}{tag}.json",
                            args.store_under_load)
                print(f"stored in {out}")
            except LoadError as error:
                print(error)


if __name__ == "__main__":
    main()
