"""What a practitioner takes away from a run (src/rlbook/runs.py, the ``plot`` and ``export`` commands of
src/rlbook/cli.py): checkpoints that ``transformers`` loads, an export with the value model, metrics read back
and plotted, the top-level imports; and the error paths, each one line and exit status 2."""

import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from rlbook.cli import main  # noqa: E402
from rlbook.checkpointing import read_checkpoint  # noqa: E402
from rlbook.plotting import MIN_FONT_PT, plot_runs, smallest_font  # noqa: E402
from rlbook.runs import export_checkpoint, metric_values, newest_checkpoint, read_metrics  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--set", "num_generations=4", "--set", "per_device_train_batch_size=8", "--no-progress"]


def one_line_error(capsys, *fragments):
    """The command's stderr is one ``error: ...`` line holding every fragment, and no traceback."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert all(f in err for f in fragments), err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A 3-step PPO run (it has a value model) saving every 2 steps: checkpoint-2 and checkpoint-3 (the end)."""
    out = tmp_path_factory.mktemp("runs") / "ppo"
    threads = torch.get_num_threads()
    try:  # `rlbook train` runs the tiny models on one thread
        assert main(["train", "--algo", "ppo", "--task", "arithmetic", "--max-steps", "3", "--save-steps", "2",
                     "--output-dir", str(out), *SMALL]) == 0
    finally:
        torch.set_num_threads(threads)
    return out


# --- checkpoints and export --------------------------------------------------------------------------------------

def test_periodic_checkpoints_are_saved_and_the_defaults_are_periodic(ppo_run):
    from rlbook.cli import DEFAULT_SAVE_STEPS, DEFAULT_SAVE_TOTAL_LIMIT, build_parser

    assert sorted(p.name for p in ppo_run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    args = build_parser().parse_args(["train", "--algo", "grpo", "--task", "arithmetic", "--max-steps", "9",
                                      "--output-dir", "D"])
    assert (args.save_steps, args.save_total_limit) == (DEFAULT_SAVE_STEPS, DEFAULT_SAVE_TOTAL_LIMIT) == (50, 3)
    assert build_parser().parse_args(["train", "--algo", "grpo", "--task", "arithmetic", "--max-steps", "9",
                                      "--output-dir", "D", "--save-total-limit", "none"]).save_total_limit is None


def test_a_checkpoint_loads_with_transformers_and_with_rlbook(ppo_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlbook import load_policy

    checkpoint = ppo_run / "checkpoint-3"
    stored = read_checkpoint(checkpoint)["policy"]
    hf = AutoModelForCausalLM.from_pretrained(checkpoint)
    ours, tokenizer = load_policy(checkpoint, device="cpu")
    for model in (hf, ours):
        state = model.state_dict()
        assert state.keys() == stored.keys()
        for key in stored:
            torch.testing.assert_close(state[key], stored[key], rtol=0, atol=0, msg=key)
    assert AutoTokenizer.from_pretrained(checkpoint)("12+34=").input_ids == tokenizer("12+34=").input_ids


def test_export_writes_the_policy_and_the_value_model_in_hugging_face_form(ppo_run, capsys):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    assert main(["export", str(ppo_run)]) == 0
    out = ppo_run / "policy-3"
    assert "policy-3" in capsys.readouterr().err
    record = json.loads((out / "export.json").read_text())
    assert record["step"] == 3 and record["value_model"] == "value_model" and record["run"]["algo"] == "ppo"
    state = read_checkpoint(ppo_run / "checkpoint-3")
    policy = AutoModelForCausalLM.from_pretrained(out)
    value_model = AutoModelForTokenClassification.from_pretrained(out / "value_model")
    for model, stored in ((policy, state["policy"]), (value_model, state["value_model"])):
        got = model.state_dict()
        assert got.keys() == stored.keys()
        for key in stored:
            torch.testing.assert_close(got[key], stored[key], rtol=0, atol=0, msg=key)
    assert value_model.config.num_labels == 1
    assert main(["export", str(ppo_run)]) == 0  # an earlier export is replaced
    assert sorted(p.name for p in ppo_run.iterdir() if p.name.startswith(".")) == []


def test_export_of_one_checkpoint_to_a_folder_of_your_choice(ppo_run, tmp_path):
    out = tmp_path / "deep" / "er" / "exported"
    assert main(["export", str(ppo_run / "checkpoint-2"), "--out", str(out)]) == 0
    assert json.loads((out / "export.json").read_text())["step"] == 2
    assert newest_checkpoint(ppo_run).name == "checkpoint-3"


def test_export_of_a_run_without_a_value_model_has_none(tmp_path):
    out = tmp_path / "grpo"
    assert main(["train", "--algo", "grpo", "--task", "arithmetic", "--max-steps", "1", "--output-dir", str(out),
                 *SMALL]) == 0
    exported = export_checkpoint(newest_checkpoint(out), tmp_path / "e")
    assert json.loads((exported / "export.json").read_text())["value_model"] is None
    assert not (exported / "value_model").exists() and (exported / "model.safetensors").is_file()


@pytest.mark.parametrize("case, fragments", [
    ("no checkpoint", ["holds no checkpoint-<step> folder", "--save-steps"]),
    ("missing", ["does not exist"]),
    ("out is a file", ["--out", "is a file, not a folder"]),
    ("out below a file", ["--out", "lies below", "which is a file"]),
    ("out holds other things", ["already exists and is not an earlier export"]),
])
def test_export_errors_are_one_line(ppo_run, tmp_path, capsys, case, fragments):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    argv = {"no checkpoint": [str(tmp_path / "empty")],
            "missing": [str(tmp_path / "nowhere")],
            "out is a file": [str(ppo_run), "--out", str(tmp_path / "file")],
            "out below a file": [str(ppo_run), "--out", str(tmp_path / "file" / "x")],
            "out holds other things": [str(ppo_run), "--out", str(tmp_path / "mine")]}[case]
    assert main(["export", *argv]) == 2
    one_line_error(capsys, *fragments)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# --- metrics read back and plotted --------------------------------------------------------------------------------

def test_read_metrics_is_a_list_of_dicts_one_per_step(ppo_run):
    records = read_metrics(ppo_run)
    assert isinstance(records, list) and [r["step"] for r in records] == [1, 2, 3]
    assert records == read_metrics(ppo_run / "metrics.jsonl")
    steps, rewards = metric_values(records, "reward")
    assert steps == [1, 2, 3] and all(isinstance(r, float) for r in rewards)


def test_read_metrics_skips_a_last_line_cut_mid_write_and_names_a_damaged_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.7}\n{"step": 3, "rew')
    assert read_metrics(tmp_path) == [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.7}]
    path.write_text('{"step": 1, "reward": 0.5}\nnot json\n{"step": 3, "reward": 0.7}\n')
    with pytest.raises(ValueError, match="metrics.jsonl, line 2, is not a JSON object"):
        read_metrics(tmp_path)
    path.write_text('{"reward": 0.5}\n')
    with pytest.raises(ValueError, match="line 1, is not a step's metrics"):
        read_metrics(tmp_path)
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl at"):
        read_metrics(tmp_path / "elsewhere")


def fake_history(steps, slope, seed=0):
    rng = np.random.default_rng(seed)
    return [{"step": s, "reward": slope * s + 0.05 * rng.standard_normal(), "entropy": 1.0 / s,
             **({"eval_accuracy": 0.1 * s} if s % 5 == 0 else {})} for s in range(1, steps + 1)]


def test_plot_runs_draws_one_panel_per_metric_and_names_each_run_at_its_line_end():
    runs = {"grpo": fake_history(30, 0.01), "dapo": fake_history(20, 0.02, seed=1)}
    fig, axes = plot_runs(runs, ["reward", "entropy", "eval_accuracy"], smooth=5)
    assert [ax.get_title() for ax in axes] == ["reward", "entropy", "eval_accuracy"]
    assert all(len([line for line in ax.get_lines() if not line.get_label().startswith("_")]) == 2 for ax in axes)
    assert {t.get_text() for t in axes[-1].texts} == {"grpo", "dapo"}
    assert len(axes[2].get_lines()[0].get_xdata()) == 6 - 5 + 1  # eval_accuracy at steps 5..30, smoothed over 5
    assert smallest_font(fig)[0] >= MIN_FONT_PT
    plt.close(fig)
    with pytest.raises(ValueError, match="no run logged the metric 'kl'; they logged: entropy, eval_accuracy"):
        plot_runs(runs, ["kl"])
    plt.close("all")


def test_rlbook_plot_writes_the_figure(ppo_run, tmp_path, capsys):
    out = tmp_path / "figs" / "compare.png"
    assert main(["plot", str(ppo_run), str(ppo_run / "metrics.jsonl"), "--metric", "reward", "--metric",
                 "loss/value", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize("case, fragments", [
    ("unknown metric", ["no run logged the metric 'nope'", "reward"]),
    ("no metrics", ["no metrics.jsonl at"]),
    ("bad format", ["unknown figure format '.txt'"]),
    ("out is a folder", ["is a folder; give a file name"]),
    ("out below a file", ["its folder", "is a file, not a folder"]),
    ("bad smooth", ["--smooth must be >= 1"]),
])
def test_plot_errors_are_one_line(ppo_run, tmp_path, capsys, case, fragments):
    (tmp_path / "file").write_text("x")
    argv = {"unknown metric": [str(ppo_run), "--metric", "nope"],
            "no metrics": [str(tmp_path)],
            "bad format": [str(ppo_run), "--out", str(tmp_path / "fig.txt")],
            "out is a folder": [str(ppo_run), "--out", str(tmp_path)],
            "out below a file": [str(ppo_run), "--out", str(tmp_path / "file" / "fig.png")],
            "bad smooth": [str(ppo_run), "--smooth", "0"]}[case]
    assert main(["plot", *argv, *([] if "--out" in argv else ["--out", str(tmp_path / "f.png")])]) == 2
    one_line_error(capsys, *fragments)


# --- the package's top level --------------------------------------------------------------------------------------

def test_import_rlbook_is_light_and_exports_the_entry_points_on_first_use():
    code = ("import sys, rlbook; assert 'torch' not in sys.modules, 'import rlbook loaded torch'; "
            "from rlbook import Trainer, preset, RECIPES, load_base_policy, read_metrics, plot_runs, train_dpo; "
            "import rlbook.trainer; assert Trainer is rlbook.trainer.Trainer; print(rlbook.__version__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    import rlbook

    assert done.stdout.strip() == rlbook.__version__
    assert set(rlbook.__all__) <= set(dir(rlbook))
    with pytest.raises(AttributeError, match="has no attribute 'Trainr'; the top level exports"):
        rlbook.Trainr  # noqa: B018


# --- the smaller items: messages that name what is wrong ----------------------------------------------------------

def test_a_reward_function_error_names_the_step_as_metrics_count_it():
    from rlbook import RECIPES, Trainer, load_base_policy, preset

    policy, tokenizer = load_base_policy("arithmetic")
    config = preset("grpo", num_generations=4, per_device_train_batch_size=8, max_steps=2, eval_size=8)

    def wrong_shape(examples, completions, truncated):
        return np.zeros(3)

    trainer = Trainer(policy, tokenizer, RECIPES["arithmetic"].make_task(), config, reward_fn=wrong_shape)
    with pytest.raises(ValueError, match=r"^step 1: the reward function must return 8 finite rewards"):
        trainer.train_step()  # the first step, logged as "step": 1


def test_resume_into_a_trainer_of_another_config_names_both_values(ppo_run):
    from rlbook import RECIPES, Trainer, load_base_policy, preset

    stored = read_checkpoint(ppo_run / "checkpoint-3")["config"]
    policy, tokenizer = load_base_policy("arithmetic")
    config = preset("ppo", **{**{k: stored[k] for k in ("num_generations", "per_device_train_batch_size",
                                                        "max_completion_length", "max_steps")},
                              "learning_rate": 0.5})
    trainer = Trainer(policy, tokenizer, RECIPES["arithmetic"].make_task(), config)
    with pytest.raises(ValueError) as error:
        trainer.resume(ppo_run / "checkpoint-3")
    message = str(error.value)
    assert "another config (differs in ['learning_rate'])" in message
    assert f"the checkpoint: learning_rate={stored['learning_rate']!r}" in message
    assert "this trainer: learning_rate=0.5" in message


def test_the_trl_bridge_on_a_cpu_says_to_pass_bf16_false_and_use_cpu():
    pytest.importorskip("trl")
    if torch.cuda.is_available():
        pytest.skip("TRL's bf16 default is refused only without a GPU")
    from rlbook.integrations.trl import grpo_config

    with pytest.raises(ValueError, match=r"on a CPU pass grpo_config\(\.\.\., bf16=False, use_cpu=True\)"):
        grpo_config("grpo", report_to="none")
    assert grpo_config("grpo", report_to="none", bf16=False, use_cpu=True).bf16 is False
