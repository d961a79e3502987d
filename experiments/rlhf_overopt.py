"""PPO against a learned reward model, with the task's rule measured on the side (Chapter "PPO for RLHF").

1. A reward model is trained once (Bradley–Terry, :func:`rlbook.reward_model.train_reward_model`) from the
   arithmetic base policy on the task's preference pairs (chosen = the demonstration, rejected = a near miss);
   its held-out pair accuracy is recorded.
2. Its scores are normalised with the mean and std over the base policy's own completions (so the starting policy
   scores about 0 ± 1) and clipped to ±10 (OpenRLHF's clip), and it becomes the trainer's ``reward_fn``.
3. PPO (the ``ppo`` preset: GAE, 4 epochs, whitened advantages, value clip 0.2) optimises it, with the value model
   initialised from the reward model (as InstructGPT and TRL do; its head rescaled to the normalised score), for
   each KL coefficient beta in :data:`BETAS` and each seed. Per step (:data:`LOGGED`): the learned reward, the gold
   accuracy (the task's rule, on the training completions), the KL to the reference, value loss, explained
   variance, clip fraction; every ``EVAL_EVERY`` steps the gold accuracy on held-out test prompts.
4. A control (arm ``gold_reward``): the same PPO with the task's rule as the reward (``reward_fn`` left out, the
   value model from the policy) at the smaller beta, to tell over-optimisation of the learned reward from an
   unstable optimiser.

    python experiments/rlhf_overopt.py            # writes experiments/results/rlhf_overopt.json
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.experiment import Arm, run_experiment, train_run
from rlbook.lm.value import build_value_model
from rlbook.reward_model import RewardModelConfig, RewardModelScorer, build_reward_model, train_reward_model
from rlbook.rollout import generate_rollouts
from rlbook.tasks.preferences import build_preference_pairs

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
LOGGED = ("reward", "accuracy", "objective/kl_per_token", "objective/kl", "loss/value", "explained_variance",
          "clip_ratio/region_mean", "approx_kl", "completions/mean_length", "beta")


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


def run_one(name: str, arm: Arm, seed: int, reward_model, stats, steps: int = STEPS) -> dict:
    """One PPO run against the learned reward (or, for the ``gold_reward`` arm, against the task's rule): per-step
    metrics and the held-out gold accuracy."""
    learned = {}
    if name != "gold_reward":
        policy, tokenizer = load_base_policy(POLICY)
        learned = dict(reward_fn=RewardModelScorer(reward_model, tokenizer, mean=stats[0], std=stats[1], clip=10.0),
                       value_model=value_from_reward_model(policy, reward_model, *stats))
    return train_run(POLICY, arm, seed, logged=LOGGED, **learned, **RL, max_steps=steps)


def run(betas=BETAS, seeds=range(5), steps: int = STEPS, reward_steps: int | None = None, out: Path | None = None,
        processes: int | None = 1, arguments: dict | None = None) -> dict:
    torch.set_num_threads(1)
    reward_model, history, stats = train_reward(load_base_policy(POLICY), reward_steps)
    arms = {**{str(b): Arm("ppo", beta=b) for b in betas}, "gold_reward": Arm("ppo", beta=CONTROL_BETA)}
    extra = {"betas": list(betas), "control_beta": CONTROL_BETA, "steps": steps, "reward_model": REWARD_MODEL,
             "reward_model_eval_steps": history.eval_steps, "reward_model_pair_accuracy": history.eval_accuracy,
             "score_mean": stats[0], "score_std": stats[1]}
    return run_experiment("rlhf_overopt", partial(run_one, reward_model=reward_model, stats=stats, steps=steps),
                          arms, seeds, out=out, common={**RL, "max_steps": steps}, extra=extra,
                          processes=processes, steps_per_run=steps, arguments=arguments, checkpoints=[POLICY],
                          description=__doc__.splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    run(seeds=range(args.seeds), out=args.out, processes=args.processes,
        arguments={k: str(v) for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
