"""rlbook.objectives.dpo_loss (every loss type against its formula, gradient weight, errors, TRL cross-check)
and the DPO loop rlbook.dpo (reference computed once, TRL metrics, learning on a tiny model)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rlbook.objectives import DPO_LOSS_TYPES, dpo_loss

AGREE = 1e-6  # float32, the same operations in another order


def _logps(seed, n=64):
    g = torch.Generator().manual_seed(seed)
    return [-10 * torch.rand(n, generator=g) for _ in range(4)]  # log-probs of sequences: negative


def _reference(kind, delta, beta, eps):
    """The issue's formulas, written out with math on floats."""
    def log_sigmoid(z):
        return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))
    if kind == "sigmoid":
        return -(1 - eps) * log_sigmoid(beta * delta) - eps * log_sigmoid(-beta * delta)
    if kind == "robust":
        return (-(1 - eps) * log_sigmoid(beta * delta) + eps * log_sigmoid(-beta * delta)) / (1 - 2 * eps)
    if kind == "hinge":
        return max(0.0, 1 - beta * delta)
    return (delta - 1 / (2 * beta)) ** 2


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.05, 0.5, 2.0])
def test_each_loss_type_equals_its_formula(loss_type, beta):
    eps = 0.2 if loss_type in ("sigmoid", "robust") else 0.0
    cw, cl, rw, rl = _logps(int(beta * 100))
    losses, chosen_rewards, rejected_rewards = dpo_loss(cw, cl, rw, rl, beta=beta, loss_type=loss_type,
                                                        label_smoothing=eps)
    assert losses.shape == (64,)
    delta = ((cw - rw) - (cl - rl)).double()
    expected = torch.tensor([_reference(loss_type, float(d), beta, eps) for d in delta], dtype=torch.float32)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chosen_rewards, beta * (cw - rw), rtol=AGREE, atol=AGREE)
    torch.testing.assert_close(rejected_rewards, beta * (cl - rl), rtol=AGREE, atol=AGREE)


def test_sigmoid_is_log2_at_zero_margin_and_beta_appears_once():
    x = torch.full((5,), -3.0)
    losses, _, _ = dpo_loss(x, x - 1, x, x - 1)  # equal log-ratios: Δ = 0
    torch.testing.assert_close(losses, torch.full((5,), math.log(2)), rtol=AGREE, atol=AGREE)
    # E12: β multiplies Δ once; a β² version would give -log σ(0.01 · 1) at β = 0.1, Δ = 1.
    one = torch.tensor([1.0])
    zero = torch.tensor([0.0])
    loss, _, _ = dpo_loss(one, zero, zero, zero, beta=0.1)
    assert math.isclose(loss.item(), -F.logsigmoid(torch.tensor(0.1)).item(), rel_tol=1e-6)


def test_rewards_are_detached_and_loss_has_gradient():
    cw, cl, rw, rl = (t.requires_grad_() for t in _logps(1, 8))
    losses, chosen_rewards, rejected_rewards = dpo_loss(cw, cl, rw, rl)
    assert not chosen_rewards.requires_grad and not rejected_rewards.requires_grad
    assert losses.requires_grad


def test_gradient_weight_is_sigmoid_of_reversed_reward_gap_and_largest_on_misranked_pairs():
    beta = 0.5
    cw, cl, rw, rl = _logps(2, 32)
    cw = cw.clone().requires_grad_()
    losses, r_w, r_l = dpo_loss(cw, cl, rw, rl, beta=beta)
    losses.sum().backward()
    # d loss / d log π(y_w) = -β σ(r_l - r_w): eq. of the DPO gradient in the chapter
    torch.testing.assert_close(cw.grad, -beta * torch.sigmoid(r_l - r_w), rtol=1e-5, atol=1e-6)
    weight = -cw.grad / beta
    misranked = r_l > r_w
    assert bool(misranked.any()) and bool((~misranked).any())
    assert weight[misranked].min() > 0.5 > weight[~misranked].max()


def test_rejected_gradient_is_opposite():
    cw, cl, rw, rl = _logps(3, 16)
    cl = cl.clone().requires_grad_()
    cw2 = cw.clone().requires_grad_()
    dpo_loss(cw2, cl, rw, rl)[0].sum().backward()
    torch.testing.assert_close(cl.grad, -cw2.grad, rtol=AGREE, atol=AGREE)


@pytest.mark.parametrize("bad, message", [
    (dict(beta=0.0), "beta"), (dict(beta=-1.0), "beta"), (dict(beta=float("nan")), "beta"),
    (dict(label_smoothing=0.5), "label_smoothing"), (dict(label_smoothing=-0.1), "label_smoothing"),
    (dict(loss_type="kto"), "loss_type"), (dict(loss_type="hinge", label_smoothing=0.1), "label_smoothing"),
])
def test_bad_arguments_raise(bad, message):
    x = torch.zeros(3)
    with pytest.raises(ValueError, match=message):
        dpo_loss(x, x, x, x, **bad)


def test_bad_tensors_raise():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="shape mismatch"):
        dpo_loss(x, torch.zeros(4), x, x)
    with pytest.raises(ValueError, match="not finite"):
        dpo_loss(torch.tensor([0.0, float("nan"), 0.0]), x, x, x)
    with pytest.raises(ValueError, match="not finite"):
        dpo_loss(x, x, x, torch.tensor([0.0, -float("inf"), 0.0]))
    with pytest.raises(ValueError, match=r"\(N,\)"):
        dpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))


# --- cross-check against TRL's DPOTrainer._compute_loss (skipped without trl) ---------------------------------


class _Accelerator:
    device = torch.device("cpu")

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather


def _trl_loss(loss_type, beta, eps, chosen_tok, rejected_tok, ref_chosen, ref_rejected, mask):
    """TRL's loss on per-token log-probs (2N, L-1) laid out [chosen; rejected], with its references given
    (``precompute_ref_logps``), called unbound on a stand-in that carries only what ``_compute_loss`` reads."""
    from trl import DPOTrainer

    per_token = torch.cat([chosen_tok, rejected_tok])
    two_n, width = per_token.shape
    outputs = SimpleNamespace(log_probs=per_token, entropy=torch.zeros(two_n, width),
                              mean_logits=torch.zeros(two_n, width), is_top1=torch.zeros(two_n, width, dtype=bool))
    model = lambda **kw: outputs  # noqa: E731
    stand_in = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_Accelerator(), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0],
        beta=beta, label_smoothing=eps, use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0, _tp_size=1,
    )
    full_mask = torch.cat([torch.zeros(two_n, 1, dtype=torch.long), mask.long()], dim=1)  # (2N, L)
    inputs = {"input_ids": torch.ones_like(full_mask), "attention_mask": torch.ones_like(full_mask),
              "completion_mask": full_mask, "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    loss = DPOTrainer._compute_loss(stand_in, model, inputs, return_outputs=False)
    return loss, {k: v[-1] for k, v in stand_in._metrics["train"].items()}


@pytest.mark.parametrize("loss_type, eps", [("sigmoid", 0.0), ("hinge", 0.0), ("ipo", 0.0), ("robust", 0.1)])
def test_dpo_loss_equals_trls(loss_type, eps):
    pytest.importorskip("trl")
    g = torch.Generator().manual_seed(7)
    n, width, beta = 16, 9, 0.3
    lengths = torch.randint(1, width + 1, (2 * n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()  # (2N, W): right-padded completions
    per_token = -2 * torch.rand(2 * n, width, generator=g) * mask
    ref_chosen, ref_rejected = -8 * torch.rand(n, generator=g), -8 * torch.rand(n, generator=g)
    trl_loss, trl_metrics = _trl_loss(loss_type, beta, eps, per_token[:n], per_token[n:], ref_chosen, ref_rejected,
                                      mask)
    chosen, rejected = per_token[:n].sum(-1), per_token[n:].sum(-1)
    rc, rr = ref_chosen, ref_rejected
    if loss_type == "ipo":  # the caller averages over each completion's tokens
        chosen, rc = chosen / lengths[:n], rc / lengths[:n]
        rejected, rr = rejected / lengths[n:], rr / lengths[n:]
    losses, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, rc, rr, beta=beta, loss_type=loss_type,
                                                        label_smoothing=eps)
    assert math.isclose(losses.mean().item(), trl_loss.item(), rel_tol=1e-5, abs_tol=1e-6)
    if loss_type != "ipo":  # TRL logs rewards of the summed log-ratios, whatever the loss
        assert math.isclose(chosen_rewards.mean().item(), trl_metrics["rewards/chosen"], rel_tol=1e-5, abs_tol=1e-6)
        assert math.isclose((chosen_rewards - rejected_rewards).mean().item(), trl_metrics["rewards/margins"],
                            rel_tol=1e-5, abs_tol=1e-6)
        assert math.isclose((chosen_rewards > rejected_rewards).float().mean().item(),
                            trl_metrics["rewards/accuracies"], rel_tol=1e-6)


# --- the training loop ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.tasks.preferences import build_preference_pairs

    torch.set_num_threads(1)
    model, tokenizer = load_base_policy("arithmetic")
    task = RECIPES["arithmetic"].make_task()
    return (model, tokenizer, build_preference_pairs(task, 256, seed=0, split="train"),
            build_preference_pairs(task, 64, seed=1, split="test"))


def test_pair_logps_match_sequence_logprobs_row_by_row(tiny):
    from rlbook.dpo import pair_logps
    from rlbook.rollout import encode_completions, sequence_logprobs

    model, tokenizer, pairs, _ = tiny
    with torch.no_grad():
        both = pair_logps(model, tokenizer, pairs[:6])
        for i, p in enumerate(pairs[:6]):
            for side in ("chosen", "rejected"):
                ids, attn, mask = encode_completions(tokenizer, [p.prompt], [getattr(p, side)])
                one = sequence_logprobs(model, ids, attn, mask).sum()
                assert math.isclose(both[side][i].item(), one.item(), rel_tol=1e-4, abs_tol=1e-4)
                assert int(both[f"{side}_len"][i]) == len(getattr(p, side)) + 1  # characters + EOS


def test_train_dpo_logs_trl_metrics_and_learns(tiny):
    import copy

    from rlbook.dpo import METRICS, DPOConfig, train_dpo

    model, tokenizer, train, test = tiny
    policy = copy.deepcopy(model)
    config = DPOConfig(beta=0.5, learning_rate=3e-4, per_device_train_batch_size=32, max_steps=30, eval_every=15)
    history = train_dpo(policy, tokenizer, train, test, config)
    assert len(history) == 30 and [h["step"] for h in history] == list(range(1, 31))
    for name in METRICS:
        assert name in history[0] and f"eval_{name}" in history[-1]
    # step 1 starts at the reference: every implicit reward 0 and the loss log 2
    assert math.isclose(history[0]["loss"], math.log(2), rel_tol=1e-4)
    assert abs(history[0]["rewards/margins"]) < 1e-4
    # the effect, with a margin: held-out margins grow and most held-out pairs are ranked right
    assert history[-1]["eval_rewards/margins"] > 0.05
    assert history[-1]["eval_rewards/accuracies"] > 0.55


def test_train_dpo_is_seeded_and_rejects_bad_config(tiny):
    import copy

    from rlbook.dpo import DPOConfig, train_dpo

    model, tokenizer, train, _ = tiny
    runs = [train_dpo(copy.deepcopy(model), tokenizer, train, config=DPOConfig(max_steps=3, seed=5))
            for _ in range(2)]
    for a, b in zip(*runs):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-6)
    for bad in (dict(beta=0), dict(loss_type="nope"), dict(label_smoothing=0.5), dict(max_steps=0),
                dict(learning_rate=0), dict(rpo_alpha=-1.0), dict(eval_every=-1)):
        with pytest.raises(ValueError):
            DPOConfig(**bad)
    with pytest.raises(ValueError, match="test_pairs"):
        train_dpo(model, tokenizer, train, None, DPOConfig(eval_every=5))
    with pytest.raises(ValueError, match="at least one"):
        train_dpo(model, tokenizer, [], None)


def test_ipo_and_rpo_run(tiny):
    import copy

    from rlbook.dpo import DPOConfig, train_dpo

    model, tokenizer, train, _ = tiny
    history = train_dpo(copy.deepcopy(model), tokenizer, train,
                        config=DPOConfig(loss_type="ipo", max_steps=2, rpo_alpha=1.0))
    assert "nll_loss" in history[0] and history[0]["nll_loss"] > 0
    # IPO at the reference: Δ = 0, so the loss is (1 / (2β))²
    assert math.isclose(history[0]["loss"], (1 / 0.2) ** 2, rel_tol=1e-4)
