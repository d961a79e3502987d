"""Tests of scripts/check_browser.py: tiny hand-made pages, each with one planted fault, must be reported;
a clean page must pass. The browser tests need Chromium (`make test-browser` installs it) and are skipped
without it; the parsing helpers are tested everywhere."""

import importlib.util
import importlib.metadata
import os
import struct
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_browser", ROOT / "scripts" / "check_browser.py")
cb = importlib.util.module_from_spec(_spec)
sys.modules["check_browser"] = cb
_spec.loader.exec_module(cb)


def mathjax_dir() -> Path | None:
    """The offline MathJax that the book ships (from sphinx-mathjax-offline), if installed."""
    try:
        dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))
    return path if (path / "tex-chtml.js").exists() else None


def png(width: int, height: int) -> bytes:
    """A valid grey PNG of the given size (no image library needed)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


HEAD = """<!DOCTYPE html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<script>MathJax = {options: {processHtmlClass: 'math'}};</script>
<script defer src="_static/mathjax/tex-chtml.js"></script>
<style>body { font-family: sans-serif; margin: 8px; } div.math mjx-container { overflow-x: auto; }
span.math { display: inline-flex; } span.rlbook-nowrap { white-space: nowrap; }</style>
<title>%s</title></head><body><main><article>
"""
TAIL = "</article></main></body></html>\n"

PAGES = {
    # a page with every kind of content, all of it right: no fault may be reported
    "clean.html": """<h1 id="top">Clean</h1>
<p>Inline <span class="math">\\(x^2 + \\gamma\\)</span> and a link to <a href="other.html#sec">a section</a>,
to <a href="#top">the top</a> and to <a href="https://example.org/paper">a paper on the web</a>.</p>
<div class="math">\\[\\begin{cases} 1, & x > 0,\\\\[2pt] 0, & \\text{otherwise} \\end{cases}\\]</div>
<div class="math">\\[ G_t = r_t + \\gamma r_{t+1} + \\gamma^2 r_{t+2} + \\gamma^3 r_{t+3} + \\gamma^4 r_{t+4} + \\gamma^5 r_{t+5} + \\gamma^6 r_{t+6} + \\cdots \\]</div>
<figure><img src="plot.png" alt="../_images/0123456789abcdef0123456789abcdef.png"><figcaption>Fig. 1: the return</figcaption></figure>
<p><img src="plot.png" alt="A grey square"></p>
<div style="overflow-x: auto"><table><tr><td>""" + "wide_cell_" * 8 + """</td></tr></table></div>
<div class="highlight"><pre style="overflow-x: auto; font-size: 14px; padding: 16px">""" + "long_code_line = 1; " * 5 + """</pre></div>
<p>MyST source shown as code is not a fault: <code>{eq}`eq-ppo-clip`</code>, <code>\\frac{a}{b}</code>.</p>
<p style="width: 102px">Words <span class="rlbook-nowrap"><span class="math" style="display: inline-block; width: 100px">x</span>,</span> more.</p>
<p>强化学习 (reinforcement learning)</p>""",
    "other.html": """<h1 id="sec">Other</h1><p>Nothing here.</p>""",
    # a broken $$ formula: MathJax shows an error instead of the formula
    "broken_math.html": """<p>Broken:</p><div class="math">$$x^2^3 + \\frac{1}{2}$$</div>""",
    # unbalanced braces: MathJax does not even find the formula, the TeX stays on the page as text
    "unbalanced_math.html": """<p>Unbalanced:</p><div class="math">$$\\frac{1}{2$$</div>""",
    # an undefined macro: MathJax draws it in red instead of failing
    "undefined_macro.html": """<p>Unknown <span class="math">\\(\\notamacro{x}\\)</span>.</p>""",
    # an image that is missing, and one whose alt text is only the file's hash name
    "missing_image.html": """<p><img src="missing.png" alt="A plot that is not there"></p>""",
    "hash_alt.html": """<p><img src="plot.png" alt="../_images/0123456789abcdef0123456789abcdef.png"></p>""",
    # dangling anchors and a missing page
    "dangling.html": """<p><a href="#nowhere">here</a>, <a href="missing_page.html">a page</a>,
<a href="other.html#nosuchid">a section</a>.</p>""",
    # an over-wide table at phone width (no scroll box around it)
    "wide_table.html": """<table><tr><td>""" + "wide_cell_" * 30 + """</td></tr></table>""",
    # content cut off by a box that hides its overflow
    "clipped.html": """<div style="overflow: hidden; width: 200px"><span style="white-space: nowrap">"""
                    + "clipped text " * 20 + """</span></div>""",
    # requests that would leave the machine
    "network.html": """<script src="https://example.invalid/tracker.js"></script>
<img src="http://example.invalid/remote.png" alt="A remote picture">""",
    # a JavaScript error
    "js_error.html": """<script>undefinedFunctionCall();</script><p>Script error.</p>""",
    # MyST roles that were not parsed, left as text on the page and inside a formula
    "raw_role.html": """<p>See {eq}`eq-ppo-clip`, and the KL is {glue:text}`ppo_kl:.3f`.</p>""",
    "role_in_math.html": """<p>Text <span class="math">\\(x = {numref}`fig-x`\\)</span>.</p>""",
    # TeX that lost its math delimiters (a lost backslash swaps the $ pairs), and TeX that MathJax draws as
    # text inside a formula (control words and escapes inside \text)
    "tex_text.html": """<p>The norm \\lVert g \\rVert of the step and \\frac{1}{2}.</p>""",
    "tex_in_math.html": """<p>Ratio <span class="math">\\(e^{\\text{log\\_p}}\\)</span> and
<span class="math">\\(\\text{the \\mathrm{old} policy}\\)</span>.</p>""",
    # at 1280 px: a code box, a display equation and a table that scroll sideways
    "wide_code.html": """<div class="highlight"><pre style="overflow-x: auto">""" + "x = 1; " * 30 + """</pre></div>""",
    "wide_display.html": """<div class="math">\\[""" + " + ".join(f"a_{{{i}}} b_{{{i}}}" for i in range(80))
                         + """\\]</div>""",
    "wide_table_desktop.html": """<div style="overflow-x: auto"><table><tr><td>""" + "wide_cell_" * 200
                               + """</td></tr></table></div>""",
    # the same inside a closed dropdown (a solution): the reader opens it, so it is checked open
    "wide_in_dropdown.html": """<details><summary>Solution</summary>
<div class="highlight"><pre style="overflow-x: auto">""" + "y = 2; " * 30 + """</pre></div>
<div class="math">\\[""" + " + ".join(f"c_{{{i}}} d_{{{i}}}" for i in range(80)) + """\\]</div></details>""",
    # a comma after an inline formula (an inline box, as the theme draws it) that wraps onto a line of its own
    "stray_comma.html": """<p style="width: 102px">Words <span class="math" style="display: inline-block; width: 100px">x</span>, more.</p>""",
    # code too small to read, in a column too narrow for 100 characters
    "narrow_code.html": """<div style="width: 500px"><div class="highlight"><pre style="font-size: 12px">x = 1</pre></div></div>""",
    # a generated Markdown table that was not parsed: its lines shown as a paragraph of text (inline code and a
    # formula in a row, as the inline markup is still parsed), and a second one glued into a line of prose
    "markdown_table.html": """<p>The presets:</p>
<p>| preset | options |
|---|---|
| <code>grpo</code> | <span class="math">\\(\\beta = 0\\)</span> |</p>""",
    "markdown_table_inline.html": """<p>Settings: | arm | lr | | :--- | ---: | | grpo | 1e-3 |</p>""",
    # pipes that are not an unparsed Markdown table: a real table (cells holding pipes), the same Markdown in
    # a code block and in inline code, a rendered formula with absolute values, and pipes in prose
    "pipes_not_tables.html": """<table><thead><tr><th>preset</th><th>options</th></tr></thead>
<tbody><tr><td><code>grpo</code></td><td>|x|</td></tr><tr><td>a | b</td><td>| c |</td></tr></tbody></table>
<div class="highlight"><pre style="font-size: 14px">| preset | options |
|---|---|
| grpo   | beta=0  |</pre></div>
<p>Write <code>|---|---|</code> under the header, or <code>| a | b |</code>.</p>
<p><span class="math">\\(|o_i| + |o_j|\\)</span> tokens</p>
<p>A shell pipe, a | b, and the length |o| of a completion.</p>""",
}


# ---- helpers, without a browser
def test_formulas_are_counted_from_the_source(tmp_path):
    page = tmp_path / "p.html"
    page.write_text('<span class="math">\\(a\\)</span><div class="math">\\[\\begin{cases}1\\\\[2pt]2\\end{cases}\\]'
                    '</div><div class="math">$$x$$</div><p>\\(not math\\)</p><p id="x"></p><a name="y"></a>')
    parsed = cb.parse_source(page)
    assert parsed.formulas == 3
    assert {"x", "y"} <= parsed.ids


def test_hash_like_alt_text():
    assert cb.is_hash_like(None, "a.png")
    assert cb.is_hash_like("  ", "a.png")
    assert cb.is_hash_like("../../_images/388ac98c93857d60d91080a3a263cc87.png", "../../_images/388ac98c93857d60d91080a3a263cc87.png")
    assert cb.is_hash_like("plot.png", "img/plot.png")
    assert not cb.is_hash_like("Value of each state of FrozenLake", "../../_images/388ac98c.png")


def test_redirect_pages_are_only_followed(tmp_path):
    (tmp_path / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    assert cb.parse_source(tmp_path / "index.html").refresh == "book/intro.html"


def test_skipped_pages(tmp_path):
    for name in ("a.html", "genindex.html", "search.html", "_static/x.html", "_sources/y.html", "sub/b.html"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("<p>x</p>")
    assert [p.relative_to(tmp_path).as_posix() for p in cb.list_pages(tmp_path)] == ["a.html", "sub/b.html"]


def test_punctuation_after_inline_math_is_kept_with_it():
    """_ext/rlbook_html.py wraps a formula and the punctuation touching it in span.rlbook-nowrap."""
    from docutils import nodes

    spec = importlib.util.spec_from_file_location("rlbook_html", ROOT / "_ext" / "rlbook_html.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    p = nodes.paragraph()
    p += [nodes.Text("where ("), nodes.math(text="x"), nodes.Text("), then "), nodes.math(text="y"),
          nodes.Text(" and "), nodes.math(text="z"), nodes.Text(".")]
    assert ext.keep_punctuation_with_math(p) == 2
    boxes = [n for n in p.children if isinstance(n, nodes.inline)]
    assert [b.astext() for b in boxes] == ["(x),", "z."]
    assert all(b["classes"] == ["rlbook-nowrap"] for b in boxes)
    assert p.astext() == "where (x), then y and z."


# ---- the planted faults, in a real browser
chromium = cb.find_chromium()
needs_browser = pytest.mark.skipif(chromium is None, reason="Chromium is not installed (make test-browser installs it)")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    mj = mathjax_dir()
    if mj is None:
        pytest.skip("sphinx-mathjax-offline is not installed")
    site = tmp_path_factory.mktemp("site")
    (site / "_static").mkdir()
    os.symlink(mj, site / "_static" / "mathjax")
    (site / "plot.png").write_bytes(png(40, 30))
    for name, body in PAGES.items():
        (site / name).write_text(HEAD % name + body + TAIL, encoding="utf-8")
    shots = tmp_path_factory.mktemp("shots")
    got = cb.check_site(site, shots, chromium=chromium)
    return {r.page: r for r in got}, shots


def faults(results, page):
    return "\n".join(results[0][page].faults)


@needs_browser
def test_every_page_is_checked_and_photographed(results):
    by_page, shots = results
    assert set(by_page) == set(PAGES)
    for name in PAGES:
        stem = name.removesuffix(".html")
        for width in ("desktop", "phone"):
            data = (shots / f"{stem}-{width}.png").read_bytes()
            assert data.startswith(b"\x89PNG"), f"no {width} screenshot of {name}"


@needs_browser
def test_clean_pages_pass(results):
    for page in ("clean.html", "other.html"):
        assert results[0][page].faults == [], f"{page}: {results[0][page].faults}"


@needs_browser
def test_real_tables_code_and_formulas_with_pipes_are_not_markdown_tables(results):
    assert results[0]["pipes_not_tables.html"].faults == [], results[0]["pipes_not_tables.html"].faults


@needs_browser
def test_an_unparsed_markdown_table_is_reported_once_with_its_first_line(results):
    found = [f for f in results[0]["markdown_table.html"].faults if f.startswith("Markdown table")]
    assert found == ["Markdown table left as text on the page (not parsed): '| preset | options |'"], found


@needs_browser
def test_clean_page_reports_its_code_column(results):
    notes = "\n".join(results[0]["clean.html"].notes)
    assert "code column at 1280 px:" in notes and "14-px font" in notes, notes


@needs_browser
def test_scrolling_inside_its_box_is_allowed_at_phone_width(results):
    # the clean page's 100-character code line and wide table scroll inside their boxes at 390 px: no fault
    assert not [f for f in results[0]["clean.html"].faults if f.startswith("at 390 px")]


@needs_browser
def test_cjk_text_is_checked_for_a_real_font(results):
    notes = "\n".join(results[0]["clean.html"].notes)
    if cb.cjk_font_families():
        assert "CJK text drawn with" in notes
    else:
        assert "CJK text not checked" in notes


@needs_browser
@pytest.mark.parametrize("page, expected", [
    ("broken_math.html", "MathJax error: Double exponent: use braces to clarify in 'x^2^3"),
    ("unbalanced_math.html", "MathJax rendered 0 of the 1 formulas"),
    ("unbalanced_math.html", "raw TeX left on the page: '$$\\\\frac{1}{2$$'"),
    ("undefined_macro.html", "notamacro"),
    ("missing_image.html", "image 'missing.png' did not load"),
    ("hash_alt.html", "no caption and its alt text is a file hash"),
    ("dangling.html", "link to #nowhere"),
    ("dangling.html", "missing local file missing_page.html"),
    ("dangling.html", "other.html has no element with id 'nosuchid'"),
    ("wide_table.html", "at 390 px: the page is"),
    ("wide_table.html", "widens the page"),
    ("clipped.html", "cuts off"),
    ("network.html", "request leaves the machine (blocked): https://example.invalid/tracker.js"),
    ("network.html", "request leaves the machine (blocked): http://example.invalid/remote.png"),
    ("js_error.html", "undefinedFunctionCall is not defined"),
    ("raw_role.html", "MyST role left as text on the page: 'See {eq}`eq-ppo-clip`, and the"),
    ("raw_role.html", "{glue:text}`ppo_kl:.3f`"),
    ("role_in_math.html", "MyST role inside a formula (MathJax draws it as text): 'x = {numref}`fig-x`'"),
    ("tex_text.html", "TeX left as text on the page (\\lVert \\rVert \\frac): 'The norm \\\\lVert g"),
    ("tex_in_math.html", "TeX drawn as text inside a formula: '\\\\_' in 'e^{\\\\text{log\\\\_p}}'"),
    ("tex_in_math.html", "TeX drawn as text inside a formula: '\\\\mathrm'"),
    ("wide_code.html", "at 1280 px: code box scrolls sideways"),
    ("wide_code.html", "its longest line has 210 characters"),
    ("wide_display.html", "at 1280 px: display equation wider than the column"),
    ("wide_table_desktop.html", "at 1280 px: table scrolls sideways"),
    ("wide_in_dropdown.html", "at 1280 px: code box scrolls sideways"),
    ("wide_in_dropdown.html", "at 1280 px: display equation wider than the column (it scrolls): "),
    ("wide_in_dropdown.html", "c_{0} d_{0} + c_{1} d_{1}"),
    ("stray_comma.html", "at 1280 px: \",\" after the formula"),
    ("stray_comma.html", "starts a new line"),
    ("narrow_code.html", "at 1280 px: code is drawn at 12 px"),
    ("narrow_code.html", "characters a line: 100 must fit"),
    ("markdown_table.html", "Markdown table left as text on the page (not parsed): '| preset | options |'"),
    ("markdown_table_inline.html", "Markdown table left as text on the page (not parsed): 'Settings: | arm | lr |"),
])
def test_planted_fault_is_reported(results, page, expected):
    assert expected in faults(results, page), faults(results, page)


@needs_browser
def test_main_exits_nonzero_on_faults_and_zero_on_a_clean_book(results, tmp_path, capsys):
    mj = mathjax_dir()
    site = tmp_path / "html"
    site.mkdir()
    (site / "page.html").write_text(HEAD % "page" + PAGES["dangling.html"] + TAIL)
    (site / "_static").mkdir()
    os.symlink(mj, site / "_static" / "mathjax")
    assert cb.main([str(site), "--no-screenshots"]) == 1
    (site / "page.html").write_text(HEAD % "page" + PAGES["other.html"] + TAIL)
    assert cb.main([str(site), "--no-screenshots"]) == 0
    assert "browser check: 1 pages, 0 with faults" in capsys.readouterr().out
