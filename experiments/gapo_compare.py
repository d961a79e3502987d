"""GAPO against PPO on a frozen judge, PPO on the rule and DPO, at the same budget (Chapter "GAPO").

On the constraint_string task, from its shipped base policy, for each seed a judge (a BERT-style encoder, the
``small`` size) is warmed up on (satisfying, one-letter-wrong) pairs, then:

- ``ppo_frozen`` (the baseline): ``rounds`` x ``generator_steps`` PPO steps against the judge kept frozen;
- ``gapo``: the same, the judge updated after every round (``encoder_steps`` Bradley–Terry steps on half
  existing pairs, half fresh pairs built from the policy's samples), rejecting only samples the task's rule marks
  wrong (``negatives="rule"``);
- ``gapo_non_reference``: the same, every sample that is not the reference rejected (the GAN reading,
  ``negatives="non_reference"``, this chapter's earlier assumption);
- ``ppo_rule``: PPO with the task's rule as the reward (the control: no judge at all);
- ``dpo``: :func:`rlbook.dpo.train_dpo` on the judge's training pairs, as many updates as PPO takes.

Every PPO arm uses the ``"ppo"`` preset (four updates per rollout) at learning rate 1e-4, the rate the PPO
chapter found safe, with GAPO's KL penalty of 0.01 in the reward. The gold, which no arm but ``ppo_rule`` sees, is
the rule: ``expected_accuracy`` on ``num_prompts`` held-out prompts x ``num_samples`` samples, the same prompts
and sampling stream for every run (paired seeds), after the warm-up and after every round. The judge's held-out
pair accuracy is measured at the same points, separately on pairs whose wrong side has the wrong length and on
pairs whose wrong side has a wrong letter count. The stored file keeps the organisms' layout
(:func:`rlbook.organisms.phenomenon`): the failure under the frozen judge is that the gold falls (``down``).

    python experiments/gapo_compare.py --processes 2     # writes experiments/results/gapo_compare.json
"""

from __future__ import annotations

import argparse
import copy
from functools import partial
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, train_dpo
from rlbook.evaluation import evaluate_policy
from rlbook.experiment import add_plan_arguments, run_experiment, seeds_of
from rlbook.gapo import GAPOConfig, encoder_scores, train_gapo
from rlbook.lm.value import build_value_model
from rlbook.presets import preset
from rlbook.reward_model import pair_scores
from rlbook.tasks.preferences import build_preference_pairs
from rlbook.trainer import Trainer

RESULTS = Path(__file__).parent / "results" / "gapo_compare.json"
BATCH = 64  # samples per PPO step = pairs per DPO step
COMMON = dict(task="constraint_string", rounds=10, generator_steps=10, num_prompts=1024, num_samples=4,
              prompt_seed=2024,
              gapo=dict(warmup_steps=300, num_train_pairs=4000, num_test_pairs=512, encoder_batch_size=BATCH,
                        encoder_steps=10, beta=0.01,
                        rl=dict(learning_rate=1e-4, num_generations=4, per_device_train_batch_size=BATCH,
                                max_completion_length=16)),
              dpo=dict(beta=0.1, learning_rate=3e-4, per_device_train_batch_size=BATCH))
ARMS = {
    "ppo_frozen": dict(method="gapo", encoder_steps=0),
    "gapo": dict(method="gapo", negatives="rule"),
    "gapo_non_reference": dict(method="gapo", negatives="non_reference"),
    "ppo_rule": dict(method="ppo_rule"),
    "dpo": dict(method="dpo"),
}
ORGANISM = dict(name="frozen_judge",
                description="PPO on constraint strings against a warmed-up encoder judge that ranks every "
                            "wrong-length pair right and wrong-count pairs at about chance, while the base "
                            "policy's mistakes are almost all wrong counts",
                policy="constraint_string", metric="expected_accuracy", failure="down", failure_threshold=None)


def judge_accuracy(encoder, tokenizer, pairs) -> dict:
    """Held-out pair accuracy of the judge: overall, on pairs whose rejected side has the wrong length, and on
    pairs whose rejected side has the right length (so a wrong letter count)."""
    with torch.no_grad():
        chosen, rejected = pair_scores(encoder, tokenizer, pairs, encoder_scores)
    right = (chosen > rejected).numpy()
    length = np.array([len(p.chosen) != len(p.rejected) for p in pairs])
    return {"pair_accuracy": round(float(right.mean()), 6),
            "pair_accuracy_length": round(float(right[length].mean()), 6),
            "pair_accuracy_count": round(float(right[~length].mean()), 6)}


def run_one(arm_name: str, arm: dict, seed: int, common: dict = COMMON) -> dict:
    """One run: the gold after the warm-up and after every round (and, for the judge arms, the judge's numbers)."""
    torch.set_num_threads(1)
    policy, tokenizer = load_base_policy(common["task"])
    recipe = RECIPES[common["task"]]
    task = recipe.make_task()
    prompts = task.sample(common["num_prompts"], seed=np.random.default_rng(common["prompt_seed"]), split="test")
    settings = common["gapo"]
    test_pairs = build_preference_pairs(task, settings["num_test_pairs"], seed=[seed, 2], split="test")

    def gold(policy_) -> dict:
        result = evaluate_policy(policy_, tokenizer, task, prompts, num_samples=common["num_samples"],
                                 max_new_tokens=recipe.sft.max_new_tokens, seed=0).summary(ks=())
        return {"expected_accuracy": round(result["expected_accuracy"], 6)}

    steps = common["generator_steps"]
    if arm["method"] == "gapo":
        config = GAPOConfig(rounds=common["rounds"], generator_steps=steps, seed=seed,
                            **{**settings, **{k: v for k, v in arm.items() if k != "method"}})
        out = train_gapo(policy, tokenizer, task, config,
                         evaluate=lambda p, e: gold(p) | judge_accuracy(e, tokenizer, test_pairs))
        keep = ("expected_accuracy", "pair_accuracy", "pair_accuracy_length", "pair_accuracy_count", "reward",
                "train_gold", "objective/kl_per_token", "num_fresh_pairs")
        evals = [{"step": h["round"] * steps} | {k: h[k] for k in keep} for h in out["history"]]
        return {"evals": evals, "warmup_accuracy": out["warmup_accuracy"]}
    if arm["method"] == "ppo_rule":
        rl = preset("ppo", beta=settings["beta"], seed=seed, **settings["rl"])
        trainer = Trainer(policy, tokenizer, task, rl, value_model=build_value_model(policy, seed=seed))
        evals = [{"step": 0} | gold(policy)]
        for r in range(1, common["rounds"] + 1):
            history = trainer.train(steps, progress=False)[-steps:]
            evals.append({"step": r * steps} | gold(policy) | {
                "train_gold": float(np.mean([s["accuracy"] for s in history])),
                "objective/kl_per_token": float(np.mean([s["objective/kl_per_token"] for s in history]))})
        return {"evals": evals}
    # DPO on the judge's training pairs; the base policy stays the reference (a new optimizer each round)
    pairs = build_preference_pairs(task, settings["num_train_pairs"], seed=[seed, 1], split="train")
    reference = copy.deepcopy(policy).eval()
    evals = [{"step": 0} | gold(policy)]
    for r in range(1, common["rounds"] + 1):
        config = DPOConfig(**common["dpo"], max_steps=steps, seed=1000 * seed + r)
        train_dpo(policy, tokenizer, pairs, config=config, ref_model=reference)
        evals.append({"step": r * steps} | gold(policy))
    return {"evals": evals}


def run(seeds=range(5), arms=tuple(ARMS), *, out=None, processes=None, progress=True, arguments=None, plan=None,
        **overrides) -> dict:
    """Every arm for every seed; ``overrides`` replace entries of :data:`COMMON` (reduced runs)."""
    common = {**COMMON, **overrides}
    organism = {**ORGANISM, "num_prompts": common["num_prompts"], "num_samples": common["num_samples"],
                "eval_every": common["generator_steps"]}
    summary = {"gold change": lambda r: r["evals"][-1]["expected_accuracy"] - r["evals"][0]["expected_accuracy"]}
    return run_experiment("gapo_compare", partial(run_one, common=common), {a: ARMS[a] for a in arms}, seeds,
                          out=out, common=common, extra={"organism": organism}, processes=processes,
                          summary=summary, arguments=arguments, checkpoints=[common["task"]], progress=progress,
                          plan=plan,
                          description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_plan_arguments(parser)
    args = parser.parse_args()
    run(seeds_of(args), tuple(args.arms), out=args.out, processes=args.processes, plan=args.plan,
        arguments={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
