"""``rlbook train`` (src/rlbook/cli.py): a run writes metrics.jsonl and checkpoints, resumes exactly, and bad input
gets one line and exit status 2."""

import json
import os
import subprocess
import sys

import pytest

from rlbook.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--set", "num_generations=4", "--set", "per_device_train_batch_size=8", "--no-progress"]


def read_metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_python_dash_m_rlbook_train_writes_metrics_and_a_checkpoint(tmp_path):
    """The command of the README, in a fresh process: ``python -m rlbook train``."""
    out = tmp_path / "D"
    done = subprocess.run([sys.executable, "-m", "rlbook", "train", "--algo", "grpo", "--task", "arithmetic",
                           "--max-steps", "2", "--output-dir", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2]
    for key in ("entropy", "completions/mean_length", "reward", "kl", "loss/policy"):
        assert key in metrics[-1], key
    assert (out / "checkpoint-2" / "trainer_state.pt").is_file()
    assert json.loads((out / "run.json").read_text())["config"]["loss_type"] == "grpo"


def test_a_resumed_run_continues_exactly_like_an_uninterrupted_one(tmp_path):
    common = ["train", "--algo", "dapo", "--task", "arithmetic", "--seed", "3", *SMALL]
    assert main([*common, "--max-steps", "4", "--output-dir", str(tmp_path / "straight")]) == 0
    assert main([*common, "--max-steps", "2", "--output-dir", str(tmp_path / "split")]) == 0
    assert main([*common, "--max-steps", "4", "--output-dir", str(tmp_path / "split"), "--resume",
                 "--save-steps", "1"]) == 0
    straight, split = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "split")
    assert [m["step"] for m in split] == [1, 2, 3, 4]
    for a, b in zip(straight, split):
        for key in ("reward", "entropy", "loss/policy", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)
    assert sorted(p.name for p in (tmp_path / "split").glob("checkpoint-*")) == [
        "checkpoint-2", "checkpoint-3", "checkpoint-4"]


@pytest.mark.parametrize("args, message", [
    (["--algo", "trpo"], "unknown preset 'trpo'"),
    (["--task", "chess"], "unknown task 'chess'"),
    (["--set", "lr=1e-3"], "unknown RLConfig key 'lr'; did you mean 'learning_rate'"),
    (["--set", "learning_rate=fast"], "--set learning_rate=fast: expected float"),
    (["--set", "mask_truncated_completions=maybe"], "expected bool"),
    (["--set", "epsilon=-0.2"], "bad configuration: epsilon and epsilon_high must be positive"),
    (["--set", "num_generations=3"], "must be a multiple of num_generations"),
    (["--max-steps", "0"], "--max-steps must be >= 1, got 0"),
    (["--save-steps", "0"], "--save-steps must be >= 1, got 0"),
    (["--save-total-limit", "0"], "--save-total-limit must be >= 1 (or 'none': keep all), got 0"),
    (["--save-total-limit", "few"], "expected a number or 'none', got 'few'"),
    (["--algo", "dpo"], "--algo dpo: DPO trains on preference pairs"),
    (["--max-steps", "ten"], "invalid int value: 'ten'"),
    (["--model-size", "huge"], "unknown model size 'huge'"),
    (["--resume"], "holds no checkpoint"),
])
def test_bad_input_gets_one_line_and_exit_status_2(tmp_path, capsys, args, message):
    base = {"--algo": "grpo", "--task": "arithmetic", "--max-steps": "2", "--output-dir": str(tmp_path / "D")}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["train", *[x for kv in base.items() for x in kv], *[a for a in args if a == "--resume"]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert "Traceback" not in err


def test_an_output_dir_that_holds_a_run_needs_resume(tmp_path, capsys):
    argv = ["train", "--algo", "rloo", "--task", "arithmetic", "--max-steps", "1", "--output-dir", str(tmp_path), *SMALL]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert main([*argv[:-len(SMALL)], "--set", "learning_rate=0.5", *SMALL, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "made with other settings (differs in ['learning_rate'])" in err
    assert "run.json: learning_rate=0.0001; this command: learning_rate=0.5" in err, err


def test_help_lists_the_presets_and_the_tasks(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    from rlbook.checkpoints import RECIPES
    from rlbook.presets import PRESETS

    assert all(name in out for name in [*PRESETS, *RECIPES])


def test_help_shows_each_option_s_default_and_each_task_s_underlying_task(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 50)" in out and "(default: 3)" in out and "(default: cpu)" in out
    assert "sort_scratchpad: task 'sort_digits'" in out and "rlbook.dpo.train_dpo" in out


def test_a_dpo_algo_says_where_dpo_is_trained(tmp_path, capsys):
    argv = ["train", "--algo", "dpo", "--task", "arithmetic", "--max-steps", "2", "--output-dir", str(tmp_path / "D")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "rlbook.dpo.train_dpo" in err and len(err.strip().splitlines()) == 1


def unwritable_folder(tmp_path):
    """A folder this process cannot create files in: a read-only one, or (as root, who may write anywhere)
    one below /sys, which the kernel refuses to anyone."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        return folder / "D"
    if not os.path.isdir("/sys/kernel"):
        pytest.skip("running as root without /sys: no folder that cannot be written")
    return __import__("pathlib").Path("/sys/rlbook-test-unwritable/D")


@pytest.mark.parametrize("case, message", [
    ("a file", "is a file, not a folder"),
    ("below a file", "lies below"),
    ("unwritable", "cannot be written"),
])
def test_an_output_dir_that_cannot_hold_a_run_gets_one_line_and_exit_status_2(tmp_path, capsys, case, message):
    (tmp_path / "file").write_text("not a folder")
    out = {"a file": tmp_path / "file", "below a file": tmp_path / "file" / "run",
           "unwritable": unwritable_folder(tmp_path) if case == "unwritable" else None}[case]
    argv = ["train", "--algo", "grpo", "--task", "arithmetic", "--max-steps", "1", "--output-dir", str(out), *SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --output-dir {out} ") and message in err, err
    assert "Traceback" not in err
