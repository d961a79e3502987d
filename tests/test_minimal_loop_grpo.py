"""The GRPO chapter's minimal loop (the cell tagged minimal-loop in book/part4/grpo.md) is the package's GRPO.

One ``grpo_step`` of the loop, on the batch that ``rlbook.Trainer`` with ``preset("grpo")`` sampled and scored, gives
the Trainer's loss and every parameter's gradient to 1e-6. The Trainer is read only through its public hooks
(:class:`rlbook.callbacks.TrainerCallback`): the policy and the scored batch before the update, the gradients after
it (clipped at ``max_grad_norm``, as the loop clips them). The loop's own sampler and reward are checked against the
package's log-probs and the task's rule on the loop's own batch."""

import copy

import pytest
import torch
from minimal_loops import check_torch_only, load_minimal_loop

from rlbook import RECIPES, Trainer, TrainerCallback, load_base_policy, preset
from rlbook.rollout import sequence_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LOOP = load_minimal_loop("part4/grpo")
G, PROMPTS = 8, 16


@pytest.fixture(scope="module")
def base():
    model, tokenizer = load_base_policy("arithmetic")
    return model, tokenizer, RECIPES["arithmetic"].make_task()


class OneStep(TrainerCallback):
    """What one step of the Trainer saw and did: the policy before the update (a copy), the scored batch, and the
    gradients the update left (after clipping, before the next step clears them)."""

    def on_score_end(self, trainer, scored):
        self.policy, self.scored = copy.deepcopy(trainer.policy), scored

    def on_update_end(self, trainer, scored):
        self.grads = {name: p.grad.detach().clone() for name, p in trainer.policy.named_parameters()}


@pytest.mark.parametrize("step, temperature", [(0, 1.0), (2, 1.0), (1, 0.7)],
                         ids=["first step", "third step (KL > 0)", "second step at temperature 0.7"])
def test_one_step_of_the_loop_equals_one_step_of_the_trainer(base, step, temperature):
    model, tokenizer, task = base
    config = preset("grpo", max_completion_length=8, num_generations=G, per_device_train_batch_size=G * PROMPTS,
                    learning_rate=2e-4, temperature=temperature, max_steps=step + 1, seed=0)
    watch = OneStep()
    trainer = Trainer(copy.deepcopy(model), tokenizer, task, config, callbacks=[watch])
    metrics = trainer.train(progress=False)[-1]  # the last step is the one the callback kept
    assert metrics["optimizer_steps"] == 1, "one micro-batch and one optimizer step per rollout, as in the loop"
    s = watch.scored

    policy = watch.policy  # the Trainer's policy just before this step's update
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.learning_rate, weight_decay=0.0)
    rewards = torch.as_tensor(s.rewards, dtype=torch.float32)
    loss = LOOP["grpo_step"](policy, trainer.reference, optimizer, s.input_ids, s.attention_mask, s.mask,
                             s.old_logp, rewards, G, epsilon=config.epsilon, beta=config.beta,
                             temperature=temperature, max_grad_norm=config.max_grad_norm)

    torch.testing.assert_close(torch.tensor(loss, dtype=torch.float64),
                               torch.tensor(metrics["loss/policy"], dtype=torch.float64), atol=1e-6, rtol=1e-6)
    names = [name for name, _ in policy.named_parameters()]
    assert names == list(watch.grads), "the same parameters, in the same order"
    for name, p in policy.named_parameters():
        torch.testing.assert_close(p.grad, watch.grads[name], atol=1e-6, rtol=1e-6, msg=lambda m: f"{name}: {m}")
    if step > 0:  # the policy has moved: the KL term is in the loss, and so in the comparison
        assert metrics["kl"] > 0


def test_the_loops_sampler_and_reward_follow_the_packages_conventions(base):
    model, tokenizer, task = base
    examples = task.sample(4, seed=0, split="train")
    ids, attention, mask, sampler_logp = LOOP["sample_groups"](
        model, tokenizer, [e.prompt for e in examples], G, max_new_tokens=8, temperature=0.8,
        generator=torch.Generator().manual_seed(0))
    B, T = mask.shape
    assert B == 4 * G and ids.shape == attention.shape == (B, ids.shape[1]) and T <= 8
    # the mask runs up to and including the first EOS, and nothing after it is real
    completions = ids[:, -T:]
    is_eos = (completions == tokenizer.eos_token_id) & mask.bool()
    ends = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full((B,), T))
    assert torch.equal(mask, (torch.arange(T)[None, :] < ends[:, None]).long())
    # the sampler's log-probs are the package's log-probs of the same tokens at the same temperature
    package_logp = sequence_logprobs(model, ids, attention, mask, temperature=0.8)
    torch.testing.assert_close(sampler_logp * mask, package_logp * mask, atol=1e-5, rtol=1e-5)
    # the reward is the task's rule on the decoded completions
    rewards = LOOP["score"](tokenizer, task, examples, G, ids, mask)
    texts = tokenizer.batch_decode(completions.masked_fill(mask == 0, tokenizer.pad_token_id).tolist(),
                                   skip_special_tokens=True)
    truncated = ~(completions == tokenizer.eos_token_id).any(-1)
    expected = task.rewards([e for e in examples for _ in range(G)], texts, truncated.tolist())
    assert rewards.tolist() == expected.tolist()


def test_the_loops_advantages_and_loss_are_the_packages():
    from rlbook.losses import policy_loss_of
    from rlbook.objectives import group_advantages

    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (4 * G,), generator=gen).float()
    rewards[-G:] = 1.0  # an all-right group: advantage 0
    torch.testing.assert_close(LOOP["group_normalised"](rewards, G), group_advantages(rewards, G),
                               atol=1e-6, rtol=1e-6)
    B, T = len(rewards), 6
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=gen)[:, None]).float()
    logp = (-3 * torch.rand(B, T, generator=gen)).requires_grad_()
    old_logp = (logp + 0.3 * torch.randn(B, T, generator=gen)).detach()  # ratios off 1: the clip acts
    ref_logp = (logp + 0.5 * torch.randn(B, T, generator=gen)).detach()
    advantages = group_advantages(rewards, G)
    mine = LOOP["grpo_loss"](logp, old_logp * mask, ref_logp * mask, advantages, mask, 0.2, 0.04)
    theirs, metrics = policy_loss_of(logp, old_logp * mask, advantages, mask, loss_type="grpo", epsilon=0.2,
                                     beta=0.04, ref_logp=ref_logp * mask)
    assert metrics["clip_ratio/region_mean"] > 0
    torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.autograd.grad(mine, logp)[0], torch.autograd.grad(theirs, logp)[0],
                               atol=1e-6, rtol=1e-6)


def test_the_loop_is_short_and_imports_only_torch():
    check_torch_only("part4/grpo")
