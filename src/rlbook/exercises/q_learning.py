"""Exercises of the chapter "Q-learning": expected SARSA and double Q-learning updates.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random inputs (seeded, so a
failure is reproducible), including terminal transitions, self-loops ``s' = s`` and tied action values. It checks
the returned value and the whole table after the in-place update, raises ``AssertionError`` at the first
disagreement and prints ``ok`` when everything agrees.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, checker
from rlbook.tabular import epsilon_greedy_probs
from rlbook.tabular.greedy import greedy_action

NUM_TRIALS = 300


def reference_expected_sarsa_update(
    Q: np.ndarray, s, a, r, s_next, alpha, gamma, epsilon, terminated: bool = False
) -> float:
    """One expected SARSA update, in place; returns the new ``Q[s, a]`` (van Seijen et al., 2009).

        Q(s,a) <- Q(s,a) + alpha [ r + gamma sum_a' pi(a'|s') Q(s',a') - Q(s,a) ]

    ``pi`` is the epsilon-greedy policy of :func:`rlbook.tabular.epsilon_greedy_probs` on ``Q[s']``
    (ties share the greedy mass). When ``terminated`` is true the target is just ``r``.
    ``Q`` has shape ``(S, A)``.
    """
    expected_next = float(epsilon_greedy_probs(Q[s_next], epsilon) @ Q[s_next])
    target = r if terminated else r + gamma * expected_next
    Q[s, a] += alpha * (target - Q[s, a])
    return float(Q[s, a])


def reference_double_q_learning_update(
    Q1: np.ndarray, Q2: np.ndarray, s, a, r, s_next, alpha, gamma, update_first: bool, terminated: bool = False
) -> float:
    """One double Q-learning update, in place; returns the new value of the table that was updated (van Hasselt, 2010).

    If ``update_first``:  ``a* = argmax_a' Q1(s', a')`` and ``Q1(s,a) <- Q1(s,a) + alpha [r + gamma Q2(s', a*) - Q1(s,a)]``;
    otherwise the same with the roles of ``Q1`` and ``Q2`` swapped. One table selects the action, the other
    evaluates it. Ties in the argmax go to the lowest action index (the package's tie rule,
    :func:`rlbook.tabular.greedy.greedy_action`; ``np.argmax`` agrees unless another value lies within 1e-10
    below the maximum, which the checker never generates). When ``terminated`` is true
    the target is just ``r``. ``Q1`` and ``Q2`` have shape ``(S, A)``.
    """
    select, evaluate = (Q1, Q2) if update_first else (Q2, Q1)
    a_star = greedy_action(select[s_next])
    target = r if terminated else r + gamma * evaluate[s_next, a_star]
    select[s, a] += alpha * (target - select[s, a])
    return float(select[s, a])


def _random_case(rng: np.random.Generator) -> dict:
    """One random transition and table; about half the tables hold small integers so that ties are common."""
    num_states, num_actions = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    if rng.random() < 0.5:
        make = lambda: rng.integers(-2, 3, size=(num_states, num_actions)).astype(float)  # noqa: E731
    else:
        make = lambda: rng.normal(size=(num_states, num_actions))  # noqa: E731
    s = int(rng.integers(num_states))
    s_next = s if rng.random() < 0.2 else int(rng.integers(num_states))  # self-loops too
    return dict(
        Q1=make(),
        Q2=make(),
        s=s,
        a=int(rng.integers(num_actions)),
        r=float(rng.normal()),
        s_next=s_next,
        alpha=float(rng.choice([1.0, rng.uniform(0.01, 1.0)])),
        gamma=float(rng.choice([0.0, 1.0, rng.uniform(0.0, 1.0)])),
        epsilon=float(rng.choice([0.0, 1.0, rng.uniform(0.0, 1.0)])),
        terminated=bool(rng.random() < 0.3),
    )


def _describe(trial: int, seed: int, case: dict, names: tuple[str, ...], tables: tuple[str, ...]) -> str:
    """The inputs of a failing trial, so that the reader can reproduce it."""
    args = ", ".join(f"{name}={case[name]!r}" for name in names)
    shown = "".join(f"\n  {name} before the call =\n{np.array2string(case[name], precision=4)}" for name in tables)
    return f"  inputs of trial {trial} (seed {seed}): {args}{shown}"


def _compare(got, expected, what: str, inputs: str) -> None:
    assert_close(got, expected, what, inputs=inputs)


def _check_returned(
    got, table_after: np.ndarray, s: int, a: int, expected: float, inputs: str, name: str = "Q"
) -> None:
    if got is None:
        raise AssertionError(f"your function returned None; it must return the new value {name}[s, a]\n{inputs}")
    _compare(got, expected, "returned value", inputs)
    _compare(
        table_after[s, a],
        got,
        f"{name}[s, a] after the call is not the value you returned "
        f"(update {name} in place, then return {name}[s, a])",
        inputs,
    )


@checker
def check_expected_sarsa_update(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = 0) -> None:
    """Compare ``fn(Q, s, a, r, s_next, alpha, gamma, epsilon, terminated=...)`` with the reference."""
    rng = np.random.default_rng(seed)
    names = ("s", "a", "r", "s_next", "alpha", "gamma", "epsilon", "terminated")
    for trial in range(num_trials):
        case = _random_case(rng)
        case["Q"] = case["Q1"]
        inputs = _describe(trial, seed, case, names, ("Q",))
        Q_yours, Q_reference = case["Q"].copy(), case["Q"].copy()
        args = [case[name] for name in names[:-1]]
        got = call_reader(fn, (Q_yours, *args), inputs, dict(terminated=case["terminated"]))
        expected = reference_expected_sarsa_update(Q_reference, *args, terminated=case["terminated"])
        _check_returned(got, Q_yours, case["s"], case["a"], expected, inputs)
        _compare(Q_yours, Q_reference, "table Q after the in-place update", inputs)
    print("ok")


@checker
def check_double_q_learning_update(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = 0) -> None:
    """Compare ``fn(Q1, Q2, s, a, r, s_next, alpha, gamma, update_first, terminated=...)`` with the reference."""
    rng = np.random.default_rng(seed)
    names = ("s", "a", "r", "s_next", "alpha", "gamma", "update_first", "terminated")
    for trial in range(num_trials):
        case = _random_case(rng)
        case["update_first"] = trial % 2 == 0
        inputs = _describe(trial, seed, case, names, ("Q1", "Q2"))
        yours = case["Q1"].copy(), case["Q2"].copy()
        reference = case["Q1"].copy(), case["Q2"].copy()
        args = [case[name] for name in names[:-1]]
        got = call_reader(fn, (*yours, *args), inputs, dict(terminated=case["terminated"]))
        expected = reference_double_q_learning_update(*reference, *args, terminated=case["terminated"])
        updated = 0 if case["update_first"] else 1
        _check_returned(got, yours[updated], case["s"], case["a"], expected, inputs, name=f"Q{updated + 1}")
        _compare(yours[0], reference[0], "table Q1 after the call", inputs)
        _compare(yours[1], reference[1], "table Q2 after the call", inputs)
    print("ok")
