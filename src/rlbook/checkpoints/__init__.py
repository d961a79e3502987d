"""The base (reference) policies the book starts RL from, shipped inside the package, and how to rebuild them.

Each checkpoint is a tiny causal LM fine-tuned by :func:`rlbook.sft.train_sft` on one task until its sampled
accuracy first reaches a target, so that RL has headroom. Load one with::

    from rlbook.checkpoints import load_base_policy
    model, tokenizer = load_base_policy("arithmetic")

Rebuild them (bit for bit on the same kind of machine: training runs on one CPU thread, seeded)::

    python -m rlbook.checkpoints build            # rewrite the shipped files
    python -m rlbook.checkpoints verify           # rebuild into a temporary folder and compare file hashes
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import transformers

from rlbook.lm import build_model, build_tokenizer, count_parameters, load_policy, save_policy
from rlbook.sft import SFTConfig, sampled_accuracy, train_sft
from rlbook.tasks import get_task

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Recipe:
    """How one base policy is made: the task, the model, and the SFT settings."""

    task: str
    task_kwargs: dict = field(default_factory=dict)
    size: str = "tiny"
    arch: str = "llama"
    model_seed: int = 0
    sft: SFTConfig = field(default_factory=SFTConfig)
    final_eval_size: int = 512  # prompts for the accuracy recorded in the manifest (one sample each, T = 1)

    def make_task(self):
        """The :class:`rlbook.tasks.Task` this policy was trained on."""
        return get_task(self.task, **self.task_kwargs)


def final_sampled_accuracy(recipe: Recipe, model, tokenizer) -> float:
    """The accuracy recorded in a manifest: ``final_eval_size`` fixed prompts, one sample each at temperature 1."""
    task = recipe.make_task()
    examples = task.sample(recipe.final_eval_size, seed=np.random.default_rng(10_000 + recipe.sft.seed))
    return sampled_accuracy(model, tokenizer, task, examples, recipe.sft.max_new_tokens, seed=10_000)


RECIPES: dict[str, Recipe] = {
    "arithmetic": Recipe(
        task="arithmetic",
        task_kwargs={"num_digits": 2, "operations": "+"},
        sft=SFTConfig(max_steps=3000, eval_every=50, stop_at_accuracy=0.45, max_new_tokens=8, seed=0),
    ),
    "sort_scratchpad": Recipe(
        task="sort_digits",
        task_kwargs={"min_length": 3, "max_length": 6, "scratchpad": True},
        sft=SFTConfig(max_steps=3000, eval_every=25, stop_at_accuracy=0.45, max_new_tokens=40, seed=0),
    ),
    "constraint_string": Recipe(
        task="constraint_string",
        sft=SFTConfig(max_steps=3000, eval_every=50, stop_at_accuracy=0.45, max_new_tokens=16, seed=0),
    ),
}


def checkpoint_dir(name: str) -> Path:
    """The folder of a shipped checkpoint inside the installed package."""
    if name not in RECIPES:
        raise ValueError(f"unknown base policy {name!r}; choose one of {sorted(RECIPES)}")
    return Path(str(resources.files("rlbook.checkpoints") / name))


def load_base_policy(name: str, device=None):
    """``(model, tokenizer)`` of the shipped base policy ``name`` (see :data:`RECIPES`), in eval mode."""
    path = checkpoint_dir(name)
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"checkpoint {name!r} is missing from {path}; run `python -m rlbook.checkpoints build`")
    return load_policy(path, device=device if device is not None else "cpu")


def load_manifest(name: str) -> dict:
    """What was recorded when checkpoint ``name`` was built: recipe, steps, accuracies, file hashes."""
    return json.loads((checkpoint_dir(name) / MANIFEST).read_text())


def build_checkpoint(name: str, out_dir: str | Path) -> dict:
    """Train base policy ``name`` from its recipe and save it in ``out_dir``; returns the manifest it writes."""
    recipe = RECIPES[name]
    out_dir = Path(out_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # float reductions in a fixed order: the same bytes on every run
    try:
        tokenizer = build_tokenizer()
        model = build_model(recipe.size, arch=recipe.arch, seed=recipe.model_seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.sft.seed)
            history = train_sft(model, tokenizer, recipe.make_task(), recipe.sft)
            final_accuracy = final_sampled_accuracy(recipe, model, tokenizer)
    finally:
        torch.set_num_threads(threads)
    save_policy(model, tokenizer, out_dir)
    manifest = {
        "name": name,
        "recipe": asdict(recipe),
        "parameters": count_parameters(model),
        "sft_steps": history.steps,
        "sft_final_loss": history.losses[-1],
        "eval_steps": history.eval_steps,
        "eval_accuracy": history.eval_accuracy,
        "final_sampled_accuracy": final_accuracy,
        "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__},
        "sha256": file_hashes(out_dir),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def file_hashes(folder: str | Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` except the manifest, by file name."""
    folder = Path(folder)
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != MANIFEST
    }
