"""Every preset's settings in the three engines a reader will meet next: TRL, verl and OpenRLHF.

:func:`engine_options` gives, for a preset (or any :class:`~rlbook.presets.RLConfig`), the option settings of
each engine that run the same algorithm, as ``{engine: {option: value}}`` with the engine's own option names:

- **TRL**: ``GRPOConfig`` keyword arguments, taken from :func:`rlbook.integrations.trl.grpo_kwargs` (so this
  table cannot drift from the bridge), ``RLOOConfig``'s for RLOO, ``GMPOConfig``'s for GMPO;
- **verl**: Hydra overrides of ``verl/trainer/config/ppo_trainer.yaml`` (``algorithm.adv_estimator=grpo``,
  ``actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean``, ...);
- **OpenRLHF**: command-line flags of ``openrlhf.cli.train_ppo_ray`` (``--algo.advantage.estimator group_norm``,
  ``--rollout.n_samples_per_prompt 8``, ...; OpenRLHF 0.11 groups its flags by component, older releases spelled
  them flat: ``--advantage_estimator``, ``--n_samples_per_prompt``, ``--init_kl_coef``, ``--use_kl_loss``).

Where an engine lacks a piece, the option is the book's setting and its value reads ``"not available: <why>"``;
a ``"note"`` entry holds a caveat of an option that does exist. The option names were read in the sources at
:data:`ENGINE_VERSIONS`; they move between releases, so check them against the release you run.

Batch sizes: the book counts completions, globally (``per_device_train_batch_size * steps_per_generation``
completions per step over all processes). verl counts *prompts* (``data.train_batch_size`` per step,
``actor_rollout_ref.actor.ppo_mini_batch_size`` per optimizer step, each times ``rollout.n``); OpenRLHF counts
prompts per rollout (``--rollout.batch_size``) and completions per optimizer step (``--train.batch_size``); TRL
counts completions per process (the bridge divides by ``num_processes``; the table shows one process).
"""

from __future__ import annotations

import warnings

from rlbook.integrations.trl import TRL_VERSION, grpo_kwargs, rloo_kwargs, unsupported
from rlbook.presets import PRESETS, RLConfig, preset

ENGINES = ("TRL", "verl", "OpenRLHF")
# where the option names were read
ENGINE_VERSIONS = {
    "TRL": f"trl {TRL_VERSION} (trl/trainer/grpo_config.py, rloo_config.py, experimental/gmpo)",
    "verl": "verl-project/verl 0.10.0.dev, commit 1dda039b9c6311889a9c9a26040677e1254814f9 (v0.8.0-337, "
            "2026-08-22): verl/trainer/config/_generated_ppo_trainer.yaml, verl/trainer/ppo/core_algos.py",
    "OpenRLHF": "OpenRLHF/OpenRLHF 0.11.0, commit 3c3be6234e0cb353e76bb8019947db9dfe99fca7 (2026-08-13): "
                "openrlhf/cli/train_ppo_ray.py, openrlhf/trainer/ppo_utils/experience_maker.py, "
                "openrlhf/models/loss.py",
}


def na(reason: str) -> str:
    """The value of an option an engine lacks."""
    return f"not available: {reason}"


def _str(value) -> str:
    """An option value as the engine's command line writes it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def completions_per_optimizer_step(c: RLConfig) -> int:
    """Completions per optimizer step, over all processes: ``per_device_train_batch_size *
    gradient_accumulation_steps`` (the book's batch sizes are global)."""
    return c.per_device_train_batch_size * c.gradient_accumulation_steps


def trl_options(c: RLConfig) -> dict[str, str]:
    """TRL's settings for ``c`` (one process): ``GRPOConfig`` (or ``GMPOConfig``) from :func:`grpo_kwargs`, with
    "not available" for what :func:`rlbook.integrations.trl.unsupported` names; RLOO as ``RLOOConfig``."""
    if c.advantage_estimator == "rloo":
        return rloo_options(c)
    reasons = unsupported(c)
    if c.advantage_estimator in ("gae", "vapo"):
        return {"trainer": na("TRL 1.16 ships no PPO trainer (a value model and GAE)")}
    if c.advantage_estimator == "reinforce":
        return {"trainer": na("no trainer without a baseline (GRPOTrainer and RLOOTrainer subtract one)")}
    trainer = "trl.experimental.gmpo.GMPOTrainer" if c.loss_type == "gmpo" else "trl.GRPOTrainer"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = {"trainer": trainer, **{k: _str(v) for k, v in grpo_kwargs(c, strict=False).items()}}
    if c.overlong_buffer_length is not None:
        options["reward_funcs"] = ("task reward + trl.rewards.get_soft_overlong_punishment(max_completion_len="
                                   f"{c.max_completion_length}, soft_punish_cache={c.overlong_buffer_length})")
    for reason in reasons:
        setting, _, why = reason.partition(": ")
        options[setting.split("=")[0]] = na(why or reason)
    return options


def rloo_options(c: RLConfig) -> dict[str, str]:
    """TRL's ``RLOOTrainer`` settings for an RLOO config (:func:`rlbook.integrations.trl.rloo_kwargs`)."""
    options = {"trainer": "trl.RLOOTrainer", **{k: _str(v) for k, v in rloo_kwargs(c).items()},
               "note": "RLOOTrainer clips one ratio per completion (the sum of its token log-ratios) and averages "
                       "over completions; a KL (beta > 0) is a k1 penalty in the reward"}
    if c.loss_type != "dr_grpo" or c.num_iterations > 1 or c.steps_per_generation > c.gradient_accumulation_steps:
        options["loss_type"] = na(f"RLOOTrainer has one per-completion loss, not loss_type={c.loss_type!r} "
                                  f"with token ratios")
    return options


VERL_LOSS_AGG = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "bnpo": "token-mean",
                 "dr_grpo": "seq-mean-token-sum-norm"}


def verl_options(c: RLConfig) -> dict[str, str]:
    """verl's Hydra overrides (``ppo_trainer.yaml``) for ``c``."""
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    o: dict[str, str] = {}
    G = c.num_generations
    # slot 1, the advantage
    if c.advantage_estimator in ("grpo", "group_mean"):
        if c.advantage_estimator == "grpo" and c.scale_rewards == "batch":
            o["algorithm.adv_estimator"] = na("verl's grpo divides by the group's std or by nothing, not the batch's")
        else:
            o["algorithm.adv_estimator"] = "grpo"
            o["algorithm.norm_adv_by_std_in_grpo"] = _str(c.advantage_estimator == "grpo"
                                                          and c.scale_rewards == "group")
    elif c.advantage_estimator == "rloo":
        o["algorithm.adv_estimator"] = "rloo"
    elif c.advantage_estimator == "gae":
        o["algorithm.adv_estimator"] = "gae"
        o["algorithm.gamma"], o["algorithm.lam"] = _str(c.gamma), _str(c.lam)
        o["critic.cliprange_value"] = _str(c.cliprange_value) if c.cliprange_value is not None else na(
            "the value clip is always on")
        o["critic.optim.lr"] = _str(c.learning_rate)
        o["vf_coef"] = na("the critic is a separate model with its own optimizer (no shared loss)")
        if not c.whiten_advantages:
            o["whiten_advantages"] = na("verl's GAE always whitens the advantages")
    elif c.advantage_estimator == "reinforce":
        o["algorithm.adv_estimator"] = na("no estimator without a baseline (reinforce_plus_plus whitens the "
                                          "returns over the batch)")
    elif c.advantage_estimator == "vapo":
        o["algorithm.adv_estimator"] = na("no VAPO estimator in verl's core (decoupled and length-adaptive GAE)")
    elif c.advantage_estimator == "gfpo":
        o["algorithm.adv_estimator"] = na("no GFPO filter (keep gfpo_k completions of each group)")
    # sampling and batch layout (verl counts prompts)
    o[f"{rollout}.n"] = _str(G)
    o["data.max_response_length"] = _str(c.max_completion_length)
    o[f"{rollout}.temperature"] = _str(c.temperature)
    o["data.train_batch_size"] = _str(c.num_prompts)
    per_step = completions_per_optimizer_step(c)
    o[f"{actor}.ppo_mini_batch_size"] = _str(per_step // G) if per_step % G == 0 else na(
        f"an optimizer step of {per_step} completions is not a whole number of groups of {G}")
    o[f"{actor}.ppo_epochs"] = _str(c.num_iterations)
    o[f"{actor}.optim.lr"] = _str(c.learning_rate)
    o[f"{actor}.optim.weight_decay"] = _str(c.weight_decay)
    o[f"{actor}.optim.clip_grad"] = _str(c.max_grad_norm)
    o["trainer.total_training_steps"] = _str(c.max_steps)
    # slots 2-4: ratio, clip, aggregation
    if c.loss_type == "gmpo":
        o[f"{actor}.policy_loss.loss_mode"] = "geo_mean"
    elif c.importance_sampling_level in ("sequence", "sequence_token"):
        o[f"{actor}.policy_loss.loss_mode"] = "gspo"
        o["note"] = "verl's gspo is the GSPO-token form and always aggregates seq-mean-token-mean"
    else:
        o[f"{actor}.policy_loss.loss_mode"] = "vanilla"
    o[f"{actor}.clip_ratio_low"] = _str(c.epsilon)
    o[f"{actor}.clip_ratio_high"] = _str(c.epsilon if c.epsilon_high is None else c.epsilon_high)
    if c.loss_type != "gmpo":
        o[f"{actor}.loss_agg_mode"] = VERL_LOSS_AGG[c.loss_type]
    if c.loss_type == "dr_grpo":
        o[f"{actor}.loss_scale_factor"] = _str(c.max_completion_length)
    if c.loss_type == "bnpo":
        o["note"] = ("token-mean divides by the tokens of the whole optimizer step; the book's bnpo by each "
                     "micro-batch's (the same when gradient_accumulation_steps = 1 on one process)")
    # slot 5, the KL
    kl_in_loss, kl_in_reward = c.beta > 0 and c.kl_placement == "loss", c.beta > 0 and c.kl_placement == "reward"
    o[f"{actor}.use_kl_loss"] = _str(kl_in_loss)
    o["algorithm.use_kl_in_reward"] = _str(kl_in_reward)
    if kl_in_loss:
        o[f"{actor}.kl_loss_coef"], o[f"{actor}.kl_loss_type"] = _str(c.beta), "low_var_kl"
    if kl_in_reward:
        o["algorithm.kl_penalty"], o["algorithm.kl_ctrl.kl_coef"] = "kl", _str(c.beta)
    if c.adaptive_kl_target is not None:
        o["algorithm.kl_ctrl.type"] = "adaptive"
        o["algorithm.kl_ctrl.target_kl"] = _str(c.adaptive_kl_target)
        o["algorithm.kl_ctrl.horizon"] = _str(c.adaptive_kl_horizon)
    # extra machinery
    if c.dynamic_sampling:
        o["algorithm.filter_groups.enable"] = "true"
        o["algorithm.filter_groups.metric"] = "acc"
        o["algorithm.filter_groups.max_num_gen_batches"] = _str(c.max_num_gen_batches)
        o["data.gen_batch_size"] = _str(c.num_prompts)
    if c.mask_truncated_completions:
        o["mask_truncated_completions"] = na("no overlong filtering (loss mask of truncated completions)")
    if c.overlong_buffer_length is not None:
        o["reward.reward_manager.name"] = "dapo"
        o["+reward.reward_kwargs.overlong_buffer_cfg.enable"] = "true"
        o["+reward.reward_kwargs.overlong_buffer_cfg.len"] = _str(c.overlong_buffer_length)
        o["+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"] = "1.0"
        o["+reward.reward_kwargs.max_resp_len"] = _str(c.max_completion_length)
    if c.routing_replay:
        o[f"{actor}.router_replay.mode"] = "R2"
    _common_missing(c, o, "verl")
    return o


def openrlhf_estimator(c: RLConfig) -> str:
    """OpenRLHF's ``--algo.advantage.estimator`` for ``c``, or "not available" with the reason."""
    if c.advantage_estimator == "group_mean" or (c.advantage_estimator == "grpo" and c.scale_rewards == "none"):
        return "dr_grpo"  # r - the group's mean, nothing else
    if c.advantage_estimator == "grpo":
        return "group_norm" if c.scale_rewards == "group" else na("no group advantage divided by the batch's std")
    if c.advantage_estimator in ("rloo", "gae"):
        return c.advantage_estimator
    return na({"reinforce": "its 'reinforce' is REINFORCE++ (returns whitened over the batch), not a bare reward",
               "vapo": "no VAPO (decoupled and length-adaptive GAE)",
               "gfpo": "no GFPO filter (keep gfpo_k completions of each group)"}[c.advantage_estimator])


def openrlhf_options(c: RLConfig) -> dict[str, str]:
    """OpenRLHF's ``train_ppo_ray`` flags for ``c``."""
    o: dict[str, str] = {}
    o["--algo.advantage.estimator"] = openrlhf_estimator(c)
    if c.advantage_estimator == "gae":
        o["--algo.advantage.gamma"], o["--algo.advantage.lambd"] = _str(c.gamma), _str(c.lam)
        o["--critic.value_clip"] = _str(c.cliprange_value) if c.cliprange_value is not None else na(
            "the value clip is always on")
        o["--critic.adam.lr"] = _str(c.learning_rate)
        o["vf_coef"] = na("the critic is a separate model with its own optimizer (no shared loss)")
        if not c.whiten_advantages:
            o["whiten_advantages"] = na("GAE advantages are always centred over the batch "
                                        "(--algo.advantage.no_std_norm only skips the std)")
    if c.value_pretrain_steps:
        o["--critic.freezing_steps"] = _str(c.value_pretrain_steps)
    # sampling and batch layout
    o["--rollout.n_samples_per_prompt"] = _str(c.num_generations)
    o["--rollout.max_new_tokens"] = _str(c.max_completion_length)
    o["--rollout.temperature"] = _str(c.temperature)
    o["--rollout.batch_size"] = _str(c.num_prompts)
    o["--train.batch_size"] = _str(completions_per_optimizer_step(c))
    o["--train.max_epochs"] = _str(c.num_iterations)
    o["--actor.adam.lr"] = _str(c.learning_rate)
    o["--actor.adam.weight_decay"] = _str(c.weight_decay)
    o["--actor.max_norm"] = _str(c.max_grad_norm)
    o["--actor.lr_scheduler"] = "constant"
    o["--actor.lr_warmup_ratio"] = "0"
    # slots 2-4
    if c.loss_type == "gmpo":
        o["--actor.policy_loss_type"] = na("no geometric-mean (GMPO) loss")
    elif c.importance_sampling_level in ("sequence", "sequence_token"):
        o["--actor.policy_loss_type"] = "gspo"
    else:
        o["--actor.policy_loss_type"] = "ppo"
    high = c.epsilon if c.epsilon_high is None else c.epsilon_high
    o["--actor.eps_clip_low_high"] = f"{_str(c.epsilon)} {_str(high)}"
    sequence_level = c.importance_sampling_level != "token"
    if c.loss_type == "grpo" and not sequence_level:
        o["loss_type"] = na("the per-completion token mean (grpo) is used only with policy_loss_type gspo; "
                            "ppo's loss is a token mean")
    elif c.loss_type in ("dr_grpo", "bnpo"):
        o["loss_type"] = na(f"{c.loss_type}: the loss is always the token mean over the optimizer step (dapo's)")
    # slot 5, the KL
    if c.beta > 0:
        o["--algo.kl.init_coef"] = _str(c.beta)
        if c.kl_placement == "loss":
            o["--algo.kl.use_loss"], o["--algo.kl.estimator"] = "", "k3"
        else:
            o["--algo.kl.estimator"] = "k1"
    else:
        o["--algo.kl.init_coef"] = "0"
    if c.adaptive_kl_target is not None:
        o["--algo.kl.target"], o["--algo.kl.horizon"] = _str(c.adaptive_kl_target), _str(c.adaptive_kl_horizon)
    # extra machinery
    if c.dynamic_sampling:
        o["--algo.dynamic_filtering_enable"] = ""
        o["--algo.dynamic_filtering_range"] = "0 1"
        o["note"] = ("dynamic filtering drops a group whose mean reward is outside (0, 1): all-equal groups for "
                     "0/1 rewards; it samples until the batch is full (no max_num_gen_batches)")
    if c.mask_truncated_completions:
        o["mask_truncated_completions"] = na("no loss mask for truncated completions (--reward."
                                             "stop_properly_penalty_coef scales their reward instead)")
    if c.overlong_buffer_length is not None:
        o["--reward.overlong_buffer_len"] = _str(c.overlong_buffer_length)
        o["--reward.overlong_penalty_factor"] = "1"
    if c.routing_replay:
        o["routing_replay"] = na("no routing replay")
    _common_missing(c, o, "OpenRLHF")
    return o


def _common_missing(c: RLConfig, o: dict[str, str], engine: str) -> None:
    """Add the book's settings that neither verl nor OpenRLHF has (as "not available")."""
    if c.lambda_grpo:
        o["lambda_grpo"] = na("no learnable length-based response weights (λ-GRPO)")
    if c.early_stop_kl is not None:
        o["early_stop_kl"] = na("no early stop of a rollout's updates on approx_kl")
    if c.advantage_estimator == "vapo" and engine == "verl":
        o["value_pretrain_steps"] = (f"trainer.critic_warmup={c.value_pretrain_steps}" if c.value_pretrain_steps
                                     else "0")
    if c.nll_coef > 0:
        o["nll_coef"] = na("no NLL term on correct completions")
    if c.lam_critic is not None or c.lam_alpha is not None:
        o["lam_critic, lam_alpha"] = na("one GAE lambda for the policy and the value targets")
    if c.router_learning_rate is not None:
        o["router_learning_rate"] = na("one learning rate for every parameter of the actor")


def engine_options(config_or_preset_name: RLConfig | str) -> dict[str, dict[str, str]]:
    """``{engine: {option: value}}`` for a preset's name or an :class:`RLConfig`, one entry per engine of
    :data:`ENGINES`; a value ``"not available: <why>"`` marks what the engine lacks."""
    c = preset(config_or_preset_name) if isinstance(config_or_preset_name, str) else config_or_preset_name
    return {"TRL": trl_options(c), "verl": verl_options(c), "OpenRLHF": openrlhf_options(c)}


# The options that set sizes, lengths and the optimiser's schedule rather than the algorithm (the book's are set for
# its tiny policies): engine_table(sizes=False) leaves them out.
SIZE_OPTIONS = {
    "TRL": {"max_completion_length", "temperature", "top_p", "top_k", "per_device_train_batch_size",
            "gradient_accumulation_steps", "learning_rate", "weight_decay", "max_grad_norm", "lr_scheduler_type",
            "warmup_steps", "max_steps", "seed"},
    "verl": {"data.max_response_length", "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.actor.optim.lr",
             "actor_rollout_ref.actor.optim.weight_decay", "actor_rollout_ref.actor.optim.clip_grad",
             "trainer.total_training_steps", "critic.optim.lr"},
    "OpenRLHF": {"--rollout.max_new_tokens", "--rollout.temperature", "--actor.adam.lr", "--actor.adam.weight_decay",
                 "--actor.max_norm", "--actor.lr_scheduler", "--actor.lr_warmup_ratio", "--critic.adam.lr"},
}


def engine_table(names=None, sizes: bool = True) -> list[dict[str, str]]:
    """Rows for the book's table, one per preset (all of :data:`rlbook.presets.PRESETS` by default): ``preset``
    and, per engine, its options as ``"option=value"`` lines (a flag without a value alone), the missing pieces
    last; ``sizes=False`` leaves out the :data:`SIZE_OPTIONS`."""
    rows = []
    for name in names or PRESETS:
        row = {"preset": name}
        for engine, options in engine_options(name).items():
            if not sizes:
                options = {k: v for k, v in options.items() if k not in SIZE_OPTIONS[engine]}
            present = [k if v == "" else f"{k}={v}" for k, v in options.items() if not v.startswith("not available")]
            missing = [f"{k}: {v}" for k, v in options.items() if v.startswith("not available")]
            row[engine] = "\n".join(present + missing)
        rows.append(row)
    return rows
