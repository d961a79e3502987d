"""How much does a baseline cut the variance of the policy-gradient estimate? (Chapter "The policy-gradient theorem")

At the *fixed* arithmetic base policy, draw many independent batches of ``batch_size`` completions (``batch_size / G``
prompts, G completions each), and for each batch compute the flattened gradient of the REINFORCE loss the trainer
uses (``policy_loss`` with the ``dr_grpo`` denominator, ratio 1) under three advantages computed from the *same*
rollouts, the estimators of the presets ``reinforce``, ``reinforce_baseline`` and ``rloo`` (rlbook.advantages):

- ``reinforce``: A_i = r_i (no baseline);
- ``group_mean``: A_i = r_i - mean of the group's rewards (``group_advantages(..., scale_rewards="none")``);
- ``rloo``: A_i = r_i - mean of the *other* G - 1 rewards (``leave_one_out_advantages``).

For each estimator we record the total variance of the gradient estimate across batches, ``E||g - E g||^2`` (the
trace of its covariance, summed over all parameters), and the squared norm of its mean. An arm is a group size G
(at a fixed budget of completions per batch); a seed is an independent set of batches.

The task's rewards default to 0/1; ``--shifted`` scores with :data:`SHIFTED` instead (right 6, wrong 5, the
``shifted_rewards`` organism's), on the same rollouts (same sampling seeds), and stores a second file. A shift c
adds c times the sum of the batch's scores to the no-baseline estimate and nothing to the group baselines' ones.

    python experiments/pg_gradient_variance.py            # writes experiments/results/pg_gradient_variance.json
    python experiments/pg_gradient_variance.py --shifted  # experiments/results/pg_gradient_variance_shifted.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.experiment import run_experiment
from rlbook.objectives import group_advantages, leave_one_out_advantages, policy_loss
from rlbook.rollout import generate_rollouts, sequence_logprobs

ESTIMATORS = ("reinforce", "group_mean", "rloo")
GROUP_SIZES = (2, 4, 8, 16)
SETTINGS = dict(policy="arithmetic", batch_size=64, num_batches=16)
RESULTS = Path(__file__).parent / "results" / "pg_gradient_variance.json"
SHIFTED = {"correct_reward": 6.0, "incorrect_reward": 5.0}  # the task settings of the shifted run
RESULTS_SHIFTED = RESULTS.with_name("pg_gradient_variance_shifted.json")


def advantages(rewards: torch.Tensor, estimator: str, G: int) -> torch.Tensor:
    """(B,) advantages of one batch: what ``rlbook.advantages.ESTIMATORS[estimator]`` computes."""
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


def run_one(name: str, arm: dict, seed: int, *, policy: str, batch_size: int, num_batches: int,
            task_kwargs: dict | None = None) -> dict:
    """One arm (group size) and seed: ``num_batches`` batches; per estimator, the total variance of the gradient
    estimate and the squared norm of its mean. ``task_kwargs`` override the recipe's task settings (the rewards)."""
    torch.set_num_threads(1)
    model, tokenizer = load_base_policy(policy)
    recipe, G = RECIPES[policy], arm["num_generations"]
    task = recipe.make_task(**(task_kwargs or {}))
    per_batch = [batch_gradients(model, tokenizer, task, G=G, batch_size=batch_size,
                                 max_completion_length=recipe.sft.max_new_tokens, seed=[seed, G, k])
                 for k in range(num_batches)]
    out = {"total_variance": {}, "mean_sq_norm": {}}
    for estimator in ESTIMATORS:
        var, sq = variance_of_estimates(np.stack([g[estimator] for g in per_batch]))
        out["total_variance"][estimator], out["mean_sq_norm"][estimator] = var, sq
    return out


def run(group_sizes=GROUP_SIZES, seeds=range(5), *, out=None, processes=None, progress=True, arguments=None,
        task_kwargs: dict | None = None, **settings) -> dict:
    """Every group size and seed; ``task_kwargs`` (stored in ``common`` when given) change the task's rewards."""
    common = {**SETTINGS, **settings, **({"task_kwargs": dict(task_kwargs)} if task_kwargs else {})}
    arms = {f"G={G}": {"num_generations": G} for G in group_sizes}
    summary = {f"var {e} / reinforce": functools.partial(_relative_variance, e) for e in ESTIMATORS[1:]}
    return run_experiment("pg_gradient_variance", functools.partial(run_one, **common), arms, seeds, out=out,
                          common=common, processes=processes, progress=progress, arguments=arguments,
                          summary=summary, checkpoints=[common["policy"]], description=__doc__.splitlines()[0],
                          extra={"estimators": list(ESTIMATORS),
                                 "max_completion_length": RECIPES[common["policy"]].sft.max_new_tokens})


def _relative_variance(estimator: str, record: dict) -> float:
    return record["total_variance"][estimator] / record["total_variance"]["reinforce"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-batches", type=int, default=SETTINGS["num_batches"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=None, help="default: one per core")
    parser.add_argument("--shifted", action="store_true", help=f"rewards {SHIFTED} instead of 0/1")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or (RESULTS_SHIFTED if args.shifted else RESULTS)
    run(seeds=range(args.seeds), out=out, processes=args.processes, arguments={**vars(args), "out": str(out)},
        num_batches=args.num_batches, task_kwargs=SHIFTED if args.shifted else None)


if __name__ == "__main__":
    main()
