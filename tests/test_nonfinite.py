"""What the trainer does with NaN: a non-finite reward (raise, or skip its group), a non-finite loss or gradient
norm (an error naming the step, before the optimizer step, so the weights never hold NaN)."""

import numpy as np
import pytest
import torch

from rlbook.lm import build_model, build_tokenizer
from rlbook.presets import RLConfig, preset
from rlbook.tasks import get_task
from rlbook.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(num_generations=4, per_device_train_batch_size=8, max_completion_length=4, max_steps=4,
             learning_rate=1e-3, eval_size=8)


def nan_for_completion(index):
    """A length reward that returns NaN for one completion of every batch (row ``index``)."""
    def reward(examples, completions, truncated):
        rewards = np.array([float(len(c)) for c in completions])
        rewards[index] = np.nan
        return rewards
    return reward


def make_trainer(reward_fn, name="rloo", **overrides):
    config = preset(name, **{**SMALL, **overrides})
    return Trainer(build_model("tiny", seed=0), build_tokenizer(), get_task("arithmetic", num_digits=1), config,
                   reward_fn=reward_fn)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_nonfinite_rewards_must_be_raise_or_skip_group():
    assert RLConfig().nonfinite_rewards == "raise"
    with pytest.raises(ValueError, match="unknown nonfinite_rewards 'drop'"):
        RLConfig(nonfinite_rewards="drop")


def test_a_nan_reward_raises_naming_the_step_the_completion_and_the_fix():
    trainer = make_trainer(nan_for_completion(5))
    trainer.step = 1  # as after one step: the message names the step being taken, 2, as metrics.jsonl counts
    before = weights(trainer.policy)
    with pytest.raises(ValueError) as error:
        trainer.train_step()
    message = str(error.value)
    assert "step 2" in message and "the reward function" in message and "completion 5" in message
    assert "nonfinite_rewards='skip_group'" in message and "nan" in message
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.policy).items())


def test_skip_group_drops_the_groups_with_a_nan_reward_and_counts_them():
    trainer = make_trainer(nan_for_completion(5), nonfinite_rewards="skip_group")  # row 5: group 1 of 2
    rollout = trainer.sample_rollout(0)
    assert len(rollout.examples) == 1 and len(rollout.completions) == 4 and np.isfinite(rollout.rewards).all()
    assert rollout.metrics["nonfinite_rewards/groups_skipped"] == 1
    metrics = trainer.train_step()
    assert metrics["nonfinite_rewards/groups_skipped"] == 1 and metrics["num_completions"] == 8
    assert all(np.isfinite(v) for v in metrics.values() if isinstance(v, float))
    assert all(bool(torch.isfinite(v).all()) for v in weights(trainer.policy).values())


def test_skip_group_with_no_finite_group_left_is_an_error_naming_the_step():
    trainer = make_trainer(lambda e, completions, t: np.full(len(completions), np.inf),
                           nonfinite_rewards="skip_group")
    with pytest.raises(ValueError, match="step 4: the reward function returned a non-finite reward in every"):
        trainer.sample_rollout(3)


def test_skip_group_without_nan_logs_zero_and_changes_nothing():
    def length(examples, completions, truncated):
        return np.array([float(len(c)) for c in completions])

    plain, skipping = make_trainer(length), make_trainer(length, nonfinite_rewards="skip_group")
    a, b = plain.train_step(), skipping.train_step()
    assert b.pop("nonfinite_rewards/groups_skipped") == 0
    assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
        k: v for k, v in b.items() if not k.startswith("time/")}


def test_skip_group_under_dynamic_sampling_counts_every_round():
    trainer = make_trainer(nan_for_completion(0), name="dapo", nonfinite_rewards="skip_group",
                           max_num_gen_batches=2)
    rollout = trainer.sample_rollout(0)
    assert rollout.metrics["nonfinite_rewards/groups_skipped"] >= 1
    assert np.isfinite(rollout.rewards).all()


def length_reward(examples, completions, truncated):
    return np.array([float(len(c)) for c in completions])


def test_nan_log_probs_are_an_error_naming_the_step_and_leave_the_weights_alone(monkeypatch):
    trainer = make_trainer(length_reward)
    scored = trainer.score(trainer.sample_rollout(0))
    learner = trainer._learner

    def nan_learner(*args, **kwargs):
        logp, values, entropies = learner(*args, **kwargs)
        return (None if logp is None else logp * float("nan")), values, entropies

    monkeypatch.setattr(trainer, "_learner", nan_learner)
    before = weights(trainer.policy)
    with pytest.raises(ValueError, match="step 1: the policy's log-probs \\(logp\\) is not finite"):
        trainer.update(scored)
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.policy).items())


def test_a_nan_policy_loss_is_an_error_naming_the_step(monkeypatch):
    import rlbook.trainer as trainer_module

    trainer = make_trainer(length_reward)
    scored = trainer.score(trainer.sample_rollout(0))
    trainer.step = 7
    real = trainer_module.policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(trainer_module, "policy_loss", nan_loss)
    before = weights(trainer.policy)
    with pytest.raises(ValueError, match="step 8: the policy loss is not finite"):
        trainer.update(scored)
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.policy).items())


def test_an_infinite_gradient_is_an_error_before_the_optimizer_step():
    trainer = make_trainer(length_reward)
    scored = trainer.score(trainer.sample_rollout(0))
    before = weights(trainer.policy)
    parameter = next(p for p in trainer.policy.parameters() if p.requires_grad)
    parameter.register_hook(lambda grad: grad * float("inf"))
    with pytest.raises(ValueError, match="step 1: the gradient norm is not finite"):
        trainer.update(scored)
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.policy).items())


def test_the_trl_bridge_refuses_skip_group():
    from rlbook.integrations.trl import unsupported

    assert not unsupported(preset("grpo"))
    assert any("nonfinite_rewards" in r for r in unsupported(preset("grpo", nonfinite_rewards="skip_group")))
