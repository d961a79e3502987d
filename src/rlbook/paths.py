"""Where the repository's stored experiment results are, for the chapters that plot them."""

from __future__ import annotations

from pathlib import Path


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

