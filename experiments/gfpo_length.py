"""Length inflation under GRPO and GFPO's three filters (Chapter "GFPO").

Trains the shipped ``sort_scratchpad`` base policy (sort 3-6 digits after an insertion-sort scratchpad; the reward
checks only the answer after the last ``"|"``, so the model is free to choose its length: the task of the book with
the longest completions) with four settings, the same prompts per step and the same number of completions trained
on per prompt (8):

- ``grpo``: GRPO with DAPO's token-level loss (the paper's baseline), G = 8, all kept;
- ``gfpo_length``: sample G = 16, keep the 8 shortest;
- ``gfpo_efficiency``: sample G = 16, keep the 8 with the most reward per token;
- ``gfpo_adaptive``: sample G = 16, keep 4, 6, 8 or 8 by difficulty quartile (see ``gfpo_adaptive_k``).

Every step records the mean *excess* length of its sampled completions (characters, the tokenizer being
character-level; minus the length of the demonstration of the same prompt, so that which prompts were drawn does
not matter) and the step's sampling and update times. Before and after training, the held-out accuracy and excess
length of one sample per held-out prompt are measured: length inflation is the final minus the starting excess
length (the paper's "extra length over the starting model").

    python experiments/gfpo_length.py            # writes experiments/results/gfpo_length.json
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.lm import autocast
from rlbook.paths import write_results
from rlbook.rollout import generate_rollouts
from rlbook.trainer import Trainer, preset

POLICY = "sort_scratchpad"
RESULTS = Path(__file__).parent / "results" / "gfpo_length.json"
# name -> (preset, settings); per_device_train_batch_size = 8 prompts x num_generations
METHODS = {
    "grpo": ("grpo", dict(num_generations=8, per_device_train_batch_size=64, loss_type="dapo", beta=0.0)),
    "gfpo_length": ("gfpo", dict(num_generations=16, per_device_train_batch_size=128, gfpo_k=8)),
    "gfpo_efficiency": ("gfpo", dict(num_generations=16, per_device_train_batch_size=128, gfpo_k=8,
                                     gfpo_metric="token_efficiency")),
    "gfpo_adaptive": ("gfpo", dict(num_generations=16, per_device_train_batch_size=128, gfpo_k=None,
                                   gfpo_adaptive=True)),
}
SETTINGS = dict(learning_rate=3e-4, max_steps=200, eval_every=50, eval_size=128)


def excess_lengths(task, examples, completions) -> np.ndarray:
    """Length of each completion minus the length of its prompt's demonstration (characters)."""
    return np.array([len(c) - len(task.demonstration(e)) for e, c in zip(examples, completions)], dtype=float)


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


def train_one(name: str, seed: int, base, held_out_size: int = 256, **settings) -> dict:
    """One run of method ``name`` from a copy of ``base = (model, tokenizer)``; length and accuracy before and
    after on ``held_out_size`` held-out prompts."""
    torch.set_num_threads(1)
    model, tokenizer = copy.deepcopy(base[0]), base[1]
    recipe = RECIPES[POLICY]
    task = recipe.make_task()
    excess = []

    def reward_fn(examples, completions, truncated):  # the task's reward, recording the lengths on the way
        excess.append(round(float(excess_lengths(task, examples, completions).mean()), 4))
        return task.rewards(examples, completions, truncated)

    preset_name, method = METHODS[name]
    config = preset(preset_name, max_completion_length=recipe.sft.max_new_tokens, seed=seed,
                    **{**method, **SETTINGS, **settings})
    trainer = Trainer(model, tokenizer, task, config, reward_fn=reward_fn)
    held_out = task.sample(held_out_size, seed=np.random.default_rng([seed, 7]), split="test")
    start = held_out_stats(model, tokenizer, task, held_out, config.max_completion_length, seed=seed)
    eval_steps, eval_accuracy = trainer.train_with_eval_curve()
    end = held_out_stats(model, tokenizer, task, held_out, config.max_completion_length, seed=seed)
    history = trainer.history
    return {"excess_length": excess, "accuracy": [m["accuracy"] for m in history],
            "kept_length": [m.get("gfpo_kept_length") for m in history],
            "time_generate": [round(m["time_generate"], 4) for m in history],
            "time_step": [round(m["time_generate"] + m["time_score"] + m["time_update"], 4) for m in history],
            "eval_steps": eval_steps, "eval_accuracy": eval_accuracy, "start": start, "end": end}


def run(methods=tuple(METHODS), seeds=(0, 1, 2, 3, 4), held_out_size: int = 256, **settings) -> dict:
    base = load_base_policy(POLICY)  # loaded once: every run starts from the same weights
    out = {"policy": POLICY, "checkpoint_sha256": load_manifest(POLICY)["sha256"]["model.safetensors"],
           "methods": {name: METHODS[name][1] for name in methods}, "settings": {**SETTINGS, **settings},
           "seeds": list(seeds), "held_out_size": held_out_size, "runs": {}}
    for name in methods:
        out["runs"][name] = [train_one(name, seed, base, held_out_size, **settings) for seed in seeds]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=SETTINGS["max_steps"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = tuple(range(args.first_seed, args.first_seed + args.seeds))
    write_results(args.out, lambda: run(methods=tuple(args.methods), seeds=seeds, max_steps=args.steps))


if __name__ == "__main__":
    main()
