"""Tests for rlbook.tabular: the finite MDP type, exact planning, and TD control."""

import gymnasium as gym
import numpy as np
import pytest

from rlbook.exercises.mdp import random_mdp
from rlbook.tabular import (
    TIE_ATOL,
    FiniteMDP,
    bellman_expectation_operator,
    bellman_optimality_operator,
    epsilon_greedy_probs,
    greedy_action,
    greedy_mask,
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
    assert mdp.initial[0] == pytest.approx(1.0)
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
    assert mdp.P[36, 1, 36] == pytest.approx(1.0) and mdp.R[36, 1, 36] == pytest.approx(-100)


def test_toy_text_terminations_are_per_state_in_frozen_lake_and_cliff_walking(frozen_lake_mdp):
    # Every terminating transition enters a terminal state, so the per-transition mask adds nothing there and the
    # models (and every result computed from them) are the same as with per-state termination alone.
    for mdp in (frozen_lake_mdp, FiniteMDP.from_gymnasium(gym.make("CliffWalking-v1"), gamma=1.0)):
        expected = np.broadcast_to(mdp.terminal[None, None, :], mdp.P.shape)
        assert (mdp.terminates == expected).all()
        same = FiniteMDP(mdp.P, mdp.R, mdp.gamma, mdp.terminal)
        np.testing.assert_allclose(mdp.continuation, same.continuation, rtol=0, atol=1e-12)
        np.testing.assert_allclose(value_iteration(mdp).V, value_iteration(same).V, rtol=0, atol=1e-12)


def test_per_transition_termination_feeds_the_continuation():
    # One state, two actions that both return to it: action 1 ends the episode (reward 5), action 0 goes on.
    P = np.ones((1, 2, 1))
    R = np.array([[1.0, 5.0]])
    mdp = FiniteMDP(P, R, 0.9, terminates=np.array([[[False], [True]]]))
    assert not mdp.terminal[0]
    np.testing.assert_allclose(mdp.continuation[0, :, 0], [1.0, 0.0], atol=1e-12)
    # V* = max(5, 1 + 0.9 V*) = 10: going on forever is worth 1 / (1 - 0.9) = 10 > 5.
    np.testing.assert_allclose(value_iteration(mdp, tol=1e-12).V, [10.0], atol=1e-9)
    np.testing.assert_allclose(policy_evaluation(mdp, np.array([1])), [5.0], atol=1e-12)
    np.testing.assert_allclose(mdp.with_gamma(0.5).continuation, mdp.continuation, atol=1e-12)  # kept by with_gamma
    with pytest.raises(ValueError, match="terminates must be a boolean array of shape"):
        FiniteMDP(P, R, 0.9, terminates=np.zeros((1, 2, 1)))


@pytest.fixture(scope="module")
def taxi():
    env = gym.make("Taxi-v4")
    return env, FiniteMDP.from_gymnasium(env, gamma=1.0)


def test_from_gymnasium_taxi_marks_termination_per_transition(taxi):
    # A successful drop-off ends the episode in a state the taxi can also drive into, so no state is terminal:
    # the episode ends on the 4 drop-off transitions (one per destination) instead.
    env, mdp = taxi
    assert (mdp.num_states, mdp.num_actions) == (500, 6)
    assert not mdp.terminal.any()
    ends = np.argwhere(mdp.terminates)
    assert len(ends) == 4 and set(ends[:, 1].tolist()) == {5}  # action 5: drop off
    for s, a, s_next in ends:
        (prob, next_state, reward, terminated), = env.unwrapped.P[int(s)][int(a)]
        assert terminated and next_state == s_next and reward == pytest.approx(20)
        assert mdp.continuation[s, a].sum() == pytest.approx(0.0)
    np.testing.assert_allclose(mdp.initial, env.unwrapped.initial_state_distrib, atol=1e-12)


def test_taxi_optimal_values_match_greedy_rollouts(taxi):
    # Each step costs -1 and the drop-off pays +20 instead, so with gamma = 1 an optimal episode of n steps
    # returns 21 - n: V* takes integer values between 3 (the farthest states) and 20 (one drop-off away).
    env, mdp = taxi
    result = value_iteration(mdp)
    np.testing.assert_allclose(result.V, np.round(result.V), atol=1e-9)
    assert result.V.min() == pytest.approx(3.0) and result.V.max() == pytest.approx(20.0)
    for s, a, _ in np.argwhere(mdp.terminates):
        assert result.V[s] == pytest.approx(20.0) and result.policy[s] == a
    # The greedy policy terminates from every state, so its exact evaluation exists and equals V*.
    np.testing.assert_allclose(policy_evaluation(mdp, result.policy), result.V, atol=1e-9)
    discounted = value_iteration(mdp.with_gamma(0.9), tol=1e-12)
    for seed in range(5):  # the environment itself (deterministic): rollouts return exactly V*(start)
        states, total = greedy_rollout(env, result.Q, seed=seed)
        steps = len(states) - 1
        assert steps < 200 and total == pytest.approx(result.V[states[0]]) and total == pytest.approx(21 - steps)
        rewards = [-1.0] * (steps - 1) + [20.0]
        discounted_return = sum(0.9**t * r for t, r in enumerate(rewards))
        assert discounted_return == pytest.approx(discounted.V[states[0]], abs=1e-8)


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
    np.testing.assert_allclose(V[frozen_lake_mdp.terminal], 0.0, atol=1e-12)


def test_policy_evaluation_rejects_bad_policies(frozen_lake_mdp):
    with pytest.raises(ValueError, match="policy must have shape"):
        policy_evaluation(frozen_lake_mdp, np.zeros((16, 3)))
    with pytest.raises(ValueError, match=r"pi\[0, :\] sums to 2"):
        policy_evaluation(frozen_lake_mdp, np.full((16, 4), 0.5))
    with pytest.raises(IndexError, match="unknown action"):
        policy_evaluation(frozen_lake_mdp, np.full(16, 4))


def test_undiscounted_policy_that_never_terminates_is_reported_with_the_trapped_states():
    # Non-slippery FrozenLake, gamma = 1, always LEFT: from the first column the agent bumps into the wall for
    # ever (states 0, 4, 8, 12 minus the hole 12), and from every other non-terminal state it walks left into
    # that column or into a hole; states 1, 2, 3 slide to 0, and 9, 10 walk to 8.
    mdp = FiniteMDP.from_gymnasium(gym.make("FrozenLake-v1", is_slippery=False), gamma=1.0)
    with pytest.raises(np.linalg.LinAlgError, match="with gamma = 1") as error:
        policy_evaluation(mdp, np.zeros(16, dtype=int))
    message = str(error.value)
    assert "never ends the episode from 8 state(s) (0, 1, 2, 3, 4, 8, 9, 10)" in message
    assert "neither a terminal state nor a terminating transition" in message


def test_a_gamma_too_close_to_one_is_reported_as_such():
    mdp = FiniteMDP.from_gymnasium(gym.make("FrozenLake-v1", is_slippery=False), gamma=1 - 1e-14)
    with pytest.raises(np.linalg.LinAlgError, match="so close to 1"):
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


# --- the one tie rule (rlbook.tabular.greedy) ----------------------------------------------------------------


def test_greedy_policy_breaks_ties_towards_the_lowest_action():
    assert greedy_policy(np.array([[1.0, 3.0, 3.0], [0.0, 0.0, 0.0]])).tolist() == [1, 0]


# A row whose first and third values are tied up to rounding (1e-12 apart), and a real difference (1e-6).
NEAR_TIE = np.array([1.0, 0.0, 1.0 + 1e-12, 0.5])
REAL_GAP = np.array([1.0, 0.0, 1.0 + 1e-6, 0.5])


def test_greedy_set_is_every_action_within_the_tolerance_of_the_maximum():
    assert TIE_ATOL == pytest.approx(1e-10)
    assert greedy_mask(NEAR_TIE).tolist() == [True, False, True, False]
    assert greedy_mask(REAL_GAP).tolist() == [False, False, True, False]
    assert greedy_mask(REAL_GAP, atol=1e-5).tolist() == [True, False, True, False]
    assert greedy_action(NEAR_TIE) == 0 and greedy_action(REAL_GAP) == 2
    assert greedy_action(np.stack([NEAR_TIE, REAL_GAP])).tolist() == [0, 2]
    with pytest.raises(ValueError, match="NaN"):
        greedy_mask([1.0, np.nan])


def test_every_greedy_function_applies_the_same_tie_rule():
    Q = np.stack([NEAR_TIE, REAL_GAP, np.zeros(4)])
    # Deterministic choices take the lowest index of the greedy set...
    assert greedy_policy(Q).tolist() == [0, 2, 0]
    # ...and epsilon-greedy spreads its greedy mass uniformly over the same set, so the deterministic greedy
    # action always has the largest epsilon-greedy probability.
    probs = epsilon_greedy_probs(Q, 0.0)
    np.testing.assert_allclose(probs, [[0.5, 0, 0.5, 0], [0, 0, 1, 0], [0.25] * 4], atol=1e-12)
    np.testing.assert_allclose(epsilon_greedy_probs(Q, 0.2)[0], [0.45, 0.05, 0.45, 0.05], atol=1e-12)
    assert (greedy_mask(Q) == (probs > 0)).all()
    for row in range(len(Q)):
        assert probs[row, greedy_policy(Q)[row]] == pytest.approx(probs[row].max())


def test_greedy_rollout_breaks_near_ties_like_greedy_policy():
    # Non-slippery FrozenLake, actions LEFT=0 and RIGHT=2 tied up to rounding in every state: np.argmax would walk
    # right, the tie rule picks LEFT, the lowest index, and the agent stays against the wall in state 0.
    env = gym.make("FrozenLake-v1", is_slippery=False)
    Q = np.tile(NEAR_TIE, (16, 1))
    states, total = greedy_rollout(env, Q, max_steps=3)
    assert states == [0, 0, 0, 0] and total == pytest.approx(0.0)
    assert greedy_policy(Q)[0] == 0


def test_policy_iteration_keeps_an_action_that_is_greedy_up_to_rounding():
    # Two actions with the same effect: whichever the policy holds is kept, so the loop cannot cycle.
    P = np.zeros((2, 2, 2))
    P[0, :, 1] = 1.0
    P[1, :, 1] = 1.0
    mdp = FiniteMDP(P, np.array([[1.0, 1.0 + 1e-13], [0.0, 0.0]]), 0.9, terminal=[False, True])
    for start in (0, 1):
        _, policy, iterations = policy_iteration(mdp, np.array([start, 0]))
        assert policy.tolist() == [start, 0] and iterations == 1


# --- epsilon-greedy and the TD updates ------------------------------------------------------------------


def test_epsilon_greedy_study_note_example():
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


def test_q_learning_update_study_note_example_in_place():
    Q = np.zeros((2, 2))
    Q[0, 0], Q[1] = 0.5, [0.3, 0.8]
    new = q_learning_update(Q, 0, 0, 1.0, 1, alpha=0.1, gamma=0.99)
    assert new == pytest.approx(0.6292) and Q[0, 0] == pytest.approx(0.6292)


def test_terminal_transitions_do_not_bootstrap():
    Q = np.array([[0.0, 0.0], [10.0, 10.0]])
    assert q_learning_update(Q.copy(), 0, 0, 1.0, 1, 0.5, 0.9, terminated=True) == pytest.approx(0.5)
    assert sarsa_update(Q.copy(), 0, 0, 1.0, 1, 1, 0.5, 0.9, terminated=True) == pytest.approx(0.5)


def test_sarsa_uses_the_next_action_taken_not_the_max():
    Q = np.array([[0.0, 0.0], [2.0, 6.0]])
    assert sarsa_update(Q, 0, 0, 0.0, 1, 0, alpha=1.0, gamma=0.5) == pytest.approx(1.0)


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
    assert [step(n) for n in (1, 2, 4)] == pytest.approx([1.0, 0.5, 0.25])
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
    np.testing.assert_allclose(a.Q, b.Q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.episode_returns, b.episode_returns, rtol=0, atol=1e-12)
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
    assert q_return == pytest.approx(-13) and len(q_path) == 14  # the optimal path hugs the cliff (row 2)...
    assert q_path == [36] + list(range(24, 36)) + [47]
    assert s_path[:3] == [36, 24, 12]  # ...SARSA's climbs away from it first
    # ...and, exploring with epsilon = 0.1, SARSA earns more per episode while learning.
    assert s_result.episode_returns[-100:].mean() > q_result.episode_returns[-100:].mean()
