"""What the engine tests (tests/test_engines_verl.py, tests/test_engines_openrlhf.py) share: the configs they check,
the engine's release installed without its dependencies, the shell that reads a pasted command, a small batch of
log-probs to compare losses on, and the check that the chapter shows exactly the tested commands."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlbook.integrations.engines import engine_markdown
from rlbook.presets import PRESETS, preset

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "part6" / "beyond_one_machine.ipynb"

# configs beyond the presets, for the branches no preset reaches: KL in the reward with an adaptive controller and
# critic warm-up; dynamic sampling alone (without DAPO's reward manager in verl); GSPO-token; a grpo loss over two
# micro-batches; the entropy methods the engines have (a fixed entropy bonus, verl's Clip-Cov and KL-Cov)
EXTRA = {
    "ppo+adaptive_kl+warmup": dict(name="ppo", value_pretrain_steps=5, beta=0.05, adaptive_kl_target=6.0),
    "trl_grpo+dynamic_sampling": dict(name="trl_grpo", dynamic_sampling=True),
    "gspo+sequence_token": dict(name="gspo", importance_sampling_level="sequence_token"),
    "grpo+accumulation": dict(name="grpo", gradient_accumulation_steps=2, steps_per_generation=2),
    # a band and a share wide enough that the small test batch has tokens to cut
    "dapo+clip_cov+entropy": dict(name="dapo", dynamic_sampling=False, covariance_method="clip_cov", clip_cov_lb=0.0,
                                  clip_cov_ratio=0.1, entropy_coef=0.01),
    "grpo+kl_cov": dict(name="grpo", covariance_method="kl_cov"),
    "luspo": dict(name="gspo", loss_type="luspo"),  # TRL 1.16's LUSPO: GSPO's sequence ratio, token sums
}
CONFIGS = {**{name: preset(name) for name in PRESETS},
           **{key: preset(**settings) for key, settings in EXTRA.items()}}


def install_release(name: str, version: str) -> Path:
    """``pip install --no-deps name==version`` into ``<venv>/engine-wheels/name-version`` (once: reused when there);
    skips the test with pip's last line when pip cannot install it (no package index)."""
    folder = Path(sys.prefix) / "engine-wheels" / f"{name}-{version}"
    if (folder / ".complete").exists():
        return folder
    staging = folder.with_name(f"{folder.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--no-compile", "--retries", "1", "--timeout", "30", "--target", str(staging),
                           f"{name}=={version}"],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        last = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()][-1:]
        pytest.skip(f"pip could not install {name}=={version}: {last[0] if last else done.returncode}")
    (staging / ".complete").touch()
    try:
        staging.rename(folder)
    except OSError:  # another worker installed it first
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def pasted_argv(command: str) -> list[str]:
    """The arguments ``python3`` gets when ``command`` is pasted into bash (``-eu``: an unset variable fails)."""
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    script = "python3() { printf '%s\\0' CALL \"$@\"; }\n" + command + "\n"
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eu", "-c", script], capture_output=True, text=True,
                          env={"HOME": "/home/reader", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, timeout=60)
    assert done.returncode == 0, f"bash rejects the command: {done.stderr}"
    words = done.stdout.split("\0")[:-1]
    assert words.count("CALL") == 1 and words[0] == "CALL", "the command must call python3 exactly once"
    return words[1:]


def small_batch(c, lengths, seed=0):
    """Log-probs of completions of ``lengths`` tokens (ragged), one token with ratio e^2.5 in a completion of
    negative advantage (verl's default dual clip, c = 3, would cut it), and the reference's log-probs."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    B, T = len(lengths), int(lengths.max())
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -2 * torch.rand(B, T, generator=g)
    delta = (1e-3 if c.importance_sampling_level != "token" else 0.3) * torch.randn(B, T, generator=g)
    delta[0, 0] = 2.5
    advantages = torch.randn(B, generator=g)
    advantages[0] = -abs(advantages[0]) - 0.5
    if c.advantage_estimator == "gae":
        advantages = torch.randn(B, T, generator=g)
        advantages[0, 0] = -1.0
    return old, (old + delta).requires_grad_(), old + 0.2 * torch.randn(B, T, generator=g), advantages, mask


def assert_the_chapter_shows_exactly(engine_run):
    """Every command ``engine_run`` (``verl_run``, ``openrlhf_run``) prints for a preset is in
    ``engine_markdown()``, and the chapter's stored output is that Markdown."""
    markdown = engine_markdown()
    for name in PRESETS:
        run = engine_run(preset(name))
        if run.command is not None:
            assert f"```bash\n{run.command}\n```" in markdown, name
    nb = json.loads(CHAPTER.read_text(encoding="utf-8"))
    shown = ["".join(out["data"]["text/markdown"]) for cell in nb["cells"] if cell["cell_type"] == "code"
             for out in cell.get("outputs", []) if "text/markdown" in out.get("data", {})]
    assert markdown in shown, "the chapter's engine commands are not engine_markdown(): rerun the chapter"
