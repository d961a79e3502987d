"""The checkers of the chapter "Q-learning" accept the references and reject typical mistakes."""

import numpy as np
import pytest

from rlbook.exercises import check_double_q_learning_update, check_expected_sarsa_update
from rlbook.exercises.q_learning import reference_double_q_learning_update, reference_expected_sarsa_update
from rlbook.tabular import epsilon_greedy_probs, q_learning_update


# ---------------------------------------------------------------- references on hand-computed cases
def test_expected_sarsa_reference_by_hand():
    Q = np.array([[0.5, 0.0], [0.3, 0.8]])
    # pi(.|s') = [0.05, 0.95] for epsilon = 0.1 and 2 actions: E[Q(s',.)] = 0.05 * 0.3 + 0.95 * 0.8 = 0.775
    new = reference_expected_sarsa_update(Q, 0, 0, 1.0, 1, alpha=0.1, gamma=0.99, epsilon=0.1)
    assert new == pytest.approx(0.5 + 0.1 * (1.0 + 0.99 * 0.775 - 0.5))
    np.testing.assert_allclose(Q, [[new, 0.0], [0.3, 0.8]], rtol=1e-12, atol=1e-12)


def test_expected_sarsa_with_epsilon_zero_is_q_learning():
    rng = np.random.default_rng(1)
    for _ in range(20):
        Q = rng.normal(size=(4, 3))
        Q_ref = Q.copy()
        assert reference_expected_sarsa_update(Q, 1, 2, 0.3, 3, 0.5, 0.9, 0.0) == pytest.approx(
            q_learning_update(Q_ref, 1, 2, 0.3, 3, 0.5, 0.9)
        )


def test_double_q_reference_by_hand():
    Q1 = np.array([[0.0, 0.0], [1.0, 2.0]])
    Q2 = np.array([[0.0, 0.0], [5.0, -1.0]])
    # Q1 selects a* = 1 in s' = 1, Q2 evaluates it: target = 1 + 0.5 * (-1) = 0.5
    assert reference_double_q_learning_update(Q1, Q2, 0, 1, 1.0, 1, 1.0, 0.5, update_first=True) == pytest.approx(0.5)
    np.testing.assert_allclose(Q1[0], [0.0, 0.5], atol=1e-12)
    np.testing.assert_allclose(Q2[0], [0.0, 0.0], atol=1e-12)
    # Q2 selects a* = 0, Q1 evaluates it: target = 1 + 0.5 * 1.0 = 1.5
    assert reference_double_q_learning_update(Q1, Q2, 0, 0, 1.0, 1, 1.0, 0.5, update_first=False) == pytest.approx(1.5)
    assert Q2[0, 0] == pytest.approx(1.5)
    # terminated: no bootstrap
    new = reference_double_q_learning_update(Q1, Q2, 0, 0, 2.0, 1, 1.0, 0.5, True, terminated=True)
    assert new == pytest.approx(2.0)


def test_double_q_reference_follows_the_package_tie_rule():
    """Values within 1e-10 of the maximum are tied, and ties go to the lowest action (rlbook.tabular.greedy)."""
    Q2 = np.array([[0.0, 0.0], [10.0, -10.0]])
    for row in ([3.0, 3.0], [3.0, 3.0 + 1e-12]):  # exactly tied, tied up to rounding: a* = 0 both times
        Q1 = np.array([[0.0, 0.0], row])
        assert reference_double_q_learning_update(Q1, Q2, 0, 0, 0.0, 1, 1.0, 1.0, True) == pytest.approx(10.0)
    Q1 = np.array([[0.0, 0.0], [3.0, 3.0 + 1e-6]])  # a real difference: a* = 1
    assert reference_double_q_learning_update(Q1, Q2, 0, 0, 0.0, 1, 1.0, 1.0, True) == pytest.approx(-10.0)


def test_references_pass_their_checkers(capsys):
    check_expected_sarsa_update(reference_expected_sarsa_update)
    check_double_q_learning_update(reference_double_q_learning_update)
    assert capsys.readouterr().out == "ok\nok\n"


# ---------------------------------------------------------------- wrong expected SARSA updates are caught
def expected_sarsa_ignoring_terminated(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    return reference_expected_sarsa_update(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False)


def expected_sarsa_with_max(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    return q_learning_update(Q, s, a, r, s_next, alpha, gamma, terminated)


def expected_sarsa_uniform_mean(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    """Averages Q(s', .) uniformly, as if epsilon were 1."""
    target = r if terminated else r + gamma * Q[s_next].mean()
    Q[s, a] += alpha * (target - Q[s, a])
    return float(Q[s, a])


def expected_sarsa_policy_of_current_state(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    """Weights Q(s', .) with the epsilon-greedy probabilities of Q(s, .), the wrong state."""
    target = r if terminated else r + gamma * epsilon_greedy_probs(Q[s], epsilon) @ Q[s_next]
    Q[s, a] += alpha * (target - Q[s, a])
    return float(Q[s, a])


def expected_sarsa_explore_non_greedy(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    """The study note's reading of epsilon-greedy: exploration only among the non-greedy actions."""
    q = Q[s_next]
    greedy = int(np.argmax(q))
    probs = np.full(len(q), epsilon / max(len(q) - 1, 1))
    probs[greedy] = 1 - epsilon if len(q) > 1 else 1.0
    target = r if terminated else r + gamma * probs @ q
    Q[s, a] += alpha * (target - Q[s, a])
    return float(Q[s, a])


def expected_sarsa_not_in_place(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    return reference_expected_sarsa_update(Q.copy(), s, a, r, s_next, alpha, gamma, epsilon, terminated)


def expected_sarsa_returns_nothing(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    reference_expected_sarsa_update(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated)


def expected_sarsa_returns_target(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=False):
    reference_expected_sarsa_update(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated)
    return float(r if terminated else r + gamma * epsilon_greedy_probs(Q[s_next], epsilon) @ Q[s_next])


@pytest.mark.parametrize(
    "wrong, message",
    [
        (expected_sarsa_ignoring_terminated, "returned value"),
        (expected_sarsa_with_max, "returned value"),
        (expected_sarsa_uniform_mean, "returned value"),
        (expected_sarsa_policy_of_current_state, "returned value"),
        (expected_sarsa_explore_non_greedy, "returned value"),
        (expected_sarsa_not_in_place, "in place"),
        (expected_sarsa_returns_nothing, "returned None"),
        (expected_sarsa_returns_target, "returned value"),
    ],
)
def test_expected_sarsa_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message) as error:
        check_expected_sarsa_update(wrong)
    assert "inputs of trial" in str(error.value)
    assert "ok" not in capsys.readouterr().out


# ---------------------------------------------------------------- wrong double Q-learning updates are caught
def double_q_ignoring_terminated(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated=False):
    return reference_double_q_learning_update(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first)


def double_q_select_and_evaluate_with_same_table(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated=False):
    """Plain Q-learning on the updated table: the maximisation bias double Q-learning removes."""
    return q_learning_update(Q1 if update_first else Q2, s, a, r, s_next, alpha, gamma, terminated)


def double_q_select_with_other_table(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated=False):
    """Roles swapped: the evaluating table selects the action."""
    select, evaluate = (Q1, Q2) if update_first else (Q2, Q1)
    a_star = int(np.argmax(evaluate[s_next]))
    target = r if terminated else r + gamma * select[s_next, a_star]
    select[s, a] += alpha * (target - select[s, a])
    return float(select[s, a])


def double_q_ties_to_last(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated=False):
    select, evaluate = (Q1, Q2) if update_first else (Q2, Q1)
    row = select[s_next]
    a_star = len(row) - 1 - int(np.argmax(row[::-1]))
    target = r if terminated else r + gamma * evaluate[s_next, a_star]
    select[s, a] += alpha * (target - select[s, a])
    return float(select[s, a])


def double_q_always_first(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated=False):
    return reference_double_q_learning_update(Q1, Q2, s, a, r, s_next, alpha, gamma, True, terminated)


def double_q_updates_both(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated=False):
    Q1_old = Q1.copy()
    value = reference_double_q_learning_update(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated)
    reference_double_q_learning_update(Q1_old, Q2, s, a, r, s_next, alpha, gamma, not update_first, terminated)
    return value


@pytest.mark.parametrize(
    "wrong, message",
    [
        (double_q_ignoring_terminated, "returned value"),
        (double_q_select_and_evaluate_with_same_table, "returned value"),
        (double_q_select_with_other_table, "returned value"),
        (double_q_ties_to_last, "returned value"),
        (double_q_always_first, "returned value|Q2\\[s, a\\] after the call"),
        (double_q_updates_both, "table Q2 after the call"),
    ],
)
def test_double_q_checker_rejects(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message) as error:
        check_double_q_learning_update(wrong)
    assert "Q1 before the call" in str(error.value)
    assert "ok" not in capsys.readouterr().out


@pytest.mark.parametrize("checker", [check_expected_sarsa_update, check_double_q_learning_update])
def test_a_crash_of_the_readers_function_reports_the_inputs(checker):
    def broken(*args, **kwargs):
        raise ValueError("my bug")

    with pytest.raises(AssertionError, match="your function raised ValueError: my bug") as error:
        checker(broken)
    assert isinstance(error.value.__cause__, ValueError)  # the reader's own traceback is chained
    message = str(error.value)
    assert "inputs of trial 0 (seed 0)" in message and "s_next=" in message and "before the call" in message
