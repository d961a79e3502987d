"""PPO against VAPO at the same sample budget, and VAPO without value pretraining and decoupled GAE (Chapter "VAPO").

All arms start from the shipped ``sort_scratchpad`` base policy (the task with the longest completions, about 28
tokens), see the same prompts at every step (the prompts depend on (seed, step) only) and sample the same number of
completions per step (4 prompts x 8 completions), with the same learning rate and passes per rollout, so what differs
is the algorithm's configuration:

- ``ppo``: the trainer's ``ppo`` preset (GAE with one lambda = 0.95 for policy and critic, symmetric clip 0.2,
  token mean per minibatch), no value pretraining.
- ``vapo``: the ``vapo`` preset: value pretraining, decoupled GAE (critic lambda 1), length-adaptive policy lambda
  (alpha 0.05), token-level loss, clip-higher (0.2 / 0.28), NLL on correct completions (mu 0.1), groups of 8.
- ``vapo_no_vp_dgae``: the same without value pretraining and with ``lam_critic=None``: the critic's targets are
  computed with the policy's own (length-adaptive) lambda, as a single GAE pass would.
- ``vapo_lam095``: VAPO with the policy's lambda fixed at PPO's 0.95 instead of the length-adaptive one (added after
  the first runs: with completions of 15 to 40 tokens the length-adaptive lambda is close to 0).

Value pretraining costs extra sampled completions (``PRETRAIN_STEPS`` rollouts that train only the critic); the
budget above counts the policy-training steps, as the paper does. Held-out sampled accuracy (one completion per
"test" problem at temperature 1) is measured every ``EVAL_EVERY`` steps. Each run's record also keeps the value
pretraining's history (``pretrain``: value loss and explained variance per pretraining step).

    python experiments/vapo_compare.py            # writes experiments/results/vapo_compare.json
    python experiments/vapo_compare.py --steps 2 --seeds 1 --out /tmp/x.json   # a smoke test
    python experiments/vapo_compare.py --arms vapo_lam095 --merge     # add (or redo) arms in the stored file
"""

from __future__ import annotations

import argparse
import warnings
from functools import partial
from pathlib import Path

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from rlbook.callbacks import ValuePretrainingHistory
    from rlbook.experiment import Arm, run_experiment, train_run

RESULTS = Path(__file__).parent / "results" / "vapo_compare.json"
TASK = "sort_scratchpad"
PRETRAIN_STEPS = 10  # the paper's 50, scaled down with the run
STEPS, EVAL_EVERY, EVAL_SIZE = 60, 10, 128
COMMON = dict(num_generations=8, per_device_train_batch_size=32, learning_rate=2e-4, num_iterations=2)
ARMS = {
    "ppo": Arm("ppo"),
    "vapo": Arm("vapo", value_pretrain_steps=PRETRAIN_STEPS),
    "vapo_no_vp_dgae": Arm("vapo", value_pretrain_steps=0, lam_critic=None),
    "vapo_lam095": Arm("vapo", value_pretrain_steps=PRETRAIN_STEPS, lam_alpha=None),
}
LOGGED = ("reward", "accuracy", "completions/mean_length", "loss/value", "explained_variance",
          "clip_ratio/region_mean", "approx_kl", "loss/nll", "vapo/lam_policy")


def run_one(name: str, arm: Arm, seed: int, steps: int = STEPS, eval_size: int = EVAL_SIZE) -> dict:
    """One run of ``arm``: held-out accuracy, the per-step metrics of ``LOGGED``, the value pretraining's history."""
    pretraining = ValuePretrainingHistory()
    record = train_run(TASK, arm, seed, callbacks=[pretraining], logged=LOGGED, **COMMON, max_steps=steps,
                       eval_every=min(EVAL_EVERY, steps), eval_size=eval_size)
    return {**record, "pretrain": pretraining.history}


def run(arms=tuple(ARMS), seeds=range(5), steps: int = STEPS, eval_size: int = EVAL_SIZE, out: Path | None = None,
        merge: bool = False, processes: int | None = 1, arguments: dict | None = None) -> dict:
    common = {**COMMON, "max_steps": steps, "eval_every": min(EVAL_EVERY, steps), "eval_size": eval_size}
    return run_experiment("vapo_compare", partial(run_one, steps=steps, eval_size=eval_size),
                          {a: ARMS[a] for a in arms}, seeds, out=out, merge=merge, common=common,
                          extra={"task": TASK, "pretrain_steps": PRETRAIN_STEPS, "steps": steps},
                          processes=processes, steps_per_run=steps, arguments=arguments, checkpoints=[TASK],
                          description=__doc__.splitlines()[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--eval-size", type=int, default=EVAL_SIZE)
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--merge", action="store_true", help="keep the other arms already stored in --out")
    args = parser.parse_args(argv)
    return run(tuple(args.arms), range(args.seeds), args.steps, args.eval_size, out=args.out, merge=args.merge,
               processes=args.processes, arguments={k: str(v) for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
