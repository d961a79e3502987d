"""What each algorithm is: :class:`RLConfig` (every setting of the one training loop) and :data:`PRESETS`.

Read this file to answer "what is GRPO?" (or PPO, DAPO, ...): a preset names the values of the five slots of
the family's objective (chapter "The family in one table") and the extra machinery an algorithm adds:

1. the **advantage**: ``advantage_estimator`` (a function of :mod:`rlbook.advantages`) and ``scale_rewards``;
2. the **ratio level**: ``importance_sampling_level`` (token, or one ratio per completion);
3. the **clip**: ``epsilon``, ``epsilon_high``;
4. the **aggregation** of token losses into one number: ``loss_type``, which :data:`rlbook.losses.LOSS_TYPES` maps to
   an aggregation and to the surrogate of slots 2-3 (PPO-Clip's for most; CISPO, SAPO, GMPO, VESPO their own);
5. the **KL** penalty to the reference: ``beta`` and where it goes, ``kl_placement`` ("loss" or "reward").

``RLConfig()`` with no arguments is the preset ``"trl_grpo"``: GRPO as TRL's ``GRPOConfig`` runs it by default
(group z-scores, DAPO's token-level loss, no KL, a symmetric clip of 0.2, one update per rollout); only the sizes
(learning rate, batch, completion budget) are ours, set for the book's tiny policies.

Names are TRL's wherever TRL has the concept (``num_generations``, ``epsilon``, ``beta``, ``loss_type``,
``scale_rewards``, ``importance_sampling_level``, ``mask_truncated_completions``, ``vf_coef``, ``cliprange_value``,
``gamma``, ``lam``, ...); the others say what they do.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass

from rlbook.advantages import ESTIMATORS, VALUE_MODEL_ESTIMATORS
from rlbook.losses import LOSS_TYPES, SURROGATES, config_errors
from rlbook.objectives import (
    COVARIANCE_METHODS,
    IMPORTANCE_SAMPLING_LEVELS,
    VLLM_IMPORTANCE_SAMPLING_MODES,
    check_delta,
    check_sapo_temperatures,
)

KL_PLACEMENTS = ("loss", "reward")


@dataclass
class RLConfig:
    """Every setting of :class:`rlbook.trainer.Trainer`. The defaults are the preset ``"trl_grpo"``."""

    # --- sampling
    num_generations: int = 8  # G completions per prompt
    max_completion_length: int = 16
    temperature: float = 1.0
    # --- the sampler against the learner. In production an inference engine samples (often in lower precision)
    # and its log-probs differ from the learner's for the same tokens. sampler_temperature other than temperature
    # plays such a sampler: it draws and scores at its own temperature. old_logprobs says what the ratio divides
    # by: "learner" (pi_old recomputed by the training forward whenever it can differ from the sampler's, as TRL:
    # num_iterations > 1, steps_per_generation > gradient_accumulation_steps, another sampler_temperature, or a
    # forward that rounds below float32, bf16 autocast on a GPU included: rlbook.lm.device.low_precision; in float32
    # the two agree to about 1e-6 and the sampler's numbers are used) or "sampler" (the sampler's log-probs, as
    # engines that skip the recompute: the mismatch enters every ratio).
    sampler_temperature: float | None = None  # None: temperature
    old_logprobs: str = "learner"
    # --- correcting for the sampler (TRL's names, vllm_ prefix included, though here the sampler is the rollout's):
    # the learner's pi_old over the sampler's probability of each token (or completion), truncated to [clip_min,
    # clip_max] or masked outside it, multiplies each token's policy loss (rlbook.objectives.
    # sampler_importance_weights; IcePop is "token_mask" with its band). Needs old_logprobs="learner" (pi_old is then
    # always recomputed, as TRL does). Off by default: TRL applies it only when vLLM samples (use_vllm).
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_mode: str = "sequence_mask"  # token_ or sequence_ x truncate or mask (TRL's default)
    vllm_importance_sampling_clip_min: float | None = None  # None: no lower bound
    vllm_importance_sampling_clip_max: float | None = 3.0  # TRL's default C_max; must be set when correcting
    # DeepSeek-V3.2's off-policy sequence masking: drop a negative-advantage completion whose mean log(pi_sampler /
    # pi_theta) exceeds this (rlbook.objectives.off_policy_sequence_mask); None: off
    off_policy_mask_threshold: float | None = None
    # --- batch layout, TRL's: generation_batch_size = per_device_train_batch_size * steps_per_generation
    # completions per step; one pass over them is steps_per_generation micro-batches; the optimizer steps after
    # every gradient_accumulation_steps micro-batches; num_iterations passes reuse each rollout (PPO's epochs).
    per_device_train_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    steps_per_generation: int | None = None  # None: gradient_accumulation_steps (one optimizer step per pass)
    num_iterations: int = 1
    # --- optimisation (AdamW)
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # --- slot 1, the advantage: a function of rlbook.advantages
    advantage_estimator: str = "grpo"
    scale_rewards: str = "group"  # group methods: divide by the group's std ("group"), the batch's, or not ("none")
    # --- slot 2, the ratio: "token" (PPO, GRPO), "sequence" (GSPO), "sequence_token" (GSPO-token)
    importance_sampling_level: str = "token"
    # --- slot 3, the clip range [1 - epsilon, 1 + epsilon_high] (GMPO: the same numbers in log space)
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: epsilon (a symmetric clip); loss_type "cispo": the weight's cap itself
    delta: float | None = None  # two-sided clip (INTELLECT-2): the ratio capped at delta > 1 + epsilon_high for A < 0
    # --- slot 3's soft alternatives: loss_type "cispo" (a clipped, stopped-gradient weight: epsilon_high > 1 is its
    # cap) and "sapo" (a sigmoid gate of temperature sapo_temperature_pos for A > 0, _neg otherwise; TRL's defaults)
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    # loss_type "vespo" (TRL 1.16): the Gamma weight's power k and decay lambda for A >= 0 (_pos) and A < 0 (_neg),
    # TRL's defaults (rlbook.objectives.vespo_weights)
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    # --- entropy (TRL's names): keep only the top_entropy_quantile share of tokens by the policy's entropy in the
    # policy loss (the high-entropy minority, rlbook.objectives.high_entropy_mask; 1.0: all), and add
    # -entropy_coef * mean token entropy to the loss (rlbook.objectives.entropy_bonus_loss). use_adaptive_entropy:
    # Skywork-OR1's controller moves entropy_coef by entropy_coef_delta per step, up while the entropy is at or
    # below entropy_target (then the bonus applies), down otherwise (rlbook.objectives.adaptive_entropy_coef)
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2
    # verl's covariance methods (Cui et al.; its policy_loss.loss_mode and settings, defaults as its ppo_trainer.yaml):
    # "clip_cov" cuts the loss of a random clip_cov_ratio share of tokens whose covariance of log-prob and advantage
    # lies in (clip_cov_lb, clip_cov_ub); "kl_cov" drops the clip and adds ppo_kl_coef * |log ratio| on the
    # kl_cov_ratio share with the largest covariance; None: off
    covariance_method: str | None = None
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    ppo_kl_coef: float = 0.1  # verl's ppo_trainer.yaml (its function's fallback is 1.0)
    # --- slot 4, the aggregation, and with it the surrogate: TRL's loss_type, a key of rlbook.losses.LOSS_TYPES ("grpo",
    # "bnpo", "dr_grpo", "dapo", "luspo": PPO-Clip's surrogate, five aggregations; "gmpo", "cispo", "sapo", "vespo":
    # their own surrogates, aggregated as TRL does)
    loss_type: str = "dapo"
    # --- slot 5, the KL penalty to the reference policy (a frozen copy of the initial policy, held when beta > 0)
    beta: float = 0.0
    kl_placement: str = "loss"  # "loss": + beta * k3 per token (GRPO); "reward": - beta * k1 per token (PPO-RLHF)
    # --- KL control
    adaptive_kl_target: float | None = None  # Ziegler et al.'s controller: beta moves toward this KL per completion
    adaptive_kl_horizon: int = 10_000  # ... by at most 20 % per adaptive_kl_horizon completions
    early_stop_kl: float | None = None  # end a rollout's updates once approx_kl > 1.5 * this (CleanRL's target_kl)
    # --- value model (advantage_estimator "gae" or "vapo")
    gamma: float = 1.0
    lam: float = 0.95  # GAE's lambda
    vf_coef: float = 0.1
    cliprange_value: float | None = 0.2
    whiten_advantages: bool = True
    value_init: str = "policy"
    # --- VAPO (advantage_estimator "vapo")
    lam_critic: float | None = None  # the value targets' lambda (VAPO: 1.0); None: the policy's lambda (coupled)
    lam_alpha: float | None = None  # length-adaptive policy lambda 1 - 1/(alpha l) (VAPO: 0.05); None: lam
    nll_coef: float = 0.0  # + nll_coef * token-mean NLL of the correct completions (VAPO's mu)
    value_pretrain_steps: int = 0  # fit the value model alone on the initial policy's rollouts first
    # --- DAPO (each off by default)
    mask_truncated_completions: bool = False  # overlong filtering: no loss on completions cut at the budget
    overlong_buffer_length: int | None = None  # soft overlong punishment: the ramp's length L_cache before the budget
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, sample new ones in their place
    max_num_gen_batches: int = 4  # dynamic sampling: generation rounds per step at most (the first included)
    # --- GFPO (advantage_estimator "gfpo"): keep gfpo_k of each group's G, the advantages over the kept
    gfpo_k: int | None = None
    gfpo_metric: str = "length"  # keep the shortest ("length") or the most reward per token ("token_efficiency")
    gfpo_adaptive: bool = False  # Adaptive Difficulty: k per prompt from its difficulty (gfpo_adaptive_k)
    # --- λ-GRPO: token losses weighted by f_i = G softmax_i(h_i^λ) (lambda_grpo_weights), λ learned by its own
    # AdamW group (lambda_grpo_learning_rate 0: a fixed λ); h_i = 1 + lambda_grpo_r * z_i (the length z-score)
    lambda_grpo: bool = False
    lambda_grpo_init: float = 0.0  # λ = 0 is DAPO's token mean
    lambda_grpo_learning_rate: float = 1e-2
    lambda_grpo_r: float = 0.3  # r < sqrt(G)/(G - 1) keeps h > 0 in every group
    # --- Routing Replay (GSPO paper, its GRPO baseline on mixture-of-experts policies): score() records the experts
    # pi_old routes every token to, and the updates compute pi_theta's log-probs on those routes (rlbook.lm.moe.
    # replay_routes), so a token's ratio does not jump when an update swaps its experts. A MoE policy only (the
    # Trainer checks).
    routing_replay: bool = False
    # the routers' weights in their own AdamW group at this learning rate (None: learning_rate), a router that moves
    # faster than the rest of a MoE policy
    router_learning_rate: float | None = None
    # --- non-finite rewards: "raise" (an error naming the step and the completion), or "skip_group" (drop the
    # groups holding one from the step's rollout, counted in nonfinite_rewards/groups_skipped)
    nonfinite_rewards: str = "raise"
    # --- the run
    max_steps: int = 100
    seed: int = 0
    eval_every: int = 0  # 0: never; else held-out sampled accuracy every eval_every steps
    eval_size: int = 128
    # the problems the prompts come from (rlbook.tasks.Task.sample): "train", or "train_without_validation" for a run
    # whose settings are chosen on the task's "validation" split, which must then stay unseen
    train_split: str = "train"

    def __post_init__(self):
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        _check(self)

    @property
    def generation_batch_size(self) -> int:
        """Completions sampled per step."""
        return self.per_device_train_batch_size * self.steps_per_generation

    @property
    def sampling_temperature(self) -> float:
        """The temperature the sampler draws and scores at: ``sampler_temperature``, else ``temperature``."""
        return self.temperature if self.sampler_temperature is None else self.sampler_temperature

    @property
    def num_prompts(self) -> int:
        """Prompts per step."""
        return self.generation_batch_size // self.num_generations

    @property
    def needs_value_model(self) -> bool:
        """Whether the advantage estimator reads a value model's estimates (PPO's GAE, VAPO's)."""
        return self.advantage_estimator in VALUE_MODEL_ESTIMATORS


PRESETS: dict[str, dict] = {
    # REINFORCE: the policy gradient itself. One on-policy update per rollout (the ratio is 1 and the clip never
    # acts), summed over tokens (dr_grpo's constant denominator keeps the sum's direction), no baseline.
    "reinforce": dict(advantage_estimator="reinforce", loss_type="dr_grpo", num_iterations=1),
    "reinforce_baseline": dict(advantage_estimator="group_mean", loss_type="dr_grpo", num_iterations=1),
    "rloo": dict(advantage_estimator="rloo", loss_type="dr_grpo", num_iterations=1),
    # PPO-Clip with GAE and a value model; TRL's PPO defaults: 4 epochs, gamma 1, lambda 0.95, vf_coef 0.1,
    # value clip 0.2, whitened advantages, token-mean loss, and a KL penalty (when beta > 0) in the reward.
    "ppo": dict(advantage_estimator="gae", loss_type="bnpo", num_iterations=4, gamma=1.0, lam=0.95, vf_coef=0.1,
                cliprange_value=0.2, whiten_advantages=True, kl_placement="reward"),
    # GRPO as in DeepSeekMath: group z-scores, per-completion token means averaged over the group, k3 KL in the
    # loss with beta 0.04, one update per rollout.
    "grpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="grpo", beta=0.04, epsilon=0.2),
    # GRPO as TRL's GRPOConfig runs it by default (= RLConfig()): DAPO's token-level loss and no KL.
    "trl_grpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="dapo", beta=0.0, epsilon=0.2,
                     epsilon_high=None, num_iterations=1, importance_sampling_level="token"),
    # Dr. GRPO: no std scaling, and a constant normaliser (B * max_completion_length) instead of |o_i|.
    "dr_grpo": dict(advantage_estimator="grpo", scale_rewards="none", loss_type="dr_grpo", beta=0.0, epsilon=0.2),
    # DAPO: clip-higher (0.2 / 0.28), token-level loss, no KL, dynamic sampling, overlong filtering and soft
    # overlong punishment (the paper's buffer is 4,096 of 20,480 tokens; here a quarter of the budget, see preset()).
    "dapo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="dapo", beta=0.0, epsilon=0.2,
                 epsilon_high=0.28, dynamic_sampling=True, mask_truncated_completions=True),
    # VAPO's seven techniques: value pretraining, decoupled GAE (critic lambda 1), length-adaptive policy lambda
    # (alpha 0.05), token-level loss, clip-higher (0.2 / 0.28), NLL on correct completions (mu 0.1), and group
    # sampling (several completions per prompt: num_generations). Paper: 50 value-pretraining steps.
    "vapo": dict(advantage_estimator="vapo", loss_type="dapo", epsilon=0.2, epsilon_high=0.28, gamma=1.0,
                 lam=0.95, lam_critic=1.0, lam_alpha=0.05, nll_coef=0.1, value_pretrain_steps=50,
                 whiten_advantages=True, num_iterations=1, kl_placement="reward"),
    # GSPO: one ratio per completion (the geometric mean of its token ratios), clipped in a tiny range (3e-4 / 4e-4),
    # no KL, and four minibatch updates per rollout so that the ratio is not trivially 1 (TRL's documented recipe).
    "gspo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="grpo", beta=0.0, epsilon=3e-4,
                 epsilon_high=4e-4, importance_sampling_level="sequence", gradient_accumulation_steps=1,
                 steps_per_generation=4),
    # GMPO: the geometric mean of token ratios clipped in log space (epsilon 0.4: ratios in (0.67, 1.49)), no KL.
    "gmpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="gmpo", beta=0.0, epsilon=0.4,
                 epsilon_high=0.4),
    # GFPO: sample 16, keep the 8 shortest per prompt, advantages over the kept ones, DAPO's token-level loss.
    "gfpo": dict(advantage_estimator="gfpo", scale_rewards="group", loss_type="dapo", beta=0.0, num_generations=16,
                 gfpo_k=8, gfpo_metric="length"),
    # λ-GRPO: DAPO's token-level loss with learnable length-based response weights. The paper does not give (in
    # what we could read) λ's start, its learning rate, r or the clip; our assumptions: λ starts at 0 (DAPO), AdamW
    # with lr 1e-2 on λ alone (no weight decay, no gradient clipping), r = 0.3 fixed, ε = 0.2, no KL.
    "lambda_grpo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="dapo", beta=0.0, epsilon=0.2,
                        lambda_grpo=True, lambda_grpo_init=0.0, lambda_grpo_learning_rate=1e-2, lambda_grpo_r=0.3),
    # CISPO (MiniMax-M1): the importance weight clipped and its gradient stopped, so no token loses its gradient.
    # TRL 1.16's loss_type "cispo": the weight capped at epsilon_high itself, 5.0 (ScaleRL's ε_max, TRL's
    # recommended value; epsilon is unused), no lower bound (MiniMax-M1 sets its ε_low large); DAPO's token-level
    # loss, group z-scores, no KL, one update per rollout (TRL's default).
    "cispo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="cispo", beta=0.0, epsilon=0.2,
                  epsilon_high=5.0, num_iterations=1, importance_sampling_level="token"),
    # SAPO (Qwen): a sigmoid gate on the token ratio in place of the clip, temperature 1.0 for A > 0 and 1.05
    # otherwise (the paper's and TRL 1.16's defaults); per-completion token means as GRPO (TRL's aggregation for
    # "sapo"), group z-scores, no KL, one update per rollout (TRL's default).
    "sapo": dict(advantage_estimator="grpo", scale_rewards="group", loss_type="sapo", beta=0.0,
                 sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, num_iterations=1,
                 importance_sampling_level="token"),
}


def preset(name: str, **overrides) -> RLConfig:
    """An :class:`RLConfig` with the named algorithm's settings (see :data:`PRESETS`), then
    ``overrides``.

    DAPO's soft overlong buffer defaults to a quarter of ``max_completion_length`` (the paper's
    4,096 of 20,480)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    settings = {**PRESETS[name], **overrides}
    if name == "dapo" and "overlong_buffer_length" not in overrides:
        settings["overlong_buffer_length"] = max(1, settings.get("max_completion_length", 16) // 4)
    return RLConfig(**settings)


def config_fields() -> dict[str, dataclasses.Field]:
    """The fields of :class:`RLConfig`, by name."""
    return {f.name: f for f in dataclasses.fields(RLConfig)}


# Other libraries' names (and this book's old ones) for RLConfig fields: hints for an unknown key.
OTHER_NAMES = {
    "lr": "learning_rate", "kl_coef": "beta", "init_kl_coef": "beta", "cliprange": "epsilon", "clip_range": "epsilon",
    "clip_ratio_low": "epsilon", "clip_ratio_high": "epsilon_high", "num_ppo_epochs": "num_iterations",
    "ppo_epochs": "num_iterations", "group_size": "num_generations", "n_samples_per_prompt": "num_generations",
    "max_new_tokens": "max_completion_length", "batch_size": "per_device_train_batch_size",
    "clip_range_value": "cliprange_value", "target_kl": "early_stop_kl", "kl_target": "adaptive_kl_target",
    "kl_horizon": "adaptive_kl_horizon", "adv_estimator": "advantage_estimator", "loss_agg_mode": "loss_type",
    "lambda_init": "lambda_grpo_init", "lambda_learning_rate": "lambda_grpo_learning_rate", "lambda_r": "lambda_grpo_r",
}


def check_keys(settings: dict) -> None:
    """Raise a ``ValueError`` naming the first key of ``settings`` that is not an :class:`RLConfig` field, with the
    field it probably means (another library's name for it, or the closest spelling) as a hint."""
    names = config_fields()
    for key in settings:
        if key not in names:
            close = [OTHER_NAMES[key]] if key in OTHER_NAMES else difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown RLConfig key {key!r}{hint}")


def _naming_unknown_keys(init):
    """``RLConfig.__init__`` that names an unknown key and the field it probably means (:func:`check_keys`), where
    the dataclass alone would say only "unexpected keyword argument"."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        check_keys(kwargs)
        init(self, *args, **kwargs)

    return __init__


RLConfig.__init__ = _naming_unknown_keys(RLConfig.__init__)


def _check(c: RLConfig) -> None:
    """Every bad value or combination, named, with the fix (called by ``RLConfig.__post_init__``)."""
    for name in ("num_generations", "max_completion_length", "per_device_train_batch_size",
                 "gradient_accumulation_steps", "steps_per_generation", "num_iterations", "max_steps", "eval_size",
                 "max_num_gen_batches", "adaptive_kl_horizon"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for name, choices in (("advantage_estimator", tuple(ESTIMATORS)), ("loss_type", tuple(LOSS_TYPES)),
                          ("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS), ("kl_placement", KL_PLACEMENTS),
                          ("scale_rewards", ("group", "batch", "none")),
                          ("gfpo_metric", ("length", "token_efficiency")), ("value_init", ("policy", "random")),
                          ("old_logprobs", ("learner", "sampler")),
                          ("train_split", ("train", "train_without_validation")),
                          ("vllm_importance_sampling_mode", VLLM_IMPORTANCE_SAMPLING_MODES),
                          ("nonfinite_rewards", ("raise", "skip_group"))):
        if getattr(c, name) not in choices:
            raise ValueError(f"unknown {name} {getattr(c, name)!r}; choose one of {choices}")
    for name in ("learning_rate", "temperature", "epsilon", "max_grad_norm", "beta", "weight_decay", "gamma", "lam",
                 "vf_coef", "nll_coef", "lambda_grpo_init", "lambda_grpo_learning_rate", "lambda_grpo_r",
                 "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
                 "vespo_lambda_neg"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if c.generation_batch_size % c.num_generations:
        raise ValueError(f"the generation batch (per_device_train_batch_size * steps_per_generation = "
                         f"{c.generation_batch_size}) must be a multiple of num_generations ({c.num_generations})")
    if c.steps_per_generation % c.gradient_accumulation_steps:
        raise ValueError(f"steps_per_generation ({c.steps_per_generation}) must be a multiple of "
                         f"gradient_accumulation_steps ({c.gradient_accumulation_steps})")
    if c.advantage_estimator in ("rloo", "grpo", "gfpo") and c.num_generations < 2:
        raise ValueError(f"advantage_estimator={c.advantage_estimator!r} compares the completions of one prompt: "
                         f"it needs num_generations >= 2, got {c.num_generations}")
    if not c.learning_rate > 0 or not c.temperature > 0 or not c.max_grad_norm > 0:
        raise ValueError(f"learning_rate, temperature and max_grad_norm must be positive, got {c.learning_rate}, "
                         f"{c.temperature} and {c.max_grad_norm}")
    for name, default in (("sampler_temperature", "the learner's temperature"),
                          ("router_learning_rate", "learning_rate")):
        value = getattr(c, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < math.inf):
            raise ValueError(f"{name} must be a positive finite number or None ({default}), got {value!r}")
    if not (0 <= c.gamma <= 1 and 0 <= c.lam <= 1):
        raise ValueError(f"gamma and lam must lie in [0, 1], got {c.gamma} and {c.lam}")
    if not c.epsilon > 0 or (c.epsilon_high is not None and not c.epsilon_high > 0):
        raise ValueError(f"epsilon and epsilon_high must be positive, got {c.epsilon} and {c.epsilon_high}")
    log_space = SURROGATES[LOSS_TYPES[c.loss_type][0]].log_space_clip
    if c.epsilon >= 1 and not log_space:
        raise ValueError(f"epsilon must be below 1 (the lower clip 1 - epsilon must stay positive), got {c.epsilon}; "
                         f"only GMPO's log-space clip (loss_type='gmpo') allows more")
    if c.epsilon_high is not None and c.epsilon_high < c.epsilon and not log_space:
        raise ValueError(f"epsilon_high ({c.epsilon_high}) is below epsilon ({c.epsilon}): clip-higher widens the "
                         f"upper side; set epsilon_high >= epsilon or leave it None for a symmetric clip")
    if c.beta < 0 or c.weight_decay < 0 or c.nll_coef < 0 or c.value_pretrain_steps < 0:
        raise ValueError(f"beta, weight_decay, nll_coef and value_pretrain_steps must be >= 0, got {c.beta}, "
                         f"{c.weight_decay}, {c.nll_coef}, {c.value_pretrain_steps}")
    if c.overlong_buffer_length is not None and not 1 <= c.overlong_buffer_length <= c.max_completion_length:
        raise ValueError(f"overlong_buffer_length must lie in [1, max_completion_length = {c.max_completion_length}], "
                         f"got {c.overlong_buffer_length}")
    for name in ("adaptive_kl_target", "early_stop_kl"):
        if getattr(c, name) is not None and not getattr(c, name) > 0:
            raise ValueError(f"{name} must be positive or None, got {getattr(c, name)}")
    if c.adaptive_kl_target is not None and c.beta == 0:
        raise ValueError("adaptive_kl_target moves beta multiplicatively, so it needs a starting beta > 0")
    if c.cliprange_value is not None and not c.cliprange_value > 0:
        raise ValueError(f"cliprange_value must be positive or None, got {c.cliprange_value}")
    if c.advantage_estimator != "vapo" and (c.lam_critic is not None or c.lam_alpha is not None):
        raise ValueError("lam_critic and lam_alpha are VAPO's: they need advantage_estimator='vapo'")
    if c.lam_critic is not None and not 0 <= c.lam_critic <= 1:
        raise ValueError(f"lam_critic must lie in [0, 1], got {c.lam_critic}")
    if c.lam_alpha is not None and not c.lam_alpha > 0:
        raise ValueError(f"lam_alpha must be positive, got {c.lam_alpha}")
    if not c.needs_value_model and c.value_pretrain_steps:
        raise ValueError(f"value_pretrain_steps needs a value model: advantage_estimator in "
                         f"{sorted(VALUE_MODEL_ESTIMATORS)}")
    if c.advantage_estimator == "gfpo":
        if c.gfpo_k is None and not c.gfpo_adaptive:
            raise ValueError("advantage_estimator='gfpo' needs gfpo_k (survivors per group) or gfpo_adaptive=True")
        if c.gfpo_k is not None and not 1 <= c.gfpo_k <= c.num_generations:
            raise ValueError(f"gfpo_k must lie in [1, num_generations = {c.num_generations}], got {c.gfpo_k}")
    elif c.gfpo_k is not None or c.gfpo_adaptive:
        raise ValueError("GFPO's filter (gfpo_k, gfpo_adaptive) needs advantage_estimator='gfpo'")
    if c.lambda_grpo:
        if c.advantage_estimator not in ("grpo", "gfpo"):
            raise ValueError("lambda_grpo weighs the completions of groups: it needs advantage_estimator 'grpo' or "
                             "'gfpo'")
        if c.lambda_grpo_learning_rate < 0 or not c.lambda_grpo_r > 0:
            raise ValueError(f"lambda_grpo_learning_rate must be >= 0 (0: a fixed lambda) and lambda_grpo_r positive, "
                             f"got {c.lambda_grpo_learning_rate} and {c.lambda_grpo_r}")
    if not isinstance(c.routing_replay, bool):
        raise ValueError(f"routing_replay must be True or False, got {c.routing_replay!r}")
    _check_variants(c)
    _check_entropy_methods(c)
    for error in config_errors(c):  # the rules that follow from what the surrogate declares (rlbook.losses)
        raise ValueError(error)
    if c.dynamic_sampling and c.num_generations < 2:
        raise ValueError("dynamic_sampling needs num_generations >= 2 (a group of one always has equal rewards)")


def _check_variants(c: RLConfig) -> None:
    """TRL 1.16's variants: CISPO's cap, SAPO's temperatures, delta, the sampler-mismatch corrections."""
    check_sapo_temperatures(c.sapo_temperature_pos, c.sapo_temperature_neg)
    if c.delta is not None:
        check_delta(c.delta, c.epsilon if c.epsilon_high is None else c.epsilon_high)
    if not isinstance(c.vllm_importance_sampling_correction, bool):
        raise ValueError(f"vllm_importance_sampling_correction must be True or False, got "
                         f"{c.vllm_importance_sampling_correction!r}")
    clip_min, clip_max = c.vllm_importance_sampling_clip_min, c.vllm_importance_sampling_clip_max
    for name, value in (("vllm_importance_sampling_clip_min", clip_min),
                        ("vllm_importance_sampling_clip_max", clip_max)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < math.inf):
            raise ValueError(f"{name} must be a finite number >= 0 or None, got {value!r}")
    if clip_min is not None and clip_max is not None and not clip_min < clip_max:
        raise ValueError(f"vllm_importance_sampling_clip_min ({clip_min}) must be below "
                         f"vllm_importance_sampling_clip_max ({clip_max})")
    if c.vllm_importance_sampling_correction:
        if clip_max is None or not clip_max > 0:
            raise ValueError("vllm_importance_sampling_correction needs a positive vllm_importance_sampling_clip_max "
                             f"(the largest weight kept; TRL's default 3.0), got {clip_max!r}")
        if c.old_logprobs != "learner":
            raise ValueError("vllm_importance_sampling_correction weighs by pi_old / pi_sampler, which is 1 when the "
                             "ratio divides by the sampler's log-probs: it needs old_logprobs='learner'")
    if c.off_policy_mask_threshold is not None and (
            isinstance(c.off_policy_mask_threshold, bool) or not isinstance(c.off_policy_mask_threshold, (int, float))
            or not 0 <= c.off_policy_mask_threshold < math.inf):
        raise ValueError(f"off_policy_mask_threshold must be a finite number >= 0 or None, got "
                         f"{c.off_policy_mask_threshold!r}")


def _check_entropy_methods(c: RLConfig) -> None:
    """The high-entropy filter, the (adaptive) entropy bonus and the covariance methods."""
    def number(name, ok=lambda v: True, says="a finite number"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise ValueError(f"{name} must be {says}, got {value!r}")

    number("top_entropy_quantile", lambda v: 0 <= v <= 1, "in [0, 1] (the share of tokens kept; 1.0: all)")
    number("entropy_coef")
    for name in ("entropy_target", "entropy_coef_min", "entropy_coef_max", "ppo_kl_coef"):
        number(name, lambda v: v >= 0, "a finite number >= 0")
    number("entropy_coef_delta", lambda v: v > 0, "a finite number > 0")
    if not isinstance(c.use_adaptive_entropy, bool):
        raise ValueError(f"use_adaptive_entropy must be True or False, got {c.use_adaptive_entropy!r}")
    if c.use_adaptive_entropy and not c.entropy_coef_min <= c.entropy_coef <= c.entropy_coef_max:
        raise ValueError(f"use_adaptive_entropy starts from entropy_coef, which must lie in [entropy_coef_min, "
                         f"entropy_coef_max] = [{c.entropy_coef_min}, {c.entropy_coef_max}], got {c.entropy_coef}")
    if c.covariance_method is None:
        return
    if c.covariance_method not in COVARIANCE_METHODS:
        raise ValueError(f"unknown covariance_method {c.covariance_method!r}; choose one of {COVARIANCE_METHODS} "
                         f"or None")
    for name in ("clip_cov_ratio", "kl_cov_ratio"):
        number(name, lambda v: 0 < v <= 1, "in (0, 1] (a share of the tokens)")
    number("clip_cov_lb")
    number("clip_cov_ub")
    if not c.clip_cov_lb < c.clip_cov_ub:
        raise ValueError(f"clip_cov_lb ({c.clip_cov_lb}) must be below clip_cov_ub ({c.clip_cov_ub})")
