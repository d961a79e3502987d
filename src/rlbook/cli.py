"""``rlbook train``: one algorithm of the book on one task, from a terminal; ``rlbook plot`` and ``rlbook export``
to look at its runs and take their models away.

    rlbook train --algo grpo --task arithmetic --max-steps 100 --seed 0 --output-dir runs/grpo
    rlbook train --algo dapo --task sort_scratchpad --max-steps 200 --output-dir runs/dapo --set learning_rate=3e-4
    rlbook train ... --output-dir runs/dapo --resume          # continue from the last checkpoint in runs/dapo
    rlbook plot runs/grpo runs/dapo --metric reward --metric entropy --out runs/compare.png
    rlbook export runs/grpo                                   # the newest checkpoint's models: runs/grpo/policy-100
    rlbook convert-checkpoint runs/old --trust                # rewrite a trusted checkpoint of an older format
    torchrun --nproc_per_node 2 -m rlbook train --algo grpo --task arithmetic --max-steps 100 --output-dir runs/g

It starts from the task's shipped base policy (``--model-size`` builds a fresh, untrained model of that size
instead), shows a progress bar, appends one JSON object per step (``step``, counted from 1, and the metrics of
:data:`rlbook.metrics.METRICS`) to ``DIR/metrics.jsonl``, and saves a checkpoint ``DIR/checkpoint-<step>`` every
``--save-steps`` steps (default 50) and at the end; only the newest ``--save-total-limit`` of them are kept
(default 3; ``none`` keeps all). A checkpoint is also a Hugging Face model folder (``model.safetensors``,
``config.json``, tokenizer), which ``transformers.AutoModelForCausalLM.from_pretrained`` reads;
``rlbook export`` writes the policy, and the value model where the run trained one, without the trainer's state
(:mod:`rlbook.runs`). Bad input (an unknown name, a bad number, an output folder that is a file, lies below one
or cannot be written) gets one line on stderr and exit status 2, never a traceback.

DPO is not here: it trains on preference pairs with no sampling, no reward and no advantages, so it is not a
setting of the RL loop that ``--algo`` chooses from; its loop is :func:`rlbook.dpo.train_dpo`.

Nothing is lost if the process is killed (``kill -9``, a lost machine): checkpoints are written to a
temporary folder and renamed into place when complete (:mod:`rlbook.checkpointing`), so ``--resume`` always
finds a loadable one. It falls back to the previous checkpoint if the newest cannot be read, drops
the metrics logged after the checkpoint (and a last line cut mid-write), and continues exactly as
the uninterrupted run would have. A checkpoint that cannot be written (a full disk) stops the run
with one line on stderr and exit status 1; the previous checkpoints are intact.

A checkpoint is data, never code (:mod:`rlbook.checkpointing`): ``--resume`` reads ``trainer_state.pt`` with
``torch.load(..., weights_only=True)`` and the policy from ``model.safetensors``, so a run folder someone sent you
cannot run their code. A ``trainer_state.pt`` that holds other objects (a crafted pickle, or numpy scalars of an
older format) stops the run with one line and exit status 2, naming ``rlbook convert-checkpoint DIR --trust``:
that command unpickles the checkpoints of ``DIR`` (a run folder, or one ``checkpoint-<step>`` folder in it) fully,
which runs any code they hold, and rewrites them as data. It refuses to run without ``--trust``.

Under ``torchrun`` every process runs this command: they join a process group (gloo on CPU, NCCL with
``--device cuda``), share each step's groups (:mod:`rlbook.distributed`), and rank 0 alone writes ``DIR``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the models are built from local configs
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage block
        raise UsageError(f"{self.prog}: {message} (see --help)")


class _HelpFormatter(argparse.HelpFormatter):
    """Each line of the description and epilog wrapped on its own (so lists stay lists), and each option's
    default after its help (when it has one that says something: not for required options, flags and empty
    lists)."""

    def _fill_text(self, text, width, indent):
        import textwrap

        return "\n".join(textwrap.fill(line, width, initial_indent=indent,
                                        subsequent_indent=indent + " " * (2 * (len(line) - len(line.lstrip()))))
                         for line in text.splitlines())

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and not action.required and action.default not in (None, False, [])
                and action.default is not argparse.SUPPRESS and "%(default)" not in text):
            text += " (default: %(default)s)"
        return text


DEFAULT_SAVE_STEPS = 50  # a crash loses at most this many steps
DEFAULT_SAVE_TOTAL_LIMIT = 3  # the newest checkpoints kept: enough to fall back on if the newest is damaged
NOT_PRESETS = {  # algorithms of the book that --algo does not run, and where they are
    "dpo": "DPO trains on preference pairs with no sampling, reward or advantages, so it is not a setting of "
           "the RL loop; train it in Python with rlbook.dpo.train_dpo(policy, tokenizer, pairs, "
           "config=rlbook.dpo.DPOConfig(...)) (pairs: rlbook.tasks.build_preference_pairs; see the README)",
    "ipo": "IPO is DPO's loss_type='ipo': rlbook.dpo.train_dpo with DPOConfig(loss_type='ipo') (see the README)",
    "gapo": "GAPO trains an encoder reward model beside the policy in its own loop: rlbook.gapo.train_gapo "
            "(chapter 'GAPO')",
}


def save_total_limit(text: str) -> int | None:
    """``--save-total-limit``'s value: a number, or ``none`` (keep every checkpoint)."""
    if text.strip().lower() in ("none", "all"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    from rlbook.checkpoints import RECIPES
    from rlbook.lm import MODEL_SIZES
    from rlbook.presets import PRESETS

    parser = _Parser(prog="rlbook", description="The package beside the book 'Reinforcement Learning from "
                                                "Q-learning to the GRPO family'.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    train = commands.add_parser(
        "train", help="train a policy with one algorithm of the book",
        description="Train a policy with one preset of rlbook.presets on one task, from the task's shipped base "
                    "policy. Writes DIR/run.json, DIR/metrics.jsonl (one line per step) and DIR/checkpoint-<step> "
                    "folders (each a Hugging Face model folder plus the trainer's state).",
        epilog=f"presets (--algo): {', '.join(PRESETS)}\n"
               f"tasks (--task), each a shipped base policy and the task it was fine-tuned on:\n"
               + "".join(f"  {line}\n" for line in task_lines(RECIPES))
               + "--set takes any RLConfig field (python -c 'import rlbook.presets as p; help(p.RLConfig)').\n"
                 "DPO is trained in Python: rlbook.dpo.train_dpo (it needs preference pairs, not this loop).",
        formatter_class=_HelpFormatter)
    train.add_argument("--algo", required=True, metavar="PRESET", help=f"one of: {', '.join(PRESETS)}")
    train.add_argument("--task", required=True, metavar="NAME", help=f"one of: {', '.join(RECIPES)}")
    train.add_argument("--model-size", metavar="SIZE", default=None,
                       help=f"a fresh, untrained model of this size ({', '.join(MODEL_SIZES)}) instead of the "
                            "task's base policy")
    train.add_argument("--max-steps", type=int, required=True, metavar="N",
                       help="train until step N (with --resume: the run's total, not N more)")
    train.add_argument("--seed", type=int, default=0, metavar="S", help="the run's seed (prompts, sampling, init)")
    train.add_argument("--output-dir", required=True, type=Path, metavar="DIR",
                       help="where run.json, metrics.jsonl and the checkpoints go")
    train.add_argument("--save-steps", type=int, default=DEFAULT_SAVE_STEPS, metavar="K",
                       help="save a checkpoint every K steps, and always at the end")
    train.add_argument("--save-total-limit", type=save_total_limit, default=DEFAULT_SAVE_TOTAL_LIMIT, metavar="K",
                       help="keep only the newest K checkpoints, or 'none' to keep all (TRL's save_total_limit)")
    train.add_argument("--resume", action="store_true", help="continue the run in DIR from its last checkpoint")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                       help="override one RLConfig field, e.g. --set learning_rate=3e-4 (repeatable)")
    train.add_argument("--device", default="cpu", help="cpu or cuda")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    plot = commands.add_parser(
        "plot", help="draw runs side by side, one panel per metric",
        description="Draw the metrics.jsonl of one or more runs side by side in the book's figure style: one panel "
                    "per --metric, one line per run, named by its folder at the line's end.",
        epilog="In Python: rlbook.plot_runs({name: rlbook.read_metrics(DIR), ...}, metrics=[...]).",
        formatter_class=_HelpFormatter)
    plot.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                      help="a folder written by rlbook train (or its metrics.jsonl)")
    plot.add_argument("--metric", action="append", default=None, dest="metrics", metavar="KEY",
                      help="a key of metrics.jsonl, e.g. reward, accuracy, entropy, completions/mean_length, kl "
                           "(repeatable; default: reward)")
    plot.add_argument("--out", type=Path, default=Path("runs.png"), metavar="FILE",
                      help="the figure's file; its suffix (.png, .pdf, .svg) sets the format")
    plot.add_argument("--smooth", type=int, default=1, metavar="K", help="running mean over K steps")
    export = commands.add_parser(
        "export", help="write a run's policy (and value model) as Hugging Face folders",
        description="Write the policy of a run's newest checkpoint (or of one checkpoint-<step> folder) to DIR as "
                    "a Hugging Face model with its tokenizer, which rlbook.lm.load_policy and "
                    "transformers.AutoModelForCausalLM.from_pretrained read, and the value model, where the run "
                    "trained one (PPO, VAPO), to DIR/value_model "
                    "(transformers.AutoModelForTokenClassification.from_pretrained). DIR/export.json says what "
                    "it was made from.",
        formatter_class=_HelpFormatter)
    export.add_argument("path", type=Path, metavar="RUN_DIR",
                        help="a run folder (its newest checkpoint is exported) or one checkpoint-<step> folder")
    export.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where to write it (default: RUN_DIR/policy-<step>)")
    convert = commands.add_parser(
        "convert-checkpoint", help="rewrite trusted checkpoints of an older format as data (unpickles them)",
        description="Rewrite the checkpoints of a run written by `rlbook train` (DIR is the run folder, or one "
                    "checkpoint-<step> folder in it) in the current format: the policy as model.safetensors, the "
                    "rest as tensors and plain Python values that --resume reads without unpickling code. This "
                    "unpickles each trainer_state.pt fully, which runs any code it holds: pass --trust only for "
                    "checkpoints whose author you trust.")
    convert.add_argument("dir", type=Path, metavar="DIR")
    convert.add_argument("--trust", action="store_true",
                         help="I trust whoever made these checkpoints: unpickle them fully (runs their code)")
    return parser


def task_lines(recipes: dict) -> list[str]:
    """One line per base policy for ``--help``: its name, the task of :data:`rlbook.tasks.TASKS` it was
    fine-tuned on and that task's settings (``RECIPES[name].make_task()`` builds it)."""
    lines = []
    for name, recipe in recipes.items():
        settings = ", ".join(f"{k}={v!r}" for k, v in recipe.task_kwargs.items())
        lines.append(f"{name}: task {recipe.task!r}" + (f" ({settings})" if settings else ""))
    return lines


def parse_overrides(items: list[str]) -> dict:
    """``["key=value", ...]`` -> ``{key: value}``, each value converted to its :class:`RLConfig` field's type."""
    from rlbook.presets import check_keys, config_fields

    fields = config_fields()
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE")
        try:
            check_keys({key: None})
        except ValueError as error:
            raise UsageError(f"--set {item}: {error}") from None
        out[key] = _convert(key, text.strip(), str(fields[key].type))
    return out


def _convert(key: str, text: str, annotation: str):
    """``text`` as the type named by ``annotation`` (``"int"``, ``"float | None"``, ``"bool"``, ``"str"``...)."""
    kinds = [part.strip() for part in annotation.split("|")]
    if "None" in kinds and text.lower() in ("none", "null"):
        return None
    kind = next(k for k in kinds if k != "None")
    try:
        if kind == "bool":
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        return text
    except ValueError:
        raise UsageError(f"--set {key}={text}: expected {annotation.replace('None', 'none')}") from None


def train(args) -> int:
    from rlbook.callbacks import CheckpointSaver, MetricsLogger
    from rlbook.checkpoints import RECIPES
    from rlbook.distributed import World, barrier, init_from_env, launched_by_torchrun
    from rlbook.checkpointing import atomic_write_text, list_checkpoints, remove_leftovers
    from rlbook.lm import MODEL_SIZES
    from rlbook.presets import PRESETS, preset
    from rlbook.trainer import Trainer

    if args.algo.lower() in NOT_PRESETS:
        raise UsageError(f"--algo {args.algo}: {NOT_PRESETS[args.algo.lower()]}")
    if args.algo not in PRESETS:
        raise UsageError(f"unknown preset {args.algo!r}; choose one of: {', '.join(PRESETS)}")
    if args.task not in RECIPES:
        raise UsageError(f"unknown task {args.task!r}; choose one of: {', '.join(RECIPES)}")
    if args.model_size is not None and args.model_size not in MODEL_SIZES:
        raise UsageError(f"unknown model size {args.model_size!r}; choose one of: {', '.join(MODEL_SIZES)}")
    if args.max_steps < 1:
        raise UsageError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.save_steps < 1:
        raise UsageError(f"--save-steps must be >= 1, got {args.save_steps}")
    if args.save_total_limit is not None and args.save_total_limit < 1:
        raise UsageError(f"--save-total-limit must be >= 1 (or 'none': keep all), got {args.save_total_limit}")
    recipe = RECIPES[args.task]
    overrides = parse_overrides(args.overrides)
    try:
        config = preset(args.algo, **{"max_completion_length": recipe.sft.max_new_tokens, **overrides},
                        max_steps=args.max_steps, seed=args.seed)
    except (TypeError, ValueError) as error:
        raise UsageError(f"bad configuration: {error}") from None

    out = args.output_dir
    check_output_dir(out, "--output-dir")
    run = {"algo": args.algo, "task": args.task, "model_size": args.model_size, "seed": args.seed,
           "overrides": overrides, "config": dataclasses.asdict(config)}
    checkpoints = list_checkpoints(out)  # complete ones only: temporary folders are not listed
    if args.resume:
        if not checkpoints and not (out / "run.json").is_file():
            raise UsageError(f"--resume: {out} holds no checkpoint-<step> folder to resume from")
        if not (out / "run.json").is_file():
            raise UsageError(f"--resume: {out} has checkpoints but no run.json: it was not written by rlbook train")
        stored = json.loads((out / "run.json").read_text())
        mismatch = resume_mismatch(stored, run)
        if mismatch:
            raise UsageError(f"--resume: the run in {out} was made with other settings {mismatch}")
    elif out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} already holds a run; pass --resume to continue it or choose another --output-dir")

    import torch

    try:
        kind = torch.device(args.device).type
    except RuntimeError:
        raise UsageError(f"--device {args.device!r}: expected cpu or cuda") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible (torch.cuda.is_available() is False"
                         + ("; this torch is a CPU-only build" if torch.version.cuda is None else "") + ")")
    torch.set_num_threads(1)  # the book's tiny models run fastest on one thread
    world, device = init_from_env(args.device) if launched_by_torchrun() else (World(), args.device)
    barrier(world)  # every process has checked DIR before rank 0 writes to it
    if world.is_main:
        make_output_dir(out, "--output-dir")
    model, tokenizer = starting_policy(args.task, args.model_size, args.seed, device)
    try:
        trainer = Trainer(model, tokenizer, recipe.make_task(), config, world=world)
    except ValueError as error:
        raise UsageError(f"bad configuration: {error}") from None
    metrics_path = out / "metrics.jsonl"
    if args.resume:
        resume_from_newest_readable(trainer, checkpoints, out)
        if world.is_main:
            remove_leftovers(out)  # temporary files of a process killed while saving
            truncate_metrics(metrics_path, trainer.step)
            print(f"resumed {out} at step {trainer.step}", file=sys.stderr)
    elif world.is_main:
        run_json = json.dumps({**run, "world_size": world.size}, indent=1) + "\n"
        atomic_write_text(out / "run.json", run_json)
    if world.is_main:
        trainer.callbacks += [MetricsLogger(metrics_path)]
    saver = CheckpointSaver(out, args.save_steps, keep_last=args.save_total_limit)
    trainer.callbacks += [saver]  # saves on rank 0 only
    trainer.train(args.max_steps - trainer.step, progress=not args.no_progress)
    if not (out / f"checkpoint-{trainer.step}").exists():
        saver.save(trainer)
    barrier(world)
    last = trainer.history[-1] if trainer.history else {}
    if world.is_main:
        print(f"done: {trainer.step} steps, reward {last.get('reward', float('nan')):.4g}, "
              f"metrics in {metrics_path}" + (f" ({world.size} processes)" if world.distributed else ""),
              file=sys.stderr)
    return 0


def resume_mismatch(stored: dict, run: dict) -> str:
    """The settings in which ``stored`` (a run's ``run.json``) and ``run`` (this command's) differ, with both
    values (``"(differs in ['learning_rate']); run.json: learning_rate=0.001; this command: ..."``), or ``""``.
    ``max_steps`` may differ: a resumed run may be extended."""
    from rlbook.checkpointing import describe_differences

    top = ("algo", "task", "model_size", "seed")
    before = {**{k: stored[k] for k in top if k in stored}, **stored.get("config", {})}
    now = {**{k: run[k] for k in top}, **run["config"]}
    keys = [k for k in top if before.get(k) != now[k]] + sorted(
        k for k in run["config"] if k != "max_steps" and before.get(k) != now[k])
    return describe_differences(keys, before, now, "run.json", "this command") if keys else ""


def output_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an output folder, in a few words (it is a file, or it lies below one), or None.
    Whether it can be written is known only by trying (:func:`make_output_dir`)."""
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else f"lies below {parent}, which is a file"
    return None


def check_output_dir(path: Path, flag: str) -> None:
    """``UsageError`` naming ``flag`` when ``path`` is a file or lies below one."""
    problem = output_problem(path)
    if problem:
        raise UsageError(f"{flag} {path} {problem}; choose a folder")


def make_output_dir(path: Path, flag: str) -> None:
    """Create the folder ``path`` (and its parents) and check that a file can be created in it: a
    ``UsageError`` naming ``flag`` and the cause (no permission, a read-only file system) otherwise."""
    import tempfile

    check_output_dir(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise UsageError(f"{flag} {path} cannot be written: {error.strerror or error}") from None


def starting_policy(task: str, model_size: str | None, seed: int, device):
    """``(model, tokenizer)`` a run starts from: the task's shipped base policy, or a fresh model of
    ``model_size``."""
    from rlbook.checkpoints import load_base_policy
    from rlbook.lm import build_model, build_tokenizer

    if model_size is None:
        return load_base_policy(task, device=device)
    tokenizer = build_tokenizer()
    return build_model(model_size, seed=seed, tokenizer=tokenizer, device=device), tokenizer


def convert(args) -> int:
    """``rlbook convert-checkpoint DIR --trust``: rewrite the checkpoints of ``DIR`` (a run folder, or one
    ``checkpoint-<step>`` folder in it) in the current format, with the architecture named by the run's
    ``run.json`` (:func:`rlbook.checkpointing.convert_checkpoint`)."""
    from rlbook.checkpointing import STATE_FILE, convert_checkpoint, list_checkpoints

    folder = args.dir
    if not args.trust:
        raise UsageError(f"convert-checkpoint unpickles the checkpoints in {folder}, which runs any code they hold; "
                         "pass --trust if you trust whoever made them")
    one = (folder / STATE_FILE).is_file()
    run_dir, checkpoints = (folder.parent, [folder]) if one else (folder, list_checkpoints(folder))
    if not checkpoints:
        raise UsageError(f"{folder} is neither a checkpoint folder nor a run folder holding checkpoint-<step> folders")
    if not (run_dir / "run.json").is_file():
        raise UsageError(f"{run_dir} has no run.json: convert-checkpoint needs the run folder written by rlbook train "
                         "(in Python, call rlbook.checkpointing.convert_checkpoint(path, policy, tokenizer))")
    try:
        run = json.loads((run_dir / "run.json").read_text())
        model, tokenizer = starting_policy(run["task"], run["model_size"], run["seed"], "cpu")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise UsageError(f"{run_dir / 'run.json'} does not name a task, model size and seed rlbook knows: "
                         f"{error}") from None
    for path in checkpoints:
        try:
            convert_checkpoint(path, model, tokenizer)
        except (TypeError, ValueError) as error:
            raise UsageError(f"could not convert {path}: {error}") from None
        print(f"converted {path}", file=sys.stderr)
    return 0


def plot(args) -> int:
    """``rlbook plot RUN_DIR ... --metric KEY --out FILE``: the runs side by side (:func:`rlbook.plotting.plot_runs`)
    in the book's style, each named by its folder."""
    from rlbook.runs import read_metrics

    metrics = args.metrics or ["reward"]
    if args.smooth < 1:
        raise UsageError(f"--smooth must be >= 1, got {args.smooth}")
    runs = {}
    for folder, label in zip(args.runs, run_labels(args.runs)):
        try:
            runs[label] = read_metrics(folder)
        except (FileNotFoundError, ValueError) as error:
            raise UsageError(str(error)) from None
        if not runs[label]:
            raise UsageError(f"{folder} has no metrics yet: its metrics.jsonl is empty")
    out = args.out
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file name such as {out / 'runs.png'}")

    import matplotlib.pyplot as plt
    from matplotlib.backend_bases import FigureCanvasBase

    from rlbook.plotting import BOOK_RC, plot_runs

    if out.suffix.lstrip(".").lower() not in FigureCanvasBase.get_supported_filetypes():
        raise UsageError(f"--out {out}: unknown figure format {out.suffix or '(no suffix)'!r}; end the name in "
                         + ", ".join(f".{f}" for f in ("png", "pdf", "svg")))
    with plt.rc_context(BOOK_RC):  # the book's figure style (rlbook.plotting.use_book_style), for this figure only
        try:
            fig, _ = plot_runs(runs, metrics, smooth=args.smooth)
        except ValueError as error:
            raise UsageError(str(error)) from None
        try:
            make_output_dir(out.parent, f"--out {out}: its folder")
            fig.savefig(out)
        except OSError as error:
            raise UsageError(f"--out {out} cannot be written: {error.strerror or error}") from None
        finally:
            plt.close(fig)
    print(f"wrote {out}: {', '.join(metrics)} of {len(runs)} run(s)", file=sys.stderr)
    return 0


def run_labels(folders: list[Path]) -> list[str]:
    """A name for each run folder: its own name, or the path as given where two runs share a name (or a
    metrics.jsonl was given: its folder's name)."""
    names = [(f.parent if f.name == "metrics.jsonl" else f).resolve().name or str(f) for f in folders]
    return [name if names.count(name) == 1 else str(folder) for name, folder in zip(names, folders)]


def export(args) -> int:
    """``rlbook export RUN_DIR [--out DIR]``: the newest checkpoint's policy (and value model) as Hugging Face
    folders (:func:`rlbook.runs.export_checkpoint`)."""
    from rlbook.checkpointing import UnsafeCheckpointError
    from rlbook.runs import VALUE_MODEL_DIR, export_checkpoint, newest_checkpoint

    try:
        checkpoint = newest_checkpoint(args.path)
    except FileNotFoundError as error:
        raise UsageError(f"{error} (rlbook train saves one every --save-steps steps and at the end)") from None
    step = checkpoint.name.removeprefix("checkpoint-")
    out = args.out if args.out is not None else checkpoint.parent / (
        f"policy-{step}" if step.isdigit() else f"{checkpoint.name}-policy")
    check_output_dir(out, "--out")
    try:
        export_checkpoint(checkpoint, out)
    except (UnsafeCheckpointError, FileExistsError) as error:
        raise UsageError(str(error)) from None
    except OSError as error:  # no permission, a read-only file system
        raise UsageError(f"--out {out} cannot be written: {error.strerror or error}") from None
    value = f" and its value model ({out / VALUE_MODEL_DIR})" if (out / VALUE_MODEL_DIR).is_dir() else ""
    print(f"exported the policy of {checkpoint} to {out}{value}; load it with rlbook.lm.load_policy({str(out)!r}) "
          f"or transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})", file=sys.stderr)
    return 0


def resume_from_newest_readable(trainer, checkpoints: list[Path], out: Path) -> None:
    """Load the newest of ``checkpoints`` that can be read into ``trainer``, warning on stderr about
    each one skipped; with no checkpoint at all (a run killed before its first save) it starts from
    step 0."""
    from rlbook.checkpointing import CheckpointError

    for path in reversed(checkpoints):
        try:
            trainer.resume(path)
            return
        except ValueError as error:
            raise UsageError(f"--resume: {error}") from None
        except CheckpointError as error:
            print(f"warning: {error}; trying the previous checkpoint", file=sys.stderr)
    if checkpoints:
        raise CheckpointError(f"--resume: none of the {len(checkpoints)} checkpoints in {out} "
                              "can be read")
    print(f"warning: {out} holds no checkpoint yet; starting again from step 0", file=sys.stderr)


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the lines of ``metrics.jsonl`` up to ``step`` (those logged after the checkpoint are
    logged again), dropping a line cut mid-write by a killed process; rewritten atomically."""
    from rlbook.checkpointing import atomic_write_text

    if not path.exists():
        return
    kept, damaged = [], 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            damaged += 1
            continue
        if record["step"] <= step:
            kept.append(line)
    if damaged:
        print(f"warning: dropped {damaged} damaged line(s) of {path}", file=sys.stderr)
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "train":
            return train(args)
        if args.command == "convert-checkpoint":
            return convert(args)
        if args.command == "plot":
            return plot(args)
        if args.command == "export":
            return export(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # a checkpoint that cannot be written or read: one line, exit 1
        from rlbook.checkpointing import CheckpointError

        if not isinstance(error, CheckpointError):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        _leave_process_group()
    return 1


def _leave_process_group() -> None:
    """Leave the torchrun process group, if this process joined one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
