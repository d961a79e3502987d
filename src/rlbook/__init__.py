"""rlbook: the package beside *Reinforcement Learning from Q-learning to the GRPO family*.

Each sub-package follows a part of the book:

- :mod:`rlbook.tabular` -- finite MDPs, dynamic programming, Q-learning and SARSA (Part I);
- :mod:`rlbook.lm` -- tiny Llama/Qwen2 causal LMs over a character tokenizer, saving and loading policies;
- :mod:`rlbook.tasks` -- verifiable-reward tasks, preference pairs, and an evaluator;
- :mod:`rlbook.rollout` -- batched sampling with a KV cache, and per-token log-probs of completions;
- :mod:`rlbook.sft` -- supervised fine-tuning of the base (reference) policies;
- :mod:`rlbook.presets` -- ``RLConfig`` and ``PRESETS``: what each algorithm of Parts III-V is, as settings;
- :mod:`rlbook.advantages`, :mod:`rlbook.objectives` -- advantage estimators, KL estimators and losses, each a small
  pure tensor function;
- :mod:`rlbook.trainer`, :mod:`rlbook.callbacks`, :mod:`rlbook.metrics` -- the one RL loop, its public hooks, and
  the meaning of every metric it logs;
- :mod:`rlbook.reward_model`, :mod:`rlbook.dpo`, :mod:`rlbook.gapo` -- Bradley-Terry reward models, DPO, GAPO;
- :mod:`rlbook.experiment`, :mod:`rlbook.cli` -- arms x seeds experiments with stored results, and ``rlbook train``;
- :mod:`rlbook.distributed`, :mod:`rlbook.integrations` -- the trainer under torchrun, the TRL bridge, and every
  preset's TRL, verl and OpenRLHF options;
- :mod:`rlbook.exercises` -- checkers that compare a reader's solution with the reference;
- :mod:`rlbook.runs`, :mod:`rlbook.plotting` -- a run folder read back (``read_metrics``, ``export_checkpoint``), and
  the book's plots (``plot_runs`` draws runs side by side).

The main entry points are importable from the top (``from rlbook import Trainer, preset, load_base_policy``); they
are imported on first use, so ``import rlbook`` itself loads neither torch nor transformers::

    from rlbook import RECIPES, Trainer, load_base_policy, preset

    policy, tokenizer = load_base_policy("arithmetic")   # a shipped base policy; RECIPES names them all
    task = RECIPES["arithmetic"].make_task()              # the task (and settings) it was fine-tuned on
    history = Trainer(policy, tokenizer, task, preset("grpo", max_steps=100)).train()
"""

from importlib import import_module

__version__ = "0.1.0"

# name -> the module that defines it, imported when the name is first used (PEP 562)
_EXPORTS = {
    "Trainer": "rlbook.trainer",
    "RLConfig": "rlbook.presets",
    "PRESETS": "rlbook.presets",
    "preset": "rlbook.presets",
    "TrainerCallback": "rlbook.callbacks",
    "METRICS": "rlbook.metrics",
    "RECIPES": "rlbook.checkpoints",
    "load_base_policy": "rlbook.checkpoints",
    "load_policy": "rlbook.lm",
    "save_policy": "rlbook.lm",
    "TASKS": "rlbook.tasks",
    "get_task": "rlbook.tasks",
    "build_preference_pairs": "rlbook.tasks",
    "DPOConfig": "rlbook.dpo",
    "train_dpo": "rlbook.dpo",
    "read_metrics": "rlbook.runs",
    "export_checkpoint": "rlbook.runs",
    "plot_runs": "rlbook.plotting",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlbook' has no attribute {name!r}; the top level exports "
                             f"{', '.join(sorted(_EXPORTS))} (the rest lives in the sub-modules)")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # found directly next time
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
