"""DPO on the arithmetic base policy: beta's effect, and the four loss types (Chapter "Bradley–Terry and DPO").

For each arm (a loss type and its beta) and each seed, :func:`rlbook.dpo.train_dpo` trains a fresh copy of the
arithmetic base policy on ``NUM_TRAIN_PAIRS`` preference pairs of training problems (chosen = the demonstration,
rejected = a near miss; the pairs drawn with the seed) and records every ``EVAL_EVERY`` steps the TRL metrics on
``NUM_TEST_PAIRS`` held-out pairs (test problems, the same for every run). Before and after training it measures
the task's sampled accuracy (one sample at temperature 1 per problem) on ``NUM_EVAL_PROBLEMS`` held-out problems:
the gold reward, which DPO never sees.

    python experiments/dpo_sweep.py            # writes experiments/results/dpo_sweep.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, train_dpo
from rlbook.sft import sampled_accuracy
from rlbook.tasks.preferences import build_preference_pairs

RESULTS = Path(__file__).parent / "results" / "dpo_sweep.json"
POLICY = "arithmetic"
NUM_TRAIN_PAIRS, NUM_TEST_PAIRS, NUM_EVAL_PROBLEMS = 1000, 256, 256
STEPS, EVAL_EVERY = 120, 20
TRAIN = dict(learning_rate=3e-4, per_device_train_batch_size=32)
# arm name -> DPOConfig fields: beta's sweep with the sigmoid loss, then the other loss types at beta = 0.5
ARMS = {
    "sigmoid_0.05": dict(loss_type="sigmoid", beta=0.05),
    "sigmoid_0.1": dict(loss_type="sigmoid", beta=0.1),
    "sigmoid_0.5": dict(loss_type="sigmoid", beta=0.5),
    "sigmoid_2": dict(loss_type="sigmoid", beta=2.0),
    "hinge_0.5": dict(loss_type="hinge", beta=0.5),
    "ipo_0.5": dict(loss_type="ipo", beta=0.5),
    "robust_0.5": dict(loss_type="robust", beta=0.5, label_smoothing=0.1),
}
KEEP = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
        "logps/rejected")


def run_one(arm: str, seed: int, base, steps: int = STEPS, eval_every: int = EVAL_EVERY,
            num_train_pairs: int = NUM_TRAIN_PAIRS, num_test_pairs: int = NUM_TEST_PAIRS,
            num_eval_problems: int = NUM_EVAL_PROBLEMS) -> dict:
    """One DPO run: the eval metrics over steps and the sampled accuracy before and after."""
    torch.set_num_threads(1)
    policy, tokenizer = copy.deepcopy(base[0]), base[1]
    task = RECIPES[POLICY].make_task()
    train_pairs = build_preference_pairs(task, num_train_pairs, seed=1000 + seed, split="train")
    test_pairs = build_preference_pairs(task, num_test_pairs, seed=1, split="test")
    problems = task.sample(num_eval_problems, np.random.default_rng(2), split="test")
    max_new = RECIPES[POLICY].sft.max_new_tokens
    before = sampled_accuracy(policy, tokenizer, task, problems, max_new, seed=seed)
    config = DPOConfig(**ARMS[arm], **TRAIN, max_steps=steps, eval_every=eval_every, seed=seed)
    history = train_dpo(policy, tokenizer, train_pairs, test_pairs, config)
    after = sampled_accuracy(policy, tokenizer, task, problems, max_new, seed=seed)
    evals = [h for h in history if "eval_loss" in h]
    return {"arm": arm, "seed": seed, "accuracy_before": before, "accuracy_after": after,
            "eval_steps": [h["step"] for h in evals],
            "eval": {k: [h[f"eval_{k}"] for h in evals] for k in KEEP}}


def run(seeds: int, arms=tuple(ARMS), **kwargs) -> dict:
    base = load_base_policy(POLICY)
    runs, start = [], time.time()
    for arm in arms:
        for seed in range(seeds):
            runs.append(run_one(arm, seed, base, **kwargs))
            print(f"{arm} seed {seed}: acc {runs[-1]['accuracy_before']:.3f} -> {runs[-1]['accuracy_after']:.3f}, "
                  f"eval pair acc {runs[-1]['eval']['rewards/accuracies'][-1]:.3f} "
                  f"({time.time() - start:.0f} s)", flush=True)
    return {"policy": POLICY, "steps": kwargs.get("steps", STEPS), "train": TRAIN, "arms": {a: ARMS[a] for a in arms},
            "num_train_pairs": kwargs.get("num_train_pairs", NUM_TRAIN_PAIRS),
            "num_test_pairs": kwargs.get("num_test_pairs", NUM_TEST_PAIRS),
            "num_eval_problems": kwargs.get("num_eval_problems", NUM_EVAL_PROBLEMS),
            "seconds": round(time.time() - start), "runs": runs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = run(args.seeds, tuple(args.arms))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
