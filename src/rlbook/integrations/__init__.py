"""Bridges from the book's settings to the libraries that train large models.

- :mod:`rlbook.integrations.trl` -- an :class:`rlbook.presets.RLConfig` (or a preset's name) as TRL's
  ``GRPOConfig``, a task's reward as TRL reward functions, and its prompts as a ``datasets.Dataset``: the same
  algorithm under TRL's ``GRPOTrainer`` with accelerate or DeepSpeed on many GPUs. Needs the ``crosscheck`` extra
  (``pip install -e '.[crosscheck]'``).
- :mod:`rlbook.integrations.engines` -- every preset's option settings in TRL, verl and OpenRLHF, with "not
  available" and the reason where an engine lacks a piece (:func:`~rlbook.integrations.engines.engine_table` is the
  book's table). Needs nothing beyond the package.

Nothing here is imported by ``rlbook`` itself: the book and its tests run without TRL.
"""
