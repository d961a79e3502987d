"""Checkers for the exercises of the chapter "MDPs and the Bellman equations".

Each ``check_<name>(fn)`` runs the reader's ``fn`` and a reference on random finite MDPs (or Markov chains)
built with a seeded generator, raises ``AssertionError`` naming the first disagreement, and prints ``ok``.

- :func:`check_iterative_policy_evaluation`: ``fn(mdp, policy, tol) -> V``, shape ``(S,)``, compared with the
  exact linear solve :func:`rlbook.tabular.policy_evaluation` (equation ``eq-bellman-linear``).
- :func:`check_q_value_iteration_step`: ``fn(mdp, Q) -> T* Q``, shape ``(S, A)`` (equation ``eq-bellman-opt-q``).
- :func:`check_average_reward`: ``fn(P, R) -> lim_{gamma -> 1} (1 - gamma) V_gamma``, shape ``(S,)``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close
from rlbook.tabular.mdp import FiniteMDP
from rlbook.tabular.planning import policy_evaluation, q_from_v

_SEED = 20240101


def random_mdp(rng: np.random.Generator, num_states: int, num_actions: int, gamma: float, terminals: int = 0) -> FiniteMDP:
    """A random finite MDP: Dirichlet transition rows, normal rewards ``R[s, a, s']``, ``terminals`` absorbing states.

    Terminal states loop on themselves with reward 0, as in gymnasium's toy-text environments.
    """
    P = rng.dirichlet(np.full(num_states, 0.5), size=(num_states, num_actions))
    R = rng.normal(size=(num_states, num_actions, num_states))
    terminal = np.zeros(num_states, dtype=bool)
    terminal[rng.choice(num_states, size=terminals, replace=False)] = True
    for s in np.flatnonzero(terminal):
        P[s] = np.eye(num_states)[s]
        R[s] = 0.0
    return FiniteMDP(P, R, gamma, terminal=terminal)


def random_policy(rng: np.random.Generator, num_states: int, num_actions: int) -> np.ndarray:
    """A random stochastic policy ``pi[s, a]``, shape ``(S, A)``, rows summing to one."""
    return rng.dirichlet(np.ones(num_actions), size=num_states)


def _cases(rng: np.random.Generator, count: int):
    """Random MDPs of varied size and discount, some with terminal states, including gamma = 0."""
    for case in range(count):
        num_states = int(rng.integers(1, 7))
        num_actions = int(rng.integers(1, 4))
        gamma = 0.0 if case == 0 else float(rng.choice([0.5, 0.9, 0.95]))
        terminals = int(rng.integers(0, num_states)) if case % 2 else 0
        yield case, random_mdp(rng, num_states, num_actions, gamma, terminals)


def check_iterative_policy_evaluation(fn: Callable, count: int = 30) -> None:
    """Check ``fn(mdp, policy, tol) -> V`` (shape ``(S,)``) against the exact ``V^pi`` of a linear solve.

    ``policy`` is a stochastic matrix ``pi[s, a]`` of shape ``(S, A)``; the checker passes ``tol = 1e-10``.
    """
    rng = np.random.default_rng(_SEED)
    for case, mdp in _cases(rng, count):
        policy = random_policy(rng, mdp.num_states, mdp.num_actions)
        expected = policy_evaluation(mdp, policy)
        got = fn(mdp, policy, 1e-10)
        assert_close(
            got, expected, f"case {case} (S={mdp.num_states}, A={mdp.num_actions}, gamma={mdp.gamma}, "
            f"{int(mdp.terminal.sum())} terminal state(s)): V^pi", atol=1e-6, rtol=1e-6,
        )
    print("ok")


def check_q_value_iteration_step(fn: Callable, count: int = 30) -> None:
    """Check ``fn(mdp, Q) -> T* Q`` (shape ``(S, A)``), one sweep of the Bellman optimality operator on Q.

    ``(T* Q)(s, a) = sum_s' P(s'|s,a) [R(s,a,s') + gamma max_a' Q(s', a')]``, the bootstrap term dropped
    for terminal ``s'``. ``fn`` must not modify ``Q``.
    """
    rng = np.random.default_rng(_SEED + 1)
    for case, mdp in _cases(rng, count):
        Q = rng.normal(size=(mdp.num_states, mdp.num_actions))
        before = Q.copy()
        expected = q_from_v(mdp, Q.max(axis=1))
        got = fn(mdp, Q)
        if not np.array_equal(Q, before):
            raise AssertionError(f"case {case}: fn modified its input Q in place; return a new array instead")
        assert_close(
            got, expected, f"case {case} (S={mdp.num_states}, A={mdp.num_actions}, gamma={mdp.gamma}, "
            f"{int(mdp.terminal.sum())} terminal state(s)): (T* Q)", atol=1e-10, rtol=1e-10,
        )
    print("ok")


def average_reward_reference(P: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``lim_{gamma -> 1} (1 - gamma) V_gamma = (mu @ R) * ones(S)`` for an irreducible chain ``P`` (shape ``(S, S)``).

    ``mu`` is the stationary distribution, the solution of ``mu P = mu`` with ``sum(mu) = 1``.
    """
    P = np.asarray(P, dtype=float)
    num_states = P.shape[0]
    # mu (P - I) = 0 together with sum(mu) = 1: replace one (redundant) balance equation by the normalisation.
    system = (P - np.eye(num_states)).T
    system[-1] = 1.0
    rhs = np.zeros(num_states)
    rhs[-1] = 1.0
    mu = np.linalg.solve(system, rhs)
    return np.full(num_states, mu @ np.asarray(R, dtype=float))


def check_average_reward(fn: Callable, count: int = 30) -> None:
    """Check ``fn(P, R) -> lim_{gamma -> 1} (1 - gamma) V_gamma`` (shape ``(S,)``) on random Markov reward processes.

    ``P`` is a transition matrix of shape ``(S, S)`` with all entries positive, ``R`` the rewards, shape ``(S,)``.
    """
    rng = np.random.default_rng(_SEED + 2)
    for case in range(count):
        num_states = int(rng.integers(1, 7))
        P = rng.dirichlet(np.ones(num_states), size=num_states) * 0.98 + 0.02 / num_states
        R = rng.normal(size=num_states)
        expected = average_reward_reference(P, R)
        got = fn(P.copy(), R.copy())
        assert_close(got, expected, f"case {case} (S={num_states}): lim (1 - gamma) V_gamma", atol=1e-8, rtol=1e-6)
    print("ok")
