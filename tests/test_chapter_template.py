"""The textbook-first chapter template (CONTRIBUTING, "Chapter template"), checked on every algorithm chapter.

Each algorithm chapter of Parts III-V and VII teaches its algorithm whole before it reports evidence:
1. At a glance has four fields in order -- **Idea.**, **Key equation.**, **You will be able to**, **Result.** --
   and the Result states at most one interval and links the box "How the experiments in this book work".
2. At least one *concept figure* (a figure not drawn from stored results or training, in the sense of
   tests/test_book_text.py) comes before the chapter's main experiment.
3. Every experiment but the main one sits in a last section headed exactly ``## Evidence`` (the HTML collapses it),
   and outside it, experiment prose is at most 25 % of the prose words. Experiment prose is every word of a section
   whose heading starts with "Experiment", and every other paragraph that carries an experiment marker (seed,
   pilot, registered, confirmatory, organism, a Finding line or a glued interval). Code, math, tables, labels,
   directive options and figure captions are not prose.
4. The main experiment's own prose is short: at most MAIN_EXPERIMENT_WORDS words and MAIN_EXPERIMENT_NUMBERS glued
   numbers in its paragraphs (its intervals go in its table).

TEMPLATE_CHAPTERS lists the chapters the template is enforced on: all of ALGORITHM_CHAPTERS (a new algorithm chapter
is added to both). The measurements are printed for every algorithm chapter (``pytest -s -k report``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import test_book_text as text_rules

ROOT = Path(__file__).resolve().parents[1]
ALGORITHM_CHAPTERS = ["part3/policy_gradient", "part3/ppo", "part4/grpo", "part4/dr_grpo", "part4/dapo",
                      "part4/gmpo", "part4/gspo", "part4/gfpo", "part4/lambda_grpo", "part5/ppo_rlhf",
                      "part5/vapo", "part5/dpo", "part5/gapo", "part7/after_the_note"]
TEMPLATE_CHAPTERS = list(ALGORITHM_CHAPTERS)  # every algorithm chapter follows the template
MAX_EXPERIMENT_SHARE = 0.25
MAIN_EXPERIMENT_WORDS = 350  # "about 300 words"
MAIN_EXPERIMENT_NUMBERS = 6
GLANCE_FIELDS = ("**Idea.**", "**Key equation.**", "**You will be able to**", "**Result.**")
EXPERIMENTS_BOX = "how-experiments-work"

MARKER = re.compile(r"\b(seeds?|pilot|pre-registered|registered|confirmatory|organisms?|Finding)\b", re.I)
GLUE = text_rules.GLUE_ROLE
INTERVAL = re.compile(r"\[\s*\{glue(?::\w+)?\}`[^`]*`\s*,\s*\{glue(?::\w+)?\}`[^`]*`\s*\]")
ROLE = re.compile(r"\{(?:ref|numref|term|doc|eq|cite(?::\w+)?)\}`([^`]*)`")
LABEL = re.compile(r"^\s*\([\w-]+\)=\s*$")
COMMENT = re.compile(r"^\s*%")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+\.)\s")
FIGURE_OPEN = re.compile(r"^(`{3,}|:{3,})\{(glue:figure|figure)\}")


def words(line: str) -> int:
    """Words of a prose line as a reader sees them: a glued value is one word, a role its visible text, math one."""
    line = GLUE.sub(" W ", line)
    line = ROLE.sub(lambda m: " " + re.sub(r"\s*<[^<>]*>$", "", m.group(1)) + " ", line)
    line = re.sub(r"\$[^$]+\$", " M ", line)
    return len(re.findall(r"[A-Za-z0-9\u00C0-\u024F][\w'\u2019.-]*", line))


def prose_paragraphs(text: str):
    """(first line number, heading path, paragraph text) of every prose paragraph of a MyST chapter (a list item is
    a paragraph), without code, math, tables, labels, comments, directive options, fences and figure captions."""
    lines = text.split("\n")
    kinds = text_rules.classify(lines)
    caption = [False] * len(lines)
    j = 0
    while j < len(lines):  # a figure directive's body (its caption and alt text) is not prose
        m = FIGURE_OPEN.match(lines[j].strip())
        if m and kinds[j] == "fence":
            fence, k = m.group(1), j + 1
            while k < len(lines) and lines[k].strip() != fence:
                caption[k] = True
                k += 1
            j = k
        j += 1
    headings: list[tuple[int, str]] = []
    paragraphs, current, start = [], [], 0

    def flush():
        if current:
            paragraphs.append((start + 1, tuple(h for _, h in headings), " ".join(current)))
        current.clear()

    for j, (line, kind) in enumerate(zip(lines, kinds)):
        h = HEADING.match(line) if kind == "prose" else None
        if h:
            flush()
            level = len(h.group(1))
            headings[:] = [x for x in headings if x[0] < level] + [(level, h.group(2).strip())]
            continue
        keep = (kind == "prose" and not caption[j] and not LABEL.match(line) and not COMMENT.match(line)
                and not text_rules.TABLE_ROW.match(line) and not text_rules.OPTION.match(line))
        if not keep:
            flush()
            continue
        if current and LIST_ITEM.match(line):  # each list item is a paragraph of its own
            flush()
        if not current:
            start = j
        current.append(line.strip())
    flush()
    return paragraphs


def in_evidence(path: tuple[str, ...]) -> bool:
    return bool(path) and any(h == "Evidence" for h in path)


def is_experiment(path: tuple[str, ...], paragraph: str) -> bool:
    in_section = any(h.startswith("Experiment") for h in path[1:])  # path[0] is the chapter's title
    return in_section or bool(MARKER.search(paragraph)) or bool(INTERVAL.search(paragraph))


def measure(text: str) -> dict:
    """Prose words outside Evidence, experiment words among them, and the main experiment's words and numbers."""
    total = experiment = main_words = main_numbers = 0
    mains = set()
    for _, path, paragraph in prose_paragraphs(text):
        if in_evidence(path):
            continue
        n = words(paragraph)
        total += n
        if is_experiment(path, paragraph):
            experiment += n
        main = next((h for h in path[1:] if h.startswith("Experiment")), None)
        if main is not None:
            mains.add(main)
            main_words += n
            main_numbers += len(GLUE.findall(paragraph))
    return dict(total=total, experiment=experiment, share=experiment / max(total, 1), main_sections=sorted(mains),
                main_words=main_words, main_numbers=main_numbers)


def evidence_fault(text: str, name: str) -> str | None:
    """None when the chapter's last H2 is exactly '## Evidence' with a label line above it."""
    lines = text.split("\n")
    kinds = text_rules.classify(lines)
    h2 = [j for j, (line, kind) in enumerate(zip(lines, kinds)) if kind == "prose" and line.startswith("## ")]
    found = [j for j in h2 if lines[j].rstrip() == "## Evidence"]
    if not found:
        return f"{name}: no '## Evidence' section"
    if found[-1] != h2[-1]:
        return f"{name}:{found[-1] + 1}: '## Evidence' must be the chapter's last H2 (found {lines[h2[-1]]!r} after it)"
    above = next((lines[k] for k in range(found[-1] - 1, -1, -1) if lines[k].strip()), "")
    if not LABEL.match(above):
        return f"{name}:{found[-1] + 1}: '## Evidence' needs a label line such as '(ppo-evidence)=' above it"
    return None


def glance_field_fault(text: str, name: str) -> str | None:
    found = text_rules.glance_body(text)
    if found is None:
        return f"{name}: no At a glance box"
    box = found[1]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", box) if p.strip()]
    labels = [next((f for f in GLANCE_FIELDS if p.startswith(f)), None) for p in paragraphs]
    if labels != list(GLANCE_FIELDS):
        return (f"{name}: At a glance must be exactly four paragraphs opening with {', '.join(GLANCE_FIELDS)} "
                f"in that order (found {[p[:24] for p in paragraphs]})")
    result = paragraphs[3]
    if len(INTERVAL.findall(result)) > 1:
        return f"{name}: At a glance's Result states {len(INTERVAL.findall(result))} intervals (at most one)"
    if f"<{EXPERIMENTS_BOX}>" not in result:
        return f"{name}: At a glance's Result does not link the experiments box (<{EXPERIMENTS_BOX}>)"
    key = paragraphs[1]
    if "$" not in key and "{math}" not in key:
        return f"{name}: At a glance's Key equation has no formula"
    return None


def concept_figure_fault(text: str, name: str) -> str | None:
    """None when a figure not drawn from results or training comes before the main experiment, outside Evidence."""
    lines = text.split("\n")
    _, experiment_keys = text_rules.figure_faults(text, name)
    kinds = text_rules.classify(lines)
    stop = next((j for j, (line, kind) in enumerate(zip(lines, kinds)) if kind == "prose"
                 and re.match(r"^##\s+(Experiment|Evidence)\b", line)), len(lines))
    for j in range(stop):
        m = text_rules.FIGURE.match(lines[j])
        if not m:
            continue
        key = m.group(3) or next((o.group(1) for o in [re.match(r"^:name:\s*(\S+)", lines[j + 1])] if o), "")
        if key and key not in experiment_keys:
            return None
    return f"{name}: no concept figure (a figure not drawn from stored results or training) before line {stop + 1}"


def template_faults(chapter: str) -> list[str]:
    path = ROOT / "book" / f"{chapter}.md"
    text, name = path.read_text(encoding="utf-8"), f"book/{chapter}.md"
    faults = [f for f in (glance_field_fault(text, name), concept_figure_fault(text, name),
                          evidence_fault(text, name)) if f]
    m = measure(text)
    if m["share"] > MAX_EXPERIMENT_SHARE:
        faults.append(f"{name}: experiment prose is {m['share']:.0%} of the prose outside Evidence "
                      f"({m['experiment']} of {m['total']} words; at most {MAX_EXPERIMENT_SHARE:.0%})")
    if len(m["main_sections"]) > 1:
        faults.append(f"{name}: {len(m['main_sections'])} experiment sections outside Evidence "
                      f"({m['main_sections']}); keep one, move the others to '## Evidence'")
    if m["main_words"] > MAIN_EXPERIMENT_WORDS or m["main_numbers"] > MAIN_EXPERIMENT_NUMBERS:
        faults.append(f"{name}: the main experiment's prose has {m['main_words']} words and {m['main_numbers']} "
                      f"glued numbers (at most {MAIN_EXPERIMENT_WORDS} and {MAIN_EXPERIMENT_NUMBERS})")
    return faults


@pytest.mark.parametrize("chapter", ALGORITHM_CHAPTERS)
def test_chapter_follows_the_template(chapter):
    faults = template_faults(chapter)
    if chapter not in TEMPLATE_CHAPTERS:  # not rewritten yet: its faults are shown (pytest -rs), not enforced
        pytest.skip("not yet in TEMPLATE_CHAPTERS: " + ("; ".join(faults) or "no faults: add it"))
    assert not faults, "\n".join(faults)


def test_template_chapters_are_algorithm_chapters():
    assert set(TEMPLATE_CHAPTERS) <= set(ALGORITHM_CHAPTERS)
    for chapter in ALGORITHM_CHAPTERS:
        assert (ROOT / "book" / f"{chapter}.md").exists(), chapter


def test_the_experiments_box_exists():
    text = (ROOT / "book" / "part3" / "policy_gradient.md").read_text(encoding="utf-8")
    if TEMPLATE_CHAPTERS:
        assert f"({EXPERIMENTS_BOX})=" in text, "the box every At a glance links to is missing"


def test_report(capsys):
    """Prints the measurements of every algorithm chapter (run with -s); asserts nothing beyond that they parse."""
    rows = []
    for chapter in ALGORITHM_CHAPTERS:
        m = measure((ROOT / "book" / f"{chapter}.md").read_text(encoding="utf-8"))
        rows.append(f"{chapter:24} {m['share']:5.0%} of {m['total']:5d} words; main experiment "
                    f"{m['main_words']:4d} words, {m['main_numbers']:2d} numbers; "
                    f"{len(template_faults(chapter))} template faults")
        assert m["total"] > 0
    with capsys.disabled():
        print("\n" + "\n".join(rows))


# --- the rules catch what they should ------------------------------------------------------------------------

GOOD = """# T

:::{admonition} At a glance
:class: at-a-glance
**Idea.** Subtract a baseline.

**Key equation.** $L = -A \\log \\pi$.

**You will be able to** derive it; run it.

**Result.** It learns on a toy ({ref}`how the experiments work <how-experiments-work>`).
:::

## Derivation

The gradient of the log-probability points uphill, and the baseline leaves it unbiased.

```{glue:figure} fig-t-concept
:name: fig-t-concept

A caption with many words that are not counted as prose at all.
```

## Experiment: a run

Twelve words about the run and what it shows to a learner here.

## Pros and cons

A plain paragraph that teaches something without reporting anything measured.

(t-evidence)=
## Evidence

With 5 seeds, the pilot and the registered run gave [{glue:text}`a`, {glue:text}`b`].
"""


def test_rules_pass_a_good_chapter():
    assert glance_field_fault(GOOD, "g") is None
    assert evidence_fault(GOOD, "g") is None
    m = measure(GOOD)
    assert m["main_sections"] == ["Experiment: a run"] and m["main_words"] == 13
    assert m["experiment"] == 13, "only the experiment section counts: the Result line has no marker word"
    assert m["total"] == 26 + 13 + 13 + 10, "At a glance (options not counted), the three sections; no caption"


def test_rules_catch_planted_faults():
    assert glance_field_fault(GOOD.replace("**Key equation.** $L = -A \\log \\pi$.\n\n", ""), "g")
    assert glance_field_fault(GOOD.replace("<how-experiments-work>", "<chap-pg>"), "g")
    assert glance_field_fault(GOOD.replace("on a toy", "by [{glue:text}`a`, {glue:text}`b`] and "
                                           "[{glue:text}`c`, {glue:text}`d`]"), "g")
    assert evidence_fault(GOOD.replace("## Evidence", "## Appendix"), "g")
    assert evidence_fault(GOOD.replace("(t-evidence)=\n", ""), "g")
    assert evidence_fault(GOOD + "\n## Summary\n\nText.\n", "g"), "Evidence must be last"
    moved_back = GOOD.replace("(t-evidence)=\n## Evidence\n", "")
    assert measure(moved_back)["experiment"] > measure(GOOD)["experiment"], "a marker paragraph counts"
    disguised = GOOD.replace("## Pros and cons\n\nA plain paragraph that teaches something without reporting "
                             "anything measured.", "## Pros and cons\n\nOver 5 seeds it won " + "big " * 40 + ".")
    assert measure(disguised)["share"] > MAX_EXPERIMENT_SHARE, "experiment prose under another heading counts"
    assert measure(GOOD)["total"] == measure(GOOD.replace("A caption with many", "A caption " + "w " * 50))["total"]
    listed = GOOD.replace("A plain paragraph that teaches", "- Over 5 seeds.\n- A plain paragraph that teaches")
    assert measure(listed)["experiment"] == measure(GOOD)["experiment"] + 3, "a list item is its own paragraph"
