"""Cutting text to a token budget: the model's window is the scarcest thing the agent has.

Counting tokens is exact for the local model (its own tokenizer) and an estimate for an
endpoint; either way the cut is made on line boundaries and checked against the count.
"""

from __future__ import annotations

from collections.abc import Callable

Counter = Callable[[str], int]


def _cut(text: str, budget: int, count: Counter, keep: Callable[[list[str], int], str]) -> str:
    if budget <= 0:
        return ""
    tokens = count(text)
    if tokens <= budget:
        return text
    chars = int(len(text) * budget / tokens)
    lines = text.splitlines()
    while chars > 0:
        cut = keep(lines, chars)
        if count(cut) <= budget:
            return cut
        chars = int(chars * 0.85)
    return ""


def head_tail(text: str, budget: int, count: Counter) -> str:
    """The start and the end of `text` (a runner's summary and the first failure), middle cut."""
    def keep(lines: list[str], chars: int) -> str:
        head, tail = _take(lines, chars // 3), _take(lines[::-1], chars - chars // 3)[::-1]
        if len(head) + len(tail) >= len(lines):
            return "\n".join(lines)
        skipped = len(lines) - len(head) - len(tail)
        return "\n".join([*head, f"[... {skipped} lines cut ...]", *tail])

    return _cut(text, budget, count, keep)


def head(text: str, budget: int, count: Counter) -> str:
    """The start of `text`, with a note of what was left out."""
    def keep(lines: list[str], chars: int) -> str:
        taken = _take(lines, chars)
        return "\n".join([*taken, f"[... {len(lines) - len(taken)} more lines ...]"])

    return _cut(text, budget, count, keep)


def _take(lines: list[str], chars: int) -> list[str]:
    taken, used = [], 0
    for line in lines:
        used += len(line) + 1
        if used > chars:
            break
        taken.append(line)
    return taken
