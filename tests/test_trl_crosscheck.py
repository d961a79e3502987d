"""Cross-check against TRL (the optional extra `crosscheck`; skipped when trl is not installed).

GRPO's per-step loss, and the bnpo / dr_grpo / dapo aggregations, computed by rlbook.objectives.policy_loss and
by TRL's own `GRPOTrainer._compute_loss` on the same tensors. `_compute_loss` is called unbound on a stand-in
for the trainer that carries only the attributes it reads (single process, no vLLM, no entropy masking), and
whose `_get_per_token_logps_and_entropies` returns our log-probs, so the comparison covers exactly TRL's
clipping, k3 KL and aggregation. Group advantages are compared with TRL's formula on its own `nanstd`.
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from rlbook.objectives import group_advantages, policy_loss  # noqa: E402

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


def _trl_loss(loss_type, logp, old_logp, ref_logp, advantages, mask, *, beta, epsilon, epsilon_high,
              max_completion_length, num_items_in_batch):
    B, T = mask.shape
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type=loss_type, epsilon_low=epsilon, epsilon_high=epsilon_high, use_vllm=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length, accelerator=_Accelerator(), _entropy_bonus_enabled=False,
        aux_loss_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
    )
    inputs = {
        "prompt_ids": torch.ones((B, 3), dtype=torch.long), "prompt_mask": torch.ones((B, 3), dtype=torch.long),
        "completion_ids": torch.ones((B, T), dtype=torch.long), "completion_mask": mask.long(),
        "advantages": advantages, "old_per_token_logps": old_logp, "ref_per_token_logps": ref_logp,
        "num_items_in_batch": torch.tensor(float(num_items_in_batch)),
    }
    return GRPOTrainer._compute_loss(stand_in, None, inputs)


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
