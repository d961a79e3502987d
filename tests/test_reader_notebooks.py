"""The reader copy of the notebooks (`make lab`, scripts/make_reader.py): numbers, figures, captions and code in
place of MyST-NB's glue and Sphinx's roles, which JupyterLab with jupyterlab-myst cannot resolve.

The copy of every chapter is built once into a temporary folder (no kernel, a few seconds) and read back.
"""

import base64
import functools
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_reader", ROOT / "scripts" / "make_reader.py")
make_reader = sys.modules["make_reader"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_reader)

CHAPTERS = make_reader.chapter_notebooks()
# Directives jupyterlab-myst renders; anything else in a reader notebook would show as "Unknown Directive".
RENDERED = {"math", "admonition", "note", "warning", "tip", "important", "caution", "attention", "danger", "error",
            "hint", "seealso", "exercise", "solution", "solution-start", "solution-end", "dropdown", "figure",
            "image", "table", "list-table", "code", "code-block", "margin", "aside", "card", "tab-set", "tab-item"}
RENDERED |= {f"prf:{kind}" for kind in make_reader._PROOF_KINDS | {"proof"}}
LEFT_OVER = re.compile(r"\{(glue|glue:[a-z]+|numref|eq|ref|prf:ref|term|doc|cite|cite:[a-z]+|download|any)\}`"
                       r"|\{(literalinclude|glue:[a-z]+|glue)\}")  # a role (with its backtick), or a directive
DIRECTIVE = re.compile(r"^\s*(`{3,}|:{3,})\{(?P<name>[^}\s]+)\}", re.M)
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<src>data:image/(?:png|jpeg);base64,[A-Za-z0-9+/=]+|attachment:[^)\s]+)\)")


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("reader")
    assert make_reader.main(["--out", str(out)]) == 0
    return out


@functools.lru_cache(maxsize=None)
def _read(path: Path):
    return nbformat.read(path, as_version=4)


def pair(chapter, reader_dir):
    """(the stored notebook, its reader copy), read once per test session (the tests only look at them)."""
    return _read(chapter), _read(reader_dir / chapter.relative_to(ROOT / "notebooks"))


def markdown(nb, images: bool = False) -> str:
    """The notebook's Markdown; without ``images`` each data URI's payload is cut to ``...`` (faster to search)."""
    text = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return text if images else re.sub(r"(;base64,)[A-Za-z0-9+/=]+", r"\1...", text)


def test_every_chapter_has_a_reader_copy(reader_dir):
    assert {"grpo", "family", "mdp"} <= {p.stem for p in CHAPTERS}
    for chapter in CHAPTERS:
        assert (reader_dir / chapter.relative_to(ROOT / "notebooks")).exists(), chapter


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_role_or_unknown_directive_is_left(chapter, reader_dir):
    original, reader = pair(chapter, reader_dir)
    nbformat.validate(reader)
    text = markdown(reader)
    left = sorted({m.group(0) for m in LEFT_OVER.finditer(text)})
    assert not left, f"roles left as text: {left}"
    unknown = sorted({m["name"] for m in DIRECTIVE.finditer(text)} - RENDERED)
    assert not unknown, f"directives jupyterlab-myst does not know: {unknown}"
    assert "not computed]" not in text and "not found]" not in text
    # the code cells are all kept, in order, with the glue records dropped from their outputs
    assert [c.source for c in original.cells if c.cell_type == "code"] == \
        [c.source for c in reader.cells if c.cell_type == "code"]
    for cell in reader.cells:
        if cell.cell_type == "code":
            assert not any("scrapbook" in o.get("metadata", {}) for o in cell.outputs)
            if "remove-cell" in cell.metadata.get("tags", []):
                assert cell.metadata["jupyter"]["source_hidden"] is True


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_each_glued_value_is_written_in(chapter, reader_dir):
    """Every {glue:text} of the source is replaced by its formatted value: the glued numbers appear in the text."""
    original, reader = pair(chapter, reader_dir)
    values = make_reader.glue_values(original)
    text = markdown(reader)
    roles = re.findall(r"\{glue:text\}`([^`]+)`", markdown(original))
    for content in roles:
        key, fmt = content.rsplit(":", 1) if ":" in content else (content, "")
        formatted = make_reader.format_plain_text("".join(values[key]["text/plain"]), fmt)
        assert formatted in text, f"{content}: {formatted!r} not in the reader copy"
        # the name of the value is not printed as if it were the value (the reader's complaint)
    names = {content.rsplit(":", 1)[0] for content in roles}
    shown = [name for name in names if re.search(rf"(?<![\w`/.-]){re.escape(name)}(?![\w`/.-])", text)]
    assert not shown, f"glue names shown as text: {shown[:5]}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_figure_is_an_image_with_a_numbered_caption(chapter, reader_dir):
    original, reader = pair(chapter, reader_dir)
    figures = re.findall(r"\{glue:figure\}\s*(\S+)[^\n]*\n(?::[^\n]*\n)*", markdown(original))
    text = markdown(reader, images=True)
    images = IMAGE.findall(text)
    assert len(images) >= len(figures)
    captions = re.findall(r"\*\*Figure (\d+)\.(\d+)\.\*\* \*\S", text)
    assert len(captions) == len(figures), f"{len(figures)} figures, {len(captions)} numbered captions"
    if captions:
        assert [int(k) for _, k in captions] == list(range(1, len(captions) + 1))
        assert {n for n, _ in captions} == {str(reader.metadata[make_reader.READER_KEY]["chapter"])}
    for src in images:
        if src.startswith("data:"):
            assert base64.b64decode(src.split(",", 1)[1])[:4] in (b"\x89PNG", b"\xff\xd8\xff\xe0", b"\xff\xd8\xff\xe1")
    # each image is directly followed by its caption
    for match in IMAGE.finditer(text):
        after = text[match.end():match.end() + 40].lstrip("\n")
        if "glue:figure" in markdown(original):
            assert after.startswith("**Figure"), after


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_literalinclude_became_code(chapter, reader_dir):
    """Each former literalinclude is a pointer line ("From `rlbook.x.f` in `src/...`, lines a–b:") and a
    non-empty fenced block whose lines are the file's lines a to b."""
    original, reader = pair(chapter, reader_dir)
    includes = len(re.findall(r"\{literalinclude\}", markdown(original)))
    blocks = re.findall(r"From (`[^`]+`(?: in `[^`]+`)?), lines? (\d+)(?:–(\d+))?:\n\n(`{3,})(\w*)\n(.*?)\n\4(?!`)",
                        markdown(reader), flags=re.S)
    assert len(blocks) == includes, f"{includes} literalincludes, {len(blocks)} code blocks"
    for where, first, last, _, _, code in blocks:
        assert code.strip(), f"{where}: empty code block"
        path = re.findall(r"`([^`]+)`", where)[-1]
        lines = (ROOT / path).read_text().splitlines()[int(first) - 1:int(last or first)]
        shown = code.splitlines()
        assert len(shown) == len(lines)
        # the file's lines, but for the docstrings' equation labels, which read as the book's numbers
        numbered = [_number_labels(line) for line in lines]
        assert all(s.strip() == line.strip() for s, line in zip(shown, numbered)), f"{where}: not the file's lines"


@functools.cache
def _equation_numbers() -> dict:
    index = make_reader.build_index()
    return {label: t.number for label, t in index.targets.items() if t.kind == "equation"}


def _number_labels(line: str) -> str:
    return make_reader._book_extension("rlbook_html").number_equation_labels(line, _equation_numbers().get)


def test_the_family_code_section_is_not_empty(reader_dir):
    """The reader's complaint: 'the code behind each cell' was five bold labels with nothing under them."""
    family = next(p for p in CHAPTERS if p.stem == "family")
    _, reader = pair(family, reader_dir)
    text = markdown(reader)
    assert text.count("```python") >= 10
    for name in ("rlbook.advantages.grpo", "rlbook.objectives.clipped_surrogate"):
        assert f"`{name}`" in text


def test_cross_references_read_as_the_book_prints_them(reader_dir):
    grpo = next(p for p in CHAPTERS if p.stem == "grpo")
    _, reader = pair(grpo, reader_dir)
    text = markdown(reader)
    chapter = reader.metadata[make_reader.READER_KEY]["chapter"]
    assert re.search(rf"^# {chapter}\. GRPO", text, flags=re.M)
    assert "Chapter 5 (PPO)" in text and f"Figure {chapter}.1" in text and f"({chapter}.1)" in text
    assert "Shao et al. (2024)" in text
    assert text.startswith(f"---\nnumbering:\n  enumerator: {chapter}.%s")  # jupyterlab-myst numbers as the book


# ---- the script on hand-made notebooks
def _index():
    index = make_reader.Index()
    index.chapters["notebooks/x"] = 3
    make_reader.index_document(index, "notebooks/x", "(chap-x)=\n# X\n\n```{math}\n:label: eq-a\na\n```\n\n"
                               "```{glue:figure} f\n:name: fig-f\n\nCap.\n```\n\n```{exercise} Do it\n:label: ex-a\n"
                               "```\n\n```{prf:algorithm} Alg\n:label: alg-a\n```", 3)
    index.citations["k"] = ("Doe et al.", "2020")
    return index


def _notebook(*markdown_cells, glue=None):
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("glue(...)", metadata={"tags": ["remove-cell"]})
    code.outputs = [nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": v},
                                           metadata={"scrapbook": {"name": k,
                                                                   "mime_prefix": "application/papermill.record/"}})
                    for k, v in (glue or {}).items()]
    nb.cells = [code] + [nbformat.v4.new_markdown_cell(m) for m in markdown_cells]
    return nb


def test_roles_on_a_hand_made_notebook():
    nb = _notebook("# X\n\nSee {numref}`Chapter %s (X) <chap-x>`, {numref}`fig-f`, {eq}`eq-a`, {ref}`ex-a`,\n"
                   "{prf:ref}`alg-a`, {term}`a term <Term>`, {cite:t}`k`, {cite:p}`k`; value {glue:text}`v:.2f`,\n"
                   "`{glue:text}` stays code.", glue={"v": "0.12345"})
    reader = make_reader.reader_notebook(nb, _index(), "notebooks/x")
    assert reader.cells[0].source.startswith("---\nnumbering:\n  enumerator: 3.%s")  # a front-matter cell first
    text = reader.cells[2].source
    assert ("See Chapter 3 (X), Figure 3.1, (3.1), Exercise 3.1,\nAlgorithm 3.1, a term, Doe et al. (2020), "
            "(Doe et al., 2020); value 0.12,\n`{glue:text}` stays code.") in text
    assert "# 3. X" in text
    assert reader.cells[1].outputs == [] and reader.cells[1].metadata["jupyter"]["source_hidden"]


BIB = r"""
@article{three, author = {Doe, Jane and Roe, Richard and Poe, Edgar}, title = {T}, year = {2020}}
@article{others, author = {Doe, Jane and Roe, Richard and others}, title = {T}, year = {2021}}
@article{two, author = {van Roe, Richard and Doe, Jane}, title = {T}, year = {2019}}
@article{one, author = {Szepesv{\'a}ri, Csaba}, title = {T}, year = {2010}}
@misc{org, organization = {The {RL} Group}, title = {T}}
"""


def test_citations_read_as_the_bibliography_labels_them(tmp_path):
    """The reader's author-year text is the book's bibliography style's (_ext/rlbook_bibstyle.py): "et al." from
    three authors on, "and others" counted as more, LaTeX accents resolved, the organization when no one is named."""
    from pybtex.database import parse_file

    (tmp_path / "refs.bib").write_text(BIB)
    citations = make_reader.read_citations(tmp_path / "refs.bib")
    assert citations == {"three": ("Doe et al.", "2020"), "others": ("Doe et al.", "2021"),
                         "two": ("van Roe and Doe", "2019"), "one": ("Szepesvári", "2010"),
                         "org": ("The RL Group", "n.d.")}
    if str(ROOT / "_ext") not in sys.path:
        sys.path.insert(0, str(ROOT / "_ext"))
    from rlbook_bibstyle import AuthorYearLabelStyle

    for key, entry in parse_file(str(tmp_path / "refs.bib")).entries.items():
        assert " ".join(citations[key]) == AuthorYearLabelStyle().format_label(entry), key


def test_citations_read_as_the_book_prints_them():
    """Every entry of references.bib: the reader's text is what sphinxcontrib-bibtex's author_year style prints in
    the book for {cite:t} and {cite:p} (names and year; the book sets "et al." in italics). An entry with no author
    or editor would fail here: the book prints its title, the bibliography style its organization."""
    from pybtex.database import parse_file
    from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle
    from sphinxcontrib.bibtex.style.template import year

    style = AuthorYearReferenceStyle()
    citations = make_reader.read_citations(ROOT / "references.bib")
    for key, entry in parse_file(str(ROOT / "references.bib")).entries.items():
        data = {"entry": entry, "style": style}
        book = (style.person.author_or_editor_or_title(full=False).format_data(data).render_as("text"),
                year.format_data(data).render_as("text"))
        assert citations[key] == book, key


def test_a_missing_glue_value_or_label_fails_loudly():
    with pytest.raises(make_reader.ReaderError, match="no glued value named 'nope'"):
        make_reader.reader_notebook(_notebook("{glue:text}`nope`"), _index(), "notebooks/x")
    with pytest.raises(make_reader.ReaderError, match="'eq-missing' not found"):
        make_reader.reader_notebook(_notebook("{eq}`eq-missing`"), _index(), "notebooks/x")


def test_literalinclude_options(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text(
        "import os\n\n\n@decorator\ndef f(x):\n    '''Doc.'''\n    return x\n\n\nclass C:\n    def m(self):\n"
        "        return 1\n\n    # start here\n    def n(self):\n        return 2\n")
    code, where, first, last = make_reader.literal_include("/src/pkg/mod.py", {"pyobject": "f"}, tmp_path)
    assert code.startswith("@decorator\ndef f(x):") and (first, last) == (4, 7) and where.startswith("`pkg.mod.f`")
    code, _, first, last = make_reader.literal_include("/src/pkg/mod.py", {"pyobject": "C.m", "dedent": "4"},
                                                       tmp_path)
    assert code == "def m(self):\n    return 1" and (first, last) == (11, 12)
    code, _, first, _ = make_reader.literal_include(
        "/src/pkg/mod.py", {"start-after": "# start here", "end-at": "return 2"}, tmp_path)
    assert code.strip().startswith("def n") and first == 15
    code, _, first, last = make_reader.literal_include("/src/pkg/mod.py", {"lines": "1,5-6"}, tmp_path)
    assert code == "import os\ndef f(x):\n    '''Doc.'''" and (first, last) == (1, 6)
    code, _, first, last = make_reader.literal_include(
        "/src/pkg/mod.py", {"pyobject": "C", "start-at": "def n", "lines": "2"}, tmp_path)
    assert code == "        return 2" and (first, last) == (16, 16)
    with pytest.raises(make_reader.ReaderError, match="start-at pattern not found: def nope"):
        make_reader.literal_include("/src/pkg/mod.py", {"start-at": "def nope"}, tmp_path)
    with pytest.raises(make_reader.ReaderError, match="end-before pattern not found: nope"):
        make_reader.literal_include("/src/pkg/mod.py", {"end-before": "nope"}, tmp_path)
    with pytest.raises(make_reader.ReaderError, match="'C.nope' not found"):
        make_reader.literal_include("/src/pkg/mod.py", {"pyobject": "C.nope"}, tmp_path)


def test_display_math_without_a_label_is_not_numbered():
    """jupyterlab-myst numbers every display equation; the book numbers only labelled ones, so the reader copy
    turns `$$ ... $$` into an unnumbered math directive (and keeps `$$ ... $$ (label)` as it is)."""
    nb = _notebook("Text\n\n$$\na = b\n$$\n\nmore\n\n$$\nc\n$$ (eq-c)\n\n```{admonition} A\n$$ d $$\n```")
    text = make_reader.reader_notebook(nb, _index(), "notebooks/x").cells[2].source
    assert ":::{math}\n:enumerated: false\na = b\n:::" in text
    assert "$$\nc\n$$ (eq-c)" in text
    assert ":::{math}\n:enumerated: false\nd\n:::" in text


def test_solutions_are_collapsed_in_the_reader_copy(tmp_path):
    """GRPO's twin: every code cell between a solution's markers is hidden (source and outputs), every line of
    solution prose sits in a {dropdown} titled "Solution to Exercise 6.k", and the markers are kept for
    `make student`; the cells outside the solutions are not hidden by it."""
    chapter = ROOT / "notebooks" / "part4" / "grpo.ipynb"
    assert make_reader.main(["--out", str(tmp_path), str(chapter)]) == 0
    original, reader = _read(chapter), nbformat.read(tmp_path / "part4" / "grpo.ipynb", as_version=4)
    assert len(reader.cells) == len(original.cells)
    inside, solutions, hidden = False, 0, 0
    for cell in reader.cells:
        if cell.cell_type == "code":
            flags = cell.metadata.get("jupyter", {})
            if inside:
                assert flags.get("source_hidden") and flags.get("outputs_hidden"), cell.source[:80]
                hidden += 1
            continue
        lines, dropdown, i = cell.source.splitlines(), None, 0
        while i < len(lines):
            line = lines[i]
            if make_reader._SOLUTION_START.match(line):
                inside, solutions = True, solutions + 1
                i = make_reader._marker_end(lines, i, make_reader._SOLUTION_START.match(line)["fence"])
                continue
            if make_reader._SOLUTION_END.match(line):
                assert dropdown is None, "a solution's dropdown is not closed before its end marker"
                inside = False
            elif inside and (opening := re.match(r"^(:{4,})\{dropdown\} (.*)$", line)):
                assert re.fullmatch(r"Solution to Exercise 6\.\d+", opening[2]), opening[2]
                dropdown = opening[1]
            elif inside and dropdown and line == dropdown:
                dropdown = None
            elif inside and line.strip():
                assert dropdown, f"solution prose outside a dropdown: {line!r}"
            i += 1
    markers = (ROOT / "book" / "part4" / "grpo.md").read_text(encoding="utf-8").count("{solution-start}")
    assert solutions == markers >= 2 and hidden >= solutions


def test_only_long_listings_are_collapsed(tmp_path):
    """A literalinclude of more than 30 lines is a {dropdown} titled by its caption and length, holding the usual
    pointer line and code; a short one is left open."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("def short():\n    return 1\n\n\ndef long():\n"
                                           + "".join(f"    x{k} = {k}\n" for k in range(40)) + "    return 0\n")
    ctx = make_reader.Context(make_reader.Index(), "doc", 1, {}, tmp_path)
    source = ("```{literalinclude} /src/m.py\n:pyobject: %s\n:caption: The %s one.\n```")
    short = make_reader.transform_markdown(source % ("short", "short"), ctx)
    long = make_reader.transform_markdown(source % ("long", "long"), ctx)
    assert "{dropdown}" not in short and short.startswith("*The short one.* From `m.short` in `src/m.py`")
    lines = long.splitlines()
    assert lines[0] == "::::{dropdown} The long one. (42 lines)" and lines[-1] == "::::"
    assert lines[1].startswith("*The long one.* From `m.long` in `src/m.py`") and "```python" in lines
    assert not ctx.problems


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_role_is_left_in_generated_tables(chapter, reader_dir):
    """Markdown outputs of code cells (the generated tables of Part 6) read as the book prints their roles."""
    _, reader = pair(chapter, reader_dir)
    for cell in reader.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            text = "".join(output.get("data", {}).get("text/markdown", ""))
            assert not LEFT_OVER.search(text), LEFT_OVER.search(text)[0]


def test_a_listings_equation_labels_become_the_books_numbers(tmp_path):
    """A docstring names its equation by label; the reader copy prints the number the book gives it ("3.1" here),
    and leaves a label the book does not number as written."""
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text(
        "def f(x):\n    '''The loss (eq-a), and eq-unknown-label.'''\n    return x\n")
    ctx = make_reader.Context(_index(), "notebooks/x", 3, {}, tmp_path)
    listing = "\n".join(make_reader._include(ctx, "/src/pkg/mod.py", {"pyobject": "f"}))
    assert "The loss (eq. (3.1)), and eq-unknown-label." in listing and not ctx.problems
