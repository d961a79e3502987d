"""Write the student edition of the chapter notebooks: every solution replaced by a stub.

A solution is everything between a ``{solution-start} <label>`` marker and the next ``{solution-end}`` marker
(see CONTRIBUTING.md), whether the markers sit in their own markdown cells or share one with other text. In the
student edition

- the solution's prose and code are dropped;
- if its code called a checker (``check_<name>(fn)`` from ``rlbook.exercises``), one stub code cell takes its
  place: the solution's imports, each checked function with its signature (as the exercise statement writes it
  where it does, else as the solution defines it), its docstring and the body
  ``raise NotImplementedError("your solution")``, then the checker calls exactly as the solution made them;
- a solution without a checker call (prose only, or code that only illustrates) leaves nothing behind;
- every other cell is kept, with its outputs and execution counts cleared.

Usage::

    python scripts/make_student.py                      # every notebooks/**/*.ipynb -> _build/student/**
    python scripts/make_student.py --out DIR notebooks/part1/mdp.ipynb
    python scripts/make_student.py --source _build/reader   # from the reader copy (what `make student` does)

`make student` builds it from the reader copy (scripts/make_reader.py), so that the student reads glued numbers,
figures with captions and the package's code in place; a stub that is run before it is written stops with one
line, ``ExerciseNotDone: ...`` (see rlbook.exercises._compare).

The script works from the markers, never from cell positions, so it follows the chapters as they change.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "notebooks"
OUT_DIR = ROOT / "_build" / "student"

STUB_BODY = 'raise NotImplementedError("your solution")'
STUB_COMMENT = "# Your solution: replace each `raise NotImplementedError`; the checker call(s) at the end test it."
STUB_KEY = "rlbook_student_stub"  # cell metadata: the label of the exercise whose solution the stub replaces

_START = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\{solution-start\}\s*(?P<label>[^\s`]+)?")
_END = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\{solution-end\}")
_EXERCISE = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\{exercise\}")
_LABEL = re.compile(r"^\s*:label:\s*(?P<label>\S+)")


class MarkerError(ValueError):
    """The solution markers of a notebook do not pair up."""


@dataclass
class Solution:
    label: str | None
    code: list[str] = field(default_factory=list)


def _skip_directive_header(lines: list[str], i: int, fence: str) -> int:
    """Index just past the closing fence of a directive opened (without body) on line ``i``."""
    j = i + 1
    while j < len(lines) and lines[j].strip() != fence:
        if not lines[j].strip().startswith(":") and lines[j].strip():
            raise MarkerError(f"unexpected text inside a solution marker: {lines[j]!r}")
        j += 1
    if j == len(lines):
        raise MarkerError(f"solution marker {lines[i].strip()!r} is not closed by {fence!r}")
    return j + 1


def exercise_statements(nb) -> dict[str, str]:
    """Map each exercise label to the text of its ``{exercise}`` directive."""
    lines = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown").splitlines()
    statements, i = {}, 0
    while i < len(lines):
        match = _EXERCISE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, body, label = match["fence"], [lines[i]], None
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            label = label or (m["label"] if (m := _LABEL.match(lines[i])) else None)
            body.append(lines[i])
            i += 1
        if label:
            statements[label] = "\n".join(body)
    return statements


def _is_checker_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name.startswith("check_")


def _parse(code: str) -> tuple[str, ast.Module | None]:
    """Parse a code cell, with IPython magics and shell escapes blanked out; None if it is not Python."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())
    try:
        return code, ast.parse(code)
    except SyntaxError:
        return code, None


def _signature(name: str, fn: ast.FunctionDef, statement: str) -> str:
    """``name(params)`` as the exercise statement writes it, else as the solution defines it."""
    for match in re.finditer(rf"`{re.escape(name)}\((?P<params>[^`]*)\)`", statement):
        params = " ".join(match["params"].split())
        try:
            ast.parse(f"def {name}({params}):\n    pass\n")
        except SyntaxError:
            continue
        return f"{name}({params})"
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    return f"{name}({ast.unparse(fn.args)}){returns}"


def stub_source(solution: Solution, statement: str) -> str | None:
    """The stub cell for one solution, or None if its code calls no checker."""
    imports, functions, checks = [], {}, []
    for cell in solution.code:
        code, tree = _parse(cell)
        if tree is None:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                text = ast.get_source_segment(code, node)
                if text not in imports:
                    imports.append(text)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[node.name] = (code, node)
            elif not isinstance(node, ast.ClassDef) and any(_is_checker_call(n) for n in ast.walk(node)):
                checks.append((code, node))
    if not checks:
        return None
    checked = []  # names of the solution's functions that a checker call uses, in order of first use
    for _, node in checks:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in functions and n.id not in checked:
                checked.append(n.id)
    stubs = []
    for name in checked:
        code, fn = functions[name]
        head = f"{'async ' if isinstance(fn, ast.AsyncFunctionDef) else ''}def {_signature(name, fn, statement)}:"
        body = ""
        if ast.get_docstring(fn) is not None:
            body = "    " + ast.get_source_segment(code, fn.body[0]) + "\n"
        stubs.append(f"{head}\n{body}    {STUB_BODY}")
    sections = ["\n".join(imports)] if imports else []
    sections.append(STUB_COMMENT + "\n" + "\n\n\n".join(stubs))
    sections.append("\n".join(ast.get_source_segment(code, node) for code, node in checks))
    return "\n\n\n".join(sections)


def _clean_code_cell(cell):
    cell = nbformat.from_dict(dict(cell))
    cell.outputs = []
    cell.execution_count = None
    return cell


def student_notebook(nb):
    """A copy of ``nb`` with every solution replaced by a stub (see the module docstring)."""
    statements = exercise_statements(nb)
    cells, solution, first_piece = [], None, True

    def flush(buffer, template):
        nonlocal first_piece
        text = "\n".join(buffer).strip("\n")
        if text.strip():
            if first_piece:
                piece = nbformat.from_dict(dict(template))
                piece.source = text
                first_piece = False
            else:
                piece = nbformat.v4.new_markdown_cell(text, metadata=dict(template.get("metadata", {})))
            cells.append(piece)
        buffer.clear()

    for cell in nb.cells:
        if cell.cell_type == "code":
            if solution is not None:
                solution.code.append(cell.source)
            else:
                cells.append(_clean_code_cell(cell))
            continue
        if cell.cell_type != "markdown":
            if solution is None:
                cells.append(cell)
            continue
        lines, buffer, i, first_piece = cell.source.splitlines(), [], 0, True
        while i < len(lines):
            start, end = _START.match(lines[i]), _END.match(lines[i])
            if start:
                if solution is not None:
                    raise MarkerError(f"solution {start['label']!r} starts inside solution {solution.label!r}")
                flush(buffer, cell)
                solution = Solution(start["label"])
                i = _skip_directive_header(lines, i, start["fence"])
            elif end:
                if solution is None:
                    raise MarkerError("a solution-end marker without a solution-start marker")
                i = _skip_directive_header(lines, i, end["fence"])
                stub = stub_source(solution, statements.get(solution.label or "", ""))
                if stub is not None:
                    cells.append(nbformat.v4.new_code_cell(stub, metadata={STUB_KEY: solution.label}))
                solution = None
            else:
                if solution is None:
                    buffer.append(lines[i])
                i += 1
        flush(buffer, cell)
    if solution is not None:
        raise MarkerError(f"solution {solution.label!r} has no solution-end marker")

    student = nbformat.from_dict(dict(nb))
    student.cells = cells
    student.metadata = {k: v for k, v in nb.metadata.items() if k != "jupytext"}  # not paired with book/
    nbformat.validate(student)
    return student


def convert(source: Path, target: Path) -> int:
    """Write the student edition of ``source`` to ``target``; returns the number of stubs."""
    nb = nbformat.read(source, as_version=4)
    try:
        student = student_notebook(nb)
    except MarkerError as error:
        raise MarkerError(f"{source}: {error}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(student, target)
    return sum(STUB_KEY in c.metadata for c in student.cells)


def chapter_notebooks(source_dir: Path = SOURCE_DIR) -> list[Path]:
    return sorted(p for p in source_dir.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="chapter notebooks (default: notebooks/**/*.ipynb)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: _build/student)")
    parser.add_argument("--source", type=Path, default=SOURCE_DIR,
                        help="folder of the notebooks (default: notebooks; `make student` uses _build/reader)")
    args = parser.parse_args(argv)
    source_dir = args.source.resolve()
    sources = [p.resolve() for p in args.notebooks] or chapter_notebooks(source_dir)
    for source in sources:
        try:
            relative = source.relative_to(source_dir)
        except ValueError:
            relative = Path(source.name)
        target = args.out / relative
        try:
            stubs = convert(source, target)
        except MarkerError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"{target}  ({stubs} exercise stub{'s' if stubs != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
