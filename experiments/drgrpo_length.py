"""Length of wrong and correct completions under GRPO and Dr. GRPO (Chapter "Dr. GRPO").

Trains the shipped ``sort_scratchpad`` base policy (sort 3-6 digits, writing an insertion-sort scratchpad before
the answer; the reward checks only the answer, so the model is free to choose its length) with the trainer's
presets ``grpo`` (group z-scores, per-completion token mean 1/|o_i|) and ``dr_grpo`` (no std, constant
normaliser), both with beta = 0 so that the normaliser and the std are the only differences, several seeds each.
Every step records (:class:`LengthStats`), over that step's sampled completions, the mean length (characters; the
tokenizer is character-level) of the wrong and of the correct ones, and the mean *excess* length: length minus the
length of the reference scratchpad of the same prompt (0 for a completion as long as the demonstration), which
removes the effect of which prompts (3 or 6 digits) happened to be drawn.

    python experiments/drgrpo_length.py            # writes experiments/results/drgrpo_length.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np

from rlbook.callbacks import TrainerCallback
from rlbook.experiment import Arm, run_experiment, train_run

POLICY = "sort_scratchpad"
ARMS = {"grpo": Arm("grpo"), "dr_grpo": Arm("dr_grpo")}
RESULTS = Path(__file__).parent / "results" / "drgrpo_length.json"
SETTINGS = dict(num_generations=8, per_device_train_batch_size=64, learning_rate=3e-4, beta=0.0, max_steps=200,
                eval_every=50, eval_size=128)
LOGGED = ("length_wrong", "excess_wrong", "length_correct", "excess_correct", "accuracy", "completions/clipped_ratio")


def length_stats(task, examples, completions, rewards) -> dict:
    """Mean length and mean excess length (length minus the reference's) of the wrong and the correct completions
    of one step; NaN where a step has none of a kind."""
    lengths = np.array([len(c) for c in completions], dtype=float)
    excess = lengths - np.array([len(task.demonstration(e)) for e in examples], dtype=float)
    correct = np.asarray(rewards) == task.correct_reward
    out = {}
    for kind, rows in (("wrong", ~correct), ("correct", correct)):
        out[f"length_{kind}"] = float(lengths[rows].mean()) if rows.any() else float("nan")
        out[f"excess_{kind}"] = float(excess[rows].mean()) if rows.any() else float("nan")
    return out


class LengthStats(TrainerCallback):
    """:func:`length_stats` of each step's rollout, rounded to 4 decimals (the rewards,
    here the task's rule, decide which completions are wrong and which correct)."""

    metrics = {"length_wrong": "mean length of the step's wrong completions (characters)",
               "excess_wrong": "their mean length minus the reference scratchpad's",
               "length_correct": "mean length of the step's correct completions",
               "excess_correct": "their mean length minus the reference scratchpad's"}

    def on_rollout_end(self, trainer, rollout):
        G = trainer.config.num_generations
        examples = [e for e in rollout.examples for _ in range(G)]  # one per completion
        stats = length_stats(trainer.task, examples, rollout.completions, rollout.rewards)
        return {key: round(value, 4) for key, value in stats.items()}


def run_one(name: str, arm: Arm, seed: int, **settings) -> dict:
    """One run of ``arm`` from the shipped base policy: per-step lengths and accuracy, held-out accuracy."""
    return train_run(POLICY, arm, seed, callbacks=[LengthStats()], logged=LOGGED, **settings)


def run(arms=tuple(ARMS), seeds=(0, 1, 2, 3, 4), *, out=None, processes=None, arguments=None, **settings) -> dict:
    """Run the presets ``arms`` for ``seeds``; ``settings`` override :data:`SETTINGS` (the tests shorten runs)."""
    settings = {**SETTINGS, **settings}
    return run_experiment("drgrpo_length", functools.partial(run_one, **settings), {a: ARMS[a] for a in arms}, seeds,
                          out=out, common=settings, processes=processes, steps_per_run=settings["max_steps"],
                          arguments=arguments, checkpoints=[POLICY], description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=SETTINGS["max_steps"])
    parser.add_argument("--lr", type=float, default=SETTINGS["learning_rate"])
    parser.add_argument("--presets", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(tuple(args.presets), seeds=range(args.first_seed, args.first_seed + args.seeds), out=args.out,
        processes=args.processes, arguments={**vars(args), "out": str(args.out)}, max_steps=args.steps,
        learning_rate=args.lr)


if __name__ == "__main__":
    main()
