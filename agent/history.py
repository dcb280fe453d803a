"""The conversation the model sees, kept inside its window.

Turns are only ever appended, so the prompt grows at its end and the local engine reuses
its cache. When the conversation no longer fits, the bulk of old turns is replaced by
their one-line briefs, oldest tool output first and the first task message last, down to
well under the limit — cutting once frees room for several steps, where trimming just
enough would move the cut, and void the cache, on every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HEADROOM = 0.7  # after a cut, the conversation takes at most this share of its limit


@dataclass
class Turn:
    role: str
    text: str
    brief: str  # what stands in for `text` once dropped
    dropped: bool = False


class History:
    def __init__(self):
        self.turns: list[Turn] = []

    def add(self, role: str, text: str, brief: str | None = None) -> None:
        self.turns.append(Turn(role, text, brief if brief is not None else text))

    def messages(self) -> list[dict]:
        return [{"role": t.role, "content": t.brief if t.dropped else t.text} for t in self.turns]

    def fit(self, limit: int, measure: Callable[[list[dict]], int], keep_last: int = 2) -> bool:
        """Drop old output until measure(messages) <= limit; False if even that is not enough."""
        if measure(self.messages()) <= limit:
            return True
        recent = max(1, len(self.turns) - keep_last)
        # Oldest first, tool output before the model's answers, the task itself last.
        order = [t for t in self.turns[1:recent] if t.role == "user"] + [t for t in self.turns[1:recent] if t.role != "user"]
        for turn in [*order, *self.turns[:1]]:
            if turn.dropped or turn.brief == turn.text:
                continue
            turn.dropped = True
            if measure(self.messages()) <= limit * HEADROOM:
                return True
        return measure(self.messages()) <= limit
