"""The VAPO chapter's exercise checkers accept the reference and reject the usual mistakes with a helpful message."""

import numpy as np
import pytest

from rlbook.exercises.vapo import (
    check_decoupled_gae,
    check_length_adaptive_lam,
    reference_decoupled_gae,
    reference_length_adaptive_lam,
)


def test_length_adaptive_lam_accepts_the_reference(capsys):
    check_length_adaptive_lam(reference_length_adaptive_lam, num_trials=40)
    assert capsys.readouterr().out.strip() == "ok"


def test_length_adaptive_lam_reference_matches_vapo_numbers():
    # alpha = 0.05: 0 up to l = 20 (clamped), 0.5 at 40, 0.9 at 200, 0.99 at 2000
    got = reference_length_adaptive_lam([1, 20, 40, 200, 2000], 0.05)
    np.testing.assert_allclose(got, [0.0, 0.0, 0.5, 0.9, 0.99], atol=1e-6)


def test_length_adaptive_lam_names_a_missing_clamp():
    def unclamped(lengths, alpha):
        return 1.0 - 1.0 / (alpha * np.asarray(lengths, dtype=float))

    with pytest.raises(AssertionError, match="clamp it"):
        check_length_adaptive_lam(unclamped)


def test_length_adaptive_lam_rejects_in_place_changes_and_crashes():
    def in_place(lengths, alpha):
        lengths += 0
        lengths[0] = 5
        return reference_length_adaptive_lam(lengths, alpha)

    with pytest.raises(AssertionError, match="in place"):
        check_length_adaptive_lam(in_place)
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_length_adaptive_lam(lambda lengths, alpha: 1 / 0)


def test_decoupled_gae_accepts_the_reference(capsys):
    check_decoupled_gae(reference_decoupled_gae, num_trials=40)
    assert capsys.readouterr().out.strip() == "ok"


def test_decoupled_gae_reference_at_lam_critic_one_gives_monte_carlo_returns():
    rng = np.random.default_rng(0)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=float)
    rewards, values = rng.normal(size=(2, 4)) * mask, rng.normal(size=(2, 4)) * mask
    _, returns = reference_decoupled_gae(rewards, values, mask, 1.0, np.array([0.3, 0.7]), 1.0)
    reward_to_go = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1] * mask
    np.testing.assert_allclose(returns, reward_to_go, atol=1e-10)


def test_decoupled_gae_names_coupled_returns():
    def coupled(rewards, values, mask, gamma, lam_policy, lam_critic):
        advantages, _ = reference_decoupled_gae(rewards, values, mask, gamma, lam_policy, lam_critic)
        return advantages, advantages + values * mask

    with pytest.raises(AssertionError, match="the critic's targets use lam_critic"):
        check_decoupled_gae(coupled)


def test_decoupled_gae_rejects_swapped_lambdas_and_a_single_output():
    def swapped(rewards, values, mask, gamma, lam_policy, lam_critic):
        advantages, _ = reference_decoupled_gae(rewards, values, mask, gamma, np.full(len(rewards), lam_critic),
                                                lam_critic)
        return advantages, reference_decoupled_gae(rewards, values, mask, gamma, lam_policy, lam_critic)[1]

    with pytest.raises(AssertionError, match="advantages"):
        check_decoupled_gae(swapped)
    with pytest.raises(AssertionError, match=r"must return \(advantages, returns\)"):
        check_decoupled_gae(lambda *args: None)
