"""The book's algorithms under TRL: an :class:`~rlbook.presets.RLConfig` as TRL's ``GRPOConfig``.

What it is for. The book trains tiny policies with :class:`rlbook.trainer.Trainer`, one loop whose settings are an
``RLConfig``. To run the same algorithm on a real model, on many GPUs with accelerate or DeepSpeed (and vLLM for
sampling), hand the same settings to TRL's ``GRPOTrainer``::

    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.integrations.trl import grpo_config, prompt_dataset, reward_funcs, trainer_class
    from rlbook.presets import preset

    config = preset("dr_grpo", max_steps=200)
    task = RECIPES["arithmetic"].make_task()
    model, tokenizer = load_base_policy("arithmetic")  # or a hub model and its tokenizer (with a pad token)
    args = grpo_config(config, num_processes=8, output_dir="runs/dr_grpo", bf16=True)
    trainer = trainer_class(config)(model=model, processing_class=tokenizer, args=args,
                                    reward_funcs=reward_funcs(task, config),
                                    train_dataset=prompt_dataset(task, 10_000, seed=0))
    trainer.train()

The names already agree (``num_generations``, ``epsilon``, ``epsilon_high``, ``beta``, ``loss_type``,
``scale_rewards``, ``importance_sampling_level``, ``mask_truncated_completions``, ...): :func:`grpo_kwargs` is
mostly a copy. The differences it translates:

- **Batch sizes.** The book's batch sizes are *global*: ``per_device_train_batch_size * steps_per_generation``
  completions per step over all processes (under ``torchrun`` the same config is split across ranks). TRL's
  ``per_device_train_batch_size`` is per process, so :func:`grpo_kwargs` divides it by ``num_processes`` and raises
  a ``ValueError`` when it does not divide.
- **Steps.** The book's ``max_steps`` counts rollouts; TRL's counts optimizer steps, ``num_iterations *
  steps_per_generation / gradient_accumulation_steps`` of them per rollout.
- **Optimizer.** The book's AdamW runs at a constant learning rate: ``lr_scheduler_type="constant"`` (TRL's default
  decays it linearly to 0).
- **Advantages.** ``advantage_estimator="group_mean"`` (REINFORCE with the group's mean as the baseline) is TRL's
  ``scale_rewards="none"``.
- **GMPO.** ``loss_type="gmpo"`` is TRL's experimental ``GMPOTrainer`` (``trl.experimental.gmpo``): its
  ``GMPOConfig`` has the same fields, with ``epsilon`` and ``epsilon_high`` in log space as ours.
  :func:`grpo_config` returns a ``GMPOConfig`` and :func:`trainer_class` the trainer to use.
- **Rewards.** A task scores ``(example, completion, truncated)``; TRL calls ``reward_func(prompts=...,
  completions=..., completion_ids=..., **dataset_columns)``. :func:`prompt_dataset` carries each problem's
  ``prompt`` and ``answer`` (all a task's reward reads), and :func:`reward_funcs` rebuilds the examples and calls
  :meth:`rlbook.tasks.Task.rewards`. A completion is truncated when its ids do not end with EOS (TRL keeps the EOS
  it stopped on in ``completion_ids`` and decodes without it, as the book's sampler does). DAPO's soft overlong
  punishment (``overlong_buffer_length``) is one more reward function, added to the task's reward as the book's
  trainer adds it.

What TRL's ``GRPOTrainer`` cannot express (TRL 1.16; :func:`unsupported` lists them for a config, and
:func:`grpo_config` refuses such a config unless ``strict=False``):

- ``"reinforce"``: no baseline, while TRL always subtracts the group's mean reward;
- ``"rloo"``: TRL's RLOO is another trainer (``RLOOTrainer``), with one ratio per completion (the product of token
  ratios) and a per-completion mean; :func:`rloo_kwargs` gives its ``RLOOConfig``;
- ``"ppo"`` and ``"vapo"``: a value model and GAE; TRL 1.16 ships no PPO trainer;
- ``"dapo"``: dynamic sampling (drop groups whose rewards are all equal and sample more); TRL has no such option
  (``preset("dapo", dynamic_sampling=False)`` maps, overlong filtering and punishment included);
- ``"gfpo"``: GFPO's filter (keep the ``gfpo_k`` shortest of each group) is not in TRL;
- ``"lambda_grpo"``: λ-GRPO's learnable response weights are not in TRL.

The others map: ``"grpo"``, ``"trl_grpo"``, ``"dr_grpo"``, ``"reinforce_baseline"``, ``"gspo"``, ``"gmpo"``,
``"cispo"`` and ``"sapo"``. So do TRL 1.16's variants under their TRL names: ``loss_type="cispo"`` (its cap is
``epsilon_high``) and ``"sapo"`` (with ``sapo_temperature_pos``/``_neg``), ``delta``, ``off_policy_mask_threshold``
and the ``vllm_importance_sampling_*`` correction (which TRL applies only when vLLM samples, ``use_vllm=True``; the
book's sampler plays vLLM's part), and the entropy methods ``top_entropy_quantile``, ``entropy_coef`` and
``use_adaptive_entropy`` (with ``entropy_coef_min``/``_max``/``_delta`` and ``entropy_target``).

Nor these settings, in any config: ``kl_placement="reward"`` with ``beta > 0`` (TRL puts the k3 KL in the loss),
``adaptive_kl_target``, ``early_stop_kl``, ``importance_sampling_level="sequence_token"``, ``routing_replay``,
``router_learning_rate``, ``sampler_temperature``, ``old_logprobs="sampler"``, ``nll_coef``,
``nonfinite_rewards="skip_group"``, ``covariance_method`` (verl's Clip-Cov and KL-Cov).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from rlbook.presets import RLConfig, preset
from rlbook.tasks.base import Example, Task
from rlbook.tasks.shaping import soft_overlong_penalty
from rlbook.vocab import EOS_TOKEN, SPECIAL_TOKENS

TRL_VERSION = "1.16.0"  # the release whose GRPOConfig, GRPOTrainer and GMPOTrainer these names were checked against
BOOK_EOS_TOKEN_ID = SPECIAL_TOKENS.index(EOS_TOKEN)  # the character tokenizer's EOS id (rlbook.lm.build_tokenizer)


def as_config(config_or_preset_name: RLConfig | str) -> RLConfig:
    """An :class:`RLConfig` as it is, or the preset of that name."""
    return preset(config_or_preset_name) if isinstance(config_or_preset_name, str) else config_or_preset_name


def unsupported(config: RLConfig | str) -> list[str]:
    """Why TRL's ``GRPOTrainer`` (or ``GMPOTrainer`` for ``loss_type="gmpo"``) cannot run ``config`` faithfully:
    one sentence per setting it lacks; empty when it can."""
    c = as_config(config)
    reasons = []
    estimator_reasons = {
        "reinforce": "advantage_estimator='reinforce' has no baseline, while GRPOTrainer always subtracts the "
                     "group's mean reward",
        "rloo": "advantage_estimator='rloo' is TRL's RLOOTrainer (RLOOConfig), another trainer with one ratio per "
                "completion: not GRPOTrainer",
        "gae": "advantage_estimator='gae' needs a value model (PPO); TRL 1.16 has no PPO trainer",
        "vapo": "advantage_estimator='vapo' needs a value model (VAPO's decoupled, length-adaptive GAE); TRL 1.16 "
                "has no PPO trainer",
        "gfpo": "advantage_estimator='gfpo': TRL has no GFPO filter (keep gfpo_k completions of each group)",
    }
    if c.advantage_estimator in estimator_reasons:
        reasons.append(estimator_reasons[c.advantage_estimator])
    if c.importance_sampling_level not in ("token", "sequence"):
        reasons.append(f"importance_sampling_level={c.importance_sampling_level!r}: TRL has 'token' and "
                       f"'sequence' only")
    if c.loss_type == "gmpo" and c.importance_sampling_level != "token":
        reasons.append("loss_type='gmpo' with a sequence-level ratio: TRL's GMPOTrainer clips token ratios only")
    if c.beta > 0 and c.kl_placement == "reward":
        reasons.append("kl_placement='reward' (a k1 KL penalty in the reward): GRPOTrainer puts the k3 KL in the "
                       "loss")
    if c.adaptive_kl_target is not None:
        reasons.append("adaptive_kl_target: TRL's GRPOTrainer keeps beta fixed (no adaptive KL controller)")
    if c.early_stop_kl is not None:
        reasons.append("early_stop_kl: TRL does not stop a rollout's updates early on approx_kl")
    if c.dynamic_sampling:
        reasons.append("dynamic_sampling: TRL has no option to drop groups whose rewards are all equal and sample "
                       "more")
    if c.lambda_grpo:
        reasons.append("lambda_grpo: TRL has no learnable length-based response weights (λ-GRPO)")
    if c.routing_replay:
        reasons.append("routing_replay: TRL's GRPOTrainer does not replay the old policy's expert routes")
    if c.router_learning_rate is not None:
        reasons.append("router_learning_rate: TRL trains every parameter at one learning rate")
    if c.sampler_temperature is not None and c.sampler_temperature != c.temperature:
        reasons.append("sampler_temperature: TRL samples and scores at one temperature")
    if c.old_logprobs == "sampler":
        reasons.append("old_logprobs='sampler': TRL's GRPOTrainer recomputes pi_old with the training forward")
    if c.nonfinite_rewards == "skip_group":
        reasons.append("nonfinite_rewards='skip_group': TRL does not drop the groups that hold a non-finite reward")
    if c.nll_coef > 0 and c.advantage_estimator != "vapo":
        reasons.append("nll_coef: TRL's GRPOTrainer has no NLL term on correct completions")
    if c.covariance_method is not None:
        reasons.append(f"covariance_method={c.covariance_method!r}: TRL has no Clip-Cov or KL-Cov (verl's "
                       f"policy-loss modes)")
    return reasons


def per_device_batch_size(global_batch_size: int, num_processes: int) -> int:
    """TRL's ``per_device_train_batch_size`` for the book's global one: ``global_batch_size / num_processes``, or a
    ``ValueError`` when it does not divide."""
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    if global_batch_size % num_processes:
        raise ValueError(f"per_device_train_batch_size is global in rlbook ({global_batch_size} completions per "
                         f"micro-batch over all processes) and does not split over num_processes={num_processes}; "
                         f"choose a multiple of {num_processes}")
    return global_batch_size // num_processes


def trl_max_steps(config: RLConfig) -> int:
    """TRL's ``max_steps`` (optimizer steps) for the book's (rollouts): ``max_steps * num_iterations *
    steps_per_generation / gradient_accumulation_steps``."""
    per_rollout = config.num_iterations * config.steps_per_generation // config.gradient_accumulation_steps
    return config.max_steps * per_rollout


def grpo_kwargs(config: RLConfig | str, *, num_processes: int = 1, strict: bool = True) -> dict:
    """The keyword arguments of TRL's ``GRPOConfig`` (``GMPOConfig`` for ``loss_type="gmpo"``) for ``config``: a
    plain dict, no TRL import, so that a table (:mod:`rlbook.integrations.engines`) can show it.

    ``strict``: raise a ``ValueError`` listing :func:`unsupported` reasons; with ``False``, warn and map what
    TRL can express."""
    c = as_config(config)
    reasons = unsupported(c)
    if reasons and strict:
        raise ValueError("TRL's GRPOTrainer cannot run this config faithfully:\n- " + "\n- ".join(reasons)
                         + "\n(pass strict=False to map what it can)")
    if reasons:
        warnings.warn("mapped to TRL without: " + "; ".join(reasons), stacklevel=2)
    kwargs = dict(
        # sampling
        num_generations=c.num_generations,
        max_completion_length=c.max_completion_length,
        temperature=c.temperature,
        top_p=1.0,
        top_k=0,
        # batch layout (global in rlbook, per process in TRL)
        per_device_train_batch_size=per_device_batch_size(c.per_device_train_batch_size, num_processes),
        gradient_accumulation_steps=c.gradient_accumulation_steps,
        steps_per_generation=c.steps_per_generation,
        num_iterations=c.num_iterations,
        # AdamW at a constant rate
        learning_rate=c.learning_rate,
        weight_decay=c.weight_decay,
        max_grad_norm=c.max_grad_norm,
        lr_scheduler_type="constant",
        warmup_steps=0,
        # the five slots
        scale_rewards="none" if c.advantage_estimator == "group_mean" else c.scale_rewards,
        importance_sampling_level=c.importance_sampling_level,
        epsilon=c.epsilon,
        epsilon_high=c.epsilon if c.epsilon_high is None else c.epsilon_high,
        beta=c.beta,
        # DAPO's overlong filtering (its soft punishment is a reward function: reward_funcs(task, config))
        mask_truncated_completions=c.mask_truncated_completions,
        # the run
        max_steps=trl_max_steps(c),
        seed=c.seed,
    )
    if c.loss_type != "gmpo":  # GMPOTrainer has its own loss and ignores loss_type
        kwargs["loss_type"] = c.loss_type
    if c.beta > 0:  # TRL 1.16 multiplies its k3 term by the ratio by default (a KL gradient of its own); ours not
        kwargs["use_bias_correction_kl"] = False
    # TRL 1.16's variants, only where set (TRL's names; a config without them maps as before)
    if c.delta is not None:
        kwargs["delta"] = c.delta
    if c.loss_type == "sapo":
        kwargs["sapo_temperature_pos"] = c.sapo_temperature_pos
        kwargs["sapo_temperature_neg"] = c.sapo_temperature_neg
    if c.loss_type == "vespo":
        kwargs.update({name: getattr(c, name) for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
                                                          "vespo_lambda_neg")})
    if c.vllm_importance_sampling_correction:  # TRL applies it only when vLLM samples (use_vllm=True)
        kwargs.update(vllm_importance_sampling_correction=True,
                      vllm_importance_sampling_mode=c.vllm_importance_sampling_mode,
                      vllm_importance_sampling_clip_min=c.vllm_importance_sampling_clip_min,
                      vllm_importance_sampling_clip_max=c.vllm_importance_sampling_clip_max)
    if c.off_policy_mask_threshold is not None:
        kwargs["off_policy_mask_threshold"] = c.off_policy_mask_threshold
    # the entropy methods TRL has, under TRL's names, only where set
    if c.top_entropy_quantile < 1.0:
        kwargs["top_entropy_quantile"] = c.top_entropy_quantile
    if c.entropy_coef != 0.0 or c.use_adaptive_entropy:
        kwargs["entropy_coef"] = c.entropy_coef
    if c.use_adaptive_entropy:
        kwargs.update(use_adaptive_entropy=True, entropy_coef_min=c.entropy_coef_min,
                      entropy_coef_max=c.entropy_coef_max, entropy_coef_delta=c.entropy_coef_delta,
                      entropy_target=c.entropy_target)
    return kwargs


def rloo_kwargs(config: RLConfig | str, *, num_processes: int = 1) -> dict:
    """The keyword arguments of TRL's ``RLOOConfig`` for an RLOO config (``advantage_estimator="rloo"``): the
    sizes, optimizer, clip and KL of :func:`grpo_kwargs`, without GRPO's advantage and aggregation settings, and
    ``normalize_advantages=False``. TRL's ``RLOOTrainer`` clips one ratio per completion (the product of its token
    ratios) and averages over completions: with one on-policy update per rollout (the ``"rloo"`` preset) its
    gradient is the book's ``dr_grpo`` one times ``max_completion_length``, the same direction. Its KL (``beta >
    0``) is a k1 penalty in the reward, summed over tokens."""
    c = as_config(config)
    if c.advantage_estimator != "rloo":
        raise ValueError(f"rloo_kwargs maps advantage_estimator='rloo', got {c.advantage_estimator!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = grpo_kwargs(c, num_processes=num_processes, strict=False)
    for name in ("scale_rewards", "importance_sampling_level", "loss_type", "use_bias_correction_kl"):
        kwargs.pop(name, None)
    return {**kwargs, "normalize_advantages": False}


def grpo_config(config_or_preset_name: RLConfig | str, *, num_processes: int = 1, output_dir: str = "rlbook-trl",
                strict: bool = True, **trl_overrides):
    """TRL's ``GRPOConfig`` for an :class:`RLConfig` or a preset's name (``GMPOConfig``, its subclass, for
    ``loss_type="gmpo"``): :func:`grpo_kwargs`, then ``trl_overrides`` (TRL's own settings: ``bf16``,
    ``report_to``, ``use_vllm``, ``logging_steps``...; a mapped name given here wins).

    ``num_processes``: the processes TRL will run on (accelerate's ``num_processes``); the book's global batch
    is split over them. ``strict=False`` maps what TRL can express and warns about the rest (:func:`unsupported`).

    TRL's configs default to ``bf16=True``, which needs a GPU: on a CPU pass ``bf16=False, use_cpu=True`` (TRL's
    refusal is then re-raised with that hint).
    """
    c = as_config(config_or_preset_name)
    kwargs = {**grpo_kwargs(c, num_processes=num_processes, strict=strict), "output_dir": output_dir,
              **trl_overrides}
    if c.loss_type == "gmpo":
        from trl.experimental.gmpo import GMPOConfig as TRLConfig
    else:
        from trl import GRPOConfig as TRLConfig
    try:
        return TRLConfig(**kwargs)
    except ValueError as error:
        if "bf16" not in str(error) or kwargs.get("bf16") is False:
            raise
        raise ValueError(f"{error} (TRL's {TRLConfig.__name__} defaults to bf16=True, which needs a GPU; on a CPU "
                         "pass grpo_config(..., bf16=False, use_cpu=True))") from error


def trainer_class(config: RLConfig | str) -> type:
    """The TRL trainer for ``config``: ``trl.experimental.gmpo.GMPOTrainer`` for ``loss_type="gmpo"``, else
    ``trl.GRPOTrainer``."""
    if as_config(config).loss_type == "gmpo":
        from trl.experimental.gmpo import GMPOTrainer

        return GMPOTrainer
    from trl import GRPOTrainer

    return GRPOTrainer


def prompt_dataset(task: Task, n: int, seed: int = 0, split: str = "train"):
    """``n`` problems of ``task`` (``task.sample(n, seed, split)``) as a ``datasets.Dataset`` with a ``"prompt"``
    column (plain strings: the book's tokenizer has no chat template) and an ``"answer"`` column, which TRL passes
    to the reward functions of :func:`reward_funcs`."""
    from datasets import Dataset

    examples = task.sample(n, seed=np.random.default_rng(seed), split=split)
    return Dataset.from_dict({"prompt": [e.prompt for e in examples], "answer": [e.answer for e in examples]})


def truncated_flags(completion_ids: Sequence[Sequence[int]], eos_token_id: int | Sequence[int]) -> list[bool]:
    """(B,) whether each completion was cut at the budget: its ids do not end with an EOS id (TRL keeps the EOS it
    stopped on in ``completion_ids``)."""
    eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    return [len(ids) == 0 or int(ids[-1]) not in eos for ids in completion_ids]


class TaskReward:
    """A TRL reward function for a task: ``task.rewards`` of the examples rebuilt from the ``prompt`` and
    ``answer`` columns, with truncation read from ``completion_ids``. A class, not a closure, so that it pickles
    (TRL's asynchronous rollouts send reward functions to other processes)."""

    def __init__(self, task: Task, eos_token_id: int | Sequence[int] = BOOK_EOS_TOKEN_ID):
        self.task = task
        self.eos_token_id = eos_token_id
        self.__name__ = f"{task.name}_reward"  # TRL logs rewards/<__name__>

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
        examples = [Example(prompt=p, answer=a) for p, a in zip(prompts, answer, strict=True)]
        truncated = truncated_flags(completion_ids, self.eos_token_id)
        return self.task.rewards(examples, completions, truncated).tolist()


class OverlongPenalty:
    """DAPO's soft overlong punishment as a TRL reward function (:func:`rlbook.tasks.soft_overlong_penalty` of the
    completion's token count, EOS included, as the book's trainer counts it; the same numbers as TRL's
    ``trl.rewards.get_soft_overlong_punishment``)."""

    __name__ = "soft_overlong_punishment"

    def __init__(self, max_completion_length: int, overlong_buffer_length: int):
        self.max_completion_length = max_completion_length
        self.overlong_buffer_length = overlong_buffer_length

    def __call__(self, completion_ids, **kwargs) -> list[float]:
        lengths = [len(ids) for ids in completion_ids]
        return soft_overlong_penalty(lengths, self.max_completion_length, self.overlong_buffer_length).tolist()


def reward_funcs(task: Task, config: RLConfig | str | None = None, *,
                 eos_token_id: int | Sequence[int] = BOOK_EOS_TOKEN_ID) -> list:
    """TRL reward functions for ``task``: its reward (:class:`TaskReward`), and, when ``config`` has an
    ``overlong_buffer_length``, DAPO's soft overlong punishment (:class:`OverlongPenalty`), which TRL adds to it
    (its default ``reward_weights``: one each), as the book's trainer does.

    ``eos_token_id``: the tokenizer's EOS id(s), by which truncation is read (default: the book's tokenizer's)."""
    funcs = [TaskReward(task, eos_token_id)]
    c = None if config is None else as_config(config)
    if c is not None and c.overlong_buffer_length is not None:
        funcs.append(OverlongPenalty(c.max_completion_length, c.overlong_buffer_length))
    return funcs

