"""A finite Markov decision process held as dense arrays (chapter "MDPs and the Bellman equations").

An MDP is the 5-tuple (S, A, P, R, gamma). Here S = {0, ..., S-1} and A = {0, ..., A-1}; ``P[s, a, s']`` is
the probability of moving to ``s'`` after taking ``a`` in ``s``, and ``R[s, a, s']`` is the reward received on
that transition. Episodic tasks mark the end of an episode in one of two ways:

- per state, ``terminal[s']``: entering ``s'`` always ends the episode (FrozenLake's holes and goal, CliffWalking's
  goal); nothing is bootstrapped from it, and its value is 0 by definition;
- per transition, ``terminates[s, a, s']``: this particular transition ends the episode, although ``s'`` may also
  be entered without ending it (Taxi: a successful drop-off lands in a state the taxi can also drive into).

Both feed one array, ``continuation[s, a, s']``, the probability of moving to ``s'`` *and going on*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

_ROW_SUM_ATOL = 1e-8


def check_gamma(gamma: float) -> float:
    """Return ``gamma`` as a float, or raise if it is not a discount factor in [0, 1]."""
    gamma = float(gamma)
    if not 0.0 <= gamma <= 1.0:  # also rejects NaN
        raise ValueError(f"discount factor gamma must lie in [0, 1], got {gamma}")
    return gamma


@dataclass(frozen=True)
class FiniteMDP:
    """A finite MDP (S, A, P, R, gamma) with optional terminal (absorbing) states and terminating transitions.

    Args:
        P: transition probabilities, shape ``(S, A, S)``; every row ``P[s, a, :]`` sums to one.
        R: reward on each transition, shape ``(S, A, S)``, or the expected reward ``r(s, a)``, shape ``(S, A)``.
        gamma: discount factor in [0, 1].
        terminal: boolean mask of shape ``(S,)``; entering a terminal state ends the episode.
        initial: start-state distribution, shape ``(S,)`` (defaults to uniform over non-terminal states).
        shape: optional ``(rows, cols)`` of a grid world, used only for plotting.
        desc: optional grid of map letters (FrozenLake's ``S``, ``F``, ``H``, ``G``), used only for plotting.
        terminates: optional boolean mask of shape ``(S, A, S)``: the transition ``s -a-> s'`` ends the episode
            (gymnasium's per-transition ``terminated`` flag). Every transition into a terminal ``s'`` ends it too,
            so after construction ``terminates[s, a, s'] = terminates[s, a, s'] or terminal[s']``.
    """

    P: np.ndarray
    R: np.ndarray
    gamma: float
    terminal: np.ndarray | None = None
    initial: np.ndarray | None = None
    shape: tuple[int, int] | None = None
    desc: np.ndarray | None = field(default=None, repr=False)
    terminates: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        P = np.asarray(self.P, dtype=float)
        if P.ndim != 3 or P.shape[0] != P.shape[2] or P.shape[0] == 0 or P.shape[1] == 0:
            raise ValueError(f"P must have shape (S, A, S) with S, A >= 1, got {P.shape}")
        num_states, num_actions, _ = P.shape
        if not np.all(np.isfinite(P)) or np.any(P < 0):
            raise ValueError("P must hold finite, non-negative probabilities")
        row_sums = P.sum(axis=2)
        bad = np.argwhere(np.abs(row_sums - 1.0) > _ROW_SUM_ATOL)
        if len(bad):
            s, a = bad[0]
            raise ValueError(
                f"transition rows must sum to 1: P[{s}, {a}, :] sums to {row_sums[s, a]:.6g} "
                f"({len(bad)} bad row(s) in all)"
            )

        R = np.asarray(self.R, dtype=float)
        if R.shape == (num_states, num_actions):
            R = np.broadcast_to(R[:, :, None], P.shape).copy()
        if R.shape != P.shape:
            raise ValueError(f"R must have shape {P.shape} or {(num_states, num_actions)}, got {R.shape}")
        if not np.all(np.isfinite(R)):
            raise ValueError("R holds NaN or infinite rewards")

        terminal = np.zeros(num_states, bool) if self.terminal is None else np.asarray(self.terminal, bool)
        if terminal.shape != (num_states,):
            raise ValueError(f"terminal must have shape ({num_states},), got {terminal.shape}")

        ends = np.broadcast_to(terminal[None, None, :], P.shape).copy()
        if self.terminates is not None:
            extra = np.asarray(self.terminates)
            if extra.shape != P.shape or extra.dtype != bool:
                raise ValueError(
                    f"terminates must be a boolean array of shape {P.shape}, got {extra.dtype} {extra.shape}"
                )
            ends |= extra

        if self.initial is None:
            initial = (~terminal).astype(float) if not terminal.all() else np.ones(num_states)
            initial /= initial.sum()
        else:
            initial = np.asarray(self.initial, dtype=float)
            if initial.shape != (num_states,):
                raise ValueError(f"initial must have shape ({num_states},), got {initial.shape}")
            if np.any(initial < 0) or abs(initial.sum() - 1.0) > _ROW_SUM_ATOL:
                raise ValueError(f"initial must be a probability vector, it sums to {initial.sum():.6g}")

        for name, value in [("P", P), ("R", R), ("terminal", terminal), ("initial", initial), ("terminates", ends)]:
            object.__setattr__(self, name, _read_only(value))
        object.__setattr__(self, "gamma", check_gamma(self.gamma))

    @property
    def num_states(self) -> int:
        return self.P.shape[0]

    @property
    def num_actions(self) -> int:
        return self.P.shape[1]

    @cached_property  # computed once: every Bellman sweep reads it, and the MDP is immutable
    def expected_reward(self) -> np.ndarray:
        """``r(s, a) = sum_s' P(s'|s,a) R(s,a,s')``, shape ``(S, A)``; 0 in terminal ``s`` (the episode is over)."""
        return _read_only(np.einsum("ijk,ijk->ij", self.P, self.R) * (~self.terminal)[:, None])

    @cached_property
    def continuation(self) -> np.ndarray:
        """``P(s'|s,a) (1 - terminates[s,a,s']) (1 - terminal[s])``, shape ``(S, A, S)``: the probability of going on.

        Nothing is bootstrapped after a transition that ends the episode (in particular one into a terminal ``s'``),
        and nothing follows a terminal ``s``, so that ``V(terminal) = 0`` even where the environment's table lists
        moves out of a terminal state (CliffWalking).
        """
        return _read_only(self.P * ~self.terminates * (~self.terminal)[:, None, None])

    def with_gamma(self, gamma: float) -> FiniteMDP:
        """The same MDP with another discount factor."""
        return FiniteMDP(self.P, self.R, gamma, self.terminal, self.initial, self.shape, self.desc, self.terminates)

    def check_state(self, s) -> int:
        """Return ``s`` as an int, or raise if it is not a state of this MDP."""
        return _check_index(s, self.num_states, "state")

    def check_action(self, a) -> int:
        """Return ``a`` as an int, or raise if it is not an action of this MDP."""
        return _check_index(a, self.num_actions, "action")

    @classmethod
    def from_gymnasium(cls, env, gamma: float = 0.99) -> FiniteMDP:
        """Build the exact model of a gymnasium toy-text environment (FrozenLake, CliffWalking,
        Taxi).

        Toy-text environments expose their dynamics as ``env.unwrapped.P[s][a]``, a list of
        ``(probability, next_state, reward, terminated)`` tuples; this turns them into dense arrays.
        ``terminated`` belongs to a transition: it becomes ``terminates[s, a, s']``, and a state is
        also marked ``terminal`` when every transition into it ends the episode (FrozenLake's holes,
        CliffWalking's goal).
        """
        unwrapped = getattr(env, "unwrapped", env)
        table = getattr(unwrapped, "P", None)
        if not isinstance(table, dict):
            raise TypeError(
                f"{type(unwrapped).__name__} exposes no transition table env.unwrapped.P; "
                "only gymnasium's toy-text environments (FrozenLake, CliffWalking, Taxi) do"
            )
        num_states = int(unwrapped.observation_space.n)
        num_actions = int(unwrapped.action_space.n)
        P = np.zeros((num_states, num_actions, num_states))
        R = np.zeros((num_states, num_actions, num_states))
        # +1: the transition ends the episode, -1: it goes on, 0: unseen
        ends = np.zeros(P.shape, dtype=int)
        for s, row in table.items():
            for a, outcomes in row.items():
                for prob, s_next, reward, terminated in outcomes:
                    s_next = int(s_next)
                    # Several outcomes may share a next state (FrozenLake at a wall): accumulate,
                    # and keep the probability-weighted reward so that the expected reward is exact.
                    R[s, a, s_next] = (R[s, a, s_next] * P[s, a, s_next] + prob * reward) / max(
                        P[s, a, s_next] + prob, 1e-300
                    )
                    P[s, a, s_next] += prob
                    if prob > 0:
                        flag = 1 if terminated else -1
                        if ends[s, a, s_next] == -flag:
                            raise ValueError(f"the move {s} -{a}-> {s_next} both ends the episode "
                                             "and goes on")
                        ends[s, a, s_next] = flag
        entered_ending, entered_going = (ends == 1).any(axis=(0, 1)), (ends == -1).any(axis=(0, 1))
        initial = getattr(unwrapped, "initial_state_distrib", None)
        shape = getattr(unwrapped, "shape", None)
        if shape is None and hasattr(unwrapped, "nrow"):
            shape = (int(unwrapped.nrow), int(unwrapped.ncol))
        desc = getattr(unwrapped, "desc", None)
        if desc is not None:
            desc = np.asarray(desc).astype(str)
        terminal = entered_ending & ~entered_going
        return cls(P, R, gamma, terminal, initial, shape, desc, terminates=ends == 1)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _check_index(i, n: int, what: str) -> int:
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
        raise TypeError(f"{what} must be an integer index, got {i!r}")
    if not 0 <= i < n:
        raise IndexError(f"unknown {what} {int(i)}: valid {what}s are 0..{n - 1}")
    return int(i)
