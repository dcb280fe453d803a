"""A test double for the agent's model client: it replays canned answers, one per step.

It streams each answer in four-character pieces (its "tokens"), stops at the step's
max_tokens as a real model would, and keeps every prompt it was sent so tests can check
what the model was shown. It is not a model and never ships: it lives in tests/.
"""

from __future__ import annotations

import itertools
import time

from agent.client import ReplyStats

CHARS_PER_TOKEN = 4
ENDLESS = object()  # an answer that streams until it is cancelled or reaches max_tokens


class ScriptedReply:
    def __init__(self, text, max_tokens: int, prompt_tokens: int):
        self._text = text
        self._max_tokens = max_tokens
        self._cancelled = False
        self.stats = ReplyStats(prompt_tokens=prompt_tokens)

    def cancel(self) -> None:
        self._cancelled = True

    def __iter__(self):
        start = time.perf_counter()
        first = None
        if self._text is ENDLESS:
            pieces = itertools.repeat("blah")
        else:
            pieces = [self._text[i : i + CHARS_PER_TOKEN] for i in range(0, len(self._text), CHARS_PER_TOKEN)]
        self.stats.stop_reason = "stop"
        for n, piece in enumerate(pieces):
            if self._cancelled:
                self.stats.stop_reason = "cancelled"
                return
            if n == self._max_tokens:
                self.stats.stop_reason = "length"
                return
            now = time.perf_counter()
            first = first or now
            self.stats.generated_tokens = n + 1
            self.stats.ttft_s = first - start
            self.stats.decode_s = now - first
            yield piece


class ScriptedModel:
    """Answers step N with answers[N] (an exception: raised, as a failing server's); running out of answers fails
    the test that used it."""

    def __init__(self, answers: list, context_size: int = 16384, name: str = "scripted"):
        self.answers = list(answers)
        self.context_size = context_size
        self.name = name
        self.prompts: list[tuple[str, list[dict], int]] = []  # (system, messages, max_tokens) per step

    def count_tokens(self, text: str) -> int:
        return len(text) // CHARS_PER_TOKEN + 1

    def prompt_tokens(self, system: str, messages: list[dict]) -> int:
        return sum(self.count_tokens(m["content"]) + 4 for m in [{"content": system}, *messages])

    def generate(self, system: str, messages: list[dict], max_tokens: int, deadline: float | None = None) -> ScriptedReply:
        if not self.answers:
            raise AssertionError(f"the scripted model ran out of answers at step {len(self.prompts) + 1}")
        self.prompts.append((system, [dict(m) for m in messages], max_tokens))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):  # the server failing at this step
            raise answer
        return ScriptedReply(answer, max_tokens, self.prompt_tokens(system, messages))
