"""Plotting helpers: masked heat-map cells and the grid map; bad input raises a clear error."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from rlbook.plotting import plot_grid_map, plot_grid_values  # noqa: E402


def test_masked_cells_show_no_value_and_labels_are_set():
    values = np.arange(6.0)
    mask = np.array([False, False, False, False, True, True])
    fig, ax = plt.subplots()
    plot_grid_values(values, (2, 3), mask=mask, ax=ax, cbar_label="value", xlabel="column", ylabel="row", fmt="{:.0f}")
    shown = {t.get_text() for t in ax.texts}
    assert {"0", "1", "2", "3"} <= shown and not {"4", "5"} & shown
    assert ax.get_xlabel() == "column" and ax.get_ylabel() == "row"
    assert fig.axes[1].get_ylabel() == "value"  # the colour bar
    plt.close(fig)


def test_mask_of_wrong_shape_raises():
    with pytest.raises(ValueError, match="mask must have shape"):
        plot_grid_values(np.zeros(6), (2, 3), mask=np.zeros(5, bool))
    plt.close("all")


def test_grid_map_numbers_states_row_by_row():
    fig, ax = plt.subplots()
    plot_grid_map(np.array([list("SF"), list("HG")]), ax=ax)
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["S", "0", "F", "1", "H", "2", "G", "3"]
    with pytest.raises(ValueError, match="desc must be a"):
        plot_grid_map(np.array(list("SFHG")))
    plt.close("all")


def test_training_curves_plot_mean_and_seeds_with_direct_labels():
    from rlbook.plotting import plot_training_curves

    def history(offset):
        return [{"step": s, "reward": s + offset, **({"eval_accuracy": 0.5} if s % 2 == 0 else {})}
                for s in range(1, 7)]

    axes = plot_training_curves({"a": [history(0), history(2)], "b": [history(1)]},
                                ["reward", "eval_accuracy"])
    means = [line for line in axes[0].get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in means] == ["a (n=2)", "b (n=1)"]
    assert list(means[0].get_xdata()) == [1, 2, 3, 4, 5, 6]
    assert list(means[0].get_ydata()) == [2, 3, 4, 5, 6, 7]
    assert len(axes[0].get_lines()) == 4, "two thin seed lines for 'a', none for the single seed of 'b'"
    assert list(axes[1].get_lines()[-1].get_xdata()) == [2, 4, 6]
    assert [t.get_text() for t in axes[1].texts] == ["a (n=2)", "b (n=1)"], "labels at the line ends"
    assert axes[0].get_legend() is None
    with pytest.raises(ValueError, match="2 axes for 1 metrics"):
        plot_training_curves({"a": [history(0)]}, ["reward"], axes=list(axes))
    plt.close("all")


def test_plot_seeds_draws_seeds_band_or_mean_only():
    from rlbook.plotting import plot_seeds

    x, ys = np.arange(5), np.array([[0.0, 1, 2, 3, 4], [2, 3, 4, 5, 6]])
    fig, ax = plt.subplots()
    line = plot_seeds(ax, x, ys, label="arm", color="C1", ls="--")
    assert len(ax.get_lines()) == 3 and line is ax.get_lines()[-1] and line.get_linestyle() == "--"
    assert list(line.get_ydata()) == [1, 2, 3, 4, 5] and line.get_label() == "arm"
    assert all(seed.get_label().startswith("_") for seed in ax.get_lines()[:2])
    plot_seeds(ax, x, ys, spread="band")
    assert len(ax.collections) == 1
    smoothed = plot_seeds(ax, x, ys, spread="none", smooth=3)
    assert list(smoothed.get_xdata()) == [2, 3, 4] and list(smoothed.get_ydata()) == [2, 3, 4]
    with pytest.raises(ValueError, match="ys must have shape"):
        plot_seeds(ax, x[:4], ys)
    with pytest.raises(ValueError, match="spread must be"):
        plot_seeds(ax, x, ys, spread="minmax")
    plt.close(fig)


def test_direct_labels_keep_order_and_do_not_overlap():
    from rlbook.plotting import _spread, label_lines

    assert _spread([0.5, 0.1, 0.9], 0.05) == [0.5, 0.1, 0.9], "far apart: each at its line's end"
    close = _spread([0.50, 0.51, 0.2], 0.1)
    assert close[2] == 0.2 and abs(close[1] - close[0] - 0.1) < 1e-12 and abs(sum(close[:2]) / 2 - 0.505) < 1e-12
    fig, ax = plt.subplots(figsize=(4, 3))
    for i, end in enumerate([1.0, 1.01, 1.02, 0.0]):
        ax.plot([0, 1], [0, end], label=f"line {i}")
    texts = label_lines(ax, names={"line 3": "bottom"})
    assert [t.get_text() for t in texts] == ["line 0", "line 1", "line 2", "bottom"]
    fig.draw_without_rendering()
    boxes = sorted((t.get_window_extent() for t in texts), key=lambda b: b.y0)
    assert all(lower.y1 <= upper.y0 + 0.5 for lower, upper in zip(boxes, boxes[1:])), "no two labels overlap"
    assert all(b.x0 >= ax.get_window_extent().x1 for b in boxes), "right of the axes"
    assert texts[0].get_color() == ax.get_lines()[0].get_color()
    plt.close(fig)


def test_book_style_figure_png_carries_its_size_and_smallest_font():
    import io
    import json

    import matplotlib
    from PIL import Image

    from rlbook.plotting import BOOK_RC, FULL_WIDTH, PNG_DPI, book_subplots, figure_png, smallest_font

    with matplotlib.rc_context(BOOK_RC):
        fig, ax = book_subplots(1, 2, panel_height=2.5)
        ax[0].plot([0, 1], label="x")
        ax[0].set_xlabel("step")
        ax[1].text(0.5, 0.5, "tiny", fontsize=8)
        assert smallest_font(fig) == (8.0, "tiny")
        png, display = figure_png(fig)
    image = Image.open(io.BytesIO(png))
    info = json.loads(image.text["rlbook-figure"])
    assert info == {"dpi": PNG_DPI, "min_font_pt": 8.0, "min_font_text": "tiny"}
    assert abs(image.width / PNG_DPI - FULL_WIDTH) < 0.15, "constrained layout: about the width asked for"
    assert display["width"] == round(image.width * 96 / PNG_DPI)
    plt.close(fig)


def test_use_book_style_makes_ipython_show_figures_as_book_pngs():
    """In an IPython shell (a fresh process: the shell is global), a figure's display data, which
    myst-nb's glue stores, is the 200-dpi PNG with the figure's width for the page."""
    import json
    import subprocess
    import sys

    script = """
import json, matplotlib
matplotlib.use("Agg")
from IPython.core.formatters import format_display_data
from IPython.core.interactiveshell import InteractiveShell
InteractiveShell.instance()
import matplotlib.pyplot as plt
from rlbook.plotting import use_book_style, book_subplots, HALF_WIDTH
use_book_style()
fig, ax = book_subplots(width=HALF_WIDTH)
ax.plot([0, 1])
data, metadata = format_display_data(fig)
print(json.dumps({"mimes": sorted(data), "metadata": metadata,
                  "font": plt.rcParams["xtick.labelsize"]}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown["mimes"] == ["image/png", "text/plain"] and shown["font"] == 10
    assert abs(shown["metadata"]["image/png"]["width"] - 360) <= 12, "HALF_WIDTH: 3.75 in = 360 px"


def test_plot_organism_draws_each_arm_over_its_evaluation_steps():
    import matplotlib.pyplot as plt

    from rlbook.plotting import plot_organism

    def runs(values):
        return [{"seed": s, "evals": [{"step": 0, "m": 1.0}, {"step": 5, "m": v}]} for s, v in enumerate(values)]

    result = {"experiment": "organism_x", "runs": {"a": runs([2.0, 4.0]), "b": runs([0.0, 1.0])}}
    fig, ax = plt.subplots()
    lines = plot_organism(ax, result, "m", names={"a": "arm A"})
    assert list(lines) == ["a", "b"] and lines["a"].get_label() == "arm A (n=2)"
    assert list(lines["a"].get_ydata()) == [1.0, 3.0] and list(lines["b"].get_xdata()) == [0, 5]
    with pytest.raises(ValueError, match="no arm 'c'"):
        plot_organism(ax, result, "m", arms=["c"])
    plt.close(fig)


def test_plot_organism_panels_draws_one_panel_per_metric():
    import matplotlib.pyplot as plt

    from rlbook.plotting import plot_organism_panels

    runs = [{"seed": 0, "evals": [{"step": 0, "m": 1.0, "n": 2.0}, {"step": 5, "m": 3.0, "n": 4.0}]}]
    result = {"experiment": "organism_x", "runs": {"a": runs}}
    fig, axes = plot_organism_panels(result, [("m", "(a) m", "m units"), ("n", "(b) n", "n units")])
    assert axes.shape == (1, 2) and [ax.get_title() for ax in axes.flat] == ["(a) m", "(b) n"]
    assert list(axes[0, 1].lines[-1].get_ydata()) == [2.0, 4.0] and axes[0, 0].get_xlabel() == "step"
    plt.close(fig)


def test_glue_helpers_round_and_name_what_they_store(monkeypatch):
    import myst_nb

    from rlbook.plotting import glue_figure, glue_interval, glue_num

    stored = {}
    def fake_glue(name, value, display):
        stored[name] = (value, display)

    monkeypatch.setattr(myst_nb, "glue", fake_glue)
    glue_num("x", 0.123456789)
    glue_num("y", 2 / 3, digits=2)
    glue_interval("d", (0.0123456, -0.0456789, 0.0703456), digits=3)
    glue_interval("e", (1.0, 0.5, 1.5), suffixes=("", "_lo", "_hi"))
    assert stored["x"] == (0.1235, False) and stored["y"] == (0.67, False)
    assert [stored[k][0] for k in ("d", "d_low", "d_high")] == [0.0123, -0.0457, 0.0703]
    assert [stored[k][0] for k in ("e", "e_lo", "e_hi")] == [1.0, 0.5, 1.5]
    fig, _ = plt.subplots()
    glue_figure("fig-x", fig)
    assert stored["fig-x"] == (fig, True) and not plt.fignum_exists(fig.number)  # shown once, then closed
    with pytest.raises(ValueError, match="mean, low, high"):
        glue_interval("bad", (0.1, 0.2))


def test_plot_lineage_draws_a_box_per_node_and_an_arrow_per_edge():
    from rlbook.plotting import plot_lineage

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set(xlim=(0, 4), ylim=(0, 3))
    nodes = {"PPO": (1, 2, "clipped ratio"), "GRPO": (3, 2, "group baseline"), "DPO": (1, 0.5, "")}
    boxes = plot_lineage(ax, nodes, [("PPO", "GRPO"), ("PPO", "DPO", "--")])
    assert set(boxes) == set(nodes) and "group baseline" in boxes["GRPO"].get_text()
    names = {t.get_text() for t in ax.texts if t.get_text() in nodes}  # the names, in bold over each box
    assert names == set(nodes)
    arrows = [t for t in ax.texts if t.get_text() == "" and t.arrow_patch is not None]
    assert len(arrows) == 2 and arrows[1].arrow_patch.get_linestyle() == "--"
    with pytest.raises(ValueError, match="no node 'VAPO'"):
        plot_lineage(ax, nodes, [("PPO", "VAPO")])
    plt.close(fig)
