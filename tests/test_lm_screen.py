"""The LM head's int8 screen (kernels: LM_SCREEN; engine/backends/cuda.py: lm_screen_rows), on the CPU.

Greedy decoding on the GPU reads the int8 rows and recomputes from the bf16 rows only those whose upper
bound reaches the largest lower bound, so the bound must hold for every row and input: here the screened
logit, computed in fp32 as the kernel does, is checked against fp32 evaluations of the bf16 rows in two
summation orders, on rows with outliers, a zero row and inputs of very different sizes."""

import numpy as np
import pytest

from engine.backends.cuda import lm_screen_rows


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even (as the backend stores weights)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def screened(q8: np.ndarray, consts: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The kernel's screened logits: s_r (q_r . x) with the q exact in fp32."""
    q = q8.astype(np.float32) - np.float32(128)
    return consts[:, 0] * (q @ x)


@pytest.fixture(params=[64, 576, 1536])
def rows(request):
    rng = np.random.default_rng(request.param)
    w = rng.standard_normal((300, request.param)).astype(np.float32) * np.float32(0.02)
    w[5, 3] = 1.5  # an outlier sets its row's scale
    w[7] = 0.0  # a zero row
    w[9] *= np.float32(1e-30)  # a row of tiny weights
    return bf16_bits(w)


def test_rows_keep_their_layout(rows):
    q8, consts = lm_screen_rows(rows)
    assert q8.shape == rows.shape and q8.dtype == np.uint8
    assert consts.shape == (rows.shape[0], 2) and consts.dtype == np.float32
    w = bf16_value(rows).astype(np.float64)
    q = q8.astype(np.float64) - 128
    assert q.min() >= -127 and q.max() <= 127
    assert consts[7, 0] == 1.0 and not q[7].any()  # a zero row: scale 1, no weights
    # round to nearest: no weight further than half a step from its int8 value
    assert np.all(np.abs(w - q * consts[:, :1]) <= consts[:, :1] * 0.5 * (1 + 1e-6))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_the_bound_holds_for_every_row(rows, scale):
    q8, consts = lm_screen_rows(rows)
    w32 = bf16_value(rows)
    rng = np.random.default_rng(int(scale * 1000) + rows.shape[1])
    for _ in range(20):
        x = (rng.standard_normal(rows.shape[1]) * scale).astype(np.float32)
        x[rng.integers(rows.shape[1])] *= np.float32(40)  # one large input
        approx = screened(q8, consts, x)
        bound = np.float32(np.sqrt(np.float32(x @ x))) * consts[:, 1]
        for exact in (w32 @ x, w32[:, ::-1] @ x[::-1]):  # two summation orders
            assert np.all(np.abs(exact.astype(np.float64) - approx) <= bound), "a row's screened logit left its bound"


def test_the_argmax_row_is_always_a_candidate(rows):
    """Rows built to tie or nearly tie: the bf16 argmax (first index on ties) is among the rows whose
    upper bound reaches the largest lower bound."""
    rng = np.random.default_rng(3)
    base = bf16_value(rows)
    near = np.repeat(base[:1], 6, axis=0)
    near[1:, 0] = np.nextafter(near[1:, 0], np.float32(1))  # rows one ulp apart, and exact copies
    near[3] = near[0]
    w = np.concatenate([base, near])
    bits = bf16_bits(w)
    q8, consts = lm_screen_rows(bits)
    w32 = bf16_value(bits)
    for _ in range(50):
        x = rng.standard_normal(w.shape[1]).astype(np.float32)
        exact = w32 @ x
        approx = screened(q8, consts, x)
        bound = np.float32(np.sqrt(np.float32(x @ x))) * consts[:, 1]
        candidates = np.flatnonzero(approx + bound >= np.max(approx - bound))
        assert int(np.argmax(exact)) in candidates
        assert len(candidates) < len(w)  # the screen leaves rows out
