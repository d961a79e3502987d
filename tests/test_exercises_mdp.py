"""The checkers of the chapter "MDPs and the Bellman equations": references pass, typical mistakes raise.

Each wrong solution below is named after its mistake; the checkers must reject all of them.
"""

import gymnasium as gym
import numpy as np
import pytest

from rlbook.exercises import check_average_reward, check_iterative_policy_evaluation, check_q_value_iteration_step
from rlbook.exercises.mdp import average_reward_reference, random_mdp, random_policy
from rlbook.exercises.mdp import reference_iterative_policy_evaluation as iterative_policy_evaluation
from rlbook.exercises.mdp import reference_q_value_iteration_step as q_value_iteration_step
from rlbook.tabular import FiniteMDP, bellman_expectation_operator, policy_evaluation, q_from_v, value_iteration


# ---------------------------------------------------------------- reference solutions
def iterative_policy_evaluation_as_in_the_chapter(mdp, policy, tol, return_sweeps=False):
    V = np.zeros(mdp.num_states)
    sweeps = 0
    while True:
        Q = mdp.expected_reward + mdp.gamma * mdp.continuation @ V
        V_next = np.sum(policy * Q, axis=1)
        sweeps += 1
        if np.max(np.abs(V_next - V)) <= tol:
            return (V_next, sweeps) if return_sweeps else V_next
        V = V_next


def average_reward(P, R):
    return average_reward_reference(P, R)


def test_references_pass(capsys):
    check_iterative_policy_evaluation(iterative_policy_evaluation)
    check_iterative_policy_evaluation(iterative_policy_evaluation_as_in_the_chapter)
    check_q_value_iteration_step(q_value_iteration_step)
    check_average_reward(average_reward)
    assert capsys.readouterr().out == "ok\nok\nok\nok\n"


@pytest.mark.parametrize("checker", [check_iterative_policy_evaluation, check_q_value_iteration_step])
def test_the_trial_mdps_have_terminal_states_that_list_rewarded_moves(checker, capsys):
    """As CliffWalking's goal does: the rows of terminal states are not reward-0 self-loops."""
    seen = []

    def recording(mdp, *args):
        seen.append(mdp)
        if checker is check_q_value_iteration_step:
            return q_value_iteration_step(mdp, *args)
        return iterative_policy_evaluation(mdp, *args)

    checker(recording)
    with_moves = [
        mdp for mdp in seen
        if any(np.abs(mdp.R[s]).max() > 0.1 and mdp.P[s, :, s].min() < 0.99 for s in np.flatnonzero(mdp.terminal))
    ]
    assert len(with_moves) >= 10
    assert any(mdp.gamma > 0.5 for mdp in with_moves)


# ---------------------------------------------------------------- iterative policy evaluation: wrong solutions
def _iterate(mdp, policy, tol, expected_reward, transitions):
    V = np.zeros(mdp.num_states)
    while True:
        V_next = np.sum(policy * (expected_reward + mdp.gamma * transitions @ V), axis=1)
        if np.max(np.abs(V_next - V)) <= tol:
            return V_next
        V = V_next


def evaluation_ignoring_terminal_states(mdp, policy, tol):
    """Uses mdp.P and mdp.R as they are: rewards collected in, and values bootstrapped from, terminal states."""
    return _iterate(mdp, policy, tol, np.einsum("sat,sat->sa", mdp.P, mdp.R), mdp.P)


def evaluation_bootstrapping_from_terminal_states(mdp, policy, tol):
    """Rewards right (mdp.expected_reward), but P instead of the continuation probabilities."""
    return _iterate(mdp, policy, tol, mdp.expected_reward, mdp.P)


def evaluation_collecting_rewards_in_terminal_states(mdp, policy, tol):
    """Masks terminal next states only: a terminal state still earns its listed rewards and moves on."""
    return _iterate(mdp, policy, tol, np.einsum("sat,sat->sa", mdp.P, mdp.R), mdp.P * ~mdp.terminal)


def evaluation_with_tol_hard_coded(mdp, policy, tol):
    """Ignores its tol argument."""
    return iterative_policy_evaluation(mdp, policy, 1e-7)


def evaluation_returning_the_previous_iterate(mdp, policy, tol):
    V = np.zeros(mdp.num_states)
    while True:
        V_next = bellman_expectation_operator(mdp, V, policy)
        if np.max(np.abs(V_next - V)) <= tol:
            return V
        V = V_next


def evaluation_stopping_after_one_sweep(mdp, policy, tol):
    """V = r_pi: no discounted future at all."""
    return np.sum(policy * mdp.expected_reward, axis=1)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (evaluation_ignoring_terminal_states, "V\\^pi with tol = 1e-10"),
        (evaluation_bootstrapping_from_terminal_states, "V\\^pi with tol = 1e-10"),
        (evaluation_collecting_rewards_in_terminal_states, "V\\^pi with tol = 1e-10"),
        (evaluation_with_tol_hard_coded, "as if tol were ignored"),
        (evaluation_returning_the_previous_iterate, "return the new iterate V_k\\+1, not V_k"),
        (evaluation_stopping_after_one_sweep, "V\\^pi"),
    ],
)
def test_iterative_policy_evaluation_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message) as error:
        check_iterative_policy_evaluation(wrong)
    assert "inputs of trial" in str(error.value) and "mdp.P[s, a, s']" in str(error.value)
    assert "ok" not in capsys.readouterr().out


def test_ignoring_terminal_states_is_far_off_on_cliff_walking():
    """The mistake the checker now catches matters: on CliffWalking (goal 47 lists moves with reward -1) the
    uniformly random policy's values are wrong by more than 10 when terminal states are ignored."""
    cliff = FiniteMDP.from_gymnasium(gym.make("CliffWalking-v1"), gamma=0.9)
    uniform = np.full((cliff.num_states, cliff.num_actions), 0.25)
    wrong = evaluation_ignoring_terminal_states(cliff, uniform, 1e-10)
    assert np.max(np.abs(wrong - policy_evaluation(cliff, uniform))) > 1.0
    assert abs(wrong[47]) > 1.0


# ---------------------------------------------------------------- one sweep of Q-value iteration: wrong solutions
def q_step_ignoring_terminal_states(mdp, Q):
    return np.einsum("sat,sat->sa", mdp.P, mdp.R) + mdp.gamma * mdp.P @ Q.max(axis=1)


def q_step_zeroing_terminal_values_only(mdp, Q):
    """No bootstrap from terminal s' (V(terminal) = 0), but rewards and moves out of terminal s kept."""
    V = Q.max(axis=1) * ~mdp.terminal
    return np.einsum("sat,sat->sa", mdp.P, mdp.R) + mdp.gamma * mdp.P @ V


def q_step_without_gamma(mdp, Q):
    return mdp.expected_reward + mdp.continuation @ Q.max(axis=1)


def q_step_with_mean_instead_of_max(mdp, Q):
    return mdp.expected_reward + mdp.gamma * mdp.continuation @ Q.mean(axis=1)


def q_step_in_place(mdp, Q):
    Q[...] = mdp.expected_reward + mdp.gamma * mdp.continuation @ Q.max(axis=1)
    return Q


@pytest.mark.parametrize(
    "wrong, message",
    [
        (q_step_ignoring_terminal_states, "T\\* Q"),
        (q_step_zeroing_terminal_values_only, "only terminal rows .* are wrong"),
        (q_step_without_gamma, "T\\* Q"),
        (q_step_with_mean_instead_of_max, "T\\* Q"),
        (q_step_in_place, "in place"),
        (lambda mdp, Q: q_from_v(mdp, Q.max(axis=1)).max(axis=1), "shape"),
    ],
)
def test_q_value_iteration_step_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message) as error:
        check_q_value_iteration_step(wrong)
    assert "inputs of trial" in str(error.value)
    assert "ok" not in capsys.readouterr().out


# ---------------------------------------------------------------- a crash reports the trial's inputs
def crash(*args):
    raise ValueError("my bug")


@pytest.mark.parametrize(
    "checker, shown",
    [
        (check_iterative_policy_evaluation, ["S=", "A=", "gamma=", "tol=", "policy =", "seed 20240101"]),
        (check_q_value_iteration_step, ["S=", "A=", "gamma=", "Q =", "seed 20240102"]),
        (check_average_reward, ["S=", "P[s, s']", "R[s]", "seed 20240103"]),
    ],
)
def test_a_crash_of_the_readers_function_reports_the_inputs(checker, shown):
    with pytest.raises(AssertionError, match="your function raised ValueError: my bug") as error:
        checker(crash)
    assert isinstance(error.value.__cause__, ValueError)  # the reader's own traceback is chained
    message = str(error.value)
    assert "inputs of trial 0" in message
    for text in shown:
        assert text in message


def test_an_unwritten_stub_is_not_reported_as_a_crash():
    """The student edition's stubs raise NotImplementedError; it reaches the reader unchanged."""

    def stub(mdp, policy, tol):
        raise NotImplementedError("write your solution here")

    with pytest.raises(NotImplementedError, match="your solution"):
        check_iterative_policy_evaluation(stub)


# ---------------------------------------------------------------- average reward
def test_average_reward_wrong_answers_fail():
    with pytest.raises(AssertionError, match="inputs of trial"):
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


def test_study_note_example_two_state_chain():
    P = np.array([[0.5, 0.5], [0.1, 0.9]])
    np.testing.assert_allclose(average_reward_reference(P, np.array([1.0, 0.0])), [1 / 6, 1 / 6], rtol=1e-12)


# ---------------------------------------------------------------- the random MDP helpers
def test_random_mdp_helpers_are_valid():
    rng = np.random.default_rng(1)
    mdp = random_mdp(rng, 5, 3, 0.9, terminals=2)
    assert mdp.terminal.sum() == 2
    for s in np.flatnonzero(mdp.terminal):  # reward-0 self-loops by default (FrozenLake's holes)
        np.testing.assert_allclose(mdp.P[s, :, s], 1.0, atol=1e-12)
        np.testing.assert_allclose(mdp.R[s], 0.0, atol=1e-12)
    policy = random_policy(rng, 5, 3)
    np.testing.assert_allclose(policy.sum(axis=1), 1.0, rtol=1e-12)


def test_random_mdp_with_terminal_moves_keeps_them_but_values_terminal_states_at_zero():
    mdp = random_mdp(np.random.default_rng(2), 5, 3, 0.9, terminals=2, terminal_moves=True)
    terminal = np.flatnonzero(mdp.terminal)
    assert np.abs(mdp.R[terminal]).max() > 0.1 and mdp.P[terminal][:, :, terminal].max() < 0.99
    np.testing.assert_allclose(mdp.expected_reward[terminal], 0.0, atol=1e-12)
    np.testing.assert_allclose(mdp.continuation[terminal], 0.0, atol=1e-12)
    V = policy_evaluation(mdp, random_policy(np.random.default_rng(3), 5, 3))
    np.testing.assert_allclose(V[terminal], 0.0, atol=1e-12)


def test_terminal_states_have_zero_value_even_when_the_table_lists_moves_out_of_them():
    # CliffWalking's table lets the agent "move" out of the goal (47) with reward -1; the episode is over there,
    # so V*(goal) must be 0, and the start state is worth exactly -13 (13 steps along the cliff edge).
    cliff = FiniteMDP.from_gymnasium(gym.make("CliffWalking-v1"), gamma=1.0)
    result = value_iteration(cliff)
    np.testing.assert_allclose(result.V[47], 0.0, atol=1e-12)
    np.testing.assert_allclose(result.Q[47], 0.0, atol=1e-12)
    np.testing.assert_allclose(result.V[36], -13.0, atol=1e-9)
