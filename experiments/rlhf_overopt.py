"""PPO against a learned reward model, with the task's rule measured on the side (Chapter "PPO for RLHF").

1. A reward model is trained once (Bradley–Terry, :func:`rlbook.reward_model.train_reward_model`) from the
   arithmetic base policy on the task's preference pairs (chosen = the demonstration, rejected = a near miss);
   its held-out pair accuracy is recorded.
2. Its scores are normalised with the mean and std over the base policy's own completions (so the starting policy
   scores about 0 ± 1) and clipped to ±10 (OpenRLHF's clip), and it becomes the trainer's ``reward_fn``.
3. PPO (the ``ppo`` preset: GAE, 4 epochs, whitened advantages, value clip 0.2) optimises it, with the value model
   initialised from the reward model (as InstructGPT and TRL do; its head rescaled to the normalised score), for each KL coefficient beta in :data:`BETAS`
   and each seed. Per step: the learned reward, the gold accuracy (the task's rule, on the training completions),
   the KL to the reference, value loss, explained variance, clip fraction; every ``EVAL_EVERY`` steps the gold
   accuracy on held-out test prompts.
4. A control: the same PPO with the task's rule as the reward (``reward_fn`` left out, the value model from the
   policy) at the smaller beta, to tell over-optimisation of the learned reward from an unstable optimiser.

    python experiments/rlhf_overopt.py            # writes experiments/results/rlhf_overopt.json
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.lm.value import build_value_model
from rlbook.paths import write_results
from rlbook.reward_model import RewardModelConfig, RewardModelScorer, build_reward_model, train_reward_model
from rlbook.rollout import generate_rollouts
from rlbook.tasks.preferences import build_preference_pairs
from rlbook.trainer import Trainer, preset

RESULTS = Path(__file__).parent / "results" / "rlhf_overopt.json"
POLICY = "arithmetic"
NUM_TRAIN_PAIRS, NUM_TEST_PAIRS = 2000, 256
REWARD_MODEL = dict(steps=300, batch_size=64, lr=3e-4, eval_every=50, seed=0)
NORMALISE_PROMPTS = 64  # prompts x 8 samples of the base policy for the score's mean and std
BETAS = (0.01, 0.1)
CONTROL_BETA = 0.01  # the control arm ("gold_reward"): PPO on the task's own reward
STEPS, EVAL_EVERY = 40, 10
RL = dict(learning_rate=3e-4, num_generations=8, per_device_train_batch_size=64, max_completion_length=8,
          eval_every=EVAL_EVERY, eval_size=128)
KEEP = ("reward", "accuracy", "kl_ref", "kl_ref_sequence", "value_loss", "explained_variance", "clip_frac",
        "approx_kl", "completion_length", "beta")


def train_reward(base, steps: int | None = None) -> tuple:
    """``(reward_model, history, (mean, std))``: the Bradley–Terry reward model started from ``base``'s policy,
    and its score statistics over the base policy's completions of training prompts."""
    policy, tokenizer = base
    task = RECIPES[POLICY].make_task()
    train_pairs = build_preference_pairs(task, NUM_TRAIN_PAIRS, seed=0, split="train")
    test_pairs = build_preference_pairs(task, NUM_TEST_PAIRS, seed=1, split="test")
    config = RewardModelConfig(**{**REWARD_MODEL, **({"steps": steps} if steps else {})})
    reward_model = build_reward_model(policy)
    history = train_reward_model(reward_model, tokenizer, train_pairs, test_pairs, config)
    examples = task.sample(NORMALISE_PROMPTS, seed=np.random.default_rng(12345), split="train")
    batch = generate_rollouts(policy, tokenizer, [e.prompt for e in examples], num_generations=8,
                              max_new_tokens=RL["max_completion_length"], temperature=1.0, seed=12345)
    repeated = [e.prompt for e in examples for _ in range(8)]
    raw = RewardModelScorer(reward_model, tokenizer).raw_scores(repeated, batch.decode_completions(tokenizer))
    return reward_model, history, (float(raw.mean()), float(raw.std()))


def value_from_reward_model(policy, reward_model, mean: float, std: float):
    """The value model initialised from the reward model (InstructGPT, TRL), on the reward's normalised scale:
    the head's weight divided by ``std`` and its bias set to ``-mean / std``, so that at a completion's last token
    it starts out predicting exactly the normalised score (before the clip)."""
    value_model = build_value_model(policy, init="reward_model", reward_model=reward_model)
    with torch.no_grad():
        value_model.score.weight.div_(std)
        value_model.score.bias.fill_(-mean / std)
    return value_model


def train_one(beta: float, seed: int, base, reward_model, stats, steps: int = STEPS) -> dict:
    """One PPO run against the learned reward (or, with ``reward_model=None``, against the task's rule): per-step
    metrics and the held-out gold accuracy."""
    torch.set_num_threads(1)
    policy, tokenizer = copy.deepcopy(base[0]), base[1]
    config = preset("ppo", beta=beta, seed=seed, max_steps=steps, **RL)
    if reward_model is None:
        trainer = Trainer(policy, tokenizer, RECIPES[POLICY].make_task(), config)
    else:
        scorer = RewardModelScorer(reward_model, tokenizer, mean=stats[0], std=stats[1], clip=10.0)
        value_model = value_from_reward_model(policy, reward_model, *stats)
        trainer = Trainer(policy, tokenizer, RECIPES[POLICY].make_task(), config, value_model=value_model,
                          reward_fn=scorer)
    eval_steps, eval_accuracy = [0], [trainer.evaluate()]
    history = trainer.train(progress=False)
    for m in history:
        if "eval_accuracy" in m:
            eval_steps.append(m["step"])
            eval_accuracy.append(m["eval_accuracy"])
    out = {key: [m[key] for m in history] for key in KEEP if key in history[0]}
    return {**out, "eval_steps": eval_steps, "eval_accuracy": eval_accuracy}


def run(betas=BETAS, seeds=(0, 1, 2, 3, 4), steps: int = STEPS, reward_steps: int | None = None,
        out_path: Path | None = None) -> dict:
    torch.set_num_threads(1)
    base = load_base_policy(POLICY)
    reward_model, history, stats = train_reward(base, reward_steps)
    out = {"seeds": list(seeds), "betas": list(betas), "steps": steps, "rl": RL, "reward_model": REWARD_MODEL,
           "checkpoint_sha256": load_manifest(POLICY)["sha256"]["model.safetensors"],
           "reward_model_eval_steps": history.eval_steps, "reward_model_pair_accuracy": history.eval_accuracy,
           "score_mean": stats[0], "score_std": stats[1], "control_beta": CONTROL_BETA,
           "runs": {**{str(b): [] for b in betas}, "gold_reward": []}}
    for seed in seeds:  # seed-major, so that a partial file holds every arm for the first seeds
        for beta in betas:
            out["runs"][str(beta)].append(train_one(beta, seed, base, reward_model, stats, steps))
        out["runs"]["gold_reward"].append(train_one(CONTROL_BETA, seed, base, None, None, steps))
        if out_path is not None:
            out_path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)  # run() writes partial results there as it goes
    write_results(args.out, lambda: run(seeds=tuple(range(args.seeds)), out_path=args.out))


if __name__ == "__main__":
    main()
