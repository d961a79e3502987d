"""PPO against VAPO at the same sample budget, and VAPO without value pretraining and decoupled GAE (Chapter "VAPO").

All arms start from the shipped ``sort_scratchpad`` base policy (the task with the longest completions, about 28
tokens), see the same prompts at every step (the prompts depend on (seed, step) only) and sample the same number of
completions per step (4 prompts x 8 completions), with the same learning rate and passes per rollout, so what differs
is the algorithm's configuration:

- ``ppo``: the trainer's ``ppo`` preset (GAE with one lambda = 0.95 for policy and critic, symmetric clip 0.2,
  token mean per minibatch), no value pretraining.
- ``vapo``: the ``vapo`` preset: value pretraining, decoupled GAE (critic lambda 1), length-adaptive policy lambda
  (alpha 0.05), token-level loss, clip-higher (0.2 / 0.28), NLL on correct completions (mu 0.1), groups of 8.
- ``vapo_no_vp_dgae``: the same without value pretraining and with the critic's targets computed with the policy's
  own (length-adaptive) lambda, as a single GAE pass would.
- ``vapo_lam095``: VAPO with the policy's lambda fixed at PPO's 0.95 instead of the length-adaptive one (added after
  the first runs: with completions of 15 to 40 tokens the length-adaptive lambda is close to 0).

Value pretraining costs extra sampled completions (``PRETRAIN_STEPS`` rollouts that train only the critic); the
budget above counts the policy-training steps, as the paper does. Held-out sampled accuracy (one completion per
"test" problem at temperature 1) is measured every ``EVAL_EVERY`` steps.

    python experiments/vapo_compare.py            # writes experiments/results/vapo_compare.json
    python experiments/vapo_compare.py --steps 2 --seeds 1 --out /tmp/x.json   # a smoke test
    python experiments/vapo_compare.py --arms vapo_lam095 --merge     # add (or redo) arms in the stored file
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from pathlib import Path

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
    from rlbook.objectives import gae, length_adaptive_lam, masked_mean
    from rlbook.trainer import Trainer, preset

RESULTS = Path(__file__).parent / "results" / "vapo_compare.json"
TASK = "sort_scratchpad"
PRETRAIN_STEPS = 10  # the paper's 50, scaled down with the run
EVAL_EVERY, EVAL_SIZE = 10, 128
COMMON = dict(num_generations=8, per_device_train_batch_size=32, learning_rate=2e-4, num_iterations=2)
ARMS = {
    "ppo": dict(preset="ppo"),
    "vapo": dict(preset="vapo", value_pretrain_steps=PRETRAIN_STEPS),
    "vapo_no_vp_dgae": dict(preset="vapo", value_pretrain_steps=0, coupled_critic=True),
    "vapo_lam095": dict(preset="vapo", value_pretrain_steps=PRETRAIN_STEPS, lam_alpha=None),
}
KEEP = ("reward", "accuracy", "completion_length", "value_loss", "explained_variance", "clip_frac", "approx_kl",
        "nll_loss", "lam_policy")


class VapoTrainer(Trainer):
    """The book's trainer plus a metric (``lam_policy``: the mean length-adaptive lambda of the step's completions)
    and, with ``coupled_critic``, the critic's targets computed with the policy's own lambda (no decoupled GAE)."""

    def __init__(self, *args, coupled_critic: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.coupled_critic = coupled_critic

    def _score(self, batch, examples, rewards):
        out = super()._score(batch, examples, rewards)
        config = self.config
        lam = config.lam if config.lam_alpha is None else length_adaptive_lam(batch.lengths, config.lam_alpha)
        out["metrics"]["lam_policy"] = float(torch.as_tensor(lam).float().mean())
        if self.coupled_critic:  # beta = 0: the token rewards are the score at the last real token
            mask = out["mask"]
            scores = torch.as_tensor(out["rewards"], dtype=torch.float32)
            token_rewards = torch.zeros_like(mask)
            token_rewards[torch.arange(len(mask)), mask.sum(-1).long() - 1] = scores
            _, out["returns"] = gae(token_rewards, out["old_values"], mask, config.gamma, lam)
            err = masked_mean((out["returns"] - out["old_values"]) ** 2, mask)
            var = masked_mean((out["returns"] - masked_mean(out["returns"], mask)) ** 2, mask)
            out["metrics"]["explained_variance"] = float(1 - err / var.clamp(min=1e-8))
        return out


def run_one(arm: str, seed: int, base, steps: int, eval_size: int = EVAL_SIZE) -> dict:
    """One run of ``arm`` from a copy of ``base = (model, tokenizer)``: held-out accuracy and per-step metrics."""
    torch.set_num_threads(1)
    spec = dict(ARMS[arm])
    name, coupled = spec.pop("preset"), spec.pop("coupled_critic", False)
    recipe = RECIPES[TASK]
    config = preset(name, **COMMON, **spec, max_completion_length=recipe.sft.max_new_tokens, max_steps=steps,
                    seed=seed, eval_every=min(EVAL_EVERY, steps), eval_size=eval_size)
    trainer = VapoTrainer(copy.deepcopy(base[0]), base[1], recipe.make_task(), config, coupled_critic=coupled)
    start = time.perf_counter()
    eval_steps, eval_accuracy = trainer.train_with_eval_curve()
    history = trainer.history
    pretrain = trainer.value_pretrain_history
    return {
        "arm": arm, "seed": seed, "eval_steps": eval_steps, "eval_accuracy": eval_accuracy,
        "metrics": {k: [m.get(k) for m in history] for k in KEEP},
        "pretrain": {k: [m.get(k) for m in pretrain] for k in ("value_loss", "explained_variance")},
        "seconds": round(time.perf_counter() - start, 1),
    }


def run(arms=tuple(ARMS), seeds=(0, 1, 2, 3, 4), steps: int = 60, eval_size: int = EVAL_SIZE) -> dict:
    base = load_base_policy(TASK)  # loaded once: every run starts from the same weights
    out = {"task": TASK, "checkpoint_sha256": load_manifest(TASK)["sha256"]["model.safetensors"],
           "common": COMMON, "arms": ARMS, "pretrain_steps": PRETRAIN_STEPS, "steps": steps,
           "seeds": list(seeds), "runs": {}}
    for arm in arms:
        out["runs"][arm] = []
        for seed in seeds:
            record = run_one(arm, seed, base, steps, eval_size)
            out["runs"][arm].append(record)
            print(f"{arm:>16} seed {seed}: held-out accuracy {record['eval_accuracy'][0]:.3f} -> "
                  f"{record['eval_accuracy'][-1]:.3f} ({record['seconds']:.0f} s)", flush=True)
    return out


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-size", type=int, default=EVAL_SIZE)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--merge", action="store_true", help="keep the other arms already stored in --out")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(tuple(args.arms), seeds=tuple(range(args.seeds)), steps=args.steps, eval_size=args.eval_size)
    result["command"] = "python experiments/vapo_compare.py"
    result["seconds"] = round(time.perf_counter() - start, 1)
    if args.merge and args.out.exists():  # the same settings (checked), the stored arms plus the new ones
        stored = json.loads(args.out.read_text())
        for key in ("task", "checkpoint_sha256", "common", "pretrain_steps", "steps", "seeds"):
            if stored[key] != result[key]:
                raise ValueError(f"--merge: stored {key} {stored[key]!r} differs from this run's {result[key]!r}")
        runs = {**stored["runs"], **result["runs"]}
        result["runs"] = {arm: runs[arm] for arm in ARMS if arm in runs}
        result["seconds"] = round(stored["seconds"] + result["seconds"], 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")
    return args.out


if __name__ == "__main__":
    main()
