"""rlbook: the package beside *Reinforcement Learning from Q-learning to the GRPO family*.

Each sub-package follows a part of the book:

- :mod:`rlbook.tabular` -- finite MDPs, dynamic programming, Q-learning and SARSA (Part I);
- :mod:`rlbook.exercises` -- checkers that compare a reader's solution with the reference.
"""

__version__ = "0.1.0"
