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


def test_training_curves_plot_mean_and_band_over_seeds():
    from rlbook.plotting import plot_training_curves

    def history(offset):
        return [{"step": s, "reward": s + offset, **({"eval_accuracy": 0.5} if s % 2 == 0 else {})} for s in range(1, 7)]

    axes = plot_training_curves({"a": [history(0), history(2)], "b": [history(1)]}, ["reward", "eval_accuracy"])
    line = axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 3, 4, 5, 6] and list(line.get_ydata()) == [2, 3, 4, 5, 6, 7]
    assert list(axes[1].get_lines()[0].get_xdata()) == [2, 4, 6]
    assert len(axes[0].collections) == 1, "one band: only label 'a' has more than one seed"
    with pytest.raises(ValueError, match="2 axes for 1 metrics"):
        plot_training_curves({"a": [history(0)]}, ["reward"], axes=list(axes))
