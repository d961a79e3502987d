"""Bridges from the book's settings to the libraries that train large models.

- :mod:`rlbook.integrations.trl` -- an :class:`rlbook.presets.RLConfig` (or a preset's name) as TRL's
  ``GRPOConfig``, a task's reward as TRL reward functions, and its prompts as a ``datasets.Dataset``: the same
  algorithm under TRL's ``GRPOTrainer`` with accelerate or DeepSpeed on many GPUs. Needs the ``crosscheck`` extra
  (``pip install -e '.[crosscheck]'``).
- :mod:`rlbook.integrations.engines` -- every preset as the text to paste into TRL, verl and OpenRLHF (pinned
  releases), with notes where an engine computes something else and "not available" with the reason where it lacks
  a piece (:func:`~rlbook.integrations.engines.engine_markdown` is the book's view). Needs nothing beyond the
  package.

Nothing here is imported by ``rlbook`` itself: the book and its tests run without TRL.
"""
