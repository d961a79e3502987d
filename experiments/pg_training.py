"""REINFORCE with and without a baseline on the arithmetic base policy (Chapter "The policy-gradient theorem").

Trains the shipped arithmetic base policy with the trainer's presets ``reinforce`` (no baseline),
``reinforce_baseline`` (group-mean baseline) and ``rloo`` (leave-one-out baseline), several seeds each, and records
held-out sampled accuracy (test-split problems, one sample each at temperature 1) every ``eval_every`` steps, with
the training reward and gradient norm of every step.

    python experiments/pg_training.py            # writes experiments/results/pg_training.json
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.paths import write_results
from rlbook.trainer import Trainer, preset

PRESETS = ("reinforce", "reinforce_baseline", "rloo")
RESULTS = Path(__file__).parent / "results" / "pg_training.json"
SETTINGS = dict(num_generations=8, per_device_train_batch_size=64, learning_rate=3e-4, max_steps=200,
                eval_every=25, eval_size=512)


def train_one(name: str, seed: int, base, policy: str = "arithmetic", **settings) -> dict:
    """One run of preset ``name`` from a copy of ``base = (model, tokenizer)``: its held-out accuracy curve and
    per-step training metrics."""
    torch.set_num_threads(1)
    model, tokenizer = copy.deepcopy(base[0]), base[1]
    recipe = RECIPES[policy]
    config = preset(name, max_completion_length=recipe.sft.max_new_tokens, seed=seed, **{**SETTINGS, **settings})
    trainer = Trainer(model, tokenizer, recipe.make_task(), config)
    start_accuracy = trainer.evaluate()
    history = trainer.train(progress=False)
    evals = [(0, start_accuracy)] + [(m["step"], m["eval_accuracy"]) for m in history if "eval_accuracy" in m]
    return {"eval_steps": [s for s, _ in evals], "eval_accuracy": [a for _, a in evals],
            "reward": [m["reward"] for m in history], "grad_norm": [m["grad_norm"] for m in history]}


def run(presets=PRESETS, seeds=(0, 1, 2, 3, 4), policy="arithmetic", **settings) -> dict:
    base = load_base_policy(policy)  # loaded once: every run starts from the same weights
    out = {"policy": policy, "checkpoint_sha256": load_manifest(policy)["sha256"]["model.safetensors"],
           "settings": {**SETTINGS, **settings}, "seeds": list(seeds), "runs": {}}
    for name in presets:
        out["runs"][name] = [train_one(name, seed, base, policy, **settings) for seed in seeds]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=SETTINGS["max_steps"])
    parser.add_argument("--lr", type=float, default=SETTINGS["learning_rate"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    write_results(args.out, lambda: run(seeds=tuple(range(args.seeds)), max_steps=args.steps, learning_rate=args.lr))


if __name__ == "__main__":
    main()
