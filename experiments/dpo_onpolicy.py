"""On-policy iterated DPO against DPO on offline near misses (Chapter "Bradley–Terry and DPO").

The chapter's DPO learns from offline pairs: the right answer against a near miss the task writes (a digit off
by one, two digits swapped), not against the mistakes the policy makes. Both arms here run ``rounds`` rounds of
``steps_per_round`` DPO steps on ``pairs_per_round`` fresh pairs of training problems, starting from the
arithmetic base policy; only where the pairs come from differs:

- ``offline`` (the baseline): :func:`rlbook.tasks.preferences.build_preference_pairs`, the demonstration over a
  near miss, as in the rest of the chapter;
- ``on_policy``: :func:`rlbook.dpo.on_policy_pairs`, ``num_generations`` samples per problem from the *current*
  policy, labelled by the task's rule, one right over one wrong for each problem that has both (the first
  ``pairs_per_round`` such problems of ``prompts_per_round`` drawn).

In both arms the reference is the policy at the start of the round (iterated DPO: each round's
:func:`rlbook.dpo.train_dpo` takes a frozen copy), and a new optimizer starts each round. After each round (and at
step 0) the gold reward, which DPO never sees, is measured: ``expected_accuracy`` on ``num_prompts`` held-out
prompts x ``num_samples`` samples, the same prompts and sampling stream for every run (paired seeds). The stored
file keeps the organisms' layout (:func:`rlbook.organisms.phenomenon`): the failure under offline pairs is that the
accuracy falls (``down``) from step 0 to the last round.

    python experiments/dpo_onpolicy.py --processes 1     # writes experiments/results/dpo_onpolicy.json
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, on_policy_pairs, train_dpo
from rlbook.evaluation import evaluate_policy
from rlbook.experiment import add_plan_arguments, run_experiment, seeds_of
from rlbook.tasks.preferences import build_preference_pairs

RESULTS = Path(__file__).parent / "results" / "dpo_onpolicy.json"
COMMON = dict(policy="arithmetic", rounds=4, steps_per_round=40, pairs_per_round=256, prompts_per_round=512,
              num_generations=8, reference="round_start", num_prompts=1024, num_samples=8, prompt_seed=2024,
              train=dict(beta=0.5, learning_rate=3e-4, per_device_train_batch_size=32))
# the pair source, and whether the loss adds the NLL of the chosen answers (rpo_alpha, the chapter's remedy for the
# drift in which both log-probs fall); the NLL arms were added after the pilot, before the full run
ARMS = {"offline": dict(pairs="near_miss", rpo_alpha=None),
        "on_policy": dict(pairs="own_samples", rpo_alpha=None),
        "offline_nll": dict(pairs="near_miss", rpo_alpha=1.0),
        "on_policy_nll": dict(pairs="own_samples", rpo_alpha=1.0)}
ORGANISM = dict(name="offline_pairs",
                description="arithmetic DPO in 4 rounds of 40 steps on 256 fresh pairs each: offline pairs of "
                            "the right answer over a near miss, not the policy's own mistakes",
                policy="arithmetic", metric="expected_accuracy", failure="down", failure_threshold=None)


def run_one(arm_name: str, arm: dict, seed: int, common: dict = COMMON) -> dict:
    """One run of ``rounds`` rounds: the pairs of each round, then DPO on them; the gold accuracy after each."""
    torch.set_num_threads(1)
    policy, tokenizer = load_base_policy(common["policy"])
    recipe = RECIPES[common["policy"]]
    task = recipe.make_task()
    prompts = task.sample(common["num_prompts"], seed=np.random.default_rng(common["prompt_seed"]), split="test")
    evals, rounds = [], []

    def measure(step):
        gold = evaluate_policy(policy, tokenizer, task, prompts, num_samples=common["num_samples"],
                               max_new_tokens=recipe.sft.max_new_tokens, seed=0).summary(ks=())
        evals.append({"step": step, "expected_accuracy": round(gold["expected_accuracy"], 6),
                      "num_pairs": sum(r["num_pairs"] for r in rounds)})

    measure(0)
    for r in range(common["rounds"]):
        round_seed = [seed, r]  # the round's problems and pairs: drawn with the seed, the same in both arms
        if arm["pairs"] == "near_miss":
            pairs = build_preference_pairs(task, common["pairs_per_round"], seed=round_seed, split="train")
        else:
            rng = np.random.default_rng(round_seed)
            examples = task.sample(common["prompts_per_round"], seed=rng, split="train")
            pairs = on_policy_pairs(policy, tokenizer, task, examples, num_generations=common["num_generations"],
                                    max_new_tokens=recipe.sft.max_new_tokens, seed=1000 * seed + r,
                                    rng=rng)[: common["pairs_per_round"]]
        config = DPOConfig(**common["train"], rpo_alpha=arm["rpo_alpha"], max_steps=common["steps_per_round"],
                           seed=1000 * seed + r)
        history = train_dpo(policy, tokenizer, pairs, config=config)  # reference: the policy at the round's start
        rounds.append({"num_pairs": len(pairs), "train_pair_accuracy": round(history[-1]["rewards/accuracies"], 6),
                       "examples": [[p.prompt, p.chosen, p.rejected] for p in pairs[:4]]})
        measure((r + 1) * common["steps_per_round"])
    return {"evals": evals, "rounds": rounds}


def run(seeds=range(5), arms=tuple(ARMS), *, out=None, processes=None, progress=True, arguments=None, plan=None,
        **overrides) -> dict:
    """Both arms over ``seeds``; ``overrides`` replace entries of :data:`COMMON` (reduced runs)."""
    common = {**COMMON, **overrides}
    summary = {"accuracy change": lambda r: r["evals"][-1]["expected_accuracy"] - r["evals"][0]["expected_accuracy"],
               "pairs per round (min)": lambda r: min(x["num_pairs"] for x in r["rounds"])}
    organism = {**ORGANISM, "num_prompts": common["num_prompts"], "num_samples": common["num_samples"],
                "eval_every": common["steps_per_round"]}
    return run_experiment("dpo_onpolicy", partial(run_one, common=common), {a: ARMS[a] for a in arms}, seeds,
                          out=out, common=common, extra={"organism": organism}, processes=processes,
                          summary=summary, arguments=arguments, checkpoints=[common["policy"]], progress=progress,
                          plan=plan,
                          description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--num-prompts", type=int, default=None, help="pilot: fewer held-out prompts")
    parser.add_argument("--num-samples", type=int, default=None, help="pilot: fewer samples per prompt")
    add_plan_arguments(parser)
    args = parser.parse_args()
    overrides = {k: v for k, v in dict(num_prompts=args.num_prompts, num_samples=args.num_samples).items()
                 if v is not None}
    run(seeds_of(args), tuple(args.arms), out=args.out, processes=args.processes, plan=args.plan,
        arguments={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, **overrides)


if __name__ == "__main__":
    main()
