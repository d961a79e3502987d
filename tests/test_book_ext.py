"""The book's own Sphinx extensions (_ext/): long listings collapse (rlbook_html.collapse_long_listings).

A doctree built by hand, then one tiny Sphinx project (two listings, the html builder, a couple of seconds)."""

import io
import re
import sys
from pathlib import Path

import pytest
from docutils import nodes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
import rlbook_html  # noqa: E402


def _listing(lines: int, caption: str | None = None, source: str = "/x/src/rlbook/m.py"):
    text = "".join(f"x{k} = {k}\n" for k in range(lines))
    block = nodes.literal_block(text, text, source=source)
    block["highlight_args"] = {"linenostart": 10}
    if caption is None:
        return block
    wrapper = nodes.container("", classes=["literal-block-wrapper"])
    wrapper += nodes.caption(caption, caption)
    wrapper += block
    return wrapper


def test_the_rule_is_more_than_thirty_lines():
    assert rlbook_html.LONG_LISTING_LINES == 30
    assert not rlbook_html.is_long_listing("a\n" * 30)
    assert rlbook_html.is_long_listing("a\n" * 31)
    assert not rlbook_html.is_long_listing("a\n" * 30 + "\n")  # a trailing newline is not a line


def test_long_literalincludes_are_wrapped_in_a_dropdown_with_their_title():
    doc = nodes.section()
    captioned, bare, short = _listing(45, "Scoring a rollout."), _listing(31), _listing(30, "Short.")
    code_block = nodes.literal_block("y\n" * 50, "y\n" * 50)  # a code-block or a notebook cell: no 'source'
    doc += [captioned, bare, short, code_block]
    assert rlbook_html.collapse_long_listings(doc) == 2
    boxes = list(doc.findall(nodes.admonition))
    assert [b["classes"] for b in boxes] == [["dropdown", "rlbook-listing"]] * 2
    assert boxes[0][0].astext() == "Scoring a rollout. (45 lines)" and boxes[0][1] is captioned
    assert boxes[1][0].astext() == "Code from m.py, lines 10\u201340" and boxes[1][1] is bare
    assert short.parent is doc and code_block.parent is doc
    assert rlbook_html.collapse_long_listings(doc) == 0  # idempotent


def test_a_listing_already_inside_a_dropdown_is_left_alone():
    """A chapter's own dropdown around a long listing is not wrapped in a second one (a box in a box would narrow
    the code column, and the reader opens it once)."""
    doc = nodes.section()
    chapters_box = nodes.admonition(classes=["dropdown"])
    chapters_box += nodes.title(text="Show the source")
    inner = _listing(45, "Inside.")
    chapters_box += inner
    doc += chapters_box
    assert rlbook_html.collapse_long_listings(doc) == 0 and inner.parent is chapters_box


def test_a_sphinx_build_collapses_only_the_long_listing(tmp_path):
    sphinx = pytest.importorskip("sphinx.application")
    (tmp_path / "m.py").write_text("def short():\n    return 1\n\n\ndef long():\n"
                                   + "".join(f"    x{k} = {k}\n" for k in range(40)) + "    return 0\n")
    (tmp_path / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / '_ext')!r})\n"
                                      "extensions = ['rlbook_html', 'sphinx_togglebutton']\nnumfig = True\n")
    (tmp_path / "index.rst").write_text(
        "Test\n====\n\n"
        ".. literalinclude:: m.py\n   :pyobject: short\n   :caption: Short one.\n\n"
        ".. literalinclude:: m.py\n   :pyobject: long\n   :caption: Long one.\n   :name: code-long\n\n"
        "See :numref:`code-long`.\n")
    app = sphinx.Sphinx(str(tmp_path), str(tmp_path), str(tmp_path / "_build"), str(tmp_path / "_doctrees"),
                        "html", status=None, warning=None, freshenv=True, warningiserror=True)
    app.build()
    html = (tmp_path / "_build" / "index.html").read_text()
    boxes = [m.start() for m in re.finditer(r'<div class="([^"]*)"', html)
             if {"admonition", "dropdown", "rlbook-listing"} <= set(m[1].split())]  # sphinx-togglebutton's selector
    assert len(boxes) == 1
    assert boxes[0] < html.index('<p class="admonition-title">Long one. (42 lines)</p>') < html.index("x39")
    assert html.index("Short one.") < boxes[0]
    assert "Listing 2" in html  # the numbered reference still resolves to the collapsed listing


def test_equation_labels_in_listings_become_numbers():
    numbers = {"eq-grpo-advantage": "8.3", "eq-a": "1.1"}
    text = "GRPO's advantage (eq-grpo-advantage); eq-a, and eq-missing-one stays; not-eq-a nor eq-a-b."
    assert rlbook_html.number_equation_labels(text, numbers.get) == (
        "GRPO's advantage (eq. (8.3)); eq. (1.1), and eq-missing-one stays; not-eq-a nor eq-a-b.")


def test_a_sphinx_build_numbers_the_equation_labels_of_a_listing(tmp_path):
    sphinx = pytest.importorskip("sphinx.application")
    (tmp_path / "m.py").write_text("def loss():\n    '''The loss (eq-loss); eq-nowhere.'''\n    return 1\n")
    (tmp_path / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / '_ext')!r})\n"
                                      "extensions = ['rlbook_html']\nnumfig = True\nmath_numfig = True\n")
    (tmp_path / "index.rst").write_text(
        "Chapter\n=======\n\n.. math:: a = b\n   :label: eq-first\n\n.. math:: c = d\n   :label: eq-loss\n\n"
        ".. literalinclude:: m.py\n   :pyobject: loss\n\nSee :eq:`eq-loss`.\n")
    app = sphinx.Sphinx(str(tmp_path), str(tmp_path), str(tmp_path / "_build"), str(tmp_path / "_doctrees"),
                        "html", status=None, warning=None, freshenv=True, warningiserror=False)
    app.build()
    text = re.sub(r"<[^>]+>", "", (tmp_path / "_build" / "index.html").read_text())
    assert "The loss (eq. (2)); eq-nowhere." in text  # the number :eq: prints, and an unknown label as written


def _section(title: str, *children) -> nodes.section:
    section = nodes.section()
    section += nodes.title(text=title)
    for child in children:
        section += child
    return section


def test_the_evidence_section_body_is_collapsed_under_its_heading():
    inner = _section("A registered run", nodes.paragraph(text="Over ten seeds."))
    evidence = _section("Evidence", nodes.paragraph(text="What this holds."), inner,
                        _section("Power", nodes.paragraph(text="n = 10.")))
    chapter = _section("Chapter", _section("Derivation", nodes.paragraph(text="Teach.")), evidence)
    assert rlbook_html.collapse_evidence(chapter) == 1
    assert evidence[0].astext() == "Evidence" and len(evidence) == 2, "the heading stays, one box under it"
    box = evidence[1]
    assert isinstance(box, nodes.admonition) and {"dropdown", "rlbook-evidence"} <= set(box["classes"])
    assert box[0].astext() == rlbook_html.evidence_title(2) and "2 experiments" in box[0].astext()
    assert [c.astext() for c in box[1:2]] == ["What this holds."] and inner.parent is box
    assert rlbook_html.collapse_evidence(chapter) == 0, "already collapsed"
    other = _section("Chapter", _section("Evidence of convergence", nodes.paragraph(text="x")))
    assert rlbook_html.collapse_evidence(other) == 0, "only a section titled exactly 'Evidence'"


def test_a_sphinx_build_collapses_the_evidence_and_keeps_its_references(tmp_path):
    sphinx = pytest.importorskip("sphinx.application")
    (tmp_path / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / '_ext')!r})\n"
                                      "extensions = ['rlbook_html', 'sphinx_togglebutton']\nnumfig = True\n")
    (tmp_path / "index.rst").write_text(
        "Chapter\n=======\n\nIdea\n----\n\nSee :ref:`the run <run>`.\n\n"
        "Evidence\n--------\n\nEverything else.\n\n.. _run:\n\nThe run\n~~~~~~~\n\nTen seeds.\n")
    warnings = io.StringIO()
    app = sphinx.Sphinx(str(tmp_path), str(tmp_path), str(tmp_path / "_build"), str(tmp_path / "_doctrees"),
                        "html", status=None, warning=warnings, freshenv=True)
    app.build()
    # a second Sphinx app in one process re-registers the node classes; any other warning is a fault
    assert not [w for w in warnings.getvalue().splitlines() if w.strip() and "is already registered" not in w]
    html = (tmp_path / "_build" / "index.html").read_text()
    boxes = [m.start() for m in re.finditer(r'<div class="([^"]*)"', html)
             if {"admonition", "dropdown", "rlbook-evidence"} <= set(m[1].split())]
    assert len(boxes) == 1
    assert html.index(">Evidence<") < boxes[0] < html.index("Everything else.") < html.index("Ten seeds.")
    assert 'href="#run"' in html and 'id="run"' in html  # the reference into the box still resolves
    assert html.index(">Idea<") < html.index(">Evidence<")
