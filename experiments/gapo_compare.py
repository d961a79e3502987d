"""GAPO against PPO with a frozen reward model and against DPO, at the same budget (Chapter "GAPO").

On the constraint_string task, from its shipped base policy, for each seed:

- ``gapo``: warm up a small BERT-style encoder on (satisfying, violating) pairs, then ``rounds`` rounds of
  ``generator_steps`` PPO steps of the generator against it, each followed by ``encoder_steps`` encoder steps on
  half existing pairs, half fresh (reference vs generator sample) pairs (:func:`rlbook.gapo.train_gapo`);
- ``gapo_more_encoder``: GAPO with five times the encoder steps per round (does a faster-learning judge help?);
- ``ppo_frozen``: the same, with the encoder frozen after the warm-up (``encoder_steps=0``);
- ``dpo``: :func:`rlbook.dpo.train_dpo` on the same training pairs, as many updates as the generator gets
  (rounds x generator_steps) with the same batch size.

Gold = the task's rule: the held-out constraint-satisfaction rate, measured before training and after every round
(DPO: after the same number of updates). Small budget, sized for a shared 2-core machine. Runs go through
:func:`rlbook.experiment.run_experiment` (arms x seeds in parallel processes, one results layout).

    python experiments/gapo_compare.py            # writes experiments/results/gapo_compare.json
"""

from __future__ import annotations

import argparse
import copy
from functools import partial
from pathlib import Path

import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, train_dpo
from rlbook.experiment import run_experiment
from rlbook.gapo import GAPOConfig, train_gapo
from rlbook.presets import preset
from rlbook.tasks.preferences import build_preference_pairs
from rlbook.trainer import Trainer

RESULTS = Path(__file__).parent / "results" / "gapo_compare.json"
BATCH = 64  # samples per PPO step = pairs per DPO step
COMMON = dict(task="constraint_string", rounds=6, generator_steps=5, batch=BATCH,
              gapo=dict(warmup_steps=200, num_train_pairs=1000, num_test_pairs=256, encoder_batch_size=BATCH,
                        rl=dict(learning_rate=3e-4, num_generations=4, per_device_train_batch_size=BATCH,
                                max_completion_length=16)))
ARMS = {
    "gapo": dict(method="gapo", encoder_steps=5),
    "gapo_more_encoder": dict(method="gapo", encoder_steps=25),
    "ppo_frozen": dict(method="gapo", encoder_steps=0),
    "dpo": dict(method="dpo", beta=0.1, learning_rate=3e-4, per_device_train_batch_size=BATCH),
}
KEEP = ("gold", "pair_accuracy", "reward", "train_gold", "objective/kl_per_token")  # of train_gapo's history


def gold_rate(policy, tokenizer, task, seed: int) -> float:
    """Held-out sampled constraint-satisfaction rate, on the same prompts the PPO trainer evaluates on."""
    return Trainer(policy, tokenizer, task, preset("dr_grpo", seed=seed)).evaluate()


def run_dpo(arm: dict, seed: int, common: dict) -> list[float]:
    """DPO's gold curve: measured before training and after each block of ``generator_steps`` updates."""
    policy, tokenizer = load_base_policy(common["task"])
    task = RECIPES[common["task"]].make_task()
    pairs = build_preference_pairs(task, common["gapo"]["num_train_pairs"], seed=[seed, 1], split="train")
    reference = copy.deepcopy(policy).eval()  # the base policy stays the reference across rounds
    dpo = {k: v for k, v in arm.items() if k != "method"}
    curve = [gold_rate(policy, tokenizer, task, seed)]
    for _ in range(common["rounds"]):
        config = DPOConfig(**dpo, max_steps=common["generator_steps"], seed=seed + 100 * len(curve))
        train_dpo(policy, tokenizer, pairs, config=config, ref_model=reference)
        curve.append(gold_rate(policy, tokenizer, task, seed))
    return curve


def run_one(arm_name: str, arm: dict, seed: int, common: dict = COMMON) -> dict:
    """One run of one arm: the gold curve (and, for the GAPO arms, the encoder's and the generator's numbers)."""
    torch.set_num_threads(1)
    if arm["method"] == "dpo":
        return {"gold": run_dpo(arm, seed, common)}
    policy, tokenizer = load_base_policy(common["task"])
    config = GAPOConfig(rounds=common["rounds"], generator_steps=common["generator_steps"],
                        encoder_steps=arm["encoder_steps"], seed=seed, **common["gapo"])
    out = train_gapo(policy, tokenizer, RECIPES[common["task"]].make_task(), config)
    return {key: [h[key] for h in out["history"]] for key in KEEP} | {"warmup_accuracy": out["warmup_accuracy"]}


def run(seeds=range(5), arms=ARMS, *, out=None, processes=None, progress=True, arguments=None,
        **overrides) -> dict:
    """Every arm for every seed; ``overrides`` replace entries of :data:`COMMON` (reduced runs)."""
    common = {**COMMON, **overrides}
    updates = [r * common["generator_steps"] for r in range(common["rounds"] + 1)]
    return run_experiment("gapo_compare", partial(run_one, common=common), arms, seeds, out=out, common=common,
                          extra={"updates": updates}, processes=processes, arguments=arguments,
                          summary={"final gold": lambda r: r["gold"][-1]}, checkpoints=[common["task"]],
                          progress=progress, description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(range(args.seeds), out=args.out, processes=args.processes,
        arguments={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
