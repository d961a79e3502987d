"""Reduced runs of experiments/vapo (a few seconds each): they run, and their results have the shape and the
properties the chapter relies on; the stored results were made by the script's current settings."""

import pytest
from experiment_scripts import load_script, load_stored

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_vapo_compare_reduced_run():
    from rlbook.experiment import Arm

    script = load_script("vapo_compare")
    for arm in ("vapo", "vapo_lam095"):  # a fresh module per load_script: nothing to restore
        script.ARMS[arm] = Arm("vapo", **{**script.ARMS[arm].overrides, "value_pretrain_steps": 1})
    result = script.run(seeds=(0,), steps=2, eval_size=8)
    assert set(result["runs"]) == set(script.ARMS)
    for arm, (run,) in result["runs"].items():
        assert run["eval_steps"] == [0, 2] and all(0.0 <= a <= 1.0 for a in run["eval_accuracy"])
        assert list(run["metrics"]) == list(script.LOGGED) and len(run["metrics"]["reward"]) == 2
        lam = run["metrics"]["vapo/lam_policy"]
        if arm == "ppo":  # one GAE lambda: the trainer logs no vapo/lam_policy
            assert lam == [None, None] and run["config"]["lam"] == 0.95 and run["pretrain"]["loss/value"] == []
        else:
            assert len(lam) == 2 and all(0.0 <= x <= 1.0 for x in lam)
    assert len(result["runs"]["vapo"][0]["pretrain"]["loss/value"]) == 1
    assert result["runs"]["vapo_lam095"][0]["metrics"]["vapo/lam_policy"] == pytest.approx([0.95, 0.95])
    assert result["runs"]["vapo"][0]["metrics"]["vapo/lam_policy"][0] < 0.9  # length-adaptive: short answers
    assert result["runs"]["vapo_no_vp_dgae"][0]["pretrain"]["loss/value"] == []
    assert result["runs"]["vapo_no_vp_dgae"][0]["config"]["lam_critic"] is None


def test_vapo_coupled_critic_uses_the_policy_lambda():
    """The ablation's arm (``lam_critic=None``): the critic's targets equal GAE with the per-row length-adaptive
    lambda, plus V, as one coupled GAE pass gives them; with the preset's lam_critic = 1 they are the returns."""
    import torch

    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.objectives import gae, length_adaptive_lam
    from rlbook.presets import preset
    from rlbook.trainer import Trainer

    script = load_script("vapo_compare")
    policy, tokenizer = load_base_policy(script.TASK)
    config = preset("vapo", num_generations=4, per_device_train_batch_size=8, max_completion_length=40,
                    **script.ARMS["vapo_no_vp_dgae"].overrides)
    trainer = Trainer(policy, tokenizer, RECIPES[script.TASK].make_task(), config)
    scored = trainer.score(trainer.sample_rollout(0))
    mask, lengths = scored.mask, scored.lengths.long()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(mask)), lengths - 1] = torch.as_tensor(scored.rewards, dtype=torch.float32)
    expected = gae(token_rewards, scored.old_values, mask, 1.0, length_adaptive_lam(lengths, 0.05))[1]
    torch.testing.assert_close(scored.returns, expected, atol=1e-5, rtol=1e-5)
    to_go = gae(token_rewards, scored.old_values, mask, 1.0, 1.0)[1]
    if scored.rewards.any():  # a reward to propagate: the coupled targets are not the Monte Carlo returns
        assert not torch.allclose(scored.returns, to_go, atol=1e-3)


def test_vapo_stored_results_match_the_script():
    """The stored comparison has >= 5 seeds per arm, made with the script's current settings."""
    script = load_script("vapo_compare")
    stored = load_stored("vapo_compare")
    assert stored["experiment"] == "vapo_compare" and len(stored["seeds"]) >= 5
    assert stored["common"] == {**script.COMMON, "max_steps": script.STEPS, "eval_every": script.EVAL_EVERY,
                                "eval_size": script.EVAL_SIZE}
    assert stored["arms"] == {name: arm.to_json() for name, arm in script.ARMS.items()}
    assert stored["task"] == script.TASK and stored["pretrain_steps"] == script.PRETRAIN_STEPS
    for arm in script.ARMS:
        runs = stored["runs"][arm]
        assert [run["seed"] for run in runs] == stored["seeds"]
        assert all(list(run["metrics"]) == list(script.LOGGED) for run in runs)
        assert all(len(run["metrics"]["reward"]) == stored["steps"] for run in runs)
        assert all(run["eval_steps"][-1] == stored["steps"] for run in runs)
