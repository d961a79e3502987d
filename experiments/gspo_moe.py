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

After every step's four updates the script recomputes the rollout's log-probs under the updated policy and records
the spread of the log-ratios log(pi_new / pi_old) at token level (``var_token``: variance over all completion
tokens) and at sequence level (``var_sequence``: variance over completions of their mean token log-ratio, log s_i),
and, on the MoE policy, the share of completion tokens whose set of experts changed in some layer
(``route_changed``) and the mean |token log-ratio| of the tokens whose routing changed and of those whose did not.

    python experiments/gspo_moe.py            # writes experiments/results/gspo_moe.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
from pathlib import Path

import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.lm import build_model, build_tokenizer, count_parameters
from rlbook.lm.moe import expert_choices, is_moe, routing_changed
from rlbook.objectives import masked_mean
from rlbook.paths import write_results
from rlbook.rollout import sequence_logprobs
from rlbook.sft import train_sft
from rlbook.trainer import Trainer, preset

RESULTS = Path(__file__).parent / "results" / "gspo_moe.json"
TASK = "arithmetic"
# The MoE policy: tiny Qwen3-MoE, the shipped recipe's SFT settings (stop at 45 % held-out accuracy).
MOE = dict(size="tiny", arch="qwen3_moe", num_experts=4, num_experts_per_tok=2, model_seed=0)
# Shared by every RL run: 16 prompts x G = 8 completions per step, split into 4 minibatches of 32 (GRPO's
# learning rate of experiments/grpo_training.py).
COMMON = dict(num_generations=8, per_device_train_batch_size=32, steps_per_generation=4, learning_rate=2e-4,
              eval_every=25, eval_size=256)
ARMS = {
    "dense_grpo": dict(policy="dense", preset="grpo", settings=dict(beta=0.0, epsilon=0.2, epsilon_high=0.27)),
    "moe_grpo": dict(policy="moe", preset="grpo", settings=dict(beta=0.0, epsilon=0.2, epsilon_high=0.27)),
    "moe_gspo": dict(policy="moe", preset="gspo", settings=dict()),
}
STEPS = 100
KEEP = ("reward", "accuracy", "clip_frac", "ratio_min", "ratio_max", "var_token", "var_sequence",
        "route_changed", "abs_logratio_route_changed", "abs_logratio_route_same")


class RatioSpreadTrainer(Trainer):
    """The book's trainer plus the ratio measurements of the module docstring, taken after each step's updates."""

    def _update(self, rollout: dict, value_only: bool = False) -> dict:
        ids, attn, mask = rollout["input_ids"], rollout["attention_mask"], rollout["mask"]
        moe = is_moe(self.policy)
        before = expert_choices(self.policy, ids, attn) if moe else None
        metrics = super()._update(rollout, value_only)
        with torch.no_grad():
            new_logp = sequence_logprobs(self.policy, ids, attn, mask, temperature=self.config.temperature)
        log_ratio = (new_logp - rollout["old_logp"]) * mask
        tokens = log_ratio[mask.bool()]
        sequences = log_ratio.sum(-1) / mask.sum(-1)  # log s_i, the mean token log-ratio (eq. GSPO ratio)
        metrics["var_token"] = float(tokens.var())
        metrics["var_sequence"] = float(sequences.var())
        if moe:
            completion = mask.bool()
            changed = routing_changed(before, expert_choices(self.policy, ids, attn))[:, -mask.shape[1]:]
            metrics["route_changed"] = masked_mean(changed.float(), mask).item()
            for name, which in (("route_changed", changed & completion), ("route_same", ~changed & completion)):
                if bool(which.any()):
                    metrics[f"abs_logratio_{name}"] = float(log_ratio[which].abs().mean())
        return metrics


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


def train_one(arm: str, seed: int, base, steps: int = STEPS) -> dict:
    """One run of ``arm`` from a copy of ``base = (model, tokenizer)``: per-step metrics and the eval curve."""
    torch.set_num_threads(1)
    spec = ARMS[arm]
    recipe = RECIPES[TASK]
    config = preset(spec["preset"], max_completion_length=recipe.sft.max_new_tokens, seed=seed, max_steps=steps,
                    **COMMON, **spec["settings"])
    trainer = RatioSpreadTrainer(copy.deepcopy(base[0]), base[1], recipe.make_task(), config)
    eval_steps, eval_accuracy = trainer.train_with_eval_curve()
    run = {key: [m.get(key) for m in trainer.history] for key in KEEP}
    return {**run, "eval_steps": eval_steps, "eval_accuracy": eval_accuracy}


def run(arms=tuple(ARMS), seeds=(0, 1, 2, 3, 4), steps: int = STEPS, moe_sft_steps: int | None = None) -> dict:
    """All ``arms`` x ``seeds``. ``moe_sft_steps`` cuts the MoE's SFT short (for the reduced test run)."""
    start = time.perf_counter()
    moe, tokenizer, sft_record = build_moe_policy(moe_sft_steps)
    sft_record["seconds"] = round(time.perf_counter() - start, 1)
    bases = {"dense": load_base_policy(TASK), "moe": (moe, tokenizer)}
    return {
        "task": TASK, "seeds": list(seeds), "steps": steps, "common": COMMON, "arms": ARMS, "moe": MOE,
        "moe_sft": sft_record,
        "dense_checkpoint_sha256": load_manifest(TASK)["sha256"]["model.safetensors"],
        "runs": {arm: [train_one(arm, seed, bases[ARMS[arm]["policy"]], steps) for seed in seeds] for arm in arms},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    write_results(args.out, lambda: run(seeds=tuple(range(args.seeds)), steps=args.steps))


if __name__ == "__main__":
    main()
