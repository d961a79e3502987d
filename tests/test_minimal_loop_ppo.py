"""The PPO chapter's minimal loop (the cell tagged minimal-loop in book/part3/ppo.md) is one step of the package.

The chapter says that rlbook's Trainer with ``preset("ppo", ...)`` is its 80-line loop generalised. These tests
hold it to that: the package runs one training step (one rollout, ``num_iterations`` full-batch epochs); a
callback (the public extension point, rlbook.callbacks) keeps the rollout it sampled, copies of the models as they
were before the update, and every parameter's gradient after the update; the book's loop then updates those copies
on the same rollout. Loss and every gradient of the policy and of the critic agree to 1e-6.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from minimal_loops import check_torch_only, load_minimal_loop

from rlbook.callbacks import TrainerCallback
from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.lm.value import build_value_model, token_values
from rlbook.objectives import gae
from rlbook.presets import preset
from rlbook.rollout import sequence_logprobs
from rlbook.trainer import Trainer

TOL = dict(atol=1e-6, rtol=1e-6)


@pytest.fixture(scope="module")
def loop():
    return load_minimal_loop("part3/ppo")


class Capture(TrainerCallback):
    """The rollout, the models before the update, and the gradients the update left (after its norm clipping)."""

    def on_rollout_end(self, trainer, rollout):
        self.rollout = rollout
        self.before = copy.deepcopy((trainer.policy, trainer.value_model))

    def on_update_end(self, trainer, scored):
        self.grads = {name: p.grad.clone() for name, p in named_parameters(trainer.policy, trainer.value_model)}


def named_parameters(policy, critic):
    return [(f"policy.{n}", p) for n, p in policy.named_parameters()] + \
           [(f"critic.{n}", p) for n, p in critic.named_parameters()]


def package_step(num_iterations: int, seed: int = 0):
    torch.manual_seed(seed)
    recipe = RECIPES["arithmetic"]
    policy, tokenizer = load_base_policy("arithmetic")
    critic = build_value_model(policy)
    config = preset("ppo", learning_rate=1e-4, num_generations=8, per_device_train_batch_size=64,
                    max_completion_length=recipe.sft.max_new_tokens, max_steps=1, seed=seed,
                    num_iterations=num_iterations)
    capture = Capture()
    trainer = Trainer(policy, tokenizer, recipe.make_task(), config, value_model=critic, callbacks=[capture])
    metrics = trainer.train_step()
    assert metrics["optimizer_steps"] == num_iterations, "one minibatch of all 64 rows per epoch"
    return trainer, config, metrics, capture


@pytest.mark.parametrize("num_iterations", [1, 4])
def test_one_step_of_the_loop_is_one_step_of_the_package(loop, num_iterations):
    trainer, config, metrics, capture = package_step(num_iterations)
    policy, critic = capture.before
    batch = capture.rollout.batch
    rewards = torch.as_tensor(capture.rollout.rewards, dtype=torch.float32)
    optimizer = torch.optim.AdamW(list(policy.parameters()) + list(critic.parameters()),
                                  lr=config.learning_rate, weight_decay=config.weight_decay)
    losses = loop["ppo_update"](policy, critic, optimizer,
                                (batch.input_ids, batch.attention_mask, batch.completion_mask.float()),
                                rewards, epochs=num_iterations, gamma=config.gamma, lam=config.lam,
                                epsilon=config.epsilon, value_clip=config.cliprange_value,
                                vf_coef=config.vf_coef, max_grad_norm=config.max_grad_norm)
    assert len(losses) == num_iterations
    # the package logs the mean over its optimizer steps of each loss: the same mean of the loop's losses
    package_loss = metrics["loss/policy"] + config.vf_coef * metrics["loss/value"]
    torch.testing.assert_close(torch.tensor(float(np.mean(losses))), torch.tensor(float(package_loss)), **TOL)
    # every gradient of the last update, policy and critic
    mine = dict(named_parameters(policy, critic))
    assert set(mine) == set(capture.grads)
    for name, grad in capture.grads.items():
        assert mine[name].grad is not None, name
        torch.testing.assert_close(mine[name].grad, grad, **TOL, msg=lambda m, name=name: f"{name}: {m}")
    # and the parameters after the step. AdamW divides each gradient by its own running scale, so an entry near 0
    # turns rounding into a visible share of a step: the parameters agree to a tenth of the learning rate.
    theirs = dict(named_parameters(trainer.policy, trainer.value_model))
    for name, p in mine.items():
        torch.testing.assert_close(p, theirs[name], atol=config.learning_rate / 10, rtol=0)


def test_the_loop_reads_what_the_package_reads(loop):
    """On the loop's own samples: its log-probs and values are the package's sequence_logprobs and token_values,
    its mask ends at the first EOS, and its GAE is rlbook.objectives.gae."""
    recipe = RECIPES["arithmetic"]
    policy, tokenizer = load_base_policy("arithmetic")
    critic = build_value_model(policy, init="random")  # a critic whose values are not all 0
    task = recipe.make_task()
    examples = task.sample(4, seed=np.random.default_rng(0), split="train")
    generator = torch.Generator().manual_seed(0)
    ids, attention, mask = loop["sample"](policy, tokenizer, [e.prompt for e in examples], 3,
                                          recipe.sft.max_new_tokens, generator)
    T = mask.shape[1]
    completion = ids[:, -T:]
    for row, m in zip(completion, mask):
        n = int(m.sum())
        assert bool((m[:n] == 1).all()) and bool((m[n:] == 0).all())
        eos = (row[:n] == tokenizer.eos_token_id).nonzero().flatten().tolist()
        assert eos in ([], [n - 1]), "the mask runs up to and including the first EOS"
        assert eos or n == T, "a row without EOS fills the budget"
    with torch.no_grad():
        logp, values = loop["logprobs_and_values"](policy, critic, ids, attention, mask)
        torch.testing.assert_close(logp, sequence_logprobs(policy, ids, attention, mask), **TOL)
        torch.testing.assert_close(values, token_values(critic, ids, attention, mask), **TOL)
    rewards = loop["score"](task, tokenizer, [e for e in examples for _ in range(3)], batch=(ids, attention, mask))
    assert rewards.shape == (len(ids),)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(mask)), mask.sum(-1).long() - 1] = rewards
    for lam in (0.0, 0.5, 0.95, 1.0):
        mine = loop["gae"](token_rewards, values, mask, 1.0, lam)
        for got, expected in zip(mine, gae(token_rewards, values, mask, 1.0, lam)):
            torch.testing.assert_close(got, expected, **TOL)


def test_the_loop_is_short_and_imports_only_torch():
    check_torch_only("part3/ppo")
