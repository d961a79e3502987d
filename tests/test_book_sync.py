"""Every chapter's text source (book/*.md) and its executed twin (notebooks/*.ipynb) hold the same cells."""

from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for p in (ROOT / "book").rglob("*.md") if "kernelspec:" in p.read_text().split("\n---", 1)[0])
# Jupyter writes autosave copies into .ipynb_checkpoints/ (git ignores them): they are not chapters.
TWINS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def twin_of(source: Path) -> Path:
    return ROOT / "notebooks" / source.relative_to(ROOT / "book").with_suffix(".ipynb")


def cells(nb):
    return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]


def test_there_are_chapters():
    assert SOURCES, "no MyST text notebooks found under book/"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_text_source_and_notebook_in_sync(source):
    twin = twin_of(source)
    assert twin.exists(), f"{twin.relative_to(ROOT)} is missing: run `make notebooks`"
    text = jupytext.read(source)
    executed = nbformat.read(twin, as_version=4)
    assert cells(text) == cells(executed), (
        f"{source.relative_to(ROOT)} and {twin.relative_to(ROOT)} differ: run `make notebooks`"
    )


@pytest.mark.parametrize("twin", TWINS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_has_a_source_and_is_executed(twin):
    source = ROOT / "book" / twin.relative_to(ROOT / "notebooks").with_suffix(".md")
    assert source in SOURCES, f"{twin.relative_to(ROOT)} has no text source {source.relative_to(ROOT)}"
    code = [c for c in nbformat.read(twin, as_version=4).cells if c.cell_type == "code"]
    unexecuted = [i for i, c in enumerate(code) if c.execution_count is None]
    assert not unexecuted, f"{twin.relative_to(ROOT)}: code cells {unexecuted} were never executed"
