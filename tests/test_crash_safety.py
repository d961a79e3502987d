"""Nothing is lost under faults (src/rlbook/checkpointing.py, the checkpoint code of trainer.py and cli.py).

``rlbook train`` is killed with SIGKILL at chosen points and resumed with ``--resume``; the resumed run must
end exactly like an uninterrupted one (metrics.jsonl and the final weights). The kill points:

    (a) as soon as step 2's line is in metrics.jsonl (polled: anywhere in or after step 2's save)
    (b) half-way through writing checkpoint-2's trainer_state.pt (deterministic, see KILL_DURING_SAVE)
    (c) right after checkpoint-2 is renamed into place, before the older ones are pruned
    (d) no kill, but the damage one could leave on a bad disk: the newest checkpoint truncated and
        metrics.jsonl ending in a line cut mid-write

The deterministic kills (b, c) run the CLI in a child process whose ``torch.save`` or
``prune_checkpoints`` is wrapped to SIGKILL itself at the chosen point, so the library holds no
test-only hook. A full disk is simulated in-process with ``torch.save`` raising ENOSPC.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlbook.cli import main
from rlbook.checkpointing import (
    CheckpointError,
    atomic_folder,
    atomic_save,
    list_checkpoints,
    prune_checkpoints,
    read_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
STEPS = 3
SMALL = ["--set", "num_generations=2", "--set", "per_device_train_batch_size=4"]


def train_args(out, *extra, steps=STEPS):
    return ["train", "--algo", "grpo", "--task", "arithmetic", "--max-steps", str(steps),
            "--save-steps", "1", "--output-dir", str(out), "--seed", "0", "--no-progress", *SMALL, *extra]


def start(out, *extra, code=None, steps=STEPS):
    """``python -m rlbook train ...`` in a child process (``python -c code ...`` when ``code`` is given)."""
    head = ["-m", "rlbook"] if code is None else ["-c", code]
    return subprocess.Popen([sys.executable, *head, *train_args(out, *extra, steps=steps)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, timeout=120):
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def resume(out, *extra):
    code, err = finish(start(out, "--resume", *extra))
    assert code == 0, err
    assert "resumed" in err or "starting again from step 0" in err, err
    return err


def read_metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(out, reference):
    """Same metrics lines (numbers to rel 1e-6, timings aside) and the same final weights (atol 1e-6)."""
    got, want = read_metrics(out), read_metrics(reference)
    assert [m["step"] for m in got] == [m["step"] for m in want] == list(range(1, STEPS + 1))
    for a, b in zip(got, want):
        assert a.keys() == b.keys(), a["step"]
        for key, value in b.items():
            if key.startswith("time/"):
                continue
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=1e-6, abs=1e-12, nan_ok=True), (a["step"], key)
            else:
                assert a[key] == value, (a["step"], key)
    final = f"checkpoint-{STEPS}"
    mine, theirs = read_checkpoint(out / final)["policy"], read_checkpoint(reference / final)["policy"]
    assert mine.keys() == theirs.keys()
    for key in theirs:
        torch.testing.assert_close(mine[key], theirs[key], atol=1e-6, rtol=0, msg=key)


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp-" in p.name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of STEPS steps, a checkpoint at every step."""
    out = tmp_path_factory.mktemp("reference") / "run"
    code, err = finish(start(out))
    assert code == 0, err
    return out


# --- the pieces --------------------------------------------------------------------------------------------

def test_atomic_save_leaves_no_temporary_file_and_replaces_the_old_content(tmp_path):
    atomic_save({"x": 1}, tmp_path / "f.pt")
    atomic_save({"x": 2}, tmp_path / "f.pt")
    assert torch.load(tmp_path / "f.pt") == {"x": 2}
    assert os.listdir(tmp_path) == ["f.pt"]


def test_a_failed_folder_write_keeps_the_existing_folder(tmp_path):
    with atomic_folder(tmp_path / "checkpoint-1") as folder:
        (folder / "a").write_text("old")
    with pytest.raises(OSError), atomic_folder(tmp_path / "checkpoint-1") as folder:
        (folder / "a").write_text("new, half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (tmp_path / "checkpoint-1" / "a").read_text() == "old"
    with atomic_folder(tmp_path / "checkpoint-1") as folder:  # replacing a complete folder
        (folder / "a").write_text("new")
    assert (tmp_path / "checkpoint-1" / "a").read_text() == "new"
    assert os.listdir(tmp_path) == ["checkpoint-1"]


def test_list_and_prune_see_complete_checkpoints_only(tmp_path):
    for name in ("checkpoint-10", "checkpoint-9", "checkpoint-2", ".checkpoint-11.tmp", ".checkpoint-1.trash",
                 "checkpoint-x"):
        (tmp_path / name).mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-9", "checkpoint-10"]
    assert [p.name for p in prune_checkpoints(tmp_path, 1, keep=tmp_path / "checkpoint-2")] == ["checkpoint-9"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-10"]
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, 0)


def test_a_full_disk_stops_the_run_with_one_line_and_the_previous_checkpoint_intact(tmp_path, capsys,
                                                                                    monkeypatch):
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if "checkpoint-2" in str(getattr(f, "name", f)):
            f.write(b"PK\x03\x04 a few bytes")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "D"
    assert main(train_args(out, steps=2)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err == (f"error: could not save checkpoint {out / 'checkpoint-2'}: No space left on device; "
                   "the previous checkpoint is intact")
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-1"]
    assert read_checkpoint(out / "checkpoint-1")["step"] == 1
    assert leftovers(out) == []


def test_the_trainer_raises_checkpoint_error_naming_the_folder(tmp_path, monkeypatch):
    from tests.test_trainer import make_trainer

    trainer = make_trainer("grpo", max_steps=1)
    trainer.save_checkpoint(tmp_path / "checkpoint-0")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match="could not save checkpoint .*checkpoint-1: No space left"):
        trainer.save_checkpoint(tmp_path / "checkpoint-1")
    assert os.listdir(tmp_path) == ["checkpoint-0"]
    make_trainer("grpo", max_steps=1).resume(tmp_path / "checkpoint-0")


# --- kill -9 and --resume ----------------------------------------------------------------------------------

def test_killed_after_a_step_is_logged_resumes_like_an_uninterrupted_run(tmp_path, reference):
    out = tmp_path / "run"
    process = start(out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        metrics = out / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(json.loads(line)["step"] == 2 for line in lines if line.endswith("}")):
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    code, _ = finish(process)
    assert code == -signal.SIGKILL, "the run ended before it was killed"
    resume(out)
    assert_same_run(out, reference)


KILL_DURING_SAVE = """
import io, os, signal, sys
import torch
from rlbook.cli import main

real_save = torch.save

def save(obj, f, *args, **kwargs):
    if ".checkpoint-2.tmp" in str(getattr(f, "name", f)):  # write half of checkpoint-2, then die
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)

torch.save = save
sys.exit(main(sys.argv[1:]))
"""


def test_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(tmp_path, reference):
    out = tmp_path / "run"
    code, _ = finish(start(out, code=KILL_DURING_SAVE))
    assert code == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-1"]
    assert leftovers(out) == [".checkpoint-2.tmp"]
    partial = list((out / ".checkpoint-2.tmp").iterdir())
    assert len(partial) == 1 and partial[0].name.startswith("trainer_state.pt.tmp-")
    assert [m["step"] for m in read_metrics(out)] == [1, 2]  # step 2 was logged before its save
    err = resume(out)
    assert "resumed" in err and "at step 1" in err, err
    assert leftovers(out) == []
    assert_same_run(out, reference)


KILL_BEFORE_PRUNING = """
import os, signal, sys
import rlbook.callbacks
from rlbook.cli import main

real_prune = rlbook.callbacks.prune_checkpoints

def prune(folder, keep_last, keep=None):
    if keep is not None and keep.name == "checkpoint-2":  # checkpoint-2 is in place: die before pruning
        os.kill(os.getpid(), signal.SIGKILL)
    return real_prune(folder, keep_last, keep)

rlbook.callbacks.prune_checkpoints = prune
sys.exit(main(sys.argv[1:]))
"""


def test_killed_between_a_checkpoint_and_pruning_resumes_and_prunes_later(tmp_path, reference):
    out = tmp_path / "run"
    code, _ = finish(start(out, "--save-total-limit", "1", code=KILL_BEFORE_PRUNING))
    assert code == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-1", "checkpoint-2"]
    err = resume(out, "--save-total-limit", "1")
    assert "at step 2" in err, err
    assert [p.name for p in list_checkpoints(out)] == [f"checkpoint-{STEPS}"]
    assert leftovers(out) == []
    assert_same_run(out, reference)


def test_an_unreadable_checkpoint_and_a_cut_metrics_line_are_skipped_on_resume(tmp_path, reference):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    state = out / f"checkpoint-{STEPS}" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 3])
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward": 0.2')  # a line cut mid-write
    err = resume(out)
    assert f"warning: could not read checkpoint {out / f'checkpoint-{STEPS}'}" in err, err
    assert "dropped 1 damaged line" in err and f"at step {STEPS - 1}" in err, err
    assert_same_run(out, reference)
