"""Token vs sequence importance ratios on a dense and a mixture-of-experts policy, and GSPO vs GRPO (Chapter "GSPO").

Two policies for the arithmetic task (2-digit additions):

- ``dense``: the shipped base policy (``load_base_policy("arithmetic")``, a tiny Llama);
- ``moe``: a tiny Qwen3-MoE (``build_model("tiny", arch="qwen3_moe")``: 4 experts per layer, 2 per token),
  fine-tuned from scratch here with the same SFT recipe as the shipped policy (same task, settings and target
  accuracy), once, before the RL runs.

Three arms, several seeds each, every one with four minibatch updates per rollout (``steps_per_generation=4``), so
that the ratio moves away from 1 within a step:

- ``dense_grpo`` and ``moe_grpo``: GRPO (token-level ratios, clip 0.2 / 0.27 as GSPO's baseline, no KL);
- ``moe_gspo``: the trainer's ``gspo`` preset (sequence-level ratio, clip 3e-4 / 4e-4, no KL).

Logged per step (:data:`LOGGED`): reward, accuracy, ``clip_ratio/region_mean``, ``ratio/min``, ``ratio/max``, and,
after the step's four updates, the spread of the rollout's log-ratios log(pi_new / pi_old) under the updated policy
(:class:`rlbook.callbacks.PostUpdateRatios`) at token level (``post_update/log_ratio_token_var``: variance over all
completion tokens) and at sequence level (``post_update/log_ratio_sequence_var``: variance over completions of their
mean token log-ratio, log s_i); on the MoE policy (:class:`rlbook.callbacks.ExpertRoutingChanges`) the share of
completion tokens whose set of experts changed in some layer (``moe/route_changed``) and the mean |token log-ratio|
of the tokens whose routing changed and of those whose did not (``moe/abs_log_ratio_route_changed``,
``moe/abs_log_ratio_route_same``); None for the dense policy.

    python experiments/gspo_moe.py            # writes experiments/results/gspo_moe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from pathlib import Path

import torch

from rlbook.callbacks import ExpertRoutingChanges, PostUpdateRatios
from rlbook.checkpoints import RECIPES
from rlbook.experiment import Arm, run_experiment, train_run
from rlbook.lm import build_model, build_tokenizer, count_parameters
from rlbook.sft import train_sft

RESULTS = Path(__file__).parent / "results" / "gspo_moe.json"
TASK = "arithmetic"
# The MoE policy: tiny Qwen3-MoE, the shipped recipe's SFT settings (stop at 45 % held-out accuracy).
MOE = dict(size="tiny", arch="qwen3_moe", num_experts=4, num_experts_per_tok=2, model_seed=0)
# Shared by every RL run: 16 prompts x G = 8 completions per step, split into 4 minibatches of 32 (GRPO's
# learning rate of experiments/grpo_training.py).
COMMON = dict(num_generations=8, per_device_train_batch_size=32, steps_per_generation=4, learning_rate=2e-4,
              eval_every=25, eval_size=256)
GRPO = dict(beta=0.0, epsilon=0.2, epsilon_high=0.27)  # the GSPO paper's GRPO baseline, no KL
ARMS = {"dense_grpo": Arm("grpo", **GRPO), "moe_grpo": Arm("grpo", **GRPO), "moe_gspo": Arm("gspo")}
POLICIES = {"dense_grpo": "dense", "moe_grpo": "moe", "moe_gspo": "moe"}  # which policy each arm trains
STEPS = 100
LOGGED = ("reward", "accuracy", "clip_ratio/region_mean", "ratio/min", "ratio/max",
          "post_update/log_ratio_token_var", "post_update/log_ratio_sequence_var", "moe/route_changed",
          "moe/abs_log_ratio_route_changed", "moe/abs_log_ratio_route_same")


def build_moe_policy(sft_max_steps: int | None = None):
    """``(model, tokenizer, sft_record)``: the tiny MoE fine-tuned with the shipped arithmetic recipe's SFT
    (``sft_max_steps`` cuts it short, without the stop rule, for the reduced test run)."""
    torch.set_num_threads(1)
    recipe = RECIPES[TASK]
    if sft_max_steps is not None:
        recipe = dataclasses.replace(recipe, sft=dataclasses.replace(recipe.sft, max_steps=sft_max_steps,
                                                                     stop_at_accuracy=None))
    tokenizer = build_tokenizer()
    model = build_model(MOE["size"], arch=MOE["arch"], seed=MOE["model_seed"], num_experts=MOE["num_experts"],
                        num_experts_per_tok=MOE["num_experts_per_tok"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.sft.seed)
        history = train_sft(model, tokenizer, recipe.make_task(), recipe.sft)
    record = {"parameters": count_parameters(model), "sft_steps": history.steps,
              "eval_steps": history.eval_steps, "eval_accuracy": history.eval_accuracy}
    return model, tokenizer, record


def run_one(name: str, arm: Arm, seed: int, moe=None, steps: int = STEPS) -> dict:
    """One run of ``arm`` from its policy (the shipped dense one, or ``moe = (model, tokenizer)``), with the
    post-update ratio and routing measurements of the docstring."""
    return train_run(TASK, arm, seed, policy=moe if POLICIES[name] == "moe" else None,
                     callbacks=[PostUpdateRatios(), ExpertRoutingChanges()], logged=LOGGED, max_steps=steps,
                     **COMMON)


def run(arms=tuple(ARMS), seeds=range(8), steps: int = STEPS, moe_sft_steps: int | None = None, out=None,
        processes=None, arguments=None) -> dict:
    """All ``arms`` x ``seeds`` (written to ``out`` when given). ``moe_sft_steps`` cuts the MoE's SFT short (for
    the reduced test run)."""
    start = time.perf_counter()
    moe, tokenizer, sft_record = build_moe_policy(moe_sft_steps)
    sft_record["seconds"] = round(time.perf_counter() - start, 1)
    return run_experiment("gspo_moe", functools.partial(run_one, moe=(moe, tokenizer), steps=steps),
                          {arm: ARMS[arm] for arm in arms}, seeds, out=out, common=COMMON,
                          extra={"steps": steps, "policies": POLICIES, "moe": MOE, "moe_sft": sft_record},
                          processes=processes, steps_per_run=steps, checkpoints=[TASK], arguments=arguments,
                          description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(seeds=range(args.seeds), steps=args.steps, out=args.out, processes=args.processes,
        arguments={**vars(args), "out": str(args.out)})


if __name__ == "__main__":
    main()
