"""A fix to the HTML that Jupyter Book 1.0.4 (Sphinx 7.4) writes, found by `make test-browser`.

Sphinx adds every script that an extension registers after the builder has started (sphinx-togglebutton's
selector, sphinx-thebe's configuration) a second time just before writing, with the file name '' instead of
None, which its own duplicate check misses. Every page then declares `const THEBE_JS_URL` twice: a
SyntaxError in the reader's console. This drops exact duplicates from each page's list of scripts.
"""


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


def setup(app):
    # after the other extensions' html-page-context handlers (myst-nb adds page scripts there)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
