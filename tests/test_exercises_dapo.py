"""The DAPO chapter's exercise checkers accept the reference and reject the usual mistakes with a helpful message."""

import numpy as np
import pytest

from rlbook.exercises.dapo import (
    check_informative_groups,
    check_soft_overlong_penalty,
    reference_informative_groups,
    reference_soft_overlong_penalty,
)


def test_soft_overlong_penalty_accepts_the_reference(capsys):
    check_soft_overlong_penalty(reference_soft_overlong_penalty, num_trials=50)
    assert capsys.readouterr().out.strip() == "ok"


def test_soft_overlong_penalty_reference_matches_dapo_numbers():
    # the paper's setting: L_max = 20480, L_cache = 4096 -> 0 at 16384, -0.5 at 18432, -1 at 20480 and beyond
    got = reference_soft_overlong_penalty([0, 16384, 18432, 20480, 30000], 20480, 4096)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -1.0], atol=1e-12)


def test_soft_overlong_penalty_names_a_ramp_that_starts_late():
    def late(lengths, max_length, cache_length):
        lengths = np.asarray(lengths, dtype=float)
        return np.where(lengths <= max_length, np.minimum(0.0, (max_length - lengths) / cache_length), -1.0)

    with pytest.raises(AssertionError, match="ramp starts at L_max"):
        check_soft_overlong_penalty(late)


def test_soft_overlong_penalty_catches_a_strict_knot():
    def strict(lengths, max_length, cache_length):
        lengths = np.asarray(lengths, dtype=float)
        ramp = (max_length - cache_length - lengths) / cache_length
        return np.where(lengths <= max_length - cache_length, 0.0, np.where(lengths < max_length, ramp, -1.0)) * 0.5

    with pytest.raises(AssertionError, match="soft overlong penalty"):
        check_soft_overlong_penalty(strict)


def test_soft_overlong_penalty_reports_a_crash_and_none():
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_soft_overlong_penalty(lambda lengths, m, c: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_soft_overlong_penalty(lambda lengths, m, c: None)


def test_informative_groups_accepts_the_reference(capsys):
    check_informative_groups(reference_informative_groups, num_trials=60)
    assert capsys.readouterr().out.strip() == "ok"


def test_informative_groups_rejects_a_mean_based_filter():
    # a filter on the group mean (0 < mean < 1) is right for 0/1 rewards, wrong for +-1 or shaped rewards
    def by_mean(rewards, num_generations):
        means = np.asarray(rewards, dtype=float).reshape(-1, num_generations).mean(-1)
        return (means > 0) & (means < 1)

    with pytest.raises(AssertionError, match="informative groups: group"):
        check_informative_groups(by_mean)


def test_informative_groups_rejects_wrong_shape_and_dtype():
    with pytest.raises(AssertionError, match="one flag per group"):
        check_informative_groups(lambda rewards, G: np.ones(len(rewards), dtype=bool))
    with pytest.raises(AssertionError, match="bool array"):
        check_informative_groups(lambda rewards, G: reference_informative_groups(rewards, G).astype(int))


def test_informative_groups_rejects_in_place_changes():
    def sorts(rewards, num_generations):
        rewards.sort()
        return reference_informative_groups(rewards, num_generations)

    with pytest.raises(AssertionError, match="in place"):
        check_informative_groups(sorts)
