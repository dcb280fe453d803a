"""Search/replace on text: exact first, then tolerant of whitespace, else say what is closest.

A SEARCH text must occur exactly once. When it does not occur verbatim, lines are
compared with their indentation and trailing spaces ignored; if that finds exactly one
place, the REPLACE text is re-indented by the difference, since small models often get
the indentation of a copied block wrong but rarely its words. Anything else is refused
with the closest lines of the file, so the model can copy them right next time.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from itertools import chain

from agent.errors import ToolError

WORD = re.compile(r"\w+|[^\w\s]")  # a line's words and marks, which rank the places like a SEARCH text
# The best-ranked places are compared by characters while the comparisons' characters x characters, and a
# comparison's own cost counted as COMPARE_COST of them, stay under REFINE_WORK (~0.7 s).
REFINE_WORK = 20_000_000
COMPARE_COST = 10_000
TAB = 4  # columns a tab stands for, where the file and the model indent with different characters
BOM = "\ufeff"  # a byte order mark, which some editors put at the start of a UTF-8 file


def lines_of(text: str) -> list[str]:
    """`text`'s lines, each with its end, numbered as editors and tracebacks number them: split at newlines only,
    not also at the form feeds, vertical tabs and Unicode separators that str.splitlines splits at."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def apply_blocks(text: str, blocks: list[tuple[str, str]], path: str) -> str:
    """All blocks or none: the first that fails raises, and the file is left as it was."""
    newline = "\r\n" if "\r\n" in text else "\n"
    bom = BOM if text.startswith(BOM) else ""  # not part of the first line the model copies, but kept
    text = text[len(bom):]
    for number, (search, replace) in enumerate(blocks, 1):
        label = f"{path}: SEARCH block {number}" if len(blocks) > 1 else f"{path}: the SEARCH block"
        text = replace_once(text, search.replace("\n", newline), replace.replace("\n", newline), label)
    return bom + text


def in_style_of(old: str, new: str) -> str:
    """A whole new file (`@edit PATH` with a fenced block) with the old one's line endings and byte order mark."""
    if "\r\n" in old:
        new = new.replace("\r\n", "\n").replace("\n", "\r\n")  # (a body already in CRLF stays so, not \r\r\n)
    return (BOM if old.startswith(BOM) and not new.startswith(BOM) else "") + new


def replace_once(text: str, search: str, replace: str, label: str) -> str:
    if not search.strip():
        if text.strip():
            raise ToolError(f"{label} is empty; copy the lines to change from the file")
        return replace
    # Whole lines only: a SEARCH line found inside a longer one ("x = 1" in "max = 1") is not what was copied,
    # and one found after the line's indentation is matched loosely below, so the REPLACE is re-indented.
    places = [m.start() for m in re.finditer("^" + re.escape(search), text, re.MULTILINE)]
    count = len(places)
    if count == 1:
        return text[: places[0]] + replace + text[places[0] + len(search) :]
    if count > 1:
        raise ToolError(f"{label} matches {count} places; add surrounding lines so it matches one")
    return _replace_loosely(text, search, replace, label)


def _key(line: str) -> str:
    return line.strip()


def _replace_loosely(text: str, search: str, replace: str, label: str) -> str:
    lines = lines_of(text)
    wanted = [_key(line) for line in search.splitlines() if line.strip()]
    # Candidate windows: runs of non-blank lines that equal the SEARCH lines once stripped.
    body = [(i, _key(line)) for i, line in enumerate(lines) if line.strip()]
    hits = [
        (body[k][0], body[k + len(wanted) - 1][0])
        for k in range(len(body) - len(wanted) + 1)
        if [key for _, key in body[k : k + len(wanted)]] == wanted
    ]
    if len(hits) > 1:
        raise ToolError(f"{label} matches {len(hits)} places when whitespace is ignored; add surrounding lines")
    if not hits:
        raise ToolError(f"{label} matches nothing. {closest(lines, search)}")
    first, last = hits[0]
    shift = _columns(lines[first]) - _columns(next(line for line in search.splitlines() if line.strip()))
    # the file's own indentation character: a tab-indented file stays so when the model indents with spaces
    char = next((line[0] for line in chain(lines[first : last + 1], lines, replace.splitlines())
                 if line[:1] in (" ", "\t") and line.strip()), " ")
    new = _reindent(replace, shift, char)
    if new and not new.endswith(("\n", "\r\n")) and lines[last].endswith("\n"):
        new += "\r\n" if lines[last].endswith("\r\n") else "\n"
    elif not lines[last].endswith("\n") and last + 1 == len(lines):  # a file without a newline at its end keeps so
        new = new.removesuffix("\n").removesuffix("\r")
    return "".join(lines[:first]) + new + "".join(lines[last + 1 :])


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _columns(line: str) -> int:
    return len(line[: _indent(line)].expandtabs(TAB))


def _reindent(text: str, shift: int, char: str) -> str:
    """`text` with each line's indentation moved by `shift` columns and written with `char`."""
    out = []
    for line in text.splitlines(keepends=True):
        if not line.strip():
            out.append(line)
            continue
        columns = max(0, _columns(line) + shift)
        indent = "\t" * (columns // TAB) + " " * (columns % TAB) if char == "\t" else " " * columns
        out.append(indent + line[_indent(line) :])
    return "".join(out)


def closest(lines: list[str], search: str) -> str:
    """The file's lines most like `search`, numbered, for the error message. Every window of the search's size is
    ranked by the words and marks it shares with the search, in one pass over the file; then the best-ranked are
    compared character by character, as many as REFINE_WORK allows: that comparison costs the product of the two
    texts' lengths (all of a 1,000-line file's windows against a 30-line search took over 2 minutes)."""
    want = search.splitlines()
    size = max(1, len(want))
    if not lines:
        return "The file is empty."
    target = "\n".join(line.strip() for line in want)
    stripped = [line.strip() for line in lines]
    wanted = Counter(WORD.findall(target))
    words = [WORD.findall(line) for line in stripped]
    have = Counter(chain.from_iterable(words[:size]))  # the first window's words; each later one slides by a line
    shared = sum(min(n, wanted[w]) for w, n in have.items())
    scores = [shared]
    for start in range(1, len(lines) - size + 1):
        for w in words[start - 1]:
            have[w] -= 1
            shared -= have[w] < wanted[w]
        for w in words[start + size - 1]:
            shared += have[w] < wanted[w]
            have[w] += 1
        scores.append(shared)

    ranked = sorted(range(len(scores)), key=lambda start: -scores[start])
    best, best_likeness, work = ranked[0], -1.0, 0  # (a SEARCH text too long to compare at all: the words decide)
    for start in ranked:
        window = "\n".join(stripped[start : start + size])
        work += len(target) * len(window) + COMPARE_COST
        if work > REFINE_WORK:
            break
        likeness = difflib.SequenceMatcher(None, target, window, autojunk=False).ratio()
        if likeness > best_likeness or (likeness == best_likeness and start < best):
            best, best_likeness = start, likeness
    shown = lines[best : best + size]
    numbered = "".join(f"{best + 1 + i:>5}| {line.rstrip()}\n" for i, line in enumerate(shown))
    return f"The closest lines ({best + 1}-{best + len(shown)}) are:\n{numbered}".rstrip()
