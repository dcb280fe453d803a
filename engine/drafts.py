"""The draft rule on the host, and when a drafted decode switches between the kernel's two builds.

A draft is what followed the latest earlier occurrence of the context's last n tokens, the longest n from
NGRAM down to MIN_MATCH that occurs (kernels/decode.cu `draft_search` runs the same rule on the GPU).
`ContextDrafts` keeps, for each n, where every n-gram of the context last ended, so the rule costs the same
for each token whatever the context's length.

The drafts' build of the kernel runs a pass without a draft at ~1.16x a plain token on SmolLM2 (PERF.md session
70) and 1.08-1.27x from H = 1,024 up, where the drafts' build multiplies on the tensor cores (sessions 76-78): where
the text copies nothing the plain build is faster. `BuildSwitch` watches the tokens as they come and
says when to leave the build that runs: the plain build where the context's last COPY_MATCH tokens occurred
before (the text starts to copy), the drafts' build after DRY_PASSES passes in a row that kept no draft token
(it stopped copying). It replays the drafts' build's passes from the tokens alone: a pass keeps its draft's
tokens up to the first the model did not choose, and that token, the model's own, ends it.
"""

from __future__ import annotations

NGRAM = 4  # the longest suffix a draft matches (kernels: DRAFT_NGRAM)
MIN_MATCH = 2  # a draft needs this many of the last tokens matched (kernels: DRAFT_MIN_MATCH)
# (4, 4) of the rules timed on SmolLM2's real replies with a switch's ~26 us (PERF.md session 75): free prose 1.12x
# the plain decode ((3, 3), (3, 6): 1.09x; (2, 4): 1.03x), the agent's own reply 1.72-1.73x ((3, 6): 1.75x, the
# drafts' build throughout 1.76x); the other three within 0.02x of the best rule. By bench/drafts_model.py, whose
# switches land a pass late as the engine's do (PERF.md session 80), (3, 4) would be 0.9-1.6% faster on every shape:
# inside the model's error, not yet timed.
COPY_MATCH = 4  # the plain build hands over where the context's last this-many tokens occurred before
DRY_PASSES = 4  # the drafts' build hands back after this many passes in a row that kept no draft token


class ContextDrafts:
    """A context's tokens and, for each n from min_match to ngram, the latest end of every n-gram but the one
    that ends the context (a draft copies from an earlier occurrence). Another rule than the kernel's
    (`ngram`, `min_match`) is for bench/lookup_acceptance.py's comparisons."""

    def __init__(self, tokens: list[int] = (), ngram: int = NGRAM, min_match: int = MIN_MATCH):
        self.tokens: list[int] = []
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(max(min_match, 1), ngram + 1)}
        self.extend(tokens)

    def append(self, token: int) -> None:
        last = len(self.tokens) - 1  # the context's end until now becomes an earlier occurrence
        for n, ends in self._ends.items():
            if last + 1 >= n:
                ends[tuple(self.tokens[last + 1 - n :])] = last
        self.tokens.append(int(token))

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.append(token)

    def matched(self) -> tuple[int, int]:
        """(n, end): the longest n of the context's last tokens (ngram at most) that occurred before, and where
        that occurrence's latest end is; (0, -1) where not even min_match did."""
        for n in reversed(self._ends):  # (longest first)
            end = self._ends[n].get(tuple(self.tokens[-n:])) if n < len(self.tokens) else None
            if end is not None:
                return n, end
        return 0, -1

    def draft(self, k: int) -> list[int]:
        """The next k tokens the rule copies (fewer where the context ends first; [] where nothing matched)."""
        n, end = self.matched()
        return self.tokens[end + 1 : end + 1 + k] if n else []


class BuildSwitch:
    """When a drafted decode leaves the build that runs (see the module's doc). `drafts` is the context's index:
    `seen` appends each token to it."""

    def __init__(self, drafts: ContextDrafts, positions: int):
        self.drafts = drafts
        self.positions = positions  # the drafts' build's positions a pass: its drafts are positions - 1 tokens
        self.drafting = False
        self._draft: list[int] = []  # the drafts' build's open pass: its draft, and how many of it came so far
        self._kept = 0
        self._dry = 0

    def start(self, drafting: bool) -> None:
        """A launch of the drafts' build (`drafting`) or the plain one goes on from the context's last token: the
        next token seen is its first pass's."""
        self.drafting = drafting
        self._dry = 0
        self._open_pass()

    def _open_pass(self) -> None:
        self._draft = self.drafts.draft(self.positions - 1) if self.drafting else []
        self._kept = 0

    def seen(self, token: int) -> bool:
        """The build yielded `token`: whether to leave it now."""
        self.drafts.append(token)
        if not self.drafting:
            return self.drafts.matched()[0] >= COPY_MATCH
        if self._kept < len(self._draft) and token == self._draft[self._kept]:
            self._kept += 1  # a kept draft token: the pass goes on
            return False
        self._dry = 0 if self._kept else self._dry + 1  # the model's own token ends the pass
        self._open_pass()
        return self._dry >= DRY_PASSES
