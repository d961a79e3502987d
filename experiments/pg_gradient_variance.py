"""How much does a baseline cut the variance of the policy-gradient estimate? (Chapter "The policy-gradient theorem")

At the *fixed* arithmetic base policy, draw many independent batches of ``num_prompts x G`` completions, and for each
batch compute the flattened gradient of the REINFORCE loss the trainer uses (``policy_loss`` with the ``dr_grpo``
denominator, ratio 1) under three advantages computed from the *same* rollouts:

- ``reinforce``: A_i = r_i (no baseline);
- ``group_mean``: A_i = r_i - mean of the group's rewards (``group_advantages(..., scale_rewards="none")``);
- ``rloo``: A_i = r_i - mean of the *other* G - 1 rewards (``leave_one_out_advantages``).

For each estimator we record the total variance of the gradient estimate across batches, ``E||g - E g||^2`` (the
trace of its covariance, summed over all parameters), and the squared norm of its mean. The whole sweep is repeated
for group sizes G at a fixed budget of completions per batch, and for several seeds (independent sets of batches).

    python experiments/pg_gradient_variance.py            # writes experiments/results/pg_gradient_variance.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy, load_manifest
from rlbook.objectives import group_advantages, leave_one_out_advantages, policy_loss
from rlbook.paths import write_results
from rlbook.rollout import generate_rollouts, sequence_logprobs

ESTIMATORS = ("reinforce", "group_mean", "rloo")
RESULTS = Path(__file__).parent / "results" / "pg_gradient_variance.json"


def advantages(rewards: torch.Tensor, estimator: str, G: int) -> torch.Tensor:
    """(B,) advantages of one batch: the three estimators the trainer's presets use."""
    if estimator == "reinforce":
        return rewards
    if estimator == "group_mean":
        return group_advantages(rewards, G, scale_rewards="none")
    if estimator == "rloo":
        return leave_one_out_advantages(rewards, G)
    raise ValueError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")


def batch_gradients(model, tokenizer, task, *, G: int, batch_size: int, max_completion_length: int,
                    seed) -> dict[str, np.ndarray]:
    """One batch of ``batch_size`` completions (``batch_size / G`` prompts): the flattened gradient of the
    REINFORCE loss for every estimator, ``{estimator: (num_params,) float64}``, all from the same rollouts."""
    rng = np.random.default_rng(seed)
    examples = task.sample(batch_size // G, seed=rng, split="train")
    batch = generate_rollouts(model, tokenizer, [e.prompt for e in examples], num_generations=G,
                              max_new_tokens=max_completion_length, temperature=1.0,
                              seed=int(rng.integers(2**62)))
    repeated = [e for e in examples for _ in range(G)]
    rewards = torch.as_tensor(task.rewards(repeated, batch.decode_completions(tokenizer), batch.truncated.tolist()),
                              dtype=torch.float32)
    mask = batch.completion_mask.float()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = {}
    for estimator in ESTIMATORS:
        model.zero_grad(set_to_none=True)
        logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, mask)
        loss, _ = policy_loss(logp, logp.detach(), advantages(rewards, estimator, G), mask, loss_type="dr_grpo",
                              max_completion_length=max_completion_length)
        loss.backward()
        grads[estimator] = torch.cat([p.grad.flatten() for p in params]).double().numpy()
    return grads


def variance_of_estimates(grads: np.ndarray) -> tuple[float, float]:
    """``grads`` (K, D): K independent gradient estimates -> (total variance E||g - mean||^2 with K - 1 in the
    denominator, squared norm of the mean)."""
    mean = grads.mean(0)
    return float(((grads - mean) ** 2).sum(1).sum() / (len(grads) - 1)), float(mean @ mean)


def run(group_sizes=(2, 4, 8, 16), seeds=(0, 1, 2, 3, 4), num_batches=16, batch_size=64,
        policy="arithmetic") -> dict:
    torch.set_num_threads(1)
    model, tokenizer = load_base_policy(policy)
    recipe = RECIPES[policy]
    task = recipe.make_task()
    L = recipe.sft.max_new_tokens
    out = {"policy": policy, "checkpoint_sha256": load_manifest(policy)["sha256"]["model.safetensors"],
           "batch_size": batch_size, "num_batches": num_batches, "max_completion_length": L,
           "group_sizes": list(group_sizes), "seeds": list(seeds), "estimators": list(ESTIMATORS),
           "total_variance": {}, "mean_sq_norm": {}}
    for estimator in ESTIMATORS:
        out["total_variance"][estimator] = [[None] * len(seeds) for _ in group_sizes]
        out["mean_sq_norm"][estimator] = [[None] * len(seeds) for _ in group_sizes]
    for gi, G in enumerate(group_sizes):
        for si, seed in enumerate(seeds):
            per_batch = [batch_gradients(model, tokenizer, task, G=G, batch_size=batch_size,
                                         max_completion_length=L, seed=[seed, G, k])
                         for k in range(num_batches)]
            for estimator in ESTIMATORS:
                var, sq = variance_of_estimates(np.stack([g[estimator] for g in per_batch]))
                out["total_variance"][estimator][gi][si] = var
                out["mean_sq_norm"][estimator][gi][si] = sq
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-batches", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    write_results(args.out, lambda: run(seeds=tuple(range(args.seeds)), num_batches=args.num_batches))


if __name__ == "__main__":
    main()
