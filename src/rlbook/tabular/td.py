"""Temporal-difference control: epsilon-greedy exploration, Q-learning and SARSA (chapter "Q-learning").

The two algorithms differ only in their TD target:

- Q-learning (off-policy): ``y = r + gamma * max_a' Q(s', a')``;
- SARSA (on-policy):       ``y = r + gamma * Q(s', a')`` with ``a'`` the action actually taken next.

Both then move ``Q(s, a)`` a fraction ``alpha`` of the way towards ``y``. The target is held fixed while doing so:
the update is a *semi-gradient* step, not gradient descent on the squared TD error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from rlbook.tabular.greedy import TIE_ATOL, greedy_action, greedy_mask
from rlbook.tabular.mdp import _check_index, check_gamma


def epsilon_greedy_probs(q_values, epsilon: float, atol: float = TIE_ATOL) -> np.ndarray:
    """Action probabilities of the epsilon-greedy policy, shape ``(..., A)`` like ``q_values``.

    With probability ``1 - epsilon`` take a greedy action, with probability ``epsilon`` an action
    drawn uniformly from *all* ``A`` actions (the greedy one included):

        pi(a|s) = (1 - epsilon) * 1[a greedy] / (number of greedy actions) + epsilon / A.

    Tied greedy actions (within ``atol``, the package's tie rule in :mod:`rlbook.tabular.greedy`)
    share the greedy mass equally. Example (erratum E6): ``epsilon = 0.1`` and
    ``Q = [0.2, 0.9, 0.5]`` give ``[0.0333, 0.9333, 0.0333]``, not ``[0.05, 0.9, 0.05]``.
    """
    is_greedy = greedy_mask(q_values, atol)  # raises on NaN or an empty action axis
    epsilon = float(epsilon)
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
    greedy_share = is_greedy / is_greedy.sum(axis=-1, keepdims=True)
    return (1.0 - epsilon) * greedy_share + epsilon / is_greedy.shape[-1]


def _td_step(Q: np.ndarray, s, a, target: float, alpha: float) -> float:
    """Move ``Q[s, a]`` towards a fixed ``target``: ``Q[s,a] <- Q[s,a] + alpha (target - Q[s,a])``."""
    Q[s, a] += alpha * (target - Q[s, a])
    return float(Q[s, a])


def _check_td_args(Q, s, a, r, s_next, alpha, gamma) -> tuple[int, int, int, float, float]:
    if not isinstance(Q, np.ndarray) or Q.ndim != 2 or not np.issubdtype(Q.dtype, np.floating):
        raise TypeError("Q must be a float numpy array of shape (S, A); it is updated in place")
    num_states, num_actions = Q.shape
    s = _check_index(s, num_states, "state")
    s_next = _check_index(s_next, num_states, "state")
    a = _check_index(a, num_actions, "action")
    if not np.isfinite(r):
        raise ValueError(f"reward must be finite, got {r}")
    alpha = float(alpha)
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"step size alpha must lie in (0, 1], got {alpha}")
    return s, a, s_next, alpha, check_gamma(gamma)


def q_learning_update(Q: np.ndarray, s, a, r, s_next, alpha, gamma,
                      terminated: bool = False) -> float:
    """One Q-learning update, in place; returns the new ``Q[s, a]``.

        Q(s,a) <- Q(s,a) + alpha [ r + gamma max_a' Q(s',a') - Q(s,a) ]   (eq. q-learning-update)

    When ``terminated`` is true, ``s'`` ends the episode and the target is just ``r``.
    Worked example 1 of the study note: ``Q(s,a)=0.5``, ``r=1``, ``max Q(s',.)=0.8``, ``alpha=0.1``,
    ``gamma=0.99`` give ``0.6292``.
    """
    s, a, s_next, alpha, gamma = _check_td_args(Q, s, a, r, s_next, alpha, gamma)
    target = r if terminated else r + gamma * Q[s_next].max()
    return _td_step(Q, s, a, target, alpha)


def sarsa_update(Q: np.ndarray, s, a, r, s_next, a_next, alpha, gamma,
                 terminated: bool = False) -> float:
    """One SARSA update, in place; returns the new ``Q[s, a]``.

        Q(s,a) <- Q(s,a) + alpha [ r + gamma Q(s',a') - Q(s,a) ]

    with a' the next action actually taken.
    """
    s, a, s_next, alpha, gamma = _check_td_args(Q, s, a, r, s_next, alpha, gamma)
    a_next = _check_index(a_next, Q.shape[1], "action")
    target = r if terminated else r + gamma * Q[s_next, a_next]
    return _td_step(Q, s, a, target, alpha)


def visit_count_step_size(power: float = 1.0) -> Callable[[int], float]:
    """The step-size schedule ``alpha_n = 1 / n**power`` for the n-th visit of a state-action pair.

    It satisfies the Robbins-Monro conditions (sum alpha = inf, sum alpha^2 < inf) for ``0.5 < power <= 1``.
    """
    if not 0.0 < power <= 1.0:
        raise ValueError(f"power must lie in (0, 1], got {power}")
    return lambda n: 1.0 / n**power


@dataclass
class TDControlResult:
    """What :func:`q_learning` and :func:`sarsa` return.

    Attributes:
        Q: the learned action values, shape ``(S, A)``.
        episode_returns: undiscounted sum of rewards of each training episode, shape ``(E,)``.
        episode_lengths: steps in each training episode, shape ``(E,)``.
        q_error: ``max_{s,a} |Q - Q*|`` after each episode, shape ``(E,)``, when ``q_star`` was given.
    """

    Q: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    q_error: np.ndarray | None = None


def _sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    # Inverse-CDF sampling: several times faster than rng.choice(p=...) for a handful of actions.
    return min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")), len(probs) - 1)


def _td_control(
    env,
    method: str,
    num_episodes: int,
    alpha: float | Callable[[int], float],
    gamma: float,
    epsilon: float,
    seed: int,
    q_star: np.ndarray | None,
    max_steps_per_episode: int,
) -> TDControlResult:
    """The episode loop shared by Q-learning and SARSA; only the update rule differs."""
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be at least 1, got {num_episodes}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
    check_gamma(gamma)
    num_states, num_actions = int(env.observation_space.n), int(env.action_space.n)
    if q_star is not None and np.shape(q_star) != (num_states, num_actions):
        raise ValueError(f"q_star must have shape {(num_states, num_actions)}, "
                         f"got {np.shape(q_star)}")
    step_size = alpha if callable(alpha) else (lambda n: alpha)
    rng = np.random.default_rng(seed)
    Q = np.zeros((num_states, num_actions))
    visits = np.zeros((num_states, num_actions), dtype=int)
    returns = np.zeros(num_episodes)
    lengths = np.zeros(num_episodes, dtype=int)
    q_error = np.zeros(num_episodes) if q_star is not None else None

    def behave(state: int) -> int:
        return _sample(epsilon_greedy_probs(Q[state], epsilon), rng)

    env.action_space.seed(seed)
    for episode in range(num_episodes):
        s, _ = env.reset(seed=seed if episode == 0 else None)
        a = behave(s)
        for t in range(max_steps_per_episode):
            s_next, r, terminated, truncated, _ = env.step(a)
            visits[s, a] += 1
            lr = step_size(visits[s, a])
            if method == "sarsa":
                a_next = behave(s_next)  # SARSA's target uses the action it will really take
                sarsa_update(Q, s, a, r, s_next, a_next, lr, gamma, terminated)
            else:
                q_learning_update(Q, s, a, r, s_next, lr, gamma, terminated)
                a_next = behave(s_next)  # chosen after the update, from the freshest estimates
            returns[episode] += r
            if terminated or truncated:
                break
            s, a = s_next, a_next
        lengths[episode] = t + 1
        if q_error is not None:
            q_error[episode] = np.max(np.abs(Q - q_star))
    return TDControlResult(Q, returns, lengths, q_error)


def q_learning(
    env,
    num_episodes: int,
    alpha: float | Callable[[int], float] = 0.1,
    gamma: float = 0.99,
    epsilon: float = 0.1,
    seed: int = 0,
    q_star: np.ndarray | None = None,
    max_steps_per_episode: int = 10_000,
) -> TDControlResult:
    """Tabular Q-learning with an epsilon-greedy behaviour policy on a gymnasium environment with discrete spaces.

    ``alpha`` is a constant step size or a schedule ``n -> alpha_n`` of the visit count of ``(s, a)``
    (see :func:`visit_count_step_size`). Pass ``q_star`` (e.g. from :func:`value_iteration`) to record the
    max-norm error after every episode.
    """
    return _td_control(env, "q_learning", num_episodes, alpha, gamma, epsilon, seed, q_star, max_steps_per_episode)


def sarsa(
    env,
    num_episodes: int,
    alpha: float | Callable[[int], float] = 0.1,
    gamma: float = 0.99,
    epsilon: float = 0.1,
    seed: int = 0,
    q_star: np.ndarray | None = None,
    max_steps_per_episode: int = 10_000,
) -> TDControlResult:
    """Tabular SARSA, on-policy TD control with an epsilon-greedy policy; arguments as for :func:`q_learning`."""
    return _td_control(env, "sarsa", num_episodes, alpha, gamma, epsilon, seed, q_star, max_steps_per_episode)


def greedy_rollout(env, Q: np.ndarray, max_steps: int = 200, seed: int = 0) -> tuple[list[int], float]:
    """Follow the greedy action of ``Q`` (lowest index among ties, :func:`rlbook.tabular.greedy.greedy_action`)
    from a reset; returns the visited states and the undiscounted return."""
    shape = (int(env.observation_space.n), int(env.action_space.n))
    if np.shape(Q) != shape:
        raise ValueError(f"Q must have shape {shape} (states, actions), got {np.shape(Q)}")
    s, _ = env.reset(seed=seed)
    states, total = [int(s)], 0.0
    for _ in range(max_steps):
        s, r, terminated, truncated, _ = env.step(greedy_action(Q[s]))
        states.append(int(s))
        total += r
        if terminated or truncated:
            break
    return states, total
