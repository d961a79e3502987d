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

    python experiments/head_to_head.py --seeds 5 --processes 2     # experiments/results/head_to_head.json
    python experiments/head_to_head.py --memory                     # adds the memory pass to the stored file
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

RESULTS = Path(__file__).parent / "results" / "head_to_head.json"
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
LOGGED = ("accuracy", "reward", "entropy", "completions/mean_length", "num_completions", "approx_kl",
          "time/generate", "time/score", "time/update")
STEP_TIME = ("time/generate", "time/score", "time/update")


def arm_for(algorithm: str, organism: str) -> Arm | dict:
    """The arm of ``algorithm`` on ``organism``: the organism's task setting added, VAPO's alpha rescaled (a DPO
    arm, a dict, as it is)."""
    spec, arm = SETTINGS[organism], ALGORITHMS[algorithm]
    if isinstance(arm, dict):
        return arm
    overrides = dict(arm.overrides)
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
    """One run of ``algorithm`` on ``organism`` (``settings`` and ``evaluation`` shorten it in the tests)."""
    if isinstance(arm, dict):
        return run_dpo(seed, organism=organism, rpo_alpha=arm["rpo_alpha"], evaluation=evaluation, **settings)
    spec = SETTINGS[organism]
    held_out, pretraining = _evaluation(organism, evaluation), PretrainingCost()
    record = train_run(spec["policy"], arm_for(algorithm, organism), seed, callbacks=[held_out, pretraining],
                       logged=LOGGED, **{**spec["settings"], **settings})
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

    def on_train_begin(self, trainer):
        rounds = trainer.value_pretrain_history
        self.samples = len(rounds) * trainer.config.generation_batch_size
        self.seconds = sum(m["time/pretrain"] for m in rounds)


def run_dpo(seed: int, *, organism: str, rpo_alpha: float | None = None, evaluation: dict | None = None,
            **settings) -> dict:
    """Iterated DPO on the policy's own samples: rounds of :data:`DPO_ROUND` (the reference is the policy at the
    round's start) until the RL arms' sample budget is spent; held-out evaluations as the RL arms'."""
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

    # what HeldOutEvaluation reads off a trainer
    view = SimpleNamespace(policy=policy, tokenizer=tokenizer, task=task, step=0, history=[],
                           config=SimpleNamespace(max_completion_length=budget_tokens, temperature=1.0))
    rows = []
    start = time.perf_counter()
    held_out.on_train_begin(view)
    for r in range(rounds):
        timer = time.perf_counter()
        rng = np.random.default_rng([seed, r])
        examples = task.sample(DPO_ROUND["prompts"], seed=rng, split="train")
        pairs = on_policy_pairs(policy, tokenizer, task, examples, num_generations=DPO_ROUND["num_generations"],
                                max_new_tokens=budget_tokens, seed=1000 * seed + r, rng=rng)
        if pairs:
            config = DPOConfig(beta=DPO_ROUND["beta"], learning_rate=common["learning_rate"],
                               per_device_train_batch_size=DPO_ROUND["batch"], max_steps=DPO_ROUND["steps"],
                               rpo_alpha=rpo_alpha, seed=1000 * seed + r)
            history = train_dpo(policy, tokenizer, pairs, config=config)
        view.step += DPO_ROUND["steps"]
        view.history.append({"num_completions": round_samples})
        rows.append({"num_pairs": len(pairs), "loss": round(history[-1]["loss"], 6) if pairs else None,
                     "seconds": round(time.perf_counter() - timer, 3)})
        if (eval_rounds and (r + 1) % eval_rounds == 0) or r == rounds - 1:
            held_out.measure(view)
    for e in held_out.records:
        e["samples"] = e["num_completions"]
        e["seconds"] = round(sum(row["seconds"] for row in rows[: e["step"] // DPO_ROUND["steps"]]), 3)
    return {"evals": held_out.records, "rounds": rows, "pretrain": {"samples": 0},
            "config": {"algorithm": "dpo", **DPO_ROUND, "rpo_alpha": rpo_alpha, "rounds": rounds,
                       "learning_rate": common["learning_rate"], "max_completion_length": budget_tokens},
            "seconds": round(time.perf_counter() - start, 1)}


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

    algorithm, organism = job
    torch.set_num_threads(1)
    spec = SETTINGS[organism]
    recipe = RECIPES[spec["policy"]]
    policy, tokenizer = load_base_policy(spec["policy"])
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current resident size
    before = _rss_mib("VmRSS")
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    if isinstance(ALGORITHMS[algorithm], dict):
        from rlbook.dpo import DPOConfig, on_policy_pairs, train_dpo

        task = recipe.make_task(**spec["task_kwargs"])
        budget = spec["settings"].get("max_completion_length", recipe.sft.max_new_tokens)
        examples = task.sample(DPO_ROUND["prompts"], seed=np.random.default_rng(0), split="train")
        pairs = on_policy_pairs(policy, tokenizer, task, examples, num_generations=DPO_ROUND["num_generations"],
                                max_new_tokens=budget, seed=0)
        train_dpo(policy, tokenizer, pairs, config=DPOConfig(
            max_steps=steps, beta=DPO_ROUND["beta"], per_device_train_batch_size=DPO_ROUND["batch"],
            rpo_alpha=ALGORITHMS[algorithm]["rpo_alpha"]))
        models = {"policy": count(policy), "reference (its log-probs, then dropped)": count(policy)}
    else:
        arm = arm_for(algorithm, organism)
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
    return {"algorithm": algorithm, "organism": organism, "steps": steps,
            "peak_added_mib": round(_rss_mib("VmHWM") - before, 1), "models": models}


def run_memory(organisms=tuple(SETTINGS), algorithms=tuple(ALGORITHMS), processes: int = 2, steps: int = 3) -> list:
    """:func:`memory_one` for every pair, each in a fresh process (spawned, one task per process)."""
    jobs = [(a, o) for o in organisms for a in algorithms]
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
    parser.add_argument("--organisms", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=None, help="pilot: fewer steps")
    parser.add_argument("--num-prompts", type=int, default=None, help="pilot: fewer held-out prompts")
    parser.add_argument("--memory", action="store_true", help="run the memory pass and add it to --out")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.memory:
        memory = run_memory(args.organisms, args.algorithms, processes=args.processes or 2)
        for row in memory:
            print(f"{row['organism']:<17} {row['algorithm']:<12} +{row['peak_added_mib']:7.1f} MiB  {row['models']}")
        stored = json.loads(args.out.read_text())
        stored["memory"] = {"rows": memory, "provenance": provenance(arguments={**vars(args), "out": str(args.out)},
                                                                      processes=args.processes or 2)}
        args.out.write_text(json.dumps(stored, indent=1) + "\n")
        print(f"added the memory pass to {args.out}")
        return
    settings = {"max_steps": args.max_steps} if args.max_steps else {}
    evaluation = {"num_prompts": args.num_prompts} if args.num_prompts else None
    run(args.organisms, args.algorithms, range(args.seeds), out=args.out, processes=args.processes,
        arguments={**vars(args), "out": str(args.out)}, evaluation=evaluation, **settings)


if __name__ == "__main__":
    main()
