"""What each algorithm is for, measured: one entry per (chapter, phenomenon) from the organisms' stored results.

Reads ``experiments/results/organism_<name>.json`` (written by ``experiments/organisms.py``) and writes
``experiments/results/phenomena.json``: for each entry the failure under the baseline from the first held-out
evaluation to the last (the gate: mean and 95 % t-interval over seeds, and whether it excludes 0 in the failure's
direction) and the fix minus the baseline at the end over paired seeds. The family chapter renders it as a table;
``tests/test_phenomena.py`` recomputes every entry from the stored results.

    python experiments/phenomena.py
"""

from __future__ import annotations

import json
from pathlib import Path

from rlbook.organisms import phenomenon

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
    dict(chapter="lambda_grpo", phenomenon="wrong answers grow longer under GRPO",
         organism="length_inflation", fix="lambda_grpo", metric="mean_length_wrong", direction="down"),
    dict(chapter="dapo", phenomenon="token entropy collapses under the symmetric clip",
         organism="entropy_collapse", fix="clip_higher", metric="entropy", direction="up"),
    dict(chapter="dapo", phenomenon="wrong answers grow longer under GRPO's per-completion 1/|o_i|",
         organism="length_inflation", fix="token_loss", metric="mean_length_wrong", direction="down"),
    dict(chapter="gmpo", phenomenon="token entropy collapses under GRPO",
         organism="entropy_collapse", baseline="grpo", fix="gmpo", metric="entropy", direction="up"),
    dict(chapter="gmpo", phenomenon="accuracy collapses under GRPO's clip when the sampler and the learner disagree",
         organism="outlier_ratios", fix="gmpo"),
    dict(chapter="gspo", phenomenon="GRPO's accuracy falls when an MoE's routing moves under it",
         organism="routing_drift", fix="gspo"),
    # the failure is a level (most groups without reward spread); the fix is judged on accuracy per completion
    # sampled, since dynamic sampling draws more completions per step
    dict(chapter="dapo", phenomenon="most groups are all right and carry no gradient",
         organism="zero_gradient", fix="dynamic_sampling", fix_metric="expected_accuracy", fix_direction="up",
         compared_at="num_completions"),
    # --- Parts III and V (issue 20) ---
    # [policy_gradient phenomena]
    # [ppo phenomena]
    # [ppo_rlhf phenomena]
    # [dpo phenomena]
]


def organism_results(name: str, results: Path = RESULTS, stem: str | None = None,
                     script: str = "experiments/organisms.py") -> dict:
    """The stored results of organism ``name``: ``organism_<name>.json``, or ``<stem>.json`` for an experiment of its
    own script that stores the same layout (an ``organism`` record and ``runs`` with held-out ``evals``)."""
    path = results / f"{stem or f'organism_{name}'}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python {script}" + (f" {name}" if stem is None else ""))
    result = json.loads(path.read_text())
    if result["organism"]["name"] != name:
        raise ValueError(f"{path} holds organism {result['organism']['name']!r}, not {name!r}")
    return result


def entries(results: Path = RESULTS) -> list[dict]:
    """Every entry of :data:`PHENOMENA` computed from the stored organism results in ``results``."""
    out = []
    for spec in PHENOMENA:
        spec = dict(spec)
        name, stem = spec.pop("organism"), spec.pop("results", None)
        script = spec.pop("script", "experiments/organisms.py")
        result = organism_results(name, results, stem, script)
        out.append(phenomenon(result, **spec, script=script))
    return out


def main():
    table = {"description": __doc__.splitlines()[0], "entries": entries()}
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    for e in table["entries"]:
        mean, low, high = e["baseline_change"] if e["baseline_level"] is None else e["baseline_level"]
        diff, dlow, dhigh = e["fix_minus_baseline"]
        print(f"{e['chapter']:<12} {e['metric']:<18} baseline {e['baseline']:<15} "
              f"{'change' if e['baseline_level'] is None else 'level'} {mean:+.4g} [{low:+.4g}, {high:+.4g}] "
              f"gate {'holds' if e['gate_holds'] else 'fails'}; {e['fix']} - baseline {e['fix_metric']} "
              f"{diff:+.4g} [{dlow:+.4g}, {dhigh:+.4g}] at equal {e['compared_at']} ({e['fix_direction']} is better)")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
