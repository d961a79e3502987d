"""Write the reader copy of the chapter notebooks: the stored notebooks with the book's MyST-NB roles resolved.

JupyterLab with jupyterlab-myst renders MyST (math, admonitions, proofs, exercises) but knows nothing of
MyST-NB's glue or of Sphinx's cross-references. In the reader copy (``_build/reader/``, the same layout as
``notebooks/``, what ``make lab`` opens and what ``make student`` builds the student edition from)

- ``{glue:text}`name:fmt``` (and ``{glue}``, ``{glue:md}``) is the value glued in the notebook's stored outputs,
  formatted as MyST-NB formats it; a ``{glue:figure}`` directive is the stored image (a Markdown image with a
  data URI) followed by "**Figure N.k.**" and its caption in italics; ``{glue:math}`` is the math;
- a ``{literalinclude}`` is a fenced code block with the code it shows (read by Sphinx's own
  ``LiteralIncludeReader`` with the directive's options), under a one-line pointer to where it lives
  (``rlbook.objectives.policy_loss``, file and lines);
- ``{numref}``, ``{eq}``, ``{ref}``, ``{prf:ref}``, ``{term}``, ``{doc}`` read as the text the book prints
  ("Chapter 5 (PPO)", "Figure 6.1", "(6.2)", "Exercise 1.3", "Algorithm 6.1"; chapters numbered in ``_toc.yml``
  order, figures, equations, exercises and each kind of proof block counted per chapter) and ``{cite:t}`` /
  ``{cite:p}`` as author-year text from ``references.bib`` (names as the book's style ``_ext/rlbook_bibstyle.py``
  gives them);
- each chapter's title carries its number, and front matter in its first cell makes jupyterlab-myst number the
  equations, exercises and algorithms as the book does ("6.1"); display math without a label (``$$``) becomes
  an unnumbered ``{math}`` directive, since jupyterlab-myst would number it and the book does not;
- code cells are kept (the hidden ones still run: they compute what the text glues), collapsed where the book
  hides them (``remove-cell``/``remove-input``/``remove-output``), and the glue records are dropped from their
  outputs (JupyterLab has no renderer for them);
- each exercise's solution is collapsed: its prose in a ``{dropdown}`` ("Solution to Exercise 6.2"), its code
  cells hidden (``source_hidden``/``outputs_hidden``; they still run), the solution markers kept for
  ``make student``; a listing longer than 30 lines is a ``{dropdown}`` too, as in the book.

Usage::

    python scripts/make_reader.py                    # every notebooks/**/*.ipynb -> _build/reader/**
    python scripts/make_reader.py --out DIR notebooks/part4/grpo.ipynb
"""

from __future__ import annotations

import argparse
import re
import sys
from ast import literal_eval
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "notebooks"
OUT_DIR = ROOT / "_build" / "reader"
READER_KEY = "rlbook_reader"  # notebook metadata: the chapter number and the source notebook

_DIRECTIVE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|:{3,})\{(?P<name>[^}\s]+)\}[ \t]*(?P<arg>.*)$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_OPTION = re.compile(r"^\s*:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")
_TARGET = re.compile(r"^\((?P<label>[^)\s]+)\)=\s*$")
_HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<title>.+?)\s*#*\s*$")
_DOLLAR_LABEL = re.compile(r"\$\$\s*\((?P<label>[^)\s]+)\)\s*$")
_ROLE = re.compile(r"\{(?P<role>[A-Za-z][\w:.-]*)\}(?P<ticks>`+)(?P<content>.+?)(?P=ticks)(?!`)", re.S)
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
_PROOF_KINDS = {"algorithm", "theorem", "lemma", "definition", "remark", "conjecture", "corollary", "axiom",
                "example", "property", "observation", "proposition", "assumption", "criterion"}
_CODE_DIRECTIVES = {"code", "code-block", "sourcecode", "code-cell"}
_HIDE = {"remove-cell": ("source_hidden", "outputs_hidden"), "hide-cell": ("source_hidden", "outputs_hidden"),
         "remove-input": ("source_hidden",), "hide-input": ("source_hidden",),
         "remove-output": ("outputs_hidden",), "hide-output": ("outputs_hidden",)}


class ReaderError(ValueError):
    """Something in a chapter cannot be written into the reader copy (a missing glue value, an unknown label)."""


# ---------------------------------------------------------------------------------------------- the book's index
@dataclass
class Target:
    kind: str  # chapter, section, figure, equation, exercise, proof, code, table
    number: str | None  # "6.1", "5"; None where the book prints no number
    title: str = ""
    doc: str = ""


@dataclass
class Index:
    targets: dict[str, Target] = field(default_factory=dict)
    chapters: dict[str, int | None] = field(default_factory=dict)  # document (path without suffix) -> number
    citations: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (authors, year)


def _strip_roles(text: str) -> str:
    """A heading or caption without its roles, for use as a link text."""
    return _ROLE.sub(lambda m: _EXPLICIT.match(m["content"])["text"] if _EXPLICIT.match(m["content"])
                     else m["content"], text).strip()


def toc_documents(root: Path = ROOT) -> list[tuple[str, int | None]]:
    """``[(document path without suffix, chapter number or None)]`` in the book's order (``_toc.yml``)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    documents, number = [(toc["root"], None)], 0
    for part in toc.get("parts", []):
        for chapter in part.get("chapters", []):
            if part.get("numbered"):
                number += 1
            documents.append((chapter["file"], number if part.get("numbered") else None))
    return documents


def markdown_of(path: Path) -> str:
    """The Markdown a document's targets live in: the markdown cells of a notebook, or a .md file."""
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return path.read_text()


def _directive_blocks(lines: list[str], start: int = 0):
    """Yield ``(first line, end line (exclusive), name, argument, options, body lines)`` of each directive."""
    i = start
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i])
        if not match:
            i += 1
            continue
        end = _closing(lines, i, match["fence"])
        options, body, j = {}, [], i + 1
        while j < end and (option := _OPTION.match(lines[j])):
            options[option["key"]] = option["value"].strip()
            j += 1
        body = lines[j:end]
        yield i, min(end + 1, len(lines)), match["name"], match["arg"].strip(), options, body
        i += 1


def _closing(lines: list[str], i: int, fence: str) -> int:
    """Index of the line that closes the fence opened on line ``i`` (len(lines) if none does)."""
    char = fence[0]
    for j in range(i + 1, len(lines)):
        stripped = lines[j].strip()
        if stripped and set(stripped) == {char} and len(stripped) >= len(fence):
            return j
    return len(lines)


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def index_document(index: Index, doc: str, text: str, chapter: int | None) -> None:
    """Add the targets of one document to ``index``, numbered as the book numbers them."""
    counters: dict[str, int] = {}
    lines = text.splitlines()

    def number(kind: str) -> str:
        counters[kind] = counters.get(kind, 0) + 1
        return f"{chapter}.{counters[kind]}" if chapter is not None else str(counters[kind])

    pending: list[str] = []
    for i, line in enumerate(lines):
        if target := _TARGET.match(line):
            pending.append(target["label"])
            continue
        if heading := _HEADING.match(line):
            title = _strip_roles(heading["title"])
            for label in pending:
                if len(heading["level"]) == 1:
                    index.targets[label] = Target("chapter", str(chapter) if chapter else None, title, doc)
                else:
                    index.targets[label] = Target("section", None, title, doc)
            pending = []
        elif line.strip() and pending and not line.lstrip().startswith("|"):
            for label in pending:  # a target above a table or a paragraph: its label is all we have
                index.targets.setdefault(label, Target("table" if lines[i].startswith("|") else "section",
                                                       None, label, doc))
            pending = []
        if dollar := _DOLLAR_LABEL.search(line):
            index.targets[dollar["label"]] = Target("equation", number("equation"), "", doc)
    for _, _, name, arg, options, _ in _directive_blocks(lines):
        label = options.get("label") or options.get("name")
        if name in ("glue:figure", "figure"):
            if "name" in options:
                index.targets[options["name"]] = Target("figure", number("figure"), "", doc)
        elif name in ("math", "glue:math") and label:
            index.targets[label] = Target("equation", number("equation"), "", doc)
        elif name == "exercise":
            n = number("exercise")
            if label:
                index.targets[label] = Target("exercise", n, _strip_roles(arg), doc)
        elif name.startswith("prf:") and name[4:] in _PROOF_KINDS:
            n = number(name)
            if label:
                index.targets[label] = Target(name[4:], n, _strip_roles(arg), doc)
        elif name in ("literalinclude", "code-block", "code") and "name" in options:
            index.targets[options["name"]] = Target("code", None, _strip_roles(_unquote(options.get("caption", ""))),
                                                    doc)


def _book_extension(name: str):
    """A module of the book's Sphinx extensions (_ext/), which the reader copy follows."""
    if str(ROOT / "_ext") not in sys.path:
        sys.path.insert(0, str(ROOT / "_ext"))
    return __import__(name)


def is_long_listing(code: str) -> bool:
    """Whether the book collapses a listing of ``code`` (_ext/rlbook_html.py's rule: more than 30 lines)."""
    return _book_extension("rlbook_html").is_long_listing(code)


def read_citations(bib: Path) -> dict[str, tuple[str, str]]:
    """``key -> (author text, year)`` for author-year citations, from the book's own bibliography style
    (``_ext/rlbook_bibstyle.py``): "Schulman et al.", "Rafailov and Sharma", "Bellman"."""
    from pybtex.database import parse_file

    if str(ROOT / "_ext") not in sys.path:
        sys.path.insert(0, str(ROOT / "_ext"))
    from rlbook_bibstyle import author_year

    return {key: author_year(entry) for key, entry in parse_file(str(bib)).entries.items()}


def build_index(root: Path = ROOT) -> Index:
    index = Index()
    for doc, chapter in toc_documents(root):
        for suffix in (".ipynb", ".md"):
            path = root / (doc + suffix)
            if path.exists():
                index.chapters[doc] = chapter
                index_document(index, doc, markdown_of(path), chapter)
                break
    bib = root / "references.bib"
    if bib.exists():
        index.citations = read_citations(bib)
    return index


# ---------------------------------------------------------------------------------------------- glue values
def glue_values(nb) -> dict[str, dict]:
    """``name -> {mime type: data}`` of every value glued in the notebook's stored outputs."""
    values = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            record = output.get("metadata", {}).get("scrapbook")
            if not record:
                continue
            prefix = record.get("mime_prefix", "")
            values[record["name"]] = {k[len(prefix):]: v for k, v in output.get("data", {}).items()
                                      if k.startswith(prefix)}
    return values


def format_plain_text(text: str, fmt_spec: str) -> str:
    """MyST-NB's formatting of a glued ``text/plain`` value (myst_nb.core.variables.format_plain_text)."""
    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if fmt_spec == "":
        return str(value)
    type_char = fmt_spec[-1]
    if type_char == "s":
        value = str(value)
    elif type_char in "bcdoxX":
        value = int(value)
    elif type_char in "eEfFgGn%":
        value = float(value)
    return format(value, fmt_spec)


def _image(data: dict, alt: str, attachments: dict, name: str) -> str | None:
    """A Markdown image of a glued figure: a data URI for PNG/JPEG, a cell attachment for SVG."""
    alt = " ".join(alt.replace("[", "(").replace("]", ")").split())
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            payload = "".join(data[mime].split()) if isinstance(data[mime], str) else data[mime]
            return f"![{alt}](data:{mime};base64,{payload})"
    if "image/svg+xml" in data:
        import base64

        svg = data["image/svg+xml"]
        svg = "".join(svg) if isinstance(svg, list) else svg
        filename = f"{name}.svg"
        attachments[filename] = {"image/svg+xml": base64.b64encode(svg.encode()).decode()}
        return f"![{alt}](attachment:{filename})"
    return None


# ---------------------------------------------------------------------------------------------- literalinclude
def _sphinx_options(options: dict) -> dict:
    """The directive's options as Sphinx's ``literalinclude`` converts them (``:dedent:`` an int or None, ...)."""
    from sphinx.directives.code import LiteralInclude

    spec = LiteralInclude.option_spec
    return {key: spec[key](value or None) for key, value in options.items() if key in spec}


def literal_include(argument: str, options: dict, root: Path = ROOT) -> tuple[str, str, int, int]:
    """``(code, where, first line, last line)`` of a ``literalinclude`` as the book shows it: the code is what
    Sphinx's own reader returns for the directive's options, the line numbers are those of the file."""
    from sphinx.directives.code import LiteralIncludeReader
    from sphinx.pycode import PycodeError
    from sphinx.util import parselinenos

    path = root / argument.lstrip("/")
    config = SimpleNamespace(source_encoding="utf-8-sig")  # Sphinx's default
    try:
        shown = _sphinx_options(options)
        code, _ = LiteralIncludeReader(str(path), shown, config).read()
        # The file's line numbers of the lines shown: where pyobject/start/end put the first one (lineno-match),
        # then the :lines: picked from those (Sphinx refuses lineno-match for a disjoint :lines:, hence by hand).
        cut = {k: v for k, v in shown.items() if k in ("pyobject", "start-at", "start-after", "end-at", "end-before",
                                                       "tab-width", "encoding")}
        numbering = LiteralIncludeReader(str(path), dict(cut, **{"lineno-match": None}), config)
        _, count = numbering.read()
    except (ValueError, PycodeError) as error:
        raise ReaderError(f"literalinclude {argument} {options}: {error}") from error
    picked = range(count)
    if "lines" in shown:
        picked = [k for k in parselinenos(shown["lines"], count) if k < count]
    if not code or not picked:
        raise ReaderError(f"literalinclude {argument} {options}: shows no code")
    first, last = numbering.lineno_start + min(picked), numbering.lineno_start + max(picked)
    relative = path.relative_to(root).as_posix()
    where = f"`{relative}`"
    if relative.startswith("src/") and relative.endswith(".py"):
        module = relative[len("src/"):-len(".py")].replace("/", ".").removesuffix(".__init__")
        obj = f"{module}.{options['pyobject']}" if "pyobject" in options else module
        where = f"`{obj}` in `{relative}`"
    return code.removesuffix("\n"), where, first, last


# ---------------------------------------------------------------------------------------------- Markdown
@dataclass
class Context:
    index: Index
    doc: str
    chapter: int | None
    glue: dict[str, dict]
    root: Path = ROOT
    attachments: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _glue_text(ctx: Context, content: str, role: str) -> str:
    key, fmt = content, ""
    if role in ("glue:text", "glue:md") and ":" in content:  # as MyST-NB splits it: key:format_spec
        key, fmt = content.rsplit(":", 1)
    key = key.split("::", 1)[-1].strip()
    data = ctx.glue.get(key)
    if data is None:
        ctx.problems.append(f"no glued value named {key!r}")
        return f"**[{key}: not computed]**"
    if role == "glue:md" and "text/markdown" in data:
        return "".join(data["text/markdown"])
    if role in ("glue", "glue:any") and any(m.startswith("image/") for m in data):
        return _image(data, key, ctx.attachments, key) or key
    text = "".join(data.get("text/plain", key))
    return format_plain_text(text, fmt if role == "glue:text" else "")


def _reference(ctx: Context, role: str, content: str) -> str:
    explicit = _EXPLICIT.match(content)
    text, label = (explicit["text"], explicit["target"]) if explicit else (None, content.strip())
    label = label.lstrip("#").split(":")[-1] if role == "doc" else label
    target = ctx.index.targets.get(label)
    if role == "term":
        return text if text is not None else label
    if role == "doc":
        return text or label
    if target is None:
        ctx.problems.append(f"{{{role}}} target {label!r} not found")
        return text or label
    kind_names = {"figure": "Figure", "equation": "Equation", "chapter": "Chapter", "exercise": "Exercise",
                  "table": "Table", "code": "Listing"}
    name = kind_names.get(target.kind, target.kind.capitalize())
    number = target.number or ""
    if role == "eq":
        return f"({number})" if text is None else text.replace("%s", number).replace("{number}", number)
    if role == "numref":
        if text is None:
            return f"{name} {number}".strip()
        return text.replace("%s", number).replace("{number}", number).replace("{name}", target.title)
    if text is not None:
        return text
    if target.kind in ("exercise",) or target.kind in _PROOF_KINDS:
        return f"{name} {number}".strip()
    if target.kind == "figure":
        return f"Figure {number}"
    if target.kind == "equation":
        return f"({number})"
    if target.kind == "section" and target.title != label:
        return f"“{target.title}”"  # the book prints the section's title as a link; quoted, it reads as a name
    return target.title or label


def _cite(ctx: Context, role: str, content: str) -> str:
    keys = [k.strip() for k in content.split(",") if k.strip()]
    parts = []
    for key in keys:
        if key not in ctx.index.citations:
            ctx.problems.append(f"citation {key!r} not in references.bib")
        authors, year = ctx.index.citations.get(key, (key, ""))
        parts.append((authors, year))
    if role in ("cite:t", "cite:ts"):
        return "; ".join(f"{a} ({y})" if y else a for a, y in parts)
    inner = "; ".join(f"{a}, {y}" if y else a for a, y in parts)
    return inner if role in ("cite:alp", "cite:yearpar") else f"({inner})"


def resolve_roles(text: str, ctx: Context) -> str:
    """Every role of MyST-NB and Sphinx in ``text`` replaced by what the book prints; inline code is left alone."""
    out, i = [], 0
    while i < len(text):
        role = _ROLE.match(text, i) if text[i] == "{" else None
        if role:
            out.append(_render_role(role["role"], role["content"], role, ctx))
            i = role.end()
            continue
        if text[i] == "`" and (i == 0 or text[i - 1] == "\n" or text[:i].rsplit("\n", 1)[-1].isspace()) \
                and text.startswith("```", i):  # a fence line of a directive: not a code span
            run = re.match(r"`+", text[i:])[0]
            out.append(run)
            i += len(run)
            continue
        if text[i] == "`":  # an inline code span: copy it unchanged
            run = re.match(r"`+", text[i:])[0]
            close = re.compile(rf"(?<!`){run}(?!`)").search(text, i + len(run))
            end = close.end() if close else i + len(run)
            out.append(text[i:end])
            i = end
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _render_role(role: str, content: str, match: re.Match, ctx: Context) -> str:
    if role in ("glue", "glue:text", "glue:any", "glue:md"):
        return _glue_text(ctx, content, role)
    if role in ("numref", "eq", "ref", "prf:ref", "term", "doc", "any", "numref:ref"):
        return _reference(ctx, role, content)
    if role.startswith("cite"):
        return _cite(ctx, role, content)
    if role == "download":
        explicit = _EXPLICIT.match(content)
        return f"`{explicit['target'] if explicit else content}`"
    return match.group(0)  # {math}, {sub}, {sup}, {abbr}, {kbd}: jupyterlab-myst renders them


def _figure(ctx: Context, name: str, arg: str, options: dict, body: list[str]) -> list[str]:
    key = arg.split("::", 1)[-1].strip()
    data = ctx.glue.get(key)
    label = options.get("name")
    target = ctx.index.targets.get(label) if label else None
    caption = "\n".join(body).strip()
    if data is None or (image := _image(data, resolve_roles(options.get("alt", caption), ctx),
                                        ctx.attachments, key)) is None:
        ctx.problems.append(f"no glued image named {key!r}")
        image = f"**[figure {key}: not computed]**"
    lines = [image, ""]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", resolve_roles(caption, ctx)) if p.strip()]
    head = f"**Figure {target.number}.**" if target and target.number else "**Figure.**"
    for k, paragraph in enumerate(paragraphs or [""]):
        words = " ".join(paragraph.split())
        italic = f"*{words}*" if words else ""
        lines += [f"{head} {italic}".strip() if k == 0 else italic, ""]
    return lines[:-1]


def _glue_math(ctx: Context, arg: str, options: dict) -> list[str]:
    key = arg.split("::", 1)[-1].strip()
    data = ctx.glue.get(key, {})
    math = "".join(data.get("text/latex", data.get("text/plain", key))).strip().strip("$")
    label = options.get("label")
    target = ctx.index.targets.get(label) if label else None
    tag = f" \\tag{{{target.number}}}" if target and target.number else ""
    if key not in ctx.glue:
        ctx.problems.append(f"no glued math named {key!r}")
    return ["$$", math + tag, "$$"]


def _equation_number(ctx: Context, label: str) -> str | None:
    target = ctx.index.targets.get(label)
    return target.number if target is not None and target.kind == "equation" else None


def _include(ctx: Context, arg: str, options: dict) -> list[str]:
    try:
        code, where, first, last = literal_include(arg, options, ctx.root)
    except (OSError, ReaderError) as error:
        ctx.problems.append(str(error))
        return [f"**[code from `{arg}` not found]**"]
    # the docstrings' equation labels as the book prints them, "eq. (8.3)" (_ext/rlbook_html.py)
    code = _book_extension("rlbook_html").number_equation_labels(code, lambda label: _equation_number(ctx, label))
    language = options.get("language", "python")
    lines = f"line {first}" if first == last else f"lines {first}–{last}"
    caption = resolve_roles(_unquote(options.get("caption", "")), ctx)
    pointer = f"{caption} " if caption else ""
    pointer = f"*{pointer.strip()}* " if caption else ""
    run = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", code)), default=0))
    listing = [f"{pointer}From {where}, {lines}:", "", f"{run}{language}", code, run]
    if not is_long_listing(code):
        return listing
    # a long listing is collapsed, as in the book (_ext/rlbook_html.py): the title shows, the reader opens it
    title = f"{caption} ({len(code.splitlines())} lines)" if caption else f"Code: {where}, {lines}"
    colons = ":" * max(4, 1 + max((len(m) for m in re.findall(r"^\s*(:{3,})", code, re.M)), default=0))
    return [f"{colons}{{dropdown}} {' '.join(title.split())}", *listing, colons]


def transform_markdown(source: str, ctx: Context) -> str:
    """The reader's version of one markdown cell (see the module docstring)."""
    lines = source.splitlines()
    out, plain, i = [], [], 0
    open_fences: list[str] = []  # the fences of the directives passed through and not closed yet

    def flush():
        if plain:
            out.append(resolve_roles("\n".join(plain), ctx))
            plain.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if open_fences and stripped and set(stripped) == {open_fences[-1][0]} \
                and len(stripped) >= len(open_fences[-1]):
            open_fences.pop()  # the end of a directive passed through
            plain.append(line)
            i += 1
            continue
        directive, fence = _DIRECTIVE.match(line), _FENCE.match(line)
        if directive:
            name = directive["name"]
            end = _closing(lines, i, directive["fence"])
            options, j = {}, i + 1
            while j < end and (option := _OPTION.match(lines[j])):
                options[option["key"]] = option["value"].strip()
                j += 1
            body = lines[j:end]
            arg = directive["arg"].strip()
            replacement = None
            if name == "glue:figure" or name == "glue" or name == "glue:any":
                replacement = _figure(ctx, name, arg, options, body)
            elif name == "glue:math":
                replacement = _glue_math(ctx, arg, options)
            elif name == "literalinclude":
                replacement = _include(ctx, arg, options)
            elif name in _CODE_DIRECTIVES:
                flush()
                out.append("\n".join(lines[i:end + 1]))
                i = end + 1
                continue
            if replacement is not None:
                flush()
                out.append("\n".join(replacement))
                i = end + 1
                continue
            plain.append(line)  # a directive jupyterlab-myst renders: resolve the roles in its options and body
            if end < len(lines):
                open_fences.append(directive["fence"])
            i += 1
            continue
        if stripped.startswith("$$"):  # display math: unnumbered unless labelled, as in the book
            end = i
            while end < len(lines) and not (lines[end].rstrip().endswith("$$") and (end > i or len(stripped) > 2)) \
                    and not _DOLLAR_LABEL.search(lines[end]):
                end += 1
            block = lines[i:end + 1]
            if end < len(lines) and not _DOLLAR_LABEL.search(lines[end]):
                body = "\n".join(block).strip()[2:-2].strip()
                marks = "```" if open_fences and open_fences[-1][0] == ":" else ":::"
                indent = line[:len(line) - len(line.lstrip())]
                plain += [f"{indent}{marks}{{math}}", f"{indent}:enumerated: false", body, f"{indent}{marks}"]
                i = end + 1
                continue
        if fence:  # a fenced code block: copied unchanged
            end = _closing(lines, i, fence["fence"])
            flush()
            out.append("\n".join(lines[i:end + 1]))
            i = end + 1
            continue
        plain.append(line)
        i += 1
    flush()
    return "\n".join(out)


def _number_title(source: str, chapter: int) -> str | None:
    """``source`` with the chapter's number before its first level-1 heading outside fences, or None if it has
    none (``# GRPO: ...`` -> ``# 6. GRPO: ...``, as the book's sidebar numbers it)."""
    lines, fence = source.splitlines(), None
    for k, line in enumerate(lines):
        stripped = line.strip()
        if fence:
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                fence = None
            continue
        if opening := re.match(r"^\s*(`{3,}|~{3,}|:{3,})", line):
            fence = opening.group(1)
            continue
        if line.startswith("# "):
            lines[k] = f"# {chapter}. {line[2:]}"
            return "\n".join(lines)
    return None


# ---------------------------------------------------------------------------------------------- solutions
_SOLUTION_START = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\{solution-start\}\s*(?P<label>[^\s`]+)?")
_SOLUTION_END = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\{solution-end\}")


def _marker_end(lines: list[str], i: int, fence: str) -> int:
    """Index just past the line that closes the (bodiless) solution marker opened on line ``i``."""
    j = i + 1
    while j < len(lines) and lines[j].strip() != fence:
        j += 1
    return min(j + 1, len(lines))


def _dropdown(lines: list[str], title: str) -> list[str]:
    if not "\n".join(lines).strip():
        return lines
    colons = ":" * max(4, 1 + max((len(m) for m in re.findall(r"^\s*(:{3,})", "\n".join(lines), re.M)), default=0))
    return [f"{colons}{{dropdown}} {title}", *lines, colons]


def hide_solutions(cells: list, index: Index) -> int:
    """Collapse every gated solution (``{solution-start} label`` ... ``{solution-end}``, across cells): its prose
    goes into a ``{dropdown}`` titled "Solution to Exercise N.k" and its code cells get JupyterLab's
    ``source_hidden``/``outputs_hidden`` (they still run). jupyterlab-myst renders each cell on its own, so it
    cannot gate a solution that spans cells; the markers stay, for scripts/make_student.py. Returns how many
    solutions."""
    label, count = None, 0

    def title():
        target = index.targets.get(label or "")
        return f"Solution to Exercise {target.number}" if target and target.number else "Solution"

    for cell in cells:
        if cell.cell_type == "code":
            if label is not None:
                cell.metadata["jupyter"] = {**cell.metadata.get("jupyter", {}), "source_hidden": True,
                                            "outputs_hidden": True}
            continue
        if cell.cell_type != "markdown":
            continue
        lines, out, inside, i = cell.source.splitlines(), [], [], 0
        while i < len(lines):
            start, end = _SOLUTION_START.match(lines[i]), _SOLUTION_END.match(lines[i])
            if start and label is None:
                j = _marker_end(lines, i, start["fence"])
                out += lines[i:j]
                label, count, i = start["label"] or "", count + 1, j
            elif end and label is not None:
                out += _dropdown(inside, title())
                inside = []
                j = _marker_end(lines, i, end["fence"])
                out += lines[i:j]
                label, i = None, j
            else:
                (inside if label is not None else out).append(lines[i])
                i += 1
        if label is not None:
            out += _dropdown(inside, title())
        cell.source = "\n".join(out)
    return count


# ---------------------------------------------------------------------------------------------- notebooks
def _front_matter(chapter: int | None):
    """A first markdown cell of front matter: jupyterlab-myst then numbers equations, exercises, proofs as
    "6.1", "6.2" (the book's numbers)."""
    if chapter is None:
        return None
    cell = nbformat.v4.new_markdown_cell(f"---\nnumbering:\n  enumerator: {chapter}.%s\n  headings: false\n---")
    cell.metadata[READER_KEY] = "front-matter"
    return cell


def reader_notebook(nb, index: Index, doc: str, root: Path = ROOT):
    """The reader copy of ``nb`` (document ``doc`` of the book); ``ReaderError`` lists what could not be
    resolved."""
    chapter = index.chapters.get(doc)
    ctx = Context(index, doc, chapter, glue_values(nb), root)
    cells = []
    for cell in nb.cells:
        cell = nbformat.from_dict(dict(cell))
        if cell.cell_type == "markdown":
            ctx.attachments = {}
            cell.source = transform_markdown(cell.source, ctx)
            if ctx.attachments:
                cell.attachments = {**cell.get("attachments", {}), **ctx.attachments}
        elif cell.cell_type == "code":
            cell.metadata = dict(cell.metadata)
            cell.outputs = [o for o in cell.outputs if "scrapbook" not in o.get("metadata", {})]
            for output in cell.outputs:  # a generated table (Markdown output) names chapters with roles too
                markdown_out = output.get("data", {}).get("text/markdown")
                if markdown_out:
                    text = "".join(markdown_out) if isinstance(markdown_out, list) else markdown_out
                    output["data"]["text/markdown"] = resolve_roles(text, ctx)
            hidden = {flag for tag in cell.metadata.get("tags", []) for flag in _HIDE.get(tag, ())}
            if hidden:
                cell.metadata["jupyter"] = {**cell.metadata.get("jupyter", {}), **{f: True for f in hidden}}
        cells.append(cell)
    hide_solutions(cells, index)
    if chapter is not None:
        for cell in cells:
            if cell.cell_type == "markdown" and (numbered := _number_title(cell.source, chapter)) is not None:
                cell.source = numbered
                break
    front = _front_matter(chapter)
    if front is not None and cells and cells[0].cell_type == "markdown":  # front matter opens the first cell
        cells[0].source = front.source + "\n" + cells[0].source
    elif front is not None:
        cells.insert(0, front)
    if ctx.problems:
        raise ReaderError("; ".join(dict.fromkeys(ctx.problems)))
    reader = nbformat.from_dict(dict(nb))
    reader.cells = cells
    reader.metadata = {k: v for k, v in nb.metadata.items() if k != "jupytext"}  # not paired with book/
    reader.metadata[READER_KEY] = {"source": doc, "chapter": chapter}
    nbformat.validate(reader)
    return reader


def chapter_notebooks(source_dir: Path = SOURCE_DIR) -> list[Path]:
    return sorted(p for p in source_dir.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def convert(source: Path, target: Path, index: Index, root: Path = ROOT) -> None:
    nb = nbformat.read(source, as_version=4)
    doc = source.resolve().relative_to(root).with_suffix("").as_posix()
    try:
        reader = reader_notebook(nb, index, doc, root)
    except ReaderError as error:
        raise ReaderError(f"{source}: {error}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(reader, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="chapter notebooks (default: notebooks/**/*.ipynb)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: _build/reader)")
    args = parser.parse_args(argv)
    sources = [p.resolve() for p in args.notebooks] or chapter_notebooks()
    index = build_index(ROOT)
    failed = 0
    for source in sources:
        try:
            relative = source.relative_to(SOURCE_DIR)
        except ValueError:
            relative = Path(source.name)
        try:
            convert(source, args.out / relative, index)
        except ReaderError as error:
            print(f"error: {error}", file=sys.stderr)
            failed += 1
            continue
        print(args.out / relative)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
