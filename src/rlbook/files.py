"""The old name of :mod:`rlbook.checkpointing` (checkpoint folders written whole or not at all, read back as data):
every name of that module still resolves here."""

from rlbook import checkpointing


def __getattr__(name: str):
    return getattr(checkpointing, name)
