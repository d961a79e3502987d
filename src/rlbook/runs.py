"""A run folder read back: its metrics for plots, and its models to take away.

``rlbook train --output-dir DIR`` (and :class:`rlbook.trainer.Trainer` with ``log_file=`` and
:meth:`~rlbook.trainer.Trainer.save_checkpoint`) write::

    DIR/run.json               the command's settings: algo, task, model size, seed, overrides, the whole RLConfig
    DIR/metrics.jsonl          one JSON object per step: "step" (counted from 1) and the keys of rlbook.metrics.METRICS
    DIR/checkpoint-<step>/     a Hugging Face model folder (model.safetensors, config.json, tokenizer files) that
                               rlbook.lm.load_policy and transformers.AutoModelForCausalLM.from_pretrained read,
                               and trainer_state.pt: what --resume needs (optimizer, history, the value model's weights)

The functions here::

    read_metrics(run_dir)              metrics.jsonl as a list of dicts, one per step (the shape of Trainer.history)
    metric_values(records, key)        one metric of them as (steps, values)
    newest_checkpoint(path)            the checkpoint folder that PATH names, or the newest one of a run folder
    export_checkpoint(checkpoint, out) the policy, and the value model where there is one, as Hugging Face folders

A value model (PPO, VAPO) is stored in a checkpoint as a state dict inside ``trainer_state.pt``, which ``--resume``
reads; :func:`export_checkpoint` writes it as ``OUT/value_model``, a folder that
``transformers.AutoModelForTokenClassification.from_pretrained`` reads (:func:`rlbook.lm.value.token_values` gives
its values).
"""

from __future__ import annotations

import json
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
EXPORT_FILE = "export.json"  # what an export was made from; marks a folder `rlbook export` may replace
VALUE_MODEL_DIR = "value_model"


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The metrics of a run as a **list of dicts**, one per step in the order logged, each with ``"step"``
    (counted from 1) and the keys of :data:`rlbook.metrics.METRICS`: the shape of ``Trainer.history``, which
    :func:`rlbook.plotting.plot_runs` and :func:`rlbook.plotting.plot_training_curves` take. A key logged only at
    some steps (``eval_accuracy`` every ``eval_every``) is absent from the others.

    ``run_dir`` is a run folder holding ``metrics.jsonl`` or the file itself. A last line cut mid-write (a run
    killed, or one still writing) is left out; a damaged line before it raises ``ValueError`` naming the line.
    ``FileNotFoundError`` if there is no such file. Turn it into columns with :func:`metric_values`."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} at {path}: a run folder written by `rlbook train` holds one "
                                "(in Python, Trainer(..., log_file=PATH) writes it)")
    lines = path.read_text(errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # cut mid-write
                break
            raise ValueError(f"{path}, line {number}, is not a JSON object: {error}") from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{path}, line {number}, is not a step's metrics (a JSON object with 'step')")
        records.append(record)
    return records


def metric_values(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` at the steps of ``records`` (:func:`read_metrics`) that logged it."""
    pairs = [(r["step"], r[key]) for r in records if key in r and r[key] is not None]
    return [s for s, _ in pairs], [float(v) for _, v in pairs]


def newest_checkpoint(path: str | Path) -> Path:
    """``path`` itself if it is a checkpoint folder (it holds ``trainer_state.pt``), else the newest
    ``checkpoint-<step>`` folder of the run folder ``path``. ``FileNotFoundError`` naming ``path`` when it has
    none."""
    from rlbook.checkpointing import STATE_FILE, list_checkpoints

    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    checkpoints = list_checkpoints(path)
    if not checkpoints:
        why = ("does not exist" if not path.exists() else "is a file, not a run folder" if not path.is_dir()
               else "holds no checkpoint-<step> folder and is not one itself")
        raise FileNotFoundError(f"{path} {why}: no checkpoint to read")
    return checkpoints[-1]


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the policy of ``checkpoint`` (a ``checkpoint-<step>`` folder) to the folder ``out`` as a Hugging Face
    model with its tokenizer, and, when the run trained a value model, that model as ``out/value_model``
    (``AutoModelForTokenClassification``, one label, with the tokenizer); ``out/export.json`` says what it was made
    from. The folder appears complete or not at all; an ``out`` that exists must be an earlier export (it holds
    ``export.json``), which is replaced, or empty: anything else is a ``FileExistsError``, so that no folder of
    yours is overwritten.

    The checkpoint is read as data (:func:`rlbook.checkpointing.read_checkpoint`): one of an older format raises
    :class:`rlbook.checkpointing.UnsafeCheckpointError` naming the command that converts it, a damaged one
    :class:`rlbook.checkpointing.CheckpointError`. Returns ``out``."""
    from rlbook.checkpointing import atomic_folder, read_checkpoint
    from rlbook.lm.model import save_policy

    checkpoint, out = Path(checkpoint), Path(out)
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_FILE).is_file():
        raise FileExistsError(f"{out} already exists and is not an earlier export (it has no {EXPORT_FILE}); "
                              "choose another folder or empty it")
    state = read_checkpoint(checkpoint, "cpu")
    policy, tokenizer = _policy_of(checkpoint)
    value_model = _value_model_of(policy, state.get("value_model"), checkpoint)
    record = {"checkpoint": str(checkpoint.resolve()), "step": state.get("step"),
              "value_model": VALUE_MODEL_DIR if value_model is not None else None}
    run_json = checkpoint.parent / "run.json"
    if run_json.is_file():
        record["run"] = {k: v for k, v in json.loads(run_json.read_text()).items() if k != "config"}
    with atomic_folder(out) as folder:
        save_policy(policy, tokenizer, folder)
        if value_model is not None:
            save_policy(value_model, tokenizer, folder / VALUE_MODEL_DIR)
        (folder / EXPORT_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return out


def _policy_of(checkpoint: Path):
    """``(policy, tokenizer)`` saved in ``checkpoint``, on the CPU."""
    from rlbook.checkpointing import CheckpointError
    from rlbook.lm.model import load_policy

    try:
        return load_policy(checkpoint, device="cpu")
    except Exception as error:  # a damaged config.json or tokenizer
        raise CheckpointError(f"could not read the policy in {checkpoint}: {error}") from error


def _value_model_of(policy, weights: dict | None, checkpoint: Path):
    """The value model whose ``weights`` a checkpoint stored (a ``…ForTokenClassification`` shaped like
    ``policy``, as :func:`rlbook.lm.value.build_value_model` makes it), or None when it stored none."""
    from rlbook.checkpointing import CheckpointError
    from rlbook.lm.value import build_value_model

    if weights is None:
        return None
    value_model = build_value_model(policy, init="random")
    try:
        value_model.load_state_dict(weights)
    except RuntimeError as error:  # a value model of another architecture (passed to Trainer(value_model=...))
        raise CheckpointError(f"the value model in {checkpoint} is not shaped like its policy, so it cannot be "
                              "exported as one; load trainer_state.pt's 'value_model' state dict into your own "
                              f"model instead ({' '.join(str(error).split())[:200]})") from error
    return value_model
