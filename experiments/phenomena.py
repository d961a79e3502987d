"""What each algorithm is for, measured: one entry per (chapter, phenomenon) from the organisms' stored results.

Reads ``experiments/results/organism_<name>.json`` (written by ``experiments/organisms.py``; until an organism's
confirmatory run is made, its earlier exploratory file in ``experiments/results/exploratory/``) and writes
``experiments/results/phenomena.json``: for each entry the failure under the baseline from the first held-out
evaluation to the last (the gate: mean and 95 % t-interval over seeds, and whether it excludes 0 in the failure's
direction), the fix minus the baseline at the end over paired seeds, and the plan each results file was run under
with what ``make check-plans`` says of it (verified, or why not: "no plan" for an exploratory file); entries whose
fix arm first runs under the plan are listed as pending. The family chapter renders it as a table;
``tests/test_organisms.py`` recomputes every entry from the stored results.

    python experiments/phenomena.py
"""

from __future__ import annotations

import json
from pathlib import Path

from rlbook.organisms import phenomenon
from rlbook.plans import verify

RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "phenomena.json"

# chapter, what fails under the baseline, the organism, the fix's arm, the metric (default: the organism's), and
# which way is better (default: against the organism's failure); the fix's own metric where it differs, and where
# the fix is compared with the baseline (the last step, or the baseline's number of completions sampled). An
# experiment with a script of its own (not experiments/organisms.py) names it and its stored file's stem
# (``script=``, ``results=``); its file keeps the organisms' layout.
PHENOMENA = [
    dict(chapter="dr_grpo", phenomenon="wrong answers grow longer under GRPO's per-completion 1/|o_i|",
         organism="length_inflation", fix="dr_grpo", metric="mean_length_wrong", direction="down"),
    dict(chapter="gfpo", phenomenon="wrong answers grow longer under GRPO",
         organism="length_inflation", fix="gfpo", metric="mean_length_wrong", direction="down"),
    # GFPO's premise: right answers that GRPO lengthens (a scratchpad makes sums right more often); accuracy beside
    dict(chapter="gfpo", phenomenon="right answers grow longer under GRPO where a scratchpad makes them right more "
         "often", organism="length_growth", fix="gfpo_length", metric="mean_length_correct", direction="down",
         beside=("expected_accuracy",)),
    dict(chapter="lambda_grpo", phenomenon="wrong answers grow longer under GRPO",
         organism="length_inflation", fix="lambda_grpo", metric="mean_length_wrong", direction="down"),
    dict(chapter="dapo", phenomenon="token entropy collapses under the symmetric clip",
         organism="entropy_collapse", fix="clip_higher", metric="entropy", direction="up"),
    dict(chapter="dapo", phenomenon="wrong answers grow longer under GRPO's per-completion 1/|o_i|",
         organism="length_inflation", fix="token_loss", metric="mean_length_wrong", direction="down"),
    dict(chapter="gmpo", phenomenon="token entropy collapses under GRPO",
         organism="entropy_collapse", baseline="grpo", fix="gmpo", metric="entropy", direction="up"),
    # the control gives GRPO GMPO's range, (0.67, 1.49), as a linear clip: the table shows it beside the fix, so that
    # the geometric mean is not credited with what the wider range did
    dict(chapter="gmpo", phenomenon="accuracy collapses under GRPO's clip when the sampler and the learner disagree",
         organism="outlier_ratios", fix="gmpo", control="grpo_wide"),
    dict(chapter="gspo", phenomenon="GRPO's accuracy falls when an MoE's routing moves under it",
         organism="routing_drift", fix="gspo"),
    # the same question where re-routing moves a token's probability (one expert per token, weighted by the router);
    # Routing Replay, the GSPO paper's baseline for GRPO, beside the fix
    dict(chapter="gspo", phenomenon="GRPO's accuracy falls when re-routing moves a token's probability (one expert "
         "per token)", organism="routing_jumps", fix="gspo", control="grpo_routing_replay"),
    # the failure is a level (most groups without reward spread); the fix is judged on accuracy per completion
    # sampled, since dynamic sampling draws more completions per step
    dict(chapter="dapo", phenomenon="most groups are all right and carry no gradient",
         organism="zero_gradient", fix="dynamic_sampling", fix_metric="expected_accuracy", fix_direction="up",
         compared_at="num_completions"),
    # --- Parts III and V (issue 20) ---
    # REINFORCE's weights are the rewards themselves: shifted to {5, 6}, every sample is pushed up and the shift's
    # noise swamps the signal; the group baselines subtract the shift exactly
    dict(chapter="policy_gradient", phenomenon="held-out accuracy falls under REINFORCE without a baseline when "
         "every reward is shifted up", organism="shifted_rewards", fix="rloo"),
    dict(chapter="ppo", phenomenon="accuracy falls when PPO takes 16 updates per rollout without its clip",
         organism="many_updates", fix="ppo"),
    # GAE's lambda on 100-token chains whose critic learns nothing: the preset (lambda 0.95, no value pretraining)
    # against each change alone, the policy's lambda 1 (Monte Carlo advantages, the critic as in the preset) and the
    # critic recipe (20 pretraining rollouts, Monte Carlo targets, the policy's lambda still 0.95)
    dict(chapter="ppo", phenomenon="PPO's accuracy falls on 100-token answers with GAE's lambda 0.95 and a critic "
         "that has learned nothing; the fix: the policy's lambda 1 alone", organism="long_chain",
         fix="ppo_policy_lam_1"),
    dict(chapter="ppo", phenomenon="PPO's accuracy falls on 100-token answers with GAE's lambda 0.95 and a critic "
         "that has learned nothing; the fix: the critic pretrained on Monte Carlo targets alone",
         organism="long_chain", fix="ppo_lam_0.95"),
    # VAPO's motivating case at this scale: PPO (lambda 0.95, a critic neither pretrained nor given Monte Carlo
    # targets) on 100-token chains; the fix is VAPO with alpha rescaled to these lengths (its chapter shows the
    # paper's alpha and the seven ablations beside it)
    dict(chapter="vapo", phenomenon="PPO's accuracy falls on 100-token answers whose critic has learned nothing",
         organism="long_chain", fix="vapo_alpha_0.5"),
    # the KL penalty in the reward (beta 0.05) against none; Gao et al. found it acts like early stopping, so its
    # gold at the last step may be higher without moving the gold-versus-sqrt(KL) frontier (see the chapter)
    dict(chapter="ppo_rlhf", phenomenon="gold accuracy falls while a length-biased proxy reward is optimised",
         organism="proxy_reward", fix="kl_penalty"),
    # DPO's own trainer (rlbook.dpo.train_dpo), scripts of their own. Deterministic preferences: the gate is DPO's
    # margin growth over the second half of training (the stored evals start half-way); IPO is judged on the same
    # growth, with the gold accuracy (which both arms lose) beside it. Offline pairs: the gate is offline DPO's
    # accuracy change; the fix, pairs from the policy's own samples.
    dict(chapter="dpo", phenomenon="DPO's margin on deterministic preferences keeps growing",
         organism="deterministic_preferences", results="dpo_ipo", script="experiments/dpo_ipo.py", fix="ipo",
         compared_at="change", beside=("expected_accuracy",)),
    dict(chapter="dpo", phenomenon="iterated DPO on offline near-miss pairs lowers the held-out accuracy",
         organism="offline_pairs", results="dpo_onpolicy", script="experiments/dpo_onpolicy.py", fix="on_policy"),
    # GAPO (its own script): PPO against a warmed-up encoder judge kept frozen, a judge that ranks wrong lengths right
    # and wrong letter counts at chance while the policy's mistakes are wrong counts; the fix is GAPO with
    # rule-labelled negatives (its chapter shows the GAN reading of the pairs, PPO on the rule and DPO beside it)
    dict(chapter="gapo", phenomenon="gold accuracy falls while PPO optimises a frozen judge that cannot see the "
         "policy's mistakes", organism="frozen_judge", results="gapo_compare", script="experiments/gapo_compare.py",
         fix="gapo"),
    # Part VII: the sampler draws at temperature 1.3 and its log-probs stand in for pi_old over four updates per
    # rollout. The fix that removes the mismatch, pi_old recomputed by the learner, and CISPO, which keeps the
    # sampler's ratios but caps their weight (the chapter shows the four corrections and SAPO beside them)
    dict(chapter="after_the_note", phenomenon="GRPO's accuracy collapses when its ratio divides by the log-probs of "
         "a sampler that disagrees with the learner; the fix: pi_old recomputed by the learner",
         organism="sampler_mismatch", fix="grpo_recompute"),
    dict(chapter="after_the_note", phenomenon="GRPO's accuracy collapses when its ratio divides by the log-probs of "
         "a sampler that disagrees with the learner; the fix: CISPO's capped weight on the same ratios",
         organism="sampler_mismatch", fix="cispo"),
]
# the entropy methods on entropy_collapse's setting (organism entropy_methods): each changes one thing of the
# symmetric clip's arm; accuracy beside the entropy, since entropy kept high at the cost of accuracy is no fix
ENTROPY_FIXES = {"high_entropy": "the gradient only on the 20 % of tokens with the highest entropy",
                 "adaptive_entropy": "an entropy bonus whose coefficient adapts to a target",
                 "clip_cov": "Clip-Cov", "kl_cov": "KL-Cov", "cispo": "CISPO's capped weight in place of the clip"}
PHENOMENA += [dict(chapter="after_the_note", phenomenon=f"token entropy collapses under the symmetric clip; the fix: "
                   f"{what}", organism="entropy_methods", fix=fix, metric="entropy", direction="up",
                   beside=("expected_accuracy",)) for fix, what in ENTROPY_FIXES.items()]


def results_file(name: str, results: Path = RESULTS, stem: str | None = None) -> Path:
    """Where organism ``name``'s results are stored: the confirmatory file in ``results`` (run under its plan), or,
    until that run is made, the earlier exploratory file in ``results/exploratory``."""
    file = f"{stem or f'organism_{name}'}.json"
    for folder in (results, results / "exploratory"):
        if (folder / file).exists():
            return folder / file
    return results / file


def organism_results(name: str, results: Path = RESULTS, stem: str | None = None,
                     script: str = "experiments/organisms.py") -> tuple[Path, dict]:
    """The stored results of organism ``name`` and the file they were read from (:func:`results_file`):
    ``organism_<name>.json``, or ``<stem>.json`` for an experiment of its own script that stores the same layout
    (an ``organism`` record and ``runs`` with held-out ``evals``)."""
    path = results_file(name, results, stem)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python {script}" + (f" {name}" if stem is None else ""))
    result = json.loads(path.read_text())
    if result["organism"]["name"] != name:
        raise ValueError(f"{path} holds organism {result['organism']['name']!r}, not {name!r}")
    return path, result


def plan_status(path: Path, result: dict) -> dict:
    """The plan a results file (``result``, read from ``path``) was run under and what ``make check-plans`` says of
    it (:func:`rlbook.plans.verify`): ``{"path", "status"}``, the path None for a file without a plan record."""
    record = (result.get("provenance") or {}).get("plan") or {}
    return {"path": record.get("path"), "status": verify(path).status}


def entries(results: Path = RESULTS, *, with_plans: bool = True) -> tuple[list[dict], list[dict]]:
    """Every entry of :data:`PHENOMENA` computed from the stored organism results in ``results``, each with the
    results file it read and (``with_plans``) its plan's status; and the entries that cannot be computed yet, because
    the stored (exploratory) results lack an arm that first runs under the plan, each with the reason."""
    out, pending = [], []
    for spec in PHENOMENA:
        spec = dict(spec)
        name, stem = spec.pop("organism"), spec.pop("results", None)
        script = spec.pop("script", "experiments/organisms.py")
        path, result = organism_results(name, results, stem, script)
        where = f"experiments/results/{path.relative_to(results).as_posix()}"
        missing = [spec[k] for k in ("fix", "control") if k in spec and spec[k] not in result["runs"]]
        if missing:
            pending.append({"chapter": spec["chapter"], "phenomenon": spec["phenomenon"], "organism": name,
                            "fix": spec["fix"], "results": where, "plan": f"experiments/plans/{name}.md",
                            "reason": f"{where} has no arm {', '.join(missing)}: it first runs under the plan"})
            continue
        entry = phenomenon(result, **spec, script=script)
        entry["results"] = where
        if with_plans:
            entry["plan"] = plan_status(path, result)
        out.append(entry)
    return out, pending


def main():
    computed, pending = entries()
    table = {"description": __doc__.splitlines()[0], "entries": computed, "pending": pending}
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    for e in table["entries"]:
        mean, low, high = e["baseline_change"] if e["baseline_level"] is None else e["baseline_level"]
        diff, dlow, dhigh = e["fix_minus_baseline"]
        print(f"{e['chapter']:<12} {e['metric']:<18} baseline {e['baseline']:<15} "
              f"{'change' if e['baseline_level'] is None else 'level'} {mean:+.4g} [{low:+.4g}, {high:+.4g}] "
              f"gate {'holds' if e['gate_holds'] else 'fails'}; {e['fix']} - baseline {e['fix_metric']} "
              f"{diff:+.4g} [{dlow:+.4g}, {dhigh:+.4g}] at equal {e['compared_at']} ({e['fix_direction']} is better); "
              f"plan {e['plan']['path']}: {e['plan']['status']}")
    for e in pending:
        print(f"{e['chapter']:<12} pending: {e['reason']}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
