"""bench/drafts_model.py's hindsight bound: the cheapest switching decode of a reply, every switch placed knowing the
whole reply, is found exactly where the best path is plain to see, and no rule's decode is cheaper."""

from __future__ import annotations

import numpy as np

from bench.drafts_model import decode_time, hindsight
from bench.lookup_acceptance import parse_rules, replay

COSTS = (1.0, 1.2, 1.5, 0.5)  # a plain token, a drafts' build's pass without a draft and with one, a switch


def test_hindsight_finds_the_best_switch_and_no_rule_beats_it():
    rng = np.random.default_rng()
    span = [int(t) for t in rng.permutation(1000)[:40] + 10]  # distinct tokens: one occurrence each
    prompt = span + [1, 2]
    fresh = [2000 + int(t) for t in rng.permutation(100)[:12]]
    # fresh tokens copy nothing: the plain build throughout
    assert hindsight(prompt, fresh, 5, COSTS) == len(fresh) * COSTS[0]
    # fresh tokens, then the span copied: a draft needs two of the span's tokens matched, so the plain build runs the
    # fresh tokens and the span's first two, one switch, then passes of five tokens (four drafts and the pass's own)
    reply = fresh + span
    rest = len(span) - 2
    best = (len(fresh) + 2) * COSTS[0] + COSTS[3] + -(-rest // 5) * COSTS[2]
    assert hindsight(prompt, reply, 5, COSTS) == best
    for rule in [None] + parse_rules("4:4,3:3,2:2,2:8"):
        assert decode_time(replay(prompt, reply, 5, rule), COSTS) >= best
