"""The student edition (`make student`, scripts/make_student.py): solutions replaced by stubs that run.

Like `make student`, the tests build it from the reader copy (scripts/make_reader.py). The marker scanning here is
written independently of the script, so a bug in one is not mirrored in the other.
"""

import ast
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_student", ROOT / "scripts" / "make_student.py")
make_student = sys.modules["make_student"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_student)
_spec = importlib.util.spec_from_file_location("make_reader", ROOT / "scripts" / "make_reader.py")
make_reader = sys.modules["make_reader"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_reader)

CHAPTERS = [p for p in make_student.chapter_notebooks() if "{solution-start}" in p.read_text()]
STUB = make_student.STUB_KEY


def solutions(nb):
    """[(label, prose lines, code cell sources)] between solution-start and solution-end markers."""
    found, current = [], None
    for cell in nb.cells:
        if cell.cell_type == "code":
            if current is not None:
                current[2].append(cell.source)
            continue
        for line in cell.source.splitlines():
            if match := re.search(r"\{solution-start\}\s*(\S+)", line):
                current = (match[1], [], [])
            elif "{solution-end}" in line:
                found.append(current)
                current = None
            elif current is not None and line.strip() and not re.fullmatch(r"\s*(`{3,}|:{3,}|:class:.*)", line):
                current[1].append(line.strip())
    assert current is None, "unterminated solution"
    return found


def outside_solutions(nb):
    """(markdown lines, code sources) of the notebook outside its solutions."""
    inside, lines, code = False, [], []
    for cell in nb.cells:
        if cell.cell_type == "code":
            if not inside:
                code.append(cell.source)
            continue
        for line in cell.source.splitlines():
            if "{solution-start}" in line:
                inside = True
            elif "{solution-end}" in line:
                inside = False
            elif not inside:
                lines.append(line.strip())
    return lines, code


def checker_calls(sources):
    calls = []
    for source in sources:
        for node in ast.parse(source).body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
                calls += [ast.unparse(n) for n in ast.walk(node)
                          if isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1].startswith("check_")]
    return calls


def statements(sources):
    """ast dumps of every statement in the code, at any depth."""
    return {ast.dump(n) for s in sources for n in ast.walk(ast.parse(s)) if isinstance(n, ast.stmt)}


def reference_bodies(code_sources):
    """The body statements (docstrings excluded) of the functions a solution passes to its checkers."""
    trees = [ast.parse(s) for s in code_sources]
    calls = [c for t in trees for c in ast.walk(t)
             if isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1].startswith("check_")]
    checked = {n.id for c in calls for n in ast.walk(c) if isinstance(n, ast.Name)}
    bodies = set()
    for tree in trees:
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and fn.name in checked:
                body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
                bodies |= {ast.dump(n) for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.stmt)}
    return bodies


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory):
    """The reader copy of the chapters with exercises, the source of the student edition (as in `make student`)."""
    out = tmp_path_factory.mktemp("reader")
    assert make_reader.main(["--out", str(out), *map(str, CHAPTERS)]) == 0
    return out


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, reader_dir):
    out = tmp_path_factory.mktemp("student")
    sources = [str(reader_dir / chapter.relative_to(ROOT / "notebooks")) for chapter in CHAPTERS]
    assert make_student.main(["--source", str(reader_dir), "--out", str(out), *sources]) == 0
    return out


def student_of(chapter, student_dir):
    return nbformat.read(student_dir / chapter.relative_to(ROOT / "notebooks"), as_version=4)


def reader_of(chapter, reader_dir):
    return nbformat.read(reader_dir / chapter.relative_to(ROOT / "notebooks"), as_version=4)


def test_chapters_with_exercises_exist():
    names = {p.stem for p in CHAPTERS}
    assert {"mdp", "q_learning", "lm_policies"} <= names, names


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_edition_drops_solutions_and_keeps_exercises(chapter, student_dir, reader_dir):
    original = reader_of(chapter, reader_dir)
    student = student_of(chapter, student_dir)
    nbformat.validate(student)
    md = "\n".join(c.source for c in student.cells if c.cell_type == "markdown")
    code = [c.source for c in student.cells if c.cell_type == "code"]
    assert "{solution-start}" not in md and "{solution-end}" not in md

    # every exercise statement is kept, verbatim
    labels = re.findall(r"^:label: (ex-\S+)", "\n".join(c.source for c in original.cells), flags=re.M)
    assert labels and labels == re.findall(r"^:label: (ex-\S+)", md, flags=re.M)

    kept_lines, kept_code = outside_solutions(original)
    with_code = 0
    for label, prose, sources in solutions(original):
        # the solution prose is gone (unless the same line also appears outside the solutions)
        leaked = [line for line in prose if len(line) > 30 and line not in kept_lines and line in md]
        assert not leaked, f"{label}: solution prose left in the student edition: {leaked[:2]}"
        calls = checker_calls(sources)
        stubs = [c for c in student.cells if c.metadata.get(STUB) == label]
        if not calls:  # prose-only or illustration-only solution: nothing left behind
            assert not stubs, f"{label}: a stub for a solution without a checker call"
            continue
        with_code += 1
        assert len(stubs) == 1, f"{label}: expected one stub cell, found {len(stubs)}"
        assert checker_calls([stubs[0].source]) == calls, f"{label}: checker calls changed"
        # each checked function is a stub that raises, and no statement of the reference body survives
        tree = ast.parse(stubs[0].source)
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            stub_body = make_student.STUB_BODY.replace('"', "'")
            assert ast.unparse(fn.body[-1]) == stub_body, f"{label}: {fn.name} is no stub"
        leaked = reference_bodies(sources) - statements(kept_code)
        assert not leaked & statements(code), f"{label}: reference solution code left in the student edition"
    assert with_code == sum(STUB in c.metadata for c in student.cells)
    assert all(c.outputs == [] and c.execution_count is None for c in student.cells if c.cell_type == "code")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_edition_runs_and_only_its_stubs_fail(chapter, student_dir):
    """Execute the student notebook once (errors allowed): only the stubs fail, so nothing outside the solutions
    depends on them, and each stub's failure is one line (the checker's ExerciseNotDone, no traceback)."""
    student = student_of(chapter, student_dir)
    stubs = [i for i, c in enumerate(student.cells) if STUB in c.metadata]
    path = student_dir / chapter.relative_to(ROOT / "notebooks")
    NotebookClient(student, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = {i: o for i, c in enumerate(student.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"}
    assert sorted(errors) == stubs, "cells other than the stubs failed: " + "\n".join(
        f"cell {i}: {o.ename}: {o.evalue}" for i, o in errors.items() if i not in stubs)
    for i in stubs:
        assert errors[i].ename == "ExerciseNotDone" and "your solution" in errors[i].evalue, (
            f"stub cell {i} raised {errors[i].ename}: {errors[i].evalue}")
        assert len(errors[i].traceback) == 1, f"stub cell {i}: {len(errors[i].traceback)} lines of traceback"


# ---- the script on hand-made notebooks: markers mixed with text, several code cells, prose-only solutions
def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(c[3:]) if c.startswith("md:") else nbformat.v4.new_code_cell(c)
                for c in cells]
    return nb


_TWO_CODE_CELLS = _nb(
    "md:## Exercises\n\n```{exercise} Two\n:label: ex-two\n\nWrite `f(x, y=1)` and `g(z)`.\n```\n\n"
    "````{solution-start} ex-two\n:class: dropdown\n````\n\nSecret prose about f.",
    "from rlbook.exercises import check_f\n\n\n"
    "def f(x, y=1, extra=None):\n    \"\"\"Doc of f.\"\"\"\n    return x + y\n",
    "md:More secret prose.",
    "def g(z):\n    return 2 * z\n\n\ndef helper():\n    return 0\n\n\ncheck_f(f)\ncheck_f(g)\nprint(helper())",
    "md:````{solution-end}\n````\n\n```{exercise} Think\n:label: ex-think\n\nExplain.\n```\n\n"
    "````{solution-start} ex-think\n:class: dropdown\n````\n\nOnly prose.\n\n"
    "````{solution-end}\n````\n\n## Summary",
)


def test_several_code_cells_become_one_stub_and_prose_only_solutions_vanish():
    student = make_student.student_notebook(_TWO_CODE_CELLS)
    text = "\n".join(c.source for c in student.cells)
    assert "Secret" not in text and "Only prose" not in text and "helper" not in text and "return" not in text
    assert "{exercise} Think" in text and text.rstrip().endswith("## Summary")
    (stub,) = [c for c in student.cells if STUB in c.metadata]
    assert stub.metadata[STUB] == "ex-two"
    # the signature as the exercise writes it, the docstring, the stub body
    assert "def f(x, y=1):\n    \"\"\"Doc of f.\"\"\"\n    raise NotImplementedError" in stub.source
    assert "def g(z):\n    raise NotImplementedError" in stub.source
    assert stub.source.startswith("from rlbook.exercises import check_f")
    assert stub.source.endswith("check_f(f)\ncheck_f(g)")
    namespace = {"check_f": lambda fn: fn(1)}
    with pytest.raises(NotImplementedError, match="your solution"):
        exec(stub.source.replace("from rlbook.exercises import check_f", ""), namespace)


def test_unpaired_markers_fail_loudly():
    start_only = _nb("md:````{solution-start} ex-a\n:class: dropdown\n````\n\ntext")
    with pytest.raises(make_student.MarkerError, match="no solution-end"):
        make_student.student_notebook(start_only)
    end_only = _nb("md:````{solution-end}\n````")
    with pytest.raises(make_student.MarkerError, match="without a solution-start"):
        make_student.student_notebook(end_only)
