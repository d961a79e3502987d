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
- :mod:`rlbook.exercises` -- checkers that compare a reader's solution with the reference.
"""

__version__ = "0.1.0"
