"""bench/lookup_acceptance.py: a draft is what followed the latest earlier occurrence of the longest suffix,
and the pass count keeps drafts only up to their first wrong token."""

from __future__ import annotations

import numpy as np

from bench.lookup_acceptance import draft, passes


def test_draft_follows_the_latest_occurrence_of_the_longest_suffix():
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 1, 6, 7, 2, 9, 6, 7]
    assert draft(context, 2, ngram=3) == [2, 9]  # "6 7" occurs at 1 and 4: the latest wins; "9 6 7" nowhere
    assert draft([3, 8, 4, 8], 3, ngram=4, min_match=1) == [4, 8]  # "8" alone, and the context ends after two tokens
    assert draft([1, 2, 3], 4, ngram=4, min_match=1) == []
    assert draft([3, 8, 4, 8], 3, ngram=4) == [], "only one token matched: no draft (two by default)"


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
