"""bench/lookup_acceptance.py: the pass count keeps drafts only up to their first wrong token; a replay that switches
builds counts what each build runs; switching rules the draft rule cannot trigger are refused."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lookup_acceptance import parse_rules, passes, replay
from engine.drafts import MIN_MATCH, NGRAM


def test_a_copied_span_takes_a_pass_every_k_plus_one_tokens_and_new_tokens_one_each():
    rng = np.random.default_rng()
    span = [int(t) for t in rng.permutation(1000)[:40] + 10]  # distinct tokens: one occurrence each
    prompt = span + [1, 2]
    # the reply copies the span after its first token: each pass keeps k drafts and adds its own token
    count, drafted, missed = passes(prompt, span, k=4, ngram=4, min_match=1)
    assert (count, drafted, missed) == (1 + (len(span) - 1 + 4) // 5, count - 1, 0)
    # two tokens matched: the span's second token takes a pass of its own too
    count, drafted, missed = passes(prompt, span, k=4, ngram=4, min_match=2)
    assert (count, drafted, missed) == (2 + (len(span) - 2 + 4) // 5, count - 2, 0)
    # tokens that occur nowhere before: no draft, one token a pass
    fresh = [2000 + int(t) for t in rng.permutation(100)[:30]]
    assert passes(prompt, fresh, k=4, ngram=4) == (30, 0, 0)


def test_a_switching_replay_counts_each_build_s_passes():
    rng = np.random.default_rng()
    span = [int(t) for t in rng.permutation(1000)[:40] + 10]
    prompt = span + [1, 2]
    reply = [2000 + int(t) for t in rng.permutation(100)[:12]] + span
    # a plain build that never hands over: one plain token a pass, no switch
    assert replay(prompt, reply, 5, (10**6, 4)) == dict(plain=len(reply), without=0, drafted=0, missed=0, switches=0)
    # one that decides to hand over at its first token to a drafts' build that never hands back: its second pass runs
    # while the host decides (the switch lands a pass late), then the drafts' build's passes over the rest of the
    # reply, as if it had run throughout from there
    n = replay(prompt, reply, 5, (0, 10**6))
    rest = replay(prompt + reply[:2], reply[2:], 5, None)
    assert (n["plain"], n["switches"]) == (2, 1) and (n["without"], n["drafted"], n["missed"]) == (
        rest["without"], rest["drafted"], rest["missed"])
    assert rest["drafted"] > 0 and rest["without"] > 0


def test_switching_rules_parse_within_the_draft_rule_s_match_lengths():
    assert parse_rules(f"{NGRAM}:4,{MIN_MATCH}:1") == [(NGRAM, 4), (MIN_MATCH, 1)]
    # a copy longer than NGRAM is never reported (the plain build would never hand over); a dry count of 0 would
    # hand back after every pass
    for text in (f"{NGRAM + 1}:4", f"{MIN_MATCH - 1}:4", "4:0", "4", "4:4,", "a:b"):
        with pytest.raises(ValueError):
            parse_rules(text)
