"""The GFPO chapter's exercise checker accepts the reference and rejects the usual mistakes with a helpful message."""

import numpy as np
import pytest

from rlbook.exercises.gfpo import check_gfpo_advantages, reference_gfpo_advantages


def _z(x):
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return np.zeros_like(x)
    return (x - x.mean()) / (x.std(ddof=1) + 1e-4)


def _by_hand(rewards, lengths, G, k, metric, statistics="kept", keep_worst=False):
    """A plain loop over groups; ``statistics="group"`` z-scores with the whole group (a mistake)."""
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), G):
        r, n = np.asarray(rewards[start:start + G], float), np.asarray(lengths[start:start + G], float)
        score = -n if metric == "length" else r / n
        order = np.argsort(score if keep_worst else -score, kind="stable")
        kept = np.zeros(G, bool)
        kept[order[:k]] = True
        z = _z(r[kept]) if statistics == "kept" else _z(r)[kept]
        out[start:start + G][kept] = z
    return out


def test_accepts_the_reference_and_a_plain_loop(capsys):
    check_gfpo_advantages(reference_gfpo_advantages, num_trials=60)
    check_gfpo_advantages(_by_hand, num_trials=60)
    assert capsys.readouterr().out.strip() == "ok\nok"


def test_reference_on_a_small_group():
    # G = 4, keep the 2 shortest (lengths 3 and 5, rewards 1 and 0): z-scores +-1/sqrt(2), the others 0
    got = reference_gfpo_advantages([1.0, 0.0, 1.0, 0.0], [3, 5, 9, 7], 4, 2, "length")
    np.testing.assert_allclose(got, [0.5**0.5, -(0.5**0.5), 0.0, 0.0], atol=1e-3)


def test_names_whole_group_statistics():
    with pytest.raises(AssertionError, match="over the kept ones only"):
        check_gfpo_advantages(lambda r, n, G, k, m: _by_hand(r, n, G, k, m, statistics="group"))


def test_names_keeping_the_worst():
    with pytest.raises(AssertionError, match="kept the worst k"):
        check_gfpo_advantages(lambda r, n, G, k, m: _by_hand(r, n, G, k, m, keep_worst=True))


def test_reports_crash_none_and_in_place_changes():
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_gfpo_advantages(lambda r, n, G, k, m: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_gfpo_advantages(lambda r, n, G, k, m: None)

    def sorts(r, n, G, k, m):
        out = reference_gfpo_advantages(r, n, G, k, m)
        n.sort()
        return out

    with pytest.raises(AssertionError, match="in place"):
        check_gfpo_advantages(sorts)
