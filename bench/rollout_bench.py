"""Benchmark: rollout throughput of ``rlbook.rollout.generate_rollouts`` against ``model.generate(do_sample=True)``.

For each model size, on the same model and the same batch (N prompts x G completions, one batch of N*G rows):

- rollout tokens/s of our sampler and of ``model.generate``, and their ratio (the speed-up);
- tokens/s of the log-prob pass ``sequence_logprobs`` (no grad, as for a reference model);
- peak memory of each phase: CUDA ``max_memory_allocated`` on a GPU; on a CPU the peak resident set size of the
  process (Linux ``VmHWM``, reset before each phase; elsewhere ``ru_maxrss``, the peak since the process started).

Tokens counted are completion tokens up to and including the first EOS (what the loss uses), for both samplers.
Each sampler runs ``--warmup`` times untimed, then ``--repeats`` times, interleaved with the other so that both
see the same background load; we report the median.

Three scenarios:

- ``random``: a freshly initialised model. EOS has probability about 1/62 per token, so about half the rows
  run to ``max_new_tokens``;
- ``eos``: the same weights, the EOS logit scaled by ``--eos-boost``, so completions end at varied lengths, as a trained policy's do.
  Here dropping finished rows from the batch (which ``generate`` does not do) pays off;
- ``trained``: the shipped base policies (``rlbook.checkpoints``, tiny size) on their own tasks' prompts: the
  setting every RL chapter runs in.

    python bench/rollout_bench.py               # tiny, small, base on the default device
    python bench/rollout_bench.py --sizes tiny --threads 1 --max-new-tokens 64
    # + log-probs at Qwen2.5's vocabulary:
    python bench/rollout_bench.py --device cuda --bf16 --big-vocab 151936
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers.utils import logging as hf_logging

from benchlib import RESULTS, LoadError, machine, store

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.lm import MODEL_SIZES, autocast, build_model, build_tokenizer, count_parameters, default_device
from rlbook.rollout import generate_rollouts, sequence_logprobs


def make_prompts(n: int) -> list[str]:
    """n arithmetic prompts of different lengths (so the batch really is left-padded)."""
    return [f"{7 ** i % 1000}+{(13 * i) ** 2}=" if i % 2 else f"q{i}: {i}*{i + 3}=" for i in range(n)]


class PeakMemory:
    """Peak memory of a phase, in MiB: CUDA allocator peak, or the process's peak RSS on a CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.linux = platform.system() == "Linux" and os.path.exists("/proc/self/clear_refs")
        if device.type == "cuda":
            self.what = "CUDA max_memory_allocated"
        elif self.linux:
            self.what = "process peak RSS (Linux VmHWM, reset before each phase; includes Python, torch and weights)"
        else:
            self.what = "process peak RSS since start (ru_maxrss; cannot be reset per phase)"

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.linux:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets the peak resident set size (VmHWM) to the current one

    def peak_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.linux:
            with open("/proc/self/status") as f:
                return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / 2**20 if platform.system() == "Darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def completion_tokens(completion_ids: torch.Tensor, eos_id: int) -> int:
    """Number of tokens up to and including the first EOS in each row, summed (all of a row if it has none)."""
    is_eos = completion_ids == eos_id
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return int((~after_eos).sum())


def timed(fn, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def bench_one(model, tokenizer, prompts, args, device, memory: PeakMemory) -> dict:
    G, T = args.num_generations, args.max_new_tokens
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    encoded = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt").to(device)
    gen_inputs = {k: v.repeat_interleave(G, dim=0) for k, v in encoded.items()}
    P = gen_inputs["input_ids"].shape[1]

    def ours(seed):
        batch = generate_rollouts(model, tokenizer, prompts, num_generations=G, max_new_tokens=T, seed=seed,
                                  device=device, shrink_batch=not args.no_shrink)
        return batch, int(batch.lengths.sum())

    def theirs(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(**gen_inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=T, pad_token_id=pad_id, eos_token_id=eos_id)
        return out, completion_tokens(out[:, P:], eos_id)

    for w in range(args.warmup):  # on a GPU the first runs also plan kernels for each new shape
        ours(1000 + w), theirs(1000 + w)
    rates = {"ours": [], "generate": []}
    peaks = {"ours": 0.0, "generate": 0.0}
    for r in range(args.repeats):
        for name, fn in (("ours", ours), ("generate", theirs)):
            memory.reset()
            (_, tokens), seconds = timed(lambda: fn(r + 1), device)
            peaks[name] = max(peaks[name], memory.peak_mib())
            rates[name].append(tokens / seconds)

    batch, _ = ours(123)
    n_tokens = int(batch.lengths.sum())

    def logprob_pass():
        with torch.no_grad():
            return sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                     temperature=batch.temperature)

    for _ in range(args.warmup):
        logprob_pass()
    lp_rates, peaks["logprobs"] = [], 0.0
    for _ in range(args.repeats):
        memory.reset()
        _, seconds = timed(logprob_pass, device)
        peaks["logprobs"] = max(peaks["logprobs"], memory.peak_mib())
        lp_rates.append(n_tokens / seconds)

    ours_rate, gen_rate = statistics.median(rates["ours"]), statistics.median(rates["generate"])
    return {
        "ours": ours_rate,
        "generate": gen_rate,
        "speedup": ours_rate / gen_rate,
        "logprobs": statistics.median(lp_rates),
        "mean_len": float(batch.lengths.float().mean()),
        "truncated": float(batch.truncated.float().mean()),
        "peaks": peaks,
    }


def bench_big_vocab(args, device: torch.device, memory: PeakMemory) -> None:
    """The log-prob pass at a real vocabulary size: chunked ``sequence_logprobs`` against the plain recipe
    ``model(ids).logits.float().log_softmax(-1).gather(...)``, which holds (B, L, V) float32 logits (twice)."""
    V, B, P, T = args.big_vocab, args.big_vocab_batch, 64, args.big_vocab_tokens
    model = build_model("tiny", vocab_size=V, device=device)
    ids = torch.randint(4, V, (B, P + T), generator=torch.Generator().manual_seed(0)).to(device)
    attention_mask, completion_mask = torch.ones_like(ids), torch.ones((B, T), dtype=torch.long, device=device)

    def plain():
        logits = model(ids, attention_mask=attention_mask).logits[:, P - 1 : -1].float()
        return logits.log_softmax(-1).gather(-1, ids[:, P:, None]).squeeze(-1)

    def chunked():
        return sequence_logprobs(model, ids, attention_mask, completion_mask)

    print(f"\nlog-prob pass at vocabulary {V:,}: tiny body ({count_parameters(model):,} parameters, mostly the "
          f"embedding), {B} rows x ({P} prompt + {T} completion) tokens")
    with torch.no_grad():
        difference = (plain() - chunked()).abs().max().item()
    for name, fn in (("plain full-logits", plain), ("sequence_logprobs", chunked)):
        for grad in (False, True):
            context = contextlib.nullcontext() if grad else torch.no_grad()

            def run():
                with context:
                    out = fn()
                    if grad:
                        out.sum().backward()
                model.zero_grad(set_to_none=True)

            run()  # warm-up
            memory.reset()
            _, seconds = timed(run, device)
            print(f"  {name:18} {'forward+backward' if grad else 'no grad (reference)':20} {seconds * 1000:8.1f} ms  "
                  f"peak {memory.peak_mib():9,.0f} MiB")
    print(f"  max |difference| between the two: {difference:.2e}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small", "base"], choices=sorted(MODEL_SIZES))
    parser.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--num-generations", type=int, default=8, help="G, completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per sampler (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per sampler first")
    parser.add_argument("--scenarios", nargs="+", default=["random", "eos", "trained"], choices=["random", "eos", "trained"])
    parser.add_argument("--eos-boost", type=float, default=20.0, help="EOS logit scale in the 'eos' scenario")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-shrink", action="store_true", help="generate_rollouts(shrink_batch=False)")
    parser.add_argument("--bf16", action="store_true", help="run under rlbook.lm.autocast (bf16 on CUDA only)")
    parser.add_argument("--big-vocab", type=int, default=0, help="also time the log-prob pass at this vocabulary "
                        "size (151936 = Qwen2.5); needs GBs of memory for the plain recipe")
    parser.add_argument("--big-vocab-batch", type=int, default=32)
    parser.add_argument("--big-vocab-tokens", type=int, default=512, help="completion tokens per row")
    parser.add_argument("--out", type=Path, default=RESULTS / "rollout_bench.json",
                        help="where the table is stored (JSON); refused when the machine was loaded")
    parser.add_argument("--store-under-load", action="store_true",
                        help="store even when the load average exceeded the core count (marked in the file)")
    args = parser.parse_args(argv)

    hf_logging.set_verbosity_error()  # generate() warns about settings we choose on purpose
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else default_device()
    memory = PeakMemory(device)
    facts = machine(torch.get_num_threads())
    tokenizer = build_tokenizer()
    prompts = make_prompts(args.num_prompts)
    rows = []
    B = args.num_prompts * args.num_generations

    print(f"rlbook rollout benchmark: device={device}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {torch.get_num_threads()} CPU threads, arch={args.arch}")
    print(f"batch: {args.num_prompts} prompts x G={args.num_generations} = {B} rows, max_new_tokens="
          f"{args.max_new_tokens}; median of {args.repeats} runs after {args.warmup} warm-up; "
          "tokens = completion tokens up to and including EOS")
    precision = "bf16 autocast" if args.bf16 and device.type == "cuda" else "float32"
    print(f"peak memory: {memory.what}; precision: {precision}")
    header = (f"{'model':22} {'params':>10} {'scenario':8} {'mean len':>8} {'trunc':>5} {'ours tok/s':>10} "
              f"{'generate tok/s':>14} {'speed-up':>8} {'logprob tok/s':>13} {'peak MiB ours/gen/logprob':>26}")
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        for scenario in args.scenarios:
            if scenario == "trained":
                continue  # below, once: the shipped policies have one size
            model = build_model(size, arch=args.arch, seed=0, tokenizer=tokenizer, device=device)
            if scenario == "eos":  # (tied, so the EOS input embedding grows too: it only feeds discarded steps)
                with torch.no_grad():
                    model.get_output_embeddings().weight[tokenizer.eos_token_id] *= args.eos_boost
            with autocast(device) if args.bf16 else contextlib.nullcontext():
                r = bench_one(model, tokenizer, prompts, args, device, memory)
            peaks = "/".join(f"{r['peaks'][k]:.0f}" for k in ("ours", "generate", "logprobs"))
            rows.append({"model": size, "parameters": count_parameters(model), "scenario": scenario, **r})
            print(f"{size:22} {count_parameters(model):>10,} {scenario:8} {r['mean_len']:>8.1f} {r['truncated']:>5.2f} "
                  f"{r['ours']:>10,.0f} {r['generate']:>14,.0f} {r['speedup']:>7.2f}x {r['logprobs']:>13,.0f} "
                  f"{peaks:>26}")
    if "trained" in args.scenarios:
        for name, recipe in sorted(RECIPES.items()):
            model, tokenizer = load_base_policy(name, device=device)
            task = recipe.make_task()
            task_prompts = [e.prompt for e in task.sample(args.num_prompts, seed=0)]
            with autocast(device) if args.bf16 else contextlib.nullcontext():
                r = bench_one(model, tokenizer, task_prompts, args, device, memory)
            peaks = "/".join(f"{r['peaks'][k]:.0f}" for k in ("ours", "generate", "logprobs"))
            label = f"{recipe.size}:{name}"
            rows.append({"model": label, "parameters": count_parameters(model), "scenario": "trained", **r})
            print(f"{label:22} {count_parameters(model):>10,} {'trained':8} {r['mean_len']:>8.1f} {r['truncated']:>5.2f} "
                  f"{r['ours']:>10,.0f} {r['generate']:>14,.0f} {r['speedup']:>7.2f}x {r['logprobs']:>13,.0f} "
                  f"{peaks:>26}")
    if args.big_vocab:
        with autocast(device) if args.bf16 else contextlib.nullcontext():
            bench_big_vocab(args, device, memory)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"command": "python bench/rollout_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": {**facts, "device": str(device), "precision": precision}, "settings": settings,
              "memory": memory.what, "rows": rows}
    try:
        print(f"stored in {store(result, args.out, args.store_under_load)}")
    except LoadError as error:
        print(error)


if __name__ == "__main__":
    main()
