"""The policy-gradient chapter's minimal REINFORCE loop is one step of rlbook's Trainer (issue: the loop a learner can
hold in their head, and the claim that the package is that loop generalised).

The loop is the cell tagged ``minimal-loop`` in book/part3/policy_gradient.md, executed as the book shows it
(tests/minimal_loops.py). One Trainer step with ``preset("reinforce")`` (or ``preset("rloo")``) samples a batch and
updates a copy of the arithmetic base policy; the loop's ``train_step`` then takes its step on another copy, on the
same batch (its ``sample`` handed the trainer's completions), and the rewards, the advantages, the loss, the
gradient of every parameter (the one each optimizer step used, which ``p.grad`` still holds) and the parameters after
the AdamW step must agree.
"""

import copy

import pytest
import torch
from minimal_loops import check_torch_only, load_minimal_loop

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.presets import preset
from rlbook.rollout import sequence_logprobs
from rlbook.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHAPTER = "part3/policy_gradient"
G, MAX_LEN, LR = 4, 8, 3e-4
TOL = dict(rtol=1e-6, atol=1e-6)  # the bound for the loss and every gradient
# On the first AdamW step a parameter moves by lr * g / (|g| + eps): near g = 0 a rounding-level difference of g
# moves it by up to lr, anywhere else by far less than rounding. So parameters are compared where |g| is larger.
SMOOTH_GRAD = 1e-4
# Token log-probs of about -2 from two forward passes (the loop's Hugging Face forward, the trainer's lean one) that
# sum in other orders: float32 rounding of a few 1e-6. The loss and the gradients average many of them.
LOGP_TOL = dict(rtol=1e-5, atol=2e-5)


@pytest.fixture(scope="module")
def loop():
    return load_minimal_loop(CHAPTER)


@pytest.fixture(scope="module")
def base():
    policy, tokenizer = load_base_policy("arithmetic")
    return policy, tokenizer, RECIPES["arithmetic"].make_task()


def test_the_loop_is_short_and_imports_only_torch():
    check_torch_only(CHAPTER)


@pytest.mark.parametrize("max_grad_norm", [1.0, 1e9], ids=["clipped", "raw gradient"])
@pytest.mark.parametrize("name, baseline", [("reinforce", "none"), ("rloo", "rloo")])
def test_one_step_of_the_loop_is_one_step_of_the_trainer(loop, base, name, baseline, max_grad_norm):
    policy, tokenizer, task = base
    trained, mine = copy.deepcopy(policy), copy.deepcopy(policy)
    config = preset(name, num_generations=G, per_device_train_batch_size=32, max_completion_length=MAX_LEN,
                    learning_rate=LR, max_grad_norm=max_grad_norm, seed=0)
    trainer = Trainer(trained, tokenizer, task, config)
    rollout = trainer.sample_rollout(0)  # the batch both steps train on
    scored = trainer.score(rollout)
    metrics = trainer.update(scored)  # one optimizer step (one micro-batch of all 32 completions)
    assert metrics["optimizer_steps"] == 1

    batch = rollout.batch
    ids, attention, mask = batch.input_ids, batch.attention_mask, batch.completion_mask
    rewards = loop["score"](task, tokenizer, rollout.examples, ids, mask, G)
    torch.testing.assert_close(rewards, torch.as_tensor(rollout.rewards, dtype=torch.float32), rtol=0, atol=0)
    assert 0 < rewards.sum() < len(rewards), "the batch should hold right and wrong answers"
    torch.testing.assert_close(loop["advantages"](rewards, G, baseline), scored.advantages, **TOL)
    logp = loop["token_logprobs"](mine, ids, attention, mask)
    torch.testing.assert_close(logp.detach(), sequence_logprobs(policy, ids, attention, mask), **LOGP_TOL)

    optimizer = torch.optim.AdamW(mine.parameters(), lr=LR, weight_decay=0.0)
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
        assert optimizer.defaults[key] == trainer.optimizer.defaults[key], key
    fresh = load_minimal_loop(CHAPTER)  # the loop's step on the trainer's batch: its sampler hands that batch over
    fresh["sample"] = lambda *args: (ids, attention, mask)
    loss, mean_reward = fresh["train_step"](mine, optimizer, tokenizer, task, rollout.examples, G, MAX_LEN, None,
                                            baseline=baseline, max_grad_norm=max_grad_norm)

    torch.testing.assert_close(torch.tensor(loss), torch.tensor(metrics["loss/policy"]), **TOL)
    assert mean_reward == pytest.approx(float(rollout.rewards.mean()), abs=1e-7)
    for (label, theirs), ours in zip(trained.named_parameters(), mine.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, **TOL, msg=lambda m: f"the gradient of {label}: {m}")
        smooth = theirs.grad.abs() > SMOOTH_GRAD
        torch.testing.assert_close(ours.detach()[smooth], theirs.detach()[smooth], **TOL,
                                   msg=lambda m: f"{label} after the AdamW step: {m}")


def test_the_loops_sampler_writes_the_trainers_layout(loop, base):
    """The loop's own sampler: G rows per prompt, a completion mask of 1 up to and including the first EOS, padding
    after it, the same draw for the same generator seed; and its log-probs are the package's."""
    policy, tokenizer, task = base
    prompts = [e.prompt for e in task.sample(6, seed=0, split="train")]
    ids, attention, mask = loop["sample"](policy, tokenizer, prompts, G, MAX_LEN, torch.Generator().manual_seed(3))
    again = loop["sample"](policy, tokenizer, prompts, G, MAX_LEN, torch.Generator().manual_seed(3))
    assert all(a.equal(b) for a, b in zip((ids, attention, mask), again))
    assert ids.shape[0] == len(prompts) * G and mask.shape[1] <= MAX_LEN
    completion = ids[:, -mask.shape[1]:]
    is_eos = completion == tokenizer.eos_token_id
    ended_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    assert mask.equal((~ended_before).long()), "1 up to and including the first EOS"
    assert (completion[ended_before] == tokenizer.pad_token_id).all()
    logp = loop["token_logprobs"](policy, ids, attention, mask)
    torch.testing.assert_close(logp.detach(), sequence_logprobs(policy, ids, attention, mask), **LOGP_TOL)


def test_a_step_with_the_loops_own_sampler_moves_the_policy(loop, base):
    policy, tokenizer, task = base
    mine = copy.deepcopy(policy)
    optimizer = torch.optim.AdamW(mine.parameters(), lr=LR, weight_decay=0.0)
    examples = task.sample(4, seed=1, split="train")
    loss, mean_reward = loop["train_step"](mine, optimizer, tokenizer, task, examples, G, MAX_LEN,
                                           torch.Generator().manual_seed(0))
    assert torch.isfinite(torch.tensor(loss)) and 0.0 <= mean_reward <= 1.0
    assert any(not torch.allclose(a, b) for a, b in zip(mine.parameters(), policy.parameters()))
