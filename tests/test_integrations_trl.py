"""The TRL bridge (rlbook.integrations.trl) and the engine table (rlbook.integrations.engines).

Skipped when TRL is not installed (requirements.txt installs it). Every preset either maps to a TRL config that
carries its loss settings, or is refused with the reasons; two real GRPOTrainer steps run on the arithmetic base
policy with the bridge's reward functions and prompts; the reward functions give the task's rewards.
"""

import math
import os
import warnings

import numpy as np
import pytest

trl = pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

from rlbook.checkpoints import RECIPES, load_base_policy  # noqa: E402
from rlbook.integrations.engines import (  # noqa: E402
    ENGINE_VERSIONS,
    ENGINES,
    engine_command,
    engine_markdown,
    engine_options,
    engine_overview,
    engine_runs,
)
from rlbook.integrations.trl import (  # noqa: E402
    BOOK_EOS_TOKEN_ID,
    grpo_config,
    prompt_dataset,
    reward_funcs,
    rloo_kwargs,
    trainer_class,
    truncated_flags,
    unsupported,
)
from rlbook.presets import PRESETS, preset  # noqa: E402
from rlbook.tasks import soft_overlong_penalty  # noqa: E402

EXPRESSIBLE = {"reinforce_baseline", "grpo", "trl_grpo", "dr_grpo", "gspo", "gmpo", "cispo", "sapo"}
TRL_OFFLINE = dict(report_to="none", use_cpu=True, bf16=False, gradient_checkpointing=False)


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("num_processes", [1, 2])
def test_every_preset_maps_or_is_refused_with_reasons(name, num_processes, tmp_path):
    c = preset(name)
    reasons = unsupported(c)
    assert (not reasons) == (name in EXPRESSIBLE), reasons
    if reasons:
        with pytest.raises(ValueError) as error:
            grpo_config(c, num_processes=num_processes, output_dir=str(tmp_path), **TRL_OFFLINE)
        assert all(reason in str(error.value) for reason in reasons)
        return
    args = grpo_config(name, num_processes=num_processes, output_dir=str(tmp_path), **TRL_OFFLINE)
    assert isinstance(args, trl.GRPOConfig)
    if c.loss_type == "gmpo":
        assert type(args).__name__ == "GMPOConfig" and trainer_class(c).__name__ == "GMPOTrainer"
    else:
        assert args.loss_type == c.loss_type and trainer_class(c) is trl.GRPOTrainer
    assert args.epsilon == c.epsilon
    assert args.epsilon_high == (c.epsilon if c.epsilon_high is None else c.epsilon_high)
    assert args.beta == c.beta
    assert args.importance_sampling_level == c.importance_sampling_level
    assert args.scale_rewards == ("none" if c.advantage_estimator == "group_mean" else c.scale_rewards)
    assert args.num_generations == c.num_generations
    assert args.num_iterations == c.num_iterations
    assert args.max_completion_length == c.max_completion_length
    assert args.mask_truncated_completions == c.mask_truncated_completions
    # the book's batch is global, TRL's per process
    assert args.per_device_train_batch_size * num_processes == c.per_device_train_batch_size
    assert args.steps_per_generation == c.steps_per_generation
    assert args.gradient_accumulation_steps == c.gradient_accumulation_steps
    # TRL counts optimizer steps, the book rollouts
    assert args.max_steps == c.max_steps * c.num_iterations * c.steps_per_generation // c.gradient_accumulation_steps
    assert args.lr_scheduler_type == "constant" and args.learning_rate == c.learning_rate


def test_strict_false_maps_what_it_can_and_warns(tmp_path):
    with pytest.warns(UserWarning, match="dynamic_sampling"):
        args = grpo_config("dapo", strict=False, output_dir=str(tmp_path), **TRL_OFFLINE)
    assert (args.loss_type, args.epsilon_high, args.mask_truncated_completions) == ("dapo", 0.28, True)
    assert not unsupported(preset("dapo", dynamic_sampling=False))


def test_a_global_batch_that_does_not_split_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="num_processes=3"):
        grpo_config("grpo", num_processes=3, output_dir=str(tmp_path), **TRL_OFFLINE)


def test_settings_trl_lacks_are_named():
    assert any("kl_placement" in r for r in unsupported(preset("grpo", kl_placement="reward")))
    assert not unsupported(preset("grpo", kl_placement="reward", beta=0.0))  # no KL: the placement is moot
    assert any("sequence_token" in r for r in unsupported(preset("gspo", importance_sampling_level="sequence_token")))
    assert any("early_stop_kl" in r for r in unsupported(preset("grpo", early_stop_kl=0.01)))


def test_rloo_maps_to_trls_rloo_config(tmp_path):
    args = trl.RLOOConfig(output_dir=str(tmp_path), **TRL_OFFLINE, **rloo_kwargs("rloo", num_processes=2))
    c = preset("rloo")
    assert (args.num_generations, args.beta, args.epsilon, args.normalize_advantages) == (
        c.num_generations, c.beta, c.epsilon, False)
    assert args.per_device_train_batch_size * 2 == c.per_device_train_batch_size


def _examples_and_completions(task):
    examples = task.sample(3, seed=np.random.default_rng(5), split="train")
    right, other = examples[0].answer, examples[1].answer
    prompts = [examples[0].prompt, examples[0].prompt, examples[1].prompt, examples[2].prompt]
    answers = [right, right, other, examples[2].answer]
    # right and ended; right but cut at the budget (no EOS); wrong; a stray special id inside, then EOS
    completions = [right, right, other + "1", examples[2].answer]
    ids = [[4] * len(right) + [BOOK_EOS_TOKEN_ID], [4] * len(right), [4] * (len(other) + 1) + [BOOK_EOS_TOKEN_ID],
           [4, 0, BOOK_EOS_TOKEN_ID]]
    truncated = [False, True, False, False]
    rebuilt = [examples[0], examples[0], examples[1], examples[2]]
    return prompts, answers, completions, ids, truncated, rebuilt


def test_reward_funcs_give_the_tasks_rewards():
    task = RECIPES["arithmetic"].make_task()
    prompts, answers, completions, ids, truncated, examples = _examples_and_completions(task)
    assert truncated_flags(ids, BOOK_EOS_TOKEN_ID) == truncated
    (reward,) = reward_funcs(task)
    got = reward(prompts=prompts, completions=completions, completion_ids=ids, answer=answers, trainer_state=None)
    expected = task.rewards(examples, completions, truncated)
    assert got == expected.tolist() and got[:3] == [1.0, 0.0, 0.0]  # the truncated right answer earns nothing


def test_overlong_penalty_is_the_books_and_trls():
    task = RECIPES["arithmetic"].make_task()
    config = preset("dapo", max_completion_length=8)  # overlong buffer: a quarter of the budget, 2 tokens
    funcs = reward_funcs(task, config)
    assert len(funcs) == 2
    ids = [[4] * n for n in range(1, 10)]
    ours = funcs[1](completion_ids=ids)
    assert ours == soft_overlong_penalty(range(1, 10), 8, config.overlong_buffer_length).tolist()
    from trl.rewards import get_soft_overlong_punishment

    assert ours == pytest.approx(get_soft_overlong_punishment(8, config.overlong_buffer_length)(ids))


def test_prompt_dataset_carries_prompt_and_answer():
    task = RECIPES["arithmetic"].make_task()
    data = prompt_dataset(task, 5, seed=3)
    examples = task.sample(5, seed=np.random.default_rng(3), split="train")
    assert data.column_names == ["prompt", "answer"]
    assert data["prompt"] == [e.prompt for e in examples] and data["answer"] == [e.answer for e in examples]


def test_two_real_grpo_trainer_steps(tmp_path):
    """grpo_config("grpo") with small sizes drives TRL's own GRPOTrainer on the arithmetic base policy: plain
    string prompts (the character tokenizer has a pad token and no chat template), the bridge's rewards."""
    torch.set_num_threads(1)
    config = preset("grpo", per_device_train_batch_size=16, num_generations=4, max_completion_length=8,
                    max_steps=2)
    task = RECIPES["arithmetic"].make_task()
    model, tokenizer = load_base_policy("arithmetic")
    assert tokenizer.pad_token_id is not None and tokenizer.chat_template is None
    args = grpo_config(config, output_dir=str(tmp_path), logging_steps=1, save_strategy="no", **TRL_OFFLINE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trainer_class(config)(model=model, processing_class=tokenizer, args=args,
                                        reward_funcs=reward_funcs(task, config),
                                        train_dataset=prompt_dataset(task, 16, seed=0))
        trainer.train()
    assert trainer.state.global_step == 2
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert all(0.0 <= entry["rewards/arithmetic_reward/mean"] <= 1.0 for entry in logs)
    assert (trainer.args.loss_type, trainer.args.beta, trainer.args.epsilon, trainer.args.num_generations) == (
        "grpo", 0.04, 0.2, 4)
    assert trainer.args.per_device_train_batch_size == 16 and trainer.args.generation_batch_size == 16


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_engine_options_cover_every_preset_and_engine(name):
    options = engine_options(name)
    assert tuple(options) == ENGINES and set(ENGINE_VERSIONS) == set(ENGINES)
    for engine, settings in options.items():
        assert settings, engine
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in settings.items())
        missing = [v for v in settings.values() if v.startswith("not available")]
        assert all(len(v) > len("not available: ") + 5 for v in missing)  # each with its reason
    # TRL's column is the bridge's: an expressible preset has no "not available"
    trl_missing = [v for v in options["TRL"].values() if v.startswith("not available")]
    assert bool(trl_missing) == (name not in EXPRESSIBLE | {"rloo"})


def test_engine_options_spot_checks():
    grpo, dr_grpo, dapo, gspo = (engine_options(n) for n in ("grpo", "dr_grpo", "dapo", "gspo"))
    assert grpo["verl"]["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert grpo["verl"]["actor_rollout_ref.actor.kl_loss_type"] == "k3"
    assert grpo["verl"]["actor_rollout_ref.actor.clip_ratio_c"] == "1e9"  # verl's dual clip off
    assert grpo["OpenRLHF"]["--algo.kl.estimator"] == "k3"
    assert grpo["OpenRLHF"]["--actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert dr_grpo["verl"]["algorithm.norm_adv_by_std_in_grpo"] == "false"
    assert dr_grpo["OpenRLHF"]["--algo.advantage.estimator"] == "dr_grpo"
    assert dapo["verl"]["algorithm.filter_groups.enable"] == "true"
    assert dapo["verl"]["+reward.reward_kwargs.overlong_buffer_cfg.log"] == "false"
    assert "algorithm.filter_groups.max_num_gen_batches" not in dapo["verl"]
    assert dapo["OpenRLHF"]["--actor.eps_clip_low_high"] == "0.2 0.28"
    assert dapo["OpenRLHF"]["--actor.adam.betas"] == "0.9 0.999"
    assert gspo["verl"]["actor_rollout_ref.actor.policy_loss.loss_mode"] == "gspo"
    assert gspo["TRL"]["importance_sampling_level"] == "sequence"
    rows = engine_overview()
    assert [row["preset"] for row in rows] == list(PRESETS)
    assert all(set(row) == {"preset", *ENGINES} for row in rows)
    assert engine_runs("gmpo")["OpenRLHF"].command is None  # no GMPO loss: ppo would read ε = 0.4 as its clip


def test_engine_command_names_a_bad_engine_or_preset():
    assert engine_command("grpo", "verl") == engine_runs("grpo")["verl"].command
    assert engine_command("gfpo", "verl") is None  # no GFPO filter: no command
    with pytest.raises(ValueError, match="unknown engine 'trl'"):
        engine_command("grpo", "trl")
    with pytest.raises(ValueError, match="unknown preset"):
        engine_command("grp", "verl")


def test_the_books_commands_are_code_and_its_notes_are_not():
    """Each command is one fenced block, exactly EngineRun.command; notes and missing settings are list items
    under it, never inside it; an engine that cannot run a preset shows why and no command."""
    markdown = engine_markdown()
    for name in PRESETS:
        for engine, run in engine_runs(name).items():
            if run.blocked:
                assert run.command is None and f"Not available: `{run.blocked[0]}`" in markdown
                continue
            fence = "python" if engine == "TRL" else "bash"
            assert f"```{fence}\n{run.command}\n```" in markdown, (name, engine)
            for option, note in run.notes.items():
                assert option in run.options and note not in run.command
                assert f"- `{option}`: {note}." in markdown
            for setting, why in run.missing.items():
                assert why not in run.command and f"- not available: `{setting}`: {why}." in markdown
            assert "note" not in run.options and all(not k.startswith("not available") for k in run.options)
    # every visible line of a command fits the book's code box inside a dropdown
    lines = [line for n in PRESETS for r in engine_runs(n).values() if r.command for line in r.command.splitlines()]
    assert max(map(len, lines)) <= 88


@pytest.mark.parametrize("name", [n for n in sorted(PRESETS) if engine_runs(n)["TRL"].command is not None])
def test_the_trl_snippet_builds_trls_config(name, tmp_path):
    """The TRL code the book prints runs: it builds TRL's own config class (a wrong keyword is a TypeError) with
    the bridge's values; the overlong reward is TRL's."""
    code = engine_runs(name)["TRL"].command
    namespace = {}
    made = {}

    def capture(cls):
        def build(**kwargs):
            made.update(kwargs)
            return cls(**{**kwargs, "output_dir": str(tmp_path)}, **TRL_OFFLINE)
        return build

    import trl.experimental.gmpo as gmpo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        classes = {"GRPOConfig": trl.GRPOConfig, "RLOOConfig": trl.RLOOConfig, "GMPOConfig": gmpo.GMPOConfig}
        with pytest.MonkeyPatch.context() as patch:
            for cls_name, cls in classes.items():
                patch.setattr(trl if cls_name != "GMPOConfig" else gmpo, cls_name, capture(cls))
            exec(code, namespace)
    c = preset(name)
    expected = rloo_kwargs(c) if c.advantage_estimator == "rloo" else None
    if expected is None:
        from rlbook.integrations.trl import grpo_kwargs

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = grpo_kwargs(c, strict=False)
    assert {k: v for k, v in made.items() if k != "output_dir"} == expected
    assert type(namespace["args"]).__name__ in classes
    if c.overlong_buffer_length is not None:
        ids = [[4] * n for n in range(1, c.max_completion_length + 1)]
        assert namespace["overlong_reward"](completion_ids=ids) == pytest.approx(
            soft_overlong_penalty(range(1, c.max_completion_length + 1), c.max_completion_length,
                                  c.overlong_buffer_length).tolist())


def test_the_chapter_shows_exactly_the_tested_trl_code():
    import json
    from pathlib import Path

    chapter = Path(__file__).resolve().parents[1] / "notebooks" / "part6" / "beyond_one_machine.ipynb"
    nb = json.loads(chapter.read_text(encoding="utf-8"))
    shown = ["".join(out["data"]["text/markdown"]) for cell in nb["cells"] if cell["cell_type"] == "code"
             for out in cell.get("outputs", []) if "text/markdown" in out.get("data", {})]
    assert engine_markdown() in shown, "the chapter's engine commands are not engine_markdown(): rerun the chapter"


def test_trls_variants_map_under_their_own_names(tmp_path):
    """CISPO, SAPO, delta, the sampler correction, the off-policy mask and the entropy methods (the high-entropy
    filter, the adaptive entropy bonus) are TRL 1.16's: the bridge hands them to
    GRPOConfig under the same names (and leaves them out where unset, so the presets' configs are unchanged)."""
    cases = {
        "cispo": dict(loss_type="cispo", epsilon_high=5.0),
        "sapo": dict(loss_type="sapo", sapo_temperature_pos=0.9, sapo_temperature_neg=1.2),
        "delta": dict(delta=4.0),
        "correction": dict(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_mask",
                           vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=5.0,
                           off_policy_mask_threshold=0.5),
        "entropy": dict(top_entropy_quantile=0.2, entropy_coef=0.01, use_adaptive_entropy=True, entropy_coef_max=0.1,
                        entropy_coef_delta=0.002, entropy_target=0.5),
    }
    for name, overrides in cases.items():
        c = preset("trl_grpo", **overrides)
        assert not unsupported(c), name
        args = grpo_config(c, output_dir=str(tmp_path), **TRL_OFFLINE)
        for key, value in overrides.items():
            assert getattr(args, key) == value, (name, key)
        unmapped = {"cispo": [], "sapo": [], "delta": ["delta"],
                    "correction": ["vllm_importance_sampling_correction", "off_policy_mask_threshold"],
                    "entropy": ["top_entropy_quantile", "use_adaptive_entropy"]}[name]
        for engine in ("verl", "OpenRLHF"):  # not mapped there: blocked (a loss) or named as missing (a setting)
            run = engine_runs(c)[engine]
            if name in ("cispo", "sapo"):  # verl has both losses (test_cispo_and_sapo_map_to_verl_not_openrlhf)
                assert (run.blocked is None) == (engine == "verl"), (engine, run.blocked)
            else:
                assert not run.blocked and all(k in run.missing for k in unmapped), (engine, run.missing)
    assert "delta" not in engine_runs("grpo")["TRL"].options and "sapo_temperature_pos" not in \
        engine_runs("grpo")["TRL"].options
    assert not {"top_entropy_quantile", "entropy_coef"} & set(engine_runs("grpo")["TRL"].options)
    # verl's Clip-Cov and KL-Cov are not TRL's
    assert unsupported(preset("trl_grpo", covariance_method="kl_cov")) == [
        "covariance_method='kl_cov': TRL has no Clip-Cov or KL-Cov (verl's policy-loss modes)"]


def test_cispo_and_sapo_map_to_verl_not_openrlhf():
    """verl 0.9.1 has policy-loss modes "cispo" (weight clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]) and
    "sapo" (tau_pos, tau_neg); OpenRLHF 0.11.2's --actor.policy_loss_type is ppo or gspo, so neither runs there.
    tests/test_engines_verl.py checks verl's losses under the commands against the book's."""
    actor = "actor_rollout_ref.actor"
    cispo, sapo = engine_runs("cispo"), engine_runs("sapo")
    verl = cispo["verl"].options
    assert verl[f"{actor}.policy_loss.loss_mode"] == "cispo" and verl[f"{actor}.loss_agg_mode"] == "token-mean"
    # the book's cap is epsilon_high itself (5), verl's 1 + clip_ratio_high; no lower bound
    assert (verl[f"{actor}.clip_ratio_low"], verl[f"{actor}.clip_ratio_high"]) == ("1", "4")
    assert "epsilon_high - 1" in cispo["verl"].notes[f"{actor}.clip_ratio_high"]
    assert engine_runs(preset("cispo", epsilon_high=1.2))["verl"].options[f"{actor}.clip_ratio_high"] == "0.2"
    verl = sapo["verl"].options
    assert verl[f"{actor}.policy_loss.loss_mode"] == "sapo"
    assert (verl[f"{actor}.tau_pos"], verl[f"{actor}.tau_neg"]) == ("1.0", "1.05")
    assert verl[f"{actor}.loss_agg_mode"] == "seq-mean-token-mean" and f"{actor}.clip_ratio_low" not in verl
    assert f"{actor}.clip_ratio_c" not in verl  # verl's dual clip belongs to its vanilla loss only
    accumulated = engine_runs(preset("sapo", gradient_accumulation_steps=2, steps_per_generation=2))["verl"]
    assert "each micro-batch's" in accumulated.notes[f"{actor}.loss_agg_mode"]
    for name, run in (("cispo", cispo["OpenRLHF"]), ("sapo", sapo["OpenRLHF"])):
        assert run.command is None and run.blocked[0] == f"loss_type={name!r}"
        assert f"no {name.upper()} loss" in run.blocked[1] and "ppo or gspo" in run.blocked[1]
    # verl's two losses weigh token ratios: a sequence-level ratio has no verl command
    for name in ("cispo", "sapo"):
        run = engine_runs(preset(name, importance_sampling_level="sequence"))["verl"]
        assert run.command is None and run.blocked[0] == f"loss_type={name!r} with a sequence-level ratio"


def test_a_kl_penalty_maps_to_trls_plain_k3_not_its_bias_corrected_one():
    """TRL 1.16 multiplies the k3 term by the importance ratio unless ``use_bias_correction_kl=False`` (a gradient
    the book's loss does not have, even on-policy): with beta > 0 the bridge turns it off; with beta 0 it is moot
    and not passed; RLOO's config has no such field."""
    from rlbook.integrations.trl import grpo_kwargs, rloo_kwargs

    assert grpo_kwargs(preset("grpo", beta=0.04))["use_bias_correction_kl"] is False
    assert "use_bias_correction_kl" not in grpo_kwargs(preset("grpo", beta=0.0))
    assert "use_bias_correction_kl" not in rloo_kwargs(preset("rloo", beta=0.04))


def test_the_entropy_methods_map_to_verl_and_openrlhf_where_they_have_them():
    """A fixed entropy bonus is verl's actor.entropy_coeff and OpenRLHF's --actor.entropy_coef (noted where the
    engine's aggregation is not a token mean); Clip-Cov and KL-Cov are verl's policy-loss modes of the same names;
    the high-entropy filter and the adaptive coefficient are in neither, and are named as missing."""
    actor = "actor_rollout_ref.actor"
    clip_cov = preset("dapo", dynamic_sampling=False, covariance_method="clip_cov", entropy_coef=0.01)
    runs = engine_runs(clip_cov)
    verl = runs["verl"].options
    assert verl[f"{actor}.policy_loss.loss_mode"] == "clip_cov" and verl[f"{actor}.entropy_coeff"] == "0.01"
    assert verl[f"{actor}.policy_loss.clip_cov_ratio"] == "0.0002" and f"{actor}.entropy_coeff" not in runs["verl"].notes
    assert runs["OpenRLHF"].options["--actor.entropy_coef"] == "0.01"
    assert "covariance_method" in runs["OpenRLHF"].missing and "covariance_method" not in runs["verl"].missing
    kl_cov = engine_runs(preset("grpo", covariance_method="kl_cov", entropy_coef=0.01))["verl"]
    assert kl_cov.options[f"{actor}.policy_loss.ppo_kl_coef"] == "0.1" and f"{actor}.entropy_coeff" in kl_cov.notes
    adaptive = engine_runs(preset("grpo", use_adaptive_entropy=True, top_entropy_quantile=0.2))
    for engine in ("verl", "OpenRLHF"):
        assert {"use_adaptive_entropy", "top_entropy_quantile"} <= set(adaptive[engine].missing), engine
        assert not any("entropy_coef" in k for k in adaptive[engine].options), engine
