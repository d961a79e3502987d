"""A checkpoint is data, never code (src/rlbook/checkpointing.py, the checkpoint code of trainer.py and cli.py).

Readers send each other run folders, so ``rlbook train --resume`` must not run code hidden in one: the policy is
read from ``model.safetensors`` and ``trainer_state.pt`` with ``torch.load(..., weights_only=True)``. These tests
hand ``--resume`` a ``trainer_state.pt`` whose pickle would create a marker file when unpickled, check that a
normal save and resume is still bit-exact, and that a checkpoint of the previous format (the policy inside
``trainer_state.pt``, numpy scalars in the history) still loads when it holds only data, and is otherwise refused
with the command that converts it (``rlbook convert-checkpoint DIR --trust``).
"""

import io
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlbook.cli import main
from rlbook.checkpointing import (
    STATE_FILE,
    WEIGHTS_FILE,
    UnsafeCheckpointError,
    list_checkpoints,
    read_checkpoint,
    to_plain,
)
from rlbook.lm import load_policy
from rlbook.presets import preset

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
STEPS = 3
SMALL = ["--set", "num_generations=2", "--set", "per_device_train_batch_size=4"]


def train_args(out, *extra):
    return ["train", "--algo", "grpo", "--task", "arithmetic", "--max-steps", str(STEPS), "--save-steps", "1",
            "--output-dir", str(out), "--seed", "0", "--no-progress", *SMALL, *extra]


def read_metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def snapshot(folder):
    """Every file under ``folder`` and its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def same_metrics(a: dict, b: dict) -> bool:
    """Equal metrics, bit for bit (NaN equals NaN), timings aside."""
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) if isinstance(a[k], float) and math.isnan(a[k]) else a[k] == b[k]
        for k in a if not k.startswith("time/"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, one_torch_thread):
    """An uninterrupted run of STEPS steps, a checkpoint at every step."""
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main(train_args(out)) == 0
    return out


@pytest.fixture
def interrupted(tmp_path, straight):
    """The straight run as if killed after step STEPS - 1's checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    shutil.rmtree(out / f"checkpoint-{STEPS}")
    return out


class CreatesMarker:
    """Unpickling this object calls ``open(path, "w")``: it creates the file ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def malicious_state(marker: Path, kind: str) -> bytes:
    """A ``trainer_state.pt`` that creates ``marker`` when unpickled: written by ``torch.save`` (a zip file), or a
    bare pickle."""
    state = {"step": STEPS, "history": [CreatesMarker(marker)], "config": {}}
    if kind == "bare pickle":
        return pickle.dumps(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


# --- a crafted pickle runs nothing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["torch.save", "bare pickle"])
def test_resume_refuses_a_malicious_trainer_state_with_one_line_and_runs_nothing(interrupted, tmp_path, kind):
    marker = tmp_path / "marker"
    evil = interrupted / f"checkpoint-{STEPS}"
    evil.mkdir()
    (evil / STATE_FILE).write_bytes(malicious_state(marker, kind))
    before = snapshot(interrupted)

    done = subprocess.run([sys.executable, "-m", "rlbook", *train_args(interrupted, "--resume")], env=ENV,
                          capture_output=True, text=True, timeout=300)

    assert not marker.exists(), "unpickling the checkpoint ran its code"
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: --resume: {evil / STATE_FILE} was not loaded"), err
    assert f"rlbook convert-checkpoint {evil} --trust" in err, err
    if kind == "torch.save":
        assert "(io.open)" in err, err  # the global it asked for, read from the opcodes without running them
    assert snapshot(interrupted) == before  # earlier checkpoints, metrics.jsonl and run.json untouched


def test_read_checkpoint_raises_a_value_error_naming_the_file(tmp_path):
    marker = tmp_path / "marker"
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / STATE_FILE).write_bytes(malicious_state(marker, "torch.save"))
    with pytest.raises(UnsafeCheckpointError, match="checkpoint-1/trainer_state.pt was not loaded"):
        read_checkpoint(tmp_path / "checkpoint-1")
    assert isinstance(UnsafeCheckpointError("x"), ValueError)
    assert not marker.exists()


# --- a normal checkpoint: data only, bit-exact ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ppo", "lambda_grpo"])  # a value model; a learned λ in its own param group
def test_save_and_resume_round_trip_is_bit_exact(tmp_path, name):
    from tests.test_trainer import make_trainer

    first = make_trainer(name, max_steps=3)
    first.train(steps=2, progress=False)
    first.save_checkpoint(tmp_path / "ckpt")
    second = make_trainer(name, max_steps=3).resume(tmp_path / "ckpt")

    assert second.step == 2 and second.kl_coef == first.kl_coef
    assert all(same_metrics(a, b) for a, b in zip(first.history, second.history, strict=True))
    for a, b in [(first.policy, second.policy), (first.value_model, second.value_model)]:
        if a is not None:
            mine, theirs = a.state_dict(), b.state_dict()
            assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    mine, theirs = first.optimizer.state_dict(), second.optimizer.state_dict()
    assert mine["param_groups"] == theirs["param_groups"]
    for i, slots in mine["state"].items():
        assert all(torch.equal(value, theirs["state"][i][key]) for key, value in slots.items()), i
    if first.response_weight_lambda is not None:
        assert torch.equal(first.response_weight_lambda, second.response_weight_lambda)

    first.train(progress=False)
    second.train(progress=False)
    assert same_metrics(first.history[-1], second.history[-1])
    assert all(torch.equal(v, second.policy.state_dict()[k]) for k, v in first.policy.state_dict().items())


def test_a_mixture_of_experts_resumes_bit_exact(tmp_path):
    """transformers saves a MoE's fused expert matrices as per-expert ones; reading them back must undo it."""
    from rlbook.lm import build_model, build_tokenizer
    from rlbook.tasks import get_task
    from rlbook.trainer import Trainer
    from tests.test_trainer import SMALL, length_reward

    def make():
        return Trainer(build_model("tiny", arch="qwen3_moe", seed=0), build_tokenizer(),
                       get_task("arithmetic", num_digits=1), preset("grpo", **{**SMALL, "max_steps": 1}),
                       reward_fn=length_reward)

    first = make()
    first.train(progress=False)
    first.save_checkpoint(tmp_path / "ckpt")
    second = make().resume(tmp_path / "ckpt")
    mine, theirs = first.policy.state_dict(), second.policy.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_a_checkpoint_is_a_policy_folder_and_a_state_of_data(tmp_path):
    from tests.test_trainer import make_trainer

    trainer = make_trainer("grpo", max_steps=1)
    trainer.train(progress=False)
    trainer.history[-1]["numpy_metric"] = np.float32(0.25)  # what a callback might log: saved as a float
    trainer.save_checkpoint(tmp_path / "ckpt")

    assert {WEIGHTS_FILE, "config.json", STATE_FILE} <= {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "ckpt" / STATE_FILE) == []
    state = torch.load(tmp_path / "ckpt" / STATE_FILE, weights_only=True)
    assert "policy" not in state and type(state["history"][-1]["numpy_metric"]) is float
    taken_away, _ = load_policy(tmp_path / "ckpt", device="cpu")  # what a practitioner takes away
    assert all(torch.equal(v, taken_away.state_dict()[k]) for k, v in trainer.policy.state_dict().items())


def test_to_plain_converts_numpy_and_names_what_it_cannot():
    plain = to_plain({"history": [{"r": np.float64(0.5), "n": np.int64(3), "ok": True}], "betas": (0.9, 0.99),
                      "a": np.arange(3), 4: torch.ones(2)})
    assert plain["history"] == [{"r": 0.5, "n": 3, "ok": True}] and type(plain["history"][0]["n"]) is int
    assert plain["betas"] == (0.9, 0.99) and torch.equal(plain["a"], torch.arange(3))
    with pytest.raises(TypeError, match=r"cannot save state\['history'\]\[0\]\['when'\] in a checkpoint: "
                                        r"it is a pathlib\..*Path"):
        to_plain({"history": [{"when": Path("x")}]})


# --- the previous format -------------------------------------------------------------------------------------------

def rewrite_in_previous_format(folder: Path, **history_extra) -> None:
    """``folder`` as the previous rlbook wrote it: only ``trainer_state.pt``, the policy inside it, and (with
    ``history_extra``) numpy values in the last history entry."""
    state = read_checkpoint(folder)
    state["history"][-1].update(history_extra)
    shutil.rmtree(folder)
    folder.mkdir()
    torch.save(state, folder / STATE_FILE)


def test_a_previous_format_checkpoint_of_plain_types_still_resumes(interrupted, straight, capsys):
    rewrite_in_previous_format(interrupted / f"checkpoint-{STEPS - 1}")
    assert main(train_args(interrupted, "--resume")) == 0
    assert f"at step {STEPS - 1}" in capsys.readouterr().err
    assert all(same_metrics(a, b) for a, b in zip(read_metrics(interrupted), read_metrics(straight), strict=True))


def test_a_previous_format_checkpoint_with_numpy_is_refused_then_converted_with_trust(interrupted, straight, capsys):
    old = interrupted / f"checkpoint-{STEPS - 1}"
    rewrite_in_previous_format(old, reward=np.float64(read_metrics(straight)[STEPS - 2]["reward"]))

    assert main(train_args(interrupted, "--resume")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "numpy" in err, err
    assert err.endswith(f"convert it with: rlbook convert-checkpoint {old} --trust"), err

    assert main(["convert-checkpoint", str(interrupted)]) == 2  # never without --trust
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pass --trust if you trust whoever made them" in err, err
    assert not (old / WEIGHTS_FILE).exists()

    assert main(["convert-checkpoint", str(old), "--trust"]) == 0
    assert f"converted {old}" in capsys.readouterr().err
    assert (old / WEIGHTS_FILE).is_file()
    assert torch.serialization.get_unsafe_globals_in_checkpoint(old / STATE_FILE) == []
    assert [p.name for p in list_checkpoints(interrupted)] == [f"checkpoint-{s}" for s in range(1, STEPS)]

    assert main(train_args(interrupted, "--resume")) == 0  # and the run continues as if never converted
    assert all(same_metrics(a, b) for a, b in zip(read_metrics(interrupted), read_metrics(straight), strict=True))


def test_convert_checkpoint_needs_a_run_folder(tmp_path, capsys):
    assert main(["convert-checkpoint", str(tmp_path), "--trust"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "neither a checkpoint folder nor a run folder" in err, err
