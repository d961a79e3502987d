"""Plots used across the book: grid-world value maps, greedy-policy arrows and paths."""

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
):
    """Heat-map of state values on a grid, with the value in each cell and the policy as arrows.

    Args:
        values: ``(S,)`` state values, ``S = rows * cols`` in row-major order (gymnasium's numbering).
        shape: ``(rows, cols)`` of the grid.
        policy: optional ``(S,)`` integer actions, drawn as arrows using ``moves``.
        moves: action -> ``(d_col, d_row)``; ``FROZENLAKE_MOVES`` or ``CLIFFWALKING_MOVES``.
        desc: optional ``(rows, cols)`` map letters (e.g. FrozenLake's S/F/H/G), printed in the corner of cells.
        terminal: optional ``(S,)`` mask; no arrow is drawn on terminal states.
    Returns the matplotlib ``Axes``.
    """
    values = np.asarray(values, dtype=float)
    rows, cols = shape
    if values.shape != (rows * cols,):
        raise ValueError(f"values must have shape ({rows * cols},) for a {rows}x{cols} grid, got {values.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.9 * cols + 1.5, 0.9 * rows + 0.5))
    grid = values.reshape(rows, cols)
    image = ax.imshow(grid, cmap=cmap)
    plt.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    middle = (grid.max() + grid.min()) / 2
    for index in range(rows * cols):
        r, c = divmod(index, cols)
        color = "black" if grid[r, c] > middle else "white"
        ax.text(c, r + 0.3, fmt.format(grid[r, c]), ha="center", va="center", fontsize=7, color=color)
        if desc is not None:
            ax.text(c - 0.42, r - 0.3, str(np.asarray(desc)[r, c]), fontsize=7, color=color, weight="bold")
        if policy is not None and not (terminal is not None and terminal[index]):
            dx, dy = moves[int(policy[index])]
            ax.arrow(c - 0.2 * dx, r - 0.2 * dy - 0.08, 0.3 * dx, 0.3 * dy, head_width=0.14, color=color)
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
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
