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
"""

import re

from docutils import nodes

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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
