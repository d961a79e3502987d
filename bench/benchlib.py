"""What both benchmarks record about the machine, and the rule for storing a result: not under load.

A timing taken while other processes compete for the cores measures the competition. Each benchmark records the
load average before and after its runs, and :func:`store` refuses to write a result whose load average (the
larger of the two one-minute readings) exceeded the number of cores, unless the caller says so
(``--store-under-load``, for smoke tests), in which case the file says ``"under_load": true``.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def machine(threads: int) -> dict:
    """The facts a reader needs to compare a stored timing with their own."""
    import transformers

    facts = {"torch": torch.__version__, "transformers": transformers.__version__, "threads": threads,
             "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
             "load_average_1min_before": round(os.getloadavg()[0], 2)}
    try:
        import trl

        facts["trl"] = trl.__version__
    except ImportError:
        pass
    return facts


class LoadError(RuntimeError):
    """The machine was busy while the benchmark ran: its timings are not stored."""


def store(result: dict, path: Path, store_under_load: bool = False) -> Path:
    """Write ``result`` (with ``result["machine"]`` from :func:`machine`) to ``path`` as JSON, after recording
    the load average now; refuse (:class:`LoadError`) when the load exceeded the core count."""
    facts = result["machine"]
    facts["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    load = max(facts["load_average_1min_before"], facts["load_average_1min_after"])
    facts["under_load"] = load > facts["cores"]
    if facts["under_load"] and not store_under_load:
        raise LoadError(f"not storing {path.name}: the load average reached {load:.2f} on {facts['cores']} cores "
                        f"during the run; rerun on an idle machine (or pass --store-under-load)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def matmul_peak(threads: int, shapes=((1024, 384, 1152), (2048, 128, 512), (512, 512, 512)),
                seconds: float = 0.5) -> dict:
    """This machine's float32 matrix-multiply throughput at ``threads`` threads, GFLOP/s: the best of
    ``torch.mm`` of (m, k) @ (k, n) for each shape (the update's shapes: rows x hidden x intermediate), each
    repeated for about ``seconds``. The ceiling that a compute-bound phase is compared with."""
    import time

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = {}
        for m, k, n in shapes:
            a, b = torch.randn(m, k), torch.randn(k, n)
            torch.mm(a, b)
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                torch.mm(a, b)
                calls += 1
            best[f"{m}x{k}x{n}"] = round(2 * m * k * n * calls / (time.perf_counter() - start) / 1e9, 2)
        return {"gflops": max(best.values()), "by_shape": best, "threads": threads}
    finally:
        torch.set_num_threads(before)
