"""Reduced runs of experiments/rlhf (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import math

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_rlhf_overopt_reduced_run():
    script = load_script("rlhf_overopt")
    result = script.run(betas=(0.05,), seeds=(0,), steps=2, reward_steps=2)
    assert result["score_std"] > 0 and all(0.0 <= a <= 1.0 for a in result["reward_model_pair_accuracy"])
    assert result["arms"] == {"0.05": {"preset": "ppo", "beta": 0.05}, "gold_reward": {"preset": "ppo", "beta": 0.01}}
    (run,) = result["runs"]["0.05"]
    metrics = run["metrics"]
    assert list(metrics) == list(script.LOGGED) and len(metrics["reward"]) == 2 and run["eval_steps"][0] == 0
    assert metrics["beta"] == [0.05, 0.05] and run["config"]["beta"] == 0.05
    (control,) = result["runs"]["gold_reward"]
    # the task's reward is 1 exactly when correct; the learned reward is not
    assert control["metrics"]["reward"] == pytest.approx(control["metrics"]["accuracy"])
    assert metrics["reward"] != pytest.approx(metrics["accuracy"])
    assert all(0.0 <= a <= 1.0 for a in metrics["accuracy"] + run["eval_accuracy"])
    assert all(math.isfinite(x) for key in ("objective/kl", "loss/value", "explained_variance",
                                            "clip_ratio/region_mean") for x in metrics[key])


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
    assert stored["experiment"] == "rlhf_overopt"
    assert stored["common"] == {**script.RL, "max_steps": script.STEPS}
    assert stored["reward_model"] == script.REWARD_MODEL
    assert stored["betas"] == list(script.BETAS) and stored["steps"] == script.STEPS
    assert stored["control_beta"] == script.CONTROL_BETA
    assert stored["arms"]["gold_reward"] == {"preset": "ppo", "beta": script.CONTROL_BETA}
    for beta in [*script.BETAS, "gold_reward"]:
        runs = stored["runs"][str(beta)]
        assert [run["seed"] for run in runs] == stored["seeds"] and len(runs) >= 3
        assert all(list(run["metrics"]) == list(script.LOGGED) for run in runs)
        assert all(len(run["metrics"]["reward"]) == script.STEPS for run in runs)
        assert all(run["config"]["beta"] == run["metrics"]["beta"][0] for run in runs)
