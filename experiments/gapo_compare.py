"""GAPO against PPO with a frozen reward model and against DPO, at the same budget (Chapter "GAPO").

On the constraint_string task, from its shipped base policy, for each seed:

- ``gapo``: warm up a small BERT-style encoder on (satisfying, violating) pairs, then :data:`ROUNDS` rounds of
  :data:`GEN_STEPS` PPO steps of the generator against it, each followed by :data:`ENC_STEPS` encoder steps on
  half existing pairs, half fresh (reference vs generator sample) pairs (:func:`rlbook.gapo.train_gapo`);
- ``gapo_more_encoder``: GAPO with :data:`ENC_STEPS_MORE` encoder steps per round (does a faster-learning judge
  help?);
- ``ppo_frozen``: the same, with the encoder frozen after the warm-up (``encoder_steps=0``);
- ``dpo``: :func:`rlbook.dpo.train_dpo` on the same training pairs, as many updates as the generator gets
  (ROUNDS x GEN_STEPS) with the same batch size.

Gold = the task's rule: the held-out constraint-satisfaction rate, measured before training and after every round
(DPO: after the same number of updates). Small budget, sized for a shared 2-core machine.

    python experiments/gapo_compare.py            # writes experiments/results/gapo_compare.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, train_dpo
from rlbook.gapo import GAPOConfig, train_gapo
from rlbook.tasks.preferences import build_preference_pairs
from rlbook.trainer import Trainer, preset

RESULTS = Path(__file__).parent / "results" / "gapo_compare.json"
TASK = "constraint_string"
SEEDS = (0, 1, 2, 3, 4)
ROUNDS, GEN_STEPS, ENC_STEPS = 6, 5, 5
ENC_STEPS_MORE = 25
BATCH = 64  # samples per PPO step = pairs per DPO step
GAPO = dict(warmup_steps=200, num_train_pairs=1000, num_test_pairs=256, encoder_batch_size=BATCH,
            rl=dict(learning_rate=3e-4, num_generations=4, per_device_train_batch_size=BATCH,
                    max_completion_length=16))
DPO = dict(beta=0.1, learning_rate=3e-4, per_device_train_batch_size=BATCH)


def gold_rate(policy, tokenizer, task, seed: int) -> float:
    """Held-out sampled constraint-satisfaction rate, on the same prompts the PPO trainer evaluates on."""
    return Trainer(policy, tokenizer, task, preset("dr_grpo", seed=seed)).evaluate()


def run_dpo(seed: int, rounds: int, gen_steps: int, settings: dict) -> list[float]:
    policy, tokenizer = load_base_policy(TASK)
    task = RECIPES[TASK].make_task()
    pairs = build_preference_pairs(task, settings["num_train_pairs"], seed=[seed, 1], split="train")
    reference = copy.deepcopy(policy).eval()  # the base policy stays the reference across rounds
    curve = [gold_rate(policy, tokenizer, task, seed)]
    for _ in range(rounds):
        train_dpo(policy, tokenizer, pairs, config=DPOConfig(**DPO, max_steps=gen_steps, seed=seed + 100 * len(curve)),
                  ref_model=reference)
        curve.append(gold_rate(policy, tokenizer, task, seed))
    return curve


def run(seeds=SEEDS, rounds=ROUNDS, gen_steps=GEN_STEPS, enc_steps=ENC_STEPS, enc_steps_more=ENC_STEPS_MORE,
        warmup_steps=None) -> dict:
    torch.set_num_threads(1)
    settings = {**GAPO, **({"warmup_steps": warmup_steps} if warmup_steps is not None else {})}
    runs = {"gapo": [], "gapo_more_encoder": [], "ppo_frozen": [], "dpo": []}
    for seed in seeds:
        for name, steps in (("gapo", enc_steps), ("gapo_more_encoder", enc_steps_more), ("ppo_frozen", 0)):
            policy, tokenizer = load_base_policy(TASK)
            config = GAPOConfig(rounds=rounds, generator_steps=gen_steps, encoder_steps=steps, seed=seed, **settings)
            out = train_gapo(policy, tokenizer, RECIPES[TASK].make_task(), config)
            runs[name].append({key: [h[key] for h in out["history"]] for key in
                               ("gold", "pair_accuracy", "reward", "train_gold", "kl_ref")}
                              | {"warmup_accuracy": out["warmup_accuracy"]})
        runs["dpo"].append({"gold": run_dpo(seed, rounds, gen_steps, settings)})
    return {"task": TASK, "seeds": list(seeds), "rounds": rounds, "generator_steps": gen_steps,
            "encoder_steps": enc_steps, "encoder_steps_more": enc_steps_more, "batch": BATCH, "settings": settings, "dpo": DPO,
            "updates": [r * gen_steps for r in range(rounds + 1)], "runs": runs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    start = time.time()
    result = run()
    result["wall_seconds"] = round(time.time() - start)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['wall_seconds']} s")


if __name__ == "__main__":
    main()
