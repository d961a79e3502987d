"""What the trainer logs: :data:`METRICS` explains every key, and the few metrics that need a definition live here.

Keys are TRL's where TRL logs the same quantity (``reward``, ``reward_std``, ``frac_reward_zero_std``,
``completions/mean_length``, ``completions/clipped_ratio``, ``entropy``, ``clip_ratio/low_mean``, ``kl``, ...;
``objective/kl`` is TRL's PPO name), CleanRL's for ``approx_kl`` and ``explained_variance``. A key with a slash
groups related numbers. A test fails when the trainer logs a key that is not in this table (callbacks document
the keys they add in their own ``metrics`` attribute).
"""

from __future__ import annotations

import numpy as np
import torch

from rlbook.objectives import kl_estimate, masked_mean

METRICS: dict[str, str] = {
    # --- the step
    "step": "optimizer-update rounds done so far (one rollout each), counted from 1",
    "reward": "mean reward of the step's completions, after shaping (DAPO's overlong penalty), before any KL penalty",
    "reward_std": "standard deviation of those rewards over the step's completions (n - 1 in the denominator, as TRL)",
    "accuracy": "fraction of the step's completions the task's rule calls correct, whatever reward_fn gave "
                "(the gold metric when a reward model gives the reward)",
    "frac_reward_zero_std": "fraction of groups whose G rewards are all equal (no signal for a group baseline); "
                            "with dynamic sampling, measured on the first generation round, before filtering",
    "num_completions": "completions sampled this step, every generation round included (dynamic sampling draws "
                       "more than it trains on): the cost in samples",
    "nonfinite_rewards/groups_skipped": "groups dropped from the step's rollout because the reward function "
                                        "returned a non-finite reward for one of their completions (logged with "
                                        "nonfinite_rewards='skip_group'; every generation round counted)",
    "completions/mean_length": "mean completion length in tokens (EOS included) of the step's completions",
    "completions/min_length": "shortest completion of the step, in tokens",
    "completions/max_length": "longest completion of the step, in tokens",
    "completions/clipped_ratio": "fraction of completions cut at max_completion_length without an EOS (truncated)",
    "entropy": "mean per-token entropy (nats) of the sampling distribution softmax(logits / temperature) over the "
               "step's completion tokens: the true entropy of the whole next-token distribution, computed by the "
               "sampler, not the one-sample estimate -log pi(o_t)",
    # --- the reference policy (beta > 0)
    "kl": "mean per-token k3 estimate of KL(pi_theta || pi_ref), computed in the loss (TRL GRPO's kl); logged "
          "with kl_placement='loss'",
    "objective/kl": "mean over completions of the summed per-token k1 = log pi_old - log pi_ref of the rollout: the "
                    "KL per completion that the adaptive controller aims at (TRL PPO's objective/kl)",
    "objective/kl_per_token": "the same k1, averaged over completion tokens instead of summed",
    "beta": "the KL coefficient used this step (it moves under adaptive_kl_target)",
    # --- advantages and the critic
    "explained_variance": "1 - Var(R - V) / Var(R) over the completion tokens, R the value targets and V the value "
                          "model's estimates before the update (both variances centred): 1 a perfect critic, 0 no "
                          "better than a constant, negative worse",
    "vapo/lam_policy": "mean over completions of the policy's GAE lambda (VAPO's length-adaptive 1 - 1/(alpha l))",
    "gfpo/kept_mean_length": "mean length in tokens of the completions GFPO's filter kept",
    "dynamic_sampling/rounds": "generation rounds DAPO's dynamic sampling needed to fill the batch",
    "dynamic_sampling/groups": "groups with unequal rewards the update trained on (fewer than the prompts per step "
                               "when the rounds ran out)",
    # --- the update (means over the step's micro-batches unless said)
    "loss/policy": "the policy loss of a micro-batch as aggregated by loss_type (the KL term included when in the "
                   "loss), averaged over micro-batches",
    "loss/nll": "VAPO's token-mean negative log-likelihood of the correct completions",
    "loss/value": "the value loss 0.5 (V - R)^2 (clipped by cliprange_value), token mean",
    "clip_ratio/low_mean": "fraction of completion tokens with rho < 1 - epsilon and A < 0: the clip removes their "
                           "gradient (TRL's name)",
    "clip_ratio/high_mean": "fraction with rho > 1 + epsilon_high and A > 0 (TRL's name)",
    "clip_ratio/region_mean": "fraction of tokens whose gradient the clip removes: the sum of the two above",
    "clip_ratio/delta_mean": "with delta (two-sided clipping): fraction of tokens with A < 0 and rho > delta, whose "
                             "loss delta caps (no gradient)",
    "cispo_clip_ratio": "loss_type 'cispo': fraction of tokens with A > 0 whose importance weight the cap "
                        "epsilon_high shrinks (their gradient stays; TRL's name)",
    "vespo/phi_seq_mean": "loss_type 'vespo': the mean over completions of the Gamma weight phi(w) of each "
                          "completion's likelihood ratio w (1 on-policy; near 0 when w is far from 1; TRL's name)",
    "off_policy_mask/masked_mean": "with off_policy_mask_threshold: fraction of loss tokens the off-policy sequence "
                                   "mask drops (negative advantage, mean log(pi_sampler / pi_theta) above the "
                                   "threshold)",
    # --- the entropy methods
    "entropy_mask/kept_mean": "with top_entropy_quantile < 1: fraction of loss tokens the high-entropy filter "
                              "keeps in the policy loss (about top_entropy_quantile)",
    "entropy_coef": "with entropy_coef or use_adaptive_entropy: the entropy bonus's coefficient after each "
                    "optimizer step (TRL's name); adaptive control moves it by entropy_coef_delta",
    "covariance/selected_mean": "with covariance_method: fraction of loss tokens Clip-Cov cut or KL-Cov penalised "
                                "(those with the largest covariance of log-prob and advantage)",
    # --- the sampler against the learner (vllm_importance_sampling_correction; TRL's names)
    "sampling/sampling_logp_difference/mean": "mean over the rollout's completion tokens of |log pi_old - log "
                                              "pi_sampler|: how far the sampler's numbers are from the learner's",
    "sampling/sampling_logp_difference/max": "the largest such difference",
    "sampling/importance_sampling_ratio/min": "smallest sampler-mismatch weight (after truncation or masking) of "
                                              "the rollout, over tokens or, at the sequence level, completions",
    "sampling/importance_sampling_ratio/mean": "mean sampler-mismatch weight, likewise",
    "sampling/importance_sampling_ratio/max": "largest sampler-mismatch weight, likewise",
    "approx_kl": "k3 estimate of KL(pi_old || pi_theta) over the micro-batch's tokens: how far the update has moved "
                 "the policy from the one that sampled (CleanRL's approx_kl)",
    "ratio/min": "smallest importance ratio rho seen over the step's micro-batches (at the ratio level in use)",
    "ratio/max": "largest importance ratio rho seen over the step's micro-batches",
    "ratio/mean": "mean importance ratio over the tokens of the step's micro-batches",
    "grad_norm": "norm of the gradient before clipping at max_grad_norm, averaged over the step's optimizer steps",
    "optimizer_steps": "optimizer steps taken on this step's rollout",
    "early_stopped": "1 when early_stop_kl ended the rollout's updates before the last pass, else 0",
    "lambda_grpo/lambda": "lambda-GRPO's learnable exponent lambda after the step",
    # --- timing and evaluation
    "time/generate": "seconds spent sampling completions this step (reward calls excluded)",
    "time/score": "seconds spent on rewards, old / reference log-probs, values and advantages",
    "time/update": "seconds spent on the optimizer updates",
    "time/pretrain": "value pretraining only (Trainer.value_pretrain_history): seconds of one pretraining round",
    "eval_accuracy": "held-out sampled accuracy (one completion per test prompt at the training temperature), "
                     "every eval_every steps",
    # --- rlbook.callbacks.PostUpdateRatios: the rollout's log-ratios log(pi_new / pi_old) after the step's updates
    "post_update/log_ratio_token_var": "variance over completion tokens of the token log-ratio after the update",
    "post_update/log_ratio_sequence_var": "variance over completions of the mean token log-ratio (log s_i, GSPO's "
                                          "sequence log-ratio) after the update",
    "post_update/max_abs_log_ratio_token": "largest |token log-ratio| after the update",
    "post_update/max_abs_log_ratio_sequence": "largest |mean token log-ratio| of a completion after the update (the "
                                              "log of its geometric-mean ratio)",
    # --- rlbook.callbacks.ExpertRoutingChanges (mixture-of-experts policies)
    "moe/route_changed": "share of completion tokens whose set of experts changed in some layer during the update, "
                         "at the position that predicts the token",
    "moe/abs_log_ratio_route_changed": "mean |token log-ratio| after the update of the tokens whose routing changed",
    "moe/abs_log_ratio_route_same": "mean |token log-ratio| after the update of the tokens whose routing did not",
}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """``1 − Var(R − V) / Var(R)`` over the masked tokens, both variances centred (CleanRL's and verl's
    ``vf_explained_var``): 1 is a perfect critic, 0 no better than a constant. None when every return is the same
    (the ratio is undefined then)."""
    variance = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    if not variance > 0:
        return None
    residual = returns - values
    residual_variance = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return float(1 - residual_variance / variance)


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats, −Σ_v p_v log p_v, of the distributions whose log-probabilities ``log_probs`` (..., V) are
    (e.g. ``log_softmax(logits / temperature)``); shape (...)."""
    return -(log_probs.exp() * log_probs).sum(-1)


def rollout_metrics(rollout, scored) -> dict:
    """The step's reward, accuracy, completion-length and entropy metrics (TRL's names), from a
    :class:`rlbook.rollout.Rollout` and its :class:`rlbook.rollout.ScoredRollout`."""
    batch, rewards = rollout.batch, scored.rewards
    lengths = batch.lengths.float()
    return {
        "reward": float(rewards.mean()),
        "reward_std": float(rewards.std(ddof=1)) if len(rewards) > 1 else 0.0,
        "accuracy": float(scored.correct.float().mean()),
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(batch.truncated.float().mean()),
        "entropy": masked_mean(batch.entropies, batch.completion_mask.float()).item(),
    }


def reference_kl_metrics(old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """``objective/kl_per_token`` and ``objective/kl``: the rollout's k1 = log pi_old - log pi_ref over the
    completion tokens ``mask``, averaged over tokens, and summed per completion then averaged (what the adaptive
    KL controller aims at)."""
    k1 = kl_estimate(old_logp, ref_logp, "k1") * mask
    return {"objective/kl_per_token": masked_mean(k1, mask).item(), "objective/kl": k1.sum(-1).mean().item()}


def sampling_metrics(old_logp, sampler_logp, weights, mask, mode: str) -> dict:
    """TRL's ``sampling/*`` metrics of the sampler-mismatch correction: |log pi_old - log pi_sampler| over the
    completion tokens, and the correction's weights (one per completion at the sequence level, as TRL counts)."""
    mask = mask.bool()
    difference = (old_logp - sampler_logp).abs()[mask]
    kept = weights[:, 0] if mode.startswith("sequence") else weights[mask]
    return {"sampling/sampling_logp_difference/mean": difference.mean().item(),
            "sampling/sampling_logp_difference/max": difference.max().item(),
            "sampling/importance_sampling_ratio/min": kept.min().item(),
            "sampling/importance_sampling_ratio/mean": kept.mean().item(),
            "sampling/importance_sampling_ratio/max": kept.max().item()}


def update_summary(values: dict[str, list[float]], optimizer_steps: int, early_stopped: bool | None) -> dict:
    """An update's metrics from the ``values`` each micro-batch (or optimizer step) gave: their means, but over
    the whole update the minimum of ``ratio/min`` and the maximum of ``ratio/max``; then ``optimizer_steps``, and
    ``early_stopped`` (1.0 or 0.0) unless it is None (no early stop configured)."""
    reduced = {key: float(np.mean(v)) for key, v in values.items()}
    for key, extreme in (("ratio/min", np.min), ("ratio/max", np.max)):
        if key in values:
            reduced[key] = float(extreme(values[key]))
    reduced["optimizer_steps"] = optimizer_steps
    if early_stopped is not None:
        reduced["early_stopped"] = float(early_stopped)
    return reduced
