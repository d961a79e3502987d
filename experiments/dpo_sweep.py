"""DPO on the arithmetic base policy: beta's effect, and the four loss types (Chapter "Bradley–Terry and DPO").

For each arm (a loss type and its beta) and each seed, :func:`rlbook.dpo.train_dpo` trains a fresh copy of the
arithmetic base policy on ``num_train_pairs`` preference pairs of training problems (chosen = the demonstration,
rejected = a near miss; the pairs drawn with the seed) and records every ``eval_every`` steps the TRL metrics on
``num_test_pairs`` held-out pairs (test problems, the same for every run). Before and after training it measures
the task's sampled accuracy (one sample at temperature 1 per problem) on ``num_eval_problems`` held-out problems:
the gold reward, which DPO never sees. Runs go through :func:`rlbook.experiment.run_experiment` (arms x seeds in
parallel processes, one results layout).

    python experiments/dpo_sweep.py            # writes experiments/results/dpo_sweep.json
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, train_dpo
from rlbook.experiment import run_experiment
from rlbook.sft import sampled_accuracy
from rlbook.tasks.preferences import build_preference_pairs

RESULTS = Path(__file__).parent / "results" / "dpo_sweep.json"
COMMON = dict(policy="arithmetic", steps=120, eval_every=20, num_train_pairs=1000, num_test_pairs=256,
              num_eval_problems=256, train=dict(learning_rate=3e-4, per_device_train_batch_size=32))
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


def run_one(arm_name: str, arm: dict, seed: int, common: dict = COMMON) -> dict:
    """One DPO run: the held-out metrics over steps and the sampled accuracy before and after."""
    torch.set_num_threads(1)
    policy, tokenizer = load_base_policy(common["policy"])
    recipe = RECIPES[common["policy"]]
    task = recipe.make_task()
    train_pairs = build_preference_pairs(task, common["num_train_pairs"], seed=1000 + seed, split="train")
    test_pairs = build_preference_pairs(task, common["num_test_pairs"], seed=1, split="test")
    problems = task.sample(common["num_eval_problems"], np.random.default_rng(2), split="test")
    before = sampled_accuracy(policy, tokenizer, task, problems, recipe.sft.max_new_tokens, seed=seed)
    config = DPOConfig(**arm, **common["train"], max_steps=common["steps"], eval_every=common["eval_every"],
                       seed=seed)
    evals = [h for h in train_dpo(policy, tokenizer, train_pairs, test_pairs, config) if "eval_loss" in h]
    after = sampled_accuracy(policy, tokenizer, task, problems, recipe.sft.max_new_tokens, seed=seed)
    return {"accuracy_before": before, "accuracy_after": after,
            "eval_steps": [h["step"] for h in evals], "eval": {k: [h[f"eval_{k}"] for h in evals] for k in KEEP}}


def run(seeds=range(5), arms=tuple(ARMS), *, out=None, processes=None, progress=True, arguments=None,
        **overrides) -> dict:
    """The sweep over ``arms`` and ``seeds``; ``overrides`` replace entries of :data:`COMMON` (reduced runs)."""
    common = {**COMMON, **overrides}
    summary = {"held-out pair accuracy": lambda r: r["eval"]["rewards/accuracies"][-1],
               "sampled-accuracy change": lambda r: r["accuracy_after"] - r["accuracy_before"]}
    return run_experiment("dpo_sweep", partial(run_one, common=common), {a: ARMS[a] for a in arms}, seeds,
                          out=out, common=common, processes=processes, summary=summary, arguments=arguments,
                          checkpoints=[common["policy"]], progress=progress, description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(range(args.seeds), tuple(args.arms), out=args.out, processes=args.processes,
        arguments={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
