"""Plots used across the book: grid-world value maps, greedy-policy arrows and paths, training curves over seeds."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

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
):
    """Heat-map of state values on a grid, with the value in each cell and the policy as arrows.

    Args:
        values: ``(S,)`` state values, ``S = rows * cols`` in row-major order (gymnasium's numbering).
        shape: ``(rows, cols)`` of the grid.
        policy: optional ``(S,)`` integer actions, drawn as arrows using ``moves``.
        moves: action -> ``(d_col, d_row)``; ``FROZENLAKE_MOVES`` or ``CLIFFWALKING_MOVES``.
        desc: optional ``(rows, cols)`` map letters (e.g. FrozenLake's S/F/H/G), printed in the corner of cells.
        terminal: optional ``(S,)`` mask; no arrow is drawn on terminal states.
        mask: optional ``(S,)`` mask of cells drawn blank (light grey, no value, no arrow) and left out of the
            colour scale, e.g. CliffWalking's cliff cells, which are never occupied.
        cbar_label: label of the colour bar (what the colour encodes).
        xlabel, ylabel: axis labels, e.g. ``"column"`` and ``"row"``.
    Returns the matplotlib ``Axes``.
    """
    values = np.asarray(values, dtype=float)
    rows, cols = shape
    if values.shape != (rows * cols,):
        raise ValueError(f"values must have shape ({rows * cols},) for a {rows}x{cols} grid, got {values.shape}")
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
            ax.text(c, r + 0.3, fmt.format(grid[r, c]), ha="center", va="center", fontsize=7, color=color)
        if desc is not None:
            ax.text(c - 0.42, r - 0.3, str(np.asarray(desc)[r, c]), fontsize=7, color=color, weight="bold")
        if hidden[index]:
            continue
        if policy is not None and not (terminal is not None and terminal[index]):
            dx, dy = moves[int(policy[index])]
            ax.arrow(c - 0.2 * dx, r - 0.2 * dy - 0.08, 0.3 * dx, 0.3 * dy, head_width=0.14, color=color)
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


# Face colours of the map letters of gymnasium's grid worlds (FrozenLake S/F/H/G, and C for a cliff).
MAP_COLOURS = {"S": "#9ecae1", "F": "#eef5fb", "H": "#3f4a5a", "G": "#74c476", "C": "#8c6d62", " ": "#ffffff"}


def plot_grid_map(desc, ax=None, title: str | None = None, colours: dict[str, str] | None = None):
    """Draw a grid world's map: each cell coloured by its letter, with the letter and the state number.

    Args:
        desc: ``(rows, cols)`` map letters (FrozenLake's ``S``, ``F``, ``H``, ``G``); states are numbered
            row by row from the top-left corner, as in gymnasium.
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
            ax.text(c, r - 0.08, letter, ha="center", va="center", fontsize=11, weight="bold",
                    color="white" if dark else "black")
            ax.text(c, r + 0.3, str(r * cols + c), ha="center", va="center", fontsize=7,
                    color="white" if dark else "0.3")
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    if title:
        ax.set_title(title)
    return ax


def plot_grid_path(states, shape: tuple[int, int], ax=None, **line_kwargs):
    """Draw the path through the visited ``states`` (row-major indices) on a ``(rows, cols)`` grid."""
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


def plot_training_curves(
    runs: dict[str, list[list[dict]]],
    metrics: list[str],
    axes=None,
    x: str = "step",
    titles: dict[str, str] | None = None,
    smooth: int = 1,
):
    """One panel per metric: for each label, the mean over seeds as a line and the min-max over seeds as a band.

    Args:
        runs: label -> one metric history per seed (``Trainer.history``: a list of dicts, one per step).
            Steps where a metric is missing (``eval_accuracy`` is logged every few steps) are skipped.
        metrics: the keys to plot, e.g. ``["reward", "eval_accuracy", "clip_ratio/region_mean"]``.
        axes: optional sequence of matplotlib axes, one per metric.
        titles: optional metric -> panel title (defaults to the key); the y-axis is labelled with the key too.
        smooth: moving-average window applied to each seed before averaging (1: none).
    Returns the axes.
    """
    if axes is None:
        _, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.2), squeeze=False)
        axes = axes[0]
    if len(axes) != len(metrics):
        raise ValueError(f"got {len(axes)} axes for {len(metrics)} metrics")
    for ax, metric in zip(axes, metrics):
        for colour, (label, histories) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], runs.items()):
            steps, curves = _aligned(histories, metric, x)
            if not curves.size:
                continue
            if smooth > 1:
                kernel = np.ones(smooth) / smooth
                curves = np.stack([np.convolve(c, kernel, mode="valid") for c in curves])
                steps = steps[smooth - 1 :]
            ax.plot(steps, curves.mean(0), color=colour, label=f"{label} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(steps, curves.min(0), curves.max(0), color=colour, alpha=0.2, linewidth=0)
        ax.set_title((titles or {}).get(metric, metric))
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
    axes[0].legend(fontsize="small")
    return axes


def _aligned(histories: list[list[dict]], metric: str, x: str):
    """(steps, (seeds, steps) array) of ``metric`` at the steps every seed logged it."""
    per_seed = [{m[x]: m[metric] for m in history if metric in m} for history in histories]
    common = sorted(set.intersection(*(set(d) for d in per_seed))) if per_seed else []
    return np.asarray(common), np.asarray([[d[s] for s in common] for d in per_seed], dtype=float)
