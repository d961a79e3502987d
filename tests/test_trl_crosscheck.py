"""Cross-check against TRL (the optional extra `crosscheck`; skipped when trl is not installed).

GRPO's per-step loss, and the bnpo / dr_grpo / dapo aggregations, computed by rlbook.objectives.policy_loss and
by TRL's own `GRPOTrainer._compute_loss` on the same tensors. `_compute_loss` is called unbound on a stand-in
for the trainer that carries only the attributes it reads (single process, no vLLM, no entropy masking), and
whose `_get_per_token_logps_and_entropies` returns our log-probs, so the comparison covers exactly TRL's
clipping, k3 KL and aggregation. Group advantages are compared with TRL's formula on its own `nanstd`.

TRL 1.16's variants the same way: `loss_type="cispo"` and `"sapo"`, `delta`, `off_policy_mask_threshold`, and
the vLLM importance-sampling correction in its four modes. TRL computes that correction's weights inline in
`_generate_and_score_completions`; the test cuts that block out of TRL's own source and runs it on our tensors.
The `cispo` and `sapo` presets go through the bridge (rlbook.integrations.trl) into TRL's own GRPOConfig, whose
values drive TRL's loss.
"""

import functools
import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from rlbook.objectives import (  # noqa: E402
    adaptive_entropy_coef,
    entropy_bonus_loss,
    group_advantages,
    high_entropy_mask,
    policy_loss,
    sampler_importance_weights,
)

AGREE = 1e-6  # float32, the same operations in a slightly different order


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    @staticmethod
    def pad_across_processes(x, dim=0, pad_index=0):
        return x


def _trl_stand_in(loss_type, logp, *, beta, epsilon, epsilon_high, max_completion_length, args=None,
                  **attributes):
    """A stand-in for TRL's trainer carrying the attributes ``_compute_loss`` reads, its forward returning
    ``logp``; ``args`` (GRPOConfig fields) and ``attributes`` (the trainer's) add to or replace the defaults."""
    stand_in = SimpleNamespace(**{
        "_get_per_token_logps_and_entropies": lambda *a, **k: (logp, torch.zeros_like(logp), None),
        "top_entropy_quantile": 1.0, "off_policy_mask_threshold": None, "importance_sampling_level": "token",
        "beta": beta, "loss_type": loss_type, "epsilon_low": epsilon, "epsilon_high": epsilon_high, "use_vllm": False,
        "model": SimpleNamespace(training=True), "current_gradient_accumulation_steps": 1,
        "max_completion_length": max_completion_length, "accelerator": _Accelerator(),
        "_entropy_bonus_enabled": False, "aux_loss_enabled": False,
        "get_off_policy_mask": GRPOTrainer.get_off_policy_mask,  # TRL's own (a static method)
        "get_gamma_weights": GRPOTrainer.get_gamma_weights,  # VESPO's weight, TRL's own (a static method)
        "_metrics": defaultdict(lambda: defaultdict(list)),
        "args": SimpleNamespace(**{"use_bias_correction_kl": False, "delta": None, "steps_per_generation": 1,
                                   "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, **(args or {})}),
        **attributes,
    })
    stand_in.get_high_entropy_mask = functools.partial(GRPOTrainer.get_high_entropy_mask, stand_in)  # TRL's own
    return stand_in


def _trl_inputs(old_logp, ref_logp, advantages, mask, num_items_in_batch, inputs=None) -> dict:
    """The batch ``_compute_loss`` reads; ``inputs`` adds to or replaces its entries."""
    B, T = mask.shape
    return {
        "prompt_ids": torch.ones((B, 3), dtype=torch.long), "prompt_mask": torch.ones((B, 3), dtype=torch.long),
        "completion_ids": torch.ones((B, T), dtype=torch.long), "completion_mask": mask.long(),
        "advantages": advantages, "old_per_token_logps": old_logp, "ref_per_token_logps": ref_logp,
        "num_items_in_batch": torch.tensor(float(num_items_in_batch)), **(inputs or {}),
    }


def _trl_loss(loss_type, logp, old_logp, ref_logp, advantages, mask, *, beta, epsilon, epsilon_high,
              max_completion_length, num_items_in_batch, args=None, inputs=None, **attributes):
    """TRL's loss on our tensors (:func:`_trl_stand_in`, :func:`_trl_inputs`)."""
    stand_in = _trl_stand_in(loss_type, logp, beta=beta, epsilon=epsilon, epsilon_high=epsilon_high,
                             max_completion_length=max_completion_length, args=args, **attributes)
    return GRPOTrainer._compute_loss(stand_in, None,
                                     _trl_inputs(old_logp, ref_logp, advantages, mask, num_items_in_batch, inputs))


def _tensors(seed, B=12, T=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old_logp = -torch.rand((B, T), generator=g) * 3 * mask
    logp = (old_logp + 0.3 * torch.randn((B, T), generator=g)) * mask  # ratios well outside [0.8, 1.28]
    ref_logp = (old_logp + 0.2 * torch.randn((B, T), generator=g)) * mask
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    return logp, old_logp, ref_logp, rewards, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta, epsilon_high", [(0.0, 0.2), (0.04, 0.2), (0.0, 0.28)])
def test_policy_loss_equals_trls(loss_type, beta, epsilon_high):
    seed = 100 * len(loss_type) + int(100 * beta) + int(100 * epsilon_high)
    logp, old_logp, ref_logp, rewards, mask = _tensors(seed)
    advantages = group_advantages(rewards, num_generations=4)
    # dapo: the token count of the whole generation batch (here: this one plus as many tokens elsewhere)
    num_items = 2 * mask.sum() if loss_type == "dapo" else mask.sum()
    losses, grads = [], []
    for which in ("ours", "trl"):
        x = logp.clone().requires_grad_(True)
        if which == "ours":
            loss, _ = policy_loss(x, old_logp, advantages, mask, epsilon=0.2, epsilon_high=epsilon_high,
                                  loss_type=loss_type, max_completion_length=10, num_items_in_batch=num_items,
                                  beta=beta, ref_logp=ref_logp if beta else None)
        else:
            loss = _trl_loss(loss_type, x, old_logp, ref_logp, advantages, mask, beta=beta, epsilon=0.2,
                             epsilon_high=epsilon_high, max_completion_length=10, num_items_in_batch=num_items)
        loss.backward()
        losses.append(loss.detach())
        grads.append(x.grad)
    assert torch.allclose(losses[0], losses[1], atol=AGREE, rtol=AGREE)
    assert torch.allclose(grads[0] * mask, grads[1] * mask, atol=AGREE, rtol=AGREE)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_group_advantages_equal_trls_formula(scale_rewards):
    g = torch.Generator().manual_seed(7)
    G = 8
    rewards = torch.cat([torch.rand(3 * G, generator=g), torch.ones(G)])  # the last group: identical rewards
    # TRL 1.16, GRPOTrainer._generate_and_score_completions ("sum_then_normalize", one reward function):
    mean = rewards.view(-1, G).mean(1).repeat_interleave(G)
    std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G) if scale_rewards != "batch" else \
        nanstd(rewards).expand_as(rewards)
    expected = rewards - mean
    if scale_rewards != "none":
        expected = expected / (std + 1e-4)
    ours = group_advantages(rewards, G, scale_rewards=scale_rewards)
    assert torch.allclose(ours, expected, atol=AGREE, rtol=AGREE)


def test_model_gradient_equals_trls_on_the_same_rollout():
    """The whole path on a real model: our sampled rollout, group advantages, sequence_logprobs and the dapo loss
    give the same parameter gradient as a real GRPOTrainer's compute_loss (its own forward) on that rollout."""
    import copy

    from datasets import Dataset
    from trl import GRPOConfig

    from rlbook.lm import build_model, build_tokenizer
    from rlbook.rollout import generate_rollouts, sequence_logprobs

    tokenizer = build_tokenizer()
    model = build_model("tiny", seed=11).train()
    prompts = ["1+2=", "33+44=", "q7: 9*10="]
    batch = generate_rollouts(model, tokenizer, prompts, num_generations=4, max_new_tokens=6, seed=0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    advantages = group_advantages(rewards, 4)
    mask = batch.completion_mask.float()
    ours = copy.deepcopy(model)
    logp = sequence_logprobs(ours, batch.input_ids, batch.attention_mask, mask)
    loss, _ = policy_loss(logp, batch.logprobs, advantages, mask, loss_type="dapo")
    loss.backward()

    config = GRPOConfig(output_dir="/tmp/rlbook_trl_crosscheck", report_to="none", use_cpu=True, bf16=False,
                        gradient_checkpointing=False, per_device_train_batch_size=12, num_generations=4,
                        max_completion_length=6, loss_type="dapo", beta=0.0)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    inputs = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask,
              "completion_ids": batch.completion_ids, "completion_mask": batch.completion_mask,
              "advantages": advantages, "num_items_in_batch": mask.sum(), "old_per_token_logps": None}
    trl_loss = trainer.compute_loss(trainer.model, inputs)
    trl_loss.backward()
    assert torch.allclose(loss.detach(), trl_loss.detach(), atol=1e-6, rtol=1e-5)
    for (name, ours_p), theirs in zip(ours.named_parameters(), trainer.model.parameters()):
        assert torch.allclose(ours_p.grad, theirs.grad, atol=1e-5, rtol=1e-4), name


# --- TRL 1.16's variants ----------------------------------------------------------------------------------------


def _both_losses(ours_kwargs, trl_kwargs, logp, old_logp, ref_logp, advantages, mask, loss_type, num_items):
    """Our loss and TRL's, with their gradients in logp."""
    results = []
    for which in ("ours", "trl"):
        x = logp.clone().requires_grad_(True)
        if which == "ours":
            loss, _ = policy_loss(x, old_logp, advantages, mask, loss_type=loss_type, max_completion_length=10,
                                  num_items_in_batch=num_items, **ours_kwargs)
        else:
            loss = _trl_loss(loss_type, x, old_logp, ref_logp, advantages, mask, max_completion_length=10,
                             num_items_in_batch=num_items, **trl_kwargs)
        loss.backward()
        results.append((loss.detach(), x.grad))
    return results


def _assert_agree(results, mask):
    (ours, ours_grad), (trl_loss, trl_grad) = results
    assert torch.allclose(ours, trl_loss, atol=AGREE, rtol=AGREE), (ours.item(), trl_loss.item())
    assert torch.allclose(ours_grad * mask, trl_grad * mask, atol=AGREE, rtol=AGREE)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("cap", [1.2, 5.0])  # 1.2: many weights capped; 5.0: ScaleRL's epsilon_max
def test_cispo_equals_trls(level, cap):
    logp, old_logp, ref_logp, rewards, mask = _tensors(300 + int(10 * cap) + len(level))
    advantages = group_advantages(rewards, num_generations=4)
    results = _both_losses(dict(epsilon_high=cap, importance_sampling_level=level),
                           dict(beta=0.0, epsilon=0.2, epsilon_high=cap, importance_sampling_level=level),
                           logp, old_logp, ref_logp, advantages, mask, "cispo", 2 * mask.sum())
    _assert_agree(results, mask)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (0.5, 3.0)])
def test_sapo_equals_trls(level, tau_pos, tau_neg):
    logp, old_logp, ref_logp, rewards, mask = _tensors(400 + int(10 * tau_neg) + len(level))
    advantages = group_advantages(rewards, num_generations=4)
    temperatures = dict(sapo_temperature_pos=tau_pos, sapo_temperature_neg=tau_neg)
    results = _both_losses(dict(importance_sampling_level=level, **temperatures),
                           dict(beta=0.0, epsilon=0.2, epsilon_high=0.2, importance_sampling_level=level,
                                args=temperatures),
                           logp, old_logp, ref_logp, advantages, mask, "sapo", mask.sum())
    _assert_agree(results, mask)


@pytest.mark.parametrize("level", ["sequence", "token"])  # sequence: the LUSPO paper's; token: TRL's default
@pytest.mark.parametrize("beta, delta", [(0.0, None), (0.04, 3.0)])
def test_luspo_equals_trls(level, beta, delta):
    """LUSPO (TRL 1.16's loss_type="luspo"): PPO-Clip's surrogate, each completion's token losses summed, not
    averaged, then the mean over completions; through the registry (one row of rlbook.losses.LOSS_TYPES)."""
    logp, old_logp, ref_logp, rewards, mask = _tensors(800 + int(100 * beta) + len(level))
    advantages = group_advantages(rewards, num_generations=4)
    results = _both_losses(dict(epsilon_high=0.28, importance_sampling_level=level, beta=beta, delta=delta,
                                ref_logp=ref_logp if beta else None),
                           dict(beta=beta, epsilon=0.2, epsilon_high=0.28, importance_sampling_level=level,
                                args={"delta": delta}),
                           logp, old_logp, ref_logp, advantages, mask, "luspo", mask.sum())
    _assert_agree(results, mask)


VESPO_DEFAULTS = dict(vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)


@pytest.mark.parametrize("settings", [VESPO_DEFAULTS, dict(vespo_k_pos=0.5, vespo_lambda_pos=1.0, vespo_k_neg=4.0,
                                                           vespo_lambda_neg=6.0)])
@pytest.mark.parametrize("beta, corrected", [(0.0, False), (0.04, True)])
def test_vespo_equals_trls(settings, beta, corrected):
    """VESPO (TRL 1.16's loss_type="vespo"): a detached Gamma weight of the sequence's likelihood ratio times
    A log π, aggregated like "dapo"; with the sampler correction (token_mask) folded into the weight, not
    multiplied onto the token losses."""
    logp, old_logp, ref_logp, rewards, mask, sampler_logp = _sampler_tensors(900 + int(100 * beta), 0.05, 0.02)
    logp = old_logp + 0.1 * (logp - old_logp)  # sequence ratios near 1, where the weight is not ~0
    advantages = group_advantages(rewards, num_generations=4)
    theirs = _trl_sampler_weights(old_logp, sampler_logp, mask, "token_mask", 0.5, 2.0) if corrected else None
    ours = sampler_importance_weights(old_logp, sampler_logp, mask, "token_mask", 0.5, 2.0) if corrected else None
    results = _both_losses(
        dict(beta=beta, ref_logp=ref_logp if beta else None, importance_sampling_ratio=ours, **settings),
        dict(beta=beta, epsilon=0.2, epsilon_high=0.2, args=settings, use_vllm=corrected,
             vllm_importance_sampling_correction=corrected, inputs={"importance_sampling_ratio": theirs}),
        logp, old_logp, ref_logp, advantages, mask, "vespo", 2 * mask.sum())
    _, metrics = policy_loss(logp, old_logp, advantages, mask, loss_type="vespo", importance_sampling_ratio=ours,
                             **settings)
    assert 0.05 < metrics["vespo/phi_seq_mean"] < 1.5, "the weights must be neither ~0 nor all 1"
    _assert_agree(results, mask)


@pytest.mark.parametrize("name", ["cispo", "sapo"])
def test_the_cispo_and_sapo_presets_through_the_bridge_are_trls(name, tmp_path):
    """``preset("cispo")`` and ``preset("sapo")`` handed to TRL by the bridge (rlbook.integrations.trl.grpo_config):
    TRL's own GRPOConfig holds the same loss_type and CISPO's cap (epsilon_high = 5, ScaleRL's) or SAPO's
    temperatures, and TRL's loss read from that config equals the book's under the preset, value and gradient."""
    from rlbook.integrations.trl import grpo_config
    from rlbook.presets import preset

    c = preset(name)
    args = grpo_config(c, output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    assert args.loss_type == c.loss_type == name
    assert args.epsilon_high == (5.0 if name == "cispo" else c.epsilon)
    assert (args.epsilon, args.beta, args.importance_sampling_level) == (c.epsilon, c.beta, "token")
    assert (args.sapo_temperature_pos, args.sapo_temperature_neg) == (c.sapo_temperature_pos, c.sapo_temperature_neg)
    logp, old_logp, ref_logp, rewards, mask = _tensors(800 + len(name))
    if name == "cispo":  # some weights above the cap, so that the cap acts
        logp = torch.where(torch.arange(logp.shape[1]) == 0, old_logp + 2.0, logp) * mask
        assert bool((((logp - old_logp).exp() > args.epsilon_high) & mask.bool()).any())
    advantages = group_advantages(rewards, num_generations=4)
    num_items = 2 * mask.sum() if name == "cispo" else mask.sum()
    ours = dict(epsilon=c.epsilon, epsilon_high=c.epsilon_high, beta=c.beta,
                importance_sampling_level=c.importance_sampling_level,
                sapo_temperature_pos=c.sapo_temperature_pos, sapo_temperature_neg=c.sapo_temperature_neg)
    # TRL's trainer reads epsilon_low from args.epsilon and the rest from its args
    theirs = dict(beta=args.beta, epsilon=args.epsilon, epsilon_high=args.epsilon_high,
                  importance_sampling_level=args.importance_sampling_level,
                  args=dict(sapo_temperature_pos=args.sapo_temperature_pos,
                            sapo_temperature_neg=args.sapo_temperature_neg))
    results = _both_losses(ours, theirs, logp, old_logp, ref_logp, advantages, mask, args.loss_type, num_items)
    _assert_agree(results, mask)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_delta_equals_trls(loss_type, beta):
    logp, old_logp, ref_logp, rewards, mask = _tensors(500 + len(loss_type) + int(100 * beta))
    advantages = group_advantages(rewards, num_generations=4)
    results = _both_losses(dict(epsilon_high=0.28, delta=1.4, beta=beta, ref_logp=ref_logp if beta else None),
                           dict(beta=beta, epsilon=0.2, epsilon_high=0.28, args=dict(delta=1.4)),
                           logp, old_logp, ref_logp, advantages, mask, loss_type, 2 * mask.sum())
    ratio = (logp - old_logp).exp()
    assert bool(((ratio > 1.4) & (advantages[:, None] < 0) & mask.bool()).any()), "delta must act somewhere"
    _assert_agree(results, mask)


def _trl_sampler_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max):
    """TRL 1.16's importance-sampling weights for the sampler (vLLM) mismatch: its own code, cut from
    ``GRPOTrainer._generate_and_score_completions`` (where it is inline) and run on these tensors."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    begin = source.rindex("\n", 0, source.index("# Compute the importance sampling ratio when using vLLM")) + 1
    end = source.index("# Compute the per-token log probabilities for the reference model")
    block = textwrap.dedent(source[begin:end])
    stand_in = SimpleNamespace(use_vllm=True, vllm_importance_sampling_correction=True,
                               vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min,
                               vllm_importance_sampling_clip_max=clip_max)
    namespace = {"self": stand_in, "torch": torch, "math": math, "completion_mask": mask, "tool_mask": None,
                 "old_per_token_logps": old_logp, "sampling_per_token_logps": sampler_logp}
    exec(block, namespace)
    return namespace["vllm_importance_sampling_ratio"]


def _sampler_tensors(seed, scale=0.1, shift=0.0):
    logp, old_logp, ref_logp, rewards, mask = _tensors(seed)
    g = torch.Generator().manual_seed(seed + 1)
    sampler_logp = (old_logp + scale * torch.randn(old_logp.shape, generator=g) + shift) * mask
    return logp, old_logp, ref_logp, rewards, mask, sampler_logp


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min, clip_max", [(None, 3.0), (0.9, 1.1)])
def test_sampler_importance_weights_equal_trls(mode, clip_min, clip_max):
    logp, old_logp, ref_logp, rewards, mask, sampler_logp = _sampler_tensors(600 + len(mode))
    theirs = _trl_sampler_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max)  # (B, T) or (B, 1)
    ours = sampler_importance_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max)
    assert torch.allclose(ours, theirs.expand_as(ours) * mask, atol=AGREE, rtol=AGREE)
    if clip_max == 1.1:  # the band must truncate or mask some weights
        assert bool(((ours != (old_logp - sampler_logp).exp()) & mask.bool()).any())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo", "sapo"])
@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate"])
def test_sampler_correction_and_off_policy_mask_in_the_loss_equal_trls(loss_type, mode):
    """The weights on the token losses (TRL with use_vllm: the vLLM correction and the off-policy sequence mask
    against the sampler's log-probs), with a KL term that neither weighs, equal TRL's loss."""
    logp, old_logp, ref_logp, rewards, mask, sampler_logp = _sampler_tensors(700 + len(loss_type) + len(mode), 0.3, 0.2)
    advantages = group_advantages(rewards, num_generations=4)
    clip_min, clip_max = 0.7, 1.5
    theirs = _trl_sampler_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max)
    ours = sampler_importance_weights(old_logp, sampler_logp, mask, mode, clip_min, clip_max)
    cap = 5.0 if loss_type == "cispo" else 0.28
    beta = 0.04
    # the threshold: the median of the negative-advantage rows' KL estimates, so that the mask drops some of them
    kl = ((sampler_logp - logp) * mask).sum(-1) / mask.sum(-1)
    threshold = max(kl[advantages < 0].median().item(), 0.0)
    results = _both_losses(
        dict(epsilon_high=cap, beta=beta, ref_logp=ref_logp, importance_sampling_ratio=ours,
             off_policy_mask_threshold=threshold, sampler_logp=sampler_logp),
        dict(beta=beta, epsilon=0.2, epsilon_high=cap, use_vllm=True, vllm_importance_sampling_correction=True,
             off_policy_mask_threshold=threshold,
             inputs={"importance_sampling_ratio": theirs, "sampling_per_token_logps": sampler_logp}),
        logp, old_logp, ref_logp, advantages, mask, loss_type, 2 * mask.sum())
    _, metrics = policy_loss(logp, old_logp, advantages, mask, loss_type=loss_type, epsilon_high=cap,
                             off_policy_mask_threshold=threshold, sampler_logp=sampler_logp)
    assert 0 < metrics["off_policy_mask/masked_mean"] < 1, "the off-policy mask must drop some tokens, not all"
    _assert_agree(results, mask)


# --- the entropy methods: the high-entropy minority and the (adaptive) entropy bonus ----------------------------


def _entropies(seed, mask):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(mask.shape, generator=g) * 2.0 + 0.05) * mask


@pytest.mark.parametrize("rho", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_mask_equals_trls(rho):
    _, _, _, _, mask = _tensors(800 + int(10 * rho))
    entropies = _entropies(800, mask)
    stand_in = SimpleNamespace(accelerator=_Accelerator())
    theirs = GRPOTrainer.get_high_entropy_mask(stand_in, entropies, mask, 1 - rho)
    assert torch.equal(high_entropy_mask(entropies, mask, rho), theirs)


def _ours_with_entropy(x, h, old_logp, advantages, mask, loss_type, num_items, rho, coef, beta=0.0,
                       ref_logp=None):
    keep = high_entropy_mask(h, mask, rho) if rho < 1 else None
    loss, _ = policy_loss(x, old_logp, advantages, mask, loss_type=loss_type, max_completion_length=10,
                          num_items_in_batch=num_items, epsilon_high=0.28, entropy_mask=keep, beta=beta,
                          ref_logp=ref_logp)
    return loss + entropy_bonus_loss(h, mask.bool() if keep is None else keep, coef)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("rho, coef", [(0.2, 0.0), (1.0, 0.01), (0.3, 0.05)])
def test_entropy_filter_and_bonus_in_the_loss_equal_trls(loss_type, rho, coef):
    """TRL's ``top_entropy_quantile`` and static ``entropy_coef``: the loss and its gradient in both the log-probs
    and the entropies (the bonus is differentiable), with the KL term on."""
    logp, old_logp, ref_logp, rewards, mask = _tensors(900 + len(loss_type) + int(100 * coef))
    entropies = _entropies(901, mask)
    advantages = group_advantages(rewards, num_generations=4)
    num_items, beta = 2 * mask.sum(), 0.04
    results = []
    for which in ("ours", "trl"):
        x, h = logp.clone().requires_grad_(True), entropies.clone().requires_grad_(True)
        if which == "ours":
            loss = _ours_with_entropy(x, h, old_logp, advantages, mask, loss_type, num_items, rho, coef, beta,
                                      ref_logp)
        else:
            loss = _trl_loss(loss_type, x, old_logp, ref_logp, advantages, mask, beta=beta, epsilon=0.2,
                             epsilon_high=0.28, max_completion_length=10, num_items_in_batch=num_items,
                             _get_per_token_logps_and_entropies=lambda *a, **k: (x, h, None),
                             top_entropy_quantile=rho, _entropy_bonus_enabled=coef != 0.0, entropy_coef=coef,
                             use_adaptive_entropy=False)
        loss.backward()
        results.append((loss.detach(), x.grad, h.grad))
    (ours, ours_grad, ours_h), (theirs, trl_grad, trl_h) = results
    assert torch.allclose(ours, theirs, atol=AGREE, rtol=AGREE), (ours.item(), theirs.item())
    assert torch.allclose(ours_grad * mask, trl_grad * mask, atol=AGREE, rtol=AGREE)
    if coef:
        assert torch.allclose(ours_h * mask, trl_h * mask, atol=AGREE, rtol=AGREE)


def test_adaptive_entropy_coefficient_follows_trls_controller():
    """Twelve optimizer steps of TRL's adaptive control (``use_adaptive_entropy``, one micro-batch per step) against
    ours: the coefficient after each step, and the loss, which applies the previous step's coefficient only
    while the previous step's entropy was at or below the target."""
    logp, old_logp, ref_logp, rewards, mask = _tensors(950)
    advantages = group_advantages(rewards, num_generations=4)
    settings = dict(entropy_target=0.6, entropy_coef_delta=0.02, entropy_coef_min=0.0, entropy_coef_max=0.05)
    # one stand-in for the whole run: TRL keeps the controller's state on the trainer
    stand_in = _trl_stand_in("dapo", logp, beta=0.0, epsilon=0.2, epsilon_high=0.28, max_completion_length=10,
                             args=settings, entropy_coef=0.01, use_adaptive_entropy=True,
                             _entropy_bonus_enabled=True, _last_world_entropy=float("inf"),
                             _entropy_window_stats=None)
    coef, last_entropy, path = 0.01, float("inf"), []
    scales = [0.2, 0.3, 0.5, 0.9, 0.9, 0.9, 0.2, 0.1, 0.1, 0.8, 0.9, 0.3]  # below, then above, the target
    for step, scale in enumerate(scales):
        entropies = _entropies(960 + step, mask) * scale
        applied = coef if last_entropy <= settings["entropy_target"] else 0.0
        ours = _ours_with_entropy(logp, entropies, old_logp, advantages, mask, "dapo", mask.sum(), 1.0, applied)
        stand_in._get_per_token_logps_and_entropies = lambda *a, h=entropies, **k: (logp, h, None)
        theirs = GRPOTrainer._compute_loss(stand_in, None, _trl_inputs(old_logp, None, advantages, mask, mask.sum()))
        assert theirs.item() == pytest.approx(ours.item(), abs=AGREE, rel=AGREE), step
        entropy = ((entropies * mask).sum() / mask.sum()).item()
        coef, last_entropy = adaptive_entropy_coef(coef, entropy, **settings), entropy
        assert stand_in.entropy_coef == pytest.approx(coef, abs=1e-12), step
        path.append(coef)
    # the path reached both bounds: it rose to the max and fell to the min
    assert max(path) == pytest.approx(settings["entropy_coef_max"]) and min(path) == 0.0
