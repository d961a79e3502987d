"""rlbook: the package beside *Reinforcement Learning from Q-learning to the GRPO family*.

Each sub-package follows a part of the book:

- :mod:`rlbook.tabular` -- finite MDPs, dynamic programming, Q-learning and SARSA (Part I);
- :mod:`rlbook.lm` -- tiny Llama/Qwen2 causal LMs over a character tokenizer, saving and loading policies;
- :mod:`rlbook.tasks` -- verifiable-reward tasks, preference pairs, and an evaluator;
- :mod:`rlbook.rollout` -- batched sampling with a KV cache, and per-token log-probs of completions;
- :mod:`rlbook.sft` -- supervised fine-tuning of the base (reference) policies;
- :mod:`rlbook.exercises` -- checkers that compare a reader's solution with the reference.
"""

__version__ = "0.1.0"
