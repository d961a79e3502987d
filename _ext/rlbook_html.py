"""Fixes to the HTML that Jupyter Book 1.0.4 (Sphinx 7.4) writes, found by `make test-browser`.

1. Sphinx adds every script that an extension registers after the builder has started (sphinx-togglebutton's
   selector, sphinx-thebe's configuration) a second time just before writing, with the file name '' instead
   of None, which its own duplicate check misses. Every page then declares `const THEBE_JS_URL` twice: a
   SyntaxError in the reader's console. This drops exact duplicates from each page's list of scripts.

2. Inline math is an inline box (the theme's span.math is inline-flex), so the browser may break the line
   between a formula and the comma or full stop that follows it, leaving the punctuation alone at the start
   of the next line. In HTML output, a formula and the punctuation touching it (an opening bracket before,
   closing punctuation after) are wrapped in <span class="rlbook-nowrap">, which _static/custom.css keeps
   on one line.

3. A long listing from ``literalinclude`` (more than LONG_LISTING_LINES lines, the package's code) is wrapped
   in a dropdown admonition (sphinx-togglebutton's ``.admonition.dropdown``, as the book's solutions are): its
   title (the listing's caption, or the file and lines it shows) stays visible and the reader opens the code.
   The chapters need no markup for it, so a listing that grows past the limit collapses by itself.
   scripts/make_reader.py uses the same rule for the reader copy (a ``{dropdown}`` directive).

4. The package's docstrings name the chapter equation they implement by its label (``eq-grpo-advantage``), which
   is all a reader of the source can be given. In a listing the book shows, each label of an equation the book
   numbers is replaced by its number as the text prints it ("eq. (8.3)"); an unknown label is left as written.
   scripts/make_reader.py does the same in the reader copy (``number_equation_labels``).

5. A chapter keeps the evidence behind its claims (every experiment but its main one) in a last section headed
   exactly "Evidence". In HTML that section's body is wrapped in a dropdown admonition, so the chapter reads as a
   textbook and the evidence is one click away; its heading stays in the page's table of contents.
   _static/evidence-open.js opens a collapsed dropdown when a link (or the address) targets something inside it.
"""

import re
from pathlib import Path

from docutils import nodes

LONG_LISTING_LINES = 30  # a listing with more lines than this is collapsed (book and reader copy)
_ROOT = Path(__file__).resolve().parent.parent


def is_long_listing(code: str, limit: int = LONG_LISTING_LINES) -> bool:
    """Whether a listing of ``code`` is collapsed: more than ``limit`` lines (a trailing newline not counted)."""
    return len(code.rstrip("\n").splitlines()) > limit


def listing_title(caption: str, source: str, first: int, count: int) -> str:
    """The visible title of a collapsed listing: its caption, or the file and lines it shows; with its length."""
    if caption:
        return f"{caption} ({count} lines)"
    try:
        where = Path(source).resolve().relative_to(_ROOT).as_posix()
    except ValueError:
        where = Path(source).name
    return f"Code from {where}, lines {first}\u2013{first + count - 1}"


EQUATION_LABEL = re.compile(r"(?<![\w-])eq-[a-z0-9]+(?:-[a-z0-9]+)*(?![\w-])")


def number_equation_labels(text: str, number_of) -> str:
    """``text`` with each equation label (``eq-...``) that ``number_of(label)`` numbers replaced by
    "eq. (<number>)"; a label it returns None for stays as written."""
    def replace(match):
        number = number_of(match.group())
        return f"eq. ({number})" if number else match.group()

    return EQUATION_LABEL.sub(replace, text)


def _sphinx_equation_number(env, label: str) -> str | None:
    """The number Sphinx prints for equation ``label`` ("8.3" with numfig and math_numfig), or None."""
    from docutils.nodes import make_id  # as sphinx.domains.math names the equation's node

    docname, number = env.get_domain("math").equations.get(label, (None, None))
    if docname is None:
        return None
    if env.config.numfig and env.config.math_numfig:
        numbers = env.toc_fignumbers.get(docname, {}).get("displaymath", {}).get(make_id("equation-" + label))
        eqno = ".".join(map(str, numbers))
        return env.config.math_numsep.join(eqno.rsplit(".", 1)) if numbers else None
    return str(number)


def _number_equation_labels(app, doctree, docname):
    """Number the equation labels in the listings of an HTML page (item 4 above)."""
    if app.builder.format != "html":
        return
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if block.rawsource != text or not EQUATION_LABEL.search(text):
            continue  # a parsed literal (its markup would be lost), or nothing to number
        numbered = number_equation_labels(text, lambda label: _sphinx_equation_number(app.env, label))
        if numbered != text:
            block.rawsource = numbered
            block.children = [nodes.Text(numbered)]


def _in_dropdown(node: nodes.Node) -> bool:
    """Is ``node`` inside a dropdown admonition (one the chapter wrote, or one this transform made)?"""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, nodes.admonition) and "dropdown" in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


def collapse_long_listings(doctree: nodes.Node, limit: int = LONG_LISTING_LINES) -> int:
    """Wrap each literalinclude listing longer than ``limit`` lines (with its caption, if any) in
    ``admonition(classes=['dropdown', 'rlbook-listing'])`` titled by ``listing_title``. Returns how many."""
    collapsed = 0
    for block in list(doctree.findall(nodes.literal_block)):
        if not block.get("source") or not is_long_listing(block.astext(), limit):
            continue  # only literalinclude sets the attribute 'source' (code-block and notebook cells do not)
        outer = block.parent if isinstance(block.parent, nodes.container) \
            and "literal-block-wrapper" in block.parent["classes"] else block
        if outer.parent is None or _in_dropdown(outer):
            continue  # already collapsed: by this transform, or by a dropdown the chapter wrote around it
        caption = next((c.astext() for c in outer.findall(nodes.caption)), "") if outer is not block else ""
        first = block.get("highlight_args", {}).get("linenostart", 1)
        count = len(block.astext().rstrip("\n").splitlines())
        title = nodes.title(text=listing_title(caption, block["source"], first, count))
        box = nodes.admonition(classes=["dropdown", "rlbook-listing"])
        box.source, box.line = outer.source, outer.line
        outer.parent.replace(outer, box)  # not replace_self: it would move the ids and classes onto the box
        box += title
        box += outer
        collapsed += 1
    return collapsed


def _collapse_long_listings(app, doctree):
    collapse_long_listings(doctree)

EVIDENCE_TITLE = "Evidence"


def evidence_title(subsections: int) -> str:
    """The visible title of a collapsed Evidence section."""
    what = f"{subsections} experiment{'s' if subsections != 1 else ''}" if subsections else "the experiments"
    return f"Open the evidence: {what} in full, with their plans, figures and tables"


def collapse_evidence(doctree: nodes.Node) -> int:
    """Wrap the body of each section titled exactly ``EVIDENCE_TITLE`` (everything after its title) in
    ``admonition(classes=['dropdown', 'rlbook-evidence'])``. Returns how many sections were collapsed."""
    collapsed = 0
    for section in list(doctree.findall(nodes.section)):
        if not section.children or not isinstance(section[0], nodes.title) \
                or section[0].astext().strip() != EVIDENCE_TITLE or _in_dropdown(section):
            continue
        body = list(section.children[1:])
        if not body or len(body) == 1 and "rlbook-evidence" in body[0].get("classes", []):
            continue  # empty, or collapsed already
        subsections = sum(isinstance(child, nodes.section) for child in body)
        box = nodes.admonition(classes=["dropdown", "rlbook-evidence"])
        box.source, box.line = section.source, section.line
        box += nodes.title(text=evidence_title(subsections))
        for child in body:
            section.remove(child)
            box += child
        section += box
        collapsed += 1
    return collapsed


def _collapse_evidence(app, doctree, docname):
    if app.builder.format == "html":  # after numbering and the table of contents: both see the sections
        collapse_evidence(doctree)


_CLOSING = re.compile(r"^[,.;:!?)\]\u2019\u201d]+")  # , . ; : ! ? ) ] ’ ”
_OPENING = re.compile(r"[(\[\u2018\u201c]$")  # ( [ ‘ “


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        attributes = getattr(js, "attributes", {}) or {}
        key = (getattr(js, "filename", js) or "", tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    scripts[:] = kept


def keep_punctuation_with_math(doctree: nodes.Node) -> int:
    """Wrap each inline formula and the punctuation that touches it in inline(classes=['rlbook-nowrap']).

    Returns the number of formulas wrapped."""
    wrapped = 0
    for math in list(doctree.findall(nodes.math)):
        parent = math.parent
        if parent is None or isinstance(parent, nodes.inline) and "rlbook-nowrap" in parent["classes"]:
            continue
        index = parent.index(math)
        after = parent[index + 1] if index + 1 < len(parent) else None
        before = parent[index - 1] if index > 0 else None
        close = _CLOSING.match(after.astext()) if isinstance(after, nodes.Text) else None
        open_ = _OPENING.search(before.astext()) if isinstance(before, nodes.Text) else None
        if not close and not open_:
            continue
        box = nodes.inline(classes=["rlbook-nowrap"])
        if open_:
            _replace_text(parent, before, before.astext()[: open_.start()])
            box += nodes.Text(open_.group())
        if close:
            _replace_text(parent, after, after.astext()[close.end():])
        parent.replace(math, box)
        box += math
        if close:
            box += nodes.Text(close.group())
        wrapped += 1
    return wrapped


def _replace_text(parent: nodes.Element, old: nodes.Text, text: str):
    if text:
        parent.replace(old, nodes.Text(text))
    else:
        parent.remove(old)


def _keep_punctuation_with_math(app, doctree, docname):
    if app.builder.format == "html":
        keep_punctuation_with_math(doctree)


def setup(app):
    # after the other extensions' html-page-context handlers (myst-nb adds page scripts there)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    app.connect("doctree-resolved", _keep_punctuation_with_math)
    app.connect("doctree-resolved", _number_equation_labels)
    app.connect("doctree-resolved", _collapse_evidence)
    app.connect("doctree-read", _collapse_long_listings)  # before the figure numbers are assigned
    return {"parallel_read_safe": True, "parallel_write_safe": True}
