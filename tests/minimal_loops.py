"""The chapters' minimal loops, read from the chapter sources (issue: the loop a learner can hold in their head).

A chapter's minimal loop is one visible code cell tagged ``minimal-loop`` in ``book/<part>/<chapter>.md``: it
imports what it uses and defines functions only (the short training run that uses them is the next cell). A test
executes exactly that cell's code, so the book's loop and the loop the equality test checks are one text."""

from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parents[1]


def minimal_loop_source(chapter: str) -> str:
    """The code of the cell tagged ``minimal-loop`` in ``book/<chapter>.md`` (``chapter`` like "part4/grpo")."""
    notebook = jupytext.read(ROOT / "book" / f"{chapter}.md")
    found = [c.source for c in notebook.cells
             if c.cell_type == "code" and "minimal-loop" in c.metadata.get("tags", [])]
    if len(found) != 1:
        raise AssertionError(f"book/{chapter}.md has {len(found)} cells tagged minimal-loop (want exactly one)")
    return found[0]


def load_minimal_loop(chapter: str) -> dict:
    """Execute the chapter's minimal-loop cell in a fresh namespace and return the namespace."""
    namespace: dict = {"__name__": f"minimal_loop_{chapter.replace('/', '_')}"}
    exec(compile(minimal_loop_source(chapter), f"book/{chapter}.md:minimal-loop", "exec"), namespace)
    return namespace


def check_torch_only(chapter: str, max_lines: int = 85) -> None:
    """The chapter's loop is one short cell that imports torch alone; the policy, its tokenizer and its task
    come in as arguments (the issue: "about 80 lines at most, using only torch")."""
    import re

    source = minimal_loop_source(chapter)
    lines = len(source.strip().splitlines())
    assert lines <= max_lines, f"book/{chapter}.md: the minimal loop has {lines} lines (about 80 at most)"
    modules = {m.split(".")[0] for m in re.findall(r"^\s*(?:import|from)\s+([\w.]+)", source, re.M)}
    assert modules <= {"torch"}, f"book/{chapter}.md: the minimal loop imports {sorted(modules - {'torch'})}"
    assert "rlbook" not in source, f"book/{chapter}.md: the loop names rlbook; pass its pieces in as arguments"
