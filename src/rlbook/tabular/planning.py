"""Exact planning in a known finite MDP: policy evaluation, value iteration and policy iteration.

Equation numbers refer to the chapter "MDPs and the Bellman equations".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlbook.tabular.greedy import TIE_ATOL, greedy_action, greedy_mask
from rlbook.tabular.mdp import FiniteMDP


def as_policy_matrix(mdp: FiniteMDP, policy) -> np.ndarray:
    """Return ``policy`` as a stochastic matrix ``pi[s, a]`` of shape ``(S, A)``.

    ``policy`` is either such a matrix or a deterministic policy: an integer action per state, shape ``(S,)``.
    """
    policy = np.asarray(policy)
    S, A = mdp.num_states, mdp.num_actions
    if policy.shape == (S,) and np.issubdtype(policy.dtype, np.integer):
        if policy.min() < 0 or policy.max() >= A:
            raise IndexError(f"unknown action in deterministic policy: valid actions are 0..{A - 1}")
        return np.eye(A)[policy]
    if policy.shape != (S, A):
        raise ValueError(f"policy must have shape ({S},) of integer actions or ({S}, {A}), got {policy.shape}")
    policy = policy.astype(float)
    if not np.all(np.isfinite(policy)) or np.any(policy < 0):
        raise ValueError("policy must hold finite, non-negative probabilities")
    row_sums = policy.sum(axis=1)
    if np.any(np.abs(row_sums - 1) > 1e-8):
        s = int(np.argmax(np.abs(row_sums - 1)))
        raise ValueError(f"policy rows must sum to 1: pi[{s}, :] sums to {row_sums[s]:.6g}")
    return policy


def q_from_v(mdp: FiniteMDP, V: np.ndarray) -> np.ndarray:
    """One-step look-ahead, shape ``(S, A)``: ``Q(s,a) = sum_s' P(s'|s,a) [R(s,a,s') + gamma
    V(s')]``.

    The bootstrap term is dropped for terminal ``s'`` (the episode ends there).
    """
    V = np.asarray(V, dtype=float)
    if V.shape != (mdp.num_states,):
        raise ValueError(f"V must have shape ({mdp.num_states},), got {V.shape}")
    return mdp.expected_reward + mdp.gamma * mdp.continuation @ V


def bellman_expectation_operator(mdp: FiniteMDP, V: np.ndarray, policy) -> np.ndarray:
    """``(T^pi V)(s) = sum_a pi(a|s) sum_s' P(s'|s,a) [R(s,a,s') + gamma V(s')]`` (Bellman expectation equation)."""
    pi = as_policy_matrix(mdp, policy)
    return np.sum(pi * q_from_v(mdp, V), axis=1)


def bellman_optimality_operator(mdp: FiniteMDP, V: np.ndarray) -> np.ndarray:
    """``(T* V)(s) = max_a sum_s' P(s'|s,a) [R(s,a,s') + gamma V(s')]`` (Bellman optimality
    equation)."""
    return q_from_v(mdp, V).max(axis=1)


def greedy_policy(Q: np.ndarray, atol: float = TIE_ATOL) -> np.ndarray:
    """The deterministic policy ``argmax_a Q(s, a)``, shape ``(S,)``; ties within ``atol`` go to the lowest action
    (the tie rule of :mod:`rlbook.tabular.greedy`)."""
    Q = np.asarray(Q, dtype=float)
    if Q.ndim != 2:
        raise ValueError(f"Q must have shape (S, A), got {Q.shape}")
    return greedy_action(Q, atol)


def policy_evaluation(mdp: FiniteMDP, policy) -> np.ndarray:
    """Exact ``V^pi`` by one linear solve: ``V = (I - gamma P_pi)^{-1} r_pi``.

    ``P_pi[s, s'] = sum_a pi(a|s) continuation[s, a, s']`` (the probability of going on to ``s'``)
    and ``r_pi[s] = sum_a pi(a|s) r(s, a)``. Raises if the system is singular, which happens when
    ``gamma = 1`` and the policy, from some states, never ends the episode; the error lists such
    states.
    """
    pi = as_policy_matrix(mdp, policy)
    P_pi = np.einsum("sa,sat->st", pi, mdp.continuation)
    r_pi = np.sum(pi * mdp.expected_reward, axis=1)
    system = np.eye(mdp.num_states) - mdp.gamma * P_pi
    if np.linalg.cond(system) > 1e12:
        raise np.linalg.LinAlgError(_singular_reason(mdp.gamma, P_pi))
    return np.linalg.solve(system, r_pi)


def _singular_reason(gamma: float, P_pi: np.ndarray, shown: int = 8) -> str:
    """Why ``I - gamma P_pi`` is singular: the states from which the episode never ends under the policy."""
    # The episode can end from s when, with positive probability, some reachable state leaks probability out of
    # P_pi (a terminal state or a terminating transition). Grow that set backwards until it stops changing.
    can_end = P_pi.sum(axis=1) < 1 - 1e-12
    while True:
        grown = can_end | ((P_pi > 0) & can_end[None, :]).any(axis=1)
        if np.array_equal(grown, can_end):
            break
        can_end = grown
    never = np.flatnonzero(~can_end)
    if len(never) == 0:
        return f"I - gamma P_pi is numerically singular (gamma = {gamma}); use a smaller gamma"
    listed = ", ".join(str(int(s)) for s in never[:shown]) + (", ..." if len(never) > shown else "")
    trapped = (
        f"this policy never ends the episode from {len(never)} state(s) ({listed}): from there it reaches "
        "neither a terminal state nor a terminating transition"
    )
    if gamma == 1.0:
        return (
            f"I - gamma P_pi is singular: with gamma = 1, {trapped}, so the return sums rewards forever and "
            "V^pi is undefined; use gamma < 1 or a policy that ends the episode from every state"
        )
    return (
        f"I - gamma P_pi is numerically singular: gamma = {gamma} is so close to 1 and {trapped}, so V^pi there "
        "is of order 1 / (1 - gamma); use a smaller gamma or a policy that ends the episode from every state"
    )


@dataclass
class ValueIterationResult:
    """What :func:`value_iteration` returns.

    Attributes:
        V: the optimal state values ``V*``, shape ``(S,)``.
        Q: the optimal action values ``Q*``, shape ``(S, A)``.
        policy: a greedy (optimal) deterministic policy, shape ``(S,)``.
        history: the iterates ``V_0, V_1, ..., V_K``, shape ``(K + 1, S)``.
    """

    V: np.ndarray
    Q: np.ndarray
    policy: np.ndarray
    history: np.ndarray

    @property
    def iterations(self) -> int:
        return len(self.history) - 1


def value_iteration(
    mdp: FiniteMDP, V0: np.ndarray | None = None, tol: float = 1e-10, max_iterations: int = 100_000
) -> ValueIterationResult:
    """Iterate ``V_{k+1} = T* V_k`` until ``||V_{k+1} - V_k||_inf <= tol``.

    For ``gamma < 1`` the operator is a gamma-contraction in the max-norm, so
    ``||V_k - V*|| <= gamma^k ||V_0 - V*||``.
    """
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    _check_max_iterations(max_iterations)
    V = np.zeros(mdp.num_states) if V0 is None else np.asarray(V0, dtype=float).copy()
    if V.shape != (mdp.num_states,):
        raise ValueError(f"V0 must have shape ({mdp.num_states},), got {V.shape}")
    history = [V]
    for _ in range(max_iterations):
        V_next = bellman_optimality_operator(mdp, V)
        history.append(V_next)
        if np.max(np.abs(V_next - V)) <= tol:
            Q = q_from_v(mdp, V_next)
            return ValueIterationResult(V_next, Q, greedy_policy(Q), np.array(history))
        V = V_next
    raise RuntimeError(f"value iteration did not converge to tol={tol} in {max_iterations} "
                       "iterations")


def policy_iteration(mdp: FiniteMDP, policy=None,
                     max_iterations: int = 1_000) -> tuple[np.ndarray, np.ndarray, int]:
    """Alternate exact evaluation and greedy improvement until the policy is stable.

    Returns ``(V, policy, iterations)``. The initial policy defaults to action 0 everywhere; with
    ``gamma = 1`` pass one that terminates (a proper policy), or evaluation is singular.
    """
    _check_max_iterations(max_iterations)
    policy = np.zeros(mdp.num_states, dtype=int) if policy is None else np.asarray(policy)
    if policy.shape != (mdp.num_states,) or not np.issubdtype(policy.dtype, np.integer):
        raise ValueError(f"policy must be one integer action per state, shape ({mdp.num_states},)")
    for iteration in range(1, max_iterations + 1):
        V = policy_evaluation(mdp, policy)
        Q = q_from_v(mdp, V)
        # Keep the current action when it is still greedy, so that ties cannot make the loop cycle.
        still_greedy = greedy_mask(Q)[np.arange(mdp.num_states), policy]
        improved = np.where(still_greedy, policy, greedy_policy(Q))
        if np.array_equal(improved, policy):
            return V, policy, iteration
        policy = improved
    raise RuntimeError(f"policy iteration did not stabilise in {max_iterations} iterations")


def _check_max_iterations(max_iterations: int) -> None:
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, (int, np.integer)) or max_iterations < 1:
        raise ValueError(f"max_iterations must be an integer >= 1, got {max_iterations!r}")
