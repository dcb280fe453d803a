"""engine/drafts.py: the draft index against the rule scanned literally, and when a drafted decode switches builds."""

from __future__ import annotations

import numpy as np
import pytest

from engine import drafts
from engine.drafts import BuildSwitch, ContextDrafts


def scanned_draft(context: list[int], k: int, ngram: int, min_match: int) -> list[int]:
    """The rule as kernels/decode.cu states it: the k tokens after the latest earlier occurrence of the context's
    last n tokens, the longest n from ngram down to min_match that occurs."""
    for n in range(min(ngram, len(context) - 1), min_match - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


def test_a_draft_follows_the_latest_occurrence_of_the_longest_suffix():
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 1, 6, 7, 2, 9, 6, 7]
    assert ContextDrafts(context, ngram=3).draft(2) == [2, 9]  # "6 7" at 1-2 and 4-5: the latest; "9 6 7" nowhere
    assert ContextDrafts([3, 8, 4, 8], min_match=1).draft(3) == [4, 8]  # "8" alone; the context ends after two
    assert ContextDrafts([1, 2, 3], min_match=1).draft(4) == []
    assert ContextDrafts([3, 8, 4, 8]).draft(3) == [], "one token matched: no draft (two by default)"
    assert ContextDrafts([3, 8, 4, 8]).matched() == (0, -1)


@pytest.mark.parametrize("ngram,min_match", [(4, 2), (3, 1), (5, 3)])
def test_the_index_drafts_what_a_scan_of_the_context_finds(ngram, min_match):
    rng = np.random.default_rng()
    text = [int(t) for t in rng.integers(0, 6, 600)]  # a small vocabulary: matches of every length
    text[300:360] = text[100:160]  # and a copied stretch
    index = ContextDrafts(ngram=ngram, min_match=min_match)
    for i, token in enumerate(text):
        index.append(token)
        for k in (1, 4, 7):
            assert index.draft(k) == scanned_draft(text[: i + 1], k, ngram, min_match), f"at {i}, k={k}"


def test_the_plain_build_hands_over_where_the_last_tokens_occurred_before(monkeypatch):
    monkeypatch.setattr(drafts, "COPY_MATCH", 3)
    switch = BuildSwitch(ContextDrafts([10, 11, 12, 13, 14, 20]), positions=5)
    switch.start(drafting=False)
    assert not switch.seen(11), "20 11: never before"
    assert not switch.seen(12), "11 12 occurred, but only two tokens"
    assert switch.seen(13), "11 12 13 occurred: the text copies"


def test_the_drafts_build_hands_back_after_passes_that_kept_nothing(monkeypatch):
    monkeypatch.setattr(drafts, "DRY_PASSES", 2)
    copied = list(range(100, 120))
    switch = BuildSwitch(ContextDrafts(copied + [1, 100, 101]), positions=5)
    switch.start(drafting=True)
    # the open pass drafts 102..105: all four kept, then the pass's own token (106, right again) ends it
    assert [switch.seen(t) for t in (102, 103, 104, 105, 106)] == [False] * 5
    # the next pass drafts 107..110: its first token wrong ends it, having kept nothing (one dry pass)
    assert not switch.seen(7)
    # "106 7" never occurred: no draft, the token ends the pass: a second dry pass in a row
    assert switch.seen(8)


def test_a_pass_that_keeps_a_draft_token_ends_a_dry_run(monkeypatch):
    monkeypatch.setattr(drafts, "DRY_PASSES", 2)
    #                       0  1  2  3  4  5  6  7   8   9  10 11 12
    switch = BuildSwitch(ContextDrafts([5, 6, 7, 8, 9, 1, 5, 6, 40, 41, 2, 5, 6]), positions=5)
    switch.start(drafting=True)
    assert not switch.seen(7)  # the draft after "5 6" (40 41 2 5) wrong at once: one dry pass
    assert not switch.seen(8) and not switch.seen(0)  # "5 6 7" drafts 8 9 1 5: 8 kept, so the run of dry passes ends
    assert not switch.seen(3), "'8 0' never occurred: no draft, one dry pass"
    assert switch.seen(4), "a second dry pass in a row"
