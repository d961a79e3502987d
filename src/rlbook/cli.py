"""``rlbook train``: one algorithm of the book on one task, from a terminal.

    rlbook train --algo grpo --task arithmetic --max-steps 100 --seed 0 --output-dir runs/grpo
    rlbook train --algo dapo --task sort_scratchpad --max-steps 200 --output-dir runs/dapo --set learning_rate=3e-4
    rlbook train ... --output-dir runs/dapo --resume          # continue from the last checkpoint in runs/dapo
    rlbook convert-checkpoint runs/old --trust                # rewrite a trusted checkpoint of an older format
    torchrun --nproc_per_node 2 -m rlbook train --algo grpo --task arithmetic --max-steps 100 --output-dir runs/g

It starts from the task's shipped base policy (``--model-size`` builds a fresh, untrained model of that size
instead), shows a progress bar, appends one JSON object per step (``step`` and the metrics of
:data:`rlbook.metrics.METRICS`) to ``DIR/metrics.jsonl``, and saves a checkpoint ``DIR/checkpoint-<step>`` every
``--save-steps`` steps and at the end (only the newest ``--save-total-limit`` of them are kept).
Bad input gets one line on stderr and exit status 2, never a traceback.

Nothing is lost if the process is killed (``kill -9``, a lost machine): checkpoints are written to a
temporary folder and renamed into place when complete (:mod:`rlbook.files`), so ``--resume`` always
finds a loadable one. It falls back to the previous checkpoint if the newest cannot be read, drops
the metrics logged after the checkpoint (and a last line cut mid-write), and continues exactly as
the uninterrupted run would have. A checkpoint that cannot be written (a full disk) stops the run
with one line on stderr and exit status 1; the previous checkpoints are intact.

A checkpoint is data, never code (:mod:`rlbook.files`): ``--resume`` reads ``trainer_state.pt`` with
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
                    "policy.",
        epilog=f"presets: {', '.join(PRESETS)}\ntasks (shipped base policies): {', '.join(RECIPES)}\n"
               f"--set takes any RLConfig field (python -c 'import rlbook.presets as p; help(p.RLConfig)').",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--algo", required=True, metavar="PRESET", help=f"one of: {', '.join(PRESETS)}")
    train.add_argument("--task", required=True, metavar="NAME", help=f"one of: {', '.join(RECIPES)}")
    train.add_argument("--model-size", metavar="SIZE", default=None,
                       help=f"a fresh, untrained model of this size ({', '.join(MODEL_SIZES)}) instead of the "
                            "task's base policy")
    train.add_argument("--max-steps", type=int, required=True, metavar="N")
    train.add_argument("--seed", type=int, default=0, metavar="S")
    train.add_argument("--output-dir", required=True, type=Path, metavar="DIR")
    train.add_argument("--save-steps", type=int, default=None, metavar="K",
                       help="save a checkpoint every K steps (always at the end)")
    train.add_argument("--save-total-limit", type=int, default=None, metavar="K",
                       help="keep only the newest K checkpoints (TRL's save_total_limit)")
    train.add_argument("--resume", action="store_true", help="continue the run in DIR from its last checkpoint")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                       help="override one RLConfig field, e.g. --set learning_rate=3e-4 (repeatable)")
    train.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
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
    from rlbook.files import atomic_write_text, list_checkpoints, remove_leftovers
    from rlbook.lm import MODEL_SIZES
    from rlbook.presets import PRESETS, preset
    from rlbook.trainer import Trainer

    if args.algo not in PRESETS:
        raise UsageError(f"unknown preset {args.algo!r}; choose one of: {', '.join(PRESETS)}")
    if args.task not in RECIPES:
        raise UsageError(f"unknown task {args.task!r}; choose one of: {', '.join(RECIPES)}")
    if args.model_size is not None and args.model_size not in MODEL_SIZES:
        raise UsageError(f"unknown model size {args.model_size!r}; choose one of: {', '.join(MODEL_SIZES)}")
    if args.max_steps < 1 or (args.save_steps is not None and args.save_steps < 1):
        raise UsageError(f"--max-steps and --save-steps must be >= 1, got {args.max_steps} and {args.save_steps}")
    if args.save_total_limit is not None and args.save_total_limit < 1:
        raise UsageError(f"--save-total-limit must be >= 1, got {args.save_total_limit}")
    recipe = RECIPES[args.task]
    overrides = parse_overrides(args.overrides)
    try:
        config = preset(args.algo, **{"max_completion_length": recipe.sft.max_new_tokens, **overrides},
                        max_steps=args.max_steps, seed=args.seed)
    except (TypeError, ValueError) as error:
        raise UsageError(f"bad configuration: {error}") from None

    out = args.output_dir
    run = {"algo": args.algo, "task": args.task, "model_size": args.model_size, "seed": args.seed,
           "overrides": overrides, "config": dataclasses.asdict(config)}
    checkpoints = list_checkpoints(out)  # complete ones only: temporary folders are not listed
    if args.resume:
        if not checkpoints and not (out / "run.json").is_file():
            raise UsageError(f"--resume: {out} holds no checkpoint-<step> folder to resume from")
        if not (out / "run.json").is_file():
            raise UsageError(f"--resume: {out} has checkpoints but no run.json: it was not written by rlbook train")
        stored = json.loads((out / "run.json").read_text())
        mismatch = sorted(k for k in ("algo", "task", "model_size", "seed")
                          if stored[k] != run[k]) + sorted(
            k for k in run["config"] if k != "max_steps" and stored["config"].get(k) != run["config"][k])
        if mismatch:
            raise UsageError(f"--resume: the run in {out} was made with other settings (differs in {mismatch})")
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
        out.mkdir(parents=True, exist_ok=True)
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
    saver = CheckpointSaver(out, args.save_steps or args.max_steps, keep_last=args.save_total_limit)
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
    ``run.json`` (:func:`rlbook.files.convert_checkpoint`)."""
    from rlbook.files import STATE_FILE, convert_checkpoint, list_checkpoints

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
                         "(in Python, call rlbook.files.convert_checkpoint(path, policy, tokenizer))")
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


def resume_from_newest_readable(trainer, checkpoints: list[Path], out: Path) -> None:
    """Load the newest of ``checkpoints`` that can be read into ``trainer``, warning on stderr about
    each one skipped; with no checkpoint at all (a run killed before its first save) it starts from
    step 0."""
    from rlbook.files import CheckpointError

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
    from rlbook.files import atomic_write_text

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
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # a checkpoint that cannot be written or read: one line, exit 1
        from rlbook.files import CheckpointError

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
