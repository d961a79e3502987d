"""Files that survive a crash: checkpoints and logs are written whole or not at all.

A process can die at any instruction (``kill -9``, a lost machine, a full disk). The rule used here
is the usual one of databases and of ``git``: write the new version beside the old one under a
temporary name, force it to disk (``os.fsync``), then rename it into place, because a rename within
one folder is atomic: a reader sees the old version or the new one, never half of either. The folder
is fsynced too, so that the rename itself survives a power cut.

    atomic_save(obj, path)         torch.save to path.tmp-<pid>, fsync, os.replace, fsync the folder
    atomic_write_text(path, text)  the same for a text file (metrics.jsonl after a resume, run.json)
    atomic_folder(path)            build a folder as .<name>.tmp, rename it to <name> when complete
    write_checkpoint(state, path)  a checkpoint folder holding trainer_state.pt, or CheckpointError
    read_checkpoint(path, device)  its state, or CheckpointError when it cannot be read
    list_checkpoints(folder)       the complete checkpoint-<step> folders, oldest first
    prune_checkpoints(folder, k)   delete all but the newest k

Temporary names start with a dot (``.checkpoint-4.tmp``, ``.checkpoint-2.trash``) or end in
``.tmp-<pid>``, so nothing that looks for ``checkpoint-<step>`` ever sees them;
:func:`remove_leftovers` deletes what a killed process left behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import torch

STATE_FILE = "trainer_state.pt"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_LEFTOVER = re.compile(r"^\.checkpoint-\d+\.(tmp|trash)$|\.tmp-\d+$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the folder and the cause."""


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


def write_checkpoint(state: dict, path: str | Path) -> Path:
    """Write ``state`` to ``path/trainer_state.pt``, the folder appearing complete or not at all. A
    failure (a full disk, say) raises :class:`CheckpointError` naming ``path`` and the cause, after
    removing the temporary files; earlier checkpoints are never touched."""
    path = Path(path)
    try:
        with atomic_folder(path) as folder:
            atomic_save(state, folder / STATE_FILE)
    except (OSError, RuntimeError) as error:
        cause = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CheckpointError(f"could not save checkpoint {path}: {cause}; "
                              "the previous checkpoint is intact") from error
    return path


def read_checkpoint(path: str | Path, device=None) -> dict:
    """The state :func:`write_checkpoint` saved in ``path``; :class:`CheckpointError` if it is
    missing or cannot be read (a truncated or corrupted file)."""
    file = Path(path) / STATE_FILE
    try:
        return torch.load(file, map_location=device, weights_only=False)
    except Exception as error:  # a damaged file: RuntimeError, EOFError, UnpicklingError...
        raise CheckpointError(f"could not read checkpoint {path}: {error}") from error


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
