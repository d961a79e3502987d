"""Length inflation under GRPO and GFPO's three filters (Chapter "GFPO").

Trains the shipped ``sort_scratchpad`` base policy (sort 3-6 digits after an insertion-sort scratchpad; the reward
checks only the answer after the last ``"|"``, so the model is free to choose its length: the task of the book with
the longest completions) with four settings, the same prompts per step and the same number of completions trained
on per prompt (8):

- ``grpo``: GRPO with DAPO's token-level loss (the paper's baseline), G = 8, all kept;
- ``gfpo_length``: sample G = 16, keep the 8 shortest;
- ``gfpo_efficiency``: sample G = 16, keep the 8 with the most reward per token;
- ``gfpo_adaptive``: sample G = 16, keep 4, 6, 8 or 8 by difficulty quartile (see ``gfpo_adaptive_k``).

Every step records (callback :class:`ExcessLength`) the mean *excess* length of its sampled completions
(characters, the tokenizer being character-level; minus the length of the demonstration of the same prompt, so
that which prompts were drawn does not matter), and ``time/generate`` and ``time/step`` (sampling, scoring and
update). Before and after training (callback :class:`HeldOutStats`), the held-out accuracy and excess length of one
sample per held-out prompt are measured: length inflation is the final minus the starting excess length (the
paper's "extra length over the starting model").

    python experiments/gfpo_length.py            # writes experiments/results/gfpo_length.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np
import torch

from rlbook.callbacks import TrainerCallback
from rlbook.experiment import Arm, run_experiment, train_run
from rlbook.lm import autocast
from rlbook.rollout import generate_rollouts

POLICY = "sort_scratchpad"
RESULTS = Path(__file__).parent / "results" / "gfpo_length.json"
# per_device_train_batch_size = 8 prompts x num_generations
ARMS = {
    "grpo": Arm("grpo", num_generations=8, per_device_train_batch_size=64, loss_type="dapo", beta=0.0),
    "gfpo_length": Arm("gfpo", num_generations=16, per_device_train_batch_size=128, gfpo_k=8),
    "gfpo_efficiency": Arm("gfpo", num_generations=16, per_device_train_batch_size=128, gfpo_k=8,
                           gfpo_metric="token_efficiency"),
    "gfpo_adaptive": Arm("gfpo", num_generations=16, per_device_train_batch_size=128, gfpo_k=None,
                         gfpo_adaptive=True),
}
COMMON = dict(learning_rate=3e-4, max_steps=200, eval_every=50, eval_size=128)
LOGGED = ("excess_length", "accuracy", "gfpo/kept_mean_length", "time/generate", "time/score", "time/update")


def excess_lengths(task, examples, completions) -> np.ndarray:
    """Length of each completion minus the length of its prompt's demonstration (characters)."""
    return np.array([len(c) - len(task.demonstration(e)) for e, c in zip(examples, completions)], dtype=float)


class ExcessLength(TrainerCallback):
    """Logs ``excess_length``: the mean excess length of the step's sampled completions, all G of every group."""

    metrics = {"excess_length": "mean length of the sampled completions minus their demonstration's (characters)"}

    def on_rollout_end(self, trainer, rollout):
        G = rollout.batch.num_generations
        examples = [e for e in rollout.examples for _ in range(G)]
        return {"excess_length": round(float(excess_lengths(trainer.task, examples, rollout.completions).mean()), 4)}


@torch.no_grad()
def held_out_stats(model, tokenizer, task, examples, max_new_tokens: int, seed: int) -> dict:
    """Accuracy and mean excess length of one sample (temperature 1) per held-out prompt."""
    with autocast(next(model.parameters()).device):
        batch = generate_rollouts(model, tokenizer, [e.prompt for e in examples], max_new_tokens=max_new_tokens,
                                  temperature=1.0, seed=seed)
    completions = batch.decode_completions(tokenizer)
    rewards = task.rewards(examples, completions, batch.truncated.tolist())
    return {"accuracy": float(np.mean(rewards == task.correct_reward)),
            "excess_length": float(excess_lengths(task, examples, completions).mean())}


class HeldOutStats(TrainerCallback):
    """``held_out_stats`` of the policy on ``size`` held-out prompts (drawn from the run's seed) before training
    (``start``) and after it (``end``)."""

    def __init__(self, size: int):
        self.size, self.start, self.end = size, None, None

    def measure(self, trainer) -> dict:
        seed = trainer.config.seed
        examples = trainer.task.sample(self.size, seed=np.random.default_rng([seed, 7]), split="test")
        return held_out_stats(trainer.policy, trainer.tokenizer, trainer.task, examples,
                              trainer.config.max_completion_length, seed=seed)

    def on_train_begin(self, trainer):
        self.start = self.measure(trainer)

    def on_train_end(self, trainer):
        self.end = self.measure(trainer)


def run_one(name: str, arm: Arm, seed: int, held_out_size: int = 256, **common) -> dict:
    """One run of ``arm``: :func:`rlbook.experiment.train_run`'s record, with the three phases' times summed into
    ``time/step``, and the held-out ``start`` and ``end``."""
    held_out = HeldOutStats(held_out_size)
    run = train_run(POLICY, arm, seed, callbacks=[ExcessLength(), held_out], logged=LOGGED, **common)
    metrics = run["metrics"]
    times = [metrics.pop(key) for key in ("time/generate", "time/score", "time/update")]
    metrics["time/generate"] = [round(t, 4) for t in times[0]]
    metrics["time/step"] = [round(sum(t), 4) for t in zip(*times)]
    return {**run, "start": held_out.start, "end": held_out.end}


def run(arms=tuple(ARMS), seeds=(0, 1, 2, 3, 4), held_out_size: int = 256, out=None, processes=None,
        arguments=None, **settings) -> dict:
    common = {**COMMON, **settings}
    return run_experiment("gfpo_length", functools.partial(run_one, held_out_size=held_out_size, **common),
                          {name: ARMS[name] for name in arms}, seeds, out=out, common=common,
                          extra={"policy": POLICY, "held_out_size": held_out_size}, processes=processes,
                          arguments=arguments, steps_per_run=common["max_steps"], checkpoints=[POLICY],
                          description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=COMMON["max_steps"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(arms=tuple(args.arms), seeds=tuple(range(args.seeds)), out=args.out, processes=args.processes,
        arguments=vars(args) | {"out": str(args.out)}, max_steps=args.steps)


if __name__ == "__main__":
    main()
