"""The LM head's int8 screen (kernels: LM_SCREEN; engine/backends/cuda.py: lm_screen_rows), on the CPU.

Greedy decoding on the GPU reads the int8 rows and recomputes from the bf16 rows only those whose upper
bound reaches the largest lower bound among their block's rows, so the bound must hold for every row, every input and every fp32
summation order the kernel may use. Here the screened logit is computed as the kernel computes it (the
input in 16-bit fixed point, exact integer sums, fp32 scalings) and checked against fp32 evaluations of
the bf16 rows in several orders: on rows with outliers, a zero row and inputs of very different sizes;
on rows that lie exactly on the int8 grid with inputs whose products cancel; and where the input's own
rounding to fixed point nearly reaches its part of the bound."""

import numpy as np
import pytest

from bench.random_models import round_to_bf16
from engine.backends.cuda import lm_screen_rows

XQ = np.float32(32512)  # max |x| / s_x (kernels: LM8_XQ)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even (as the backend stores weights)."""
    return (round_to_bf16(a).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def fp32_dots(w: np.ndarray, x: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each row's dot product with x, accumulated in fp32 one term at a time in `order`."""
    terms = (w[:, order] * x[order]).astype(np.float32)
    return np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]


def orders(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.arange(n), np.arange(n)[::-1], rng.permutation(n)]


def screen(bits: np.ndarray, x: np.ndarray, nseg: int = 1):
    """The kernel's screened logits s_r (s_x V_r) and bounds |x| e_r + s_x t_r + (2H + 16) 2^-149, in
    fp32 as lm_screen_pick computes them, where a row's exact integer sum V_r comes in `nseg` segments
    added in fp32 and |x| is summed with x scaled by a power of two near 1 / max |x|."""
    f = np.float32
    q, consts = lm_screen_rows(bits)
    s, e, t = consts[:, 0], consts[:, 1], consts[:, 2]
    mx = f(np.abs(x).max())
    sx = f(max(mx, f(1e-30)) * f(1 / XQ))
    xq = np.clip(np.rint(x * (f(1) / sx)), -32639, 32639).astype(np.int64)
    parts = [q[:, k].astype(np.int64) @ xq[k] for k in np.array_split(np.arange(len(x)), nseg)]
    v = parts[0].astype(f)
    for part in parts[1:]:
        v = v + part.astype(f)
    approx = s * (sx * v)
    k = np.frexp(min(max(mx, f(1e-30)), f(1e30)))[1] - 1  # max |x| in [2^k, 2^(k + 1))
    xs = x * f(2.0**-k)
    xn = np.sqrt(f(xs @ xs)) * f(2.0**k)
    tiny = f((2 * len(x) + 16) * 2.0**-149)
    bound = xn * e + (sx * t + tiny)
    return approx, bound


def holds(exact: np.ndarray, approx: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Where exact lies between the kernel's fp32 lower and upper bounds (a NaN bound holds: the
    kernel keeps such a row as a candidate)."""
    lo, hi = approx - bound, approx + bound
    return ~(exact < lo) & ~(exact > hi)


@pytest.fixture(params=[64, 576, 1536])
def rows(request):
    rng = np.random.default_rng(request.param)
    w = rng.standard_normal((300, request.param)).astype(np.float32) * np.float32(0.02)
    w[5, 3] = 1.5  # an outlier sets its row's scale
    w[7] = 0.0  # a zero row
    w[9] *= np.float32(1e-30)  # a row of tiny weights
    w[11] *= np.float32(1e-36)  # a row whose scale is a subnormal float
    return bf16_bits(w)


def test_rows_keep_their_layout(rows):
    q, consts = lm_screen_rows(rows)
    assert q.shape == rows.shape and q.dtype == np.int8
    assert consts.shape == (rows.shape[0], 4) and consts.dtype == np.float32
    w = bf16_value(rows).astype(np.float64)
    q = q.astype(np.float64)
    assert q.min() >= -127 and q.max() <= 127
    assert consts[7, 0] == 1.0 and not q[7].any()  # a zero row: scale 1, no weights
    # round to nearest: no weight further than half a step from its int8 value
    assert np.all(np.abs(w - q * consts[:, :1]) <= consts[:, :1] * 0.5 * (1 + 1e-6))
    # t: at least half an input step for every weight step
    assert np.all(consts[:, 2] >= 0.5 * consts[:, 0] * np.abs(q).sum(axis=1)) and not consts[:, 3].any()


@pytest.mark.parametrize("nseg", [1, 2])
@pytest.mark.parametrize("scale", [1e-24, 1e-3, 1.0, 300.0, 1e15])  # 1e-24: x's squares underflow
def test_the_bound_holds_for_every_row(rows, scale, nseg):
    w32 = bf16_value(rows)
    rng = np.random.default_rng(int(np.log2(scale)) + 200 + rows.shape[1])
    for _ in range(5):
        x = (rng.standard_normal(rows.shape[1]) * scale).astype(np.float32)
        x[rng.integers(rows.shape[1])] *= np.float32(40)  # one large input
        approx, bound = screen(rows, x, nseg)
        assert np.all(np.isfinite(bound))
        for exact_order in orders(rows.shape[1], rng):
            assert np.all(holds(fp32_dots(w32, x, exact_order), approx, bound)), "a row's screened logit left its bound"


def grid_rows(rng: np.random.Generator, n: int, h: int):
    """Rows exactly on the int8 grid (no quantization error): (their bf16 bits, q, the step)."""
    q = rng.integers(-127, 128, size=(n, h)).astype(np.float32)
    q[:, 0] = 127  # every row's scale is exactly its step
    step = np.float32(2.0**-7)
    return bf16_bits(q * step), q, step  # integers times a power of two: exact in bf16


def test_the_bound_holds_on_the_int8_grid_with_cancelling_inputs():
    """Rows on the int8 grid against inputs whose products cancel to almost nothing: the fp32 sums then
    differ by their rounding and the input's fixed point alone, which the bound must cover."""
    rng = np.random.default_rng(5)
    bits, q, step = grid_rows(rng, 200, 1536)
    w32 = bf16_value(bits)
    q8, consts = lm_screen_rows(bits)
    assert np.array_equal(q8.astype(np.float32), q) and np.all(consts[:, 0] == step)
    for _ in range(10):
        x = rng.standard_normal(q.shape[1]).astype(np.float32) * np.float32(1e3)
        x[1:] -= np.float32(x[1:].mean())  # large inputs that cancel
        approx, bound = screen(bits, x)
        for exact_order in orders(q.shape[1], rng):
            exact = fp32_dots(w32, x, exact_order)
            assert np.all(holds(exact, approx, bound)), "the bound does not cover fp32 sums and the input's fixed point"


def test_the_bound_is_nearly_reached_by_the_inputs_fixed_point():
    """Inputs just under half a fixed-point step from the grid, each on the side of its weight's sign,
    add their rounding up along a row (the row on the int8 grid, so nothing else differs): the bound
    holds there with little to spare: an input term (t) a sixth smaller fails."""
    rng = np.random.default_rng(11)
    bits, q, _ = grid_rows(rng, 20, 256)  # short rows: the exact sums' rounding margin stays small beside it
    w32 = bf16_value(bits)
    order = np.arange(q.shape[1])
    for r in range(0, 20, 4):
        n = rng.integers(-3, 4, size=q.shape[1]).astype(np.float32)
        x = (n + np.float32(0.5 - 2.0**-9) * np.sign(q[r])) * np.float32(2.0**-10)
        x[0] = np.float32(32512 * 2.0**-10)  # max |x|: s_x is 2^-10 within fp32 rounding
        approx, bound = screen(bits, x)
        gap = abs(float(fp32_dots(w32[r : r + 1], x, order)[0]) - float(approx[r]))
        assert 0.85 * bound[r] <= gap <= bound[r]


def block_candidates(approx: np.ndarray, bound: np.ndarray, nblk: int) -> list[np.ndarray]:
    """The kernel's rule, per block of consecutive rows: the rows whose upper bound is not below the block's
    largest lower bound (fmaxf: a NaN bound lowers no block's largest)."""
    out = []
    for blk in np.array_split(np.arange(len(approx)), nblk):
        lo = np.fmax.reduce(approx[blk] - bound[blk])
        out.append(blk[~(approx[blk] + bound[blk] < lo)])
    return out


@pytest.mark.parametrize("nblk", [1, 7, 150])
def test_every_tied_argmax_row_is_a_candidate_and_the_first_is_picked(rows, nblk):
    """Copies of the leading row tie exactly (the same fp32 evaluation for every row): each copy, the
    first index included, is a candidate of its block, and the best of the blocks' best candidates (ties
    to the first index) is the first copy, however the rows are cut into blocks (150: the copies fall
    into different blocks)."""
    rng = np.random.default_rng(3)
    base = bf16_value(rows)
    w = np.concatenate([base[:3], np.repeat(base[10:11], 4, axis=0), base[11:]])  # rows 3-6: copies
    bits = bf16_bits(w)
    w32 = bf16_value(bits)
    order = np.arange(w.shape[1])
    for _ in range(30):
        x = (w32[3] * np.float32(20.0) + rng.standard_normal(w.shape[1]).astype(np.float32) * np.float32(0.3))
        exact = fp32_dots(w32, x, order)
        tied = np.flatnonzero(exact == exact.max())
        approx, bound = screen(bits, x)
        per_block = block_candidates(approx, bound, nblk)
        candidates = np.concatenate(per_block)
        assert set(tied) <= set(candidates) and tied[0] == 3 and len(tied) >= 4
        assert len(candidates) < len(w)  # the screen leaves rows out
        bests = [c[np.argmax(exact[c])] for c in per_block]  # argmax: the first of equal values
        assert bests[int(np.argmax(exact[bests]))] == tied[0]


@pytest.mark.parametrize("nblk", [1, 7, 64])
def test_the_blocks_pick_the_exact_argmax_where_int8_reorders_the_rows(nblk):
    """Rows that differ from a leading row by less than an int8 step: the screened order is not the
    exact one (checked: the test would pass no rule that keeps only the best screened rows), and the
    best of the blocks' best candidates is the exact argmax."""
    rng = np.random.default_rng(5)
    h = 576
    lead = rng.standard_normal(h).astype(np.float32) * np.float32(0.02)
    reordered = 0
    for _ in range(20):
        bits = bf16_bits(lead + rng.standard_normal((128, h)).astype(np.float32) * np.float32(2e-4))
        w32 = bf16_value(bits)
        x = lead * np.float32(20.0) + rng.standard_normal(h).astype(np.float32) * np.float32(0.3)
        exact = fp32_dots(w32, x, np.arange(h))
        approx, bound = screen(bits, x)
        reordered += int(np.argmax(approx) != np.argmax(exact))
        per_block = block_candidates(approx, bound, nblk)
        bests = [c[np.argmax(exact[c])] for c in per_block]
        assert bests[int(np.argmax(exact[bests]))] == np.argmax(exact)
    assert reordered >= 10


def test_the_bound_is_reached_where_x_follows_a_rows_error(rows):
    """x along a row's own quantization error makes |w . x - s q . x| = |x| |w - s q|: the bound holds
    there with little to spare, so a smaller e would fail."""
    q, consts = lm_screen_rows(rows)
    w32 = bf16_value(rows)
    order = np.arange(rows.shape[1])
    for r in (0, 1, 5, 42, 299):
        x = ((w32[r].astype(np.float64) - consts[r, 0] * q[r].astype(np.float64)) * 1e3).astype(np.float32)
        approx, bound = screen(rows, x)
        gap = abs(float(fp32_dots(w32[r : r + 1], x, order)[0]) - float(approx[r]))
        assert 0.9 * bound[r] <= gap <= bound[r]
