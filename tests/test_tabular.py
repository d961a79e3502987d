"""Tests for rlbook.tabular: the finite MDP type, exact planning, and TD control."""

import gymnasium as gym
import numpy as np
import pytest

from rlbook.exercises.mdp import random_mdp
from rlbook.tabular import (
    FiniteMDP,
    bellman_expectation_operator,
    bellman_optimality_operator,
    epsilon_greedy_probs,
    greedy_policy,
    greedy_rollout,
    policy_evaluation,
    policy_iteration,
    q_from_v,
    q_learning,
    q_learning_update,
    sarsa,
    sarsa_update,
    value_iteration,
    visit_count_step_size,
)


def two_state_mrp(gamma=0.9):
    P = np.array([[[0.5, 0.5]], [[0.1, 0.9]]])
    return FiniteMDP(P, np.array([[1.0], [0.0]]), gamma)


@pytest.fixture(scope="module")
def frozen_lake():
    return gym.make("FrozenLake-v1")


@pytest.fixture(scope="module")
def frozen_lake_mdp(frozen_lake):
    return FiniteMDP.from_gymnasium(frozen_lake, gamma=0.95)


# --- FiniteMDP: construction and validation -------------------------------------------------------------


def test_rows_that_do_not_sum_to_one_are_named():
    P = np.full((2, 1, 2), 0.5)
    P[1, 0] = [0.5, 0.4]
    with pytest.raises(ValueError, match=r"P\[1, 0, :\] sums to 0.9"):
        FiniteMDP(P, np.zeros((2, 1)), 0.9)


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan")])
def test_gamma_outside_unit_interval_is_rejected(gamma):
    with pytest.raises(ValueError, match="gamma must lie in"):
        FiniteMDP(np.ones((1, 1, 1)), np.zeros((1, 1)), gamma)


@pytest.mark.parametrize(
    "P, R, match",
    [
        (np.ones((2, 2)), np.zeros((2, 2)), "P must have shape"),
        (np.ones((2, 1, 3)) / 3, np.zeros((2, 1)), "P must have shape"),
        (np.ones((2, 1, 2)) / 2, np.zeros((2, 2)), "R must have shape"),
        (np.array([[[1.5, -0.5]], [[0.5, 0.5]]]), np.zeros((2, 1)), "non-negative"),
        (np.ones((2, 1, 2)) / 2, np.array([[np.nan], [0.0]]), "NaN"),
    ],
)
def test_shape_and_value_errors(P, R, match):
    with pytest.raises(ValueError, match=match):
        FiniteMDP(P, R, 0.9)


def test_terminal_and_initial_are_validated():
    P, R = np.ones((2, 1, 2)) / 2, np.zeros((2, 1))
    with pytest.raises(ValueError, match="terminal must have shape"):
        FiniteMDP(P, R, 0.9, terminal=[True])
    with pytest.raises(ValueError, match="probability vector"):
        FiniteMDP(P, R, 0.9, initial=[0.7, 0.7])


def test_mdp_arrays_are_read_only():
    mdp = two_state_mrp()
    with pytest.raises(ValueError):
        mdp.P[0, 0, 0] = 1.0
    with pytest.raises(ValueError):  # the cached derived arrays too: a caller cannot corrupt the cache
        mdp.expected_reward[0, 0] = 1.0
    with pytest.raises(ValueError):
        mdp.continuation[0, 0, 0] = 1.0


def test_expected_reward_averages_over_next_states():
    P = np.array([[[0.25, 0.75]], [[1.0, 0.0]]])
    R = np.array([[[4.0, 0.0]], [[1.0, 9.0]]])
    assert np.allclose(FiniteMDP(P, R, 0.5).expected_reward, [[1.0], [1.0]])


def test_from_gymnasium_frozen_lake(frozen_lake, frozen_lake_mdp):
    mdp = frozen_lake_mdp
    assert (mdp.num_states, mdp.num_actions) == (16, 4)
    assert np.flatnonzero(mdp.terminal).tolist() == [5, 7, 11, 12, 15]
    assert mdp.shape == (4, 4) and mdp.desc[0, 0] == "S" and mdp.desc[3, 3] == "G"
    assert mdp.initial[0] == 1.0
    # Expected rewards agree with gymnasium's own table.
    table = frozen_lake.unwrapped.P
    for s in range(16):
        for a in range(4):
            assert mdp.expected_reward[s, a] == pytest.approx(sum(p * r for p, _, r, _ in table[s][a]))


def test_from_gymnasium_cliff_walking():
    mdp = FiniteMDP.from_gymnasium(gym.make("CliffWalking-v1"), gamma=1.0)
    assert (mdp.num_states, mdp.num_actions) == (48, 4)
    assert np.flatnonzero(mdp.terminal).tolist() == [47]
    assert mdp.shape == (4, 12)
    # Stepping right from the start (36) falls off the cliff: -100 and back to the start.
    assert mdp.P[36, 1, 36] == 1.0 and mdp.R[36, 1, 36] == -100


def test_from_gymnasium_rejects_environments_without_a_model():
    with pytest.raises(TypeError, match="no transition table"):
        FiniteMDP.from_gymnasium(gym.make("CartPole-v1"))


# --- exact planning ---------------------------------------------------------------------------------------


def test_policy_evaluation_two_state_closed_form():
    V = policy_evaluation(two_state_mrp(), np.zeros(2, dtype=int))
    assert np.allclose(V, [95 / 32, 45 / 32])


@pytest.mark.parametrize("seed", range(5))
def test_policy_evaluation_is_the_fixed_point_of_the_expectation_operator(seed):
    mdp = random_mdp(np.random.default_rng(seed), 5, 3, gamma=0.9, terminals=seed % 2)
    policy = np.random.default_rng(seed).dirichlet(np.ones(mdp.num_actions), size=mdp.num_states)
    V = policy_evaluation(mdp, policy)
    assert np.allclose(bellman_expectation_operator(mdp, V, policy), V)
    # V^pi(s) = sum_a pi(a|s) Q^pi(s, a)
    assert np.allclose((policy * q_from_v(mdp, V)).sum(axis=1), V)


def test_terminal_states_have_zero_value(frozen_lake_mdp):
    V = policy_evaluation(frozen_lake_mdp, np.full((16, 4), 0.25))
    assert np.all(V[frozen_lake_mdp.terminal] == 0)


def test_policy_evaluation_rejects_bad_policies(frozen_lake_mdp):
    with pytest.raises(ValueError, match="policy must have shape"):
        policy_evaluation(frozen_lake_mdp, np.zeros((16, 3)))
    with pytest.raises(ValueError, match=r"pi\[0, :\] sums to 2"):
        policy_evaluation(frozen_lake_mdp, np.full((16, 4), 0.5))
    with pytest.raises(IndexError, match="unknown action"):
        policy_evaluation(frozen_lake_mdp, np.full(16, 4))


def test_undiscounted_policy_that_never_terminates_is_reported():
    # Non-slippery FrozenLake, gamma = 1, always LEFT: the agent stays in the first column forever.
    mdp = FiniteMDP.from_gymnasium(gym.make("FrozenLake-v1", is_slippery=False), gamma=1.0)
    with pytest.raises(np.linalg.LinAlgError, match="never reaches a terminal state"):
        policy_evaluation(mdp, np.zeros(16, dtype=int))


@pytest.mark.parametrize("seed", range(5))
def test_value_iteration_solves_the_optimality_equation_and_agrees_with_policy_iteration(seed):
    mdp = random_mdp(np.random.default_rng(seed), 5, 3, gamma=0.8, terminals=1)
    result = value_iteration(mdp, tol=1e-12)
    assert np.allclose(bellman_optimality_operator(mdp, result.V), result.V, atol=1e-10)
    V, policy, _ = policy_iteration(mdp)
    assert np.allclose(V, result.V, atol=1e-9)
    assert np.allclose(policy_evaluation(mdp, result.policy), result.V, atol=1e-9)


def test_value_iteration_obeys_the_contraction_bound(frozen_lake_mdp):
    result = value_iteration(frozen_lake_mdp, tol=1e-12)
    errors = np.abs(result.history - result.V).max(axis=1)
    bound = frozen_lake_mdp.gamma ** np.arange(len(errors)) * errors[0]
    assert np.all(errors <= bound + 1e-12)


def test_frozen_lake_optimal_policy_is_the_known_one(frozen_lake_mdp):
    result = value_iteration(frozen_lake_mdp.with_gamma(0.99))
    # LEFT=0, DOWN=1, RIGHT=2, UP=3; the classic optimal policy on the non-terminal states.
    expected = {0: 0, 1: 3, 2: 3, 3: 3, 4: 0, 6: 0, 8: 3, 9: 1, 10: 0, 13: 2, 14: 1}
    assert {s: int(result.policy[s]) for s in expected} == expected
    assert result.V[0] == pytest.approx(0.5420, abs=1e-4)


def test_greedy_policy_breaks_ties_towards_the_lowest_action():
    assert greedy_policy(np.array([[1.0, 3.0, 3.0], [0.0, 0.0, 0.0]])).tolist() == [1, 0]


# --- epsilon-greedy and the TD updates ------------------------------------------------------------------


def test_epsilon_greedy_seed_example():
    probs = epsilon_greedy_probs([0.2, 0.9, 0.5], 0.1)
    assert np.allclose(probs, [0.1 / 3, 0.9 + 0.1 / 3, 0.1 / 3])
    assert probs[1] == pytest.approx(0.9333, abs=1e-4)


def test_epsilon_greedy_shares_the_greedy_mass_between_ties_and_broadcasts():
    probs = epsilon_greedy_probs(np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]]), 0.2)
    assert np.allclose(probs[0], [0.45, 0.45, 0.05, 0.05])
    assert np.allclose(probs.sum(axis=1), 1.0)


@pytest.mark.parametrize(
    "q, epsilon, match",
    [([1.0, 2.0], 1.1, "epsilon must lie"), ([1.0, np.nan], 0.1, "NaN"), ([], 0.1, "at least one action")],
)
def test_epsilon_greedy_errors(q, epsilon, match):
    with pytest.raises(ValueError, match=match):
        epsilon_greedy_probs(q, epsilon)


def test_q_learning_update_seed_example_in_place():
    Q = np.zeros((2, 2))
    Q[0, 0], Q[1] = 0.5, [0.3, 0.8]
    new = q_learning_update(Q, 0, 0, 1.0, 1, alpha=0.1, gamma=0.99)
    assert new == pytest.approx(0.6292) and Q[0, 0] == pytest.approx(0.6292)


def test_terminal_transitions_do_not_bootstrap():
    Q = np.array([[0.0, 0.0], [10.0, 10.0]])
    assert q_learning_update(Q.copy(), 0, 0, 1.0, 1, 0.5, 0.9, terminated=True) == 0.5
    assert sarsa_update(Q.copy(), 0, 0, 1.0, 1, 1, 0.5, 0.9, terminated=True) == 0.5


def test_sarsa_uses_the_next_action_taken_not_the_max():
    Q = np.array([[0.0, 0.0], [2.0, 6.0]])
    assert sarsa_update(Q, 0, 0, 0.0, 1, 0, alpha=1.0, gamma=0.5) == 1.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(s=5), IndexError, "unknown state 5"),
        (dict(s_next=-1), IndexError, "unknown state -1"),
        (dict(a=2), IndexError, "unknown action 2"),
        (dict(s=1.0), TypeError, "integer index"),
        (dict(alpha=0.0), ValueError, "alpha must lie"),
        (dict(alpha=1.5), ValueError, "alpha must lie"),
        (dict(gamma=1.01), ValueError, "gamma must lie"),
        (dict(r=float("nan")), ValueError, "reward must be finite"),
    ],
)
def test_q_learning_update_errors(kwargs, error, match):
    args = dict(Q=np.zeros((2, 2)), s=0, a=0, r=1.0, s_next=1, alpha=0.1, gamma=0.9) | kwargs
    with pytest.raises(error, match=match):
        q_learning_update(**args)


def test_q_learning_update_needs_a_float_array():
    with pytest.raises(TypeError, match="float numpy array"):
        q_learning_update([[0.0, 0.0]], 0, 0, 1.0, 0, 0.1, 0.9)


def test_visit_count_step_size():
    step = visit_count_step_size(1.0)
    assert [step(n) for n in (1, 2, 4)] == [1.0, 0.5, 0.25]
    with pytest.raises(ValueError, match="power must lie"):
        visit_count_step_size(1.5)


# --- TD control on gymnasium environments ---------------------------------------------------------------


def test_q_learning_is_off_policy_it_finds_q_star_while_acting_at_random():
    env = gym.make("FrozenLake-v1", is_slippery=False)
    q_star = value_iteration(FiniteMDP.from_gymnasium(env, gamma=0.9)).Q
    result = q_learning(env, 3000, alpha=0.5, gamma=0.9, epsilon=1.0, seed=0, q_star=q_star)
    # Deterministic dynamics: a constant step size converges exactly, from a uniformly random behaviour policy.
    assert result.q_error[-1] < 1e-6
    assert result.q_error[0] > 0.1


def test_td_control_is_reproducible_and_validates_arguments(frozen_lake):
    a = q_learning(frozen_lake, 50, seed=3)
    b = q_learning(frozen_lake, 50, seed=3)
    assert np.array_equal(a.Q, b.Q) and np.array_equal(a.episode_returns, b.episode_returns)
    with pytest.raises(ValueError, match="num_episodes"):
        q_learning(frozen_lake, 0)
    with pytest.raises(ValueError, match="epsilon"):
        sarsa(frozen_lake, 5, epsilon=-0.1)
    with pytest.raises(ValueError, match="q_star must have shape"):
        q_learning(frozen_lake, 5, q_star=np.zeros((4, 4)))


def test_cliff_walking_q_learning_takes_the_cliff_edge_and_sarsa_the_safe_path():
    env = gym.make("CliffWalking-v1")
    q_result = q_learning(env, 500, alpha=0.5, gamma=1.0, epsilon=0.1, seed=0)
    s_result = sarsa(env, 500, alpha=0.5, gamma=1.0, epsilon=0.1, seed=0)
    q_path, q_return = greedy_rollout(env, q_result.Q)
    s_path, _ = greedy_rollout(env, s_result.Q)
    assert q_return == -13 and len(q_path) == 14  # the optimal path hugs the cliff (row 2)...
    assert q_path == [36] + list(range(24, 36)) + [47]
    assert s_path[:3] == [36, 24, 12]  # ...SARSA's climbs away from it first
    # ...and, exploring with epsilon = 0.1, SARSA earns more per episode while learning.
    assert s_result.episode_returns[-100:].mean() > q_result.episode_returns[-100:].mean()
