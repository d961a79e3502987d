"""DPO against IPO on deterministic preferences: few pairs, many steps (Chapter "Bradley–Terry and DPO").

IPO's claim (Azar et al., 2023): when every pair is always ordered the same way, DPO's loss has no finite optimum,
so the log-ratio margin of the training pairs keeps growing whatever β says, while IPO's squared loss
(h − 1/(2β))² holds it at a target. Each seed draws ``num_train_pairs`` preference pairs of the arithmetic task
(chosen = the right answer, rejected = a near miss) and the batch order; both arms (``dpo``: the sigmoid loss, the
baseline; ``ipo``) train a fresh copy of the arithmetic base policy on them for ``steps`` steps at the same β.
Every ``eval_every`` steps a run records, on the training pairs and on ``num_test_pairs`` held-out pairs:

- ``margin``: the mean log-ratio margin h = log π/π_ref(y_w) − log π/π_ref(y_l), sequence sums, without β (the
  quantity DPO's loss sees);
- ``margin_per_token``: the same with each log-prob divided by its completion's token count (what IPO's loss sees,
  TRL's convention; its target is 1/(2β));
- ``chosen_logratio`` and ``rejected_logratio``: the means of the two log-ratios (sums), how far the policy has
  moved on each side;

and the gold reward, which neither loss sees: ``expected_accuracy`` on ``num_prompts`` held-out prompts
x ``num_samples`` samples, the same prompts and sampling stream for every run (paired).

The stored file keeps the organisms' layout (:func:`rlbook.organisms.phenomenon`): ``organism`` names the
metric (``margin`` on the training pairs) and the failure (``up``); each run's ``evals`` start at the half-way
step, so the gate, the change from the first evaluation to the last, is the margin's growth over the second half
of training; ``curve`` holds every evaluation from step 0.

    python experiments/dpo_ipo.py --processes 1     # writes experiments/results/dpo_ipo.json
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, log_ratio_margins, reference_logps, train_dpo
from rlbook.evaluation import evaluate_policy
from rlbook.experiment import add_plan_arguments, run_experiment, seeds_of
from rlbook.tasks.preferences import build_preference_pairs

RESULTS = Path(__file__).parent / "results" / "dpo_ipo.json"
COMMON = dict(policy="arithmetic", num_train_pairs=32, num_test_pairs=256, steps=1000, eval_every=100,
              num_prompts=1024, num_samples=8, prompt_seed=2024,
              train=dict(beta=0.5, learning_rate=3e-4, per_device_train_batch_size=16))
ARMS = {"dpo": dict(loss_type="sigmoid"), "ipo": dict(loss_type="ipo")}
ORGANISM = dict(name="deterministic_preferences",
                description="32 arithmetic preference pairs (right answer over a near miss, always in that "
                            "order), 1,000 steps: DPO's margin on them has no finite optimum",
                policy="arithmetic", metric="margin", failure="up", failure_threshold=None,
                num_prompts=COMMON["num_prompts"], num_samples=COMMON["num_samples"])


def run_one(arm_name: str, arm: dict, seed: int, common: dict = COMMON) -> dict:
    """One run: margins on the training and held-out pairs and the gold accuracy every ``eval_every`` steps."""
    torch.set_num_threads(1)
    policy, tokenizer = load_base_policy(common["policy"])
    recipe = RECIPES[common["policy"]]
    task = recipe.make_task()
    train_pairs = build_preference_pairs(task, common["num_train_pairs"], seed=1000 + seed, split="train")
    test_pairs = build_preference_pairs(task, common["num_test_pairs"], seed=1, split="test")
    prompts = task.sample(common["num_prompts"], seed=np.random.default_rng(common["prompt_seed"]), split="test")
    ref_train, ref_test = (reference_logps(policy, tokenizer, p) for p in (train_pairs, test_pairs))
    curve = []

    def measure(step, model):
        if step % common["eval_every"] and step != common["steps"]:
            return
        gold = evaluate_policy(model, tokenizer, task, prompts, num_samples=common["num_samples"],
                               max_new_tokens=recipe.sft.max_new_tokens, seed=0).summary(ks=())
        record = {"step": step, **log_ratio_margins(model, tokenizer, train_pairs, ref_train),
                  **{f"test_{k}": v for k, v in log_ratio_margins(model, tokenizer, test_pairs, ref_test).items()},
                  "expected_accuracy": gold["expected_accuracy"]}
        curve.append({k: round(v, 6) if isinstance(v, float) else v for k, v in record.items()})

    measure(0, policy)
    config = DPOConfig(**arm, **common["train"], max_steps=common["steps"], seed=seed)
    history = train_dpo(policy, tokenizer, train_pairs, config=config, on_step=measure)
    half = common["steps"] // 2
    return {"evals": [e for e in curve if e["step"] >= half], "curve": curve,
            "train_loss_last": round(float(np.mean([h["loss"] for h in history[-10:]])), 6)}


def run(seeds=range(5), arms=tuple(ARMS), *, out=None, processes=None, progress=True, arguments=None, plan=None,
        **overrides) -> dict:
    """Both arms over ``seeds``; ``overrides`` replace entries of :data:`COMMON` (reduced runs)."""
    common = {**COMMON, **overrides}
    summary = {"margin growth, 2nd half": lambda r: r["evals"][-1]["margin"] - r["evals"][0]["margin"],
               "last margin per token": lambda r: r["evals"][-1]["margin_per_token"],
               "last expected accuracy": lambda r: r["evals"][-1]["expected_accuracy"]}
    organism = {**ORGANISM, "num_prompts": common["num_prompts"], "num_samples": common["num_samples"],
                "eval_every": common["eval_every"]}
    return run_experiment("dpo_ipo", partial(run_one, common=common), {a: ARMS[a] for a in arms}, seeds,
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
    parser.add_argument("--steps", type=int, default=None, help="pilot: fewer steps")
    parser.add_argument("--num-prompts", type=int, default=None, help="pilot: fewer held-out prompts")
    parser.add_argument("--num-samples", type=int, default=None, help="pilot: fewer samples per prompt")
    add_plan_arguments(parser)
    args = parser.parse_args()
    overrides = {k: v for k, v in dict(steps=args.steps, num_prompts=args.num_prompts,
                                       num_samples=args.num_samples).items() if v is not None}
    run(seeds_of(args), tuple(args.arms), out=args.out, processes=args.processes, plan=args.plan,
        arguments={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, **overrides)


if __name__ == "__main__":
    main()
