"""Where the repository's stored experiment results are, for chapters that plot them, and how scripts write them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable


def experiment_results_dir() -> Path:
    """``experiments/results`` of the rlbook checkout.

    Looked for above the current folder first (a chapter runs from ``book/<part>`` or ``notebooks/<part>``), then
    above the installed package (``src/rlbook`` in an editable install), so that a notebook copied elsewhere (the
    student edition) finds the results too.
    """
    for start in (Path.cwd().resolve(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            if (folder / "experiments" / "results").is_dir():
                return folder / "experiments" / "results"
    raise FileNotFoundError("experiments/results was not found above the current folder or the rlbook package: "
                            "run the chapter from a clone of the repository (pip install -e .)")


def write_results(path: Path, run: Callable[[], dict]) -> dict:
    """Call ``run()``, record its wall time (seconds, one decimal) as ``"seconds"``, write the result to ``path`` as
    JSON (indent 1, creating the folder) and return it: the tail of every experiments/ script."""
    start = time.perf_counter()
    result = run()
    result["seconds"] = round(time.perf_counter() - start, 1)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path} in {result['seconds']} s")
    return result
