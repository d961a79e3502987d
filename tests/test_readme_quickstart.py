"""The README's code runs as written: its Quickstart block and its DPO block (with fewer steps), and every
``rlbook`` command it shows parses."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlbook.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def code_blocks(language: str, section: str) -> list[str]:
    """The ```language blocks of the README's section whose heading starts with ``section``."""
    text = README.read_text()
    start = re.search(rf"^#+ {re.escape(section)}.*$", text, flags=re.M)
    assert start, f"the README has no section {section!r}"
    rest = text[start.end():]
    following = re.search(r"^#{1,3} ", rest, flags=re.M)
    body = rest[:following.start()] if following else rest
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)


def shrunk(code: str, **replacements: str) -> str:
    """``code`` with each ``old=new`` text replaced; each must occur exactly once, so that a changed README fails
    here instead of running a long job."""
    for old, new in replacements.items():
        assert code.count(old) == 1, f"expected {old!r} once in the README block:\n{code}"
        code = code.replace(old, new)
    return code


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_quickstart_runs_as_written_with_three_steps(tmp_path):
    (code,) = code_blocks("python", "Quickstart")
    code = shrunk(code, **{"max_steps=100": "max_steps=3"})
    done = run_python(code + "\nprint('loaded', type(model).__name__)\n", tmp_path)
    assert re.search(r"reward \d\.\d\d -> \d\.\d\d, held-out accuracy \d\.\d\d", done.stdout), done.stdout
    assert "loaded LlamaForCausalLM" in done.stdout
    assert (tmp_path / "runs" / "quickstart" / "curves.png").stat().st_size > 0
    assert (tmp_path / "runs" / "quickstart" / "checkpoint-100" / "model.safetensors").is_file()


def test_the_dpo_example_runs_as_written_with_two_steps(tmp_path):
    blocks = [b for b in code_blocks("python", "Train from a terminal") if "train_dpo" in b]
    assert len(blocks) == 1, blocks
    code = shrunk(blocks[0], **{"1000, seed=0": "16, seed=0", "max_steps=100": "max_steps=2"})
    done = run_python(code + "\nprint('steps', len(history), sorted(history[-1]))\n", tmp_path)
    assert "steps 2" in done.stdout and "rewards/margins" in done.stdout


def readme_commands() -> list[list[str]]:
    """The arguments of every ``rlbook`` command in the README's bash blocks (comments and ``--help`` aside)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split("#")[0])
            if words and words[0].endswith("/rlbook") or words[:3] == ["python", "-m", "rlbook"]:
                args = words[1:] if words[0].endswith("/rlbook") else words[3:]
                if "--help" not in args:
                    commands.append(args)
            elif "-m" in words and "rlbook" in words and words[0].endswith("torchrun"):
                commands.append(words[words.index("rlbook") + 1:])
    return commands


def test_readme_lists_train_plot_and_export_commands():
    used = {args[0] for args in readme_commands()}
    assert {"train", "plot", "export"} <= used, used


@pytest.mark.parametrize("args", readme_commands(), ids=lambda args: " ".join(args)[:60])
def test_every_rlbook_command_of_the_readme_parses(args):
    parsed = build_parser().parse_args(args)
    if parsed.command == "train":
        from rlbook.checkpoints import RECIPES
        from rlbook.presets import PRESETS

        assert parsed.algo in PRESETS and parsed.task in RECIPES
