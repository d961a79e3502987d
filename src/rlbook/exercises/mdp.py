"""Checkers for the exercises of the chapter "MDPs and the Bellman equations".

Each ``check_<name>(fn)`` runs the reader's ``fn`` and a reference on random finite MDPs (or Markov chains)
built with a seeded generator, raises ``AssertionError`` naming the first disagreement together with the inputs
of that trial (also when ``fn`` itself crashes), and prints ``ok``.

- :func:`check_iterative_policy_evaluation`: ``fn(mdp, policy, tol) -> V``, shape ``(S,)``: with a tiny ``tol``
  compared with the exact linear solve :func:`rlbook.tabular.policy_evaluation`, with a loose ``tol`` with the
  iterate at which the stopping rule ``||V_{k+1} - V_k||_inf <= tol`` first holds (so ``tol`` must be used).
- :func:`check_q_value_iteration_step`: ``fn(mdp, Q) -> T* Q``, shape ``(S, A)`` (Bellman optimality equation for Q).
- :func:`check_average_reward`: ``fn(P, R) -> lim_{gamma -> 1} (1 - gamma) V_gamma``, shape ``(S,)``.

The trial MDPs include terminal states whose rows still list moves with non-zero rewards, as CliffWalking's goal
does, so a solution that bootstraps from terminal states, or collects rewards in them, is caught.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, checker
from rlbook.tabular.mdp import FiniteMDP
from rlbook.tabular.planning import bellman_expectation_operator, policy_evaluation, q_from_v

_SEED = 20240101
_TIGHT_TOL = 1e-10


def random_mdp(
    rng: np.random.Generator,
    num_states: int,
    num_actions: int,
    gamma: float,
    terminals: int = 0,
    terminal_moves: bool = False,
) -> FiniteMDP:
    """A random finite MDP: Dirichlet transition rows, normal rewards ``R[s, a, s']``, ``terminals`` terminal states.

    By default terminal states loop on themselves with reward 0, as FrozenLake's holes do. With
    ``terminal_moves=True`` they keep their random moves and non-zero rewards, as CliffWalking's goal does: the
    episode is over there all the same (``FiniteMDP`` gives them value 0), but a computation that ignores
    ``terminal`` gets them wrong.
    """
    P = rng.dirichlet(np.full(num_states, 0.5), size=(num_states, num_actions))
    R = rng.normal(size=(num_states, num_actions, num_states))
    terminal = np.zeros(num_states, dtype=bool)
    terminal[rng.choice(num_states, size=terminals, replace=False)] = True
    if not terminal_moves:
        for s in np.flatnonzero(terminal):
            P[s] = np.eye(num_states)[s]
            R[s] = 0.0
    return FiniteMDP(P, R, gamma, terminal=terminal)


def random_policy(rng: np.random.Generator, num_states: int, num_actions: int) -> np.ndarray:
    """A random stochastic policy ``pi[s, a]``, shape ``(S, A)``, rows summing to one."""
    return rng.dirichlet(np.ones(num_actions), size=num_states)


def _cases(rng: np.random.Generator, count: int):
    """Random MDPs of varied size and discount, including gamma = 0; every odd case has terminal states whose
    rows list moves with non-zero rewards (CliffWalking's goal), every third of those self-loops (FrozenLake's)."""
    for case in range(count):
        num_states = int(rng.integers(2, 7))
        num_actions = int(rng.integers(1, 4))
        gamma = 0.0 if case == 0 else float(rng.choice([0.5, 0.9, 0.95]))
        terminals = int(rng.integers(1, num_states)) if case % 2 else 0
        yield case, random_mdp(rng, num_states, num_actions, gamma, terminals, terminal_moves=case % 6 != 5)


def _show(name: str, array: np.ndarray) -> str:
    return f"\n  {name} =\n{np.array2string(np.asarray(array), precision=4, suppress_small=True)}"


def _describe(checker: str, seed: int, case: int, mdp: FiniteMDP, **extra) -> str:
    """The inputs of a trial, so that the reader can rebuild it: sizes, seed, discount, terminal states, arrays."""
    head = (
        f"  inputs of trial {case} of {checker} (seed {seed}): S={mdp.num_states}, A={mdp.num_actions}, "
        f"gamma={mdp.gamma}, terminal states {np.flatnonzero(mdp.terminal).tolist()}"
    )
    scalars = "".join(f", {name}={value!r}" for name, value in extra.items() if np.ndim(value) == 0)
    arrays = [(name, value) for name, value in extra.items() if np.ndim(value) > 0]
    shown = "".join(_show(name, value) for name, value in arrays)  # the reader's own inputs first, then the MDP
    shown += _show("mdp.P[s, a, s']", mdp.P) + _show("mdp.R[s, a, s']", mdp.R)
    return head + scalars + shown


def _iterates(mdp: FiniteMDP, policy: np.ndarray, max_sweeps: int = 8) -> tuple[list[np.ndarray], list[float]]:
    """``V_0 = 0, V_{k+1} = T^pi V_k`` for a few sweeps, and the step sizes ``d_k = ||V_{k+1} - V_k||_inf``."""
    V = [np.zeros(mdp.num_states)]
    for _ in range(max_sweeps):
        V.append(bellman_expectation_operator(mdp, V[-1], policy))
    return V, [float(np.max(np.abs(b - a))) for a, b in zip(V, V[1:])]


def _loose_tol(steps: list[float]) -> tuple[float, int] | None:
    """A tolerance well inside a gap ``d_K < tol < d_{K-1}`` (K = 3, 2 or 1), so that the stopping rule first holds
    after sweep K + 1 whatever the rounding; returns ``(tol, K)``, or None when the steps vanish at once."""
    for K in (3, 2, 1):
        if steps[K] > 1e-4 and steps[K - 1] > 1.04 * steps[K]:  # gamma <= 0.95: d_{k+1} <= 0.95 d_k
            return float(np.sqrt(steps[K - 1] * steps[K])), K
    return None


@checker
def check_iterative_policy_evaluation(fn: Callable, count: int = 30) -> None:
    """Check ``fn(mdp, policy, tol) -> V`` (shape ``(S,)``), iterative policy evaluation from ``V_0 = 0``.

    ``policy`` is a stochastic matrix ``pi[s, a]`` of shape ``(S, A)``. Each trial calls ``fn`` twice: with
    ``tol = 1e-10`` the result must be the exact ``V^pi`` of a linear solve; with a loose ``tol`` it must be the
    iterate ``V_{k+1}`` at which ``||V_{k+1} - V_k||_inf <= tol`` first holds (so ``tol`` must stop the loop).
    """
    rng = np.random.default_rng(_SEED)
    checker = "check_iterative_policy_evaluation"
    for case, mdp in _cases(rng, count):
        policy = random_policy(rng, mdp.num_states, mdp.num_actions)
        exact = policy_evaluation(mdp, policy)
        inputs = _describe(checker, _SEED, case, mdp, tol=_TIGHT_TOL, policy=policy)
        got = call_reader(fn, (mdp, policy.copy(), _TIGHT_TOL), inputs)
        assert_close(got, exact, f"trial {case}: V^pi with tol = {_TIGHT_TOL}", atol=1e-7, rtol=1e-7, inputs=inputs)

        iterates, steps = _iterates(mdp, policy)
        loose = _loose_tol(steps)
        if loose is None:
            continue
        tol, K = loose
        inputs = _describe(checker, _SEED, case, mdp, tol=tol, policy=policy)
        got = call_reader(fn, (mdp, policy.copy(), tol), inputs)
        expected = iterates[K + 1]
        if np.shape(got) == expected.shape and not np.allclose(got, expected, atol=1e-9, rtol=1e-9):
            diagnosis = _loose_tol_diagnosis(case, np.asarray(got, float), iterates, exact, tol, K)
            raise AssertionError(f"{diagnosis}\n{inputs}")
        what = f"trial {case}: V after the stopping rule with tol = {tol:.6g}"
        assert_close(got, expected, what, atol=1e-9, rtol=1e-9, inputs=inputs)
    print("ok")


def _loose_tol_diagnosis(case: int, got: np.ndarray, iterates: list, exact: np.ndarray, tol: float, K: int) -> str:
    """Name the likely mistake when the result with a loose ``tol`` is not the iterate the stopping rule gives."""
    expected = iterates[K + 1]
    head = (
        f"trial {case}: with tol = {tol:.6g}, starting from V_0 = 0, ||V_k+1 - V_k||_inf <= tol first holds after "
        f"sweep {K + 1}, so the result is V_{K + 1} (max |V_{K + 1} - V^pi| = {np.max(np.abs(expected - exact)):.3g}); "
    )
    if np.allclose(got, exact, atol=1e-6):
        return head + "yours is V^pi itself, as if tol were ignored: stop as soon as the step is at most tol"
    for k, V in enumerate(iterates):
        if np.allclose(got, V, atol=1e-9, rtol=1e-9):
            return head + f"yours is V_{k}: " + (
                "return the new iterate V_k+1, not V_k" if k == K else "check the stopping rule and the start V_0 = 0"
            )
    worst = int(np.argmax(np.abs(got - expected)))
    return head + f"yours differs at state {worst}: expected {expected[worst]:.6g}, got {got[worst]:.6g}"


@checker
def check_q_value_iteration_step(fn: Callable, count: int = 30) -> None:
    """Check ``fn(mdp, Q) -> T* Q`` (shape ``(S, A)``), one sweep of the Bellman optimality operator on Q.

    ``(T* Q)(s, a) = sum_s' P(s'|s,a) [R(s,a,s') + gamma max_a' Q(s', a')]``, the bootstrap term dropped
    for terminal ``s'``, and 0 in a terminal ``s`` (the episode is over). ``fn`` must not modify ``Q``.
    """
    rng = np.random.default_rng(_SEED + 1)
    for case, mdp in _cases(rng, count):
        Q = rng.normal(size=(mdp.num_states, mdp.num_actions))
        before = Q.copy()
        inputs = _describe("check_q_value_iteration_step", _SEED + 1, case, mdp, Q=before)
        expected = q_from_v(mdp, Q.max(axis=1))
        got = call_reader(fn, (mdp, Q), inputs)
        if not np.array_equal(Q, before):
            raise AssertionError(f"trial {case}: fn modified its input Q in place; return a new array\n{inputs}")
        try:
            assert_close(got, expected, f"trial {case}: (T* Q)", atol=1e-10, rtol=1e-10)
        except AssertionError as error:
            hint = ""
            if np.shape(got) == expected.shape and np.any(mdp.terminal):
                wrong_rows = np.flatnonzero(~np.isclose(got, expected, atol=1e-10, rtol=1e-10).all(axis=1))
                if np.all(mdp.terminal[wrong_rows]):
                    hint = (f"\n  only terminal rows {wrong_rows.tolist()} are wrong: the episode is over in a "
                            "terminal state, so (T* Q)(s, a) = 0 there (use mdp.expected_reward and mdp.continuation)")
            raise AssertionError(f"{error}{hint}\n{inputs}") from None
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


@checker
def check_average_reward(fn: Callable, count: int = 30) -> None:
    """Check ``fn(P, R) -> lim_{gamma -> 1} (1 - gamma) V_gamma`` (shape ``(S,)``) on random Markov reward processes.

    ``P`` is a transition matrix of shape ``(S, S)`` with all entries positive, ``R`` the rewards, shape ``(S,)``.
    """
    rng = np.random.default_rng(_SEED + 2)
    for case in range(count):
        num_states = int(rng.integers(1, 7))
        P = rng.dirichlet(np.ones(num_states), size=num_states) * 0.98 + 0.02 / num_states
        R = rng.normal(size=num_states)
        inputs = f"  inputs of trial {case} of check_average_reward (seed {_SEED + 2}): S={num_states}" + _show(
            "P[s, s']", P
        ) + _show("R[s]", R)
        expected = average_reward_reference(P, R)
        got = call_reader(fn, (P.copy(), R.copy()), inputs)
        assert_close(got, expected, f"trial {case}: lim (1 - gamma) V_gamma", atol=1e-8, rtol=1e-6, inputs=inputs)
    print("ok")


# ------------------------------------------------ references in the checkers' naming (used by ``checker``)
def reference_iterative_policy_evaluation(mdp: FiniteMDP, policy: np.ndarray, tol: float) -> np.ndarray:
    """V^pi by repeated Bellman expectation sweeps from V = 0 until a sweep moves V by at most ``tol``."""
    V = np.zeros(mdp.num_states)
    while True:
        V_next = bellman_expectation_operator(mdp, V, policy)
        if np.max(np.abs(V_next - V)) <= tol:
            return V_next
        V = V_next


def reference_q_value_iteration_step(mdp: FiniteMDP, Q: np.ndarray) -> np.ndarray:
    """One sweep of Q-value iteration: ``r(s, a) + gamma * sum_s' p(s' | s, a) max_a' Q(s', a')``."""
    return mdp.expected_reward + mdp.gamma * mdp.continuation @ Q.max(axis=1)


reference_average_reward = average_reward_reference
