"""Model organisms (rlbook.organisms): every arm of one organism trained on paired seeds and measured on held-out
prompts with several samples each.

Each run starts from the organism's shipped base policy and records the trainer's per-step metrics and the
held-out evaluations (:class:`rlbook.evaluation.HeldOutEvaluation`: expected accuracy, pass@k, lengths of the
correct and the wrong answers, token entropy, distinct correct answers) at the start, every ``eval_every`` steps
and at the end. The stored file is what ``experiments/phenomena.py`` and the chapters read.

    python experiments/organisms.py length_inflation            # experiments/results/organism_length_inflation.json
    python experiments/organisms.py entropy_collapse --seeds 8
    python experiments/organisms.py length_inflation --arms grpo --seeds 3 --out /tmp/gate.json   # the gate alone
    python experiments/organisms.py outlier_ratios --arms grpo_wide --seeds 8 --merge   # an arm added later
    python experiments/organisms.py shifted_rewards --seeds 10 --first-seed 100 \
        --plan experiments/plans/shifted_rewards.md     # confirmatory: the plan's seeds, committed first
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from rlbook.evaluation import HeldOutEvaluation
from rlbook.experiment import add_plan_arguments, run_experiment, seeds_of, train_run
from rlbook.organisms import ORGANISMS, get_organism
from rlbook.stats import baseline_change, baseline_level, gate_holds

RESULTS = Path(__file__).parent / "results"
LOGGED = ("accuracy", "entropy", "completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean",
          "frac_reward_zero_std", "num_completions", "dynamic_sampling/groups", "clip_ratio/low_mean",
          "clip_ratio/high_mean", "ratio/min", "ratio/max", "moe/route_changed", "approx_kl", "reward",
          "explained_variance", "loss/value", "moe/abs_log_ratio_route_changed", "moe/abs_log_ratio_route_same")


def results_path(name: str) -> Path:
    return RESULTS / f"organism_{name}.json"


def run_one(arm_name, arm, seed, *, organism: str, evaluation: dict | None = None, **settings) -> dict:
    """One run: train ``arm`` from the organism's base policy, evaluating on its held-out prompts
    (``evaluation`` overrides the organism's ``num_prompts``, ``num_samples``, ``every``, ``at_steps``: the tests)."""
    from rlbook.callbacks import ExpertRoutingChanges, ValuePretrainingHistory

    spec = get_organism(organism)
    settings = {**spec.settings, **settings}
    sizes = {"num_prompts": spec.num_prompts, "num_samples": spec.num_samples, "every": spec.eval_every,
             "at_steps": spec.eval_at, **(evaluation or {})}
    evaluation = HeldOutEvaluation(**sizes, ks=(1, sizes["num_samples"]))
    # a mixture-of-experts policy also logs the share of tokens its updates re-routed (nothing for a dense one)
    pretraining = ValuePretrainingHistory()
    record = train_run(spec.policy, arm, seed, callbacks=[evaluation, ExpertRoutingChanges(), pretraining],
                       logged=LOGGED, **settings)
    record["evals"] = evaluation.records
    if any(pretraining.history.values()):  # an arm that pretrains its value model: what the pretraining reached
        record["value_pretrain"] = pretraining.history
    return record


def run(organism: str, arms=None, seeds=(0, 1, 2, 3, 4), *, out=None, processes=None, arguments=None,
        evaluation: dict | None = None, merge: bool = False, plan=None, **settings) -> dict:
    """Run ``arms`` (default: all) of ``organism`` for ``seeds``; ``settings`` and ``evaluation`` override the
    organism's training settings and held-out evaluation sizes (the tests shorten runs). ``merge`` keeps the other
    arms of the stored ``out`` (same settings and seeds): an arm added to an organism runs alone."""
    spec = get_organism(organism)
    arms = list(spec.arms) if arms is None else list(arms)
    common = {**spec.settings, **settings}
    result = run_experiment(f"organism_{organism}", functools.partial(run_one, organism=organism, evaluation=evaluation, **settings),
                            {a: spec.arm(a) for a in arms}, seeds, out=out, common=common,
                            processes=processes, steps_per_run=common["max_steps"], arguments=arguments,
                            checkpoints=[spec.policy], description=spec.description, merge=merge, plan=plan,
                            extra={"organism": spec.to_json()},
                            summary={f"{spec.metric} start": lambda r: r["evals"][0][spec.metric],
                                     f"{spec.metric} end": lambda r: r["evals"][-1][spec.metric],
                                     "accuracy end": lambda r: r["evals"][-1]["expected_accuracy"]})
    if spec.baseline in result["runs"]:
        runs = result["runs"][spec.baseline]
        change = baseline_change(runs, spec.metric)
        print(f"{spec.metric} under {spec.baseline} changed by {change[0]:.4g} [{change[1]:.4g}, {change[2]:.4g}]")
        if spec.failure_threshold is None:
            print(f"gate (the change, failure {spec.failure}): holds: {gate_holds(change, spec.failure)}")
        else:
            level = baseline_level(runs, spec.metric)
            print(f"gate (the level, failure {spec.failure} of {spec.failure_threshold}): {level[0]:.4g} "
                  f"[{level[1]:.4g}, {level[2]:.4g}], holds: "
                  f"{gate_holds(level, spec.failure, spec.failure_threshold)}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("organism", choices=sorted(ORGANISMS))
    parser.add_argument("--arms", nargs="+", default=None)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--merge", action="store_true",
                        help="keep the stored file's other arms (an arm added later, run alone)")
    add_plan_arguments(parser)
    args = parser.parse_args()
    out = args.out or results_path(args.organism)
    run(args.organism, args.arms, seeds=seeds_of(args), out=out, processes=args.processes, merge=args.merge,
        plan=args.plan, arguments={**vars(args), "out": str(out), "plan": args.plan and str(args.plan)})


if __name__ == "__main__":
    main()
