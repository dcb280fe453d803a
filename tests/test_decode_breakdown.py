"""bench/decode_breakdown.py's labels: a timing run refuses, before it builds anything, a label it
cannot build as written."""

from __future__ import annotations

from pathlib import Path

from bench.decode_breakdown import check_label


def test_variants_of_different_knobs_combine():
    assert check_label("no-waits+stash-0", {}) is None
    assert check_label("v8+ring-3", {"v8": Path("kernels-v8")}) is None


def test_two_variants_of_one_knob_are_refused():
    problem = check_label("no-waits+no-weight-loads", {})
    assert problem is not None and "KOG_EXP" in problem


def test_unknown_variants_and_two_versions_are_refused():
    assert "unknown variant" in check_label("no-such-variant", {})
    assert "two versions" in check_label("a+b", {"a": Path("kernels-a"), "b": Path("kernels-b")})
