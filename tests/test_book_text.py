"""The book's text as a reader meets it, checked in the sources (issue 18).

1. A source lint over book/**/*.md: a line that begins with a TeX control word without its backslash (the
   signature of a lost backslash: "\\rVert" written through a Python string became a line break and "Vert"),
   a paragraph whose `$` math does not close, a control character, and MyST roles with a broken form.
2. Visible code fits the column: every line of a visible code cell of notebooks/**/*.ipynb and of its shown
   text output, and every line of package code the book shows with `literalinclude`, is at most 100 characters.
3. Results first: every chapter opens with its "At a glance" box, of at most GLANCE_MAX_WORDS (150) words, and every experiment
   figure is followed by a results table and a `**Finding.**` line.
4. Glossary links (issue 43): every glossary term a chapter's prose uses is linked with `{term}` in that chapter,
   no later than the section of its first use (see `glossary_link_faults`; a short allow-list,
   `GLOSSARY_UNLINKED`, spares the most general words outside the part that defines them).
5. Numbers are computed: every decimal number and percentage in a chapter's prose (not code, math, roles, code
   spans, directive options, links) is glued, or it is a setting, a constant or a pilot's figure allow-listed in
   `PROSE_NUMBERS_EVERYWHERE` or the chapter's entry of `PROSE_NUMBERS_ALLOWED` (see `prose_number_faults`).

Each check is a pure function of the text, so the planted-fault tests below feed it small strings with one
fault each; the real chapters must pass with no finding. Run `python tests/test_book_text.py` to print every
finding at once.
"""

from __future__ import annotations

import ast
import json
import re
import types
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_CHARS = 100  # the column fits 100 monospace characters at 1280 px (the book's CSS)

BOOK_MD = sorted(p for p in (ROOT / "book").rglob("*.md") if ".ipynb_checkpoints" not in p.parts)
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def is_chapter(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


CHAPTERS = [p for p in BOOK_MD if p.parent.name.startswith("part") and is_chapter(p)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_absolute() and ROOT in path.parents else str(path)


# ---------------------------------------------------------------------------------------------------------
# Reading a MyST file: which lines are prose, math, code, directive options or metadata
# ---------------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}|:{3,})\s*(\{[^}]*\})?\s*(.*)$")
CODE_DIRECTIVES = {"{code-cell}", "{literalinclude}", "{code}", "{code-block}", "{sourcecode}", "{raw}",
                   "{eval-rst}", "{bibliography}", "{mermaid}"}
MATH_DIRECTIVES = {"{math}"}
OPTION = re.compile(r"^\s*:[\w-]+:(\s|$)")


def classify(lines: list[str]) -> list[str]:
    """One kind per line: 'prose', 'math', 'code', 'option', 'fence', 'meta' or 'blank'.

    Fences follow CommonMark: a fence closes on a line of the same character, at least as long, with nothing
    after it. Directives whose body is Markdown (admonitions, exercises, figures' captions) stay prose inside;
    code cells, literal includes and plain code blocks are code; `{math}` blocks and `$$ ... $$` are math.
    """
    kinds = ["blank"] * len(lines)
    stack: list[tuple[str, int, str]] = []  # (fence character, length, kind of the body)
    in_options = False
    i = 0
    if lines and lines[0].strip() == "---":  # front matter
        kinds[0] = "meta"
        i = 1
        while i < len(lines) and lines[i].strip() != "---":
            kinds[i] = "meta"
            i += 1
        if i < len(lines):
            kinds[i] = "meta"
        i += 1
    in_dollars = False
    in_comment = False
    for j in range(i, len(lines)):
        line = lines[j]
        body = stack[-1][2] if stack else "prose"
        m = FENCE.match(line)
        if m and stack and m.group(2)[0] == stack[-1][0] and len(m.group(2)) >= stack[-1][1] \
                and not m.group(3) and not m.group(4).strip():
            stack.pop()
            kinds[j] = "fence"
            in_options = False
            continue
        if body in ("code", "math"):
            kinds[j] = body
            continue
        if m and not in_dollars:
            directive = m.group(3) or ""
            if directive in CODE_DIRECTIVES or (not directive and m.group(2)[0] != ":"):
                kind = "code"
            elif directive in MATH_DIRECTIVES:
                kind = "math"
            else:
                kind = "prose"
            stack.append((m.group(2)[0], len(m.group(2)), kind))
            kinds[j] = "fence"
            in_options = bool(directive)
            continue
        if in_options and OPTION.match(line):
            kinds[j] = "option"
            continue
        in_options = False
        stripped = line.strip()
        if not stripped:
            continue
        if in_comment or stripped.startswith("<!--"):
            kinds[j] = "meta"
            in_comment = "-->" not in stripped
            continue
        if stripped.startswith("%") or stripped.startswith("+++") or re.match(r"^\(\S+\)=$", stripped):
            kinds[j] = "meta"  # MyST comments, cell separators, targets
            continue
        if in_dollars:
            kinds[j] = "math"
            if stripped.endswith("$$"):
                in_dollars = False
            continue
        if stripped.startswith("$$"):
            kinds[j] = "math"
            in_dollars = not (len(stripped) > 2 and stripped.endswith("$$"))
            continue
        kinds[j] = "prose"
    return kinds


# ---------------------------------------------------------------------------------------------------------
# 1. The source lint
# ---------------------------------------------------------------------------------------------------------

# TeX control words that are no English word: at the start of a line, with or without what follows, they are a
# command that lost its backslash.
TEX_ONLY = (
    "Vert vert lVert rVert lvert rvert mathrm mathbb mathcal mathbf mathsf mathit mathop mathtt operatorname "
    "frac dfrac tfrac sqrt textrm textbf textit texttt textsf boldsymbol cdot cdots ldots vdots ddots dots "
    "langle rangle lfloor rfloor lceil rceil lbrace rbrace leq geq neq approx infty nabla propto varepsilon "
    "varphi vartheta qquad quad overline underline widehat widetilde overbrace underbrace xrightarrow "
    "rightarrow leftarrow Rightarrow Leftarrow Leftrightarrow leftrightarrow mapsto displaystyle scriptstyle "
    "tag nonumber notag hline coloneqq sim simeq equiv odot otimes oplus times setminus subseteq supseteq "
    "emptyset forall exists mid nmid Pr begin end "
    # what a Python string leaves of \right, \rangle, \rho, \nabla, \neq, \notin, ... ("\r", "\n": a newline)
    "ight ightarrow abla onumber otin ewline eq ho iggl iggr"
).split()
# Words English uses too: a command only when a TeX character follows ("sum_", "left(", "hat{", "log\\").
TEX_COMMON = (
    "sum prod int lim max min arg argmax argmin log exp sup inf det text hat bar tilde vec dot ddot big Big "
    "bigl bigr Bigl Bigr left right in to not top bot pi mu nu rho tau phi psi chi eta beta alpha gamma delta "
    "theta lambda sigma omega kappa zeta xi Delta Gamma Theta Lambda Sigma Omega Phi Psi Pi ell cos sin tan "
    "underset overset stackrel color partial epsilon angle floor ceil brace"
).split()


def _alternatives(words: list[str]) -> str:
    return "|".join(sorted(set(words), key=len, reverse=True))


TEX_START = re.compile(r"^[\s$&=+\-*(]*(?:(?P<only>%s)(?![A-Za-z])|(?P<common>%s)(?=[{_^\\(\[|)\]$]))"
                       % (_alternatives(TEX_ONLY), _alternatives(TEX_COMMON)))
# English words among them ("begin", "end", "times", ...) are TeX only with a "{" after; "eq." abbreviates.
TEX_ENGLISH_GUARD = re.compile(r"^[\s$&=+\-*(]*((begin|end|tag|sim|mid|times|Pr|dots)(?![{A-Za-z])|eq\.)")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

ROLES = {"eq", "ref", "numref", "term", "doc", "download", "math", "sub", "sup", "abbr", "prf:ref",
         "glue", "glue:text", "glue:any", "glue:md", "glue:figure", "cite", "cite:p", "cite:t", "cite:ps",
         "cite:ts", "cite:alp", "cite:author", "cite:year", "cite:label", "footcite"}
LABEL = r"[\w.:/-]+"
ROLE_CONTENT = {  # what the text between the backticks must look like
    "eq": re.compile(rf"{LABEL}"),
    "glue": re.compile(r"[\w.-]+(:[^`\s]+)?"),
    "glue:text": re.compile(r"[\w.-]+(:[^`\s]+)?"),
    "glue:any": re.compile(r"[\w.-]+"),
    "glue:md": re.compile(r"[\w.-]+(:[\w]+)?"),
    "numref": re.compile(rf"({LABEL}|[^`<>]+<{LABEL}>)"),
    "ref": re.compile(rf"({LABEL}|[^`<>]+<{LABEL}>)"),
    "prf:ref": re.compile(rf"({LABEL}|[^`<>]+<{LABEL}>)"),
    "doc": re.compile(r"([^`<>]+|[^`<>]+<[^`<>\s]+>)"),
    "cite:p": re.compile(r"[\w.:-]+(,\s*[\w.:-]+)*"),
    "cite:t": re.compile(r"[\w.:-]+(,\s*[\w.:-]+)*"),
    "cite": re.compile(r"[\w.:-]+(,\s*[\w.:-]+)*"),
}
ROLE_USE = re.compile(r"\{([A-Za-z][\w:+-]*)\}`([^`]*)`")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")
ROLE_NAMES = "|".join(re.escape(r) for r in sorted(ROLES, key=len, reverse=True))
ROLE_MISSING_OPEN = re.compile(rf"(?<![{{\w:-])({ROLE_NAMES})\}}`")
ROLE_MISSING_CLOSE = re.compile(rf"\{{({ROLE_NAMES})(`|\s+`)")
ROLE_LOOSE = re.compile(rf"(?<![\w\\^_}}])\{{({ROLE_NAMES})\}}(?!`)")  # not TeX's \mathrm{ref}
DOLLAR = re.compile(r"(?<!\\)\$")


def mask_roles_and_code(line: str) -> str:
    """The line with well-formed roles and code spans blanked out, so that their contents are not linted."""
    line = ROLE_USE.sub(lambda m: "\0" * len(m.group(0)), line)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def lint_roles(line: str) -> list[str]:
    faults = []
    for m in ROLE_USE.finditer(line):
        name, content = m.groups()
        if name not in ROLES:
            faults.append(f"unknown role {{{name}}}")
        elif not content.strip():
            faults.append(f"role {{{name}}} with empty content")
        elif name in ROLE_CONTENT and not ROLE_CONTENT[name].fullmatch(content):
            faults.append(f"role {{{name}}}`{content}` is malformed")
    roles_masked = ROLE_USE.sub(lambda m: "\0" * len(m.group(0)), line)
    for m in ROLE_MISSING_OPEN.finditer(roles_masked):
        faults.append(f"role '{m.group(1)}}}`' has no opening brace")
    for m in ROLE_MISSING_CLOSE.finditer(roles_masked):
        faults.append(f"role '{{{m.group(1)}' has no closing brace before its backtick")
    for m in ROLE_LOOSE.finditer(CODE_SPAN.sub(lambda m: " " * len(m.group(0)), roles_masked)):
        faults.append(f"role {{{m.group(1)}}} without `content` right after it")
    return faults


def tex_start(line: str) -> str | None:
    """The TeX word a line starts with, if it starts with a control word that lost its backslash."""
    if TEX_ENGLISH_GUARD.match(line):
        return None
    m = TEX_START.match(line)
    return (m.group("only") or m.group("common")) if m else None


def paragraphs(lines: list[str], kinds: list[str]):
    """Runs of consecutive prose lines: (first line number, lines)."""
    run: list[str] = []
    start = 0
    for j, (line, kind) in enumerate(zip(lines, kinds)):
        if kind == "prose":
            if not run:
                start = j
            run.append(line)
        elif run:
            yield start, run
            run = []
    if run:
        yield start, run


def lint_text(text: str, name: str = "<text>") -> list[str]:
    """Every finding of the source lint in one MyST file, as 'name:line: what is wrong'."""
    lines = text.split("\n")
    kinds = classify(lines)
    faults = []
    for j, (line, kind) in enumerate(zip(lines, kinds)):
        where = f"{name}:{j + 1}"
        if kind not in ("code",) and CONTROL.search(line.replace("\t", "")):
            char = CONTROL.search(line.replace("\t", "")).group(0)
            faults.append(f"{where}: control character {char!r} (a backslash escape such as \\f or \\b "
                          "written through a Python string?)")
        if kind in ("prose", "option") and "\t" in line:
            faults.append(f"{where}: tab character in text (\\t of \\text or \\tau written through a Python "
                          "string?)")
        if kind in ("prose", "math"):
            word = tex_start(line)
            if word:
                faults.append(f"{where}: line starts with TeX word '{word}' without its backslash: "
                              f"{line.strip()[:40]!r}")
        if kind in ("prose", "option"):
            faults += [f"{where}: {f}" for f in lint_roles(line)]
    for start, run in paragraphs(lines, kinds):
        masked = [mask_roles_and_code(line).replace("$$", "") for line in run]
        dollars = [len(DOLLAR.findall(line)) for line in masked]
        if sum(dollars) % 2:
            # the line where the last math span opened and did not close
            opened, count = start, 0
            for k, n in enumerate(dollars):
                if count % 2 == 0 and n:
                    opened = start + k
                count += n
            faults.append(f"{name}:{opened + 1}: '$' math opened in this paragraph does not close before the "
                          f"paragraph ends (line {start + len(run)}): a stray line break inside math?")
            continue
        # roles are not expanded inside $...$: a role there is shown as text
        marked = [CODE_SPAN.sub(lambda m: " " * len(m.group(0)), ROLE_USE.sub(
            lambda m: f"\x01{m.group(1)}\x01", line)).replace("$$", "") for line in run]
        pieces = DOLLAR.split("\n".join(marked))
        for k in range(1, len(pieces), 2):
            for m in re.finditer(r"\x01([\w:+-]+)\x01", pieces[k]):
                line_no = start + "\n".join(pieces[:k]).count("\n") + 1
                faults.append(f"{name}:{line_no}: role {{{m.group(1)}}} inside $...$ math is shown as text")
    return faults


@pytest.mark.parametrize("path", BOOK_MD, ids=rel)
def test_source_lint(path):
    faults = lint_text(path.read_text(encoding="utf-8"), rel(path))
    if faults:
        pytest.fail("\n".join(faults), pytrace=False)


PLANTED_LINT = {
    "lost \\rVert": "for a softmax, $\\lVert e_a - \\pi\nVert^2 = 1 - 2\\pi_a$ grows.\n",
    "lost \\frac": "The mean is\nfrac{1}{G} \\sum_i r_i, which ...\n",
    "lost \\mathrm in a math block": "```{math}\n:label: eq-x\n\\hat A =\nmathrm{std}(r)\n```\n",
    "lost \\left": "the clip range\nleft( 1 - \\epsilon, 1 + \\epsilon \\right) bounds it\n",
    "lost \\right": "the clip range $\\left( 1 - \\epsilon, 1 + \\epsilon\nright)$ bounds it\n",
    "lost \\sum": "the loss\nsum_{i=1}^G A_i is\n",
    "lost \\mathbb": "an expectation\nmathbb{E}[r] over prompts\n",
    "\\r of \\rangle eaten": "the pair $\\langle a, b\nangle$ is\n",
    "\\n of \\nabla eaten": "the gradient $\n\nabla_\\theta J$ is\n",
    "\\f of \\frac eaten": "the mean $\x0crac{1}{G}$ of\n",
    "\\t of \\text eaten": "the ratio $r_\\mathrm{x}\text{clip}$ is\n",
    "math broken by a blank line": "the norm $\\lVert \\pi\n\n\\rVert^2$ grows as {eq}`eq-pg-x` says.\n",
    "role inside math": "the weight $w = {glue:text}`pg_w`$ is\n",
    "role without content": "as {eq} shows\n",
    "role without opening brace": "as eq}`eq-pg-x` shows\n",
    "role without closing brace": "as {numref`fig-pg-x` shows\n",
    "role with a space before its content": "as {ref} `sec-x` shows\n",
    "numref without closing angle": "see {numref}`Chapter %s (PPO) <chap-ppo` for\n",
    "unknown role": "see {numrefs}`fig-x` for\n",
    "empty role": "see {eq}`` for\n",
    "glue name with a space": "is {glue:text}`pg ratio:.3f` here\n",
}


@pytest.mark.parametrize("name", PLANTED_LINT)
def test_source_lint_catches_planted_fault(name):
    assert lint_text(PLANTED_LINT[name]), f"the lint missed: {name}"


def test_source_lint_passes_clean_text():
    clean = (
        "---\nkernelspec:\n  name: python3\n---\n\n(chap-x)=\n# Title\n\n"
        "The norm $\\lVert \\pi\n\\rVert^2$ grows as {eq}`eq-pg-x` says; see {numref}`Chapter %s (PPO) <chap-ppo>`\n"
        "and {glue:text}`pg_ratio:.3f` and `{eq}` in code, $x$ and $$y$$ and a price \\$5.\n"
        "Left to right, the sum of the rewards; begin with the end. Mathematical text.\n\n"
        "```{code-cell} ipython3\nx = 1  # $ unbalanced in code\nfrac{\n```\n\n"
        "```{math}\n:label: eq-y\n\\frac{1}{2}\n\\left( x \\right)\n```\n\n"
        "$$\n\\sum_i x_i\n$$\n\n"
        ":::{admonition} At a glance\n:class: at-a-glance\n**Idea.** $a$ and $b$.\n:::\n"
    )
    assert lint_text(clean) == []


# ---------------------------------------------------------------------------------------------------------
# 2. Visible code fits the column
# ---------------------------------------------------------------------------------------------------------

HIDDEN_SOURCE = {"remove-cell", "remove-input"}
HIDDEN_OUTPUT = {"remove-cell", "remove-output"}
# myst-nb shows the first of these an output has; text/plain only when there is nothing richer
RICHER = ("application/vnd.jupyter.widget-view+json", "application/javascript", "text/html", "image/svg+xml",
          "image/png", "image/jpeg", "text/markdown", "text/latex")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def width(line: str) -> int:
    """Columns a line takes in a monospace font: wide (CJK) characters count twice, tabs expand to 8."""
    line = line.expandtabs(8)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def shown_text(output: dict) -> str:
    """The text of one output as the book shows it ('' for images, HTML, glued values, errors' frames)."""
    kind = output.get("output_type")
    if kind == "stream":
        return "".join(output.get("text", ""))
    if kind in ("execute_result", "display_data"):
        if "scrapbook" in output.get("metadata", {}):  # glue(): shown where it is glued, not here
            return ""
        data = output.get("data", {})
        if any(m in data for m in RICHER) or "text/plain" not in data:
            return ""
        return "".join(data["text/plain"])
    if kind == "error":
        return f"{output.get('ename', '')}: {output.get('evalue', '')}"
    return ""


def long_lines_in_notebook(nb: dict, name: str, source: str | None = None) -> list[str]:
    """Lines over the limit in the visible code and shown text output of a notebook, located in its MyST
    text ``source`` when given (``book/...md:line``), else by code cell number."""
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    located = code_cells(source.split("\n")) if source is not None else []
    if len(located) != len(code):
        located = []
    faults = []
    for index, cell in enumerate(code):
        tags = set(cell.get("metadata", {}).get("tags", []))

        def where(k: int | None, output: bool = False) -> str:
            if located:
                fence, first, _ = located[index]
                return f"{name}:{fence + 1}: output line {k}" if output else f"{name}:{first + k}"
            return f"{name}: code cell {index + 1}, {'output line' if output else 'line'} {k}"

        if not tags & HIDDEN_SOURCE:
            for k, line in enumerate("".join(cell["source"]).splitlines(), 1):
                if width(line) > MAX_CHARS:
                    faults.append(f"{where(k)}: {width(line)} characters: {line.strip()[:50]!r}")
        if not tags & HIDDEN_OUTPUT:
            for output in cell.get("outputs", []):
                for k, line in enumerate(ANSI.sub("", shown_text(output)).splitlines(), 1):
                    if width(line) > MAX_CHARS:
                        faults.append(f"{where(k, output=True)}: {width(line)} characters: "
                                      f"{line.strip()[:50]!r}")
    return faults


def notebook_faults(path: Path) -> list[str]:
    """long_lines_in_notebook of one notebook, reported at the lines of its text source book/...md."""
    source = ROOT / "book" / path.relative_to(ROOT / "notebooks").with_suffix(".md")
    text = source.read_text(encoding="utf-8") if source.exists() else None
    return long_lines_in_notebook(json.loads(path.read_text(encoding="utf-8")),
                                  rel(source) if text is not None else rel(path), text)


def test_visible_code_and_output_fit_the_column():
    per_notebook = {}
    for path in NOTEBOOKS:
        faults = notebook_faults(path)
        if faults:
            per_notebook[rel(path)] = faults
    if per_notebook:
        counts = ", ".join(f"{name}: {len(f)}" for name, f in per_notebook.items())
        first = [f for faults in per_notebook.values() for f in faults[:3]]
        pytest.fail(f"lines over {MAX_CHARS} characters in visible code cells or their output ({counts})\n"
                    + "\n".join(first), pytrace=False)


def test_line_length_rule_catches_planted_faults():
    long = "x = " + "1 + " * 30 + "1"
    cell = {"cell_type": "code", "metadata": {}, "source": long,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "ok\n"}]}
    assert long_lines_in_notebook({"cells": [cell]}, "nb"), "a long visible source line"
    hidden = dict(cell, metadata={"tags": ["remove-input"]})
    assert not long_lines_in_notebook({"cells": [hidden]}, "nb"), "a hidden source line counts"
    printed = {"cell_type": "code", "metadata": {}, "source": "print(s)",
               "outputs": [{"output_type": "stream", "name": "stdout", "text": "a" * 101 + "\n"}]}
    assert long_lines_in_notebook({"cells": [printed]}, "nb"), "a long printed line"
    printed["metadata"] = {"tags": ["remove-output"]}
    assert not long_lines_in_notebook({"cells": [printed]}, "nb"), "a removed output counts"
    result = {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
              "data": {"text/plain": "b" * 101}}
    assert long_lines_in_notebook({"cells": [dict(printed, metadata={}, outputs=[result])]}, "nb")
    result["data"]["text/html"] = "<table></table>"
    assert not long_lines_in_notebook({"cells": [dict(printed, metadata={}, outputs=[result])]}, "nb")
    assert width("数" * 51) == 102


LITERALINCLUDE = re.compile(r"^\s*(`{3,}|:{3,})\{literalinclude\}\s+(\S+)\s*$")


def literalincludes(md: Path):
    """(line number, target path, options) of every literalinclude directive in one book file."""
    lines = md.read_text(encoding="utf-8").split("\n")
    for j, line in enumerate(lines):
        m = LITERALINCLUDE.match(line)
        if not m:
            continue
        target = m.group(2)
        path = ROOT / target.lstrip("/") if target.startswith("/") else md.parent / target
        options = {}
        for option in lines[j + 1:]:
            o = re.match(r"^\s*:([\w-]+):\s*(.*)$", option)
            if not o:
                break
            key, value = o.group(1), o.group(2).strip()
            options[key] = int(value) if key in ("dedent", "lineno-start") and value else (value or None)
        yield j + 1, path, options


_INCLUDED: dict = {}


def included_lines(path: Path, options: dict) -> list[tuple[int, str]]:
    """(line number in the file, text) of what Sphinx shows: its own reader, with the directive's options."""
    key = (path, tuple(sorted(options.items())))
    if key not in _INCLUDED:
        _INCLUDED[key] = _read_included(path, options)
    return _INCLUDED[key]


def _read_included(path: Path, options: dict) -> list[tuple[int, str]]:
    from sphinx.directives.code import LiteralIncludeReader

    if "lines" not in options:  # file line numbers for the report (Sphinx refuses them for a :lines: cut)
        options = dict(options, **{"lineno-match": None})
    reader = LiteralIncludeReader(str(path), options, types.SimpleNamespace(source_encoding="utf-8-sig"))
    text, _ = reader.read()
    return [(reader.lineno_start + k, line) for k, line in enumerate(text.splitlines())]


def test_package_code_the_book_shows_fits_the_column():
    faults, seen = [], set()
    for md in BOOK_MD:
        for line_no, path, options in literalincludes(md):
            assert path.exists(), f"{rel(md)}:{line_no}: literalinclude of a missing file {rel(path)}"
            try:
                shown = included_lines(path, options)
            except Exception as err:  # noqa: BLE001 - report where
                pytest.fail(f"{rel(md)}:{line_no}: literalinclude {rel(path)} {options}: {err}")
            for file_line, text in shown:
                if width(text) > MAX_CHARS and (path, file_line) not in seen:
                    seen.add((path, file_line))
                    what = options.get("pyobject") or "excerpt"
                    faults.append(f"{rel(path)}:{file_line} ({what}, shown by {rel(md)}:{line_no}): "
                                  f"{width(text)} characters")
    if faults:
        files = {}
        for f in faults:
            files[f.split(":")[0]] = files.get(f.split(":")[0], 0) + 1
        counts = ", ".join(f"{name}: {n}" for name, n in files.items())
        pytest.fail(f"lines over {MAX_CHARS} characters in code the book includes ({counts})\n" + "\n".join(faults),
                    pytrace=False)


def test_literalinclude_reader_follows_the_options(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\n\n\ndef f(x):\n    return x\n\n\nclass C:\n    def g(self):\n"
                      "        return 1\n")
    assert [n for n, _ in included_lines(source, {"pyobject": "f"})] == [4, 5]
    assert [t for _, t in included_lines(source, {"pyobject": "C.g"})] == ["    def g(self):", "        return 1"]
    assert [t for _, t in included_lines(source, {"lines": "1"})] == ["import os"]
    assert included_lines(source, {"start-at": "def g", "end-at": "return 1", "dedent": 4})[0] == (9, "def g(self):")


# ---------------------------------------------------------------------------------------------------------
# 3. Results first: the "At a glance" box, and a table and a finding under every experiment figure
# ---------------------------------------------------------------------------------------------------------

GLANCE = re.compile(r"^(`{3,}|:{3,})\{admonition\}\s+At a glance\s*$")
HEADING = re.compile(r"^(#{1,6})\s")


def glance_fault(text: str, name: str) -> str | None:
    lines = text.split("\n")
    kinds = classify(lines)
    title = next((j for j, (line, kind) in enumerate(zip(lines, kinds)) if kind == "prose"
                  and line.startswith("# ")), None)
    section = next((j for j, (line, kind) in enumerate(zip(lines, kinds)) if kind == "prose"
                    and line.startswith("## ")), len(lines))
    if title is None:
        return f"{name}: no '# Title' line"
    for j in range(title + 1, section):
        if GLANCE.match(lines[j]):
            options = []
            for line in lines[j + 1:]:
                if not OPTION.match(line):
                    break
                options.append(line.strip())
            if not any(re.fullmatch(r":class:.*\bat-a-glance\b.*", o) for o in options):
                return f"{name}:{j + 1}: the At a glance admonition lacks ':class: at-a-glance'"
            return None
    return (f"{name}:{title + 1}: no ':::{{admonition}} At a glance' box between the title and the first "
            f"section (line {section + 1})")


# ---------------------------------------------------------------------------------------------------------
# Results worded as strongly as their intervals, and no project-tracker language
# ---------------------------------------------------------------------------------------------------------

# "fell by {glue:text}`x:+.3f`" prints "fell by −0.47": a double negative (say "changed by −0.47" or "fell by 0.47")
DOUBLE_NEGATIVE = re.compile(r"\b(fell|falls?|dropped|drops?|shrank|shorter|lower|fewer|less|decreased|lost)\b,?"
                             r"\s+by\s+[−-]\s?\d", re.I)
TRACKER = re.compile(r"\bthe issue('s)?\b(?! filed)|\bissue \d+|\bthe plan says so\b", re.I)
# a tie is "no difference resolved", not a sameness the interval does not show
TIE_AS_SAMENESS = re.compile(r"\b(did as well|no clear effect|tied with (it|them|theirs|GRPO|VAPO))\b", re.I)


GLUE_TEXT = re.compile(r"\{glue:text\}`([\w.+-]+?)(?::([^`]*))?`")


def glued_values(notebook: Path) -> dict[str, str]:
    """``{name: text/plain}`` of every value a notebook glued (what ``{glue:text}`` shows)."""
    values = {}
    if notebook.exists():
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            for output in cell.get("outputs", []):
                name = output.get("metadata", {}).get("scrapbook", {}).get("name")
                plain = output.get("data", {}).get("application/papermill.record/text/plain")
                if name and plain is not None:
                    values[name] = plain if isinstance(plain, str) else "".join(plain)
    return values


def render_glue(text: str, values: dict[str, str]) -> str:
    """``text`` with each ``{glue:text}`name:spec``` written as the book shows it (a number formatted with its
    spec; the role kept where the value is unknown)."""
    def one(m):
        name, spec = m.group(1), m.group(2)
        if name not in values:
            return m.group(0)
        try:
            return format(float(values[name]), spec or "").replace("-", "−")
        except ValueError:
            return values[name].strip("'\"")
    return GLUE_TEXT.sub(one, text)


def results_language_faults(text: str, name: str = "<text>", values: dict[str, str] | None = None) -> list[str]:
    """Prose paragraphs (joined, so that a phrase may span lines, glued numbers written as the book shows them)
    with a double negative, a tie worded as sameness, or project-tracker language."""
    lines = text.split("\n")
    faults = []
    for start, run in paragraphs(lines, classify(lines)):
        paragraph = render_glue(" ".join(line.strip() for line in run), values or {})
        for rule, what in ((DOUBLE_NEGATIVE, "a double negative (a fall by a negative number)"),
                           (TRACKER, "project-tracker language"),
                           (TIE_AS_SAMENESS, "a tie worded as sameness (say: no difference resolved, [low, high])")):
            for m in rule.finditer(paragraph):
                faults.append(f"{name}:{start + 1}: {what}: {m.group(0)!r}")
    return faults


@pytest.mark.parametrize("path", [p for p in BOOK_MD if p.parent.name != "appendix" or p.name != "plans.md"],
                         ids=rel)
def test_results_are_worded_as_their_intervals(path):
    notebook = ROOT / "notebooks" / path.relative_to(ROOT / "book").with_suffix(".ipynb")
    faults = results_language_faults(path.read_text(encoding="utf-8"), rel(path), glued_values(notebook))
    if faults:
        pytest.fail("\n".join(faults), pytrace=False)


def test_results_language_rule_catches_planted_faults():
    values = {"x_change": "-0.466", "x_drop": "0.466"}
    for text in ("Accuracy fell by {glue:text}`x_change:+.3f` in 200 steps.\n",
                 "Accuracy fell by {glue:text}`x_change:.3f` in 200 steps.\n",
                 "wrong answers were shorter, by\n−4.1 tokens.\n", "The issue's aim was not reached.\n",
                 "(issue 40 asks for it).\n", "GRPO did as well as VAPO here.\n"):
        assert results_language_faults(text, values=values), text
    clean = ("Accuracy changed by {glue:text}`x_change:+.3f`; it fell by {glue:text}`x_drop:.3f`.\n"
             "No difference was resolved: [−0.02, +0.03]. TRL has had an issue filed about it.\n")
    assert results_language_faults(clean, values=values) == []


@pytest.mark.parametrize("path", CHAPTERS, ids=rel)
def test_chapter_opens_with_at_a_glance(path):
    fault = glance_fault(path.read_text(encoding="utf-8"), rel(path))
    if fault:
        pytest.fail(fault, pytrace=False)


def test_at_a_glance_rule_catches_planted_faults():
    good = "# T\n\n:::{admonition} At a glance\n:class: at-a-glance\n**Idea.** x.\n:::\n\n## One\n"
    assert glance_fault(good, "g") is None
    assert glance_fault(good.replace(":class: at-a-glance\n", ""), "g")
    assert glance_fault("# T\n\n## One\n\n" + good.split("\n\n", 1)[1], "g"), "box after the first section"
    assert glance_fault("# T\n\nText.\n\n## One\n", "g")


GLANCE_MAX_WORDS = 150  # four fields: Idea, Key equation, You will be able to, Result
# a glued value shows as one word; a cross-reference as its visible text (the text before <label>, or the label)
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`[^`]*`")
REF_ROLE = re.compile(r"\{(?:ref|numref|term|doc)\}`([^`]*)`")


def glance_body(text: str) -> tuple[int, str] | None:
    """(line number, text) of a chapter's At a glance box, without its options (`:class:`), or None without one."""
    lines = text.split("\n")
    for j, line in enumerate(lines):
        m = GLANCE.match(line)
        if not m:
            continue
        fence, body = m.group(1), []
        k = j + 1
        while k < len(lines) and OPTION.match(lines[k]):
            k += 1
        while k < len(lines) and not (lines[k].strip().startswith(fence[0] * len(fence))
                                      and set(lines[k].strip()) == {fence[0]}):
            body.append(lines[k])
            k += 1
        return j + 1, "\n".join(body)
    return None


def glance_words(text: str) -> tuple[int, int] | None:
    """(line number, word count) of a chapter's At a glance box, or None without one: the box's text without its
    options (`:class:`), as whitespace-separated tokens, each glued value one word and each cross-reference the
    words of its visible text."""
    found = glance_body(text)
    if found is None:
        return None
    box = GLUE_ROLE.sub("W", found[1])
    box = REF_ROLE.sub(lambda r: re.sub(r"\s*<[^<>]*>$", "", r.group(1)), box)
    return found[0], len(box.split())


@pytest.mark.parametrize("path", CHAPTERS, ids=rel)
def test_at_a_glance_is_at_most_the_word_limit(path):
    found = glance_words(path.read_text(encoding="utf-8"))
    if found and found[1] > GLANCE_MAX_WORDS:
        pytest.fail(f"{rel(path)}:{found[0]}: the At a glance box has {found[1]} words (at most "
                    f"{GLANCE_MAX_WORDS}: the idea in a sentence or two and the headline result)", pytrace=False)


def test_glance_word_count_catches_planted_faults():
    box = ":::{{admonition}} At a glance\n:class: at-a-glance\n{}\n:::\n\n## One\n"
    assert glance_words("# T\n\n" + box.format("**Idea.** one two three.")) == (3, 4)
    assert glance_words("# T\n\n## One\n") is None
    glued = "rose by {glue:text}`x_gain:+.3f` [{glue:text}`x_lo:+.3f`, {glue:text}`x_hi:+.3f`] ({numref}`fig-x`)"
    assert glance_words(box.format(glued)) == (1, 6), "a glued value or a bare label is one word"
    assert glance_words(box.format("see {ref}`the plan for it <plan-x>`.")) == (1, 5), "a reference's visible text"
    assert glance_words(box.format(" ".join(["word"] * (GLANCE_MAX_WORDS + 1))))[1] > GLANCE_MAX_WORDS


# A figure shows an experiment when the code that makes it reads stored results or trains: the statements its
# cell runs, and, back through the names they use, the earlier statements that assigned those names.
EXPERIMENT = re.compile(r"\bload_results\(|\bjson\.loads?\(|results/|\bRESULTS\b|experiment_results_dir\(|"
                        r"\bTrainer\(|\.train\(|\btrain_\w+\(|\btrain\(|\bq_learning\(|\bsarsa\(|\brun_seeds?\(")


def code_statements(cells: list[str]) -> list[tuple[int, str, set[str], set[str]]]:
    """(cell index, source, names assigned, names used) of every top-level statement of the code cells."""
    out = []
    for index, source in enumerate(cells):
        if source is None:
            continue
        clean = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))
        try:
            tree = ast.parse(clean)
        except SyntaxError:
            continue
        for node in tree.body:
            assigned, used = set(), set()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue  # imports load nothing; `import json` is no reading of results
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assigned.add(node.name)
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name):
                    (assigned if isinstance(sub.ctx, ast.Store) else used).add(sub.id)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    root = sub
                    while isinstance(root, (ast.Attribute, ast.Subscript)):
                        root = root.value
                    if isinstance(root, ast.Name):
                        assigned.add(root.id)
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Store) \
                        and isinstance(sub.value, ast.Name):
                    assigned.add(sub.value.id)
            out.append((index, ast.get_source_segment(clean, node) or "", assigned, used))
    return out


def experiment_cells(cells: list[str | None]) -> set[int]:
    """Indices of the code cells that read stored results or train, directly or through the names they use."""
    statements = code_statements(cells)
    last: dict[str, int] = {}
    sources = []  # per statement: the earlier statements that assigned the names it uses
    for k, (_, _, assigned, used) in enumerate(statements):
        sources.append({last[name] for name in used if name in last})
        for name in assigned:
            last[name] = k
    loads: list[bool] = []
    for k, (_, source, _, _) in enumerate(statements):  # sources come first, so one pass suffices
        loads.append(bool(EXPERIMENT.search(source)) or any(loads[e] for e in sources[k]))
    return {statements[k][0] for k in range(len(statements)) if loads[k]}


TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
FIGURE = re.compile(r"^(`{3,}|:{3,})\{(glue:figure|figure)\}\s*(\S*)\s*$")


CODE_CELL = re.compile(r"^(`{3,})\{code-cell\}")


def code_cells(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index of the opening fence, of the first source line, source without its options) of every code
    cell of a MyST file."""
    cells, j = [], 0
    while j < len(lines):
        m = CODE_CELL.match(lines[j])
        if not m:
            j += 1
            continue
        start, fence = j, m.group(1)
        j += 1
        if j < len(lines) and lines[j].strip() == "---":  # options as YAML
            j += 1
            while j < len(lines) and lines[j].strip() != "---":
                j += 1
            j += 1
        while j < len(lines) and OPTION.match(lines[j]):
            j += 1
        body, first = [], j
        while j < len(lines) and lines[j].rstrip() != fence:
            body.append(lines[j])
            j += 1
        cells.append((start, first, "\n".join(body)))
        j += 1
    return cells


def figure_faults(text: str, name: str) -> tuple[list[str], list[str]]:
    """(faults, experiment figures) of one chapter: each experiment figure needs a table and a Finding line."""
    lines = text.split("\n")
    kinds = classify(lines)
    cells = code_cells(lines)
    experimental = experiment_cells([source for _, _, source in cells])
    figures = []
    for j, line in enumerate(lines):
        m = FIGURE.match(line)
        if m and m.group(2) == "glue:figure":
            key = m.group(3)
            if not key:  # the key may come as the :name: option
                o = re.match(r"^:name:\s*(\S+)", lines[j + 1]) if j + 1 < len(lines) else None
                key = o.group(1) if o else ""
            figures.append((j, key))
    faults, experiments = [], []
    for n, (j, key) in enumerate(figures):
        makers = [k for k, (at, _, source) in enumerate(cells) if at < j
                  and re.search(rf"['\"]{re.escape(key)}['\"]", source)]
        is_experiment = bool(makers) and makers[-1] in experimental
        if not is_experiment:
            continue
        experiments.append(key)
        # the figure's block ends at its closing fence
        end = j + 1
        while end < len(lines) and kinds[end] != "fence":
            end += 1
        stop = end + 1
        while stop < len(lines) and not (kinds[stop] == "prose" and HEADING.match(lines[stop])) \
                and not FIGURE.match(lines[stop]):
            stop += 1
        after = [(lines[k], kinds[k]) for k in range(end + 1, stop)]
        has_table = any(TABLE_ROW.match(a) and kind == "prose" and k + 1 < len(after) and TABLE_RULE.match(
            after[k + 1][0]) for k, (a, kind) in enumerate(after)) or any(
            re.match(r"^(`{3,}|:{3,})\{(list-table|table)\}", a) for a, _ in after)
        has_finding = any(a.startswith("**Finding.**") and kind == "prose" for a, kind in after)
        missing = [what for what, ok in (("a results table", has_table), ("a '**Finding.**' line", has_finding))
                   if not ok]
        if missing:
            faults.append(f"{name}:{j + 1}: experiment figure {key} is not followed by "
                          f"{' and '.join(missing)} before line {stop + 1}")
    return faults, experiments


@pytest.mark.parametrize("path", CHAPTERS, ids=rel)
def test_experiment_figure_has_table_and_finding(path):
    faults, _ = figure_faults(path.read_text(encoding="utf-8"), rel(path))
    if faults:
        pytest.fail("\n".join(faults), pytrace=False)


def test_figure_rule_catches_planted_faults():
    head = "---\nkernelspec:\n  name: python3\n---\n\n# T\n\n"
    cell = ('```{code-cell} ipython3\nfrom rlbook.experiment import load_results\nruns = load_results("x")\n```\n'
            '\n```{code-cell} ipython3\nfig = plot(runs)\nglue("fig-x", fig)\n```\n\n'
            "```{glue:figure} fig-x\n:name: fig-x\n\nCaption.\n```\n\n")
    table = "| | a |\n|---|---|\n| x | {glue:text}`x` |\n\n"
    finding = "**Finding.** It works.\n\n"
    assert figure_faults(head + cell + table + finding + "## Next\n", "c") == ([], ["fig-x"])
    assert figure_faults(head + cell + finding + "## Next\n", "c")[0], "no table"
    assert figure_faults(head + cell + table + "## Next\n\n" + finding, "c")[0], "finding after the next section"
    illustration = cell.replace('from rlbook.experiment import load_results\nruns = load_results("x")',
                                "runs = [1, 2]")
    assert figure_faults(head + illustration + "## Next\n", "c") == ([], []), "an illustration needs no table"


# ---------------------------------------------------------------------------------------------------------
# 4. Glossary links: each chapter links, at or before its first use, every glossary term its prose uses
# ---------------------------------------------------------------------------------------------------------

GLOSSARY = ROOT / "book" / "appendix" / "glossary.md"
TERM_ROLE = re.compile(r"\{term\}`(?:[^`<>]*<([^`<>]+)>|([^`<>]+))`")  # the target: after "<", or the whole text
ANY_ROLE = re.compile(r"\{[A-Za-z][\w:+-]*\}`[^`]*`")
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\([^)]*\)|<https?://[^>]*>|https?://\S+")
CAPTIONED = {"{figure}", "{glue:figure}", "{table}"}  # a caption is no place for a link


def _outside(defining_part: str):
    """Allowed in every part but the one that defines the word (a later part, Part VII on, included)."""
    return lambda part: part != defining_part


def _everywhere(part: str) -> bool:
    return True


def _in_part_i(part: str) -> bool:
    return part == "part1"


# Glossary names (lower case) a chapter may use without a link: name -> whether a chapter of `part` (the folder
# name, "part1", ...) may. 13 glossary entries:
GLOSSARY_UNLINKED = {
    # The MDP's basic words and the book's subject, in nearly every paragraph of every chapter: Part I defines
    # and links them ("action", "agent" and "environment" are rarer later and are linked where they appear).
    **dict.fromkeys(("state", "reward", "policy", "reinforcement learning", "rl"), _outside("part1")),
    # Their language-model counterparts: Part II defines them; every later chapter is written in them.
    **dict.fromkeys(("token", "prompt", "response", "completion"), _outside("part2")),
    # The entry is TD's step size α (Part I); later chapters mean the optimiser's setting, which it does not define.
    **dict.fromkeys(("learning rate", "step size"), _outside("part1")),
    # English words with a second sense that whole-word matching cannot tell apart: a function "returns" a value,
    # a number is raised to a "power". "statistical power" must still be linked where it is written out.
    "return": _everywhere,
    "power": _everywhere,
    # Everyday words in Part I (FrozenLake's frozen tiles, a random-number generator, the vocabulary of the
    # chapter); their glossary senses (a frozen reference, GAPO's generator, a tokenizer's vocabulary) come later.
    **dict.fromkeys(("frozen", "generator", "vocabulary"), _in_part_i),
}


def glossary_names(text: str) -> dict[str, int]:
    """``{name: entry number}`` of every term line and alias line of every ``{glossary}`` block: an entry is a
    run of unindented lines (the term, then its aliases) followed by its indented definition."""
    names: dict[str, int] = {}
    entry, fence, after_term = -1, None, False
    for line in text.split("\n"):
        if fence is None:
            m = FENCE.match(line)
            if m and m.group(3) == "{glossary}":
                fence = m.group(2)
            continue
        if line.strip() == fence:
            fence = None
        elif line.strip() and not line[0].isspace() and not OPTION.match(line):
            entry += 0 if after_term else 1
            names[line.strip()] = entry
            after_term = True
            continue
        after_term = False
    return names


def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group(0))


def glossary_uses(text: str, names: dict[str, int], unlinked: frozenset | set = frozenset()):
    """What a chapter does with the glossary, line numbers counted from 0:

    - uses: ``{entry: (line, word, column)}``, the first prose use of any name of each entry;
    - links: ``{entry: line}``, the first ``{term}`` link to any name of each entry;
    - unknown: ``[(line, target)]``, ``{term}`` links to no glossary name;
    - sections: the ``#``/``##`` section each line is in (0 before the first heading).

    Prose is what ``classify`` calls prose, less headings, figure or table captions and the rows of a table that
    the chapter's own code reads back (its ``(label)=`` target is named in a code cell: a role there would break
    the comparison), and, inside it, less roles (a link or a reference carries no second link), code spans,
    Markdown links and ``$...$`` math. A name is used where it occurs as a whole word (hyphens join words: "token"
    does not occur in "token-level"; a line break may fall between the words of a name) with an optional plural
    "s" or "es", in any case, except names written in capitals (RL, REINFORCE, EOS), which match only in capitals;
    the longest name wins where names overlap. Names in ``unlinked`` are not looked for.
    """
    lower = {n.lower(): e for n, e in names.items()}
    wanted = sorted((n for n in names if n.lower() not in unlinked), key=len, reverse=True)
    alternatives = (re.escape(n).replace("\\ ", r"\s+") for n in wanted)  # a name may wrap onto the next line
    pattern = re.compile(r"(?<![\w-])(%s)(?:e?s)?(?![\w-])" % "|".join(
        a if n != n.upper() else f"(?-i:{a})" for n, a in zip(wanted, alternatives)), re.I)
    lines = text.split("\n")
    kinds = classify(lines)
    code = "\n".join(line for line, kind in zip(lines, kinds) if kind == "code")
    sections, prose, section, caption, read_back = [], [], 0, None, False
    for line, kind in zip(lines, kinds):
        target = re.match(r"^\((\S+)\)=$", line.strip()) if kind == "meta" else None
        if target:
            read_back = target.group(1) in code
        elif line.strip() and not line.lstrip().startswith("|"):
            read_back = False
        m = FENCE.match(line)
        if kind == "fence" and m:
            if caption is None and (m.group(3) or "") in CAPTIONED:
                caption = (m.group(2)[0], len(m.group(2)))
            elif caption and m.group(2)[0] == caption[0] and len(m.group(2)) >= caption[1] and not m.group(3):
                caption = None
        heading = HEADING.match(line) if kind == "prose" else None
        section += bool(heading and len(heading.group(1)) <= 2)
        sections.append(section)
        checked = read_back and line.lstrip().startswith("|")
        prose.append("prose" if kind == "prose" and not heading and caption is None and not checked else "other")
    uses, links, unknown = {}, {}, []
    for start, run in paragraphs(lines, prose):
        block = "\n".join(run)  # a role may wrap onto the next line
        for r in TERM_ROLE.finditer(block):
            at = start + block.count("\n", 0, r.start())
            target = " ".join((r.group(1) or r.group(2)).split()).lower()
            if target in lower:
                links.setdefault(lower[target], at)
            else:
                unknown.append((at, target))
        block = "\n".join(MARKDOWN_LINK.sub(_blank, CODE_SPAN.sub(_blank, line))
                          for line in ANY_ROLE.sub(_blank, block).split("\n"))
        pieces = DOLLAR.split(block.replace("\\$", "  "))
        block = " ".join(p if k % 2 == 0 else re.sub(r"[^\n]", " ", p) for k, p in enumerate(pieces))
        for u in pattern.finditer(block) if wanted else ():
            line_start = block.rfind("\n", 0, u.start()) + 1
            uses.setdefault(lower[" ".join(u.group(1).split()).lower()],
                            (start + block.count("\n", 0, u.start()), u.group(0), u.start() - line_start))
    return uses, links, unknown, sections


def glossary_link_faults(text: str, names: dict[str, int], name: str = "<text>", part: str = "") -> list[str]:
    """The rule: every glossary term a chapter's prose uses (any name of its entry: the term or an alias) is
    linked with ``{term}`` in that chapter, and the first link comes no later than the section (``#`` or ``##``)
    of the first use: at the first use, earlier in the chapter, or further on in the same section. Every link
    names a glossary term. Names that ``GLOSSARY_UNLINKED`` allows in ``part`` are not looked for."""
    unlinked = {n for n, allowed in GLOSSARY_UNLINKED.items() if allowed(part)}
    uses, links, unknown, sections = glossary_uses(text, names, unlinked)
    lines = text.split("\n")
    headings = {sections[j]: line.lstrip("#").strip() for j, line in enumerate(lines)
                if HEADING.match(line) and j < len(sections) and (j == 0 or sections[j] != sections[j - 1])}
    term = {}
    for n, e in names.items():
        term.setdefault(e, n)
    faults = [f"{name}:{j + 1}: {{term}}`{target}` links to no glossary term" for j, target in unknown]
    for e, (j, word, _) in sorted(uses.items(), key=lambda item: item[1][0]):
        where = f"{name}:{j + 1}: '{' '.join(word.split())}' (glossary: {term[e]})"
        section = headings.get(sections[j], "before the first heading")
        if e not in links:
            faults.append(f"{where}, first used here (section '{section}'), is never linked with {{term}}")
        elif sections[links[e]] > sections[j]:
            faults.append(f"{where}, first used here (section '{section}'), is first linked at line "
                          f"{links[e] + 1}, in a later section")
    return faults


def glossary() -> dict[str, int]:
    return glossary_names(GLOSSARY.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", CHAPTERS, ids=rel)
def test_each_chapter_links_the_glossary_terms_it_uses(path):
    """The glossary promises that chapters link the first use of a term; this holds every chapter of book/part*/
    to it. The terms are every term line and alias of the glossary's {glossary} blocks. A chapter uses a term where
    its prose (not code, math, directive options, headings, captions, roles or link targets) has one of its names
    as a whole word, in any case (a name in capitals only in capitals), plural "s"/"es" allowed. Each term used
    must be linked with {term} (to any of its names) somewhere in the chapter, and the first link must come no
    later than the `##` section of the first use: at that use, earlier, or further on in the same section (a
    reader who meets the word can find its link without leaving the section). The most general words are spared
    outside the part that defines them, and words with a second English sense everywhere (GLOSSARY_UNLINKED, each
    entry explained there). The introduction, a map of the whole book that names nearly every term once, is left
    out: the chapters link each term where they explain it."""
    faults = glossary_link_faults(path.read_text(encoding="utf-8"), glossary(), rel(path), path.parent.name)
    if faults:
        pytest.fail("\n".join(faults), pytrace=False)


def test_glossary_has_the_entries_the_chapters_lean_on():
    names = {n.lower(): e for n, e in glossary().items()}
    for term in ("model organism", "rlvr", "gold accuracy", "expected accuracy", "paired seeds", "t-interval",
                 "statistical power", "multiplicity correction", "not resolved", "baseline", "overlong filtering"):
        assert term in names, f"the glossary has no entry or alias '{term}'"
    assert names["power"] == names["statistical power"] and names["not resolved"] == names["no difference resolved"]
    assert set(GLOSSARY_UNLINKED) <= set(names), set(GLOSSARY_UNLINKED) - set(names)


def test_glossary_link_rule_catches_planted_faults():
    entries = ("```{glossary}\nmodel organism\norganism\n  **模式生物** †. A setting.\n\npaired seeds\n"
               "  **配对种子** †. Runs.\n\ngroup\n  **组**. Samples.\n\ngroup size\n  **组大小**. G.\n\n"
               "REINFORCE\n  **REINFORCE**. An algorithm.\n\nstate\n  **状态**. A state.\n```\n")
    names = glossary_names(entries)
    assert names == {"model organism": 0, "organism": 0, "paired seeds": 1, "group": 2, "group size": 3,
                     "REINFORCE": 4, "state": 5}
    head = "---\nkernelspec:\n  name: python3\n---\n\n# T\n\n"
    good = head + ("The {term}`model organism` runs on five {term}`paired seeds`.\n\n## One\n\n"
                   "Each organism is small; the {term}`group size <group size>` $G$, of a {term}`group`, is 8.\n"
                   "We reinforce it. Plain {term}`REINFORCE` fails.\n\n## Two\n\nThe organism again.\n")
    assert glossary_link_faults(good, names, "c") == []
    faults = glossary_link_faults(good.replace("{term}`paired seeds`", "paired seeds"), names, "c")
    assert len(faults) == 1 and "c:8: 'paired seeds'" in faults[0] and "never linked" in faults[0], faults
    late = head + "A model organism, at first.\n\n## One\n\nThe {term}`model organism` again.\n"
    assert "first linked at line 12, in a later section" in glossary_link_faults(late, names, "c")[0]
    same_section = head + "A model organism, at first; the {term}`organism`, linked in the same section.\n"
    assert glossary_link_faults(same_section, names, "c") == [], "a link later in the same section is enough"
    plural = head + "Two organisms.\n"
    assert "'organisms' (glossary: model organism)" in glossary_link_faults(plural, names, "c")[0]
    ignored = head + ("# Paired seeds in a heading\n\n`paired seeds` in code and $\\text{group}$ in math and\n"
                      "{ref}`the group <sec-x>` in a role, [a group](https://x.org/group) in a link; group-level and "
                      "token-level words.\n\n```{code-cell} ipython3\ngroup = 1  # group\n```\n\n"
                      "```{glue:figure} fig-x\n:name: fig-x\n\nThe group in a caption.\n```\n\n"
                      "```{math}\n\\mathrm{group}\n```\n\nState is exempt outside Part I.\n\n(tab-x)=\n\n"
                      "| a | b |\n|---|---|\n| group | 1 |\n\n```{code-cell} ipython3\ntext.split('(tab-x)=')\n```\n")
    assert glossary_link_faults(ignored, names, "c", "part4") == []
    assert glossary_link_faults(ignored.replace("'(tab-x)='", "'(tab-y)='"), names, "c", "part4"), \
        "a table no code reads back is prose"
    assert glossary_link_faults("State.\n", names, "c", "part1"), "state is linked in Part I"
    assert "never linked" in glossary_link_faults(head + "the REINFORCE estimator", names, "c")[0]
    assert glossary_link_faults(head + "the {term}`organisms`.\n", names, "c") == [
        "c:8: {term}`organisms` links to no glossary term"]
    wrapped = head + ("A {term}`model\norganism <model organism>` and {term}`group size`: no bare group,\n"
                      "no paired\nseeds.\n")
    assert [f.split(",")[0] for f in glossary_link_faults(wrapped, names, "c")] == [
        "c:9: 'group' (glossary: group)", "c:10: 'paired seeds' (glossary: paired seeds)"], "a name wraps too"


# ---------------------------------------------------------------------------------------------------------
# 5. Numbers in the prose are glued or allowed
# ---------------------------------------------------------------------------------------------------------

# The chapters the rule covers: every MyST text notebook with an executed twin, and the introduction.
NUMBER_CHAPTERS = [p for p in BOOK_MD
                   if (ROOT / "notebooks" / p.relative_to(ROOT / "book").with_suffix(".ipynb")).exists()
                   or p == ROOT / "book" / "intro.md"]
ARXIV = re.compile(r"\barXiv\s*:?\s*\d{4}\.\d{4,5}(?:v\d+)?|(?<![\w.])\d{4}\.\d{4,5}(?:v\d+)?(?![\w.])", re.I)
# a decimal (digit, point, digit; a version's further ".digits" kept with it), with an optional "%" after it, or
# a whole number followed by "%"; a "×" after a number does not change it
PROSE_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)+)(?:\s?(%))?(?!\w)|(?<![\w.])(\d+)\s?%")


def prose_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, number) of every decimal number and percentage in a chapter's prose, as written, with a
    percentage written without its space ("12 %" -> "12%"). Prose is what ``classify`` calls prose (no code
    cells or fences, no math blocks, no directive options, no front matter or comments), less, inside each
    paragraph, roles ({glue:text}`...`, {eq}`...`, {cite}`...`, ...; a role may wrap onto the next line), code
    spans, Markdown links and URLs, arXiv identifiers and ``$...$`` math."""
    lines = text.split("\n")
    found = []
    for start, run in paragraphs(lines, classify(lines)):
        block = ANY_ROLE.sub(_blank, "\n".join(run))
        block = "\n".join(ARXIV.sub(_blank, MARKDOWN_LINK.sub(_blank, CODE_SPAN.sub(_blank, line)))
                          for line in block.split("\n"))
        pieces = DOLLAR.split(block.replace("\\$", "  ").replace("$$", "  "))
        block = " ".join(p if k % 2 == 0 else re.sub(r"[^\n]", " ", p) for k, p in enumerate(pieces))
        for m in PROSE_NUMBER.finditer(block):
            number = m.group(1) + ("%" if m.group(2) else "") if m.group(1) else m.group(3) + "%"
            found.append((start + block.count("\n", 0, m.start()) + 1, number))
    return found


# Numbers the prose may write by hand. Each value is its category: "setting" (a hyperparameter or threshold the
# text states as chosen), "constant" (a definition, a version, a section number, a paper's reported value, a
# worked example computed in the text by hand from stated inputs) or "pilot" (a figure of an earlier pilot, quoted
# from experiments/PLANS.md, which stores no result file). A result of a stored run or of the chapter's code is
# never listed here: it is glued ({glue:text}`name:.3f`).
PROSE_NUMBER_CATEGORIES = {"setting", "constant", "pilot"}
PROSE_NUMBERS_EVERYWHERE = {
    "95%": "setting",  # the level of every interval the book reports
    "80%": "setting",  # the power a planned comparison is designed for
    "5%": "setting",  # the level of a two-sided test (and the share that Bonferroni divides)
    "0.2": "setting",  # PPO's and GRPO's clip ε (and PPO's value clip)
    "0.28": "setting",  # DAPO's ε_high (clip-higher)
    "0.95": "setting",  # PPO's GAE λ
    "1.16": "constant",  # the TRL version the book checks against
}
PROSE_NUMBERS_ALLOWED = {
    "appendix/errata.md": {
        "0.26": "constant",  # the study note's std in its GRPO example
        "90%": "constant",  # the study note's share of the greedy action
        "71%": "constant", "85%": "constant",  # E26: GFPO's published length reductions (46-71 %, 71-85 %)
        "4.1%": "constant", "1.4%": "constant",  # E19: GMPO's published headline gains
        "60.4": "constant",  # E16: VAPO's published AIME 2024 score
    },
    "part7/after_the_note.md": {
        "20%": "setting",  # the share of tokens the high-entropy filter keeps (top_entropy_quantile 0.2)
    },
    "appendix/reading_experiments.md": {
        "0.466": "constant",  # an example of how a change is written
    },
    "part1/q_learning.md": {
        "9.3": "constant", "11.5": "constant", "2.2": "constant", "5.4": "constant",  # sections of Sutton & Barto
        "6.6": "constant",  # Example 6.6 of Sutton & Barto
        "10%": "constant", "90%": "constant",  # the study note's split for ε = 0.1
    },
    "part2/lm_policies.md": {
        "90%": "setting",  # the training share of each task's split
        "0.1": "setting",  # the temperature plotted as greedy decoding
        "0.5": "constant",  # the accuracy at which a standard error is worked out
    },
    "part3/policy_gradient.md": {
        "0.5": "setting",  # the bandit's reward standard deviation
        "0.483": "pilot", "0.499": "pilot", "0.348": "pilot",  # the 2-seed pilot with rewards {1, 2}
    },
    "part3/ppo.md": {
        "10%": "constant",  # a bias of -0.1 on a KL of 1, worked in the text
        "0.1": "setting",  # vf_coef; and the rule of thumb for approx_kl
        "1.5": "constant",  # the standard error of one sampled evaluation (by hand); the assertion's threshold
        "4.1": "constant", "4.3": "constant",  # step numbers of the algorithm box
        "0.001": "setting",  # the lower ratio bound of the unclipped arm
        "20%": "constant",  # the clip's ε = 0.2 as a share
        "0.07": "pilot", "0.3": "pilot",  # the critic pilots' explained variance and its aim
        "30%": "constant",  # an exercise's input
        "90%": "constant",  # the share of the value's move in the worked value-clip cell
    },
    "part4/dapo.md": {
        "0.4": "setting",  # the entropy threshold in nats
        "0.29": "pilot", "0.23": "pilot",  # the detectable difference and spread from the entropy pilot
        "90%": "setting",  # the accuracy the arithmetic_solved policy is trained to
        "0.6": "constant",  # an exercise's input
    },
    "part4/dr_grpo.md": {
        "25%": "setting",  # the plan's target for length inflation
        "6%": "pilot", "2.5": "pilot",  # the rejected long-answer pilot
    },
    "part4/gfpo.md": {
        "72%": "constant", "71%": "constant", "85%": "constant", "7%": "constant",  # the GFPO paper's figures
        "0.5": "constant",  # keeping 8 of 16 would keep half the budget
        "25%": "setting",  # the plan's target for length inflation
        "0.03": "setting",  # the length-growth plan's margin on accuracy for "no loss"
    },
    "part4/gmpo.md": {
        "0.1": "constant",  # an example ratio
        "4.1%": "constant", "1.4%": "constant",  # the GMPO paper's gains
        "3.25": "constant", "1.78": "constant",  # the study note's AM and GM of [1, 1, 1, 10]
        "0.4": "setting", "0.8": "setting", "1.2": "setting",  # GMPO's log clip, GRPO's clip range
    },
    "part4/grpo.md": {
        "0.26": "constant", "1.15": "constant",  # the study note's worked example
        "90%": "constant",  # an accuracy one might hope for
    },
    "part4/lambda_grpo.md": {
        "1.9": "constant", "1.0": "constant", "1.7": "constant",  # the λ-GRPO paper's gains
    },
    "part5/dpo.md": {
        "0.018": "constant", "0.5": "constant", "0.98": "constant",  # σ(−4), σ(0), σ(4): the worked weights
    },
    "part5/gapo.md": {
        "0.1": "setting",  # the gain a hidden cell asserts
        "0.01": "setting",  # the KL coefficient
        "0.44": "pilot", "0.60": "pilot", "0.83": "pilot",  # the judge pilots listed in experiments/PLANS.md
        "90%": "setting",  # the judge accuracy aimed for
    },
    "part5/ppo_rlhf.md": {
        "20%": "constant",  # the adaptive KL controller's limit per horizon
        "2%": "constant",  # its step for n/H = 0.1, worked in the text
        "0.5": "setting",  # the bracket width called narrow
    },
    "part5/vapo.md": {
        "60.4": "constant",  # the VAPO paper's AIME 2024 score
        "5%": "constant",  # the length-adaptive λ's horizon, a share of the length
        "0.5": "setting",  # α rescaled; λ_policy of a 40-token answer (worked)
        "0.81": "constant", "0.9": "constant", "0.98": "constant",  # λ_policy = 1 − 1/(α l), worked
        "0.1": "pilot",  # the critic pilots' explained variance (experiments/PLANS.md)
    },
    "part6/beyond_one_machine.md": {
        "8.0": "constant",  # a CUDA compute capability
        "0.4": "setting",  # GMPO's ε
    },
    "part6/family.md": {
        "0.05": "setting", "0.04": "setting", "0.01": "setting",  # KL coefficients
        "0.4": "setting", "0.0003": "setting", "0.0004": "setting",  # GMPO's and GSPO's clip ranges
        "1.05": "setting",  # SAPO's temperature for negative advantages (the settings table, checked against it)
    },
    "part6/head_to_head.md": {
        "0.04": "setting", "0.05": "setting",  # GRPO's and PPO-RLHF's KL coefficients
        "0.03": "setting",  # the plan's accuracy margin for a "no worse" promise
    },
}


def prose_number_faults(text: str, name: str = "<text>", allowed: dict | None = None) -> list[str]:
    """'name:line: number' for every number of the prose that is neither in the global allow-list nor in
    ``allowed`` (the chapter's own)."""
    ok = PROSE_NUMBERS_EVERYWHERE | (allowed or {})
    return [f"{name}:{line}: {number!r} is typed by hand: glue it, or allow-list it (setting, constant, pilot)"
            for line, number in prose_numbers(text) if number not in ok]


def chapter_key(path: Path) -> str:
    return str(path.relative_to(ROOT / "book"))


@pytest.mark.parametrize("path", NUMBER_CHAPTERS, ids=rel)
def test_prose_numbers_are_glued_or_allowed(path):
    """"Every number in the prose is computed": a decimal number (0.44, 3.9×, 41.25) or a percentage (12 %, 4.1 %)
    in a chapter's prose is glued from the chapter's code, or it is a setting, a constant or a pilot's figure
    listed in PROSE_NUMBERS_EVERYWHERE or in the chapter's entry of PROSE_NUMBERS_ALLOWED."""
    faults = prose_number_faults(path.read_text(encoding="utf-8"), rel(path),
                                 PROSE_NUMBERS_ALLOWED.get(chapter_key(path), {}))
    if faults:
        pytest.fail("\n".join(faults), pytrace=False)


def test_prose_number_allow_list_is_current():
    """Every entry names a category and a chapter, and every chapter's entry is still written in its prose (an
    entry no longer needed would let a hand-typed result back in unseen)."""
    keys = {chapter_key(p): p for p in NUMBER_CHAPTERS}
    for allowed in (PROSE_NUMBERS_EVERYWHERE, *PROSE_NUMBERS_ALLOWED.values()):
        assert set(allowed.values()) <= PROSE_NUMBER_CATEGORIES, allowed
    stale = []
    for key, allowed in PROSE_NUMBERS_ALLOWED.items():
        assert key in keys, f"{key} is no chapter"
        written = {n for _, n in prose_numbers(keys[key].read_text(encoding="utf-8"))}
        stale += [f"{key}: {n}" for n in allowed if n not in written]
    assert not stale, f"allow-list entries no longer in the prose: {stale}"


def test_prose_number_rule_catches_planted_faults():
    chapter = ("---\njupytext:\n  version: 1.16\nkernelspec:\n  name: python3\n---\n\n# T\n\n"
               "Accuracy rose to {glue:text}`x_end:.3f` with $\\epsilon = 0.3$ and `lr=0.001`, see\n"
               "[arXiv:2402.03300](https://arxiv.org/abs/2402.03300) and {eq}`eq-1.5`.\n\n"
               "```{code-cell} ipython3\nassert 0.44 < end < 0.61\n```\n\n"
               "```{math}\n\\lambda = 0.95\n```\n\n"
               "```{glue:figure} fig-x\n:alt: Accuracy rises to 0.57.\n:name: fig-x\n\nThe caption.\n```\n\n"
               "The mean rose to 0.57, 3.9× the start; {glue:text}`x_pct:.1f` % of tokens and\n"
               "12 % of the prompts; the clip 0.2 as set.\n")
    faults = prose_number_faults(chapter, "c")
    assert [f.split(" is typed")[0] for f in faults] == ["c:28: '0.57'", "c:28: '3.9'", "c:29: '12%'"], faults
    assert prose_number_faults(chapter, "c", {"0.57": "pilot", "3.9": "constant", "12%": "setting"}) == []
    assert prose_numbers("A gain of 4.1 % and 41.25 points.\n") == [(1, "4.1%"), (1, "41.25")]
    assert prose_numbers("a wrapped {glue:text}`x_a:.2f` and {glue:text}`x_b:.2f` role, then $a = 0.5$\n") == []


if __name__ == "__main__":  # every finding at once: python tests/test_book_text.py
    for path in BOOK_MD:
        for fault in lint_text(path.read_text(encoding="utf-8"), rel(path)):
            print(fault)
    for path in NOTEBOOKS:
        for fault in notebook_faults(path):
            print(fault)
    for md in BOOK_MD:
        for line_no, path, options in literalincludes(md):
            for file_line, text in included_lines(path, options):
                if width(text) > MAX_CHARS:
                    print(f"{rel(path)}:{file_line}: {width(text)} characters (shown by {rel(md)}:{line_no})")
    for path in CHAPTERS:
        text = path.read_text(encoding="utf-8")
        fault = glance_fault(text, rel(path))
        if fault:
            print(fault)
        found = glance_words(text)
        if found and found[1] > GLANCE_MAX_WORDS:
            print(f"{rel(path)}:{found[0]}: the At a glance box has {found[1]} words")
        faults, experiments = figure_faults(text, rel(path))
        print(f"{rel(path)}: experiment figures: {', '.join(experiments) or 'none'}")
        for fault in faults:
            print(fault)
        for fault in glossary_link_faults(text, glossary(), rel(path), path.parent.name):
            print(fault)
    for path in NUMBER_CHAPTERS:
        for fault in prose_number_faults(path.read_text(encoding="utf-8"), rel(path),
                                         PROSE_NUMBERS_ALLOWED.get(chapter_key(path), {})):
            print(fault)
