"""The policy loss, slots 2-5 of the family's objective, as a registry: what :mod:`rlbook.advantages` is to slot 1.

A loss is two choices and some optional weights, read off the config:

- the **surrogate** (slots 2-3: the ratio at ``importance_sampling_level`` and what is done with it), one
  registered function ``(batch, log_ratio, config) -> TokenLosses``: PPO-Clip's ``"clip"``, ``"cispo"``,
  ``"sapo"``, ``"gmpo"``, ``"vespo"``, and verl's ``"kl_cov"``;
- the **aggregation** (slot 4) of the token losses into one number, which declares what it divides by (the
  completions, the micro-batch's tokens, or the whole step's tokens), so that the distributed code needs no list
  of loss types;
- the **token weights** (the off-policy mask, the high-entropy mask, Clip-Cov's cut, the sampler correction),
  small functions applied in TRL's order, then the **KL** in the loss (slot 5) and λ-GRPO's response weights.

:data:`LOSS_TYPES` maps each TRL ``loss_type`` to its (surrogate, aggregation): it is the only place that knows
the taxonomy. :func:`policy_loss` composes the pieces for one micro-batch; the pure formulas stay in
:mod:`rlbook.objectives`, where the chapters derive them.

To add a surrogate, decorate ``(batch, log_ratio, config) -> TokenLosses`` with ``@surrogate("name", ...)``,
declaring what the config must then refuse (``per_completion``, ``token_levels``, ``check``), and add its row to
:data:`LOSS_TYPES`; :class:`rlbook.presets.RLConfig` accepts the new ``loss_type`` and derives its rules at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from rlbook.metrics import sampling_metrics
from rlbook.nonfinite import require_finite
from rlbook.objectives import (
    IMPORTANCE_SAMPLING_LEVELS,
    cispo_surrogate,
    clip_cov_mask,
    clipped_surrogate,
    completion_token_mean,
    constant_normaliser,
    global_token_mean,
    gmpo_surrogate,
    kl_cov_mask,
    kl_estimate,
    log_ratio,
    masked_mean,
    masked_sum,
    off_policy_sequence_mask,
    sampler_importance_weights,
    sapo_surrogate,
    token_covariance,
    token_mean,
    vespo_weights,
)

# ``RLConfig`` in the annotations is :class:`rlbook.presets.RLConfig`, named but not imported: the presets import
# this module to derive their rules (as they import rlbook.advantages).


@dataclass
class LossBatch:
    """One micro-batch, everything a loss may read; (B, T) unless said. Shapes and finiteness are checked once,
    here, so that the pieces can start with their formula; (B,) ``advantages`` are broadcast over tokens.

    - ``logp``: π_θ's log-probs of the completion tokens (differentiable); ``old_logp``: π_old's, which sampled
      them; ``mask``: 1 on the tokens that carry a loss;
    - ``ref_logp``: the reference policy's (for the KL in the loss); ``sampler_logp``: the behaviour policy's,
      for the off-policy mask (default ``old_logp``);
    - ``importance_sampling_ratio``: the sampler correction's weights (:func:`rlbook.objectives.
      sampler_importance_weights`); ``entropy_mask`` bool: the high-entropy tokens that keep their loss;
    - ``response_weights`` (B,): λ-GRPO's f_i (gradients flow into them);
    - ``num_items_in_batch``: the optimizer step's loss tokens (the ``"global_token_mean"`` denominator; default
      this micro-batch's); ``generator``: Clip-Cov's random draw.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    importance_sampling_ratio: torch.Tensor | None = None
    entropy_mask: torch.Tensor | None = None
    response_weights: torch.Tensor | None = None
    num_items_in_batch: int | float | torch.Tensor | None = None
    generator: torch.Generator | None = None

    def __post_init__(self):
        _check_shapes(self)
        self.mask = self.mask.bool()
        if self.advantages.shape == self.logp.shape[:1]:
            self.advantages = self.advantages[:, None].expand_as(self.logp)
        _check_values(self)

    @property
    def token_weights_given(self) -> list[str]:
        """The token weights this batch carries, by name (what a per-completion surrogate refuses)."""
        return [name for name in ("importance_sampling_ratio", "entropy_mask", "response_weights")
                if getattr(self, name) is not None]


@dataclass
class TokenLosses:
    """A surrogate's output: ``loss`` (B, T), or (B,) for a per-completion surrogate; where the gradient is
    removed, ``low`` and ``high`` (B, T) bool (TRL's ``clip_ratio/low`` and ``/high``); its own ``metrics``."""

    loss: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Surrogate:
    """A registered surrogate and what it declares: ``per_completion`` (one loss per row: no token weights),
    the ``token_levels`` it accepts, ``clipped`` (PPO-Clip's clip, which ``delta`` and the covariance methods
    act on), ``weighs_sampler`` (it takes the sampler correction into its own weight), ``log_space_clip`` (ε is
    a log-space bound, so it may exceed 1), and ``check(config)``, an error text or None."""

    fn: Callable
    per_completion: bool = False
    token_levels: tuple[str, ...] = IMPORTANCE_SAMPLING_LEVELS
    clipped: bool = False
    weighs_sampler: bool = False
    log_space_clip: bool = False
    check: Callable | None = None


SURROGATES: dict[str, Surrogate] = {}


def surrogate(name: str, **declared):
    """Register ``fn(batch, log_ratio, config) -> TokenLosses`` as the surrogate ``name``."""
    def register(fn):
        SURROGATES[name] = Surrogate(fn, **declared)
        return fn
    return register


def _no_clip(batch: LossBatch) -> torch.Tensor:
    return torch.zeros_like(batch.mask)


@surrogate("clip", clipped=True)
def ppo_clip(b: LossBatch, log_rho: torch.Tensor, c: RLConfig) -> TokenLosses:
    """PPO-Clip (eq-ppo-clip), with clip-higher and TRL's two-sided ``delta``: the surrogate of
    PPO, GRPO, DAPO, Dr. GRPO, GSPO and LUSPO."""
    ratio = torch.exp(log_rho)
    loss, low, high = clipped_surrogate(ratio, b.advantages, c.epsilon, _epsilon_high(c), c.delta)
    metrics = {}
    if c.delta is not None:  # the tokens δ stops: A < 0 and ρ > δ
        metrics["clip_ratio/delta_mean"] = _share((ratio > c.delta) & (b.advantages < 0), b.mask)
    return TokenLosses(loss, low, high, metrics)


def _cispo_cap(c: RLConfig) -> str | None:
    if not _epsilon_high(c) > 1:
        return (f"loss_type={c.loss_type!r} caps the importance weight at epsilon_high itself (TRL's reading, "
                f"ScaleRL's epsilon_max), not at 1 + epsilon_high; set epsilon_high > 1 (ScaleRL: 5.0), got "
                f"{_epsilon_high(c)}")
    return None


@surrogate("cispo", check=_cispo_cap)
def cispo(b: LossBatch, log_rho: torch.Tensor, c: RLConfig) -> TokenLosses:
    """CISPO (eq-after-cispo): the weight capped at ``epsilon_high`` and its gradient stopped."""
    ratio = torch.exp(log_rho)
    logp = torch.where(b.mask, b.logp, torch.zeros((), dtype=b.logp.dtype, device=b.logp.device))
    loss, _, capped = cispo_surrogate(ratio, b.advantages, logp, max_weight=_epsilon_high(c))
    metrics = {"cispo_clip_ratio": _share(capped & (b.advantages > 0), b.mask)}
    return TokenLosses(loss, _no_clip(b), _no_clip(b), metrics)


@surrogate("sapo")
def sapo(b: LossBatch, log_rho: torch.Tensor, c: RLConfig) -> TokenLosses:
    """SAPO (eq-after-sapo): a sigmoid gate on the ratio in place of the clip."""
    loss = sapo_surrogate(torch.exp(log_rho), b.advantages, c.sapo_temperature_pos,
                          c.sapo_temperature_neg)
    return TokenLosses(loss, _no_clip(b), _no_clip(b))


@surrogate("gmpo", per_completion=True, log_space_clip=True)
def gmpo(b: LossBatch, log_rho: torch.Tensor, c: RLConfig) -> TokenLosses:
    """GMPO (eq-gmpo-objective): the geometric mean of the token ratios, clipped in log space; one
    loss a row."""
    return TokenLosses(*gmpo_surrogate(log_rho, b.advantages, b.mask, c.epsilon, _epsilon_high(c)))


def _vespo_token_correction(c: RLConfig) -> str | None:
    if c.vllm_importance_sampling_correction and not c.vllm_importance_sampling_mode.startswith("token"):
        return (f"loss_type='vespo' folds the sampler correction's token weights into its own sequence weight: "
                f"it needs vllm_importance_sampling_mode 'token_truncate' or 'token_mask' (as TRL), got "
                f"{c.vllm_importance_sampling_mode!r}")
    return None


@surrogate("vespo", token_levels=("token",), weighs_sampler=True,
           check=_vespo_token_correction)
def vespo(b: LossBatch, log_rho: torch.Tensor, c: RLConfig) -> TokenLosses:
    """VESPO (TRL 1.16's ``loss_type="vespo"``): a detached Gamma weight φ of the sequence's
    likelihood ratio times A log π, in place of the clip
    (:func:`rlbook.objectives.vespo_weights`)."""
    phi = vespo_weights(log_rho, b.advantages, b.mask, b.importance_sampling_ratio, c.vespo_k_pos,
                        c.vespo_lambda_pos, c.vespo_k_neg, c.vespo_lambda_neg)
    metrics = {"vespo/phi_seq_mean": phi[:, 0].mean().item()}
    return TokenLosses(-phi * b.advantages * b.logp, _no_clip(b), _no_clip(b), metrics)


@surrogate("kl_cov", token_levels=("token",))
def kl_cov(b: LossBatch, log_rho: torch.Tensor, c: RLConfig) -> TokenLosses:
    """KL-Cov (eq-after-kl-cov), as verl registers it: no clip, and ``ppo_kl_coef``·|log ρ| on the
    tokens of the largest covariance of log-prob and advantage."""
    selected = kl_cov_mask(token_covariance(b.logp, b.advantages, b.mask), b.mask, c.kl_cov_ratio)
    loss = -torch.exp(log_rho) * b.advantages + c.ppo_kl_coef * log_rho.abs() * selected
    metrics = {"covariance/selected_mean": _share(selected, b.mask)}
    return TokenLosses(loss, _no_clip(b), _no_clip(b), metrics)


@dataclass(frozen=True)
class Aggregation:
    """Slot 4: ``fn(loss, batch, config)`` reduces the token losses of one micro-batch, and ``divides_by`` says
    by what: ``"completions"`` or ``"tokens"`` of the micro-batch (then the sum over micro-batches is divided by
    ``gradient_accumulation_steps``), or ``"step_tokens"``, the whole optimizer step's (no further division)."""

    fn: Callable
    divides_by: str


AGGREGATIONS: dict[str, Aggregation] = {
    # GRPO: each completion's token mean, averaged over completions (eq-grpo-objective)
    "completion_token_mean": Aggregation(
        lambda loss, b, c: completion_token_mean(loss, b.mask), "completions"),
    # PPO (TRL's bnpo): the micro-batch's token mean
    "token_mean": Aggregation(lambda loss, b, c: token_mean(loss, b.mask), "tokens"),
    # Dr. GRPO: Σ / (B · max_completion_length), a constant (eq-drgrpo-weights)
    "constant_normaliser": Aggregation(
        lambda loss, b, c: constant_normaliser(loss, b.mask, c.max_completion_length),
        "completions"),
    # DAPO: Σ / the step's loss tokens (eq-dapo-objective)
    "global_token_mean": Aggregation(
        lambda loss, b, c: global_token_mean(loss, b.mask, b.num_items_in_batch), "step_tokens"),
    # LUSPO: each completion's token *sum*, averaged over completions (scales with its length)
    "completion_token_sum_mean": Aggregation(
        lambda loss, b, c: masked_sum(loss, b.mask, dim=-1).mean(), "completions"),
    # GMPO: one loss a row, averaged
    "completion_mean": Aggregation(lambda loss, b, c: loss.mean(), "completions"),
}

# TRL's loss_type -> (surrogate, aggregation): the only place that knows which is which.
LOSS_TYPES: dict[str, tuple[str, str]] = {
    "grpo": ("clip", "completion_token_mean"),
    "bnpo": ("clip", "token_mean"),
    "dr_grpo": ("clip", "constant_normaliser"),
    "dapo": ("clip", "global_token_mean"),
    "luspo": ("clip", "completion_token_sum_mean"),
    "gmpo": ("gmpo", "completion_mean"),
    "cispo": ("cispo", "global_token_mean"),
    "sapo": ("sapo", "completion_token_mean"),
    "vespo": ("vespo", "global_token_mean"),
}
CLIPPED_LOSS_TYPES = tuple(name for name, (s, _) in LOSS_TYPES.items() if SURROGATES[s].clipped)


def surrogate_of(c: RLConfig) -> str:
    """The surrogate ``c`` trains with: its loss type's, or verl's ``"kl_cov"``, which replaces PPO-Clip's."""
    return "kl_cov" if c.covariance_method == "kl_cov" else LOSS_TYPES[c.loss_type][0]


def aggregation_of(c: RLConfig) -> Aggregation:
    """The aggregation of ``c``'s loss type (what :mod:`rlbook.distributed` reads the denominator from)."""
    return AGGREGATIONS[LOSS_TYPES[c.loss_type][1]]


# --- the token weights, in TRL's order: each (batch, config, term) -> (weight (B, T), metrics) or None ---------


def clip_cov_weight(b: LossBatch, c: RLConfig, term: TokenLosses):
    """Clip-Cov (eq-after-clip-cov): 0 on a random few high-covariance tokens that PPO's clip does
    not hold."""
    if c.covariance_method != "clip_cov":
        return None
    covariance = token_covariance(b.logp, b.advantages, b.mask)
    selected = clip_cov_mask(covariance, b.mask, c.clip_cov_ratio, c.clip_cov_lb, c.clip_cov_ub,
                             already_clipped=(term.low | term.high) & b.mask, generator=b.generator)
    return ~selected, {"covariance/selected_mean": _share(selected, b.mask)}


def off_policy_weight(b: LossBatch, c: RLConfig, term: TokenLosses):
    """DeepSeek-V3.2's off-policy sequence mask (eq-after-opsm) against the behaviour policy's
    log-probs."""
    if c.off_policy_mask_threshold is None:
        return None
    behaviour = b.old_logp if b.sampler_logp is None else b.sampler_logp
    keep = off_policy_sequence_mask(b.logp, behaviour, b.advantages, b.mask,
                                    c.off_policy_mask_threshold)
    return keep, {"off_policy_mask/masked_mean": _share(~keep, b.mask)}


def entropy_weight(b: LossBatch, c: RLConfig, term: TokenLosses):
    """The high-entropy minority (eq-after-entropy-filter): only its tokens keep their loss."""
    if b.entropy_mask is None:
        return None
    return b.entropy_mask, {"entropy_mask/kept_mean": _share(b.entropy_mask, b.mask)}


def sampler_correction(old_logp, sampler_logp, mask, c: RLConfig) -> tuple:
    """The sampler-mismatch correction's weights, computed once per rollout: pi_old / pi_sampler per
    token or completion, truncated or masked (TRL's ``vllm_importance_sampling_*``), and their
    ``sampling/*`` metrics; ``(None, {})`` when off. :func:`sampler_weight` applies them."""
    if not c.vllm_importance_sampling_correction:
        return None, {}
    mode = c.vllm_importance_sampling_mode
    ratio = sampler_importance_weights(old_logp, sampler_logp, mask, mode,
                                       c.vllm_importance_sampling_clip_min,
                                       c.vllm_importance_sampling_clip_max)
    return ratio, sampling_metrics(old_logp, sampler_logp, ratio, mask, mode)


def sampler_weight(b: LossBatch, c: RLConfig, term: TokenLosses):
    """The sampler-mismatch correction (eq-after-sampler-is), unless the surrogate weighs it itself
    (VESPO)."""
    if b.importance_sampling_ratio is None or SURROGATES[surrogate_of(c)].weighs_sampler:
        return None
    return b.importance_sampling_ratio.detach(), {}


TOKEN_WEIGHTS = (clip_cov_weight, off_policy_weight, entropy_weight, sampler_weight)


def policy_loss(b: LossBatch, c: RLConfig,
                kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The family's objective for one micro-batch (eq-family-surrogate), slot by slot, in TRL's
    order: the ratio, the surrogate, × each token weight, + ``kl_coef``·k3 to the reference, ×
    the response weights, aggregated. Returns ``(loss, metrics)``; the loss is divided by
    ``gradient_accumulation_steps`` unless its aggregation divides by the whole step's tokens."""
    chosen = SURROGATES[surrogate_of(c)]
    _require(not (chosen.per_completion and b.token_weights_given),
             per_completion_refuses(c.loss_type, b.token_weights_given))
    log_rho = log_ratio(b.logp, b.old_logp, b.mask, c.importance_sampling_level)   # slot 2
    term = chosen.fn(b, log_rho, c)                                                  # slot 3
    loss, metrics = term.loss, {}
    for token_weight in TOKEN_WEIGHTS:
        weighted = token_weight(b, c, term)
        if weighted is not None:
            loss = loss * weighted[0].to(loss.dtype)
            metrics.update(weighted[1])
    kl = None
    if kl_coef > 0:                                                                  # slot 5
        _require(b.ref_logp is not None, "beta > 0 needs ref_logp, the reference policy's "
                                         "log-probs of the same tokens")
        kl = kl_estimate(b.logp, torch.where(b.mask, b.ref_logp, b.logp))
        loss = loss + kl_coef * (masked_mean(kl, b.mask, dim=-1) if chosen.per_completion else kl)
    if b.response_weights is not None:                                               # λ-GRPO
        loss = loss * b.response_weights[:, None]
    aggregation = aggregation_of(c)                                                  # slot 4
    loss = aggregation.fn(loss, b, c)
    if aggregation.divides_by != "step_tokens":
        loss = loss / c.gradient_accumulation_steps
    return loss, {**loss_metrics(b, log_rho, term, kl), **term.metrics, **metrics}


def loss_metrics(b: LossBatch, log_rho: torch.Tensor, term: TokenLosses, kl: torch.Tensor | None) -> dict:
    """The metrics every loss logs, over the masked tokens (TRL's names): the clipped shares, ``approx_kl`` (k3
    of KL(π_old ‖ π_θ), as CleanRL logs it), the ratio's range and mean, and ``kl`` to the reference."""
    with torch.no_grad():
        ratio = torch.exp(log_rho)
        metrics = {
            "clip_ratio/low_mean": _share(term.low, b.mask),
            "clip_ratio/high_mean": _share(term.high, b.mask),
            "clip_ratio/region_mean": _share(term.low | term.high, b.mask),
            "approx_kl": masked_mean(kl_estimate(b.old_logp, torch.where(b.mask, b.logp, b.old_logp)),
                                     b.mask).item(),
            "ratio/min": ratio[b.mask].min().item(),
            "ratio/max": ratio[b.mask].max().item(),
            "ratio/mean": masked_mean(ratio, b.mask).item(),
        }
        if kl is not None:
            metrics["kl"] = masked_mean(kl, b.mask).item()
    return metrics


def policy_loss_of(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                   beta: float = 0.0, ref_logp=None, sampler_logp=None, importance_sampling_ratio=None,
                   entropy_mask=None, response_weights=None, num_items_in_batch=None, generator=None,
                   max_completion_length: int | None = None, loss_type: str = "bnpo",
                   **settings) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`policy_loss` called with tensors and settings by name, as the chapters and the cross-checks call
    it (``rlbook.objectives.policy_loss``): ``settings`` are :class:`rlbook.presets.RLConfig` fields (``epsilon``,
    ``epsilon_high``, ``delta``, ...; validated there), ``beta`` the KL's coefficient in the loss, and
    ``max_completion_length`` defaults to the padded length T."""
    from rlbook.presets import RLConfig

    config = RLConfig(loss_type=loss_type, beta=beta, **settings,
                      max_completion_length=logp.shape[-1] if max_completion_length is None
                      else max_completion_length)
    batch = LossBatch(logp, old_logp, advantages, mask, ref_logp, sampler_logp, importance_sampling_ratio,
                      entropy_mask, response_weights, num_items_in_batch, generator)
    return policy_loss(batch, config, kl_coef=beta)


# --- checks ------------------------------------------------------------------------------------------------------


def config_errors(c: RLConfig) -> list[str]:
    """The rules a config breaks that follow from what its surrogate declares (called by ``RLConfig``): each rule
    written once, here."""
    name = surrogate_of(c)
    chosen = SURROGATES[name]
    errors = []
    if c.importance_sampling_level not in chosen.token_levels and c.covariance_method is None:
        errors.append(f"the {name!r} surrogate (loss_type={c.loss_type!r}) computes token ratios: it needs "
                      f"importance_sampling_level in {chosen.token_levels}, got {c.importance_sampling_level!r}")
    if chosen.per_completion:
        weights = [setting for setting, on in (
            ("vllm_importance_sampling_correction", c.vllm_importance_sampling_correction),
            ("off_policy_mask_threshold", c.off_policy_mask_threshold is not None),
            ("top_entropy_quantile", c.top_entropy_quantile < 1.0),
            ("covariance_method", c.covariance_method is not None),
            ("lambda_grpo", c.lambda_grpo)) if on]
        if weights:
            errors.append(per_completion_refuses(c.loss_type, weights))
    for setting in ("delta", "covariance_method"):
        if getattr(c, setting) is not None and (c.loss_type not in CLIPPED_LOSS_TYPES or (
                setting == "covariance_method" and c.importance_sampling_level != "token")):
            errors.append(f"{setting}={getattr(c, setting)!r} acts on PPO-Clip's token loss: it needs loss_type in "
                          f"{CLIPPED_LOSS_TYPES}{' at importance_sampling_level token' * (setting != 'delta')}, "
                          f"got {c.loss_type!r} at {c.importance_sampling_level!r}")
    if chosen.check is not None and (error := chosen.check(c)):
        errors.append(error)
    return errors


def per_completion_refuses(loss_type: str, weights: list[str]) -> str:
    """The one message for token weights given to a per-completion surrogate (GMPO)."""
    return (f"{', '.join(weights)} weigh or choose token losses, but loss_type={loss_type!r} has one loss per "
            f"completion; use a token-level loss_type")


def _epsilon_high(c: RLConfig) -> float:
    return c.epsilon if c.epsilon_high is None else c.epsilon_high


def _share(flags: torch.Tensor, mask: torch.Tensor) -> float:
    return masked_mean(flags.float(), mask).item()


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_shapes(b: LossBatch) -> None:
    """The shapes of a :class:`LossBatch`, each named in its error."""
    shape = tuple(b.logp.shape)
    _require(b.logp.dim() == 2, f"logp, old_logp and mask must be (B, T), got shape {shape}")
    for name in ("old_logp", "mask", "ref_logp", "sampler_logp", "importance_sampling_ratio", "entropy_mask"):
        tensor = getattr(b, name)
        _require(tensor is None or tuple(tensor.shape) == shape,
                 f"shape mismatch: logp {shape}, {name} {None if tensor is None else tuple(tensor.shape)}")
    _require(tuple(b.advantages.shape) in (shape[:1], shape),
             f"advantages must be (B,) = ({shape[0]},) or (B, T) = {shape}, got {tuple(b.advantages.shape)}")
    w = b.response_weights
    _require(w is None or tuple(w.shape) == shape[:1],
             f"response_weights must be (B,) = ({shape[0]},), got {None if w is None else tuple(w.shape)}")


def _check_values(b: LossBatch) -> None:
    """Finite numbers on the mask, non-negative weights, and a token to learn from."""
    _require(bool(b.mask.any()), "the loss mask is all zero: there is no completion token to learn from")
    for name in ("logp", "old_logp", "advantages", "ref_logp", "sampler_logp", "importance_sampling_ratio"):
        if getattr(b, name) is not None:
            require_finite(name, getattr(b, name), mask=b.mask)
    _require(b.importance_sampling_ratio is None or not bool((b.importance_sampling_ratio < 0)[b.mask].any()),
             "importance_sampling_ratio must be >= 0 on the mask (a weight)")
    w = b.response_weights
    _require(w is None or (bool(torch.isfinite(w).all()) and not bool((w < 0).any())),
             f"response_weights must be finite and >= 0, got {None if w is None else w.tolist()[:8]}")
