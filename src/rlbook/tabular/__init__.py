"""Tabular reinforcement learning: finite MDPs, exact planning, and TD control (Part I of the book)."""

from rlbook.tabular.greedy import TIE_ATOL, greedy_action, greedy_mask
from rlbook.tabular.mdp import FiniteMDP
from rlbook.tabular.planning import (
    ValueIterationResult,
    bellman_expectation_operator,
    bellman_optimality_operator,
    greedy_policy,
    policy_evaluation,
    policy_iteration,
    q_from_v,
    value_iteration,
)
from rlbook.tabular.td import (
    TDControlResult,
    epsilon_greedy_probs,
    greedy_rollout,
    q_learning,
    q_learning_update,
    sarsa,
    sarsa_update,
    visit_count_step_size,
)

__all__ = [
    "TIE_ATOL",
    "greedy_action",
    "greedy_mask",
    "FiniteMDP",
    "ValueIterationResult",
    "bellman_expectation_operator",
    "bellman_optimality_operator",
    "greedy_policy",
    "policy_evaluation",
    "policy_iteration",
    "q_from_v",
    "value_iteration",
    "TDControlResult",
    "epsilon_greedy_probs",
    "greedy_rollout",
    "q_learning",
    "q_learning_update",
    "sarsa",
    "sarsa_update",
    "visit_count_step_size",
]
