"""Files that survive a crash: checkpoints and logs are written whole or not at all.

A process can die at any instruction (``kill -9``, a lost machine, a full disk). The rule used here
is the usual one of databases and of ``git``: write the new version beside the old one under a
temporary name, force it to disk (``os.fsync``), then rename it into place, because a rename within
one folder is atomic: a reader sees the old version or the new one, never half of either. The folder
is fsynced too, so that the rename itself survives a power cut.

    atomic_save(obj, path)         torch.save to path.tmp-<pid>, fsync, os.replace, fsync the folder
    atomic_write_text(path, text)  the same for a text file (metrics.jsonl after a resume, run.json)
    atomic_folder(path)            build a folder as .<name>.tmp, rename it to <name> when complete
    write_checkpoint(state, path, policy, tokenizer)
                                   a checkpoint folder: trainer_state.pt, and the policy as model.safetensors
    read_checkpoint(path, device)  its state (data only, never code), or CheckpointError / UnsafeCheckpointError
    convert_checkpoint(path, policy, tokenizer)
                                   rewrite a trusted checkpoint of an older format in the current one
    trainer_state(trainer)         what a checkpoint holds of a trainer besides the policy
    restore_trainer_state(trainer, state)
                                   put it back (after checking that the config is the same)
    list_checkpoints(folder)       the complete checkpoint-<step> folders, oldest first
    prune_checkpoints(folder, k)   delete all but the newest k

A checkpoint is data, never code, because readers send runs to each other. The policy's weights are
``model.safetensors`` beside its ``config.json`` and tokenizer (:func:`rlbook.lm.save_policy`, the folder that
:func:`rlbook.lm.load_policy` and ``transformers`` read); the rest of the trainer's state is ``trainer_state.pt``,
which holds tensors and plain Python values only (:func:`to_plain`) and is read with ``torch.load(...,
weights_only=True)``: a file that asks the unpickler for anything else (an object whose ``__reduce__`` would run
code, or a numpy scalar of the previous format) is refused with :class:`UnsafeCheckpointError`, and only
:func:`convert_checkpoint`, for a file the user trusts, unpickles it fully.

Temporary names start with a dot (``.checkpoint-4.tmp``, ``.checkpoint-2.trash``) or end in
``.tmp-<pid>``, so nothing that looks for ``checkpoint-<step>`` ever sees them;
:func:`remove_leftovers` deletes what a killed process left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"
WEIGHTS_FILE = "model.safetensors"
_PLAIN = (str, int, float, bool, type(None))
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_LEFTOVER = re.compile(r"^\.checkpoint-\d+\.(tmp|trash)$|\.tmp-\d+$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the folder and the cause."""


class UnsafeCheckpointError(ValueError):
    """A checkpoint's ``trainer_state.pt`` holds objects other than tensors and plain Python values, so it was not
    loaded (unpickling them could run code); the message names the file and the command that converts it."""


def fsync_dir(path: str | Path) -> None:
    """Force a folder's entries (files created, renamed or deleted in it) to disk. A no-op where
    folders cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)


def _atomic_write(path: str | Path, write) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path`` (``<name>.tmp-<pid>``), flush and fsync
    it, rename it to ``path`` and fsync the folder. If anything fails the temporary file is removed
    and ``path`` is untouched."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
    return path


def atomic_save(obj, path: str | Path) -> Path:
    """``torch.save(obj, path)``, atomically: ``path`` holds the old content or the new, never a
    truncated file."""
    return _atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``Path(path).write_text(text)``, atomically (see :func:`atomic_save`)."""
    return _atomic_write(path, lambda f: f.write(text.encode()))


@contextlib.contextmanager
def atomic_folder(path: str | Path):
    """Yield an empty temporary folder ``.<name>.tmp`` beside ``path``; when the block ends without
    an error, rename it to ``path`` (an existing ``path`` is first moved aside to ``.<name>.trash``,
    then deleted). If the block or the rename fails, the temporary folder is removed and an existing
    ``path`` stays as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, trash = path.with_name(f".{path.name}.tmp"), path.with_name(f".{path.name}.trash")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a process killed while writing this folder
    tmp.mkdir()
    try:
        yield tmp
        fsync_dir(tmp)
        if path.exists():
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(path, trash)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(trash, path)
                raise
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def to_plain(value, where: str = "state"):
    """``value`` with what ``torch.load(..., weights_only=True)`` cannot read turned into what it can: tensors
    are kept, dicts, lists and tuples are converted item by item, numpy scalars become Python numbers and numpy
    arrays tensors. Anything else raises ``TypeError`` naming its place in ``value`` (``where``, e.g.
    ``state['history'][3]['reward']``)."""
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN:
        return value
    if isinstance(value, np.generic):  # np.float64 is a float subclass, but unpickles as a numpy global
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {to_plain(k, f"a key of {where}"): to_plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(f"cannot save {where} in a checkpoint: it is a {type(value).__module__}."
                    f"{type(value).__qualname__}, and a checkpoint holds only tensors, dicts, lists, tuples, "
                    "str, int, float, bool and None")


def write_checkpoint(state: dict, path: str | Path, policy=None, tokenizer=None) -> Path:
    """Write ``state`` (converted by :func:`to_plain`) to ``path/trainer_state.pt`` and, when ``policy`` is
    given, the policy with its tokenizer as ``model.safetensors``, ``config.json`` and tokenizer files
    (:func:`rlbook.lm.save_policy`); the folder appears complete or not at all. A failure (a full disk, say)
    raises :class:`CheckpointError` naming ``path`` and the cause, after removing the temporary files; earlier
    checkpoints are never touched. A value that is not data raises ``TypeError`` before anything is written."""
    from safetensors import SafetensorError

    from rlbook.lm.model import save_policy

    path = Path(path)
    plain = to_plain(state)
    try:
        with atomic_folder(path) as folder:
            atomic_save(plain, folder / STATE_FILE)
            if policy is not None:
                save_policy(policy, tokenizer, folder)
    except (OSError, RuntimeError, SafetensorError) as error:
        cause = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CheckpointError(f"could not save checkpoint {path}: {cause}; "
                              "the previous checkpoint is intact") from error
    return path


def read_checkpoint(path: str | Path, device=None, *, trust: bool = False) -> dict:
    """The state :func:`write_checkpoint` saved in ``path``, with the policy's weights (from
    ``model.safetensors``, or from ``trainer_state.pt`` in a checkpoint of the previous format) under
    ``"policy"``. ``trainer_state.pt`` is read as data (``weights_only=True``): if it holds anything else,
    :class:`UnsafeCheckpointError`. :class:`CheckpointError` if the checkpoint is missing or cannot be read (a
    truncated or corrupted file).

    ``trust=True`` unpickles ``trainer_state.pt`` fully, which runs any code the file holds: only for a
    checkpoint the user trusts, to convert it (:func:`convert_checkpoint`)."""
    folder = Path(path)
    file = folder / STATE_FILE
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols it was not written with
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(file, map_location=device, weights_only=not trust)
    except pickle.UnpicklingError as error:  # the safe unpickler refused something: no code has run
        if trust:  # the full unpickler refuses only a damaged file
            raise CheckpointError(f"could not read checkpoint {path}: {error}") from error
        raise UnsafeCheckpointError(
            f"{file} was not loaded: it holds objects other than tensors and plain Python values "
            f"({_refused(file, error)}), and unpickling them could run code; if you trust whoever made it, "
            f"convert it with: rlbook convert-checkpoint {folder} --trust") from None
    except Exception as error:  # a damaged file: RuntimeError, EOFError, KeyError...
        raise CheckpointError(f"could not read checkpoint {path}: {error}") from error
    if not isinstance(state, dict):
        raise CheckpointError(f"could not read checkpoint {path}: {file} holds a "
                              f"{type(state).__name__}, not a trainer's state")
    if (folder / WEIGHTS_FILE).is_file():
        state["policy"] = _read_policy_weights(folder, device)
    elif "policy" not in state:
        raise CheckpointError(f"could not read checkpoint {path}: it has no {WEIGHTS_FILE}")
    return state


def _read_policy_weights(folder: Path, device) -> dict:
    """The state dict of the policy saved in ``folder`` by :func:`rlbook.lm.save_policy`: safetensors and JSON,
    read by ``transformers`` as it reads any saved model (which also undoes its renaming of weights, e.g. a
    mixture of experts' per-expert matrices), so the tensors are those that were saved, bit for bit."""
    from rlbook.lm.model import load_policy

    try:
        model, _ = load_policy(folder, device=torch.device(device) if device is not None else "cpu")
    except Exception as error:  # a damaged model.safetensors or config.json
        raise CheckpointError(f"could not read checkpoint {folder}: {WEIGHTS_FILE}: {error}") from error
    return model.state_dict()


def _refused(file: Path, error: Exception) -> str:
    """What the safe unpickler refused in ``file``, in a few words: the globals it names (found by reading the
    pickle's opcodes, never by running them), else the first line of torch's reason."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(file)
    except Exception:  # not a torch.save zip file: a bare pickle
        names = []
    if names:
        return ", ".join(names)
    reason = re.search(r"WeightsUnpickler error:\s*(.+)", str(error))
    return reason.group(1).strip() if reason else "not a torch.save file"


def convert_checkpoint(path: str | Path, policy, tokenizer) -> Path:
    """Rewrite the checkpoint ``path`` of an older format (a ``trainer_state.pt`` holding numpy scalars or other
    objects, the policy's weights inside it) in the current one, loading its weights into ``policy`` (a model of
    the same architecture) to save them with ``tokenizer`` as safetensors.

    This unpickles ``trainer_state.pt`` fully (``read_checkpoint(path, trust=True)``), which runs any code the
    file holds: call it only on a checkpoint you trust. ``rlbook convert-checkpoint DIR --trust`` calls it."""
    state = read_checkpoint(path, trust=True)
    try:
        policy.load_state_dict(state.pop("policy"))
    except RuntimeError as error:  # another architecture: missing, unexpected or misshapen weights
        raise ValueError(f"the policy weights in {path} do not fit a {type(policy).__name__}: "
                         + " ".join(str(error).split())) from error
    return write_checkpoint(state, path, policy=policy, tokenizer=tokenizer)


def trainer_state(trainer) -> dict:
    """What a checkpoint holds of ``trainer`` (a :class:`rlbook.trainer.Trainer`) besides the policy, which
    :func:`write_checkpoint` saves on its own: the value model's weights, the optimizer's state, the step, the
    history, the adaptive coefficients (KL, entropy bonus), λ-GRPO's λ, value pretraining's history and the config
    (as a dict)."""
    lam = trainer.response_weight_lambda
    return {
        "value_model": trainer.value_model.state_dict() if trainer.value_model is not None else None,
        "optimizer": trainer.optimizer.state_dict(),
        "step": trainer.step,
        "history": trainer.history,
        "kl_coef": trainer.kl_coef,
        "entropy_coef": trainer.entropy_coef,
        "last_entropy": trainer.last_entropy,
        "response_weight_lambda": None if lam is None else lam.detach().clone(),
        "value_pretrain_history": trainer.value_pretrain_history,
        "config": dataclasses.asdict(trainer.config),
    }


def restore_trainer_state(trainer, state: dict) -> None:
    """Put a checkpoint's ``state`` (:func:`read_checkpoint`'s, the policy's weights included) back into
    ``trainer``, built with the same config (``max_steps`` aside: a run may be extended); a ``ValueError`` naming
    the settings that differ (:func:`describe_differences`) otherwise, before anything is changed. Checkpoints
    written before the entropy bonus existed restore its coefficient from the config."""
    ours = dataclasses.asdict(trainer.config)
    changed = sorted(k for k in set(state["config"]) | set(ours)
                     if k != "max_steps" and state["config"].get(k) != ours.get(k))
    if changed:
        raise ValueError("the checkpoint was made with another config "
                         + describe_differences(changed, state["config"], ours, "the checkpoint", "this trainer"))
    trainer.policy.load_state_dict(state["policy"])
    if trainer.value_model is not None:
        trainer.value_model.load_state_dict(state["value_model"])
    if trainer.response_weight_lambda is not None:
        with torch.no_grad():
            trainer.response_weight_lambda.copy_(state["response_weight_lambda"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.step, trainer.history, trainer.kl_coef = state["step"], state["history"], state["kl_coef"]
    trainer.entropy_coef = state.get("entropy_coef", trainer.config.entropy_coef)
    trainer.last_entropy = state.get("last_entropy", float("inf"))
    trainer.value_pretrain_history = state["value_pretrain_history"]


def describe_differences(keys: list[str], stored: dict, given: dict, stored_as: str = "stored",
                         given_as: str = "given") -> str:
    """``keys`` where two settings differ, with both values: ``"(differs in ['learning_rate']); the checkpoint:
    learning_rate=0.001; this trainer: learning_rate=0.5"``. A key one side lacks shows as ``(absent)``."""
    def values(settings: dict) -> str:
        return ", ".join(f"{k}={settings[k]!r}" if k in settings else f"{k}=(absent)" for k in keys)

    return f"(differs in {list(keys)}); {stored_as}: {values(stored)}; {given_as}: {values(given)}"


def list_checkpoints(folder: str | Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders in ``folder``, by increasing step (temporary folders are
    not listed)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := _CHECKPOINT.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def prune_checkpoints(folder: str | Path, keep_last: int,
                      keep: str | Path | None = None) -> list[Path]:
    """Delete all but the ``keep_last`` newest checkpoint folders (and never ``keep``); return the
    deleted ones. Each is first renamed to ``.checkpoint-<step>.trash``, so a process killed while
    deleting it never leaves a half-deleted folder that looks like a checkpoint."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    keep = Path(keep) if keep is not None else None
    deleted = []
    for old in list_checkpoints(folder)[:-keep_last]:
        if keep is not None and old.resolve() == keep.resolve():
            continue
        trash = old.with_name(f".{old.name}.trash")
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(old, trash)
        shutil.rmtree(trash, ignore_errors=True)
        deleted.append(old)
    if deleted:
        fsync_dir(folder)
    return deleted


def remove_leftovers(folder: str | Path) -> list[Path]:
    """Delete what a killed process may have left in ``folder``: ``.checkpoint-*.tmp`` and
    ``.checkpoint-*.trash`` folders and ``*.tmp-<pid>`` files. Return them."""
    found = [p for p in Path(folder).iterdir() if _LEFTOVER.search(p.name)]
    for p in found:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
    return found
