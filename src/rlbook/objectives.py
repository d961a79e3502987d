"""Losses and advantages of every LM algorithm in the book: small pure tensor functions, one idea each.

Shapes: ``B`` completions (rows), ``T`` padded completion length (columns). A ``mask`` (B, T) is 1 on the
completion's real tokens (EOS included) and 0 on right padding; a row is one episode. Nothing here has state:
tensors in, tensors out. The trainer composes them; the chapters derive them, and each docstring names the
chapter's equation label (``eq-grpo-advantage`` is the GRPO chapter's advantage equation).

The policy loss's pure pieces, in the order they are applied: :func:`log_ratio` (token or sequence level), a
surrogate (:func:`clipped_surrogate`, with TRL's two-sided ``delta``; :func:`gmpo_surrogate`;
:func:`cispo_surrogate`; :func:`sapo_surrogate`; :func:`vespo_weights`), the per-token weights that correct for the
sampler (:func:`sampler_importance_weights`, :func:`off_policy_sequence_mask`), the entropy methods' choice of
tokens (:func:`high_entropy_mask`; :func:`clip_cov_mask` and :func:`kl_cov_mask` on :func:`token_covariance`), and
the aggregations (:func:`completion_token_mean`, :func:`token_mean`, :func:`constant_normaliser`,
:func:`global_token_mean`). :mod:`rlbook.losses` registers and composes them (its ``LOSS_TYPES`` says which
``loss_type`` is which surrogate and aggregation). The entropy bonus (:func:`entropy_bonus_loss`, with
:func:`adaptive_entropy_coef`) is added beside it.

Names follow TRL where TRL has the concept (``epsilon``, ``epsilon_high``, ``beta``, ``loss_type``,
``max_completion_length``, ``num_items_in_batch``, ``cliprange_value``), and each docstring says which denominator
is meant, because the libraries disagree about it (TRL's, verl's and OpenRLHF's token means differ in what they
count under gradient accumulation; the DAPO chapter compares them).
"""

from __future__ import annotations

import math

import torch

from rlbook.nonfinite import require_finite

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
# TRL's vllm_importance_sampling_mode: the sampler-mismatch correction's level (token or sequence) and what it does
# to a weight outside [clip_min, clip_max] (truncate: clamp it; mask: 0)
VLLM_IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
KL_KINDS = ("k1", "k2", "k3")
COVARIANCE_METHODS = ("clip_cov", "kl_cov")  # verl's policy-loss modes that act on high-covariance tokens
SAPO_MIN_TEMPERATURE = 1e-6  # SAPO's temperatures are O(1) (TRL: 1.0 and 1.05); the gate's value is about 2 / τ


# --- masked reductions -----------------------------------------------------------------------------------------


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ over ``mask`` of ``x`` (all entries, or along ``dim``). Entries outside the mask may hold anything,
    NaN included: they are replaced, not multiplied, by 0."""
    _check_same_shape(x=x, mask=mask)
    kept = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over ``mask``; 0 (never NaN) where the mask is empty."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``(x − μ) / sqrt(σ² + eps)`` over the masked entries, with the unbiased variance σ² (n − 1 in the
    denominator, as TRL and verl whiten advantages); ``shift_mean=False`` adds μ back (TRL's reward whitening).
    Returns 0 outside the mask."""
    count = int(mask.sum())
    if count < 2:
        raise ValueError(f"masked_whiten needs at least 2 masked entries for an unbiased variance, got {count}")
    mean = masked_mean(x, mask)
    variance = masked_sum((x - mean) ** 2, mask) / (count - 1)
    whitened = (x - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=x.dtype, device=x.device))


# --- KL estimators ---------------------------------------------------------------------------------------------


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from tokens sampled from π (Schulman's k1, k2, k3),
    shape of ``logp``.

    With ``δ = ref_logp − logp`` (the log-ratio π_ref/π at the sampled token):
    k1 = −δ (unbiased, can be negative); k2 = ½δ² (biased, ≥ 0, low variance);
    k3 = e^δ − δ − 1 (unbiased and ≥ 0, since E_π[e^δ] = 1 and e^x ≥ 1 + x). GRPO puts β·k3 in
    its loss.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; kind must be one of {KL_KINDS}")
    _check_same_shape(logp=logp, ref_logp=ref_logp)
    delta = ref_logp - logp
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta**2
    return torch.expm1(delta) - delta  # e^δ − 1 − δ, with expm1 for accuracy when δ ≈ 0


# --- advantages ------------------------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
    lam: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over right-padded rows: ``(advantages, returns)``, each
    (B, T).

        δ_t = r_t + γ V_{t+1} − V_t   (V = 0 after a row's last real token: the episode ends there)
        A_t = δ_t + γλ A_{t+1} = Σ_k (γλ)^k δ_{t+k}
        returns = A + V                 (the value model's regression target)

    ``lam`` is a float or a per-row tensor (B,) (VAPO's length-adaptive λ). Both outputs are 0 on
    padding. Computed without a loop over time steps: ``A = δ M`` with the upper-triangular discount
    matrix ``M[s, t] = (γλ)^(t−s)`` for ``t ≥ s`` (memory B·T² for a per-row λ, T² otherwise).
    """
    mask, lam = _check_gae(rewards, values, mask, gamma, lam)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    rewards, values = torch.where(mask, rewards, zero), torch.where(mask, values, zero)
    # padding is already 0
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    deltas = rewards + gamma * next_values - values  # (B, T), 0 on padding

    T = rewards.shape[1]
    steps = torch.arange(T, device=rewards.device)
    lag = steps[None, :] - steps[:, None]  # lag[s, t] = t − s
    decay = (gamma * lam).reshape(-1, 1, 1)  # (1 or B, 1, 1)
    # (1 or B, T, T)
    discount = torch.where(lag >= 0, decay ** lag.clamp(min=0).to(rewards.dtype), zero)
    advantages = torch.einsum("bt,bst->bs", deltas, discount.expand(rewards.shape[0], T, T))
    advantages = torch.where(mask, advantages, zero)
    return advantages, torch.where(mask, advantages + values, zero)


def group_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    scale_rewards: str = "group",
    eps: float = 1e-4,
    keep_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages from a group baseline: rewards (N·G,) in contiguous groups of ``num_generations``
    → (N·G,).

    - ``"group"`` (GRPO): (r − group mean) / (group std + eps), std unbiased (n − 1), eps = 1e-4 as
      in TRL;
    - ``"batch"``: group mean, but the std of the whole batch;
    - ``"none"`` (Dr. GRPO, and REINFORCE with a group-mean baseline): r − group mean.

    ``keep_mask`` (N·G,) bool (GFPO's filtering): means and stds over the kept completions only, and
    advantage 0 for the others. A group whose (kept) rewards are all equal gets advantage 0, never
    NaN: it carries no signal about which completion is better.
    """
    G, keep = _check_group_advantages(rewards, num_generations, scale_rewards, eps, keep_mask)
    groups, kept = rewards.view(-1, G), keep.view(-1, G)
    count = kept.sum(-1, keepdim=True)
    mean = (groups * kept).sum(-1, keepdim=True) / count.clamp(min=1)
    centred = (groups - mean) * kept
    if scale_rewards == "none":
        return centred.flatten()
    if scale_rewards == "group":
        std = ((centred**2).sum(-1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    else:
        batch_mean = (rewards * keep).sum() / keep.sum().clamp(min=1)
        std = (((rewards - batch_mean) * keep) ** 2).sum().div((keep.sum() - 1).clamp(min=1)).sqrt()
    # std + eps is 0 only with eps = 0 and equal rewards, where centred is 0: advantage 0, not 0/0
    return (centred / (std + eps)).where(std + eps > 0, 0.0).flatten()


def leave_one_out_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """RLOO: each completion's baseline is the mean reward of the *other* G − 1 completions of its
    prompt, r_i − (Σ_{j≠i} r_j)/(G − 1) = G/(G − 1) · (r_i − group mean); rewards (N·G,) → (N·G,).

    Unlike the plain group mean, the baseline does not depend on r_i itself, so the gradient
    estimate stays unbiased.
    """
    G = _check_leave_one_out_advantages(rewards, num_generations)
    return group_advantages(rewards, G, scale_rewards="none") * (G / (G - 1))


def gfpo_keep_mask(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    num_generations: int,
    k: int | torch.Tensor,
    metric: str = "length",
) -> torch.Tensor:
    """GFPO's filter: keep ``k`` of each group's G completions, (N·G,) bool.

    ``metric="length"`` keeps the k shortest; ``"token_efficiency"`` the k with the highest reward
    per token (r_i / |o_i|). Ties go to the earlier completion. ``k`` is one number, or one per
    group (N,) (see :func:`gfpo_adaptive_k`). The advantages are then computed over the kept ones
    only (``group_advantages(..., keep_mask=...)``), and the others get 0.
    """
    G, k = _check_gfpo_keep_mask(rewards, lengths, num_generations, k, metric)
    N = rewards.numel() // G
    if metric == "length":
        score = -lengths.to(torch.float64)  # higher is better: shorter
    else:
        score = rewards.to(torch.float64) / lengths.to(torch.float64).clamp(min=1)
    order = torch.sort(score.view(N, G), dim=-1, descending=True, stable=True).indices  # best first
    rank = torch.empty_like(order).scatter_(-1, order,
                                            torch.arange(G, device=order.device).expand(N, G))
    return (rank < k[:, None]).flatten()


def gfpo_adaptive_k(rewards: torch.Tensor, num_generations: int,
                    k_by_difficulty=(4, 6, 8, 8)) -> torch.Tensor:
    """GFPO's Adaptive Difficulty: more survivors for harder prompts, (N,) long.

    Difficulty is the group's mean reward, ranked within the batch into as many buckets as
    ``k_by_difficulty`` has entries (quartiles by default), from easiest (highest mean reward) to
    hardest. The paper estimates difficulty on the fly without giving the formula in what we could
    read; this bucketing is our assumption.
    """
    G, k_values = _check_gfpo_adaptive_k(rewards, num_generations, k_by_difficulty)
    means = rewards.view(-1, G).mean(-1)
    N = means.numel()
    easiest_first = torch.sort(-means, stable=True).indices
    rank = torch.empty_like(easiest_first).scatter_(0, easiest_first,
                                                    torch.arange(N, device=means.device))
    bucket = (rank * len(k_values)) // N
    return k_values[bucket]


def lambda_grpo_softmax(
    lengths: torch.Tensor,
    num_generations: int,
    lam: float | torch.Tensor,
    r: float | torch.Tensor = 0.3,
    eps: float = 1e-4,
    h_min: float = 1e-3,
) -> torch.Tensor:
    """λ-GRPO's softmax weights w (N·G,), which sum to 1 over each group (see
    :func:`lambda_grpo_weights`).

    Within a group of completion lengths |o_1|, …, |o_G| (contiguous groups of ``num_generations``):

        z_i = (|o_i| − mean|o|) / (std|o| + eps)   (std unbiased, n − 1, as in
                                                    :func:`group_advantages`)
        h_i = max(1 + r · z_i, h_min)
        w_i = softmax_i(h_i^λ) = exp(h_i^λ) / Σ_j exp(h_j^λ)

    ``r`` is the paper's name for the lift's slope (the book writes ξ, r being the reward there, and
    d_i for z_i). Differentiable in ``lam`` and ``r`` (pass tensors that require grad). λ = 0 gives
    h^0 = 1 and uniform weights 1/G; with r > 0, λ > 0 puts more weight on the longer completions of
    a group and λ < 0 on the shorter ones. A group of equal lengths has z = 0 and uniform weights
    for every λ.

    ``h_min`` is our assumption: h^λ is undefined for h ≤ 0 and non-integer λ, and what the paper
    does there was not found. |z_i| ≤ (G − 1)/√G within a group, so r < √G/(G − 1) (0.40 for G = 8)
    never reaches the floor.
    """
    G = num_generations
    lam, r = _check_lambda_grpo(lengths, G, lam, r, eps, h_min)
    groups = lengths.to(torch.float32).view(-1, G)
    z = (groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True) + eps)
    h = (1 + r * z).clamp(min=h_min)
    # h^λ overflows float32 for large |λ| (h_min^λ with λ <= -13): the largest float keeps softmax
    # finite (it subtracts the maximum), and leaves every finite h^λ as it is
    power = torch.nan_to_num(h**lam, posinf=torch.finfo(h.dtype).max)
    return torch.softmax(power, dim=-1).flatten()


def lambda_grpo_weights(
    lengths: torch.Tensor,
    num_generations: int,
    lam: float | torch.Tensor,
    r: float | torch.Tensor = 0.3,
    eps: float = 1e-4,
    h_min: float = 1e-3,
) -> torch.Tensor:
    """λ-GRPO's per-response weights f (N·G,): f_i = G · w_i, which sum to G over each group.

    With them the loss is Σ_i f_i Σ_t ℓ_{i,t} / Σ_i |o_i| (``policy_loss(..., loss_type="dapo",
    response_weights=f)``): every token of completion i carries the weight f_i. λ = 0 gives f = 1,
    which is DAPO's token mean exactly; GRPO (f_i ∝ 1/|o_i|) and Dr. GRPO (f_i constant per batch)
    are other choices of f. See :func:`lambda_grpo_softmax` for w, the length standardisation and
    the floor ``h_min``.
    """
    return num_generations * lambda_grpo_softmax(lengths, num_generations, lam, r, eps, h_min)


def _check_gae(rewards, values, mask, gamma, lam):
    """:func:`gae`' arguments; returns the mask as bool and λ as a tensor (a scalar or (B,))."""
    _check_same_shape(rewards=rewards, values=values, mask=mask)
    if rewards.dim() != 2:
        raise ValueError("rewards, values and mask must be (B, T), got shape "
                         f"{tuple(rewards.shape)}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    mask = mask.bool()
    _check_right_padded(mask)
    require_finite("rewards", rewards, mask=mask)
    require_finite("values", values, mask=mask)
    lam = torch.as_tensor(lam, dtype=rewards.dtype, device=rewards.device)
    if lam.dim() not in (0, 1) or (lam.dim() == 1 and lam.shape[0] != rewards.shape[0]):
        raise ValueError(f"lam must be a float or a (B,) = ({rewards.shape[0]},) tensor, got shape "
                         f"{tuple(lam.shape)}")
    if not bool(((lam >= 0) & (lam <= 1)).all()):
        raise ValueError(f"lam must lie in [0, 1], got {lam.tolist()}")
    return mask, lam


def _check_leave_one_out_advantages(rewards, num_generations):
    """:func:`leave_one_out_advantages`' arguments; returns the group size G."""
    G = _check_groups(rewards, num_generations)
    if G < 2:
        raise ValueError(f"a leave-one-out baseline needs num_generations >= 2, got {G}")
    return G


def _check_gfpo_keep_mask(rewards, lengths, num_generations, k, metric):
    """:func:`gfpo_keep_mask`' arguments; returns the group size G and k as a tensor, one per group (N,)."""
    G = _check_groups(rewards, num_generations)
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths must have the rewards' shape {tuple(rewards.shape)}, got "
                         f"{tuple(lengths.shape)}")
    if metric not in ("length", "token_efficiency"):
        raise ValueError(f"unknown GFPO metric {metric!r}; choose 'length' or 'token_efficiency'")
    N = rewards.numel() // G
    k = torch.as_tensor(k, device=rewards.device)
    if k.shape not in ((), (N,)):
        raise ValueError(f"k must be one number or one per group, ({N},), got shape "
                         f"{tuple(k.shape)}")
    k = k.expand(N)
    if bool(((k < 1) | (k > G)).any()):
        raise ValueError(f"k must lie in [1, num_generations = {G}] for every group, got "
                         f"{k.tolist()}")
    return G, k


def _check_gfpo_adaptive_k(rewards, num_generations, k_by_difficulty):
    """:func:`gfpo_adaptive_k`' arguments; returns the group size G and the k's as a tensor."""
    G = _check_groups(rewards, num_generations)
    k_values = torch.as_tensor(k_by_difficulty, device=rewards.device)
    if k_values.dim() != 1 or len(k_values) == 0:
        raise ValueError("k_by_difficulty must be a non-empty sequence of k, one per difficulty "
                         f"bucket, got {k_by_difficulty!r}")
    if bool(((k_values < 1) | (k_values > G)).any()):
        raise ValueError(f"every k must lie in [1, num_generations = {G}], got k_by_difficulty="
                         f"{list(k_by_difficulty)}")
    return G, k_values


def _check_rlhf_token_rewards(scores, logp, ref_logp, mask, beta, kl_kind):
    """:func:`rlhf_token_rewards`' arguments; returns the mask as bool and each row's completion tokens."""
    if beta < 0 or not math.isfinite(beta):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    if kl_kind not in KL_KINDS:
        raise ValueError(f"unknown kl_kind {kl_kind!r}; choose one of {KL_KINDS}")
    _check_same_shape(logp=logp, ref_logp=ref_logp, mask=mask)
    mask = mask.bool()
    if scores.shape != logp.shape[:1]:
        raise ValueError(f"scores must be one per row, shape ({logp.shape[0]},), got "
                         f"{tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"scores must be finite, got {scores.tolist()}")
    lengths = mask.sum(-1)
    if not bool((lengths > 0).all()):
        raise ValueError("every row of mask needs at least one completion token; rows "
                         f"{(lengths == 0).nonzero().flatten().tolist()} have none")
    _check_right_padded(mask)
    return mask, lengths


def _check_adaptive_kl_coef(kl, target, num_samples, horizon):
    """:func:`adaptive_kl_coef`' arguments."""
    if not target > 0 or not horizon > 0 or num_samples < 0:
        raise ValueError(f"target and horizon must be positive and num_samples >= 0, got {target}, "
                         f"{horizon}, {num_samples}")
    if not math.isfinite(kl):
        raise ValueError(f"the measured KL must be finite, got {kl}")


def _check_length_adaptive_lam(lengths, alpha):
    """:func:`length_adaptive_lam`' arguments; returns the lengths in float64."""
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    lengths = lengths.to(torch.float64)
    if bool((lengths <= 0).any()):
        raise ValueError(f"lengths must be positive, got {lengths.tolist()}")
    return lengths


def _check_group_advantages(rewards, num_generations, scale_rewards, eps, keep_mask):
    """:func:`group_advantages`' arguments; returns the group size G and the kept completions as
    0/1 weights (all 1 without ``keep_mask``)."""
    G = _check_groups(rewards, num_generations)
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; choose 'group', 'batch' or "
                         "'none'")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if scale_rewards != "none" and G < 2:
        raise ValueError(f"scale_rewards={scale_rewards!r} needs num_generations >= 2 for a "
                         f"standard deviation, got {G}")
    if keep_mask is None:
        keep = torch.ones_like(rewards)
    else:
        if keep_mask.shape != rewards.shape:
            raise ValueError(f"keep_mask must have the rewards' shape {tuple(rewards.shape)}, got "
                             f"{tuple(keep_mask.shape)}")
        keep = keep_mask.to(rewards.dtype)
    return G, keep


def _check_lambda_grpo(lengths, G, lam, r, eps, h_min):
    """:func:`lambda_grpo_softmax`' arguments; returns λ and r as float32 scalar tensors."""
    if (lengths.dim() != 1 or G < 1 or lengths.numel() == 0
            or lengths.numel() % G):
        raise ValueError("lengths must be one per completion, (N*G,), in groups of "
                         "num_generations="
                         f"{G}; got shape {tuple(lengths.shape)}")
    if G < 2:
        raise ValueError(f"lambda_grpo weights need num_generations >= 2 for a length std, got {G}")
    lam = torch.as_tensor(lam, dtype=torch.float32, device=lengths.device)
    r = torch.as_tensor(r, dtype=torch.float32, device=lengths.device)
    if lam.dim() or r.dim():
        raise ValueError(f"lam and r must be scalars, got shapes {tuple(lam.shape)} and "
                         f"{tuple(r.shape)}")
    if not (bool(torch.isfinite(lam)) and bool(torch.isfinite(r))):
        raise ValueError(f"lam and r must be finite, got {lam.item()} and {r.item()}")
    if not eps > 0 or not h_min > 0:
        raise ValueError(f"eps and h_min must be positive, got {eps} and {h_min}")
    if not bool(torch.isfinite(lengths.to(torch.float32)).all()):
        raise ValueError(f"lengths must be finite, got {lengths.tolist()[:8]}")
    if bool((lengths < 1).any()):
        rows = (lengths < 1).nonzero().flatten().tolist()
        raise ValueError(f"completions {rows[:5]} have no token (an all-masked row): lengths "
                         "must be >= 1")
    return lam, r


def _check_groups(rewards: torch.Tensor, num_generations: int) -> int:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one per completion, shape (N*G,), got {tuple(rewards.shape)}")
    if num_generations < 1 or rewards.numel() == 0 or rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}")
    if not bool(torch.isfinite(rewards).all()):
        bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
        raise ValueError(f"rewards must be finite; completions {bad[:5]} have {rewards[bad[0]].item()}")
    return num_generations


def rlhf_token_rewards(
    scores: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    kl_kind: str = "k1",
) -> torch.Tensor:
    """The per-token reward of PPO for RLHF (InstructGPT, TRL, OpenRLHF), (B, T):

        r_t = −β · k_t(π ‖ π_ref)  at every completion token,
              plus the sequence's ``score`` at its last token,

    so each row sums to score − β Σ_t k_t and padding gets 0. ``scores`` (B,) come from a reward
    model or a rule; ``kl_kind`` is the per-token estimator (k1 in InstructGPT and by default in
    TRL's PPO). verl, OpenRLHF and we put the score at the last real token; TRL's PPO puts it one
    position later.
    """
    mask, lengths = _check_rlhf_token_rewards(scores, logp, ref_logp, mask, beta, kl_kind)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    kl = torch.where(mask, kl_estimate(torch.where(mask, logp, zero),
                                       torch.where(mask, ref_logp, zero), kl_kind), zero)
    rewards = -beta * kl
    rewards[torch.arange(len(scores), device=scores.device),
            lengths - 1] += scores.to(rewards.dtype)
    return rewards


def adaptive_kl_coef(beta: float, kl: float, target: float, num_samples: int,
                     horizon: int = 10_000) -> float:
    """The adaptive KL controller of Ziegler et al. (2019), as TRL and OpenRLHF implement it: the
    next β.

        e = clip(KL / target − 1, −0.2, 0.2),    β ← β · (1 + e · num_samples / horizon)

    β grows while the measured KL (to the reference, per sequence) exceeds the target and shrinks
    below it, by at most 20 % per ``horizon`` samples. Implementation practice, not part of the PPO
    paper.
    """
    _check_adaptive_kl_coef(kl, target, num_samples, horizon)
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * num_samples / horizon)


def length_adaptive_lam(lengths: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    """VAPO's length-adaptive λ for the policy's GAE, one per row: λ = 1 − 1/(α·l) for a completion
    of l tokens.

    Long completions get λ close to 1 (little bias from bootstrapping over many tokens), short ones
    a smaller λ (less variance). The formula is negative for α·l < 1, where the paper is silent; we
    clamp λ to [0, 1], so a completion shorter than 1/α tokens uses λ = 0 (one-step TD), which is
    the formula's limit at α·l = 1.
    """
    lengths = _check_length_adaptive_lam(lengths, alpha)
    return (1.0 - 1.0 / (alpha * lengths)).clamp(min=0.0, max=1.0).to(torch.float32)


# --- the policy loss, in named pieces: ratio -> surrogate -> aggregation ----------------------------------------


def log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
              importance_sampling_level: str = "token") -> torch.Tensor:
    """log ρ, the log importance ratio of π_θ to π_old, (B, T), 0 outside ``mask``, at TRL's
    ``importance_sampling_level``:

    - ``"token"``: log ρ_t = logp_t − old_logp_t, one ratio per token (PPO, GRPO, DAPO;
      eq-ppo-clip);
    - ``"sequence"`` (GSPO, eq-gspo-ratio): log s_i = Σ_t m (logp − old_logp) / |o_i| at every token
      of row i, the log of the geometric mean of the token ratios, with the gradient flowing through
      the mean;
    - ``"sequence_token"`` (GSPO-token, eq-gspo-token): logp_t − sg(logp_t) + sg(log s_i): the value
      of log s_i, the gradient of logp_t alone; with a per-completion advantage it equals
      ``"sequence"`` in value and gradient.

    Sequence levels need at least one masked token per row.
    """
    _check_log_ratio(importance_sampling_level)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    token = torch.where(mask, logp - old_logp, zero)  # padding may hold garbage: keep it out of exp
    if importance_sampling_level == "token":
        return token
    lengths = mask.sum(-1)
    if not bool((lengths > 0).all()):
        rows = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows[:5]} have no masked token: a sequence-level ratio needs at "
                         "least one")
    sequence = masked_sum(token, mask, dim=-1) / lengths  # log s_i, (B,)
    if importance_sampling_level == "sequence":
        return sequence[:, None].expand_as(logp)
    return torch.where(mask, logp - logp.detach() + sequence.detach()[:, None], zero)


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float,
                      epsilon_high: float, delta: float | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-Clip's per-token loss (eq-ppo-clip), −min(ρA, clip(ρ, 1 − ε, 1 + ε_high)·A), all (B, T),
    and where the clip removes the gradient: ``(loss, low, high)`` with ``low`` = ρ < 1 − ε and
    A < 0, ``high`` = ρ > 1 + ε_high and A > 0 (TRL's ``clip_ratio/low`` and ``/high``).
    ε_high > ε is DAPO's clip-higher.

    ``delta`` (TRL's name; INTELLECT-2's two-sided clipping, eq-after-delta) caps the unclipped
    branch too:

        ℓ_t = −min(min(ρ_t, δ)·A_t, clip(ρ_t, 1 − ε, 1 + ε_high)·A_t)

    With δ > 1 + ε_high this changes only A < 0: PPO-Clip's loss −ρA = |A|ρ of a token whose
    ratio has run far above 1 grows without bound (the clip never acts there), and δ stops it at
    |A|δ, with no gradient beyond (verl's and Ye et al.'s dual clip, c = δ). ``low`` and ``high``
    are unchanged by δ."""
    if delta is not None:
        check_delta(delta, epsilon_high)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    loss = -torch.minimum(unclipped * advantages, clipped * advantages)
    low = (ratio < 1 - epsilon) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    return loss, low, high


def gmpo_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GMPO's loss per completion (eq-gmpo-objective), (B,), with its clip indicators (B, T).

    Per row, Δ_t = log ρ_t is clipped in log space by the sign of the row's advantage A_i (A > 0:
    min(Δ, clip(Δ, −ε, ε_high)); A ≤ 0: max(Δ, clip(Δ, −ε, ε_high))), and the loss is
    −A_i · exp(Σ_t m Δ̃_t / |o_i|): the advantage times the *geometric* mean of the clipped token
    ratios. ε is in log space (0.4 in GMPO)."""
    _check_gmpo_surrogate(mask)
    # constant over a row for the group methods
    row_advantage = masked_mean(advantages, mask, dim=-1)
    positive = (row_advantage > 0)[:, None]
    clipped = torch.clamp(log_ratio, -epsilon, epsilon_high)
    delta = torch.where(positive, torch.minimum(log_ratio, clipped),
                        torch.maximum(log_ratio, clipped))
    geometric_mean_ratio = torch.exp(masked_sum(delta, mask, dim=-1) / mask.sum(-1))
    low = (log_ratio < -epsilon) & ~positive
    high = (log_ratio > epsilon_high) & positive
    return -row_advantage * geometric_mean_ratio, low, high


def cispo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, max_weight: float,
    min_weight: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO's per-token loss (MiniMax-M1, arXiv 2506.13585; eq-after-cispo), all (B, T): the
    importance weight is clipped *and its gradient stopped*, then multiplies the advantage and log
    π_θ:

        ŵ_t = sg(clip(ρ_t, min_weight, max_weight)),    ℓ_t = −ŵ_t · A_t · log π_θ(o_t)

    so ∇ℓ_t = −ŵ_t A_t ∇log π_θ(o_t). No token's gradient is ever removed (PPO-Clip's is, for a
    token whose ratio left the range on the side its advantage pushes): CISPO only bounds its
    weight. At ρ = 1 the gradient is REINFORCE's, −A ∇log π. The loss's value is a weighted
    log-likelihood, not PPO's surrogate; only its gradient means something.

    MiniMax-M1 writes the range [1 − ε_low^IS, 1 + ε_high^IS] and sets ε_low^IS large (no lower
    bound). TRL's ``loss_type="cispo"`` (:func:`rlbook.losses.cispo`) caps the weight at
    ``epsilon_high`` itself, not 1 + ``epsilon_high`` (ScaleRL's ε_max, 5.0 there), with no lower
    bound:
    ``max_weight=epsilon_high``, ``min_weight=None``.

    Returns ``(loss, low, high)``: where the weight was capped, ``low`` = ρ < ``min_weight``,
    ``high`` = ρ > ``max_weight`` (whatever the advantage's sign; TRL's ``cispo_clip_ratio`` counts
    ``high`` with A > 0)."""
    _check_cispo(ratio, advantages, logp, max_weight, min_weight)
    weight = torch.clamp(ratio.detach(), min=min_weight, max=max_weight)
    loss = -weight * advantages * logp
    low = (ratio < min_weight if min_weight is not None
           else torch.zeros_like(ratio, dtype=torch.bool))
    high = ratio > max_weight
    return loss, low, high


def sapo_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, temperature_pos: float = 1.0,
                   temperature_neg: float = 1.05) -> torch.Tensor:
    """SAPO's per-token loss (Soft Adaptive Policy Optimization, arXiv 2511.20347; eq-after-sapo),
    (B, T): a smooth, temperature-controlled gate on the ratio in place of a hard clip. As TRL 1.16
    computes it,

        τ_t = τ_pos if A_t > 0 else τ_neg
        f(ρ) = (4 / τ) · σ(τ (ρ − 1)),    ℓ_t = −f(ρ_t) · A_t

    (σ the logistic function). Its gradient in ρ is −4σ(1 − σ)·A = −sech²(τ(ρ − 1)/2)·A: exactly
    PPO's −A at ρ = 1, and falling smoothly towards 0 as ρ leaves 1 on either side, faster for a
    larger τ. Unlike a clip, no ratio has exactly zero gradient and none keeps the full one far from
    1 (on-policy tokens learn at full strength, far off-policy ones are attenuated, not cut).
    τ_neg > τ_pos (TRL's defaults: 1.0 and 1.05; TRL's names ``sapo_temperature_pos`` and ``_neg``)
    damps negative-advantage tokens sooner, the less stable ones in the paper's account."""
    check_sapo_temperatures(temperature_pos, temperature_neg)
    _check_same_shape(ratio=ratio, advantages=advantages)
    temperature = torch.where(advantages > 0, torch.full_like(ratio, temperature_pos),
                              torch.full_like(ratio, temperature_neg))
    gate = torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature
    return -gate * advantages


def vespo_weights(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  importance_sampling_ratio: torch.Tensor | None = None, k_pos: float = 2.0,
                  lambda_pos: float = 3.0, k_neg: float = 3.0,
                  lambda_neg: float = 2.0) -> torch.Tensor:
    """VESPO's weight of each completion (Variational Sequence-Level Soft Policy Optimization, arXiv
    2602.10693; TRL 1.16's ``loss_type="vespo"``, eq-after-vespo), (B, 1), detached: a Gamma-shaped
    function of the sequence's likelihood ratio w = Π_t ρ_t, normalised so that φ(1) = 1,

        φ(w) = exp(λ + k log w − λ w),     (k, λ) = (k_pos, λ_pos) if A ≥ 0 else (k_neg, λ_neg)

    and the loss is −φ(w)·A·log π_θ(o_t) at every token: REINFORCE's gradient scaled by φ, which
    peaks at w = k/λ (a little above 1 there) and falls smoothly to 0 on both sides, as w^k below
    and as e^{−λw} above, instead of being cut by a clip. ``log_ratio`` (B, T) are token log-ratios;
    ``importance_sampling_ratio`` (B, T), the sampler correction's token weights, multiplies w
    (its logs are added over the masked tokens). As TRL computes it: each token's log-ratio clamped
    to [−20, 20], log w to [log 1e-8, 20], a non-finite φ read as 0; ``advantages`` (B, T) constant
    over a row (its first token's sign decides)."""
    lower = math.log(1e-8)
    log_w = masked_sum(torch.clamp(log_ratio.detach(), -20.0, 20.0), mask, dim=-1)[:, None]
    if importance_sampling_ratio is not None:
        log_is = torch.clamp(torch.log(importance_sampling_ratio.detach()), lower, 20.0)
        log_w = log_w + masked_sum(log_is, mask, dim=-1)[:, None]
    log_w = torch.clamp(log_w, lower, 20.0)
    positive = advantages[:, :1] >= 0
    k = torch.where(positive, k_pos, k_neg)
    lam = torch.where(positive, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0,
                                                                       neginf=0.0)


def sampler_importance_weights(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
    mode: str = "sequence_mask", clip_min: float | None = None, clip_max: float = 3.0,
) -> torch.Tensor:
    """The per-token weight that corrects the policy loss for the sampler–learner mismatch
    (eq-after-sampler-is), (B, T), 0 outside ``mask``; plain numbers, no gradient.

    An inference engine (vLLM, SGLang; here the rollout's sampler, see
    ``RLConfig.sampler_temperature``) draws the tokens, and its log-probs ``sampler_logp`` differ
    from the learner's ``old_logp`` for the same tokens (other kernels, precision, temperature): the
    samples are slightly off-policy before any update. Importance sampling reweights them from
    π_sampler to π_old:

        token level:     r_t = π_old(o_t) / π_sampler(o_t) = exp(old_logp_t − sampler_logp_t)
        sequence level:  r_i = Π_t r_t = exp(Σ_t m (old_logp − sampler_logp)), at each token of i

    (the product over the completion's tokens, its likelihood ratio, not GSPO's geometric mean).
    ``mode`` (TRL's ``vllm_importance_sampling_mode``: level × what happens outside [C_min, C_max] =
    [``clip_min``, ``clip_max``]):

        "token_truncate", "sequence_truncate":  w = clip(r, C_min, C_max)       (truncated IS, TIS)
        "token_mask", "sequence_mask":          w = r · 1[C_min ≤ r ≤ C_max]    (masked IS, MIS)

    Truncation keeps every sample with a bounded weight (bias for bounded variance); masking drops
    the tokens or completions the sampler got too wrong. IcePop (Ring-1T; eq-after-icepop) is
    ``"token_mask"`` with its band [α, β] as [``clip_min``, ``clip_max``]: a token whose
    learner/sampler probability ratio lies outside the band leaves the gradient, one inside keeps
    its weight r_t.

    The weight multiplies the per-token policy loss, not the KL term (``policy_loss(...,
    importance_sampling_ratio=w)``), as TRL does. ``clip_min`` None is no lower bound; ``clip_max``
    must be finite (TRL also allows None in the mask modes, which leaves the weight unbounded
    above).
    """
    mask = _check_sampler_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max)
    zero = torch.zeros((), dtype=old_logp.dtype, device=old_logp.device)
    log_ratio = torch.where(mask, old_logp.detach() - sampler_logp.detach(), zero)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(old_logp)
    ratio = torch.exp(log_ratio)  # may overflow to inf: the clip and the mask below both bound it
    if mode.endswith("truncate"):
        weight = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        inside = (ratio <= clip_max) & (ratio >= (0.0 if clip_min is None else clip_min))
        weight = torch.where(inside, ratio, zero)
    return torch.where(mask, weight, zero)


def off_policy_sequence_mask(
    logp: torch.Tensor, sampler_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence masking (TRL's ``off_policy_mask_threshold``, the paper's
    δ; eq-after-opsm): which tokens keep their loss, (B, T) bool, False outside ``mask``.

        KL_i = Σ_t m (sampler_logp_t − sg(logp_t)) / |o_i|   (k1 estimate of KL(π_sampler ‖ π_θ))
        keep_{i,t} = A_{i,t} ≥ 0  or  KL_i ≤ δ

    A completion with a negative advantage that the current policy has drifted far from (by the
    updates since it was sampled, and by the sampler's own mismatch) is dropped from the loss:
    pushing down tokens the policy would no longer sample is what destabilises training, the paper
    argues. Positive-advantage completions always stay. ``advantages`` (B,) or (B, T);
    ``sampler_logp`` the behaviour policy's log-probs (TRL: the inference engine's when vLLM
    sampled, π_old's otherwise)."""
    advantages, mask = _check_off_policy_mask(logp, sampler_logp, advantages, mask, threshold)
    log_ratio = sampler_logp.detach() - logp.detach()
    kl = masked_sum(log_ratio, mask, dim=-1) / mask.sum(-1).clamp(min=1)  # (B,)
    return ((advantages >= 0) | (kl <= threshold)[:, None]) & mask


# --- entropy: which tokens learn, and a bonus ----------------------------------------------------------------------


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor,
                      top_entropy_quantile: float) -> torch.Tensor:
    """The high-entropy minority (Wang et al., "Beyond the 80/20 Rule", arXiv 2506.01939;
    eq-after-entropy-filter): which tokens keep their policy loss, (B, T) bool, False outside
    ``mask``.

        τ = the (1 − ρ) quantile of {H_t : m_t = 1}      keep_t = m_t · 1[H_t ≥ τ]

    with ρ = ``top_entropy_quantile`` (TRL's name; the paper keeps 0.2) and H_t the policy's entropy
    at token t (``entropies``, nats). Only the "forking" tokens, where the policy hesitates, are
    pushed; the confident majority is left alone. ρ = 1 keeps every token; ρ = 0 keeps the highest
    only (and its ties). The quantile interpolates linearly (``torch.quantile``), over the tokens
    given: TRL gathers every process's tokens first, this function sees one micro-batch."""
    mask = _check_high_entropy(entropies, mask, top_entropy_quantile)
    # in float32 at least (bf16 entropies have too few digits for a quantile)
    values = entropies.detach()[mask].to(torch.promote_types(entropies.dtype, torch.float32))
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1.0 - top_entropy_quantile)
    return (entropies.detach() >= threshold) & mask


def adaptive_entropy_coef(entropy_coef: float, entropy: float, *, entropy_target: float,
                          entropy_coef_delta: float, entropy_coef_min: float = 0.0,
                          entropy_coef_max: float = 1.0) -> float:
    """Skywork-OR1's adaptive entropy control (arXiv 2505.22312; eq-after-adaptive-entropy): the
    next step's coefficient of the entropy bonus, from this step's mean token entropy (nats).

        c ← clip(c + Δ, c_min, c_max)   if H ≤ H_target      (entropy too low: push harder)
        c ← clip(c − Δ, c_min, c_max)   otherwise

    The bonus −c·H is added to the loss only while H ≤ H_target (the trainer applies the coefficient
    that the *previous* step's entropy decided, as TRL does), so the controller raises entropy when
    it falls below the target and otherwise stays out of the way. Names as TRL's ``GRPOConfig``."""
    _check_adaptive_entropy_coef(entropy_coef, entropy, entropy_target, entropy_coef_delta,
                                 entropy_coef_min, entropy_coef_max)
    step = entropy_coef_delta if entropy <= entropy_target else -entropy_coef_delta
    return min(max(entropy_coef + step, entropy_coef_min), entropy_coef_max)


def entropy_bonus_loss(entropies: torch.Tensor, mask: torch.Tensor, entropy_coef: float,
                       gradient_accumulation_steps: int = 1) -> torch.Tensor:
    """The entropy bonus as a term of the loss (eq-after-entropy-bonus): −c · mean_t H_t over the
    masked tokens, divided by ``gradient_accumulation_steps``; differentiable through ``entropies``.
    Minimising it raises the policy's entropy. As in TRL the bonus is a plain token mean whatever
    the ``loss_type`` (``entropy_coef`` means the same for every aggregation), over the tokens the
    policy loss uses (pass :func:`high_entropy_mask` ∧ ``mask`` when the filter is on)."""
    if not math.isfinite(entropy_coef):
        raise ValueError(f"entropy_coef must be finite, got {entropy_coef}")
    _check_accumulation(gradient_accumulation_steps)
    _check_same_shape(entropies=entropies, mask=mask)
    mask = mask.bool()
    require_finite("entropies", entropies, mask=mask)
    if not bool(mask.any()):
        return entropies.sum() * 0.0
    return -entropy_coef * masked_mean(entropies, mask) / gradient_accumulation_steps

def token_covariance(logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """Each token's share of the covariance between its log-prob and its advantage (Cui et al., "The
    Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617;
    eq-after-entropy-cov), (B, T), 0 outside ``mask``; no gradient:

        Cov_t = (log π(o_t) − mean log π) · (A_t − mean A)      (means over the masked tokens)

    Under a softmax policy the entropy changes, to first order, by minus the covariance of log π and
    the advantage over the sampled tokens: confident tokens (high log π) with positive advantages
    make the entropy fall. Clip-Cov and KL-Cov act on the few tokens with the largest Cov_t."""
    advantages, mask = _check_token_covariance(logp, advantages, mask)
    logp, advantages = logp.detach(), advantages.detach()
    centred = (logp - masked_mean(logp, mask)) * (advantages - masked_mean(advantages, mask))
    return torch.where(mask, centred, torch.zeros((), dtype=centred.dtype, device=centred.device))


def clip_cov_mask(covariance: torch.Tensor, mask: torch.Tensor, clip_cov_ratio: float = 2e-4,
                  clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0,
                  already_clipped: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Clip-Cov (eq-after-clip-cov): the tokens whose gradient is cut, (B, T) bool.

    Among the masked tokens with ``clip_cov_lb`` < Cov_t < ``clip_cov_ub``
    (:func:`token_covariance`) and not already clipped by PPO's ratio clip (``already_clipped``),
    pick max(1, ⌊``clip_cov_ratio`` · n⌋) at random (n: the masked tokens; ``generator`` for a
    reproducible draw). Their loss is multiplied by 0, as verl does; the rest keep PPO-Clip's loss.
    Names and defaults as verl's ``policy_loss`` settings."""
    mask = _check_clip_cov_mask(covariance, mask, clip_cov_ratio, clip_cov_lb, clip_cov_ub,
                                already_clipped)
    candidates = mask & (covariance > clip_cov_lb) & (covariance < clip_cov_ub)
    if already_clipped is not None:
        candidates = candidates & ~already_clipped.bool()
    count = max(int(clip_cov_ratio * int(mask.sum())), 1)
    where = candidates.flatten().nonzero().flatten()
    chosen = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    if len(where) > 0:
        order = torch.randperm(len(where), generator=generator, device="cpu").to(where.device)
        chosen[where[order[:count]]] = True
    return chosen.view_as(mask)


def kl_cov_mask(covariance: torch.Tensor, mask: torch.Tensor,
                kl_cov_ratio: float = 2e-4) -> torch.Tensor:
    """KL-Cov (eq-after-kl-cov): the tokens that get a KL penalty, (B, T) bool: the max(1,
    ⌊``kl_cov_ratio`` · n⌋) masked tokens with the largest Cov_t (:func:`token_covariance`). Their
    loss becomes −ρ_t A_t + k·|log ρ_t| (``ppo_kl_coef`` k), the others' −ρ_t A_t, with no ratio
    clip, as verl's ``kl_cov`` does."""
    mask = _check_kl_cov_mask(covariance, mask, kl_cov_ratio)
    n = int(mask.sum())
    if n == 0:
        return torch.zeros_like(mask)
    count = max(int(kl_cov_ratio * n), 1)
    scores = torch.where(mask, covariance, torch.full((), -math.inf, dtype=covariance.dtype,
                                                      device=covariance.device))
    chosen = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    chosen[scores.flatten().topk(count).indices] = True
    return chosen.view_as(mask)


def completion_token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``loss_type="grpo"`` (eq-grpo-objective): each completion's token mean, averaged over
    completions, mean_i Σ_t m ℓ / |o_i|. Every completion weighs the same, so a token of a long one
    weighs less (f_i = 1/(B|o_i|))."""
    lengths = mask.sum(-1).clamp(min=1)
    return (masked_sum(per_token, mask, dim=-1) / lengths).mean()


def token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``loss_type="bnpo"`` (PPO's token mean): Σ m ℓ / Σ m over the batch this call sees (a
    micro-batch under gradient accumulation, so it is a mean of micro-batch means)."""
    return masked_sum(per_token, mask) / mask.sum().clamp(min=1)


def constant_normaliser(per_token: torch.Tensor, mask: torch.Tensor,
                        max_completion_length: int | None) -> torch.Tensor:
    """``loss_type="dr_grpo"`` (Dr. GRPO, eq-drgrpo-weights): Σ m ℓ / (B · L_max), a constant that
    does not depend on any completion's length (``max_completion_length`` defaults to the padded
    length T)."""
    length = _check_constant_normaliser(per_token, max_completion_length)  # L_max, T by default
    return masked_sum(per_token, mask) / (per_token.shape[0] * length)


def global_token_mean(per_token: torch.Tensor, mask: torch.Tensor,
                      num_items_in_batch: int | float | torch.Tensor | None) -> torch.Tensor:
    """``loss_type="dapo"`` (DAPO's token-level loss, eq-dapo-objective): Σ m ℓ /
    ``num_items_in_batch``, the token count of the *whole* optimizer batch (default: Σ m, this
    call's), so that the gradients of its micro-batches sum to the gradient of one global token
    mean: no further division under gradient accumulation."""
    count = _check_global_token_mean(mask, num_items_in_batch)  # Σ m unless num_items_in_batch
    return masked_sum(per_token, mask) / count


def positive_example_nll(logp: torch.Tensor, loss_mask: torch.Tensor,
                         correct: torch.Tensor) -> torch.Tensor | None:
    """VAPO's positive-example language-model loss (eq-vapo-nll): the token-mean negative
    log-likelihood −Σ m_t c_i log π_θ(o_t) / Σ m_t c_i over the loss tokens (``loss_mask`` (B, T))
    of the completions the task calls correct (``correct`` (B,) bool), whatever reward drove the
    advantages. None when no correct completion has a loss token (the term is then absent, not
    0/0)."""
    _check_positive_example_nll(loss_mask, correct)
    correct_tokens = loss_mask * correct[:, None]
    if not bool(correct_tokens.any()):
        return None
    return -masked_mean(logp, correct_tokens)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float | None = None,
) -> torch.Tensor:
    """½ · masked mean of max((V − R)², (clip(V, V_old − c, V_old + c) − R)²), all (B, T)
    (eq-ppo-value-loss).

    The clipped branch (PPO's value clipping, c = ``cliprange_value``, TRL's name) stops the value
    model from moving far from the values it had when the rollout was scored; ``None`` gives the
    plain ½ (V − R)².
    """
    mask = _check_value_loss(values, old_values, returns, mask, cliprange_value)
    squared = (values - returns) ** 2
    if cliprange_value is not None:
        clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
        squared = torch.maximum(squared, (clipped - returns) ** 2)
    return 0.5 * masked_mean(squared, mask)



def _check_log_ratio(importance_sampling_level):
    """:func:`log_ratio`' arguments (a sequence level's empty rows are found where its lengths are computed)."""
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"unknown importance_sampling_level {importance_sampling_level!r}; "
                         f"choose one of {IMPORTANCE_SAMPLING_LEVELS}")


def _check_gmpo_surrogate(mask):
    """:func:`gmpo_surrogate`' arguments: every row has a token."""
    if not bool((mask.sum(-1) > 0).all()):
        rows = (mask.sum(-1) == 0).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows[:5]} of mask have no token: GMPO's geometric mean needs at "
                         "least one")


def _check_sampler_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max):
    """:func:`sampler_importance_weights`' arguments; returns the mask as bool."""
    if mode not in VLLM_IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {VLLM_IMPORTANCE_SAMPLING_MODES}")
    _check_weight_bounds("clip_min", clip_min, "clip_max", clip_max, "the largest weight kept")
    _check_same_shape(old_logp=old_logp, sampler_logp=sampler_logp, mask=mask)
    if old_logp.dim() != 2:
        raise ValueError(f"old_logp, sampler_logp and mask must be (B, T), got shape "
                         f"{tuple(old_logp.shape)}")
    mask = mask.bool()
    require_finite("old_logp", old_logp, mask=mask)
    require_finite("sampler_logp", sampler_logp, mask=mask)
    return mask


def _check_weight_bounds(low_name, low, high_name, high, what) -> None:
    """A weight's cap ``high``, positive and finite, and its optional floor ``low`` in [0, high)."""
    if high is None or not (math.isfinite(high) and high > 0):
        raise ValueError(f"{high_name} must be a positive finite number ({what}), got {high}")
    if low is not None and not (math.isfinite(low) and 0 <= low < high):
        raise ValueError(f"{low_name} must be None or a number in [0, {high_name} = {high}), "
                         f"got {low}")


def _check_cispo(ratio, advantages, logp, max_weight, min_weight):
    """:func:`cispo_surrogate`' arguments."""
    _check_weight_bounds("min_weight", min_weight, "max_weight", max_weight,
                         "the cap on CISPO's importance weight")
    _check_same_shape(ratio=ratio, advantages=advantages, logp=logp)


def _check_off_policy_mask(logp, sampler_logp, advantages, mask, threshold):
    """:func:`off_policy_sequence_mask`' arguments; returns the advantages (B, T) and the mask as bool."""
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold (off_policy_mask_threshold, DeepSeek-V3.2's delta) must be a "
                         f"finite number >= 0, got {threshold}")
    _check_same_shape(logp=logp, sampler_logp=sampler_logp, mask=mask)
    if logp.dim() != 2:
        raise ValueError(f"logp, sampler_logp and mask must be (B, T), got shape "
                         f"{tuple(logp.shape)}")
    if advantages.shape == logp.shape[:1]:
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},) or (B, T) = "
                         f"{tuple(logp.shape)}, got {tuple(advantages.shape)}")
    mask = mask.bool()
    require_finite("logp", logp, mask=mask)
    require_finite("sampler_logp", sampler_logp, mask=mask)
    return advantages, mask


def _check_high_entropy(entropies, mask, top_entropy_quantile):
    """:func:`high_entropy_mask`' arguments; returns the mask as bool."""
    if not (isinstance(top_entropy_quantile, (int, float)) and 0.0 <= top_entropy_quantile <= 1.0):
        raise ValueError(f"top_entropy_quantile must be in [0, 1] (the share of tokens kept), got "
                         f"{top_entropy_quantile}")
    _check_same_shape(entropies=entropies, mask=mask)
    mask = mask.bool()
    require_finite("entropies", entropies, mask=mask)
    return mask


def _check_adaptive_entropy_coef(entropy_coef, entropy, entropy_target, entropy_coef_delta, entropy_coef_min,
                                 entropy_coef_max):
    """:func:`adaptive_entropy_coef`' arguments."""
    checked = (("entropy_coef", entropy_coef), ("entropy", entropy),
               ("entropy_target", entropy_target), ("entropy_coef_delta", entropy_coef_delta))
    for name, value in checked:
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
    if not 0.0 <= entropy_coef_min <= entropy_coef_max:
        raise ValueError(f"need 0 <= entropy_coef_min <= entropy_coef_max, got "
                         f"{entropy_coef_min} and {entropy_coef_max}")


def _check_token_covariance(logp, advantages, mask):
    """:func:`token_covariance`' arguments; returns the advantages (B, T) and the mask as bool."""
    if advantages.shape == logp.shape[:1]:
        advantages = advantages[:, None].expand_as(logp)
    _check_same_shape(logp=logp, advantages=advantages, mask=mask)
    mask = mask.bool()
    require_finite("logp", logp, mask=mask)
    require_finite("advantages", advantages, mask=mask)
    if not bool(mask.any()):
        raise ValueError("the mask is all zero: there is no token to take a covariance over")
    return advantages, mask


def _check_clip_cov_mask(covariance, mask, clip_cov_ratio, clip_cov_lb, clip_cov_ub, already_clipped):
    """:func:`clip_cov_mask`' arguments; returns the mask as bool."""
    if not 0.0 < clip_cov_ratio <= 1.0:
        raise ValueError(f"clip_cov_ratio must be in (0, 1] (the share of tokens cut), "
                         f"got {clip_cov_ratio}")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"need clip_cov_lb < clip_cov_ub, got {clip_cov_lb} and {clip_cov_ub}")
    _check_same_shape(covariance=covariance, mask=mask)
    mask = mask.bool()
    if already_clipped is not None:
        _check_same_shape(covariance=covariance, already_clipped=already_clipped)
    return mask


def _check_kl_cov_mask(covariance, mask, kl_cov_ratio):
    """:func:`kl_cov_mask`' arguments; returns the mask as bool."""
    if not 0.0 < kl_cov_ratio <= 1.0:
        raise ValueError(f"kl_cov_ratio must be in (0, 1] (the share of tokens penalised), "
                         f"got {kl_cov_ratio}")
    _check_same_shape(covariance=covariance, mask=mask)
    return mask.bool()


def _check_constant_normaliser(per_token, max_completion_length):
    """:func:`constant_normaliser`' arguments: L_max is at least the padded length T; returns L_max."""
    length = per_token.shape[1] if max_completion_length is None else max_completion_length
    if length < per_token.shape[1]:
        raise ValueError(f"max_completion_length {length} is shorter than the completions' padded "
                         "length "
                         f"{per_token.shape[1]}")
    return length


def _check_global_token_mean(mask, num_items_in_batch):
    """:func:`global_token_mean`' arguments: the token count is positive; returns it."""
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    if not count > 0:
        raise ValueError(f"num_items_in_batch must be positive, got {count}")
    return count


def _check_positive_example_nll(loss_mask, correct):
    """:func:`positive_example_nll`' arguments."""
    if correct.shape != loss_mask.shape[:1]:
        raise ValueError("correct must have one entry per row, shape "
                         f"{tuple(loss_mask.shape[:1])}, "
                         f"got {tuple(correct.shape)}")


def _check_value_loss(values, old_values, returns, mask, cliprange_value):
    """:func:`value_loss`' arguments; returns the mask as bool."""
    _check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    mask = mask.bool()
    if not bool(mask.any()):
        raise ValueError("the value-loss mask is all zero: there is no token to fit")
    if cliprange_value is not None and not cliprange_value > 0:
        raise ValueError(f"cliprange_value must be positive or None, got {cliprange_value}")
    for name, tensor in (("values", values), ("old_values", old_values), ("returns", returns)):
        require_finite(name, tensor, mask=mask)
    return mask


def _check_dpo(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, loss_type,
               label_smoothing):
    """:func:`dpo_loss`' arguments."""
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of {DPO_LOSS_TYPES}")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a positive finite number, got {beta!r}")
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing < 0.5):
        raise ValueError(f"label_smoothing must lie in [0, 0.5), got {label_smoothing!r}")
    if label_smoothing > 0 and loss_type not in ("sigmoid", "robust"):
        raise ValueError("label_smoothing applies to the 'sigmoid' and 'robust' losses, not "
                         f"{loss_type!r}")
    tensors = dict(chosen_logps=chosen_logps, rejected_logps=rejected_logps,
                   ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    _check_same_shape(**tensors)
    if chosen_logps.dim() != 1 or chosen_logps.numel() == 0:
        raise ValueError("DPO log-probs (chosen_logps, ...) must be (N,) with N >= 1, one per "
                         "pair, got "
                         f"{tuple(chosen_logps.shape)}")
    for name, x in tensors.items():
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} is not finite at {int((~torch.isfinite(x)).sum())} pairs")


# --- input checks ----------------------------------------------------------------------------------------------


def check_delta(delta, epsilon_high: float) -> None:
    """The two-sided clip's rule, for :func:`clipped_surrogate` and ``RLConfig``: δ > 1 + ε_high, finite."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) \
            or not delta > 1 + epsilon_high:
        raise ValueError(f"delta must be a finite number above 1 + epsilon_high = {1 + epsilon_high} (it caps "
                         f"the ratio of negative-advantage tokens above the clip range), got {delta!r}")


def check_sapo_temperatures(temperature_pos: float, temperature_neg: float) -> None:
    """SAPO's rule, for :func:`sapo_surrogate` and ``RLConfig``: both temperatures finite, at least
    ``SAPO_MIN_TEMPERATURE`` (the gate's 4 / τ overflows below)."""
    for name, value in (("sapo_temperature_pos", temperature_pos), ("sapo_temperature_neg", temperature_neg)):
        if not (math.isfinite(value) and value >= SAPO_MIN_TEMPERATURE):
            raise ValueError(f"{name} must be a positive finite number (at least {SAPO_MIN_TEMPERATURE}: "
                             f"the gate's 4 / temperature overflows below), got {value}")


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError("shape mismatch: " + ", ".join(f"{name} {shape}" for name, shape in shapes.items()))


def _check_accumulation(gradient_accumulation_steps) -> None:
    if not gradient_accumulation_steps >= 1:
        raise ValueError("gradient_accumulation_steps must be >= 1, got "
                         f"{gradient_accumulation_steps}")


def _check_right_padded(mask: torch.Tensor) -> None:
    """Each row's real tokens come first: a 0 followed by a 1 would end an episode and restart it."""
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        rows = (mask[:, 1:] & ~mask[:, :-1]).any(-1).nonzero().flatten().tolist()
        raise ValueError(f"mask must be right-padded (1s, then 0s) in every row; rows {rows[:5]} are not")


# --- DPO: the loss on preference pairs (chapter "Bradley–Terry and DPO") ----------------------------------------

DPO_LOSS_TYPES = ("sigmoid", "robust", "hinge", "ipo")


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses and implicit rewards: ``(losses, chosen_rewards, rejected_rewards)``,
    each (N,).

    The four inputs are (N,) sequence log-probs log π(y | x) of the chosen (y_w) and rejected (y_l)
    completions under the policy and under the frozen reference. With the log-ratio margin

        Δ = (chosen_logps − ref_chosen_logps) − (rejected_logps − ref_rejected_logps)

    and ε = ``label_smoothing``, the per-pair loss is (TRL's ``loss_type`` names):

    - ``"sigmoid"``: −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ); ε = 0 is plain DPO (the DPO loss equation of
      the chapter), ε > 0 is conservative DPO (cDPO, TRL ≤ 0.28 and OpenRLHF);
    - ``"robust"``: (−(1−ε)·log σ(βΔ) + ε·log σ(−βΔ)) / (1 − 2ε), unbiased under flipped labels
      (rDPO);
    - ``"hinge"``: relu(1 − βΔ) (SLiC);
    - ``"ipo"``: (Δ − 1/(2β))². IPO expects *length-averaged* log-probs (the caller divides each
      sequence log-prob by its completion length, as the IPO paper and TRL do); this function does
      not know the lengths.

    β multiplies the log-ratio margin exactly once (erratum E12).
    ``chosen_rewards = β·(chosen_logps − ref_chosen_logps)`` and ``rejected_rewards`` likewise are
    the implicit rewards TRL logs, detached (no gradient flows through them). Raises ValueError on
    mismatched shapes, non-finite log-probs, β ≤ 0, ε outside [0, 0.5) or an unknown
    ``loss_type``.
    """
    _check_dpo(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, loss_type,
               label_smoothing)
    chosen_logratios = chosen_logps - ref_chosen_logps  # log π_θ(y_w|x) − log π_ref(y_w|x)
    rejected_logratios = rejected_logps - ref_rejected_logps
    delta = chosen_logratios - rejected_logratios  # Δ: no β yet
    eps = float(label_smoothing)
    if loss_type == "sigmoid":
        losses = (-(1 - eps) * torch.nn.functional.logsigmoid(beta * delta)
                  - eps * torch.nn.functional.logsigmoid(-beta * delta))
    elif loss_type == "robust":
        losses = (-(1 - eps) * torch.nn.functional.logsigmoid(beta * delta)
                  + eps * torch.nn.functional.logsigmoid(-beta * delta)) / (1 - 2 * eps)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * delta)
    else:  # "ipo"
        losses = (delta - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    return losses, chosen_rewards, rejected_rewards


def __getattr__(name: str):
    """The loss's taxonomy and composer moved to :mod:`rlbook.losses`; these names still resolve here."""
    if name not in ("policy_loss", "LOSS_TYPES", "CLIPPED_LOSS_TYPES"):  # (not on every lookup, e.g. __path__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rlbook import losses

    moved = {"policy_loss": losses.policy_loss_of, "LOSS_TYPES": tuple(losses.LOSS_TYPES),
             "CLIPPED_LOSS_TYPES": losses.CLIPPED_LOSS_TYPES}
    return moved[name]
