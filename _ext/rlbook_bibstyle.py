"""Author-year bibliography for sphinxcontrib-bibtex (offline, no network).

The text cites author-year ({cite:t} gives "Bellman (1957)"), so the bibliography lists its entries under the
same kind of label ("Bellman 1957", "Sutton and Barto 2018", "Schulman et al. 2017"), sorted by author, year
and title. Two works with the same label get "a", "b", ... after the year. Registered as the pybtex style
``rlbook_authoryear`` and selected in _config.yml with ``bibtex_default_style``.
"""
from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle


def _plain(latex):
    """Family name as plain text: braces and accents such as {\\'a} resolved."""
    return str(Text.from_latex(latex).render_as("text"))


def _surname(person):
    return _plain(" ".join(person.prelast_names + person.last_names))


def author_year(entry):
    """``(who, year)`` of a pybtex entry: ("Bellman", "1957"), ("Sutton and Barto", "2018"), ("Schulman et al.",
    "2017"); editors when there is no author, then the organization (or the key). The bibliography's labels and
    the reader copy's citations (scripts/make_reader.py) both come from here."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(person) for person in persons]
    if "others" in names[1:]:        # "and others" in the .bib: more authors than listed
        names = names[:1] + ["", ""]
    if not names:
        who = _plain(entry.fields.get("organization", entry.key))
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return who, entry.fields.get("year", "n.d.")


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "A year", "A and B year", "A et al. year" (editors when there is no author)."""

    def format_labels(self, sorted_entries):
        labels = [self.format_label(entry) for entry in sorted_entries]
        counts, seen = Counter(labels), Counter()
        for label in labels:
            if counts[label] == 1:
                yield label
            else:
                seen[label] += 1
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]

    def format_label(self, entry):
        return " ".join(author_year(entry))


class AuthorYearStyle(UnsrtStyle):
    """pybtex's unsrt entry format, author-year labels, sorted by author, year and title."""

    default_label_style = "rlbook_authoryear"
    default_sorting_style = "author_year_title"


def setup(app):
    register_plugin("pybtex.style.labels", "rlbook_authoryear", AuthorYearLabelStyle)
    register_plugin("pybtex.style.formatting", "rlbook_authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
