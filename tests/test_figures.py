"""Every figure of the book is legible at its display size (issue 18): its smallest text reads as at least
10 pt where the page shows it.

``rlbook.plotting.use_book_style`` stores each figure as a PNG with a ``rlbook-figure`` text chunk (its dpi
and smallest font size in points) and display metadata (its width in CSS pixels, 96 per inch). The page
shows a figure at ``min(column width, its own width)``, so a font of ``f`` points reads as
``f * displayed width / own width`` points. A figure drawn without the book style (no text chunk), shown at
another width than its own, or drawn below 200 dpi fails with the notebook and the figure's name.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from rlbook.plotting import (  # noqa: E402
    BOOK_RC,
    COLUMN_PX,
    CSS_PX_PER_INCH,
    FULL_WIDTH,
    MIN_FONT_PT,
    PNG_DPI,
    PNG_KEY,
    figure_png,
)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
GLUE_PREFIX = "application/papermill.record/"
# A {glue:figure} option that rescales the image would change the size its text is read at.
RESCALING_OPTION = re.compile(r"```\{glue:figure\}[^\n]*\n(?::[^\n]*\n)*?:(width|scale|height|figwidth):")


def figures(nb):
    """``(name, mime type, data, display metadata)`` of every image output of ``nb``; a glued figure is
    named by its glue key, any other by its cell and output number."""
    for index, cell in enumerate(nb.cells):
        for number, output in enumerate(cell.get("outputs", [])):
            data = output.get("data", {})
            metadata = output.get("metadata", {})
            glued = metadata.get("scrapbook", {}).get("name")
            for key, content in data.items():
                mime = key.removeprefix(GLUE_PREFIX)
                if mime.startswith("image/"):
                    name = f"glued figure {glued!r}" if glued else f"cell {index} output {number}"
                    yield name, mime, content, metadata.get(mime, {})


def figure_problem(mime: str, content, display: dict, column_px: float = COLUMN_PX) -> str | None:
    """What makes this stored figure illegible or unchecked at display size, or None if it reads at
    ``MIN_FONT_PT`` or more."""
    fix = "draw it after rlbook.plotting.use_book_style() (see that module)"
    if mime != "image/png":
        return f"is {mime}, not the book style's PNG: {fix}"
    image = Image.open(io.BytesIO(base64.b64decode(content)))
    if PNG_KEY not in image.text:
        return f"carries no {PNG_KEY!r} metadata, so its font size is unknown: {fix}"
    info = json.loads(image.text[PNG_KEY])
    dpi = float(info["dpi"])
    own_px = image.width * CSS_PX_PER_INCH / dpi
    if dpi < 200:
        return f"is drawn at {dpi:g} dpi; at least 200 dpi keeps it sharp: {fix}"
    shown = display.get("width")
    if shown is None or abs(float(shown) - own_px) > 2:
        return (f"is shown {shown} px wide instead of its own {own_px:.0f} px ({image.width / dpi:.2f} in), "
                f"so its text size is not what was drawn: {fix}")
    displayed_px = min(column_px, own_px)
    size = float(info["min_font_pt"]) * displayed_px / own_px
    if size < MIN_FONT_PT - 1e-6:
        return (f"has text {info['min_font_pt']:g} pt ({info['min_font_text']!r}) in a figure "
                f"{image.width / dpi:.2f} in ({own_px:.0f} px) wide, shown {displayed_px:.0f} px wide: it "
                f"reads as {size:.1f} pt, under {MIN_FONT_PT} pt. Make the figure at most {FULL_WIDTH:g} in "
                f"wide (FULL_WIDTH) or that text larger")
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_every_figure_reads_at_10_pt_or_more(path):
    nb = nbformat.read(path, as_version=4)
    problems = [f"{name} {problem}" for name, mime, content, display in figures(nb)
                if (problem := figure_problem(mime, content, display))]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for match in RESCALING_OPTION.finditer(cell.source):
                problems.append(f"a {{glue:figure}} has a :{match[1]}: option, which rescales the figure "
                                f"and its text: drop it and draw the figure at the width it should have")
    if problems:
        pytest.fail(f"{path.relative_to(ROOT)}: {len(problems)} figure(s) not legible at display size:\n  "
                    + "\n  ".join(problems), pytrace=False)


# ---- The check itself can fail: figures with planted faults ----------------------------------------------


def stored(fig):
    """A figure as a notebook stores it: (mime type, base64 PNG, display metadata)."""
    png, display = figure_png(fig)
    plt.close(fig)
    return "image/png", base64.b64encode(png).decode(), display


def book_figure(width=FULL_WIDTH, **text):
    with matplotlib.rc_context(BOOK_RC):
        fig, ax = plt.subplots(figsize=(width, 2.5), layout="constrained")
        ax.plot([0, 1], [0, 1], label="a line")
        ax.set(xlabel="training step", ylabel="accuracy")
        if text:
            ax.text(0.5, 0.5, "note", **text)
        return fig


def test_a_book_style_figure_passes():
    assert figure_problem(*stored(book_figure())) is None
    assert figure_problem(*stored(book_figure(width=FULL_WIDTH / 2))) is None


def test_small_text_fails_and_is_named():
    problem = figure_problem(*stored(book_figure(fontsize=7)))
    assert problem and "text 7 pt ('note')" in problem and "reads as 7.0 pt" in problem


def test_small_tick_labels_fail():  # tick labels get their text only when the figure is drawn
    fig = book_figure()
    fig.axes[0].tick_params(labelsize=8)
    problem = figure_problem(*stored(fig))
    assert problem and "text 8 pt" in problem


def test_a_figure_wider_than_the_column_shrinks_its_text_and_fails():
    problem = figure_problem(*stored(book_figure(width=11)))
    assert problem and "shown 720 px wide" in problem and "reads as" in problem


def test_a_figure_without_the_book_style_fails():
    with matplotlib.rc_context(BOOK_RC):
        fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([0, 1])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    content = base64.b64encode(buffer.getvalue()).decode()
    problem = figure_problem("image/png", content, {})
    assert problem and "carries no 'rlbook-figure' metadata" in problem
    assert "is image/svg+xml" in figure_problem("image/svg+xml", "<svg/>", {})


def test_a_low_resolution_or_rescaled_figure_fails():
    fig = book_figure()
    png, display = figure_png(fig, dpi=100)
    assert "drawn at 100 dpi" in figure_problem("image/png", base64.b64encode(png).decode(), display)
    mime, content, display = stored(book_figure())
    assert "instead of its own" in figure_problem(mime, content, {})  # no width: shown at pixel size
    assert "instead of its own" in figure_problem(mime, content, {"width": 500})


def test_a_rescaling_option_is_found():
    source = "```{glue:figure} fig-x\n:name: fig-x\n:width: 80%\n\nCaption.\n```\n"
    assert [m[1] for m in RESCALING_OPTION.finditer(source)] == ["width"]
    assert not list(RESCALING_OPTION.finditer("```{glue:figure} fig-x\n:name: fig-x\n\nCaption.\n```\n"))


def test_constants_agree():
    assert FULL_WIDTH * CSS_PX_PER_INCH == COLUMN_PX and PNG_DPI >= 200
