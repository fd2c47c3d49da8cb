"""Text normalisation applied to references and hypotheses before scoring.

Both sides of a comparison must go through the same function, so the options
only ever make scoring more lenient, never asymmetric.
"""
from __future__ import annotations

import unicodedata

# Apostrophes stay by default: in English corpora ("DON'T", "JOHN'S") they are part of the word.
DEFAULT_KEEP = "'\u2019"


def is_punctuation(char: str) -> bool:
    """True for Unicode punctuation (categories Pc, Pd, Ps, Pe, Pi, Pf, Po)."""
    return unicodedata.category(char).startswith("P")


def normalize_text(text: str, *, upper: bool = False, remove_punct: bool = False,
                   keep: str = DEFAULT_KEEP) -> str:
    """Return ``text`` stripped, with runs of whitespace (tabs, CR, NBSP ...) collapsed to one space.

    ``upper`` upper-cases (Python's full Unicode mapping, e.g. "ß" -> "SS").
    ``remove_punct`` replaces every punctuation character not in ``keep`` by a
    space, so "well,done" becomes two words like "well, done" does; tokens made
    only of punctuation ("--") disappear. Symbols such as "<" or "+" are not
    punctuation in Unicode and are kept, so tags like "<unk>" survive.
    """
    if upper:
        text = text.upper()
    if remove_punct:
        text = "".join(" " if is_punctuation(c) and c not in keep else c for c in text)
    # str.split() with no argument splits on any Unicode whitespace and drops empty fields.
    return " ".join(text.split())
