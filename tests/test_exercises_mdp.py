"""The checkers of the chapter "MDPs and the Bellman equations": references pass, typical mistakes raise."""

import numpy as np
import pytest

from rlbook.exercises import check_average_reward, check_iterative_policy_evaluation, check_q_value_iteration_step
from rlbook.exercises.mdp import average_reward_reference, random_mdp, random_policy
from rlbook.tabular import FiniteMDP, bellman_expectation_operator, policy_evaluation, q_from_v


def iterative_policy_evaluation(mdp, policy, tol):
    V = np.zeros(mdp.num_states)
    while True:
        V_next = bellman_expectation_operator(mdp, V, policy)
        if np.max(np.abs(V_next - V)) <= tol:
            return V_next
        V = V_next


def q_value_iteration_step(mdp, Q):
    return mdp.expected_reward + mdp.gamma * mdp.continuation @ Q.max(axis=1)


def average_reward(P, R):
    return average_reward_reference(P, R)


def test_references_pass(capsys):
    check_iterative_policy_evaluation(iterative_policy_evaluation)
    check_q_value_iteration_step(q_value_iteration_step)
    check_average_reward(average_reward)
    assert capsys.readouterr().out == "ok\nok\nok\n"


def test_policy_evaluation_without_gamma_fails():
    def no_discount_after_first_step(mdp, policy, tol):  # stops after one sweep: V = r_pi
        return np.sum(policy * mdp.expected_reward, axis=1)

    with pytest.raises(AssertionError, match="V\\^pi"):
        check_iterative_policy_evaluation(no_discount_after_first_step)


def test_bootstrapping_from_absorbing_zero_reward_terminals_is_harmless():
    def bootstraps_from_terminals(mdp, policy, tol):
        V = np.zeros(mdp.num_states)
        for _ in range(1_000):  # gamma <= 0.95: 0.95^1000 is negligible
            Q = mdp.expected_reward + mdp.gamma * mdp.P @ V  # P instead of the continuation probabilities
            V = np.sum(policy * Q, axis=1)
        return V

    # Terminal states here loop on themselves with reward 0, so this mistake is harmless: V(terminal) = 0 anyway.
    check_iterative_policy_evaluation(bootstraps_from_terminals)


def test_q_step_without_gamma_fails():
    def missing_gamma(mdp, Q):
        return mdp.expected_reward + mdp.continuation @ Q.max(axis=1)

    with pytest.raises(AssertionError, match="T\\* Q"):
        check_q_value_iteration_step(missing_gamma)


def test_q_step_with_mean_instead_of_max_fails():
    def expectation_not_max(mdp, Q):
        return mdp.expected_reward + mdp.gamma * mdp.continuation @ Q.mean(axis=1)

    with pytest.raises(AssertionError):
        check_q_value_iteration_step(expectation_not_max)


def test_q_step_that_modifies_its_input_fails():
    def in_place(mdp, Q):
        Q[...] = mdp.expected_reward + mdp.gamma * mdp.continuation @ Q.max(axis=1)
        return Q

    with pytest.raises(AssertionError, match="in place"):
        check_q_value_iteration_step(in_place)


def test_q_step_with_wrong_shape_fails():
    with pytest.raises(AssertionError, match="shape"):
        check_q_value_iteration_step(lambda mdp, Q: q_from_v(mdp, Q.max(axis=1)).max(axis=1))


def test_average_reward_wrong_answers_fail():
    with pytest.raises(AssertionError):
        check_average_reward(lambda P, R: np.full(len(R), np.mean(R)))  # uniform weights, not stationary ones
    with pytest.raises(AssertionError, match="shape"):
        check_average_reward(lambda P, R: average_reward_reference(P, R)[0])


def test_average_reward_reference_matches_discounted_values_near_one():
    rng = np.random.default_rng(0)
    for num_states in [1, 2, 5]:
        P = rng.dirichlet(np.ones(num_states), size=num_states)
        R = rng.normal(size=num_states)
        gamma = 1 - 1e-7
        mrp = FiniteMDP(P[:, None, :], R[:, None], gamma)
        V = policy_evaluation(mrp, np.zeros(num_states, dtype=int))
        np.testing.assert_allclose((1 - gamma) * V, average_reward_reference(P, R), atol=1e-5)


def test_seed_example_two_state_chain():
    P = np.array([[0.5, 0.5], [0.1, 0.9]])
    np.testing.assert_allclose(average_reward_reference(P, np.array([1.0, 0.0])), [1 / 6, 1 / 6])


def test_random_mdp_helpers_are_valid():
    rng = np.random.default_rng(1)
    mdp = random_mdp(rng, 5, 3, 0.9, terminals=2)
    assert mdp.terminal.sum() == 2
    assert np.all(mdp.expected_reward[mdp.terminal] == 0)
    policy = random_policy(rng, 5, 3)
    np.testing.assert_allclose(policy.sum(axis=1), 1.0)


def test_terminal_states_have_zero_value_even_when_the_table_lists_moves_out_of_them():
    # CliffWalking's table lets the agent "move" out of the goal (47) with reward -1; the episode is over there,
    # so V*(goal) must be 0, and the start state is worth exactly -13 (13 steps along the cliff edge).
    import gymnasium as gym

    from rlbook.tabular import value_iteration

    cliff = FiniteMDP.from_gymnasium(gym.make("CliffWalking-v1"), gamma=1.0)
    result = value_iteration(cliff)
    assert result.V[47] == 0 and np.all(result.Q[47] == 0)
    assert result.V[36] == -13
