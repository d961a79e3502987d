"""Tests for rlbook.trainer (the one loop) and rlbook.lm.value (the value model)."""

import math

import numpy as np
import pytest
import torch

from rlbook.callbacks import TrainerCallback
from rlbook.lm import build_model, build_tokenizer
from rlbook.lm.value import build_value_model, token_values
from rlbook.presets import PRESETS, RLConfig, preset
from rlbook.rollout import generate_rollouts, sequence_logprobs
from rlbook.tasks import get_task
from rlbook.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(num_generations=4, per_device_train_batch_size=8, max_completion_length=4, max_steps=4,
             learning_rate=1e-3, eval_size=8)


def length_reward(examples, completions, truncated):
    """A reward that varies within every group even for an untrained model: the completion's length."""
    return np.array([float(len(c)) for c in completions])


def make_trainer(name="reinforce_baseline", callbacks=(), **overrides):
    task = get_task("arithmetic", num_digits=1)
    config = preset(name, **{**SMALL, **overrides})
    return Trainer(build_model("tiny", seed=0), build_tokenizer(), task, config, reward_fn=length_reward,
                   callbacks=callbacks)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_and_reports_finite_metrics(name):
    # the untrained model rarely ends within 4 tokens: keep truncated completions in the loss for this check
    short = {"value_pretrain_steps": 1} if PRESETS[name].get("value_pretrain_steps") else {}
    if PRESETS[name].get("gfpo_k"):
        short["gfpo_k"] = 2  # SMALL samples 4 per prompt
    trainer = make_trainer(name, max_steps=2, eval_every=2, mask_truncated_completions=False, **short)
    history = trainer.train(progress=False)
    assert [m["step"] for m in history] == [1, 2]
    last = history[-1]
    for key in ("reward", "accuracy", "completions/mean_length", "entropy", "clip_ratio/region_mean", "approx_kl",
                "loss/policy", "grad_norm", "time/generate", "time/score", "time/update", "eval_accuracy"):
        assert key in last and math.isfinite(last[key]), key
    assert ("loss/value" in last) == (PRESETS[name]["advantage_estimator"] in ("gae", "vapo"))


def test_the_update_changes_the_policy_and_reinforce_ratios_are_one():
    trainer = make_trainer("reinforce_baseline", max_steps=1)
    before = weights(trainer.policy)
    metrics = trainer.train_step()
    assert any(not torch.allclose(before[k], v) for k, v in trainer.policy.state_dict().items())
    # one on-policy pass: old log-probs come from the sampler, so the ratio is 1 up to the two paths' rounding
    assert metrics["ratio/min"] == pytest.approx(1.0, abs=1e-4) and metrics["ratio/max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_ratio/region_mean"] == pytest.approx(0.0, abs=1e-12)


def test_a_sampler_at_another_temperature_enters_the_ratio_only_with_old_logprobs_sampler():
    """sampler_temperature plays an inference engine that disagrees with the learner: the sampler draws and scores
    at 1.5, the learner at 1. With old_logprobs="learner" (TRL) pi_old is recomputed and the first ratio is 1; with
    "sampler" the ratio divides by the sampler's log-probs from the first update on."""
    ratios = {}
    for old in ("learner", "sampler"):
        trainer = make_trainer("grpo", max_steps=1, sampler_temperature=1.5, old_logprobs=old, beta=0.0)
        rollout = trainer.sample_rollout(0)
        assert rollout.batch.temperature == 1.5
        scored = trainer.score(rollout)
        batch = rollout.batch
        learner = sequence_logprobs(trainer.policy, batch.input_ids, batch.attention_mask,
                                    batch.completion_mask.float(), temperature=1.0)
        expected = learner if old == "learner" else batch.logprobs
        torch.testing.assert_close(scored.old_logp, expected, atol=1e-5, rtol=0)
        ratios[old] = trainer.update(scored)
    assert ratios["learner"]["ratio/max"] == pytest.approx(1.0, abs=1e-4)
    assert ratios["sampler"]["ratio/max"] > 1.05 or ratios["sampler"]["ratio/min"] < 0.95


def test_ppo_reuses_each_rollout_and_clipping_becomes_active():
    trainer = make_trainer("ppo", max_steps=3, num_iterations=4, learning_rate=5e-3)
    history = trainer.train(progress=False)
    assert max(m["clip_ratio/region_mean"] for m in history) > 0, "four passes at a high learning rate must move ratios past 1 ± ε"
    assert all("loss/value" in m for m in history)


def test_gradient_accumulation_with_dapo_equals_one_big_batch():
    """Two micro-batches of 8 accumulated (dapo: divided by the step's token count) give the update of one
    micro-batch of 16: same rollouts (same seeds), same minibatch order, same gradient up to rounding."""
    runs = []
    for per_device, accumulation in ((16, 1), (8, 2)):
        trainer = make_trainer("reinforce_baseline", loss_type="dapo", per_device_train_batch_size=per_device,
                               gradient_accumulation_steps=accumulation, max_steps=1)
        trainer.train_step()
        runs.append(weights(trainer.policy))
    for key in runs[0]:
        # Adam divides by sqrt(v): float rounding in tiny gradients shows up at the 1e-6 level
        torch.testing.assert_close(runs[0][key], runs[1][key], rtol=1e-4, atol=2e-5)


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    straight = make_trainer("ppo", max_steps=4)
    straight.train(progress=False)

    first = make_trainer("ppo", max_steps=4)
    first.train(steps=2, progress=False)
    first.save_checkpoint(tmp_path / "ckpt")
    second = make_trainer("ppo", max_steps=4).resume(tmp_path / "ckpt")
    assert second.step == 2
    second.train(progress=False)

    for a, b in zip(straight.history, second.history):
        for key in ("reward", "loss/policy", "loss/value", "approx_kl", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)
    for key, value in weights(straight.policy).items():
        torch.testing.assert_close(value, second.policy.state_dict()[key], rtol=1e-6, atol=1e-8)


def test_resume_refuses_another_config(tmp_path):
    trainer = make_trainer("ppo", max_steps=1)
    trainer.save_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"another config \(differs in \['learning_rate'\]\)"):
        make_trainer("ppo", max_steps=1, learning_rate=2e-3).resume(tmp_path / "ckpt")


def test_metrics_are_written_as_json_lines(tmp_path):
    import json

    task = get_task("arithmetic", num_digits=1)
    trainer = Trainer(build_model("tiny", seed=0), build_tokenizer(), task, preset("rloo", **SMALL),
                      log_file=tmp_path / "log.jsonl")
    trainer.train(steps=2, progress=False)
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_a_reward_function_that_returns_nan_is_a_clear_error():
    task = get_task("arithmetic", num_digits=1)
    trainer = Trainer(build_model("tiny", seed=0), build_tokenizer(), task, preset("rloo", **SMALL),
                      reward_fn=lambda examples, completions, truncated: np.full(len(completions), np.nan))
    with pytest.raises(ValueError, match="finite rewards"):
        trainer.train_step()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(advantage_estimator="vtrace"), "unknown advantage_estimator"),
        (dict(epsilon_high=0.1), "epsilon_high \\(0.1\\) is below epsilon"),
        (dict(adaptive_kl_target=0.1), "needs a starting beta > 0"),
        (dict(kl_placement="reward_model"), "unknown kl_placement"),
        (dict(advantage_estimator="gfpo"), "needs gfpo_k"),
        (dict(learning_rate=float("nan")), "learning_rate must be a finite number"),
        (dict(num_generations=2.5, per_device_train_batch_size=8), "num_generations must be an integer"),
        (dict(num_generations=3, per_device_train_batch_size=8), "multiple of num_generations"),
        (dict(gradient_accumulation_steps=2, steps_per_generation=3), "multiple of gradient_accumulation_steps"),
        (dict(advantage_estimator="rloo", num_generations=1), "needs num_generations >= 2"),
        (dict(learning_rate=0.0), "must be positive"),
        (dict(gamma=1.2), "gamma and lam"),
        (dict(lam=-0.5), "gamma and lam"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(beta=-1.0), "beta"),
        (dict(num_iterations=0), "num_iterations must be an integer >= 1"),
        (dict(advantage_estimator="vapo", lam_critic=1.5), "lam_critic must lie in"),
        (dict(advantage_estimator="vapo", lam_alpha=0.0), "lam_alpha must be positive"),
        (dict(advantage_estimator="gae", lam_alpha=0.05), "need advantage_estimator='vapo'"),
        (dict(adaptive_kl_target=0.0, beta=0.1), "adaptive_kl_target must be positive"),
        (dict(early_stop_kl=-1.0), "early_stop_kl must be positive"),
        (dict(nll_coef=-0.1), "nll_coef and value_pretrain_steps"),
        (dict(value_pretrain_steps=2), "value_pretrain_steps needs a value model"),
        (dict(sampler_temperature=0.0), "sampler_temperature must be a positive finite number"),
        (dict(old_logprobs="engine"), "unknown old_logprobs"),
        (dict(vllm_importance_sampling_mode="token"), "unknown vllm_importance_sampling_mode"),
        (dict(vllm_importance_sampling_clip_min=3.0), r"vllm_importance_sampling_clip_min \(3.0\) must be below"),
        (dict(vllm_importance_sampling_correction=True, vllm_importance_sampling_clip_max=None),
         "needs a positive vllm_importance_sampling_clip_max"),
        (dict(vllm_importance_sampling_correction=True, old_logprobs="sampler"), "needs old_logprobs='learner'"),
        (dict(vllm_importance_sampling_correction=1), "must be True or False"),
        (dict(off_policy_mask_threshold=-0.5), "off_policy_mask_threshold must be a finite number >= 0"),
    ],
)
def test_config_errors(kwargs, match):
    """The config's own rules; the loss's cross-field rules are tested once, in tests/test_rules.py."""
    with pytest.raises(ValueError, match=match):
        RLConfig(**kwargs)


def test_unknown_preset_and_unknown_key():
    with pytest.raises(ValueError, match="unknown preset"):
        preset("trpo")
    with pytest.raises(ValueError, match="unknown RLConfig key 'lr'; did you mean 'learning_rate'"):
        preset("grpo", lr=1e-3)
    with pytest.raises(ValueError, match="unknown RLConfig key 'target_kl'; did you mean 'early_stop_kl'"):
        preset("ppo", target_kl=0.01)  # renamed early_stop_kl: not confused with adaptive_kl_target


class Recorder(TrainerCallback):
    """Keeps what every hook saw, in order."""

    def __init__(self):
        self.calls, self.rollout, self.scored = [], None, None

    def on_train_begin(self, trainer):
        self.calls.append("train_begin")

    def on_rollout_end(self, trainer, rollout):
        self.calls.append("rollout")
        self.rollout = rollout
        return {"recorder/completions": float(len(rollout.completions))}

    def on_score_end(self, trainer, scored):
        self.calls.append("score")
        self.scored = scored

    def on_update_end(self, trainer, scored):
        self.calls.append("update")

    def on_step_end(self, trainer, metrics):
        self.calls.append("step")

    def on_train_end(self, trainer):
        self.calls.append("train_end")


# --- DAPO's techniques ----------------------------------------------------------------------------------------


def test_dynamic_sampling_drops_groups_with_equal_rewards_and_refills_the_batch():
    def some_groups_flat(examples, completions, truncated):
        # prompts whose first operand is even give every completion the same reward: no signal
        return np.array([0.0 if int(e.prompt[0]) % 2 == 0 else float(len(c)) for e, c in zip(examples, completions)])

    task = get_task("arithmetic", num_digits=1)
    config = preset("dapo", **{**SMALL, "per_device_train_batch_size": 16}, max_num_gen_batches=6)
    trainer = Trainer(build_model("tiny", seed=0), build_tokenizer(), task, config, reward_fn=some_groups_flat)
    rollout = trainer.sample_rollout(trainer.step)
    batch, examples, metrics = rollout.batch, rollout.examples, rollout.metrics
    assert len(examples) == config.num_prompts == 4 and len(batch) == 16 == len(rollout.completions)
    assert np.all(rollout.rewards.reshape(-1, 4).std(-1) > 0), "no zero-variance group while rounds are left"
    assert all(int(e.prompt[0]) % 2 == 1 for e in examples)
    assert batch.prompts == [e.prompt for e in examples]
    assert rollout.completions == batch.decode_completions(trainer.tokenizer)
    assert metrics["dynamic_sampling/rounds"] >= 2 and metrics["dynamic_sampling/groups"] == 4
    assert 0 < metrics["frac_reward_zero_std"] < 1


def test_dynamic_sampling_with_no_informative_group_trains_on_the_first_round():
    trainer = make_trainer("dapo", max_num_gen_batches=2, mask_truncated_completions=False)
    trainer.reward_fn = lambda examples, completions, truncated: np.zeros(len(completions))
    metrics = trainer.train_step()
    assert metrics["dynamic_sampling/rounds"] == 2 and metrics["dynamic_sampling/groups"] == 0
    assert metrics["frac_reward_zero_std"] == pytest.approx(1.0)


def test_overlong_filtering_and_the_soft_overlong_punishment():
    from rlbook.tasks.shaping import soft_overlong_penalty

    # an untrained model runs most completions to the 4-token budget
    recorder = Recorder()
    trainer = make_trainer("dapo", dynamic_sampling=False, overlong_buffer_length=2, callbacks=[recorder])
    trainer.reward_fn = lambda examples, completions, truncated: np.zeros(len(completions))
    metrics = trainer.train_step()
    scored = recorder.scored
    batch = scored.rollout.batch
    expected = soft_overlong_penalty(batch.lengths.numpy(), 4, 2)
    np.testing.assert_allclose(scored.rewards, expected, rtol=0, atol=1e-7)
    assert metrics["reward"] == pytest.approx(expected.mean())
    assert 0 < metrics["completions/clipped_ratio"] < 1, "the check needs both kinds of completion"
    truncated = batch.truncated
    assert torch.all(scored.loss_mask[truncated] == 0), "cut-off completions get no loss"
    assert torch.equal(scored.loss_mask[~truncated].bool(), scored.mask[~truncated].bool())


def test_dapo_preset_follows_the_paper_and_scales_its_buffer():
    config = preset("dapo", max_completion_length=16)
    assert (config.epsilon, config.epsilon_high, config.beta, config.loss_type) == (0.2, 0.28, 0.0, "dapo")
    assert config.dynamic_sampling and config.mask_truncated_completions and config.overlong_buffer_length == 4
    assert preset("dapo", overlong_buffer_length=None).overlong_buffer_length is None
    with pytest.raises(ValueError, match="overlong_buffer_length must lie in"):
        RLConfig(max_completion_length=8, overlong_buffer_length=9)


# --- RLHF and VAPO ---------------------------------------------------------------------------------------------


def test_adaptive_kl_controller_updates_beta_from_the_measured_kl():
    from rlbook.objectives import adaptive_kl_coef

    trainer = make_trainer("ppo", beta=0.05, adaptive_kl_target=1e-6, adaptive_kl_horizon=100, max_steps=3,
                           learning_rate=5e-3)
    first, second, third = (trainer.train_step() for _ in range(3))
    assert first["beta"] == pytest.approx(0.05) and first["objective/kl"] == pytest.approx(0.0, abs=1e-5)
    assert second["beta"] == pytest.approx(adaptive_kl_coef(0.05, first["objective/kl"], 1e-6, 8, 100))
    assert second["beta"] < 0.05, "no KL yet (the policy is its reference): beta shrinks"
    assert second["objective/kl"] > 1e-6, "after an update at a high learning rate the policy has moved"
    assert third["beta"] > second["beta"], "KL above a tiny target raises beta"


def test_early_stopping_on_kl_ends_the_rollouts_updates():
    trainer = make_trainer("ppo", num_iterations=4, learning_rate=5e-2, early_stop_kl=1e-9, max_steps=1)
    metrics = trainer.train_step()
    assert metrics["early_stopped"] == pytest.approx(1.0) and metrics["optimizer_steps"] < 4
    assert make_trainer("ppo", num_iterations=4, max_steps=1).train_step()["optimizer_steps"] == 4


def test_vapo_nll_term_is_the_token_mean_nll_of_the_correct_completions_only():
    task = get_task("arithmetic", num_digits=1)
    # the task's rule for this test: a completion of even length is "correct"
    task.is_correct = lambda example, completion, truncated=False: len(completion) % 2 == 0
    task.rewards = lambda examples, completions, truncated: np.array(
        [task.correct_reward if len(c) % 2 == 0 else task.incorrect_reward for c in completions])
    config = preset("vapo", **SMALL, value_pretrain_steps=0, mask_truncated_completions=False)
    recorder = Recorder()
    trainer = Trainer(build_model("tiny", seed=0), build_tokenizer(), task, config, callbacks=[recorder])
    metrics = trainer.train_step()
    scored = recorder.scored
    correct = scored.correct
    assert 0 < correct.float().mean() < 1, "the check needs both kinds of completion"
    tokens = scored.loss_mask * correct[:, None]
    expected = -(scored.old_logp * tokens).sum() / tokens.sum()
    assert metrics["loss/nll"] == pytest.approx(expected.item(), rel=1e-4)
    assert metrics["accuracy"] == pytest.approx(correct.float().mean().item())


def test_value_pretraining_fits_the_critic_and_leaves_the_policy_alone():
    trainer = make_trainer("vapo", value_pretrain_steps=3, max_steps=1, mask_truncated_completions=False)
    policy_before, value_before = weights(trainer.policy), weights(trainer.value_model)
    history = trainer.pretrain_value(3)
    assert len(history) == 3 and all("loss/value" in m and "loss/policy" not in m for m in history)
    assert all(m["time/pretrain"] > 0 for m in history)  # each round's seconds (what a head-to-head charges)
    assert all(torch.allclose(policy_before[k], v) for k, v in trainer.policy.state_dict().items())
    assert any(not torch.allclose(value_before[k], v) for k, v in trainer.value_model.state_dict().items())
    assert trainer.step == 0
    with pytest.raises(ValueError, match="needs a value model"):
        make_trainer("grpo").pretrain_value(1)


def test_a_reward_model_gives_the_reward_and_the_task_rule_the_accuracy():
    task = get_task("arithmetic", num_digits=1)
    trainer = Trainer(build_model("tiny", seed=0), build_tokenizer(), task, preset("rloo", **SMALL),
                      reward_fn=length_reward)
    metrics = trainer.train_step()
    assert metrics["reward"] > 0 and metrics["accuracy"] == pytest.approx(0.0, abs=1e-12), "an untrained model is never right"


# --- GSPO, GMPO, GFPO -----------------------------------------------------------------------------------------


def test_gspo_preset_updates_in_minibatches_so_the_sequence_ratio_moves():
    trainer = make_trainer("gspo", per_device_train_batch_size=4, max_steps=1, learning_rate=1e-2)
    config = trainer.config
    assert config.importance_sampling_level == "sequence" and config.steps_per_generation == 4
    metrics = trainer.train_step()
    assert metrics["optimizer_steps"] == 4
    assert metrics["ratio/max"] > 1 + 1e-6 or metrics["ratio/min"] < 1 - 1e-6


def test_gfpo_trains_only_on_the_kept_completions():
    recorder = Recorder()
    trainer = make_trainer("gfpo", num_generations=8, gfpo_k=3, per_device_train_batch_size=16, max_steps=1,
                           mask_truncated_completions=False, callbacks=[recorder])
    metrics = trainer.train_step()
    scored = recorder.scored
    kept_rows = scored.loss_mask.sum(-1) > 0
    assert kept_rows.view(-1, 8).sum(-1).tolist() == [3, 3]
    assert torch.all(scored.advantages[~kept_rows] == 0)
    kept_length = scored.rollout.batch.lengths[kept_rows].float().mean().item()
    assert metrics["gfpo/kept_mean_length"] == pytest.approx(kept_length)
    with pytest.raises(ValueError, match="gfpo_k must lie in"):
        preset("gfpo", gfpo_k=20)


def test_gfpo_update_forwards_only_the_kept_completions(monkeypatch):
    import rlbook.lm.learner as learner_module  # the update's forward (rlbook.lm.learner.Learner)

    forwarded = []
    real = learner_module.sequence_logprobs

    def counting(model, input_ids, *args, **kwargs):
        forwarded.append(input_ids.shape[0])
        return real(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(learner_module, "sequence_logprobs", counting)
    trainer = make_trainer("gfpo", num_generations=8, gfpo_k=3, per_device_train_batch_size=16, max_steps=1,
                           mask_truncated_completions=False)
    trainer.train_step()
    assert sum(forwarded) == 2 * 3  # two prompts, three kept of eight each; the five filtered rows are not run


# --- the value model ------------------------------------------------------------------------------------------


def test_value_model_copies_the_policy_body_and_starts_at_zero(tokenizer):
    policy = build_model("tiny", seed=3)
    value_model = build_value_model(policy)
    for key, value in policy.base_model.state_dict().items():
        torch.testing.assert_close(value_model.base_model.state_dict()[key], value)
    batch = generate_rollouts(policy, tokenizer, ["1+2=", "3+4="], num_generations=2, max_new_tokens=5, seed=0)
    values = token_values(value_model, batch.input_ids, batch.attention_mask, batch.completion_mask)
    assert values.shape == batch.completion_mask.shape and torch.all(values == 0)
    with pytest.raises(ValueError, match="unknown value-model init"):
        build_value_model(policy, init="critic")
    with pytest.raises(ValueError, match="pass reward_model= exactly when"):
        build_value_model(policy, init="reward_model")


def test_value_of_a_token_is_read_before_it(tokenizer):
    """The value at completion token t must not see token t: changing o_t leaves V_t unchanged."""
    policy = build_model("tiny", seed=3)
    value_model = build_value_model(policy, init="random")
    batch = generate_rollouts(policy, tokenizer, ["12+3="], num_generations=1, max_new_tokens=4, seed=0)
    input_ids, mask = batch.input_ids.clone(), torch.ones_like(batch.completion_mask)
    attention = torch.ones_like(input_ids)
    before = token_values(value_model, input_ids, attention, mask)
    input_ids[0, -1] = (input_ids[0, -1] + 1) % len(tokenizer)
    after = token_values(value_model, input_ids, attention, mask)
    torch.testing.assert_close(before, after)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_trainer_runs_on_cuda_under_bf16_autocast():
    task = get_task("arithmetic", num_digits=1)
    trainer = Trainer(build_model("tiny", seed=0, device="cuda"), build_tokenizer(), task, preset("ppo", **SMALL))
    metrics = trainer.train_step()
    assert math.isfinite(metrics["loss/policy"]) and math.isfinite(metrics["loss/value"])


def test_train_with_eval_curve_starts_at_the_first_step_and_follows_eval_every():
    trainer = make_trainer("rloo", max_steps=4, eval_every=2)
    steps, accuracies = trainer.train_with_eval_curve()
    assert steps == [0, 2, 4] and len(accuracies) == 3 and all(0 <= a <= 1 for a in accuracies)
    assert accuracies[1:] == [m["eval_accuracy"] for m in trainer.history if "eval_accuracy" in m]


# --- λ-GRPO: a learnable λ ------------------------------------------------------------------------------------


def test_lambda_grpo_learns_lambda_toward_the_rewarded_lengths_and_logs_it():
    # length_reward: within a group the longer completions have the higher reward, so lambda must grow
    trainer = make_trainer("lambda_grpo", max_steps=4, max_completion_length=8)
    history = trainer.train(progress=False)
    lambdas = [m["lambda_grpo/lambda"] for m in history]
    assert all(math.isfinite(x) for x in lambdas)
    assert lambdas[-1] > 0.0 and lambdas[-1] > lambdas[0] - 1e-9
    assert float(trainer.response_weight_lambda.detach()) == pytest.approx(lambdas[-1], abs=1e-7)


def test_lambda_grpo_with_a_fixed_lambda_zero_is_the_same_run_as_without_weights():
    fixed = make_trainer("lambda_grpo", max_steps=2, lambda_grpo_learning_rate=0.0)
    fixed.train(progress=False)
    plain = make_trainer("lambda_grpo", max_steps=2, lambda_grpo=False)
    plain.train(progress=False)
    assert [m["lambda_grpo/lambda"] for m in fixed.history] == pytest.approx([0.0, 0.0], abs=1e-12)
    for a, b in zip(fixed.history, plain.history):
        for key in ("reward", "loss/policy", "approx_kl", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def test_lambda_grpo_resume_restores_lambda_and_continues_like_an_uninterrupted_run(tmp_path):
    straight = make_trainer("lambda_grpo", max_steps=4)
    straight.train(progress=False)
    first = make_trainer("lambda_grpo", max_steps=4)
    first.train(steps=2, progress=False)
    first.save_checkpoint(tmp_path / "ckpt")
    second = make_trainer("lambda_grpo", max_steps=4).resume(tmp_path / "ckpt")
    assert float(second.response_weight_lambda.detach()) == pytest.approx(first.history[-1]["lambda_grpo/lambda"],
                                                                          abs=1e-7)
    second.train(progress=False)
    for a, b in zip(straight.history, second.history):
        for key in ("lambda_grpo/lambda", "loss/policy", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lambda_grpo=True, loss_type="gmpo", epsilon=0.4), "lambda_grpo weigh or choose token losses"),
        (dict(lambda_grpo=True, advantage_estimator="rloo"), "lambda_grpo weighs the completions of groups"),
        (dict(lambda_grpo=True, lambda_grpo_r=0.0), "lambda_grpo_r positive"),
        (dict(lambda_grpo=True, lambda_grpo_learning_rate=-1e-3), "lambda_grpo_learning_rate must be >= 0"),
        (dict(lambda_grpo=True, lambda_grpo_init=float("nan")), "lambda_grpo_init must be a finite number"),
    ],
)
def test_lambda_grpo_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RLConfig(**kwargs)


# --- presets, callbacks, metrics -------------------------------------------------------------------------------


# TRL GRPOConfig's algorithm defaults (TRL 1.16)
TRL_GRPO_DEFAULTS = dict(num_generations=8, temperature=1.0, loss_type="dapo", beta=0.0, epsilon=0.2,
                         epsilon_high=None, scale_rewards="group", num_iterations=1, importance_sampling_level="token",
                         mask_truncated_completions=False, max_grad_norm=1.0, weight_decay=0.0,
                         top_entropy_quantile=1.0, entropy_coef=0.0, use_adaptive_entropy=False, entropy_coef_min=0.0,
                         entropy_coef_max=1.0, entropy_coef_delta=0.005, entropy_target=0.2)


def test_rlconfig_defaults_are_the_trl_grpo_preset_and_trls_defaults():
    assert RLConfig() == preset("trl_grpo")
    config = RLConfig()
    for key, value in TRL_GRPO_DEFAULTS.items():
        assert getattr(config, key) == value, key
    try:
        from trl import GRPOConfig
    except ImportError:
        return
    trl_config = GRPOConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True, bf16=False)
    for key, value in TRL_GRPO_DEFAULTS.items():
        assert getattr(trl_config, key) == value, f"TRL's default {key} changed: {getattr(trl_config, key)!r}"


def test_callbacks_see_every_phase_in_order_and_their_metrics_are_merged():
    recorder = Recorder()
    trainer = make_trainer("rloo", max_steps=2, callbacks=[recorder])
    history = trainer.train(progress=False)
    step = ["rollout", "score", "update", "step"]
    assert recorder.calls == ["train_begin", *step, *step, "train_end"]
    assert [m["recorder/completions"] for m in history] == [8.0, 8.0]
    assert recorder.rollout.completions == recorder.rollout.batch.decode_completions(trainer.tokenizer)
    np.testing.assert_allclose(recorder.rollout.rewards, [len(c) for c in recorder.rollout.completions])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_logged_metric_is_explained_in_the_metrics_table(name):
    from rlbook.callbacks import PostUpdateRatios
    from rlbook.metrics import METRICS

    short = {"value_pretrain_steps": 1} if PRESETS[name].get("value_pretrain_steps") else {}
    short.update(gfpo_k=2) if PRESETS[name].get("gfpo_k") else None
    extra = dict(beta=0.05, adaptive_kl_target=0.01) if name in ("ppo", "grpo") else {}
    trainer = make_trainer(name, max_steps=2, eval_every=2, early_stop_kl=10.0, callbacks=[PostUpdateRatios()],
                           **short, **extra)
    trainer.train(progress=False)
    logged = {key for m in trainer.history + trainer.value_pretrain_history for key in m}
    assert logged - set(METRICS) == set(), f"logged but not explained in rlbook.metrics.METRICS: {logged - set(METRICS)}"


def test_the_two_kl_estimates_are_logged_under_different_keys():
    grpo = make_trainer("grpo", beta=0.1, max_steps=2, learning_rate=1e-2).train(progress=False)[-1]
    assert grpo["kl"] > 0 and grpo["objective/kl"] > 0  # k3 in the loss, and the rollout's k1
    assert grpo["kl"] != grpo["objective/kl_per_token"]
    ppo = make_trainer("ppo", beta=0.1, max_steps=2, learning_rate=1e-2).train(progress=False)[-1]
    assert "kl" not in ppo and ppo["objective/kl_per_token"] > 0  # PPO puts the KL in the reward: no k3 in the loss


def test_kl_placement_reward_subtracts_the_summed_k1_from_a_group_methods_reward():
    recorder = Recorder()
    trainer = make_trainer("grpo", beta=0.5, kl_placement="reward", max_steps=2, learning_rate=1e-2,
                           callbacks=[recorder])
    trainer.train(progress=False)
    scored = recorder.scored
    k1 = ((scored.old_logp - scored.ref_logp) * scored.mask).sum(-1)
    assert float(k1.abs().max()) > 1e-4, "the policy must have moved from its reference"
    rewards = torch.as_tensor(scored.rewards, dtype=torch.float32) - 0.5 * k1
    from rlbook.objectives import group_advantages

    torch.testing.assert_close(scored.advantages, group_advantages(rewards, 4), rtol=1e-4, atol=1e-5)
    assert "kl" not in trainer.history[-1], "no KL term in the loss"


def test_entropy_is_the_sampling_distributions_true_entropy():
    """The ``entropy`` metric equals −Σ p log p of softmax(logits / T) recomputed by a teacher-forced forward pass of
    the policy that sampled, and differs from the one-sample proxy −log pi(o_t)."""
    import copy

    from rlbook.lm.model import position_ids_from_mask

    recorder = Recorder()
    trainer = make_trainer("rloo", max_steps=1, temperature=0.7, callbacks=[recorder])
    sampler = copy.deepcopy(trainer.policy)
    metrics = trainer.train_step()
    batch = recorder.rollout.batch
    mask = batch.completion_mask.bool()
    with torch.no_grad():
        logits = sampler(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=position_ids_from_mask(batch.attention_mask)).logits
    T = mask.shape[1]
    log_probs = (logits[:, -T - 1 : -1].float() / 0.7).log_softmax(-1)
    expected = -(log_probs.exp() * log_probs).sum(-1)[mask].mean()
    assert metrics["entropy"] == pytest.approx(expected.item(), rel=1e-4)
    assert metrics["entropy"] != pytest.approx((-batch.logprobs[mask]).mean().item(), rel=1e-3)


def test_a_new_advantage_estimator_is_registered_and_used():
    from rlbook.advantages import ESTIMATORS, Advantages, estimator

    @estimator("sign_test")
    def sign_test(inputs, config):  # +1 for a completion above its group's mean, -1 below
        return Advantages(torch.sign(inputs.rewards.view(-1, inputs.num_generations)
                                     - inputs.rewards.view(-1, inputs.num_generations).mean(-1, keepdim=True)).flatten())

    try:
        recorder = Recorder()
        trainer = make_trainer("rloo", advantage_estimator="sign_test", max_steps=1, callbacks=[recorder])
        trainer.train_step()
        assert set(recorder.scored.advantages.unique().tolist()) <= {-1.0, 0.0, 1.0}
    finally:
        del ESTIMATORS["sign_test"]
    with pytest.raises(ValueError, match="unknown advantage_estimator 'sign_test'"):
        preset("rloo", advantage_estimator="sign_test")


def test_post_update_ratios_match_a_direct_recomputation():
    from rlbook.callbacks import PostUpdateRatios

    recorder = Recorder()
    trainer = make_trainer("gspo", per_device_train_batch_size=4, max_steps=1, learning_rate=1e-2,
                           callbacks=[recorder, PostUpdateRatios()])
    metrics = trainer.train_step()
    scored = recorder.scored
    with torch.no_grad():
        logp = sequence_logprobs(trainer.policy, scored.input_ids, scored.attention_mask, scored.mask)
    log_ratio = (logp - scored.old_logp) * scored.mask
    sequence = log_ratio.sum(-1) / scored.mask.sum(-1)
    assert metrics["post_update/log_ratio_sequence_var"] == pytest.approx(sequence.var().item(), rel=1e-5)
    assert metrics["post_update/max_abs_log_ratio_token"] == pytest.approx(
        log_ratio[scored.mask.bool()].abs().max().item(), rel=1e-5)
    assert metrics["post_update/log_ratio_token_var"] > 0


def test_explained_variance_has_one_centred_definition():
    from rlbook.metrics import explained_variance

    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 7.0, 7.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(returns + 10.0, returns, mask) == pytest.approx(1.0)  # a constant offset: centred
    constant = torch.full_like(returns, 3.0)
    assert explained_variance(constant, returns, mask) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(returns, torch.ones_like(returns), mask) is None


# --- TRL 1.16's variants in the loop ------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [
    dict(loss_type="cispo", epsilon_high=5.0),
    dict(loss_type="sapo", sapo_temperature_neg=2.0),
    dict(delta=4.0, num_iterations=2),
    dict(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
         sampler_temperature=1.3),
    dict(vllm_importance_sampling_correction=True, sampler_temperature=1.3, off_policy_mask_threshold=0.0,
         num_iterations=2),
    dict(top_entropy_quantile=0.2, entropy_coef=0.01),
    dict(use_adaptive_entropy=True, entropy_target=100.0, gradient_accumulation_steps=2, steps_per_generation=2),
    dict(covariance_method="clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-100.0, clip_cov_ub=100.0, num_iterations=2),
    dict(covariance_method="kl_cov", kl_cov_ratio=0.2, num_iterations=2),
])
def test_trl_variants_train_and_log_explained_finite_metrics(overrides):
    from rlbook.metrics import METRICS

    history = make_trainer("trl_grpo", max_steps=2, **overrides).train(progress=False)
    logged = {key for m in history for key in m}
    assert logged - set(METRICS) == set(), f"logged but not explained in METRICS: {logged - set(METRICS)}"
    assert all(math.isfinite(v) for m in history for v in m.values())
    if overrides.get("loss_type") == "cispo":
        assert "cispo_clip_ratio" in history[-1]
    if overrides.get("vllm_importance_sampling_correction"):
        assert history[-1]["sampling/sampling_logp_difference/max"] > 0.01  # the sampler runs at another temperature
    if overrides.get("off_policy_mask_threshold") is not None:
        assert "off_policy_mask/masked_mean" in history[-1]
    if "top_entropy_quantile" in overrides:
        assert 0.15 < history[-1]["entropy_mask/kept_mean"] < 0.5
    if "covariance_method" in overrides:
        assert 0.1 < history[-1]["covariance/selected_mean"] <= 0.2


def test_the_sampler_correction_weighs_the_update():
    """The sampler at temperature 1.5, the learner at 1: pi_old / pi_sampler is far from 1. A masked-IS band that
    holds none of the weights leaves every token loss 0 (no change to the policy); truncation to [0.5, 2] weighs
    each token's loss by scored.importance_sampling_ratio, computed from the recomputed pi_old and the sampler's
    log-probs."""
    settings = dict(max_steps=1, sampler_temperature=1.5, vllm_importance_sampling_correction=True)
    masked = make_trainer("trl_grpo", vllm_importance_sampling_mode="token_mask",
                          vllm_importance_sampling_clip_min=50.0, vllm_importance_sampling_clip_max=100.0, **settings)
    before = weights(masked.policy)
    scored = masked.score(masked.sample_rollout(0))
    assert float(scored.importance_sampling_ratio.abs().max()) == 0.0
    masked.update(scored)
    assert all(torch.equal(before[k], v) for k, v in masked.policy.state_dict().items())

    truncated = make_trainer("trl_grpo", vllm_importance_sampling_mode="token_truncate",
                             vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=2.0, **settings)
    scored = truncated.score(truncated.sample_rollout(0))
    mask = scored.mask.bool()
    expected = (scored.old_logp - scored.rollout.batch.logprobs).exp().clamp(0.5, 2.0)
    torch.testing.assert_close(scored.importance_sampling_ratio[mask], expected[mask])
    assert float((expected[mask] - 1).abs().max()) > 0.05
    assert scored.metrics["sampling/importance_sampling_ratio/max"] <= 2.0


def test_the_correction_recomputes_pi_old_and_is_one_when_sampler_and_learner_agree():
    trainer = make_trainer("trl_grpo", max_steps=1, vllm_importance_sampling_correction=True,
                           vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.999,
                           vllm_importance_sampling_clip_max=1.001)
    scored = trainer.score(trainer.sample_rollout(0))
    mask = scored.mask.bool()
    assert scored.old_logp is not scored.rollout.batch.logprobs  # recomputed by the training forward
    assert scored.metrics["sampling/sampling_logp_difference/max"] < 1e-4  # float32: the two paths agree
    assert bool((scored.importance_sampling_ratio[mask] > 0.999).all())  # every weight ~1, none masked


# --- the entropy methods in the loop -------------------------------------------------------------------------------


def constant_reward(examples, completions, truncated):
    return np.zeros(len(completions))


def test_the_entropy_bonus_alone_raises_the_learners_entropy():
    """Equal rewards: every advantage is 0 and the policy loss has no gradient, so the update follows the bonus
    alone; the learner's entropy on the same completions must rise (and stay put without the bonus)."""
    changes = {}
    for coef in (0.0, 0.5):
        trainer = make_trainer("trl_grpo", max_steps=1, entropy_coef=coef, learning_rate=1e-2)
        trainer.reward_fn = constant_reward
        scored = trainer.score(trainer.sample_rollout(0))

        def mean_entropy():
            with torch.no_grad():
                _, entropies = sequence_logprobs(trainer.policy, scored.input_ids, scored.attention_mask,
                                                 scored.mask, with_entropy=True)
            return float((entropies * scored.mask).sum() / scored.mask.sum())

        before = mean_entropy()
        metrics = trainer.update(scored)
        changes[coef] = mean_entropy() - before
        if coef:
            assert metrics["entropy_coef"] == coef
    assert changes[0.5] > 0.01, changes
    assert abs(changes[0.0]) < 1e-6, changes


def test_adaptive_entropy_moves_the_coefficient_once_per_optimizer_step_and_resumes(tmp_path):
    settings = dict(use_adaptive_entropy=True, entropy_coef=0.01, entropy_coef_delta=0.004, max_steps=4,
                    gradient_accumulation_steps=2, steps_per_generation=4, per_device_train_batch_size=4)
    # entropy below a 100-nat target at every step: +delta per optimizer step, two per training step
    trainer = make_trainer("trl_grpo", entropy_target=100.0, **settings)
    history = trainer.train(steps=2, progress=False)
    assert [m["optimizer_steps"] for m in history] == [2, 2]
    assert trainer.entropy_coef == pytest.approx(0.01 + 4 * 0.004)
    # above a 0-nat target: down, floored at entropy_coef_min
    falling = make_trainer("trl_grpo", entropy_target=0.0, **settings)
    falling.train(steps=2, progress=False)
    assert falling.entropy_coef == 0.0 and falling.last_entropy > 0
    # resumed from a checkpoint, the controller continues where it was
    trainer.save_checkpoint(tmp_path / "ckpt")
    resumed = make_trainer("trl_grpo", entropy_target=100.0, **settings).resume(tmp_path / "ckpt")
    assert resumed.entropy_coef == trainer.entropy_coef and resumed.last_entropy == trainer.last_entropy
    straight = make_trainer("trl_grpo", entropy_target=100.0, **settings)
    straight.train(progress=False)
    resumed.train(progress=False)
    for a, b in zip(straight.history[2:], resumed.history[2:]):
        assert a["entropy_coef"] == pytest.approx(b["entropy_coef"]) and a["loss/policy"] == pytest.approx(
            b["loss/policy"], rel=1e-5, abs=1e-8)


def test_the_high_entropy_filter_at_quantile_0_moves_the_policy_less():
    """top_entropy_quantile 0 keeps only the single highest-entropy token of each micro-batch: the update then
    moves the policy much less than the unfiltered one from the same rollout."""
    moved = {}
    for quantile in (1.0, 0.0):
        trainer = make_trainer("trl_grpo", max_steps=1, top_entropy_quantile=quantile, learning_rate=1e-2)
        before = weights(trainer.policy)
        metrics = trainer.update(trainer.score(trainer.sample_rollout(0)))
        moved[quantile] = sum(float((v - before[k]).norm()) for k, v in trainer.policy.state_dict().items())
        if quantile == 0.0:
            assert metrics["entropy_mask/kept_mean"] < 0.1
    assert moved[0.0] < moved[1.0], moved


def test_train_split_without_validation_keeps_the_validation_problems_unseen():
    from rlbook.tasks.base import split_bucket

    trainer = make_trainer("trl_grpo", max_steps=1, train_split="train_without_validation")
    for step in range(3):
        rollout = trainer.sample_rollout(step)
        keys = {trainer.task.split_key(e) for e in rollout.examples}
        assert keys and all(split_bucket(k) >= 20 for k in keys)
