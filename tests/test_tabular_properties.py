"""Property-based tests of rlbook.tabular (issue 23): random small MDPs and Q-tables give finite results, and bad
inputs (wrong shapes, gamma or epsilon outside [0, 1], alpha <= 0, tol or max_iterations out of range) raise a
ValueError that names the argument. (An unknown state or action index stays an IndexError, as documented.)"""

import inspect

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbook.tabular import greedy, mdp, planning, td
from rlbook.tabular.mdp import FiniteMDP

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)
COVERED: set[str] = {"TDControlResult", "ValueIterationResult"}  # result records, no behaviour of their own


def covers(*names):
    COVERED.update(names)
    return lambda test: test


def public_names():
    return {n for module in (mdp, planning, td, greedy) for n, f in vars(module).items()
            if not n.startswith("_") and callable(f) and getattr(f, "__module__", None) == module.__name__
            and (inspect.isfunction(f) or inspect.isclass(f))}


def test_every_public_function_has_a_property_test():
    missing = public_names() - COVERED
    assert not missing, f"public functions of rlbook.tabular without a property test: {sorted(missing)}"


def check(call, *names):
    """``call()`` returns finite numbers, or raises a ValueError naming one of ``names``."""
    try:
        result = call()
    except ValueError as error:
        assert any(name in str(error) for name in names), f"{error!r} names none of {names}"
        return None
    for x in result if isinstance(result, tuple) else (result,):
        if isinstance(x, (np.ndarray, float, int, np.floating, np.integer)):
            assert np.all(np.isfinite(x)), x
    return result


@st.composite
def mdps(draw, gamma=st.floats(0.0, 0.9)):
    S, A = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    P = rng.dirichlet(np.ones(S) * draw(st.sampled_from([0.1, 1.0])), size=(S, A))
    scale = draw(st.sampled_from([0.0, 1.0, 1e6]))
    R = rng.uniform(-scale, scale, size=(S, A, S) if draw(st.booleans()) else (S, A))
    terminal = rng.random(S) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    return FiniteMDP(P, R, draw(gamma), terminal)


@st.composite
def q_tables(draw, shape=None):
    S, A = shape or (draw(st.integers(1, 5)), draw(st.integers(1, 4)))
    values = st.floats(-1e6, 1e6) | st.sampled_from([0.0, 1e6, -1e6])
    return np.array(draw(st.lists(values, min_size=S * A, max_size=S * A)), dtype=float).reshape(S, A)


@covers("check_gamma", "FiniteMDP")
@SETTINGS
@given(model=mdps(), gamma=st.floats(-1, 2) | st.just(float("nan")))
def test_finite_mdp_and_gamma(model, gamma):
    check(lambda: mdp.check_gamma(gamma), "gamma")
    check(lambda: model.with_gamma(gamma), "gamma")
    S, A = model.num_states, model.num_actions
    check(lambda: FiniteMDP(model.P * 1.5, model.R, 0.9), "P")
    check(lambda: FiniteMDP(model.P, np.zeros((S, A + 1)), 0.9), "R")
    check(lambda: FiniteMDP(model.P[:, :, :-1] if S > 1 else np.zeros((1, A, 2)), model.R, 0.9), "P")
    check(lambda: FiniteMDP(model.P, model.R, 0.9, terminal=np.zeros(S + 1, bool)), "terminal")
    check(lambda: FiniteMDP(model.P, model.R, 0.9, initial=np.full(S, 2.0)), "initial")
    assert np.all(np.isfinite(model.expected_reward)) and np.all(np.isfinite(model.continuation))


@covers("as_policy_matrix", "q_from_v", "bellman_expectation_operator", "bellman_optimality_operator",
        "greedy_policy", "policy_evaluation")
@SETTINGS
@given(model=mdps(), data=st.data())
def test_bellman_operators_and_evaluation(model, data):
    S, A = model.num_states, model.num_actions
    V = np.array(data.draw(st.lists(st.floats(-1e6, 1e6), min_size=S, max_size=S)))
    policy = np.random.default_rng(0).dirichlet(np.ones(A), size=S)
    check(lambda: planning.as_policy_matrix(model, policy), "policy")
    check(lambda: planning.as_policy_matrix(model, policy[:, ::-1] * 2), "policy")
    check(lambda: planning.as_policy_matrix(model, np.ones((S, A + 1))), "policy")
    Q = check(lambda: planning.q_from_v(model, V), "V")
    check(lambda: planning.q_from_v(model, np.zeros(S + 1)), "V")
    check(lambda: planning.bellman_expectation_operator(model, V, policy), "V", "policy")
    check(lambda: planning.bellman_optimality_operator(model, V), "V")
    check(lambda: planning.greedy_policy(Q), "Q")
    check(lambda: planning.greedy_policy(Q[0]), "Q")
    check(lambda: planning.policy_evaluation(model, policy), "policy")


@covers("value_iteration", "policy_iteration")
@SETTINGS
@given(model=mdps(), tol=st.sampled_from([1e-8, 0.0, -1.0]), max_iterations=st.sampled_from([1000, 0, -1]))
def test_value_and_policy_iteration(model, tol, max_iterations):
    S = model.num_states
    result = check(lambda: planning.value_iteration(model, tol=tol, max_iterations=max_iterations),
                   "tol", "max_iterations")
    if result is not None:
        assert np.all(np.isfinite(result.V)) and np.all(np.isfinite(result.Q))
    check(lambda: planning.value_iteration(model, V0=np.zeros(S + 1)), "V0")
    check(lambda: planning.policy_iteration(model, max_iterations=max_iterations), "max_iterations")
    check(lambda: planning.policy_iteration(model, policy=np.zeros(S + 1, dtype=int)), "policy")


@covers("greedy_mask", "greedy_action", "epsilon_greedy_probs")
@SETTINGS
@given(Q=q_tables(), epsilon=st.floats(-0.5, 1.5) | st.just(float("nan")),
       atol=st.sampled_from([1e-10, 0.0, -1.0]))
def test_greedy_and_epsilon_greedy(Q, epsilon, atol):
    check(lambda: greedy.greedy_mask(Q, atol), "atol")
    check(lambda: greedy.greedy_action(Q, atol), "atol")
    check(lambda: greedy.greedy_action(Q[0]), "q_values")
    probs = check(lambda: td.epsilon_greedy_probs(Q, epsilon), "epsilon")
    if probs is not None:
        assert np.allclose(probs.sum(-1), 1) and np.all(probs >= 0)
    check(lambda: greedy.greedy_mask(np.zeros((2, 0))), "q_values")


@covers("q_learning_update", "sarsa_update", "visit_count_step_size")
@SETTINGS
@given(Q=q_tables(), data=st.data(), alpha=st.floats(-1, 2), gamma=st.floats(-0.5, 1.5),
       r=st.floats(-1e6, 1e6), terminated=st.booleans())
def test_td_updates(Q, data, alpha, gamma, r, terminated):
    S, A = Q.shape
    s, s_next = data.draw(st.integers(0, S - 1)), data.draw(st.integers(0, S - 1))
    a, a_next = data.draw(st.integers(0, A - 1)), data.draw(st.integers(0, A - 1))
    check(lambda: td.q_learning_update(Q.copy(), s, a, r, s_next, alpha, gamma, terminated), "alpha", "gamma")
    check(lambda: td.sarsa_update(Q.copy(), s, a, r, s_next, a_next, alpha, gamma, terminated), "alpha", "gamma")
    check(lambda: td.q_learning_update(Q.copy(), s, a, float("nan"), s_next, 0.1, 0.9), "reward")
    power = data.draw(st.floats(-1, 2))
    schedule = check(lambda: td.visit_count_step_size(power), "power")
    if schedule is not None:
        assert all(0 < schedule(n) <= 1 for n in (1, 2, 10**6))


@covers("q_learning", "sarsa", "greedy_rollout")
@settings(max_examples=15, deadline=None, derandomize=True)
@given(alpha=st.sampled_from([0.1, 1.0, 0.0, -0.1, 1.5]), gamma=st.sampled_from([0.0, 0.99, 1.0, -0.1, 1.1]),
       epsilon=st.sampled_from([0.0, 0.1, 1.0, -0.1, 1.1]), episodes=st.integers(0, 2), seed=st.integers(0, 9))
def test_td_control_and_rollout(alpha, gamma, epsilon, episodes, seed):
    env = gym.make("FrozenLake-v1", map_name="4x4", is_slippery=True)
    for method in (td.q_learning, td.sarsa):
        result = check(lambda: method(env, episodes, alpha=alpha, gamma=gamma, epsilon=epsilon, seed=seed,
                                      max_steps_per_episode=20), "alpha", "gamma", "epsilon", "num_episodes")
        if result is not None:
            assert np.all(np.isfinite(result.Q)) and np.all(np.isfinite(result.episode_returns))
        check(lambda: method(env, 1, q_star=np.zeros((3, 3))), "q_star")
    check(lambda: td.greedy_rollout(env, np.zeros((16, 4)), max_steps=10, seed=seed), "Q")
    check(lambda: td.greedy_rollout(env, np.zeros((3, 4))), "Q")


@pytest.mark.parametrize("call, name", [
    (lambda: planning.value_iteration(FiniteMDP(np.ones((1, 1, 1)), np.zeros((1, 1)), 0.5), max_iterations=0),
     "max_iterations"),  # was a RuntimeError "did not converge in 0 iterations"
    (lambda: planning.policy_iteration(FiniteMDP(np.ones((1, 1, 1)), np.zeros((1, 1)), 0.5), max_iterations=0),
     "max_iterations"),
    (lambda: td.greedy_rollout(gym.make("FrozenLake-v1"), np.zeros((3, 4))), "Q"),  # was an IndexError
])
def test_cases_the_properties_found(call, name):
    with pytest.raises(ValueError, match=name):
        call()
