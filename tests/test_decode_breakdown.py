"""bench/decode_breakdown.py: a timing run refuses, before it builds anything, a label it cannot
build as written; the trace's hop between layers reads the right events."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.decode_breakdown import LAYER_EVENTS, check_label, hop_into_next_layer


def test_variants_of_different_knobs_combine():
    assert check_label("no-waits+stash-0", {}) is None
    assert check_label("v8+ring-3", {"v8": Path("kernels-v8")}) is None


def test_two_variants_of_one_knob_are_refused():
    problem = check_label("no-waits+no-weight-loads", {})
    assert problem is not None and "KOG_EXP" in problem


def test_unknown_variants_and_two_versions_are_refused():
    assert "unknown variant" in check_label("no-such-variant", {})
    assert "two versions" in check_label("a+b", {"a": Path("kernels-a"), "b": Path("kernels-b")})


def test_hop_into_next_layer_runs_from_down_done_to_the_next_qkv_ready():
    rng = np.random.default_rng()
    layers, blocks = 9, 5
    start = np.cumsum(rng.integers(30_000, 40_000, layers))  # each layer's first 'qkv ready', ns
    per_layer = []
    for s in start:  # events in order, each block a little apart
        per_layer.append(s + np.arange(len(LAYER_EVENTS))[:, None] * 3_000 + rng.integers(0, 500, (len(LAYER_EVENTS), blocks)))
    work, crit = hop_into_next_layer(per_layer)
    assert work.shape == (4, blocks) and crit.shape == (4,)
    for k in range(4):  # the middle half of the 8 pairs: layers 2-3 .. 5-6
        cur, nxt = per_layer[2 + k], per_layer[3 + k]
        assert np.allclose(work[k], (nxt[0] - cur[-1]) / 1e3)
        assert np.isclose(crit[k], (nxt[0].max() - cur[-1].max()) / 1e3)
