"""The head-to-head (Chapter "The head-to-head"): every language-model algorithm of the book on the same three
organisms, at equal budgets in samples and in wall time, on paired seeds.

The organisms (:data:`SETTINGS`) are three of the book's settings, each with one completion budget, learning rate
and number of completions per step shared by every algorithm:

- ``short``: 2-digit sums from the arithmetic policy, 0/1 rewards, answers of a few tokens (the book's default
  scale, where most failures of Part IV do not show);
- ``length_inflation``: sorting 3-6 digits with a scratchpad, ±1 rewards, room to grow to 64 tokens (the organism
  of Dr. GRPO's chapter, where GRPO's wrong answers grow longer);
- ``many_answers``: a string of given length and letter counts, many right answers per prompt, ±1 rewards (the
  organism of DAPO's clip-higher, here with each algorithm's own number of updates per rollout).

The algorithms (:data:`ALGORITHMS`) are the presets as shipped, with only what equal budgets need: every one
samples 64 completions per step (GSPO's four minibatches are 16 each; GFPO samples 16 per prompt for 4 prompts
and keeps 8 of each group), VAPO's length-adaptive lambda is rescaled to the organism's answer lengths and its
value pretraining shortened to 10 rounds (counted in its samples and seconds), and DPO learns in rounds from the
policy's own samples (128 prompts x 8 samples, one right over one wrong per prompt, 16 steps of 32 pairs: one
optimiser step per 64 completions, like the others). DAPO's dynamic sampling draws more completions per step than
the others; every comparison at equal samples reads its curve at the others' budget.

Each run is evaluated at the start, every ``eval_every`` steps and at the end on 1,024 held-out prompts x 4
samples (the same prompts and sampling stream for every run: paired), and each evaluation records the samples
(``samples``, value pretraining included) and the training seconds (``seconds``, evaluations excluded) spent so
far, so that accuracy can be read at equal samples and at equal wall time. A second pass (``--memory``) runs three
training steps of every algorithm in a fresh process each and records the peak resident memory that training
added and the models it held.

    python experiments/head_to_head.py --seeds 5 --processes 2     # exploratory/head_to_head_shared_rate.json
    python experiments/head_to_head.py --memory                     # adds the memory pass to the stored file

That first run is exploratory: every algorithm at one shared learning rate (3e-4), no plan. The fair comparison
(:func:`run_tuning`, :func:`run_confirmation`) gives every algorithm the same tuning budget on validation prompts
(four learning rates, and one update per rollout for the recipes that make several, three seeds), selects each
one's setting by a rule fixed in its plan, then trains it on fresh seeds and tests it on the test prompts::

    python experiments/head_to_head.py --phase tuning --plan experiments/plans/head_to_head_tuning.md
    python experiments/head_to_head.py --phase confirmation --plan experiments/plans/head_to_head.md
    python experiments/head_to_head.py --phase confirmation --memory    # peak memory at the selected settings
    python experiments/head_to_head.py --phase verdicts                 # experiments/results/head_to_head_verdicts.json

Both can be made in parts (``--organisms``, ``--algorithms``): what the results file holds already is skipped.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from rlbook.callbacks import TrainerCallback
from rlbook.evaluation import HeldOutEvaluation
from rlbook.experiment import Arm, provenance, run_experiment, train_run
from rlbook.stats import mean_interval

RESULTS = Path(__file__).parent / "results" / "head_to_head.json"  # the fair comparison's confirmation
SHARED_RATE_RESULTS = Path(__file__).parent / "results" / "exploratory" / "head_to_head_shared_rate.json"
BATCH = 64  # completions sampled per step by every algorithm
EVALUATION = dict(num_prompts=1024, num_samples=4)
VALUE_PRETRAIN_STEPS = 10  # VAPO's value pretraining rounds (the paper: 50), counted in its samples and seconds
DPO_ROUND = dict(prompts=128, num_generations=8, steps=16, batch=32, beta=0.5)  # 1,024 completions, 16 steps

# organism -> the base policy, the task setting, the trainer settings every algorithm shares, VAPO's alpha (lambda
# 1 - 1/(alpha l) about 0.98 at the organism's typical answer length l: alpha = 50 / l, the rescaling of the
# long_chain organism) and the steps between held-out evaluations
SETTINGS = {
    "short": dict(policy="arithmetic", task_kwargs={},
                  settings=dict(learning_rate=3e-4, max_steps=150, per_device_train_batch_size=BATCH),
                  vapo_alpha=14.0, eval_every=25,
                  description="2-digit sums, 0/1 rewards, answers of about 4 tokens"),
    "length_inflation": dict(policy="sort_scratchpad", task_kwargs={"incorrect_reward": -1.0},
                             settings=dict(max_completion_length=64, learning_rate=3e-4, max_steps=100,
                                           per_device_train_batch_size=BATCH),
                             vapo_alpha=2.0, eval_every=25,
                             description="sort 3-6 digits with a scratchpad, ±1 rewards, room to grow to 64 tokens "
                                         "(about 25 at the start)"),
    "many_answers": dict(policy="constraint_string", task_kwargs={"incorrect_reward": -1.0},
                         settings=dict(learning_rate=3e-4, max_steps=150, per_device_train_batch_size=BATCH),
                         vapo_alpha=6.0, eval_every=25,
                         description="a string of given length and letter counts (many right answers), ±1 rewards, "
                                     "answers of about 8 tokens"),
}

# algorithm -> its arm (the preset plus what equal budgets need); "dpo" is trained by run_dpo
ALGORITHMS = {
    "reinforce": Arm("reinforce"),
    "rloo": Arm("rloo"),
    "ppo": Arm("ppo"),
    # PPO for RLHF's regulariser, the KL penalty in the reward (TRL's PPO default kl_coef 0.05); the reward is the
    # task's rule here, not a learned reward model (that is the GAPO chapter's frozen_judge organism)
    "ppo_kl": Arm("ppo", beta=0.05),
    "vapo": Arm("vapo", value_pretrain_steps=VALUE_PRETRAIN_STEPS),  # lam_alpha set per organism (run_one)
    # iterated DPO on the policy's own pairs (run_dpo), as in the DPO chapter (beta 0.5), with and without the NLL
    # of the chosen answers (rpo_alpha 1), the chapter's remedy for the fall of on-policy DPO
    "dpo": {"algorithm": "dpo", "rpo_alpha": None},
    "dpo_nll": {"algorithm": "dpo", "rpo_alpha": 1.0},
    "grpo": Arm("grpo"),
    "dr_grpo": Arm("dr_grpo"),
    "dapo": Arm("dapo"),
    "gmpo": Arm("gmpo"),
    "gspo": Arm("gspo", per_device_train_batch_size=BATCH // 4),
    "gfpo": Arm("gfpo"),
    "lambda_grpo": Arm("lambda_grpo"),
}
# the fair comparison's arms: every algorithm above, TRL's default GRPO (what a practitioner would pick instead) and
# the two soft-clip losses of Part VII at TRL's settings (as on the sampler-mismatch organism)
FAIR_ALGORITHMS = {**ALGORITHMS, "trl_grpo": Arm("trl_grpo"),
                   "cispo": Arm("grpo", beta=0.0, loss_type="cispo", epsilon_high=5.0),
                   "sapo": Arm("grpo", beta=0.0, loss_type="sapo")}
LOGGED = ("accuracy", "reward", "entropy", "completions/mean_length", "num_completions", "approx_kl",
          "time/generate", "time/score", "time/update")
STEP_TIME = ("time/generate", "time/score", "time/update")


def arm_for(algorithm: str, organism: str, **overrides) -> Arm | dict:
    """The arm of ``algorithm`` (of :data:`FAIR_ALGORITHMS`) on ``organism``: the organism's task setting added,
    VAPO's alpha rescaled, then ``overrides`` (a DPO arm is a dict: ``overrides`` update it)."""
    spec, arm = SETTINGS[organism], FAIR_ALGORITHMS[algorithm]
    if isinstance(arm, dict):
        return {**arm, **overrides}
    overrides = {**arm.overrides, **overrides}
    if algorithm == "vapo":
        overrides["lam_alpha"] = spec["vapo_alpha"]
    return Arm(arm.preset, task_kwargs={**spec["task_kwargs"], **arm.task_kwargs}, **overrides)


class TimedEvaluation(HeldOutEvaluation):
    """:class:`rlbook.evaluation.HeldOutEvaluation` whose records also hold ``cpu_seconds``: this process's CPU time
    since the callback was made (model loading, value pretraining and training), evaluations excluded. With one
    torch thread it is the wall time the run would take on an idle core, whatever else the machine ran."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cpu_start, self.cpu_in_evaluations = time.process_time(), 0.0

    def measure(self, trainer) -> dict:
        now = time.process_time()
        record = super().measure(trainer)
        record["cpu_seconds"] = round(now - self.cpu_start - self.cpu_in_evaluations, 3)
        self.cpu_in_evaluations += time.process_time() - now
        return record


def _evaluation(organism: str, evaluation: dict | None):
    spec = SETTINGS[organism]
    sizes = {**EVALUATION, "every": spec["eval_every"], **(evaluation or {})}
    return TimedEvaluation(**sizes, ks=(1, sizes["num_samples"]))


def run_one(algorithm: str, arm: Arm, seed: int, *, organism: str, evaluation: dict | None = None,
            **settings) -> dict:
    """One run of ``arm`` (``algorithm``'s, :func:`arm_for`) on ``organism`` (``settings`` and ``evaluation``
    shorten it in the tests). A run the trainer stops because a loss or gradient is not finite is recorded with
    ``"diverged"`` (the error) and the evaluations made before it, instead of ending the whole experiment."""
    if isinstance(arm, dict):
        return run_dpo(seed, organism=organism, rpo_alpha=arm["rpo_alpha"], evaluation=evaluation,
                       steps=arm.get("steps", DPO_ROUND["steps"]), **settings)
    spec = SETTINGS[organism]
    held_out, pretraining = _evaluation(organism, evaluation), PretrainingCost()
    try:
        record = train_run(spec["policy"], arm, seed, callbacks=[held_out, pretraining], logged=LOGGED,
                           **{**spec["settings"], **settings})
    except ValueError as error:
        if "is not finite" not in str(error):
            raise
        record = {"diverged": str(error), "metrics": {k: [] for k in STEP_TIME}}
    # the cost so far at each evaluation: completions sampled and training seconds, value pretraining included
    step_seconds = np.sum([[t or 0.0 for t in record["metrics"][k]] for k in STEP_TIME], axis=0)
    for e in held_out.records:
        e["samples"] = e["num_completions"] + pretraining.samples
        e["seconds"] = round(pretraining.seconds + float(step_seconds[: e["step"]].sum()), 3)
    record["evals"] = held_out.records
    record["pretrain"] = {"samples": pretraining.samples, "seconds": round(pretraining.seconds, 3)}
    return record


class PretrainingCost(TrainerCallback):
    """The completions and seconds the trainer's value pretraining spent (0 for a run without it)."""

    samples, seconds = 0, 0.0

    def on_train_begin(self, trainer):
        rounds = trainer.value_pretrain_history
        self.samples = len(rounds) * trainer.config.generation_batch_size
        self.seconds = sum(m["time/pretrain"] for m in rounds)


def run_dpo(seed: int, *, organism: str, rpo_alpha: float | None = None, evaluation: dict | None = None,
            steps: int = DPO_ROUND["steps"], **settings) -> dict:
    """Iterated DPO on the policy's own samples: rounds of :data:`DPO_ROUND` (the reference is the policy at the
    round's start; ``steps`` optimiser steps per round) until the RL arms' sample budget is spent; held-out
    evaluations as the RL arms'. The pairs' prompts come from ``settings["train_split"]`` (default "train")."""
    import torch

    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.dpo import DPOConfig, on_policy_pairs, train_dpo

    torch.set_num_threads(1)
    spec = SETTINGS[organism]
    common = {**spec["settings"], **settings}
    recipe = RECIPES[spec["policy"]]
    task = recipe.make_task(**spec["task_kwargs"])
    held_out = _evaluation(organism, evaluation)  # its CPU clock starts before the policy is loaded, as train_run's
    policy, tokenizer = load_base_policy(spec["policy"])
    budget_tokens = common.get("max_completion_length", recipe.sft.max_new_tokens)
    round_samples = DPO_ROUND["prompts"] * DPO_ROUND["num_generations"]
    rounds = math.ceil(common["max_steps"] * BATCH / round_samples)
    eval_rounds = max(1, round(held_out.every * BATCH / round_samples)) if held_out.every else 0
    # an RL step's evaluation points as rounds: the round whose samples come nearest the step's
    at_rounds = {min(rounds, max(1, round(s * BATCH / round_samples))) - 1 for s in held_out.at_steps}

    # what HeldOutEvaluation reads off a trainer
    view = SimpleNamespace(policy=policy, tokenizer=tokenizer, task=task, step=0, history=[],
                           config=SimpleNamespace(max_completion_length=budget_tokens, temperature=1.0))
    rows = []
    start = time.perf_counter()
    held_out.on_train_begin(view)
    for r in range(rounds):
        timer = time.perf_counter()
        rng = np.random.default_rng([seed, r])
        examples = task.sample(DPO_ROUND["prompts"], seed=rng, split=common.get("train_split", "train"))
        pairs = on_policy_pairs(policy, tokenizer, task, examples, num_generations=DPO_ROUND["num_generations"],
                                max_new_tokens=budget_tokens, seed=1000 * seed + r, rng=rng)
        if pairs:
            config = DPOConfig(beta=DPO_ROUND["beta"], learning_rate=common["learning_rate"],
                               per_device_train_batch_size=DPO_ROUND["batch"], max_steps=steps,
                               rpo_alpha=rpo_alpha, seed=1000 * seed + r)
            history = train_dpo(policy, tokenizer, pairs, config=config)
        view.step += steps
        view.history.append({"num_completions": round_samples})
        rows.append({"num_pairs": len(pairs), "loss": round(history[-1]["loss"], 6) if pairs else None,
                     "seconds": round(time.perf_counter() - timer, 3)})
        if (eval_rounds and (r + 1) % eval_rounds == 0) or r in at_rounds or r == rounds - 1:
            held_out.measure(view)
    for e in held_out.records:
        e["samples"] = e["num_completions"]
        e["seconds"] = round(sum(row["seconds"] for row in rows[: e["step"] // steps]), 3)
    return {"evals": held_out.records, "rounds": rows, "pretrain": {"samples": 0},
            "config": {"algorithm": "dpo", **DPO_ROUND, "steps": steps, "rpo_alpha": rpo_alpha, "rounds": rounds,
                       "learning_rate": common["learning_rate"], "max_completion_length": budget_tokens},
            "seconds": round(time.perf_counter() - start, 1)}


# --- the fair comparison: the same tuning for every arm on validation prompts, then fresh seeds on test prompts ---
# (experiments/plans/head_to_head_tuning.md and head_to_head.md; the shared-rate run above is exploratory)

LEARNING_RATES = (3e-5, 1e-4, 3e-4, 1e-3)
# the recipes that update more than once per rollout, and what makes them update once: PPO's 4 epochs, GSPO's 4
# minibatches of 16 (one batch of 64 instead), DPO's 16 steps of 32 pairs per round of at most 128 pairs (4)
ONE_UPDATE = {"ppo": {"num_iterations": 1}, "ppo_kl": {"num_iterations": 1},
              "gspo": {"per_device_train_batch_size": BATCH, "steps_per_generation": 1},
              "dpo": {"steps": 4}, "dpo_nll": {"steps": 4}}
TRAIN_SPLIT = "train_without_validation"  # the problems outside both the validation and the test prompts
TUNING_SEEDS = (200, 201, 202)
TUNING_EVALUATION = dict(num_prompts=512, num_samples=2, split="validation")  # at 0, 1/4, 1/2, 3/4 and all steps
CONFIRMATION_SEEDS = tuple(range(300, 312))
CONFIRMATION_EVERY = 50  # steps between test evaluations (1,024 prompts x 4 samples, as the shared-rate run's)
TUNING_RESULTS = RESULTS.with_name("head_to_head_tuning.json")
SELECTION_DIGITS = 3  # validation scores equal to 3 decimals are a tie: the smaller rate, then one update, wins


def tuning_grid(algorithm: str) -> list[dict]:
    """Every setting the tuning tries for ``algorithm``: each learning rate, and for a recipe that updates more
    than once per rollout each rate again with one update."""
    ones = (False, True) if algorithm in ONE_UPDATE else (False,)
    return [{"learning_rate": lr, "one_update": one} for lr in LEARNING_RATES for one in ones]


def setting_name(organism: str, algorithm: str, setting: dict | None = None) -> str:
    """``short/grpo`` (a confirmation arm), or ``short/grpo/lr=0.0003`` and ``.../one_update`` (a tuning arm)."""
    if setting is None:
        return f"{organism}/{algorithm}"
    return f"{organism}/{algorithm}/lr={setting['learning_rate']:g}" + "/one_update" * setting["one_update"]


def tuning_arms(organisms=tuple(SETTINGS), algorithms=tuple(FAIR_ALGORITHMS)) -> dict[str, dict]:
    return {setting_name(o, a, s): {"organism": o, "algorithm": a, **s}
            for o in organisms for a in algorithms for s in tuning_grid(a)}


def run_setting(name: str, arm: dict, seed: int, *, phase: str, evaluation: dict | None = None, **settings) -> dict:
    """One run of a fair-comparison arm ``{"organism", "algorithm", "learning_rate", "one_update"}``, trained on
    :data:`TRAIN_SPLIT`: in the ``"tuning"`` phase evaluated on validation prompts (:data:`TUNING_EVALUATION`, at
    five points), in the ``"confirmation"`` phase on the test prompts (every :data:`CONFIRMATION_EVERY` steps)."""
    if phase not in ("tuning", "confirmation"):
        raise ValueError(f"phase must be 'tuning' or 'confirmation', got {phase!r}")
    organism, algorithm = arm["organism"], arm["algorithm"]
    spec = SETTINGS[organism]
    steps = settings.get("max_steps", spec["settings"]["max_steps"])
    quarters = sorted({max(1, round(steps * k / 4)) for k in (1, 2, 3)} - {steps})  # and the end, always
    sizes = ({**TUNING_EVALUATION, "every": 0, "at_steps": quarters} if phase == "tuning" else
             {"split": "test", "every": CONFIRMATION_EVERY})
    overrides = ONE_UPDATE[algorithm] if arm["one_update"] else {}
    return run_one(algorithm, arm_for(algorithm, organism, **overrides), seed, organism=organism,
                   evaluation={**sizes, **(evaluation or {})},
                   **{**settings, "learning_rate": arm["learning_rate"], "train_split": TRAIN_SPLIT})


def validation_score(record: dict) -> float:
    """A tuning run's score: its mean validation expected accuracy over its last two evaluations (NaN for a run
    that diverged: its setting is not eligible)."""
    if record.get("diverged"):
        return float("nan")
    return float(np.mean([e["expected_accuracy"] for e in record["evals"][-2:]]))


def select(tuning: dict) -> dict[str, dict]:
    """The setting each organism's algorithm is confirmed at, by the plan's rule: the highest
    mean over the tuning seeds of :func:`validation_score`; scores equal to
    :data:`SELECTION_DIGITS` decimals are a tie, won by the smaller learning rate, then by one
    update. A setting with a diverged seed is not eligible.
    ``{"short/grpo": {"learning_rate", "one_update", "score"}}``."""
    scores: dict[str, list] = {}
    for name, arm in tuning["arms"].items():
        score = float(np.mean([validation_score(r) for r in tuning["runs"][name]]))
        candidates = scores.setdefault(setting_name(arm["organism"], arm["algorithm"]), [])
        if np.isfinite(score):
            candidates.append((score, arm))
    chosen = {}
    for key, candidates in scores.items():
        if not candidates:
            raise ValueError(f"{key}: every setting diverged in a tuning seed; nothing to confirm")
        best = max(round(score, SELECTION_DIGITS) for score, _ in candidates)
        tied = [(arm["learning_rate"], not arm["one_update"], score, arm)
                for score, arm in candidates if round(score, SELECTION_DIGITS) == best]
        lr, _, score, arm = min(tied, key=lambda t: t[:2])
        chosen[key] = {"learning_rate": lr, "one_update": arm["one_update"],
                       "score": round(score, 6)}
    return chosen


def _run_phase(name: str, phase: str, arms: dict, seeds, *, out, stored_evaluation: dict, plan, processes,
               arguments, progress, description: str, summary: dict, extra: dict | None = None,
               evaluation: dict | None = None, **settings) -> dict:
    """One phase of the fair comparison as one flat experiment (:func:`rlbook.experiment.run_experiment`): the
    ``arms`` that ``out`` does not hold yet, each run by :func:`run_setting` in ``phase``, merged into ``out``;
    ``settings`` are shared by every run (the tests' shorter runs) and stored in ``common`` with the evaluation."""
    arms = _not_stored(arms, out)
    if not arms:
        return json.loads(Path(out).read_text())
    return run_experiment(
        name, functools.partial(run_setting, phase=phase, evaluation=evaluation, **settings), arms, seeds,
        out=out, merge=True, plan=plan, processes=processes, arguments=arguments, progress=progress,
        steps_per_run=functools.partial(_steps_per_run, max_steps=settings.get("max_steps")),
        checkpoints=sorted({spec["policy"] for spec in SETTINGS.values()}),
        common={"batch": BATCH, "train_split": TRAIN_SPLIT, "evaluation": stored_evaluation, **settings},
        extra=extra, description=description, summary=summary)


def _not_stored(arms: dict, out) -> dict:
    """``arms`` without those ``out`` holds already (a phase made in parts resumes where it stopped)."""
    if out is None or not Path(out).exists():
        return arms
    done = json.loads(Path(out).read_text())["runs"]
    left = {name: arm for name, arm in arms.items() if name not in done}
    if not left:
        print(f"{out}: every arm asked for is stored")
    return left


def _steps_per_run(name: str, arm: dict, max_steps: int | None = None) -> int:
    """The steps a progress bar counts for one run (0 for DPO, whose rounds do not report steps)."""
    return 0 if arm["algorithm"].startswith("dpo") else max_steps or SETTINGS[arm["organism"]]["settings"]["max_steps"]


def run_tuning(organisms=tuple(SETTINGS), algorithms=tuple(FAIR_ALGORITHMS), seeds=TUNING_SEEDS, *,
               out=TUNING_RESULTS, plan=None, processes=None, arguments=None, progress=True,
               evaluation: dict | None = None, **settings) -> dict:
    """The tuning phase for the given organisms and algorithms (a part of the plan's grid; settings already stored
    in ``out`` are skipped, so a stopped tuning resumes where it stopped): one flat experiment whose arms are
    named by :func:`setting_name`, merged into ``out``."""
    return _run_phase(
        "head_to_head_tuning", "tuning", tuning_arms(organisms, algorithms), seeds, out=out, plan=plan,
        processes=processes, arguments=arguments, progress=progress, evaluation=evaluation,
        stored_evaluation=TUNING_EVALUATION,
        description="every algorithm at every learning rate (and one update per rollout), on validation prompts",
        summary={"validation score": validation_score}, **settings)


def run_confirmation(tuning_path=TUNING_RESULTS, seeds=CONFIRMATION_SEEDS, *, organisms=tuple(SETTINGS),
                     algorithms=tuple(FAIR_ALGORITHMS), out=RESULTS, plan=None, processes=None, arguments=None,
                     progress=True, evaluation: dict | None = None, **settings) -> dict:
    """The confirmation phase: each organism's algorithm at its :func:`select`-ed setting on ``seeds`` (none of the
    tuning's), evaluated on the test prompts; merged into ``out`` so that it can be made in parts. The stored file
    records the selection and the tuning file it came from (path and SHA-256)."""
    from rlbook.plans import sha256

    tuning_path = Path(tuning_path)
    data = tuning_path.read_bytes()
    tuning = json.loads(data)
    reused = sorted(set(seeds) & set(tuning["seeds"]))
    if reused:
        raise ValueError(f"confirmation seeds {reused} were used in the tuning: confirm on fresh seeds")
    selected = select(tuning)
    try:
        where = tuning_path.resolve().relative_to(Path(__file__).resolve().parents[1]).as_posix()
    except ValueError:
        where = tuning_path.name
    source = {"path": where, "sha256": sha256(data)}
    if out is not None and Path(out).exists() and json.loads(Path(out).read_text()).get("tuning") != source:
        raise ValueError(f"{out} was confirmed from another tuning file than {tuning_path}: its selection differs")
    arms = {setting_name(o, a): {"organism": o, "algorithm": a,
                                 **{k: selected[setting_name(o, a)][k] for k in ("learning_rate", "one_update")}}
            for o in organisms for a in algorithms}
    return _run_phase(
        "head_to_head", "confirmation", arms, seeds, out=out, plan=plan, processes=processes, arguments=arguments,
        progress=progress, evaluation=evaluation, stored_evaluation=EVALUATION,
        extra={"selected": selected, "tuning": source},
        description="each algorithm at its selected setting, on fresh seeds and the test prompts",
        summary={"accuracy end": lambda r: r["evals"][-1]["expected_accuracy"]}, **settings)


# --- the verdicts: the plan's rules (experiments/plans/head_to_head.md) applied to the confirmation's results ---

BASELINE = "trl_grpo"  # the default a recommendation would replace (TRL's GRPOConfig as shipped)
MARGIN = 0.03  # a "no worse" promise: the accuracy interval must lie above -MARGIN
MEMORY_RATIO = 0.9  # "less memory": peak memory at most this share of the other method's
VERDICTS_RESULTS = RESULTS.with_name("head_to_head_verdicts.json")
LI = "length_inflation"
NOT_TESTABLE = {
    "vapo": "its defining condition, long chains where a critic's credit assignment matters, is missing from the "
            "three organisms (answers of 4 to 64 tokens)",
    "dpo": "no organism has an offline preference dataset: DPO here learns from its own sampled pairs",
    "gspo": "no organism of the three is a mixture of experts",
    "gapo": "it needs a learned judge, which the three organisms do not have",
}


def at_equal_samples(result: dict, organism: str, algorithm: str, metric: str = "expected_accuracy") -> np.ndarray:
    """One value per seed of ``metric`` at the organism's sample budget (steps x :data:`BATCH`), interpolated
    between evaluations; a diverged run's last evaluation is carried forward to the budget."""
    from rlbook.stats import metric_at_budget

    budget = (result["common"].get("max_steps") or SETTINGS[organism]["settings"]["max_steps"]) * BATCH
    runs = []
    for run in result["runs"][setting_name(organism, algorithm)]:
        evals = run["evals"]
        if run.get("diverged") and evals and evals[-1]["samples"] < budget:
            evals = [*evals, {**evals[-1], "samples": budget}]
        runs.append({**run, "evals": evals})
    return metric_at_budget(runs, metric, budget, axis="samples")


def _start(result: dict, organism: str, algorithm: str, metric: str) -> np.ndarray:
    return np.array([run["evals"][0][metric] for run in result["runs"][setting_name(organism, algorithm)]])


def verdict_tests(result: dict) -> tuple[dict, dict]:
    """The thirteen paired comparisons the verdicts rest on, ``{name: per-seed differences}``, and each one's null
    (0, or -MARGIN for "no worse")."""
    acc = functools.partial(at_equal_samples, result)
    tests, nulls = {}, {}
    for organism in SETTINGS:  # 1. PPO for RLHF
        tests[f"ppo/{organism}/accuracy"] = acc(organism, "ppo_kl") - acc(organism, BASELINE)
    for algorithm in ("grpo", "gmpo"):  # 4. GRPO or GMPO instead of PPO, memory tight
        tests[f"{algorithm}/accuracy"] = acc(LI, algorithm) - acc(LI, "ppo")
        nulls[f"{algorithm}/accuracy"] = -MARGIN
    # 6. GFPO: did the length grow under the default, then shorter at no accuracy loss?
    tests["gfpo/condition"] = acc(LI, BASELINE, "mean_length") - _start(result, LI, BASELINE, "mean_length")
    tests["gfpo/length"] = acc(LI, "gfpo", "mean_length") - acc(LI, BASELINE, "mean_length")
    tests["gfpo/accuracy"] = acc(LI, "gfpo") - acc(LI, BASELINE)
    nulls["gfpo/accuracy"] = -MARGIN
    # 8. Dr. GRPO or lambda-GRPO against GRPO's per-completion mean: did its wrong answers grow, then shorter?
    tests["dr_grpo/condition"] = acc(LI, "grpo", "mean_length_wrong") - _start(result, LI, "grpo", "mean_length_wrong")
    for algorithm in ("dr_grpo", "lambda_grpo"):
        tests[f"{algorithm}/length"] = acc(LI, algorithm, "mean_length_wrong") - acc(LI, "grpo", "mean_length_wrong")
        tests[f"{algorithm}/accuracy"] = acc(LI, algorithm) - acc(LI, "grpo")
        nulls[f"{algorithm}/accuracy"] = -MARGIN
    return tests, nulls


def _side(test: dict) -> int:
    """+1 when the adjusted interval lies above its null, -1 below, 0 when it holds it."""
    return 1 if test["low"] > test["null"] else -1 if test["high"] < test["null"] else 0


def _entry(row: str, verdict: str, arm: str, compared_with: str, metric: str, test: dict | None, rule: str,
           **more) -> dict:
    numbers = ({"difference": [test["mean"], test["plain_low"], test["plain_high"]],
                "adjusted": [test["low"], test["high"]], "null": test["null"]} if test else
               {"difference": None, "adjusted": None})
    return {"row": row, "verdict": verdict, "arm": arm, "compared_with": compared_with, "metric": metric,
            **numbers, "rule": rule, **more}


def verdicts(result: dict, memory: dict | None = None) -> list[dict]:
    """The plan's eight recommendations judged on the confirmation ``result`` (``memory``: peak MiB added per
    algorithm on length inflation, from the memory pass), Holm over the thirteen tests. One entry per row and
    arm, in the file's layout (``difference``: mean and unadjusted 95 % interval; ``adjusted``: Holm's)."""
    from rlbook.stats import holm_intervals

    tests, nulls = verdict_tests(result)
    held = holm_intervals(tests, nulls)
    for name, test in held.items():  # the unadjusted 95 % interval beside Holm's
        _, test["plain_low"], test["plain_high"] = mean_interval(tests[name])
    out = []
    # 1. PPO: better accuracy on some organism and worse on none
    sides = {o: _side(held[f"ppo/{o}/accuracy"]) for o in SETTINGS}
    verdict = ("supported" if max(sides.values()) > 0 and min(sides.values()) == 0 else
               "contradicted" if min(sides.values()) < 0 and max(sides.values()) == 0 else "not supported")
    decisive = min(SETTINGS, key=lambda o: held[f"ppo/{o}/accuracy"]["p"])
    out.append(_entry("ppo", verdict, "ppo_kl", BASELINE, f"expected accuracy at equal samples ({decisive})",
                      held[f"ppo/{decisive}/accuracy"], "better on some organism, worse on none (Holm)",
                      others={o: [held[f"ppo/{o}/accuracy"][k] for k in ("mean", "low", "high")]
                              for o in SETTINGS}))
    for row in ("vapo", "dpo"):
        out.append(_entry(row, "not testable here", row, BASELINE, "expected accuracy at equal samples", None,
                          NOT_TESTABLE[row]))
    # 4. GRPO or GMPO: less memory than PPO at no accuracy loss beyond the margin
    for algorithm in ("grpo", "gmpo"):
        if memory is None or algorithm not in memory or "ppo" not in memory:
            raise ValueError("the memory pass is missing: run head_to_head.py --phase confirmation --memory first")
        ratio = memory[algorithm] / memory["ppo"]
        side = _side(held[f"{algorithm}/accuracy"])
        verdict = ("supported" if ratio <= MEMORY_RATIO and side > 0 else
                   "contradicted" if ratio > 1 or side < 0 else "not supported")
        out.append(_entry("grpo_gmpo", verdict, algorithm, "ppo", "expected accuracy at equal samples "
                          "(length inflation)", held[f"{algorithm}/accuracy"],
                          f"peak memory at most {MEMORY_RATIO} x PPO's and accuracy above -{MARGIN} (Holm)",
                          memory_ratio=round(ratio, 4)))
    out.append(_entry("gspo", "not testable here", "gspo", BASELINE, "expected accuracy at equal samples", None,
                      NOT_TESTABLE["gspo"]))
    # 6. GFPO and 8. Dr. GRPO / lambda-GRPO: shorter at no accuracy loss beyond the margin, if the failure appeared
    out += _length_rows(held, "gfpo", ("gfpo",), BASELINE, "mean length (length inflation)")
    out.append(_entry("gapo", "not testable here", "gapo", BASELINE, "expected accuracy", None,
                      NOT_TESTABLE["gapo"]))
    out += _length_rows(held, "dr_grpo", ("dr_grpo", "lambda_grpo"), "grpo",
                        "mean length of wrong answers (length inflation)")
    return out


def verdict_memory(result: dict) -> dict[str, float]:
    """``{algorithm: peak MiB added}`` on length inflation, from the confirmation's memory pass: what
    :func:`verdicts` reads for the memory promise (row 4)."""
    if "memory" not in result:
        raise ValueError("the memory pass is missing: run head_to_head.py --phase confirmation --memory first")
    return {row["algorithm"]: row["peak_added_mib"] for row in result["memory"]["rows"] if row["organism"] == LI}


def verdict_agrees(entry: dict) -> bool:
    """Whether a verdict agrees with its numbers: "supported" or "contradicted" only on a resolved difference
    (the adjusted interval excludes its null), or, for "contradicted", on the rule's other grounds (accuracy
    below -MARGIN for a length promise, more memory than PPO for the memory promise)."""
    if entry["verdict"] not in ("supported", "contradicted") or entry["adjusted"] is None:
        return True
    low, high = entry["adjusted"]
    resolved = not low <= entry["null"] <= high
    if entry["verdict"] == "contradicted" and "accuracy" in entry and "accuracy" not in entry["metric"]:
        resolved = resolved or entry["accuracy"][2] < -MARGIN  # longer, or accuracy below the margin
    if entry["verdict"] == "contradicted" and "memory_ratio" in entry:
        resolved = resolved or entry["memory_ratio"] > 1  # more memory than PPO
    return resolved


def _length_rows(held: dict, row: str, arms, compared_with: str, metric: str) -> list[dict]:
    """A length promise's rows: not testable where ``compared_with``'s length did not grow (its condition),
    else supported (shorter, accuracy above -MARGIN), contradicted (longer, or below -MARGIN) or not supported."""
    condition, out = held[f"{row}/condition"], []
    for algorithm in arms:
        length, accuracy = held[f"{algorithm}/length"], held[f"{algorithm}/accuracy"]
        if _side(condition) <= 0:
            out.append(_entry(row, "not testable here", algorithm, compared_with, f"{compared_with}'s growth in "
                              f"{metric}", condition, f"the failure did not appear under {compared_with} (its "
                              f"growth's adjusted interval is not above 0)"))
            continue
        verdict = ("supported" if _side(length) < 0 and _side(accuracy) > 0 else
                   "contradicted" if _side(length) > 0 or _side(accuracy) < 0 else "not supported")
        out.append(_entry(row, verdict, algorithm, compared_with, metric, length,
                          f"shorter, and accuracy above -{MARGIN} (Holm)",
                          accuracy=[accuracy[k] for k in ("mean", "low", "high")],
                          condition=[condition[k] for k in ("mean", "low", "high")]))
    return out


# --- peak memory and the models held, one fresh process per algorithm and organism -----------------------------


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise OSError(f"no {field} in /proc/self/status")


def memory_one(job: tuple[str, str], steps: int = 3) -> dict:
    """Peak resident memory that ``steps`` training steps of one algorithm add on one organism (Linux: the peak is
    reset after the policy is loaded, /proc/self/clear_refs), and the models the run holds with their parameters."""
    import torch

    from rlbook.checkpoints import RECIPES, load_base_policy
    from rlbook.presets import preset
    from rlbook.trainer import Trainer

    algorithm, organism, *rest = job  # (algorithm, organism[, overrides]): overrides at a selected setting
    overrides = rest[0] if rest else {}
    torch.set_num_threads(1)
    spec = SETTINGS[organism]
    recipe = RECIPES[spec["policy"]]
    policy, tokenizer = load_base_policy(spec["policy"])
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current resident size
    before = _rss_mib("VmRSS")
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    if isinstance(FAIR_ALGORITHMS[algorithm], dict):
        from rlbook.dpo import DPOConfig, on_policy_pairs, train_dpo

        task = recipe.make_task(**spec["task_kwargs"])
        budget = spec["settings"].get("max_completion_length", recipe.sft.max_new_tokens)
        examples = task.sample(DPO_ROUND["prompts"], seed=np.random.default_rng(0), split="train")
        pairs = on_policy_pairs(policy, tokenizer, task, examples, num_generations=DPO_ROUND["num_generations"],
                                max_new_tokens=budget, seed=0)
        train_dpo(policy, tokenizer, pairs, config=DPOConfig(
            max_steps=steps, beta=DPO_ROUND["beta"], per_device_train_batch_size=DPO_ROUND["batch"],
            rpo_alpha=FAIR_ALGORITHMS[algorithm]["rpo_alpha"]))
        models = {"policy": count(policy), "reference (its log-probs, then dropped)": count(policy)}
    else:
        arm = arm_for(algorithm, organism, **overrides)
        config = preset(arm.preset, **{"max_completion_length": recipe.sft.max_new_tokens, **spec["settings"],
                                       **arm.overrides, "max_steps": steps, "value_pretrain_steps": 0})
        task = recipe.make_task(**arm.task_kwargs)
        trainer = Trainer(policy, tokenizer, task, config)
        trainer.train(progress=False)
        models = {"policy": count(policy)}
        if trainer.reference is not None:
            models["reference"] = count(trainer.reference)
        if trainer.value_model is not None:
            models["value model"] = count(trainer.value_model)
    return {"algorithm": algorithm, "organism": organism, "steps": steps, **({"overrides": overrides} if rest else {}),
            "peak_added_mib": round(_rss_mib("VmHWM") - before, 1), "models": models}


def run_memory(organisms=tuple(SETTINGS), algorithms=tuple(ALGORITHMS), processes: int = 2, steps: int = 3,
               selected: dict | None = None) -> list:
    """:func:`memory_one` for every pair, each in a fresh process (spawned, one task per process); with
    ``selected`` (a confirmation's selection), each algorithm at its selected number of updates."""
    jobs = [(a, o) if selected is None else
            (a, o, ONE_UPDATE[a] if selected[setting_name(o, a)]["one_update"] else {})
            for o in organisms for a in algorithms]
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes, maxtasksperchild=1) as pool:
        return pool.map(functools.partial(memory_one, steps=steps), jobs, chunksize=1)


# --- the experiment -----------------------------------------------------------------------------------------------


def run(organisms=tuple(SETTINGS), algorithms=tuple(ALGORITHMS), seeds=range(5), *, out=None, processes=None,
        arguments=None, evaluation: dict | None = None, progress: bool = True, **settings) -> dict:
    """Every algorithm on every organism for ``seeds``: one stored file, ``{"organisms": {name: result}}``, each
    result in the harness's layout (``settings`` and ``evaluation`` shorten the runs in the tests)."""
    results = {}
    for organism in organisms:
        spec = SETTINGS[organism]
        common = {**spec["settings"], **settings}
        arms = {a: arm_for(a, organism) for a in algorithms}
        steps = lambda name, arm, n=common["max_steps"]: 0 if isinstance(arm, dict) else n  # noqa: E731
        results[organism] = run_experiment(
            f"head_to_head_{organism}", functools.partial(run_one, organism=organism, evaluation=evaluation,
                                                          **settings),
            arms, seeds, common=common, processes=processes, steps_per_run=steps, progress=progress,
            checkpoints=[spec["policy"]], description=spec["description"],
            extra={"policy": spec["policy"], "task_kwargs": spec["task_kwargs"], "vapo_alpha": spec["vapo_alpha"],
                   "eval_every": spec["eval_every"], "evaluation": {**EVALUATION, **(evaluation or {})},
                   "dpo_round": DPO_ROUND},
            summary={"accuracy end": lambda r: r["evals"][-1]["expected_accuracy"],
                     "seconds end": lambda r: r["evals"][-1]["seconds"]})
    stored = {"experiment": "head_to_head", "description": __doc__.splitlines()[0], "batch": BATCH,
              "organisms": results, "provenance": provenance(arguments=arguments, processes=processes or 0)}
    if out is not None:
        out = Path(out)
        if out.exists():  # keep a stored memory pass
            old = json.loads(out.read_text())
            if "memory" in old:
                stored["memory"] = old["memory"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(stored, indent=1) + "\n")
        print(f"wrote {out}")
    return stored


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("shared_rate", "tuning", "confirmation", "verdicts"),
                        default="shared_rate", help="the exploratory shared-rate run (default), the fair "
                        "comparison's two phases, or its verdicts from the stored confirmation")
    parser.add_argument("--organisms", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--algorithms", nargs="+", default=None, choices=list(FAIR_ALGORITHMS),
                        help="default: every algorithm of the phase")
    parser.add_argument("--seeds", type=int, default=5, help="the shared-rate run's seeds (0 ..)")
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=None, help="pilot: fewer steps")
    parser.add_argument("--num-prompts", type=int, default=None, help="pilot: fewer held-out prompts")
    parser.add_argument("--memory", action="store_true", help="run the memory pass and add it to --out")
    parser.add_argument("--plan", type=Path, default=None, help="the committed plan of a fair-comparison phase")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = {"max_steps": args.max_steps} if args.max_steps else {}
    evaluation = {"num_prompts": args.num_prompts} if args.num_prompts else None
    arguments = {**vars(args), "out": str(args.out) if args.out else None,
                 "plan": str(args.plan) if args.plan else None}
    if args.phase == "verdicts":
        stored = json.loads(RESULTS.read_text())
        rows = verdicts(stored, verdict_memory(stored))
        (args.out or VERDICTS_RESULTS).write_text(json.dumps(rows, indent=1) + "\n")
        for row in rows:
            print(f"{row['row']:<10} {row['arm']:<12} {row['verdict']:<18} {row['adjusted']}")
        return
    if args.phase in ("tuning", "confirmation") and not args.memory:
        run_phase = run_tuning if args.phase == "tuning" else run_confirmation
        out = args.out or (TUNING_RESULTS if args.phase == "tuning" else RESULTS)
        run_phase(organisms=args.organisms, algorithms=args.algorithms or list(FAIR_ALGORITHMS), out=out,
                  plan=args.plan, processes=args.processes, arguments=arguments, evaluation=evaluation, **settings)
        return
    out = args.out or (RESULTS if args.phase == "confirmation" else SHARED_RATE_RESULTS)
    algorithms = args.algorithms or list(ALGORITHMS if args.phase == "shared_rate" else FAIR_ALGORITHMS)
    if args.memory:  # the confirmation's at each algorithm's selected setting
        selected = json.loads(out.read_text())["selected"] if args.phase == "confirmation" else None
        memory = run_memory(args.organisms, algorithms, processes=args.processes or 2, selected=selected)
        for row in memory:
            print(f"{row['organism']:<17} {row['algorithm']:<12} +{row['peak_added_mib']:7.1f} MiB  {row['models']}")
        stored = json.loads(out.read_text())
        stored["memory"] = {"rows": memory, "provenance": provenance(arguments=arguments,
                                                                      processes=args.processes or 2)}
        out.write_text(json.dumps(stored, indent=1) + "\n")
        print(f"added the memory pass to {out}")
        return
    run(args.organisms, algorithms, range(args.seeds), out=out, processes=args.processes, arguments=arguments,
        evaluation=evaluation, **settings)


if __name__ == "__main__":
    main()
