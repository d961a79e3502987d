"""Reduced runs of the scripts in experiments/ (each a few seconds): they run, and their results have the shape
and the properties the chapters rely on."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_stored(name):
    """The stored results of ``experiments/<name>.py`` (skips the test while they are not stored yet)."""
    import json

    path = EXPERIMENTS / "results" / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path.name} not stored yet")
    return json.loads(path.read_text())


# ---------------------------------------------------------------- chapter 4: the policy-gradient theorem
def test_pg_gradient_variance_reduced_run():
    script = load_script("pg_gradient_variance")
    result = script.run(group_sizes=(4,), seeds=(0,), num_batches=3, batch_size=16)
    variance = {name: result["total_variance"][name][0][0] for name in script.ESTIMATORS}
    assert all(math.isfinite(v) and v >= 0 for v in variance.values())
    # the group-mean advantage is (G - 1)/G times RLOO's on every batch, so its variance is ((G - 1)/G)^2 times
    assert variance["group_mean"] == pytest.approx((3 / 4) ** 2 * variance["rloo"], rel=1e-4)


def test_pg_gradient_variance_rejects_an_unknown_estimator():
    script = load_script("pg_gradient_variance")
    import torch

    with pytest.raises(ValueError, match="unknown estimator"):
        script.advantages(torch.zeros(4), "a2c", 2)


def test_pg_training_reduced_run():
    script = load_script("pg_training")
    result = script.run(presets=("reinforce", "rloo"), seeds=(0,), max_steps=2, eval_every=2, eval_size=8,
                        num_generations=4, per_device_train_batch_size=8)
    for name in ("reinforce", "rloo"):
        (run,) = result["runs"][name]
        assert run["eval_steps"] == [0, 2] and len(run["reward"]) == 2
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"]) and np.isfinite(run["grad_norm"]).all()


def test_pg_stored_results_match_the_scripts():
    """The stored results the chapter plots were made by the current scripts' settings, >= 5 seeds."""
    for name in ("pg_gradient_variance", "pg_training"):
        stored = load_stored(name)
        assert len(stored["seeds"]) >= 5, name


# ---------------------------------------------------------------- chapter 5: PPO against REINFORCE
def test_ppo_compare_reduced_run():
    script = load_script("ppo_compare")
    for algorithm in script.ALGORITHMS:
        record = script.run("arithmetic", algorithm, seed=0, steps=2, eval_every=1, eval_size=8,
                            num_generations=4, per_device_train_batch_size=8)
        assert record["eval_steps"] == [0, 1, 2] and all(0.0 <= a <= 1.0 for a in record["eval_accuracy"])
        assert len(record["metrics"]["reward"]) == 2 and all(math.isfinite(x) for x in record["metrics"]["approx_kl"])
        if algorithm.startswith("ppo"):  # a value model and four epochs: value metrics exist and the ratio moved
            assert all(math.isfinite(x) for x in record["metrics"]["value_loss"])
            assert max(record["metrics"]["ratio_max"]) > 1.0
        else:  # one on-policy update: the ratio is 1 and nothing is clipped
            assert record["metrics"]["clip_frac"] == [0.0, 0.0]


@pytest.mark.parametrize("name", ["ppo_compare", "grpo_training"])
def test_preset_comparison_stored_results_match_the_script(name):
    """The stored comparison (chapter 5's, the GRPO chapter's) has >= 5 seeds per algorithm, made with the
    script's current settings."""
    script = load_script(name)
    stored = load_stored(name)
    for algorithm, spec in script.ALGORITHMS.items():
        runs = [r for r in stored["runs"] if r["algorithm"] == algorithm]
        assert len({r["seed"] for r in runs}) >= 5, algorithm
        for run in runs:
            assert run["config"]["learning_rate"] == pytest.approx(spec["learning_rate"])
            assert run["eval_steps"][-1] == run["config"]["max_steps"]


# ---------------------------------------------------------------- chapter "DAPO": three ablations
def test_dapo_ablations_reduced_run():
    script = load_script("dapo_ablations")
    result = script.run(seeds=(0,), steps=2)
    for name, spec in script.ABLATIONS.items():
        ablation = result["ablations"][name]
        assert set(ablation["runs"]) == set(spec["arms"])
        for arm, (run,) in ablation["runs"].items():
            assert len(run["reward"]) == 2 and all(0.0 <= f <= 1.0 for f in run["truncated_frac"])
            assert all(math.isfinite(x) and x >= 0 for x in run["neg_logp"])
    dynamic = result["ablations"]["dynamic"]["runs"]["on"][0]
    prompts = script.COMMON["per_device_train_batch_size"] // script.COMMON["num_generations"]
    rounds = script.ABLATIONS["dynamic"]["arms"]["on"]["max_num_gen_batches"]
    for groups, used in zip(dynamic["num_groups"], dynamic["gen_rounds"]):
        assert 1 <= used <= rounds and (groups == prompts or used == rounds)  # full batch unless out of rounds
    assert "gen_rounds" not in result["ablations"]["dynamic"]["runs"]["off"][0]


def test_dapo_stored_results_match_the_script():
    """The stored ablations have >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("dapo_ablations")
    stored = load_stored("dapo_ablations")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON
    for name, spec in script.ABLATIONS.items():
        ablation = stored["ablations"][name]
        assert ablation["settings"] == spec["common"] and ablation["arm_settings"] == spec["arms"]
        for arm in spec["arms"]:
            assert len(ablation["runs"][arm]) == len(stored["seeds"])
            assert all(len(run["reward"]) == ablation["steps"] == spec["steps"] for run in ablation["runs"][arm])


# ---------------------------------------------------------------- Dr. GRPO: length of wrong and correct answers
def test_drgrpo_length_stats_by_hand():
    script = load_script("drgrpo_length")
    from rlbook.checkpoints import RECIPES

    task = RECIPES[script.POLICY].make_task()
    examples = task.sample(2, seed=0, split="test")
    reference = [task.demonstration(e) for e in examples]
    completions = [reference[0], reference[1] + "|123"]  # the first right, the second 4 characters too long
    stats = script.length_stats(task, examples, completions, task.rewards(examples, completions, [False, False]))
    assert stats["excess_correct"] == pytest.approx(0.0) and stats["length_correct"] == len(reference[0])
    assert stats["excess_wrong"] == pytest.approx(4.0) and stats["length_wrong"] == len(reference[1]) + 4


def test_drgrpo_length_reduced_run():
    script = load_script("drgrpo_length")
    result = script.run(seeds=(0,), max_steps=2, eval_every=2, eval_size=8, num_generations=4,
                        per_device_train_batch_size=8)
    assert set(result["runs"]) == set(script.PRESETS) and result["settings"]["beta"] == pytest.approx(0.0)
    for name in script.PRESETS:
        (run,) = result["runs"][name]
        assert run["eval_steps"] == [0, 2] and len(run["accuracy"]) == len(run["excess_wrong"]) == 2
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"] + run["truncated_frac"])


def test_drgrpo_stored_results_match_the_script():
    """The stored results the chapter plots: >= 5 seeds per preset, made with the script's current settings."""
    script = load_script("drgrpo_length")
    stored = load_stored("drgrpo_length")
    assert len(stored["seeds"]) >= 5 and stored["settings"] == script.SETTINGS
    for name in script.PRESETS:
        assert len(stored["runs"][name]) == len(stored["seeds"])
        assert all(len(run["excess_wrong"]) == script.SETTINGS["max_steps"] for run in stored["runs"][name])


# ---------------------------------------------------------------- GRPO chapter: GRPO against PPO at equal samples
def test_grpo_training_reduced_run():
    script = load_script("grpo_training")
    for algorithm in script.ALGORITHMS:
        record = script.run("arithmetic", algorithm, seed=0, steps=2, eval_every=1, eval_size=8,
                            num_generations=4, per_device_train_batch_size=8)
        assert record["eval_steps"] == [0, 1, 2] and all(0.0 <= a <= 1.0 for a in record["eval_accuracy"])
        assert len(record["metrics"]["reward"]) == 2
        if algorithm == "grpo":  # one on-policy update with k3 in the loss: nothing clipped, KL to the reference logged
            assert record["metrics"]["clip_frac"] == [0.0, 0.0]
            assert all(math.isfinite(x) and x >= 0.0 for x in record["metrics"]["kl_ref"])
        else:
            assert all(math.isfinite(x) for x in record["metrics"]["value_loss"])


# ---------------------------------------------------------------- chapter "VAPO": PPO against VAPO on sort_scratchpad
def test_vapo_compare_reduced_run():
    script = load_script("vapo_compare")
    for arm in ("vapo", "vapo_lam095"):  # a fresh module per load_script: nothing to restore
        script.ARMS[arm]["value_pretrain_steps"] = 1
    result = script.run(seeds=(0,), steps=2, eval_size=8)
    assert set(result["runs"]) == set(script.ARMS)
    for arm, (run,) in result["runs"].items():
        assert run["eval_steps"] == [0, 2] and all(0.0 <= a <= 1.0 for a in run["eval_accuracy"])
        lam = run["metrics"]["lam_policy"]
        assert len(lam) == 2 and all(0.0 <= x <= 1.0 for x in lam)
        if arm == "ppo":
            assert lam == pytest.approx([0.95, 0.95]) and run["pretrain"]["value_loss"] == []
    assert len(result["runs"]["vapo"][0]["pretrain"]["value_loss"]) == 1
    assert result["runs"]["vapo_lam095"][0]["metrics"]["lam_policy"] == pytest.approx([0.95, 0.95])
    assert result["runs"]["vapo_no_vp_dgae"][0]["pretrain"]["value_loss"] == []


def test_vapo_coupled_critic_uses_the_policy_lambda():
    """The ablation's critic targets equal GAE with the per-row length-adaptive lambda, plus V."""
    import torch

    from rlbook.objectives import gae, length_adaptive_lam

    script = load_script("vapo_compare")
    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.trainer import preset

    policy, tokenizer = load_base_policy(script.TASK)
    config = preset("vapo", num_generations=4, per_device_train_batch_size=8, max_completion_length=40,
                    value_pretrain_steps=0)
    trainer = script.VapoTrainer(policy, tokenizer, RECIPES[script.TASK].make_task(), config, coupled_critic=True)
    batch, examples, rewards, _ = trainer._sample_groups(0)
    out = trainer._score(batch, examples, rewards)
    mask = out["mask"]
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(mask)), batch.lengths - 1] = torch.as_tensor(rewards, dtype=torch.float32)
    expected = gae(token_rewards, out["old_values"], mask, 1.0, length_adaptive_lam(batch.lengths, 0.05))[1]
    torch.testing.assert_close(out["returns"], expected, atol=1e-5, rtol=1e-5)


def test_vapo_stored_results_match_the_script():
    """The stored comparison has >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("vapo_compare")
    stored = load_stored("vapo_compare")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON and stored["arms"] == script.ARMS
    assert stored["task"] == script.TASK and stored["pretrain_steps"] == script.PRETRAIN_STEPS
    for arm in script.ARMS:
        runs = stored["runs"][arm]
        assert len(runs) == len(stored["seeds"])
        assert all(len(run["metrics"]["reward"]) == stored["steps"] for run in runs)
        assert all(run["eval_steps"][-1] == stored["steps"] for run in runs)


# ---------------------------------------------------------------- PPO for RLHF: a learned reward, gold on the side
def test_rlhf_overopt_reduced_run():
    script = load_script("rlhf_overopt")
    result = script.run(betas=(0.05,), seeds=(0,), steps=2, reward_steps=2)
    assert result["score_std"] > 0 and all(0.0 <= a <= 1.0 for a in result["reward_model_pair_accuracy"])
    (run,) = result["runs"]["0.05"]
    assert len(run["reward"]) == 2 and run["eval_steps"][0] == 0
    (control,) = result["runs"]["gold_reward"]
    assert control["reward"] == pytest.approx(control["accuracy"])  # the task's reward is 1 exactly when correct
    assert all(0.0 <= a <= 1.0 for a in run["accuracy"] + run["eval_accuracy"])
    assert all(math.isfinite(x) for key in ("kl_ref", "value_loss", "explained_variance", "clip_frac")
               for x in run[key])


def test_rlhf_value_model_starts_at_the_normalised_score():
    """The value head rescaled from the reward model, read at the last real token of prompt + completion (EOS),
    gives (r - mean) / std there: the normalised score."""
    import torch

    from rlbook.checkpoints import load_base_policy
    from rlbook.reward_model import RewardModelScorer, build_reward_model, sequence_scores
    from rlbook.rollout import encode_completions

    script = load_script("rlhf_overopt")
    policy, tokenizer = load_base_policy("arithmetic")
    reward_model = build_reward_model(policy)
    with torch.no_grad():
        reward_model.score.weight.normal_(std=0.1, generator=torch.Generator().manual_seed(0))
    value_model = script.value_from_reward_model(policy, reward_model, mean=0.3, std=2.0)
    prompts, completions = ["12+34=", "5+6="], ["46", "12"]
    scorer = RewardModelScorer(reward_model, tokenizer, mean=0.3, std=2.0, clip=None)
    expected = (scorer.raw_scores(prompts, completions) - 0.3) / 2.0
    input_ids, attention_mask, _ = encode_completions(tokenizer, prompts, completions)
    with torch.no_grad():
        got = sequence_scores(value_model, input_ids, attention_mask)
    torch.testing.assert_close(got.double(), torch.as_tensor(expected), atol=1e-5, rtol=1e-5)


def test_rlhf_stored_results_match_the_script():
    script = load_script("rlhf_overopt")
    stored = load_stored("rlhf_overopt")
    assert stored["rl"] == script.RL and stored["reward_model"] == script.REWARD_MODEL
    assert stored["betas"] == list(script.BETAS) and stored["steps"] == script.STEPS
    assert stored["control_beta"] == script.CONTROL_BETA
    for beta in [*script.BETAS, "gold_reward"]:
        runs = stored["runs"][str(beta)]
        assert len(runs) == len(stored["seeds"]) >= 3
        assert all(len(run["reward"]) == script.STEPS for run in runs)


def test_dpo_sweep_reduced_run():
    script = load_script("dpo_sweep")
    result = script.run(1, ("sigmoid_0.5", "ipo_0.5"), steps=4, eval_every=2, num_train_pairs=64,
                        num_test_pairs=32, num_eval_problems=16)
    assert [r["arm"] for r in result["runs"]] == ["sigmoid_0.5", "ipo_0.5"]
    for run in result["runs"]:
        assert run["eval_steps"] == [2, 4]
        assert set(run["eval"]) == set(script.KEEP)
        assert 0.0 <= run["accuracy_before"] <= 1.0 and 0.0 <= run["accuracy_after"] <= 1.0


def test_dpo_stored_results_match_the_script():
    import json

    script = load_script("dpo_sweep")
    stored = json.loads((EXPERIMENTS / "results" / "dpo_sweep.json").read_text())
    assert stored["arms"] == script.ARMS and stored["steps"] == script.STEPS and stored["train"] == script.TRAIN
    seeds = {}
    for run in stored["runs"]:
        seeds.setdefault(run["arm"], set()).add(run["seed"])
        assert run["eval_steps"][-1] == script.STEPS
    assert set(seeds) == set(script.ARMS) and all(len(s) >= 5 for s in seeds.values())


# ---------------------------------------------------------------- GFPO: length inflation under GRPO and GFPO
def test_gfpo_length_excess_by_hand():
    script = load_script("gfpo_length")
    from rlbook.checkpoints import RECIPES

    task = RECIPES[script.POLICY].make_task()
    examples = task.sample(2, seed=0, split="test")
    reference = [task.demonstration(e) for e in examples]
    got = script.excess_lengths(task, examples, [reference[0], reference[1] + "|123"])
    np.testing.assert_allclose(got, [0.0, 4.0], atol=1e-12)


def test_gfpo_length_reduced_run():
    script = load_script("gfpo_length")
    result = script.run(seeds=(0,), held_out_size=8, max_steps=2, eval_every=2, eval_size=8)
    assert set(result["runs"]) == set(script.METHODS)
    for name in script.METHODS:
        (run,) = result["runs"][name]
        assert run["eval_steps"] == [0, 2] and len(run["excess_length"]) == len(run["time_step"]) == 2
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"] + [run["start"]["accuracy"], run["end"]["accuracy"]])
        filtered = name != "grpo"
        assert all((k is not None) == filtered for k in run["kept_length"]), "survivors' length logged by GFPO only"


def test_gfpo_stored_results_match_the_script():
    """The stored results the chapter plots: >= 5 seeds per method, made with the script's current settings."""
    script = load_script("gfpo_length")
    stored = load_stored("gfpo_length")
    assert len(stored["seeds"]) >= 5 and stored["settings"] == script.SETTINGS
    assert stored["methods"] == {name: spec for name, (_, spec) in script.METHODS.items()}
    for name in script.METHODS:
        assert len(stored["runs"][name]) == len(stored["seeds"])
        assert all(len(run["excess_length"]) == script.SETTINGS["max_steps"] for run in stored["runs"][name])


# ---------------------------------------------------------------- GSPO: token vs sequence ratios on a dense and a MoE policy
def test_gspo_moe_reduced_run():
    script = load_script("gspo_moe")
    result = script.run(seeds=(0,), steps=2, moe_sft_steps=3)
    assert result["moe_sft"]["sft_steps"] == 3 and result["moe_sft"]["parameters"] > 0
    for arm, spec in script.ARMS.items():
        (run,) = result["runs"][arm]
        assert len(run["reward"]) == 2 and run["eval_steps"][0] == 0
        assert all(math.isfinite(v) and v >= 0 for v in run["var_sequence"] + run["var_token"])
        if spec["policy"] == "moe":
            assert all(0.0 <= f <= 1.0 for f in run["route_changed"])
        else:
            assert run["route_changed"] == [None, None]


def test_gspo_moe_stored_results_match_the_script():
    """The stored runs have >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("gspo_moe")
    stored = load_stored("gspo_moe")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON and stored["arms"] == script.ARMS
    assert stored["moe"] == script.MOE and stored["steps"] == script.STEPS
    for arm in script.ARMS:
        assert len(stored["runs"][arm]) == len(stored["seeds"])
        assert all(len(run["reward"]) == script.STEPS for run in stored["runs"][arm])


# ---------------------------------------------------------------- λ-GRPO: learnable λ against the fixed aggregations
def test_lambda_grpo_compare_reduced_run():
    script = load_script("lambda_grpo_compare")
    result = script.run(seeds=(0,), max_steps=2, eval_every=2, eval_size=8, per_device_train_batch_size=16)
    assert set(result["runs"]) == set(script.METHODS)
    for name in script.METHODS:
        (run,) = result["runs"][name]
        assert run["eval_steps"] == [0, 2] and all(0.0 <= a <= 1.0 for a in run["eval_accuracy"])
        assert len(run["metrics"]["completion_length"]) == 2
        learned = name == "lambda_grpo"
        assert all((x is not None) == learned for x in run["metrics"]["lambda"]), "lambda logged by lambda_grpo only"
        assert run["config"]["loss_type"] == {"grpo": "grpo", "dr_grpo": "dr_grpo"}.get(name, "dapo")


def test_lambda_grpo_stored_results_match_the_script():
    """The stored results the chapter plots: >= 5 seeds per method, made with the script's current settings."""
    script = load_script("lambda_grpo_compare")
    stored = load_stored("lambda_grpo_compare")
    assert len(stored["seeds"]) >= 5 and stored["settings"] == script.SETTINGS
    assert stored["methods"] == script.METHODS and stored["preset"] == script.PRESET
    for name in script.METHODS:
        assert len(stored["runs"][name]) == len(stored["seeds"])
        for run in stored["runs"][name]:
            assert len(run["metrics"]["accuracy"]) == script.SETTINGS["max_steps"]
            assert all(math.isfinite(x) for x in run["metrics"]["lambda"]) if name == "lambda_grpo" else True


# ---------------------------------------------------------------- GMPO: geometric vs arithmetic mean, ratios moving
def test_gmpo_stability_reduced_run():
    script = load_script("gmpo_stability")
    result = script.run(arms=("grpo", "gmpo_fast"), seeds=(0,), steps=2, eval_every=2, eval_size=8)
    for arm in ("grpo", "gmpo_fast"):
        (run,) = result["runs"][arm]
        assert len(run["reward"]) == 2 and run["eval_steps"] == [0, 2]
        assert all(0.0 <= a <= 1.0 for a in run["eval_accuracy"])
        assert all(0 < lo <= 1 <= hi for lo, hi in zip(run["ratio_min"], run["ratio_max"]))
        assert all(s <= t + 1e-6 for s, t in zip(run["max_abs_sequence"], run["max_abs_token"]))


def test_gmpo_stability_stored_results_match_the_script():
    """The stored runs have >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("gmpo_stability")
    stored = load_stored("gmpo_stability")
    assert len(stored["seeds"]) >= 5 and stored["common"] == script.COMMON and stored["arms"] == script.ARMS
    assert stored["steps"] == script.STEPS
    for arm in script.ARMS:
        assert len(stored["runs"][arm]) == len(stored["seeds"])
        assert all(len(run["reward"]) == script.STEPS for run in stored["runs"][arm])


# ---------------------------------------------------------------- GAPO: adversarial encoder vs frozen encoder vs DPO
def test_gapo_compare_reduced_run():
    script = load_script("gapo_compare")
    result = script.run(seeds=(0,), rounds=1, gen_steps=1, enc_steps=1, enc_steps_more=2, warmup_steps=2)
    assert result["updates"] == [0, 1]
    for name in ("gapo", "gapo_more_encoder", "ppo_frozen", "dpo"):
        (run,) = result["runs"][name]
        assert len(run["gold"]) == 2 and all(0.0 <= g <= 1.0 for g in run["gold"])
    assert result["runs"]["gapo"][0]["gold"][0] == pytest.approx(result["runs"]["dpo"][0]["gold"][0])  # same start
    frozen = result["runs"]["ppo_frozen"][0]["pair_accuracy"]
    assert frozen[0] == pytest.approx(frozen[1])  # the frozen encoder does not move


def test_gapo_compare_stored_results_match_the_script():
    """The stored runs have >= 5 seeds per method, made with the script's current settings."""
    script = load_script("gapo_compare")
    stored = load_stored("gapo_compare")
    assert len(stored["seeds"]) >= 5 and stored["settings"] == script.GAPO and stored["dpo"] == script.DPO
    assert (stored["rounds"], stored["generator_steps"], stored["encoder_steps"], stored["encoder_steps_more"]) == (
        script.ROUNDS, script.GEN_STEPS, script.ENC_STEPS, script.ENC_STEPS_MORE)
    for runs in stored["runs"].values():
        assert len(runs) == len(stored["seeds"]) and all(len(r["gold"]) == script.ROUNDS + 1 for r in runs)
