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
# the fix is compared with the baseline (the last step, or the baseline's number of completions sampled).
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
]


def organism_results(name: str, results: Path = RESULTS) -> dict:
    path = results / f"organism_{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python experiments/organisms.py {name}")
    return json.loads(path.read_text())


def entries(results: Path = RESULTS) -> list[dict]:
    """Every entry of :data:`PHENOMENA` computed from the stored organism results in ``results``."""
    out = []
    for spec in PHENOMENA:
        spec = dict(spec)
        result = organism_results(spec.pop("organism"), results)
        out.append(phenomenon(result, **spec, script="experiments/organisms.py"))
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
