"""Checkers for the book's exercises.

Each ``check_<name>(fn)`` calls the reader's ``fn`` and the reference implementation on many random inputs,
raises ``AssertionError`` with the first disagreement, and prints ``ok`` when all agree::

    from rlbook.exercises import check_expected_sarsa_update
    check_expected_sarsa_update(my_expected_sarsa_update)
"""

from rlbook.exercises._compare import assert_close
from rlbook.exercises.after_the_note import check_cispo_loss, check_sampler_weights
from rlbook.exercises.drgrpo import check_token_weights
from rlbook.exercises.dapo import check_informative_groups, check_soft_overlong_penalty
from rlbook.exercises.dpo import check_dpo_loss, check_dpo_step
from rlbook.exercises.family import check_family_changes
from rlbook.exercises.gapo import check_gan_pairs
from rlbook.exercises.gfpo import check_gfpo_advantages
from rlbook.exercises.gmpo import check_gmpo_loss
from rlbook.exercises.gspo import check_gspo_loss
from rlbook.exercises.lambda_grpo import check_lambda_grpo_weights
from rlbook.exercises.lm import (
    check_completion_mask_from_ids,
    check_entropy_at_temperature,
    check_mean_token_logprob,
    check_sequence_logprob,
)
from rlbook.exercises.mdp import (
    check_average_reward,
    check_iterative_policy_evaluation,
    check_q_value_iteration_step,
)
from rlbook.exercises.grpo import check_grpo_advantages, check_grpo_loss, check_grpo_step
from rlbook.exercises.ppo import check_clipped_objective, check_gae_loop, check_ppo_loss
from rlbook.exercises.pg import (
    check_discounted_pg_weights,
    check_leave_one_out_advantages,
    check_reinforce_step,
)
from rlbook.exercises.rlhf import check_bradley_terry_loss, check_rlhf_token_rewards
from rlbook.exercises.q_learning import check_double_q_learning_update, check_expected_sarsa_update
from rlbook.exercises.vapo import check_decoupled_gae, check_length_adaptive_lam

__all__ = [
    "assert_close",
    "check_average_reward",
    "check_bradley_terry_loss",
    "check_cispo_loss",
    "check_clipped_objective",
    "check_completion_mask_from_ids",
    "check_decoupled_gae",
    "check_discounted_pg_weights",
    "check_dpo_loss",
    "check_dpo_step",
    "check_family_changes",
    "check_double_q_learning_update",
    "check_entropy_at_temperature",
    "check_expected_sarsa_update",
    "check_gae_loop",
    "check_ppo_loss",
    "check_gan_pairs",
    "check_gfpo_advantages",
    "check_gmpo_loss",
    "check_grpo_advantages",
    "check_grpo_loss",
    "check_grpo_step",
    "check_gspo_loss",
    "check_informative_groups",
    "check_iterative_policy_evaluation",
    "check_lambda_grpo_weights",
    "check_leave_one_out_advantages",
    "check_reinforce_step",
    "check_length_adaptive_lam",
    "check_mean_token_logprob",
    "check_q_value_iteration_step",
    "check_rlhf_token_rewards",
    "check_sampler_weights",
    "check_sequence_logprob",
    "check_soft_overlong_penalty",
    "check_token_weights",
]
