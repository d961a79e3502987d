"""Length of wrong and correct completions under GRPO and Dr. GRPO (Chapter "Dr. GRPO").

Trains the shipped ``sort_scratchpad`` base policy (sort 3-6 digits, writing an insertion-sort scratchpad before
the answer; the reward checks only the answer, so the model is free to choose its length) with the trainer's
presets ``grpo`` (group z-scores, per-completion token mean 1/|o_i|) and ``dr_grpo`` (no std, constant
normaliser), both with beta = 0 so that the normaliser and the std are the only differences, several seeds each.
Every step records, over that step's sampled completions, the mean length (characters; the tokenizer is
character-level) of the wrong and of the correct ones, and the mean *excess* length: length minus the length of
the reference scratchpad of the same prompt (0 for a completion as long as the demonstration), which removes
the effect of which prompts (3 or 6 digits) happened to be drawn.

    python experiments/drgrpo_length.py            # writes experiments/results/drgrpo_length.json
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.paths import write_results
from rlbook.trainer import Trainer, preset

PRESETS = ("grpo", "dr_grpo")
POLICY = "sort_scratchpad"
RESULTS = Path(__file__).parent / "results" / "drgrpo_length.json"
SETTINGS = dict(num_generations=8, per_device_train_batch_size=64, learning_rate=3e-4, beta=0.0, max_steps=200,
                eval_every=50, eval_size=128)


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


def train_one(name: str, seed: int, base, **settings) -> dict:
    """One run of preset ``name`` from a copy of ``base = (model, tokenizer)``: per-step lengths, accuracy and
    held-out accuracy."""
    torch.set_num_threads(1)
    model, tokenizer = copy.deepcopy(base[0]), base[1]
    recipe = RECIPES[POLICY]
    task = recipe.make_task()
    steps = []

    def reward_fn(examples, completions, truncated):  # the task's reward, recording the lengths on the way
        rewards = task.rewards(examples, completions, truncated)
        steps.append(length_stats(task, examples, completions, rewards))
        return rewards

    config = preset(name, max_completion_length=recipe.sft.max_new_tokens, seed=seed, **{**SETTINGS, **settings})
    trainer = Trainer(model, tokenizer, task, config, reward_fn=reward_fn)
    start_accuracy = trainer.evaluate()
    history = trainer.train(progress=False)
    evals = [(0, start_accuracy)] + [(m["step"], m["eval_accuracy"]) for m in history if "eval_accuracy" in m]
    out = {key: [round(s[key], 4) for s in steps] for key in steps[0]}
    out.update(accuracy=[m["accuracy"] for m in history], truncated_frac=[m["truncated_frac"] for m in history],
               eval_steps=[s for s, _ in evals], eval_accuracy=[a for _, a in evals])
    return out


def run(presets=PRESETS, seeds=(0, 1, 2, 3, 4), **settings) -> dict:
    base = load_base_policy(POLICY)  # loaded once: every run starts from the same weights
    out = {"policy": POLICY, "checkpoint_sha256": load_manifest(POLICY)["sha256"]["model.safetensors"],
           "settings": {**SETTINGS, **settings}, "seeds": list(seeds), "runs": {}}
    for name in presets:
        out["runs"][name] = [train_one(name, seed, base, **settings) for seed in seeds]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=SETTINGS["max_steps"])
    parser.add_argument("--lr", type=float, default=SETTINGS["learning_rate"])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = tuple(range(args.first_seed, args.first_seed + args.seeds))
    write_results(args.out, lambda: run(presets=tuple(args.presets), seeds=seeds, max_steps=args.steps,
                                        learning_rate=args.lr))


if __name__ == "__main__":
    main()
