"""Every preset as the text to paste into the three engines a reader will meet next: TRL, verl and OpenRLHF.

:func:`engine_runs` gives, for a preset (or any :class:`~rlbook.presets.RLConfig`), one :class:`EngineRun` per
engine: the options that run the same algorithm, in the engine's own names, and the ``command`` to paste:

- **TRL** (``trl`` :data:`~rlbook.integrations.trl.TRL_VERSION`): Python that builds ``GRPOConfig`` (``RLOOConfig``
  for RLOO, ``GMPOConfig`` for GMPO) from :func:`rlbook.integrations.trl.grpo_kwargs`, so it cannot drift from the
  bridge;
- **verl** (``verl`` :data:`VERL_VERSION` from PyPI): a ``python3 -m verl.trainer.main_ppo`` command whose
  arguments are Hydra overrides of ``verl/trainer/config/ppo_trainer.yaml`` (``algorithm.adv_estimator=grpo``,
  ``actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean``, ...);
- **OpenRLHF** (``openrlhf`` :data:`OPENRLHF_VERSION` from PyPI): a ``python3 -m openrlhf.cli.train_ppo_ray``
  command with flags of its argument parser (``--algo.advantage.estimator group_norm``, ...; a flag of two values
  is written ``--actor.eps_clip_low_high 0.2 0.28``).

A verl or OpenRLHF command starts with the sizes of the reader's cluster as shell variables (model, data, GPUs,
micro-batch; example values, marked as such), then sets the options that cluster needs for the engine to start
(micro-batch sizes, the rollout engine, the critic's weights), the preset's algorithm, and the book's sizes
(completion length, batch, learning rate, run length: set for the book's tiny policies, so scale them). Beside a
command, ``notes`` say where the engine computes something other than the book at an option, and ``missing`` names
the book's settings it lacks. Where an engine cannot run what defines a preset (its advantage estimator or
surrogate, λ-GRPO's weights) there is no command (``blocked``): the rest pasted alone would run another algorithm.

The names and values follow the pinned releases and are checked against them without a GPU:
``tests/test_engines_verl.py`` composes verl's own trainer config with Hydra under every command as bash expands it,
runs verl's ``validate_config``, and checks that verl's loss, advantage and reward code under the composed config
give the book's; ``tests/test_engines_openrlhf.py`` runs OpenRLHF's own argument parser and the checks after it
(read from the release) on every command, and checks its ``PolicyLoss`` and overlong penalty the same way. Both
install the releases from PyPI without their dependencies. No command has trained a step or run on a GPU.

Batch sizes: the book counts completions, globally (``per_device_train_batch_size * steps_per_generation``
completions per step over all processes). verl counts *prompts* (``data.train_batch_size`` per step,
``actor_rollout_ref.actor.ppo_mini_batch_size`` per optimizer step, each times ``rollout.n``); OpenRLHF counts
prompts per rollout (``--rollout.batch_size``) and completions per optimizer step (``--train.batch_size``); TRL
counts completions per process (the bridge divides by ``num_processes``; the commands show one process).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from rlbook.integrations.trl import TRL_VERSION, as_config, grpo_kwargs, rloo_kwargs, unsupported
from rlbook.losses import LOSS_TYPES
from rlbook.presets import PRESETS, RLConfig

ENGINES = ("TRL", "verl", "OpenRLHF")
VERL_VERSION = "0.9.1"  # PyPI: the release whose ppo_trainer.yaml and validation the commands pass
OPENRLHF_VERSION = "0.11.2"  # PyPI: the release whose train_ppo_ray argument parser the commands pass
# the release of each engine, and the files its names were read in
ENGINE_VERSIONS = {
    "TRL": f"trl {TRL_VERSION}: trl/trainer/grpo_config.py, rloo_config.py, experimental/gmpo",
    "verl": f"verl {VERL_VERSION}: verl/trainer/config/ppo_trainer.yaml, verl/trainer/ppo/core_algos.py, "
            f"verl/trainer/ppo/v1/trainer_base.py, verl/utils/config.py",
    "OpenRLHF": f"openrlhf {OPENRLHF_VERSION}: openrlhf/cli/train_ppo_ray.py, openrlhf/models/loss.py, "
                f"openrlhf/trainer/ppo_utils/experience_maker.py, openrlhf/trainer/ppo_trainer.py",
}
RELEASES = {"TRL": f"trl {TRL_VERSION}", "verl": f"verl {VERL_VERSION}", "OpenRLHF": f"openrlhf {OPENRLHF_VERSION}"}

# verl clamps log-ratios to [-20, 20] before exp, so no ratio it computes exceeds e^20 ≈ 4.9e8: a dual-clip bound c
# above that never binds (verl's default c = 3 bounds a negative advantage's loss at 3|A|).
VERL_NO_DUAL_CLIP = "1e9"
ADAM_BETAS = "0.9 0.999"  # torch's AdamW defaults, the book's (OpenRLHF's default is 0.9 0.95)


def na(reason: str) -> str:
    """The value of an option an engine lacks."""
    return f"not available: {reason}"


def _str(value) -> str:
    """An option value as the engine's command line writes it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _g(value: float) -> str:
    """A computed number, at most 6 significant digits."""
    return f"{value:.6g}"


@dataclass(frozen=True)
class EngineRun:
    """One engine's settings for one config.

    ``options``: option -> value as the command writes it (``""`` for a flag), in the command's order;
    ``notes``: option -> where the engine computes something other than the book there; ``missing``: the book's
    setting -> why the engine lacks it; ``command``: the text to paste (``None`` when ``blocked``);
    ``blocked``: ``(setting, reason)`` when the engine cannot run what defines the preset."""

    engine: str
    options: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    command: str | None = None
    blocked: tuple[str, str] | None = None


def completions_per_optimizer_step(c: RLConfig) -> int:
    """Completions per optimizer step, over all processes: ``per_device_train_batch_size *
    gradient_accumulation_steps`` (the book's batch sizes are global)."""
    return c.per_device_train_batch_size * c.gradient_accumulation_steps


# the book's aggregations that are means over each micro-batch (rlbook.losses.AGGREGATIONS), and what they count
MICRO_BATCH_MEANS = {"completion_token_mean": "completions", "token_mean": "loss tokens",
                     "completion_token_sum_mean": "completions"}


def _micro_batch_note(c: RLConfig, engine_mode: str) -> str | None:
    """The caveat of an engine's mean over the optimizer step where the book's aggregation (``grpo``, ``sapo``,
    ``bnpo``, ``luspo``) means over each micro-batch: only when they differ (``gradient_accumulation_steps > 1``)."""
    of = MICRO_BATCH_MEANS.get(LOSS_TYPES[c.loss_type][1])
    if of is not None and c.gradient_accumulation_steps > 1:
        return (f"{engine_mode} divides by the {of} of the whole optimizer step, the book's {c.loss_type} by each "
                f"micro-batch's; they agree when gradient_accumulation_steps = 1")
    return None


def _shell(header: list[str], program: str, args: list[str]) -> str:
    """A shell command of one argument a line: the ``header`` lines, then ``python3 -m program`` and ``args``."""
    lines = [*header, f"python3 -m {program} \\"]
    lines += [f"    {a} \\" for a in args[:-1]] + [f"    {args[-1]}"]
    return "\n".join(lines)


def _cluster_header(engine: str, critic: bool) -> list[str]:
    """The shell lines that set the reader's cluster (example values for one node of 8 GPUs)."""
    model = "# the policy's weights" + (", also the critic's start" if critic else "")
    lines = ["# sizes for your cluster (examples: one node of 8 GPUs); edit them",
             f"MODEL=Qwen/Qwen2.5-0.5B-Instruct  {model}"]
    if engine == "verl":
        lines.append("DATA=$HOME/data/gsm8k  # train.parquet and test.parquet in verl's format")
    else:
        lines += ['DATA=$HOME/data/gsm8k.jsonl  # prompts in "input", answers in "label"',
                  "REWARD=$HOME/reward_func.py  # defines reward_func(queries, prompts, labels)"]
    return lines + ["GPUS=8 NODES=1 MICRO=8  # GPUs per node, nodes, completions per GPU per forward"]


def _common_missing(c: RLConfig) -> dict[str, str]:
    """The book's settings that neither verl nor OpenRLHF has."""
    missing = {}
    if c.mask_truncated_completions:
        missing["mask_truncated_completions"] = "no loss mask for completions cut at the budget (overlong filtering)"
    if c.early_stop_kl is not None:
        missing["early_stop_kl"] = "no early stop of a rollout's updates on approx_kl"
    if c.nll_coef > 0:
        missing["nll_coef"] = "no NLL term on correct completions"
    if c.router_learning_rate is not None:
        missing["router_learning_rate"] = "one learning rate for every parameter of the actor"
    if c.sampler_temperature is not None and c.sampler_temperature != c.temperature:
        missing["sampler_temperature"] = "the rollout engine samples at the temperature the learner scores at"
    if c.old_logprobs == "sampler":
        missing["old_logprobs"] = "the commands recompute pi_old with the training forward ('learner')"
    if c.needs_value_model and c.value_init == "random":
        missing["value_init"] = "the critic starts from pretrained weights (here the policy's) with a new value head"
    # TRL 1.16's variants: the book does not translate them to verl's or OpenRLHF's options (yet)
    if c.delta is not None:
        missing["delta"] = "the book does not map TRL's two-sided clip to this engine's options"
    if c.vllm_importance_sampling_correction:
        missing["vllm_importance_sampling_correction"] = ("the book does not map the sampler-mismatch correction to "
                                                          "this engine's options")
    if c.off_policy_mask_threshold is not None:
        missing["off_policy_mask_threshold"] = ("the book does not map off-policy sequence masking to this engine's "
                                                "options")
    # the entropy methods neither engine has (each engine maps a fixed entropy_coef, and verl Clip-Cov/KL-Cov)
    if c.top_entropy_quantile < 1.0:
        missing["top_entropy_quantile"] = "no filter that keeps only the high-entropy tokens in the policy loss"
    if c.use_adaptive_entropy:
        missing["use_adaptive_entropy"] = "the entropy coefficient stays fixed (no adaptive control)"
    return missing


def _entropy_coef(c: RLConfig, option: str, o: dict, notes: dict, aggregation: str) -> None:
    """A fixed entropy bonus as the engine's ``option``: both engines average the entropy with the loss's own
    aggregation, the book (as TRL) with a token mean; the two agree for the token-level aggregations."""
    if c.entropy_coef == 0.0 or c.use_adaptive_entropy:
        return
    o[option] = _str(c.entropy_coef)
    if LOSS_TYPES[c.loss_type][1] not in ("token_mean", "global_token_mean"):  # not a token mean
        notes[option] = (f"the engine averages the entropy as it aggregates the loss ({aggregation}); the book, "
                         f"as TRL, takes the token mean, so the bonus weighs long and short completions otherwise")


# ---------------------------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------------------------

def _trl_blocked(c: RLConfig) -> tuple[str, str] | None:
    if c.advantage_estimator in ("gae", "vapo"):
        return (f"advantage_estimator={c.advantage_estimator!r}",
                f"TRL {TRL_VERSION} ships no PPO trainer (a value model and GAE)")
    if c.advantage_estimator == "reinforce":
        return "advantage_estimator='reinforce'", ("no trainer without a baseline (GRPOTrainer and RLOOTrainer "
                                                   "subtract one)")
    if c.advantage_estimator == "gfpo":
        return "advantage_estimator='gfpo'", "no GFPO filter (keep gfpo_k completions of each group)"
    if c.lambda_grpo:
        return "lambda_grpo", "no learnable length-based response weights (λ-GRPO)"
    if c.importance_sampling_level not in ("token", "sequence"):
        return (f"importance_sampling_level={c.importance_sampling_level!r}",
                "TRL has the 'token' and 'sequence' ratio levels only")
    if c.loss_type == "gmpo" and c.importance_sampling_level != "token":
        return "loss_type='gmpo' with a sequence-level ratio", "TRL's GMPOTrainer clips token ratios only"
    return None


def _python(imports: str, cls: str, kwargs: dict, tail: list[str]) -> str:
    """Python that builds ``cls(**kwargs)``, one keyword a line, then ``tail``."""
    lines = [imports, "", f"args = {cls}("]
    lines += [f"    {k}={v!r}," for k, v in kwargs.items()] + [")"]
    return "\n".join(lines + tail)


def trl_run(c: RLConfig, output_dir: str = "runs/rlbook") -> EngineRun:
    """TRL's settings for ``c`` (one process): ``GRPOConfig`` (or ``GMPOConfig``) from :func:`grpo_kwargs`, with
    what :func:`rlbook.integrations.trl.unsupported` names as missing; RLOO as ``RLOOConfig``."""
    blocked = _trl_blocked(c)
    if blocked:
        return EngineRun("TRL", blocked=blocked)
    if c.advantage_estimator == "rloo":
        kwargs, notes, missing = rloo_kwargs(c), {}, {}
        cls, imports = "RLOOConfig", f"from trl import RLOOConfig  # trl {TRL_VERSION}"
        notes["normalize_advantages"] = ("RLOOTrainer clips one ratio per completion (the sum of its token "
                                         "log-ratios) and averages over completions; a KL (beta > 0) is a k1 "
                                         "penalty in the reward")
        if c.loss_type != "dr_grpo" or c.num_iterations > 1 or c.steps_per_generation > c.gradient_accumulation_steps:
            missing["loss_type"] = (f"RLOOTrainer has one per-completion loss, not loss_type={c.loss_type!r} with "
                                    f"token ratios")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs = grpo_kwargs(c, strict=False)
        if c.loss_type == "gmpo":
            cls, imports = "GMPOConfig", f"from trl.experimental.gmpo import GMPOConfig  # trl {TRL_VERSION}"
        else:
            cls, imports = "GRPOConfig", f"from trl import GRPOConfig  # trl {TRL_VERSION}"
        notes, missing = {}, {}
        for reason in unsupported(c):
            setting, _, why = reason.partition(": ")
            missing[setting.split("=")[0]] = why or reason
    notes["per_device_train_batch_size"] = ("per process in TRL: the value is one process's; divide it by the "
                                            "processes (`grpo_config(..., num_processes=N)` does)")
    kwargs = {"output_dir": output_dir, **kwargs}
    tail = []
    if c.overlong_buffer_length is not None:
        tail = ["", "from trl.rewards import get_soft_overlong_punishment", "",
                "# DAPO's soft overlong punishment: add it to the task's reward in reward_funcs",
                "overlong_reward = get_soft_overlong_punishment(",
                f"    max_completion_len={c.max_completion_length}, soft_punish_cache={c.overlong_buffer_length})"]
    options = {k: _str(v) for k, v in kwargs.items()}
    return EngineRun("TRL", options, notes, missing, _python(imports, cls, kwargs, tail))


# ---------------------------------------------------------------------------------------------------------------
# verl
# ---------------------------------------------------------------------------------------------------------------

# TRL 1.16's VESPO, which neither verl 0.9.1 (no such register_policy_loss) nor OpenRLHF 0.11 has
NOT_IN_VERL_OR_OPENRLHF = {
    "vespo": "has no VESPO loss (a detached Gamma weight of the sequence's likelihood ratio in place of the clip)",
}

# the book's aggregations as verl's loss_agg_mode (CISPO's is DAPO's token mean, SAPO's GRPO's per-completion mean,
# LUSPO's each completion's token sum averaged over completions)
VERL_LOSS_AGG = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "bnpo": "token-mean",
                 "dr_grpo": "seq-mean-token-sum-norm", "cispo": "token-mean", "sapo": "seq-mean-token-mean",
                 "luspo": "seq-mean-token-sum"}


def _verl_blocked(c: RLConfig) -> tuple[str, str] | None:
    if c.advantage_estimator == "grpo" and c.scale_rewards == "batch":
        return "scale_rewards='batch'", "verl's grpo divides by the group's std or by nothing, not the batch's"
    reasons = {"reinforce": "no estimator without a baseline (`reinforce_plus_plus` whitens the returns over "
                            "the batch)",
               "vapo": "no VAPO estimator (decoupled and length-adaptive GAE with value pretraining and an NLL term)",
               "gfpo": "no GFPO filter (keep gfpo_k completions of each group)"}
    if c.advantage_estimator in reasons:
        return f"advantage_estimator={c.advantage_estimator!r}", reasons[c.advantage_estimator]
    if c.loss_type == "gmpo" and c.importance_sampling_level != "token":
        return "loss_type='gmpo' with a sequence-level ratio", "verl's geo_mean clips token ratios"
    if c.loss_type in ("cispo", "sapo") and c.importance_sampling_level != "token":
        return (f"loss_type={c.loss_type!r} with a sequence-level ratio",
                f"verl's {c.loss_type} loss weighs token ratios only")
    if c.loss_type in NOT_IN_VERL_OR_OPENRLHF:
        return f"loss_type={c.loss_type!r}", f"verl {VERL_VERSION} {NOT_IN_VERL_OR_OPENRLHF[c.loss_type]}"
    if c.lambda_grpo:
        return "lambda_grpo", "no learnable length-based response weights (λ-GRPO)"
    per_step = completions_per_optimizer_step(c)
    if per_step % c.num_generations:
        return "per_device_train_batch_size", (f"verl's optimizer step is a whole number of groups, and {per_step} "
                                               f"completions are not groups of {c.num_generations}")
    return None


def verl_run(c: RLConfig) -> EngineRun:
    """verl's command for ``c``: Hydra overrides of ``ppo_trainer.yaml`` for ``python3 -m verl.trainer.main_ppo``."""
    blocked = _verl_blocked(c)
    if blocked:
        return EngineRun("verl", blocked=blocked)
    actor, rollout, ref = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
    G, W = c.num_generations, c.value_pretrain_steps
    critic = c.advantage_estimator == "gae"
    kl_in_loss, kl_in_reward = c.beta > 0 and c.kl_placement == "loss", c.beta > 0 and c.kl_placement == "reward"
    o: dict[str, str] = {}
    notes: dict[str, str] = {}
    missing = _common_missing(c)
    # what the cluster sets, and what verl needs to start
    o["data.train_files"], o["data.val_files"] = "$DATA/train.parquet", "$DATA/test.parquet"
    o["actor_rollout_ref.model.path"] = "$MODEL"
    o[f"{rollout}.name"] = "vllm"
    o["trainer.nnodes"], o["trainer.n_gpus_per_node"] = "$NODES", "$GPUS"
    o["trainer.logger"] = "console"
    o[f"{actor}.ppo_micro_batch_size_per_gpu"] = "$MICRO"
    o[f"{rollout}.log_prob_micro_batch_size_per_gpu"] = "$MICRO"
    if kl_in_loss or kl_in_reward:
        o[f"{ref}.log_prob_micro_batch_size_per_gpu"] = "$MICRO"
    if critic:
        o["critic.model.path"] = "$MODEL"
        o["critic.ppo_micro_batch_size_per_gpu"] = "$MICRO"
    # slot 1, the advantage
    if c.advantage_estimator in ("grpo", "group_mean"):
        o["algorithm.adv_estimator"] = "grpo"
        by_std = c.advantage_estimator == "grpo" and c.scale_rewards == "group"
        o["algorithm.norm_adv_by_std_in_grpo"] = _str(by_std)
        if by_std:
            notes["algorithm.norm_adv_by_std_in_grpo"] = ("verl divides by the group's std + 1e-6, the book by "
                                                          "std + 1e-4 (TRL's); they differ only for nearly equal "
                                                          "rewards")
    else:  # rloo, gae
        o["algorithm.adv_estimator"] = c.advantage_estimator
    if critic:
        o["algorithm.gamma"], o["algorithm.lam"] = _str(c.gamma), _str(c.lam)
        if c.cliprange_value is not None:
            o["critic.cliprange_value"] = _str(c.cliprange_value)
        else:
            missing["cliprange_value"] = "the value clip is always on"
        missing["vf_coef"] = "the critic is a separate model with its own optimizer (no shared loss)"
        if not c.whiten_advantages:
            missing["whiten_advantages"] = "verl's GAE always whitens the advantages"
    o[f"{rollout}.n"] = _str(G)
    # slots 2-4: ratio, clip, aggregation
    if c.loss_type == "gmpo":
        o[f"{actor}.policy_loss.loss_mode"] = "geo_mean"
        notes[f"{actor}.policy_loss.loss_mode"] = (
            "verl's geo_mean averages each micro-batch's completions, and the micro-batches' losses add up: with k "
            "micro-batches per GPU in an optimizer step the gradient is k times the book's (Adam undoes a constant "
            "factor, the gradient clip does not); keep MICRO at a GPU's share of an optimizer step (k = 1)")
    elif c.loss_type in ("cispo", "sapo"):  # verl's policy-loss modes of the same names (token ratios)
        o[f"{actor}.policy_loss.loss_mode"] = c.loss_type
    elif c.importance_sampling_level in ("sequence", "sequence_token"):
        o[f"{actor}.policy_loss.loss_mode"] = "gspo"
        notes[f"{actor}.policy_loss.loss_mode"] = (
            "verl's gspo is the GSPO-token ratio `sg[s_i]·π/sg[π]` (its log clamped at 10), whose value and "
            "gradient equal one ratio per completion when every token's advantage is its completion's, as here")
    else:
        o[f"{actor}.policy_loss.loss_mode"] = "vanilla"
    high = c.epsilon if c.epsilon_high is None else c.epsilon_high
    if c.loss_type == "cispo":
        # verl clips CISPO's weight to [1 - clip_ratio_low, 1 + clip_ratio_high]; the book (as TRL) caps it at
        # epsilon_high itself, with no lower bound
        o[f"{actor}.clip_ratio_low"], o[f"{actor}.clip_ratio_high"] = "1", _g(high - 1)
        notes[f"{actor}.clip_ratio_high"] = (
            f"verl's cispo caps the weight at 1 + clip_ratio_high, the book (as TRL) at epsilon_high = {_g(high)} "
            f"itself: the value is epsilon_high - 1; clip_ratio_low = 1 puts the lower bound at 0, where no ratio "
            f"falls (the book's CISPO has none)")
    elif c.loss_type == "sapo":  # no clip: the temperatures of the gate, verl's tau_pos and tau_neg
        o[f"{actor}.tau_pos"], o[f"{actor}.tau_neg"] = _str(c.sapo_temperature_pos), _str(c.sapo_temperature_neg)
    else:
        o[f"{actor}.clip_ratio_low"], o[f"{actor}.clip_ratio_high"] = _str(c.epsilon), _str(high)
    if o[f"{actor}.policy_loss.loss_mode"] == "vanilla":
        o[f"{actor}.clip_ratio_c"] = VERL_NO_DUAL_CLIP
        notes[f"{actor}.clip_ratio_c"] = ("switches off verl's dual clip (its default c = 3 caps a negative "
                                          "advantage's loss at 3|A|): verl clamps log-ratios to ±20, so no ratio "
                                          "reaches 1e9")
    if c.covariance_method is not None:  # Cui et al.'s methods: verl's policy-loss modes of the same names
        o[f"{actor}.policy_loss.loss_mode"] = c.covariance_method
        if c.covariance_method == "clip_cov":
            for name in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"):
                o[f"{actor}.policy_loss.{name}"] = _str(getattr(c, name))
        else:
            for name in ("kl_cov_ratio", "ppo_kl_coef"):
                o[f"{actor}.policy_loss.{name}"] = _str(getattr(c, name))
    if c.loss_type != "gmpo":  # geo_mean ignores loss_agg_mode (sapo's loss too, but not its KL and entropy terms)
        o[f"{actor}.loss_agg_mode"] = VERL_LOSS_AGG[c.loss_type]
        _entropy_coef(c, f"{actor}.entropy_coeff", o, notes, f"loss_agg_mode={VERL_LOSS_AGG[c.loss_type]}")
        if note := _micro_batch_note(c, f"verl's {VERL_LOSS_AGG[c.loss_type]}"):
            notes[f"{actor}.loss_agg_mode"] = note
    if c.loss_type == "dr_grpo":
        o[f"{actor}.loss_scale_factor"] = _str(c.max_completion_length)
    o[f"{actor}.ppo_epochs"] = _str(c.num_iterations)
    # slot 5, the KL
    o[f"{actor}.use_kl_loss"] = _str(kl_in_loss)
    o["algorithm.use_kl_in_reward"] = _str(kl_in_reward)
    if kl_in_loss:
        o[f"{actor}.kl_loss_coef"], o[f"{actor}.kl_loss_type"] = _str(c.beta), "k3"
        notes[f"{actor}.kl_loss_type"] = "verl caps each token's k3 at 10; the book's k3 has no cap"
    if kl_in_reward:
        o["algorithm.kl_penalty"], o["algorithm.kl_ctrl.kl_coef"] = "kl", _str(c.beta)
    if c.adaptive_kl_target is not None:
        if kl_in_reward:
            o["algorithm.kl_ctrl.type"] = "adaptive"
            o["algorithm.kl_ctrl.target_kl"] = _g(c.adaptive_kl_target / c.max_completion_length)
            o["algorithm.kl_ctrl.horizon"] = _str(c.adaptive_kl_horizon)
            notes["algorithm.kl_ctrl.target_kl"] = (
                f"verl's controller compares the batch's mean per-token KL with target_kl, the book's a KL per "
                f"completion (summed over its tokens): the value is the book's {_g(c.adaptive_kl_target)} divided by "
                f"max_completion_length, right for full-length completions; divide by the mean length instead")
        else:
            missing["adaptive_kl_target"] = ("verl adapts only the KL coefficient in the reward "
                                             "(`algorithm.kl_ctrl`); `actor.kl_loss_coef` stays fixed")
    # extra machinery
    if c.dynamic_sampling:
        o["algorithm.filter_groups.enable"], o["algorithm.filter_groups.metric"] = "true", "acc"
        notes["algorithm.filter_groups.metric"] = (
            "verl drops the groups whose `acc` (the score `compute_score` returns, before the overlong penalty) is "
            "equal across the group, and samples replacements until the batch is full")
        missing["max_num_gen_batches"] = ("verl's replay buffer refills dropped groups until the batch is full, with "
                                          "no cap on generation rounds (it ignores "
                                          "`algorithm.filter_groups.max_num_gen_batches`)")
    if c.overlong_buffer_length is not None:
        kwargs = "+reward.reward_kwargs"
        o["reward.reward_manager.name"] = "dapo"
        o[f"{kwargs}.overlong_buffer_cfg.enable"] = "true"
        o[f"{kwargs}.overlong_buffer_cfg.len"] = _str(c.overlong_buffer_length)
        o[f"{kwargs}.overlong_buffer_cfg.penalty_factor"] = "1.0"
        o[f"{kwargs}.overlong_buffer_cfg.log"] = "false"
        o[f"{kwargs}.max_resp_len"] = _str(c.max_completion_length)
    if c.routing_replay:
        missing["routing_replay"] = ("verl replays routes with its Megatron or VeOmni engine only "
                                     "(`actor.megatron.router_replay.mode=R2`); this FSDP command has none")
    # the optimizer (AdamW: verl's betas are the book's 0.9, 0.999 and its schedule is constant without warm-up)
    o[f"{actor}.optim.weight_decay"] = _str(c.weight_decay)
    o[f"{actor}.optim.clip_grad"] = _str(c.max_grad_norm)
    if critic:
        o["critic.optim.weight_decay"] = _str(c.weight_decay)
        o["critic.optim.clip_grad"] = _str(c.max_grad_norm)
    if W:
        o["trainer.critic_warmup"] = _str(W + 1)
        notes["trainer.critic_warmup"] = (f"verl updates the actor from step critic_warmup on, counting from 1: "
                                          f"{W + 1} gives {W} critic-only steps, which count in "
                                          f"`trainer.total_training_steps` ({c.max_steps} + {W})")
    # the book's sizes
    o["data.max_response_length"] = _str(c.max_completion_length)
    o[f"{rollout}.temperature"] = _str(c.temperature)
    o["data.train_batch_size"] = _str(c.num_prompts)
    o[f"{actor}.ppo_mini_batch_size"] = _str(completions_per_optimizer_step(c) // G)
    o[f"{actor}.optim.lr"] = _str(c.learning_rate)
    if critic:
        o["critic.optim.lr"] = _str(c.learning_rate)
    o["trainer.total_training_steps"] = _str(c.max_steps + W)
    notes["trainer.total_training_steps"] = ("the run also ends after `trainer.total_epochs` passes over the data "
                                             "(30 by default), whichever comes first")
    command = _shell(_cluster_header("verl", critic), "verl.trainer.main_ppo", [f"{k}={v}" for k, v in o.items()])
    return EngineRun("verl", o, notes, missing, command)


# ---------------------------------------------------------------------------------------------------------------
# OpenRLHF
# ---------------------------------------------------------------------------------------------------------------

def openrlhf_estimator(c: RLConfig) -> str:
    """OpenRLHF's ``--algo.advantage.estimator`` for ``c``, or "not available" with the reason."""
    if c.advantage_estimator == "group_mean" or (c.advantage_estimator == "grpo" and c.scale_rewards == "none"):
        return "dr_grpo"  # r - the group's mean, nothing else
    if c.advantage_estimator == "grpo":
        return "group_norm" if c.scale_rewards == "group" else na("no group advantage divided by the batch's std")
    if c.advantage_estimator in ("rloo", "gae"):
        return c.advantage_estimator
    return na({"reinforce": "its 'reinforce' is REINFORCE++ (returns whitened over the batch), not a bare reward",
               "vapo": "no VAPO (decoupled and length-adaptive GAE with value pretraining and an NLL term)",
               "gfpo": "no GFPO filter (keep gfpo_k completions of each group)"}[c.advantage_estimator])


def _openrlhf_blocked(c: RLConfig) -> tuple[str, str] | None:
    estimator = openrlhf_estimator(c)
    if estimator.startswith("not available"):
        setting = ("scale_rewards='batch'" if c.advantage_estimator == "grpo"
                   else f"advantage_estimator={c.advantage_estimator!r}")
        return setting, estimator.removeprefix("not available: ")
    if c.loss_type == "gmpo":
        return "loss_type='gmpo'", ("no geometric-mean (GMPO) loss: `--actor.policy_loss_type` is ppo or gspo, and ppo "
                                    "would read GMPO's log-space ε as its ratio clip")
    if c.lambda_grpo:
        return "lambda_grpo", "no learnable length-based response weights (λ-GRPO)"
    if c.loss_type == "cispo":
        return "loss_type='cispo'", ("no CISPO loss (a capped importance weight with its gradient stopped, times "
                                     "log π): `--actor.policy_loss_type` is ppo or gspo, both clipped surrogates")
    if c.loss_type == "sapo":
        return "loss_type='sapo'", ("no SAPO loss (a sigmoid gate on the ratio in place of the clip): "
                                    "`--actor.policy_loss_type` is ppo or gspo, both clipped surrogates")
    if c.loss_type in NOT_IN_VERL_OR_OPENRLHF:
        return f"loss_type={c.loss_type!r}", f"OpenRLHF {OPENRLHF_VERSION} {NOT_IN_VERL_OR_OPENRLHF[c.loss_type]}"
    if c.loss_type == "luspo":
        return "loss_type='luspo'", ("no LUSPO aggregation (each completion's token losses summed, then averaged "
                                     "over completions): its ppo and gspo losses take token means")
    return None


def openrlhf_run(c: RLConfig) -> EngineRun:
    """OpenRLHF's command for ``c``: flags of ``python3 -m openrlhf.cli.train_ppo_ray``."""
    blocked = _openrlhf_blocked(c)
    if blocked:
        return EngineRun("OpenRLHF", blocked=blocked)
    G, W = c.num_generations, c.value_pretrain_steps
    critic = c.advantage_estimator == "gae"
    o: dict[str, str] = {}
    notes: dict[str, str] = {}
    missing = _common_missing(c)
    # what the cluster sets: weights, data, reward, placement (everything colocated), micro-batches
    o["--actor.model_name_or_path"] = "$MODEL"
    o["--data.prompt_dataset"], o["--data.input_key"], o["--data.label_key"] = "$DATA", "input", "label"
    o["--reward.remote_url"] = "$REWARD"
    roles = ["actor"] + (["ref"] if c.beta > 0 else []) + (["critic"] if critic else [])
    for role in roles:
        o[f"--{role}.num_nodes"], o[f"--{role}.num_gpus_per_node"] = "$NODES", "$GPUS"
    if critic:
        o["--critic.model_name_or_path"] = "$MODEL"
    o["--vllm.num_engines"] = "$((GPUS * NODES))"
    o["--vllm.gpu_memory_utilization"] = "0.5"
    o["--train.colocate_all"] = o["--vllm.enable_sleep"] = o["--ds.enable_sleep"] = ""
    o["--train.micro_batch_size"] = o["--rollout.micro_batch_size"] = "$MICRO"
    # slot 1, the advantage
    o["--algo.advantage.estimator"] = openrlhf_estimator(c)
    if o["--algo.advantage.estimator"] == "group_norm":
        notes["--algo.advantage.estimator"] = ("OpenRLHF divides by the group's std + 1e-9, the book by std + 1e-4 "
                                               "(TRL's); they differ only for nearly equal rewards")
    if critic:
        o["--algo.advantage.gamma"], o["--algo.advantage.lambd"] = _str(c.gamma), _str(c.lam)
        if c.cliprange_value is not None:
            o["--critic.value_clip"] = _str(c.cliprange_value)
        else:
            missing["cliprange_value"] = "the value clip is always on"
        missing["vf_coef"] = "the critic is a separate model with its own optimizer (no shared loss)"
        if not c.whiten_advantages:
            missing["whiten_advantages"] = ("GAE advantages are always centred over the batch "
                                            "(`--algo.advantage.no_std_norm` only skips the std)")
    o["--rollout.n_samples_per_prompt"] = _str(G)
    # slots 2-4
    sequence_level = c.importance_sampling_level != "token"
    o["--actor.policy_loss_type"] = "gspo" if sequence_level else "ppo"
    if c.importance_sampling_level == "sequence_token":
        notes["--actor.policy_loss_type"] = ("OpenRLHF's gspo is one ratio per completion; the book's GSPO-token "
                                             "ratio has the same value and gradient when every token's advantage "
                                             "is its completion's, as here")
    high = c.epsilon if c.epsilon_high is None else c.epsilon_high
    o["--actor.eps_clip_low_high"] = f"{_str(c.epsilon)} {_str(high)}"
    if sequence_level or c.loss_type == "grpo":
        o["--actor.loss_agg_mode"] = "seq-mean-token-mean"  # gspo always aggregates so
        if sequence_level and c.loss_type != "grpo":
            missing["loss_type"] = f"{c.loss_type}: OpenRLHF's gspo always takes each completion's token mean"
    elif c.loss_type in ("dapo", "bnpo"):
        o["--actor.loss_agg_mode"] = "token-mean"
    else:
        missing["loss_type"] = (f"{c.loss_type}: no constant normaliser (completions × max_completion_length); "
                                f"the command keeps OpenRLHF's token-mean over the optimizer step")
    if "--actor.loss_agg_mode" in o and (note := _micro_batch_note(c, f"OpenRLHF's {o['--actor.loss_agg_mode']}")):
        notes["--actor.loss_agg_mode"] = note
    _entropy_coef(c, "--actor.entropy_coef", o, notes, o.get("--actor.loss_agg_mode", "token-mean"))
    if c.covariance_method is not None:
        missing["covariance_method"] = "no Clip-Cov or KL-Cov policy loss"
    o["--train.max_epochs"] = _str(c.num_iterations)
    # slot 5, the KL (OpenRLHF's default coefficient is 0.01, so 0 is written when there is none)
    o["--algo.kl.init_coef"] = _str(c.beta) if c.beta > 0 else "0"
    if c.beta > 0:
        clamp = "OpenRLHF clamps each token's KL estimate to [-10, 10]; the book's has no clamp"
        if c.kl_placement == "loss":
            o["--algo.kl.use_loss"], o["--algo.kl.estimator"] = "", "k3"
            if o.get("--actor.loss_agg_mode") == "seq-mean-token-mean":
                clamp += ("; and it averages the KL over the step's tokens (token-mean) where the book averages it "
                          "per completion with the loss")
        else:
            o["--algo.kl.estimator"] = "k1"
        notes["--algo.kl.estimator"] = clamp
    if c.adaptive_kl_target is not None:
        o["--algo.kl.target"] = _g(c.adaptive_kl_target / c.max_completion_length)
        o["--algo.kl.horizon"] = _str(c.adaptive_kl_horizon)
        notes["--algo.kl.target"] = (
            f"OpenRLHF's controller compares the rollout's mean per-token KL with the target, the book's a KL per "
            f"completion (summed over its tokens): the value is the book's {_g(c.adaptive_kl_target)} divided by "
            f"max_completion_length, right for full-length completions; and a TODO in its `ppo_trainer.py` says the "
            f"adaptive controller is incompatible there")
    # extra machinery
    if c.dynamic_sampling:
        o["--algo.dynamic_filtering_enable"] = ""
        o["--algo.dynamic_filtering_range"] = "0 1"
        notes["--algo.dynamic_filtering_range"] = (
            "OpenRLHF drops a group whose mean score is not strictly between 0 and 1 (the all-equal groups when "
            "`reward_func` returns scores of 0 or 1) and samples replacements until the batch is full")
        missing["max_num_gen_batches"] = "no cap on generation rounds: it samples until the batch is full"
    if c.overlong_buffer_length is not None:
        o["--reward.overlong_buffer_len"] = _str(c.overlong_buffer_length)
        o["--reward.overlong_penalty_factor"] = "1"
    if c.mask_truncated_completions:
        missing["mask_truncated_completions"] = ("no loss mask for completions cut at the budget "
                                                 "(`--reward.stop_properly_penalty_coef` scales their reward instead)")
    if c.routing_replay:
        missing["routing_replay"] = "no routing replay"
    if W:
        o["--critic.freezing_steps"] = _str(W - 1)
        notes["--critic.freezing_steps"] = (f"OpenRLHF freezes the actor while the step, counted from 0, is at most "
                                            f"freezing_steps: {W - 1} gives {W} critic-only rollouts, which count "
                                            f"in `--data.max_samples`")
    # the optimizers: AdamW at a constant rate (OpenRLHF's defaults: betas 0.9 0.95, a cosine schedule with warm-up)
    for role in ["actor"] + (["critic"] if critic else []):
        o[f"--{role}.adam.betas"] = ADAM_BETAS
        o[f"--{role}.adam.weight_decay"] = _str(c.weight_decay)
        o[f"--{role}.lr_scheduler"] = "constant"
        o[f"--{role}.lr_warmup_ratio"] = "0"
        o[f"--{role}.max_norm"] = _str(c.max_grad_norm)
    # the book's sizes; the run length is a number of prompts (OpenRLHF has no max-steps flag)
    o["--rollout.max_new_tokens"] = _str(c.max_completion_length)
    o["--rollout.temperature"] = _str(c.temperature)
    o["--rollout.batch_size"] = _str(c.num_prompts)
    o["--train.batch_size"] = _str(completions_per_optimizer_step(c))
    o["--actor.adam.lr"] = _str(c.learning_rate)
    if critic:
        o["--critic.adam.lr"] = _str(c.learning_rate)
    o["--train.num_episodes"] = "1"
    o["--data.max_samples"] = _str((c.max_steps + W) * c.num_prompts)
    notes["--data.max_samples"] = (
        f"OpenRLHF runs one rollout per `--rollout.batch_size` prompts until the data run out: "
        f"{c.max_steps + W} rollouts of {c.num_prompts} prompts, when the dataset holds that many"
        + (" (dynamic filtering uses more prompts a step, so the run ends sooner)" if c.dynamic_sampling else ""))
    args = [k if v == "" else f"{k} {v}" for k, v in o.items()]
    command = _shell(_cluster_header("OpenRLHF", critic), "openrlhf.cli.train_ppo_ray", args)
    return EngineRun("OpenRLHF", o, notes, missing, command)


# ---------------------------------------------------------------------------------------------------------------
# the book's view
# ---------------------------------------------------------------------------------------------------------------

def engine_runs(config_or_preset_name: RLConfig | str) -> dict[str, EngineRun]:
    """``{engine: EngineRun}`` for a preset's name or an :class:`RLConfig`, one entry per engine of
    :data:`ENGINES` (TRL's ``output_dir`` is ``runs/<preset>`` for a preset)."""
    c = as_config(config_or_preset_name)
    out = f"runs/{config_or_preset_name}" if isinstance(config_or_preset_name, str) else "runs/rlbook"
    return {"TRL": trl_run(c, out), "verl": verl_run(c), "OpenRLHF": openrlhf_run(c)}


def engine_command(config_or_preset_name: RLConfig | str, engine: str) -> str | None:
    """The text to paste for ``engine`` (one of :data:`ENGINES`), or ``None`` when it cannot run the config."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {ENGINES}")
    return engine_runs(config_or_preset_name)[engine].command


def engine_options(config_or_preset_name: RLConfig | str) -> dict[str, dict[str, str]]:
    """``{engine: {option: value}}``: each engine's options (:attr:`EngineRun.options`), then the book's settings it
    lacks with the value ``"not available: <why>"``; an engine that cannot run the config has one entry, the
    setting that blocks it."""
    table = {}
    for engine, run in engine_runs(config_or_preset_name).items():
        if run.blocked:
            table[engine] = {run.blocked[0]: na(run.blocked[1])}
        else:
            table[engine] = {**run.options, **{k: na(v) for k, v in run.missing.items()}}
    return table


def engine_overview(names=None) -> list[dict[str, str]]:
    """One row per preset (all of :data:`rlbook.presets.PRESETS` by default): ``preset`` and, per engine,
    ``"command"`` (with the counts of its notes and of the settings it lacks) or ``"not available"``."""
    rows = []
    for name in names or PRESETS:
        row = {"preset": name}
        for engine, run in engine_runs(name).items():
            if run.blocked:
                row[engine] = "not available"
                continue
            extra = ([f"{len(run.notes)} note{'s' if len(run.notes) > 1 else ''}"] if run.notes else []) + (
                [f"{len(run.missing)} not available"] if run.missing else [])
            row[engine] = "command" + (f" ({', '.join(extra)})" if extra else "")
        rows.append(row)
    return rows


def engine_markdown(names=None) -> str:
    """The book's MyST: per preset (all of :data:`rlbook.presets.PRESETS` by default), a dropdown holding each
    engine's command in a code block (exactly :attr:`EngineRun.command`), its notes and what it lacks, or why the
    engine cannot run the preset."""
    blocks = []
    for name in names or PRESETS:
        lines = [f":::{{admonition}} `{name}` in TRL, verl and OpenRLHF", ":class: dropdown", ""]
        for engine, run in engine_runs(name).items():
            lines += [f"**{engine}** ({RELEASES[engine]})", ""]
            if run.blocked:
                lines += [f"Not available: `{run.blocked[0]}`: {run.blocked[1]}.", ""]
                continue
            lines += ["```" + ("python" if engine == "TRL" else "bash"), run.command, "```", ""]
            lines += [f"- `{option}`: {note}." for option, note in run.notes.items()]
            lines += [f"- not available: `{setting}`: {why}." for setting, why in run.missing.items()]
            lines.append("")
        blocks.append("\n".join(lines).rstrip("\n") + "\n:::")
    return "\n\n".join(blocks) + "\n"
