"""Plots used across the book, in one style: the figure style (``use_book_style``), results over
seeds (``plot_seeds``, ``label_lines``, ``plot_training_curves``), grid worlds (value maps,
greedy-policy arrows, paths), and the glue that hands a chapter's figures and numbers to its text
(``glue_figure``, ``glue_num``, ``glue_interval``).

A figure is read at its display size. ``use_book_style`` makes every figure a PNG drawn at
``PNG_DPI`` and shown at its own width in inches (96 CSS pixels per inch), so a font of ``f`` points
in the figure reads as ``f`` points on the page as long as the figure is no wider than the
column (``COLUMN_PX``). Each PNG carries its resolution and its smallest font size (a
``rlbook-figure`` text chunk), which ``tests/test_figures.py`` reads to check every figure.
"""

from __future__ import annotations

import io
import json

import matplotlib.pyplot as plt
import numpy as np
from cycler import cycler
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import ScaledTranslation

# ---- The book's figure style -------------------------------------------------------------------

# The widest figure shown at its own size, in CSS pixels: the book's column is wider at a 1280-px
# window (about 930 px) and still 720 px at 1024 px.
COLUMN_PX = 720
CSS_PX_PER_INCH = 96  # a browser draws 96 CSS pixels per inch; 1 pt = 1/72 inch, as in matplotlib
FULL_WIDTH = COLUMN_PX / CSS_PX_PER_INCH  # 7.5 in: the widest figure, shown at its own size
HALF_WIDTH = FULL_WIDTH / 2  # a small single-panel figure (a map, one curve)
PANEL_HEIGHT = 2.6  # height in inches of one row of panels
PNG_DPI = 200  # pixels per inch of the PNG; twice the display resolution or more, so it is sharp
MIN_FONT_PT = 10  # smallest text, in points at display size, that tests/test_figures.py accepts
PNG_KEY = "rlbook-figure"  # PNG text chunk with the figure's dpi and smallest font (JSON)

# Okabe & Ito's colour-blind-safe palette, in matplotlib's order of hues: C0 blue, C1 orange,
# C2 green, C3 vermillion (red), C4 reddish purple, C5 sky blue, C6 yellow, C7 grey.
COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#7F7F7F"]

BOOK_RC = {
    "figure.figsize": (FULL_WIDTH, PANEL_HEIGHT),
    "figure.dpi": CSS_PX_PER_INCH,
    "figure.constrained_layout.use": True,  # labels never overlap; replaces fig.tight_layout()
    "savefig.dpi": PNG_DPI,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.04,
    "savefig.facecolor": "white",
    "font.size": 11,
    "axes.titlesize": 11,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "legend.title_fontsize": 10,
    "figure.titlesize": 12,
    "axes.prop_cycle": cycler(color=COLORS),
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#b0b0b0",
    "grid.alpha": 0.4,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.8,
    "legend.frameon": False,
    "image.cmap": "viridis",
}


def use_book_style() -> None:
    """Use the book's figure style: call once at the top of a chapter, after importing pyplot.

    Sets ``BOOK_RC`` (fonts of at least 10 pt, light grid, colour-blind-safe colours
    ``C0``...``C7``, constrained layout) and, inside IPython/Jupyter, shows figures (and ``glue``s
    them) as PNGs at ``PNG_DPI`` that the page and JupyterLab display at the figure's own width
    (``figure_png``).
    """
    # Load the backend now: matplotlib-inline registers its own figure formatters when it loads.
    try:
        plt._get_backend_mod()
    except Exception:  # pragma: no cover - private API; a figure created and closed does the same
        plt.close(plt.figure())
    plt.rcParams.update(BOOK_RC)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency of the notebooks only
        return
    shell = get_ipython()
    if shell is None:
        return
    formatters = shell.display_formatter.formatters
    for mime in ("image/png", "image/svg+xml", "image/jpeg", "application/pdf"):
        if mime in formatters:
            formatters[mime].pop(Figure, None)
    formatters["image/png"].for_type(Figure, figure_png)


def smallest_font(fig) -> tuple[float, str]:
    """``(size in points, text)`` of the smallest non-empty visible text of ``fig``
    (``(inf, "")`` if it has none). Draws the figure first: tick labels get their text when drawn."""
    fig.draw_without_rendering()
    sizes = [(float(t.get_fontsize()), t.get_text()) for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=(float("inf"), ""))


def figure_png(fig, dpi: int = PNG_DPI) -> tuple[bytes, dict]:
    """``(png bytes, display metadata)`` of ``fig``: the IPython formatter of ``use_book_style``.

    The PNG is drawn at ``dpi`` with a tight bounding box; the metadata's ``width`` (CSS pixels)
    makes the page and JupyterLab show it at the figure's size in inches. A ``rlbook-figure`` text
    chunk records ``dpi`` and the smallest font (``min_font_pt``, ``min_font_text``) for
    tests/test_figures.py.
    """
    size, text = smallest_font(fig)
    info = {"dpi": dpi, "min_font_pt": round(size, 2), "min_font_text": text[:60]}
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.04,
                facecolor="white", metadata={PNG_KEY: json.dumps(info)})
    png = buffer.getvalue()
    width = int.from_bytes(png[16:20], "big")  # the IHDR chunk: width in pixels
    scale = CSS_PX_PER_INCH / dpi
    # width only: a page narrower than the figure scales it down with its aspect ratio (a fixed
    # height would squash it)
    return png, {"width": round(width * scale)}


def book_subplots(nrows: int = 1, ncols: int = 1, *, width: float = FULL_WIDTH,
                  panel_height: float = PANEL_HEIGHT, **kwargs):
    """``plt.subplots`` at a book width (``FULL_WIDTH`` or ``HALF_WIDTH`` inches), ``panel_height``
    inches per row of panels, constrained layout; other keyword arguments go to ``plt.subplots``."""
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(nrows, ncols, figsize=(width, panel_height * nrows), **kwargs)


# ---- Glue: a chapter's figures and numbers for the book's text ---------------------------------

def glue_figure(name: str, fig) -> None:
    """Store ``fig`` for a numbered ``{glue:figure}`` and close it, so that it is shown once, with its
    caption. The cell's own output (removed in the book by its tag) shows it in JupyterLab, which
    cannot render ``{glue:figure}``."""
    from myst_nb import glue  # the book's toolchain, needed only where a notebook glues

    glue(name, fig, display=True)
    plt.close(fig)


def glue_num(name: str, value, digits: int = 4) -> None:
    """Glue a number for ``{glue:text}``, rounded to ``digits`` significant digits so that no float
    error (or a machine's last-bit difference) is stored; the text's format spec sets what is shown."""
    from myst_nb import glue

    glue(name, float(f"{float(value):.{digits}g}"), display=False)


def glue_interval(name: str, interval, digits: int = 4, suffixes=("", "_low", "_high")) -> None:
    """Glue an interval ``(mean, low, high)`` (as :func:`rlbook.stats.mean_interval` returns) as
    three numbers, ``name`` followed by each of ``suffixes``, with :func:`glue_num`."""
    values = tuple(interval)
    if len(values) != 3 or len(suffixes) != 3:
        raise ValueError(f"glue_interval needs (mean, low, high) and three suffixes, got {values!r}, "
                         f"{tuple(suffixes)!r}")
    for suffix, value in zip(suffixes, values):
        glue_num(f"{name}{suffix}", value, digits)


# ---- Grid worlds -------------------------------------------------------------------------------

# Unit moves (d_col, d_row) of each action, in the action numbering of each gymnasium environment.
FROZENLAKE_MOVES = {0: (-1, 0), 1: (0, 1), 2: (1, 0), 3: (0, -1)}  # LEFT, DOWN, RIGHT, UP
CLIFFWALKING_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}  # UP, RIGHT, DOWN, LEFT


def plot_grid_values(
    values,
    shape: tuple[int, int],
    policy=None,
    moves: dict[int, tuple[int, int]] = FROZENLAKE_MOVES,
    desc=None,
    terminal=None,
    ax=None,
    title: str | None = None,
    cmap: str = "viridis",
    fmt: str = "{:.2f}",
    mask=None,
    cbar_label: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    fontsize: float = MIN_FONT_PT,
):
    """Heat-map of state values on a grid, with the value in each cell and the policy as arrows.

    Args:
        values: ``(S,)`` state values, ``S = rows * cols``, row-major (gymnasium's numbering).
        shape: ``(rows, cols)`` of the grid.
        policy: optional ``(S,)`` integer actions, drawn as arrows using ``moves``.
        moves: action -> ``(d_col, d_row)``; ``FROZENLAKE_MOVES`` or ``CLIFFWALKING_MOVES``.
        desc: optional ``(rows, cols)`` map letters (e.g. FrozenLake's S/F/H/G), printed in the
            corner of cells.
        terminal: optional ``(S,)`` mask; no arrow is drawn on terminal states.
        mask: optional ``(S,)`` mask of cells drawn blank (light grey, no value, no arrow) and left
            out of the colour scale, e.g. CliffWalking's cliff cells, which are never occupied.
        cbar_label: label of the colour bar (what the colour encodes).
        xlabel, ylabel: axis labels, e.g. ``"column"`` and ``"row"``.
        fontsize: points of the values and map letters in the cells (10: the book's smallest).
    Returns the matplotlib ``Axes``.
    """
    values = np.asarray(values, dtype=float)
    rows, cols = shape
    if values.shape != (rows * cols,):
        raise ValueError(f"values must have shape ({rows * cols},) for a {rows}x{cols} grid, "
                         f"got {values.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.9 * cols + 1.5, 0.9 * rows + 0.5))
    hidden = np.zeros(rows * cols, bool) if mask is None else np.asarray(mask, bool).ravel()
    if hidden.shape != (rows * cols,):
        raise ValueError(f"mask must have shape ({rows * cols},), got {hidden.shape}")
    grid = np.ma.masked_array(values, hidden).reshape(rows, cols)
    colormap = plt.get_cmap(cmap).with_extremes(bad="0.85")  # masked cells: light grey
    image = ax.imshow(grid, cmap=colormap)
    colorbar = plt.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if cbar_label:
        colorbar.set_label(cbar_label)
    middle = (grid.max() + grid.min()) / 2
    for index in range(rows * cols):
        r, c = divmod(index, cols)
        color = "black" if hidden[index] or grid[r, c] > middle else "white"
        if not hidden[index]:
            ax.text(c, r + 0.28, fmt.format(grid[r, c]), ha="center", va="center",
                    fontsize=fontsize, color=color)
        if desc is not None:
            ax.text(c - 0.44, r - 0.22, str(np.asarray(desc)[r, c]), fontsize=fontsize, color=color,
                    weight="bold")
        if hidden[index]:
            continue
        if policy is not None and not (terminal is not None and terminal[index]):
            dx, dy = moves[int(policy[index])]
            # an arrow of 0.36 cells above the value, head included, so the two never overlap
            ax.arrow(c - 0.18 * dx, r - 0.14 - 0.18 * dy, 0.36 * dx, 0.36 * dy, head_width=0.16,
                     head_length=0.14, length_includes_head=True, color=color)
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.grid(False)  # grid lines would cross the cells
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


# Face colours of the map letters of gymnasium's grid worlds (FrozenLake S/F/H/G; C for a cliff).
MAP_COLOURS = {"S": "#9ecae1", "F": "#eef5fb", "H": "#3f4a5a", "G": "#74c476", "C": "#8c6d62",
               " ": "#ffffff"}


def plot_grid_map(desc, ax=None, title: str | None = None, colours: dict[str, str] | None = None):
    """Draw a grid world's map: each cell coloured by its letter, with the letter and state number.

    Args:
        desc: ``(rows, cols)`` map letters (FrozenLake's ``S``, ``F``, ``H``, ``G``); states are
            numbered row by row from the top-left corner, as in gymnasium.
        colours: letter -> face colour; defaults to ``MAP_COLOURS``.
    Returns the matplotlib ``Axes``, with axes labelled "column" and "row".
    """
    desc = np.asarray(desc).astype(str)
    if desc.ndim != 2:
        raise ValueError(f"desc must be a (rows, cols) grid of letters, got shape {desc.shape}")
    rows, cols = desc.shape
    colours = MAP_COLOURS | (colours or {})
    if ax is None:
        _, ax = plt.subplots(figsize=(0.8 * cols + 0.8, 0.8 * rows + 0.6))
    for r in range(rows):
        for c in range(cols):
            letter = desc[r, c]
            face = colours.get(letter, "#ffffff")
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor=face, edgecolor="0.4"))
            dark = letter in ("H", "C")
            ax.text(c, r - 0.1, letter, ha="center", va="center", fontsize=12, weight="bold",
                    color="white" if dark else "black")
            ax.text(c, r + 0.3, str(r * cols + c), ha="center", va="center", fontsize=MIN_FONT_PT,
                    color="white" if dark else "0.3")
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.grid(False)
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    if title:
        ax.set_title(title)
    return ax


def plot_grid_path(states, shape: tuple[int, int], ax=None, **line_kwargs):
    """Draw the path through the visited ``states`` (row-major) on a ``(rows, cols)`` grid."""
    rows, cols = shape
    states = np.asarray(states, dtype=int)
    if states.size and (states.min() < 0 or states.max() >= rows * cols):
        raise ValueError(f"states must lie in 0..{rows * cols - 1}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * cols, 0.5 * rows))
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
    r, c = np.divmod(states, cols)
    ax.plot(c, r, **({"marker": "o", "markersize": 3} | line_kwargs))
    return ax


# ---- Results over seeds ------------------------------------------------------------------------


def running_mean(values, window: int):
    """Running mean over the last axis with a window of ``window`` points (``mode="valid"``: the
    result is ``window - 1`` points shorter)."""
    values = np.asarray(values, dtype=float)
    if window <= 1:
        return values
    kernel = np.ones(window) / window
    return np.apply_along_axis(lambda v: np.convolve(v, kernel, mode="valid"), -1, values)


def plot_seeds(ax, x, ys, *, label: str | None = None, color=None, smooth: int = 1,
               spread: str = "seeds", **line_kwargs):
    """One arm of an experiment over seeds: the mean as a line, and each seed as a thin faint line.

    Args:
        ax: matplotlib axes.
        x: ``(T,)`` x values (training steps).
        ys: ``(seeds, T)`` values, one row per seed (a single row draws the line alone).
        label: name of the arm, kept on the mean line (for ``label_lines`` or a legend).
        color: the arm's colour (default: the axes' next colour).
        smooth: running mean over ``smooth`` points of each seed first (``x`` is cut to match).
        spread: ``"seeds"`` (thin line per seed), ``"band"`` (light min-max band) or ``"none"``.
        **line_kwargs: style of the mean line (``ls``, ``lw``, ``marker``...).
    Returns the mean line (``Line2D``).
    """
    ys = np.atleast_2d(np.asarray(ys, dtype=float))
    x = np.asarray(x)
    if ys.shape[-1] != len(x):
        raise ValueError(f"ys must have shape (seeds, {len(x)}) to match x, got {ys.shape}")
    if spread not in ("seeds", "band", "none"):
        raise ValueError(f"spread must be 'seeds', 'band' or 'none', got {spread!r}")
    if smooth > 1:
        ys, x = running_mean(ys, smooth), x[smooth - 1:]
    if color is None:
        color = ax._get_lines.get_next_color()
    if len(ys) > 1 and spread == "seeds":
        for y in ys:
            ax.plot(x, y, color=color, lw=0.7, alpha=0.3, label="_seed", zorder=1.5)
    elif len(ys) > 1 and spread == "band":
        ax.fill_between(x, ys.min(0), ys.max(0), color=color, alpha=0.12, lw=0, zorder=1.5)
    line_kwargs.setdefault("lw", line_kwargs.pop("linewidth", 2.2))
    (line,) = ax.plot(x, ys.mean(0), color=color, label=label, zorder=2.5, **line_kwargs)
    return line


def label_lines(ax, lines=None, names: dict | None = None, *, fontsize=None,
                pad_pt: float = 4):
    """Write each line's label right of the axes, level with the line's last point and in its
    colour, instead of a legend; labels that would overlap are moved apart vertically.

    Args:
        lines: the lines to label (default: each line of ``ax`` whose label does not start
            with ``_``).
        names: optional label -> text to write (shorter names for the plot).
        fontsize: default ``legend.fontsize``.
        pad_pt: gap in points between the axes' right edge and the labels.
    Call it after plotting (and after setting y limits). Returns the ``Text`` objects. Constrained
    layout (the book style's default) makes room for them to the right of the axes.
    """
    ax.figure.draw_without_rendering()  # settle the layout and the axis limits
    if lines is None:
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    fontsize = plt.rcParams["legend.fontsize"] if fontsize is None else fontsize
    size_pt = Text(text="x", fontsize=fontsize).get_fontsize()
    to_axes = ax.transScale + ax.transLimits  # data -> axes fraction
    targets = []
    for line in lines:
        xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
        xy = xy[np.isfinite(xy).all(1)]
        if len(xy):
            targets.append(float(np.clip(to_axes.transform(xy[-1])[1], 0, 1)))
        else:
            targets.append(np.nan)
    kept = [(t, line) for t, line in zip(targets, lines) if np.isfinite(t)]
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    gap = 1.15 * size_pt / max(height_pt, 1.0)
    positions = _spread([t for t, _ in kept], gap)
    offset = ScaledTranslation(pad_pt / 72, 0, ax.figure.dpi_scale_trans)
    texts = []
    for y, (_, line) in zip(positions, kept):
        text = (names or {}).get(line.get_label(), line.get_label())
        texts.append(ax.text(1.0, y, text, transform=ax.transAxes + offset, color=line.get_color(),
                             fontsize=fontsize, va="center", ha="left", clip_on=False))
    return texts


def _spread(targets: list[float], gap: float) -> list[float]:
    """Positions as close as possible to ``targets`` with at least ``gap`` between neighbours:
    overlapping labels form clusters centred on their targets' mean, merged until none overlap."""
    order = np.argsort(targets)
    clusters = []  # [sum of targets, number of labels], bottom to top
    for i in order:
        clusters.append([targets[i], 1])
        while len(clusters) > 1:
            (s1, n1), (s2, n2) = clusters[-2], clusters[-1]
            top_of_lower = s1 / n1 + (n1 - 1) * gap / 2
            bottom_of_upper = s2 / n2 - (n2 - 1) * gap / 2
            if bottom_of_upper - top_of_lower >= gap:
                break
            clusters[-2:] = [[s1 + s2, n1 + n2]]
    positions = np.empty(len(targets))
    rank = 0
    for total, count in clusters:
        centre = total / count
        for k in range(count):
            positions[order[rank]] = centre + (k - (count - 1) / 2) * gap
            rank += 1
    return positions.tolist()


def plot_training_curves(
    runs: dict[str, list[list[dict]]],
    metrics: list[str],
    axes=None,
    x: str = "step",
    titles: dict[str, str] | None = None,
    smooth: int = 1,
    spread: str = "seeds",
):
    """One panel per metric; for each label, the mean over seeds as a line and each seed as a thin
    line (``plot_seeds``), labelled at the right end of the last panel (``label_lines``).

    Args:
        runs: label -> one metric history per seed (``Trainer.history``: a list of dicts, one per
            step). Steps where a metric is missing (``eval_accuracy`` is logged every few steps)
            are skipped.
        metrics: the keys to plot, e.g. ``["reward", "eval_accuracy", "clip_ratio/region_mean"]``.
        axes: optional sequence of matplotlib axes, one per metric.
        titles: optional metric -> panel title (defaults to the key); the y-axis shows the key.
        smooth: moving-average window applied to each seed before averaging (1: none).
        spread: how seeds are shown, as in ``plot_seeds``.
    Returns the axes.
    """
    if axes is None:
        _, axes = book_subplots(1, len(metrics), squeeze=False)
        axes = axes[0]
    if len(axes) != len(metrics):
        raise ValueError(f"got {len(axes)} axes for {len(metrics)} metrics")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes, metrics):
        for colour, (label, histories) in zip(colours, runs.items()):
            steps, curves = _aligned(histories, metric, x)
            if not curves.size:
                continue
            plot_seeds(ax, steps, curves, label=f"{label} (n={len(curves)})", color=colour,
                       smooth=smooth, spread=spread)
        ax.set_title((titles or {}).get(metric, metric))
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
    label_lines(axes[-1])
    return axes


def _aligned(histories: list[list[dict]], metric: str, x: str):
    """(steps, (seeds, steps) array) of ``metric`` at the steps every seed logged it."""
    per_seed = [{m[x]: m[metric] for m in history if metric in m} for history in histories]
    common = sorted(set.intersection(*(set(d) for d in per_seed))) if per_seed else []
    return np.asarray(common), np.asarray([[d[s] for s in common] for d in per_seed], dtype=float)


def plot_organism(ax, result: dict, metric: str, arms=None, *, names: dict | None = None, colors: dict | None = None,
                  spread: str = "band"):
    """The held-out ``metric`` of an organism experiment (``experiments/organisms.py``'s stored result) against
    the training step, one line per arm: the mean over seeds, and the range over seeds as a band (``spread`` as
    in :func:`plot_seeds`). ``names`` maps arm names to labels, ``colors`` arm names to colours (default: the
    arm's position among the experiment's arms, so an arm keeps its colour from figure to figure).
    Returns ``{arm: line}``."""
    from rlbook.stats import eval_series

    arms = list(result["runs"]) if arms is None else list(arms)
    order = list(result["runs"])
    lines = {}
    for arm in arms:
        if arm not in result["runs"]:
            raise ValueError(f"no arm {arm!r} in {result.get('experiment')}; it has {order}")
        steps, values = eval_series(result["runs"][arm], metric)
        color = (colors or {}).get(arm, COLORS[order.index(arm) % len(COLORS)])
        label = f"{(names or {}).get(arm, arm)} (n={len(values)})"
        lines[arm] = plot_seeds(ax, steps, values, label=label, color=color, spread=spread, marker="o", ms=4)
    ax.set_xlabel("step")
    return lines


def plot_organism_panels(result: dict, panels, arms=None, *, names: dict | None = None, colors: dict | None = None,
                         spread: str = "band", ncols: int = 2, panel_height: float = 2.4):
    """One :func:`plot_organism` panel per held-out metric of an organism experiment, in a grid of ``ncols``
    columns sharing the step axis. ``panels``: ``(metric, title, ylabel)`` per panel. Returns ``(fig, axes)``."""
    panels = list(panels)
    nrows = -(-len(panels) // ncols)
    fig, axes = book_subplots(nrows, ncols, panel_height=panel_height, sharex=True, squeeze=False)
    for ax, (metric, title, ylabel) in zip(axes.flat, panels):
        plot_organism(ax, result, metric, arms, names=names, colors=colors, spread=spread)
        ax.set(title=title, ylabel=ylabel)
    for ax in axes[:-1].flat:
        ax.set_xlabel("")
    return fig, axes


# ---- A lineage of algorithms -------------------------------------------------------------------

def plot_lineage(ax, nodes: dict, edges, *, box_width: float = 1.5, fontsize: float = 10):
    """A family tree drawn with matplotlib alone (nothing loaded from outside the page): one box per node, an
    arrow per edge, and under each node's name what changed along the edge into it.

    Args:
        ax: matplotlib axes whose data units are inches (``ax.set(xlim=(0, width), ylim=(0, height))`` on a
            figure of that size); the axes are hidden.
        nodes: ``{name: (x, y, what_changed)}``, the box's centre and the text under the name (wrapped to the
            box; "" for none).
        edges: ``(parent, child)`` or ``(parent, child, linestyle)``; ``"--"`` marks a separate branch (an idea
            borrowed, not an algorithm modified).
        box_width: the width of a box's text in inches (about 7 characters per inch at 10 pt).
    Returns ``{name: Text}``, the boxes.
    """
    import textwrap

    width = max(8, int(box_width * 72 / (0.55 * fontsize)))  # characters per line at about 0.55 em each
    boxes = {}
    for name, (x, y, changed) in nodes.items():
        body = "\n".join(textwrap.wrap(changed, width)) if changed else ""
        # the box holds an empty first line, where the name is written in bold over it
        boxes[name] = ax.text(x, y, " \n" + body if body else " ", ha="center", va="center", fontsize=fontsize,
                              linespacing=1.15, zorder=3,
                              bbox=dict(boxstyle="round,pad=0.35", fc="white", ec="0.35", lw=0.9))
        ax.annotate(name, xy=(0.5, 1.0), xycoords=boxes[name], ha="center", va="top", fontsize=fontsize,
                    fontweight="bold", zorder=4)
    for edge in edges:
        parent, child, style = (*edge, "-")[:3]
        for end in (parent, child):
            if end not in boxes:
                raise ValueError(f"edge {parent!r} -> {child!r}: no node {end!r}")
        ax.annotate("", xy=boxes[child].get_position(), xytext=boxes[parent].get_position(),
                    arrowprops=dict(arrowstyle="-|>", color="0.3", lw=1.1, ls=style, shrinkA=2, shrinkB=2,
                                    patchA=boxes[parent].get_bbox_patch(), patchB=boxes[child].get_bbox_patch(),
                                    mutation_scale=12), zorder=2)
    ax.set_axis_off()
    return boxes


# ---- Runs of `rlbook train` side by side ---------------------------------------------------------

def plot_runs(runs: dict[str, list[dict]], metrics=("reward",), *, smooth: int = 1, ncols: int = 3,
              titles: dict[str, str] | None = None):
    """Runs side by side: one panel per metric (``ncols`` to a row), one line per run against the step, each run
    in its own colour in every panel and named at its line's end in the first row's last panel
    (:func:`label_lines`). Call :func:`use_book_style` first for the book's look (``rlbook plot`` does).

    Args:
        runs: label -> one run's metrics, a list of dicts with ``"step"`` (``Trainer.history``, or
            :func:`rlbook.runs.read_metrics` of a run folder). A step that did not log a metric is skipped.
        metrics: the keys to plot, e.g. ``["reward", "entropy", "completions/mean_length"]``.
        smooth: running mean over this many steps (1: none; cut to a run's length).
        titles: optional metric -> panel title (default: the key).
    Returns ``(fig, axes)``, ``axes`` flat with one panel per metric. ``ValueError`` naming the metric and the
    keys the runs have when no run logged one of ``metrics``, or when ``runs`` or ``metrics`` is empty.
    """
    metrics = list(metrics)
    if not runs or not metrics:
        raise ValueError(f"plot_runs needs at least one run and one metric, got {len(runs)} runs and "
                         f"metrics {metrics}")
    logged = {k for history in runs.values() for record in history for k in record}
    for metric in metrics:
        if metric not in logged:
            keys = sorted(k for k in logged if k != "step")
            raise ValueError(f"no run logged the metric {metric!r}; they logged: {', '.join(keys) or 'nothing'}")
    ncols = max(1, min(ncols, len(metrics)))
    nrows = -(-len(metrics) // ncols)
    fig, grid = book_subplots(nrows, ncols, squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    axes = axes[:len(metrics)]
    for ax, metric in zip(axes, metrics):
        for colour, (label, history) in zip(_cycle(COLORS, len(runs)), runs.items()):
            steps, values = _aligned([history], metric, "step")
            if not steps.size:
                continue
            plot_seeds(ax, steps, values, label=label, color=colour, smooth=max(1, min(smooth, steps.size)))
        ax.set_title((titles or {}).get(metric, metric))
        ax.set_xlabel("step")
    label_lines(axes[min(ncols, len(axes)) - 1])
    return fig, axes


def _cycle(colours: list[str], n: int) -> list[str]:
    """``n`` colours from ``colours``, starting again from the first when there are more runs than colours."""
    return [colours[i % len(colours)] for i in range(n)]
