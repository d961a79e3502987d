"""Losses and advantages of every LM algorithm in the book: small pure tensor functions, one idea each.

Shapes: ``B`` completions (rows), ``T`` padded completion length (columns). A ``mask`` (B, T) is 1 on the
completion's real tokens (EOS included) and 0 on right padding; a row is one episode. Nothing here has state:
tensors in, tensors out. The trainer composes them; the chapters derive them (equation numbers as in the book).

Names follow TRL where TRL has the concept (``epsilon``, ``epsilon_high``, ``beta``, ``loss_type``,
``max_completion_length``, ``num_items_in_batch``), and each docstring says which denominator is meant, because
the libraries disagree about it (``../shared/reference/libraries.md``, section 6).
"""

from __future__ import annotations

import math

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "gmpo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
KL_KINDS = ("k1", "k2", "k3")


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
    """Per-token estimate of KL(π ‖ π_ref) from tokens sampled from π (Schulman's k1, k2, k3), shape of ``logp``.

    With ``δ = ref_logp − logp`` (the log-ratio π_ref/π at the sampled token):
    k1 = −δ (unbiased, can be negative); k2 = ½δ² (biased, ≥ 0, low variance); k3 = e^δ − δ − 1 (unbiased
    and ≥ 0, since E_π[e^δ] = 1 and e^x ≥ 1 + x). GRPO puts β·k3 in its loss.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_KINDS}")
    _check_same_shape(logp=logp, ref_logp=ref_logp)
    delta = ref_logp - logp
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta**2
    return torch.expm1(delta) - delta  # e^δ − 1 − δ, with expm1 for accuracy when δ ≈ 0


# --- advantages ------------------------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over right-padded rows: ``(advantages, returns)``, each (B, T).

        δ_t = r_t + γ V_{t+1} − V_t      (V = 0 after a row's last real token: the episode ends there)
        A_t = δ_t + γλ A_{t+1} = Σ_k (γλ)^k δ_{t+k}
        returns = A + V                 (the value model's regression target)

    ``lam`` is a float or a per-row tensor (B,) (VAPO's length-adaptive λ). Both outputs are 0 on padding.
    Computed without a loop over time steps: ``A = δ M`` with the upper-triangular discount matrix
    ``M[s, t] = (γλ)^(t−s)`` for ``t ≥ s`` (memory B·T² for a per-row λ, T² otherwise).
    """
    _check_same_shape(rewards=rewards, values=values, mask=mask)
    if rewards.dim() != 2:
        raise ValueError(f"rewards, values and mask must be (B, T), got shape {tuple(rewards.shape)}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    mask = mask.bool()
    _check_right_padded(mask)
    _check_finite("rewards", rewards, mask)
    _check_finite("values", values, mask)
    lam = torch.as_tensor(lam, dtype=rewards.dtype, device=rewards.device)
    if lam.dim() not in (0, 1) or (lam.dim() == 1 and lam.shape[0] != rewards.shape[0]):
        raise ValueError(f"lam must be a float or a (B,) = ({rewards.shape[0]},) tensor, got shape {tuple(lam.shape)}")
    if not bool(((lam >= 0) & (lam <= 1)).all()):
        raise ValueError(f"lam must lie in [0, 1], got {lam.tolist()}")

    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    rewards, values = torch.where(mask, rewards, zero), torch.where(mask, values, zero)
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)  # padding is already 0
    deltas = rewards + gamma * next_values - values  # (B, T), 0 on padding

    T = rewards.shape[1]
    steps = torch.arange(T, device=rewards.device)
    lag = steps[None, :] - steps[:, None]  # lag[s, t] = t − s
    decay = (gamma * lam).reshape(-1, 1, 1)  # (1 or B, 1, 1)
    discount = torch.where(lag >= 0, decay ** lag.clamp(min=0).to(rewards.dtype), zero)  # (1 or B, T, T)
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
    """Advantages from a group baseline: rewards (N·G,) in contiguous groups of ``num_generations`` → (N·G,).

    - ``"group"`` (GRPO): (r − group mean) / (group std + eps), std unbiased (n − 1), eps = 1e-4 as in TRL;
    - ``"batch"``: group mean, but the std of the whole batch;
    - ``"none"`` (Dr. GRPO, and REINFORCE with a group-mean baseline): r − group mean.

    ``keep_mask`` (N·G,) bool (GFPO's filtering): means and stds over the kept completions only, and advantage 0
    for the others. A group whose (kept) rewards are all equal gets advantage 0, never NaN: it carries no signal
    about which completion is better.
    """
    G = _check_groups(rewards, num_generations)
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; choose 'group', 'batch' or 'none'")
    if scale_rewards != "none" and G < 2:
        raise ValueError(f"scale_rewards={scale_rewards!r} needs num_generations >= 2 for a standard deviation, got {G}")
    if keep_mask is None:
        keep = torch.ones_like(rewards)
    else:
        if keep_mask.shape != rewards.shape:
            raise ValueError(f"keep_mask must have the rewards' shape {tuple(rewards.shape)}, got {tuple(keep_mask.shape)}")
        keep = keep_mask.to(rewards.dtype)
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
    return (centred / (std + eps)).flatten()


def leave_one_out_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """RLOO: each completion's baseline is the mean reward of the *other* G − 1 completions of its prompt,
    r_i − (Σ_{j≠i} r_j)/(G − 1) = G/(G − 1) · (r_i − group mean); rewards (N·G,) → (N·G,).

    Unlike the plain group mean, the baseline does not depend on r_i itself, so the gradient estimate stays
    unbiased.
    """
    G = _check_groups(rewards, num_generations)
    if G < 2:
        raise ValueError(f"a leave-one-out baseline needs num_generations >= 2, got {G}")
    return group_advantages(rewards, G, scale_rewards="none") * (G / (G - 1))


def gfpo_keep_mask(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    num_generations: int,
    k: int | torch.Tensor,
    metric: str = "length",
) -> torch.Tensor:
    """GFPO's filter: keep ``k`` of each group's G completions, (N·G,) bool.

    ``metric="length"`` keeps the k shortest; ``"token_efficiency"`` the k with the highest reward per token
    (r_i / |o_i|). Ties go to the earlier completion. ``k`` is one number, or one per group (N,) (see
    :func:`gfpo_adaptive_k`). The advantages are then computed over the kept ones only
    (``group_advantages(..., keep_mask=...)``), and the others get 0.
    """
    G = _check_groups(rewards, num_generations)
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths must have the rewards' shape {tuple(rewards.shape)}, got {tuple(lengths.shape)}")
    if metric not in ("length", "token_efficiency"):
        raise ValueError(f"unknown GFPO metric {metric!r}; choose 'length' or 'token_efficiency'")
    N = rewards.numel() // G
    k = torch.as_tensor(k, device=rewards.device).expand(N)
    if bool(((k < 1) | (k > G)).any()):
        raise ValueError(f"k must lie in [1, num_generations = {G}] for every group, got {k.tolist()}")
    if metric == "length":
        score = -lengths.to(torch.float64)  # higher is better: shorter
    else:
        score = rewards.to(torch.float64) / lengths.to(torch.float64).clamp(min=1)
    order = torch.sort(score.view(N, G), dim=-1, descending=True, stable=True).indices  # best first
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(G, device=order.device).expand(N, G))
    return (rank < k[:, None]).flatten()


def gfpo_adaptive_k(rewards: torch.Tensor, num_generations: int, k_by_difficulty=(4, 6, 8, 8)) -> torch.Tensor:
    """GFPO's Adaptive Difficulty: more survivors for harder prompts, (N,) long.

    Difficulty is the group's mean reward, ranked within the batch into as many buckets as ``k_by_difficulty``
    has entries (quartiles by default), from easiest (highest mean reward) to hardest. The paper estimates
    difficulty on the fly without giving the formula in what we could read; this bucketing is our assumption.
    """
    G = _check_groups(rewards, num_generations)
    k_values = torch.as_tensor(k_by_difficulty, device=rewards.device)
    if bool(((k_values < 1) | (k_values > G)).any()):
        raise ValueError(f"every k must lie in [1, num_generations = {G}], got {list(k_by_difficulty)}")
    means = rewards.view(-1, G).mean(-1)
    N = means.numel()
    easiest_first = torch.sort(-means, stable=True).indices
    rank = torch.empty_like(easiest_first).scatter_(0, easiest_first, torch.arange(N, device=means.device))
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
    """λ-GRPO's softmax weights w (N·G,), which sum to 1 over each group (see :func:`lambda_grpo_weights`).

    Within a group of completion lengths |o_1|, …, |o_G| (contiguous groups of ``num_generations``):

        z_i = (|o_i| − mean|o|) / (std|o| + eps)    (std unbiased, n − 1, as in :func:`group_advantages`)
        h_i = max(1 + r · z_i, h_min)
        w_i = softmax_i(h_i^λ) = exp(h_i^λ) / Σ_j exp(h_j^λ)

    ``r`` is the paper's name for the lift's slope (the book writes ξ, r being the reward there, and d_i for
    z_i). Differentiable in ``lam`` and ``r`` (pass tensors that require grad). λ = 0 gives h^0 = 1 and uniform
    weights 1/G; with r > 0, λ > 0 puts more weight on the longer completions of a group and λ < 0 on the
    shorter ones. A group of equal lengths has z = 0 and uniform weights for every λ.

    ``h_min`` is our assumption: h^λ is undefined for h ≤ 0 and non-integer λ, and what the paper does there was
    not found. |z_i| ≤ (G − 1)/√G within a group, so r < √G/(G − 1) (0.40 for G = 8) never reaches the floor.
    """
    if lengths.dim() != 1 or num_generations < 1 or lengths.numel() == 0 or lengths.numel() % num_generations:
        raise ValueError(f"lengths must be one per completion, (N*G,), in groups of num_generations="
                         f"{num_generations}; got shape {tuple(lengths.shape)}")
    G = num_generations
    if G < 2:
        raise ValueError(f"lambda_grpo weights need num_generations >= 2 for a length std, got {G}")
    lam = torch.as_tensor(lam, dtype=torch.float32, device=lengths.device)
    r = torch.as_tensor(r, dtype=torch.float32, device=lengths.device)
    if lam.dim() or r.dim():
        raise ValueError(f"lam and r must be scalars, got shapes {tuple(lam.shape)} and {tuple(r.shape)}")
    if not (bool(torch.isfinite(lam)) and bool(torch.isfinite(r))):
        raise ValueError(f"lam and r must be finite, got {lam.item()} and {r.item()}")
    if not eps > 0 or not h_min > 0:
        raise ValueError(f"eps and h_min must be positive, got {eps} and {h_min}")
    if not bool(torch.isfinite(lengths.to(torch.float32)).all()):
        raise ValueError(f"lengths must be finite, got {lengths.tolist()[:8]}")
    if bool((lengths < 1).any()):
        rows = (lengths < 1).nonzero().flatten().tolist()
        raise ValueError(f"completions {rows[:5]} have no token (an all-masked row): every length must be >= 1")
    groups = lengths.to(torch.float32).view(-1, G)
    z = (groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True) + eps)
    h = (1 + r * z).clamp(min=h_min)
    return torch.softmax(h**lam, dim=-1).flatten()


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
    response_weights=f)``): every token of completion i carries the weight f_i. λ = 0 gives f = 1, which is
    DAPO's token mean exactly; GRPO (f_i ∝ 1/|o_i|) and Dr. GRPO (f_i constant per batch) are other choices of
    f. See :func:`lambda_grpo_softmax` for w, the length standardisation and the floor ``h_min``.
    """
    return num_generations * lambda_grpo_softmax(lengths, num_generations, lam, r, eps, h_min)


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

        r_t = −β · k_t(π ‖ π_ref)  at every completion token,  plus the sequence's ``score`` at its last token,

    so each row sums to score − β Σ_t k_t and padding gets 0. ``scores`` (B,) come from a reward model or a rule;
    ``kl_kind`` is the per-token estimator (k1 in InstructGPT and by default in TRL's PPO). verl, OpenRLHF and we
    put the score at the last real token; TRL's PPO puts it one position later.
    """
    if beta < 0 or not math.isfinite(beta):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    _check_same_shape(logp=logp, ref_logp=ref_logp, mask=mask)
    mask = mask.bool()
    if scores.shape != logp.shape[:1]:
        raise ValueError(f"scores must be one per row, shape ({logp.shape[0]},), got {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"scores must be finite, got {scores.tolist()}")
    lengths = mask.sum(-1)
    if not bool((lengths > 0).all()):
        raise ValueError(f"every row needs at least one completion token; rows {(lengths == 0).nonzero().flatten().tolist()} have none")
    _check_right_padded(mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    kl = torch.where(mask, kl_estimate(torch.where(mask, logp, zero), torch.where(mask, ref_logp, zero), kl_kind), zero)
    rewards = -beta * kl
    rewards[torch.arange(len(scores), device=scores.device), lengths - 1] += scores.to(rewards.dtype)
    return rewards


def adaptive_kl_coef(beta: float, kl: float, target: float, num_samples: int, horizon: int = 10_000) -> float:
    """The adaptive KL controller of Ziegler et al. (2019), as TRL and OpenRLHF implement it: the next β.

        e = clip(KL / target − 1, −0.2, 0.2),    β ← β · (1 + e · num_samples / horizon)

    β grows while the measured KL (to the reference, per sequence) exceeds the target and shrinks below it, by at
    most 20 % per ``horizon`` samples. Implementation practice, not part of the PPO paper.
    """
    if not target > 0 or not horizon > 0 or num_samples < 0:
        raise ValueError(f"target and horizon must be positive and num_samples >= 0, got {target}, {horizon}, {num_samples}")
    if not math.isfinite(kl):
        raise ValueError(f"the measured KL must be finite, got {kl}")
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * num_samples / horizon)


def length_adaptive_lam(lengths: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    """VAPO's length-adaptive λ for the policy's GAE, one per row: λ = 1 − 1/(α·l) for a completion of l tokens.

    Long completions get λ close to 1 (little bias from bootstrapping over many tokens), short ones a smaller λ
    (less variance). The formula is negative for α·l < 1, where the paper is silent; we clamp λ to [0, 1], so a
    completion shorter than 1/α tokens uses λ = 0 (one-step TD), which is the formula's limit at α·l = 1.
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    lengths = lengths.to(torch.float64)
    if bool((lengths <= 0).any()):
        raise ValueError(f"lengths must be positive, got {lengths.tolist()}")
    return (1.0 - 1.0 / (alpha * lengths)).clamp(min=0.0, max=1.0).to(torch.float32)


# --- the policy loss -------------------------------------------------------------------------------------------


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "bnpo",
    max_completion_length: int | None = None,
    num_items_in_batch: int | float | None = None,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    importance_sampling_level: str = "token",
    response_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate (PPO-Clip) with an optional in-loss KL term, aggregated as ``loss_type``.

    Per token, with ρ = exp(logp − old_logp) and ε_high = ε unless given:

        ℓ_t = −min(ρ_t A_t, clip(ρ_t, 1 − ε, 1 + ε_high) A_t) + β · k3_t(π ‖ π_ref)

    ``advantages`` are per token (B, T) (PPO with GAE) or per completion (B,) (the group methods), broadcast over
    tokens. Aggregation over the masked tokens, named as in TRL:

    - ``"grpo"``: mean over rows of Σ_t m ℓ / max(|o_i|, 1) (each completion weighs the same);
    - ``"bnpo"``: Σ m ℓ / max(Σ m, 1) (a token mean over this batch);
    - ``"dr_grpo"``: Σ m ℓ / (B · max_completion_length) (a constant; ``max_completion_length`` defaults to T);
    - ``"dapo"``: Σ m ℓ / num_items_in_batch, where ``num_items_in_batch`` (default Σ m) is the token count of the
      *whole* batch when this call sees one micro-batch of it, so that summed micro-batch gradients equal the
      gradient of the global token mean.

    ``importance_sampling_level`` (TRL's name) chooses the ratio:

    - ``"token"``: ρ_t = exp(logp_t − old_logp_t), one per token (PPO, GRPO, DAPO);
    - ``"sequence"`` (GSPO): s_i = exp(Σ_t m (logp − old_logp) / |o_i|) for every token of row i, the geometric
      mean of the token ratios, with the gradient flowing through the mean;
    - ``"sequence_token"`` (GSPO-token): w_t = exp(logp_t − sg(logp_t) + sg(log s_i)): the value s_i, the gradient
      of logp_t scaled by s_i; with a per-completion advantage it equals ``"sequence"`` in value and gradient.

    ``loss_type="gmpo"`` (GMPO) replaces the arithmetic mean of clipped token ratios by a geometric one: per row,
    Δ_t = logp_t − old_logp_t is clipped in log space, by the sign of the row's advantage A_i (A > 0:
    min(Δ, clip(Δ, −ε, ε_high)); A ≤ 0: max(Δ, clip(Δ, −ε, ε_high))), and the loss is
    mean_i(−A_i · exp(Σ_t m Δ̃_t / |o_i|)) (+ β · mean_i of the row's mean k3). Here ε is in log space (0.4 in GMPO).
    Sequence-level ratios and GMPO need at least one token in every row.

    ``response_weights`` (B,) ≥ 0 (λ-GRPO) multiply every token's loss of row i by f_i before the aggregation:
    with ``loss_type="dapo"`` the loss is Σ_i f_i Σ_t m ℓ_{i,t} / ``num_items_in_batch``, and with
    ``num_items_in_batch=1`` the bare Σ_i f_i Σ_t m ℓ_{i,t}, the one formula of which GRPO (f_i = 1/(B|o_i|)),
    DAPO (f_i = 1/Σ_j |o_j|) and Dr. GRPO (f_i = 1/(B · L_max)) are special cases. Gradients flow into the
    weights (λ-GRPO learns its λ through them). Not with ``"gmpo"``.

    Returns ``(loss, metrics)``; the metrics are detached floats over the masked tokens: ``clip_frac_low``
    (ρ < 1 − ε with A < 0), ``clip_frac_high`` (ρ > 1 + ε_high with A > 0), ``clip_frac`` (their sum: the tokens
    whose gradient the clip removes), ``approx_kl`` (k3 estimate of KL(π_old ‖ π_θ)), ``ratio_min/max/mean``, and
    ``kl_ref`` (mean k3 to the reference) when β > 0.
    """
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; choose one of {LOSS_TYPES}")
    if not epsilon > 0 or not epsilon_high > 0:
        raise ValueError(f"epsilon and epsilon_high must be positive, got {epsilon} and {epsilon_high}")
    if epsilon >= 1 and loss_type != "gmpo":  # GMPO's epsilon is in log space
        raise ValueError(f"epsilon must be below 1 (the ratio's lower clip 1 - epsilon must stay positive), got {epsilon}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"unknown importance_sampling_level {importance_sampling_level!r}; "
                         f"choose one of {IMPORTANCE_SAMPLING_LEVELS}")
    if beta < 0 or not math.isfinite(beta):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    _check_same_shape(logp=logp, old_logp=old_logp, mask=mask)
    if logp.dim() != 2:
        raise ValueError(f"logp, old_logp and mask must be (B, T), got shape {tuple(logp.shape)}")
    mask = mask.bool()
    if not bool(mask.any()):
        raise ValueError("the loss mask is all zero: there is no completion token to learn from")
    if advantages.shape == logp.shape[:1]:
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},) or (B, T) = {tuple(logp.shape)}, "
                         f"got {tuple(advantages.shape)}")
    _check_finite("logp", logp, mask)
    _check_finite("old_logp", old_logp, mask)
    _check_finite("advantages", advantages, mask)
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp, the reference policy's log-probs of the same tokens")
        _check_same_shape(logp=logp, ref_logp=ref_logp)
        _check_finite("ref_logp", ref_logp, mask)

    if response_weights is not None:
        if loss_type == "gmpo":
            raise ValueError("response_weights weigh token losses; GMPO's loss is per row (use another loss_type)")
        if response_weights.shape != logp.shape[:1]:
            raise ValueError(f"response_weights must be (B,) = ({logp.shape[0]},), got {tuple(response_weights.shape)}")
        if not bool(torch.isfinite(response_weights).all()) or bool((response_weights < 0).any()):
            raise ValueError(f"response_weights must be finite and >= 0, got {response_weights.tolist()[:8]}")

    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    log_ratio = torch.where(mask, logp - old_logp, zero)  # padding may hold garbage: keep it out of exp
    lengths = mask.sum(-1)
    if (importance_sampling_level != "token" or loss_type == "gmpo") and not bool((lengths > 0).all()):
        rows = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows[:5]} have no masked token: a sequence-level ratio needs at least one")
    if importance_sampling_level == "sequence":
        log_ratio = (masked_sum(log_ratio, mask, dim=-1) / lengths)[:, None].expand_as(logp)
    elif importance_sampling_level == "sequence_token":
        sequence = (masked_sum(log_ratio, mask, dim=-1) / lengths).detach()
        log_ratio = torch.where(mask, logp - logp.detach() + sequence[:, None], zero)
    ratio = torch.exp(log_ratio)
    kl_ref = kl_estimate(logp, torch.where(mask, ref_logp, logp)) if beta > 0 else None
    if loss_type == "gmpo":
        loss, low, high = _gmpo_loss(log_ratio, advantages, mask, epsilon, epsilon_high)
        if beta > 0:
            loss = loss + beta * masked_mean(kl_ref, mask, dim=-1).mean()
    else:
        clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
        per_token = -torch.minimum(ratio * advantages, clipped * advantages)
        if beta > 0:
            per_token = per_token + beta * kl_ref
        if response_weights is not None:
            per_token = per_token * response_weights[:, None]
        loss = _aggregate(per_token, mask, loss_type, max_completion_length, num_items_in_batch)
        low = (ratio < 1 - epsilon) & (advantages < 0)
        high = (ratio > 1 + epsilon_high) & (advantages > 0)

    with torch.no_grad():
        metrics = {
            "clip_frac_low": masked_mean(low.float(), mask).item(),
            "clip_frac_high": masked_mean(high.float(), mask).item(),
            "clip_frac": masked_mean((low | high).float(), mask).item(),
            "approx_kl": masked_mean(kl_estimate(old_logp, torch.where(mask, logp, old_logp)), mask).item(),
            "ratio_min": ratio[mask].min().item(),
            "ratio_max": ratio[mask].max().item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
        if beta > 0:
            metrics["kl_ref"] = masked_mean(kl_ref, mask).item()
    return loss, metrics


def _gmpo_loss(log_ratio, advantages, mask, epsilon, epsilon_high):
    """GMPO's loss (see :func:`policy_loss`) and its clip indicators (log space), per token (B, T)."""
    row_advantage = masked_mean(advantages, mask, dim=-1)  # constant over a row for the group methods
    positive = (row_advantage > 0)[:, None]
    clipped = torch.clamp(log_ratio, -epsilon, epsilon_high)
    delta = torch.where(positive, torch.minimum(log_ratio, clipped), torch.maximum(log_ratio, clipped))
    geometric_mean_ratio = torch.exp(masked_sum(delta, mask, dim=-1) / mask.sum(-1))
    loss = (-row_advantage * geometric_mean_ratio).mean()
    low = (log_ratio < -epsilon) & ~positive
    high = (log_ratio > epsilon_high) & positive
    return loss, low, high


def _aggregate(per_token, mask, loss_type, max_completion_length, num_items_in_batch) -> torch.Tensor:
    """Reduce the (B, T) per-token loss to a scalar with ``loss_type``'s denominator (see :func:`policy_loss`)."""
    if loss_type == "grpo":
        lengths = mask.sum(-1).clamp(min=1)
        return (masked_sum(per_token, mask, dim=-1) / lengths).mean()
    total = masked_sum(per_token, mask)
    if loss_type == "bnpo":
        return total / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        length = per_token.shape[1] if max_completion_length is None else max_completion_length
        if length < per_token.shape[1]:
            raise ValueError(f"max_completion_length {length} is shorter than the completions' padded length "
                             f"{per_token.shape[1]}")
        return total / (per_token.shape[0] * length)
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    if not count > 0:
        raise ValueError(f"num_items_in_batch must be positive, got {count}")
    return total / count


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float | None = None,
) -> torch.Tensor:
    """½ · masked mean of max((V − R)², (clip(V, V_old − c, V_old + c) − R)²), all (B, T).

    The clipped branch (PPO's value clipping, c = ``clip_range_value``) stops the value model from moving far
    from the values it had when the rollout was scored; ``None`` gives the plain ½ (V − R)².
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    mask = mask.bool()
    if not bool(mask.any()):
        raise ValueError("the value-loss mask is all zero: there is no token to fit")
    if clip_range_value is not None and not clip_range_value > 0:
        raise ValueError(f"clip_range_value must be positive or None, got {clip_range_value}")
    for name, tensor in (("values", values), ("old_values", old_values), ("returns", returns)):
        _check_finite(name, tensor, mask)
    squared = (values - returns) ** 2
    if clip_range_value is not None:
        clipped = old_values + (values - old_values).clamp(-clip_range_value, clip_range_value)
        squared = torch.maximum(squared, (clipped - returns) ** 2)
    return 0.5 * masked_mean(squared, mask)


# --- input checks ----------------------------------------------------------------------------------------------


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError("shape mismatch: " + ", ".join(f"{name} {shape}" for name, shape in shapes.items()))


def _check_finite(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    bad = ~torch.isfinite(x) & mask.bool()
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} is not finite at {int(bad.sum())} masked entries (first at row {row}, token "
                         f"{col}: {x[row, col].item()})")


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
    """Per-pair DPO losses and implicit rewards: ``(losses, chosen_rewards, rejected_rewards)``, each (N,).

    The four inputs are (N,) sequence log-probs log π(y | x) of the chosen (y_w) and rejected (y_l) completions
    under the policy and under the frozen reference. With the log-ratio margin

        Δ = (chosen_logps − ref_chosen_logps) − (rejected_logps − ref_rejected_logps)

    and ε = ``label_smoothing``, the per-pair loss is (TRL's ``loss_type`` names):

    - ``"sigmoid"``: −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ); ε = 0 is plain DPO (the DPO loss equation of the
      chapter), ε > 0 is conservative DPO (cDPO, TRL ≤ 0.28 and OpenRLHF);
    - ``"robust"``: (−(1−ε)·log σ(βΔ) + ε·log σ(−βΔ)) / (1 − 2ε), unbiased under flipped labels (rDPO);
    - ``"hinge"``: relu(1 − βΔ) (SLiC);
    - ``"ipo"``: (Δ − 1/(2β))². IPO expects *length-averaged* log-probs (the caller divides each sequence
      log-prob by its completion length, as the IPO paper and TRL do); this function does not know the lengths.

    β multiplies the log-ratio margin exactly once (erratum E12). ``chosen_rewards = β·(chosen_logps −
    ref_chosen_logps)`` and ``rejected_rewards`` likewise are the implicit rewards TRL logs, detached (no
    gradient flows through them). Raises ValueError on mismatched shapes, non-finite log-probs, β ≤ 0,
    ε outside [0, 0.5) or an unknown ``loss_type``.
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of {DPO_LOSS_TYPES}")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a positive finite number, got {beta!r}")
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing < 0.5):
        raise ValueError(f"label_smoothing must lie in [0, 0.5), got {label_smoothing!r}")
    if label_smoothing > 0 and loss_type not in ("sigmoid", "robust"):
        raise ValueError(f"label_smoothing applies to the 'sigmoid' and 'robust' losses, not {loss_type!r}")
    tensors = dict(chosen_logps=chosen_logps, rejected_logps=rejected_logps,
                   ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    _check_same_shape(**tensors)
    if chosen_logps.dim() != 1 or chosen_logps.numel() == 0:
        raise ValueError(f"DPO log-probs must be (N,) with N >= 1 (one per pair), got {tuple(chosen_logps.shape)}")
    for name, x in tensors.items():
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} is not finite at {int((~torch.isfinite(x)).sum())} pairs")

    chosen_logratios = chosen_logps - ref_chosen_logps  # log π_θ(y_w|x) − log π_ref(y_w|x)
    rejected_logratios = rejected_logps - ref_rejected_logps
    delta = chosen_logratios - rejected_logratios  # Δ: no β yet
    eps = float(label_smoothing)
    if loss_type == "sigmoid":
        losses = -(1 - eps) * torch.nn.functional.logsigmoid(beta * delta) - eps * torch.nn.functional.logsigmoid(-beta * delta)
    elif loss_type == "robust":
        losses = (-(1 - eps) * torch.nn.functional.logsigmoid(beta * delta) + eps * torch.nn.functional.logsigmoid(-beta * delta)) / (1 - 2 * eps)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * delta)
    else:  # "ipo"
        losses = (delta - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    return losses, chosen_rewards, rejected_rewards
