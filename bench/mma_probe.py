"""A product's math on tensor cores: fewer instructions per weight than the kernel's FMAs? (timing only)

The decode kernel's products turn every bf16 weight into an fp32 and multiply-add it (per 16-byte vector
a lane: a shared load, 8 conversions, 8 FMAs; a granule ends in a shuffle sum). With no weight bytes at
all, Qwen2.5's gate/up still takes 8.4 us of a 12.3 us phase (PERF.md session 45): that math lies just
under the weight stream, so any math added per weight (the decode of 12-bit weights) surfaces. Here a
granule of 1,024 weights is 8 rows x 128 columns instead of one row's segment, laid out so that a lane's
four 16-byte vectors are its B fragments of eight `mma.sync.m16n8k16` (bf16 in, fp32 accumulate): the
input x is split into three bf16 terms (x = xh + xm + xl to ~2^-24, as prefill splits it), the A
fragments' rows 0-2, computed once; a weight times a term is exact in fp32, and rows 0-2 of D summed
give each row's dot product. Per granule: 4 shared loads, 8 mma, 4 shuffles, against the FMA path's ~80
instructions a lane. The 12-bit weights of bench/coded_probe.py decode straight into those fragments.

It checks the tensor-core sums against float64 (and the kernel's FMA order against the same reference,
for scale), then times phases through bench/stream_probe.py's ring at four shapes' shares of a product:
with the weight bytes, and with none (the math alone, `no copies`), for the kernel's FMAs, the tensor
cores, and both on 12-bit weights, each in the kernel's loop (a granule's math, then its slot's refill)
and pipelined (the next granule taken into registers and its slot refilled before this one's math); and
the FMAs without their sum across lanes (five dependent shuffles a granule: what a cheaper sum could save),
and with four granules' sums done together (1.5 shuffles a granule). A sum check compares the four-row sum
with four separate shuffle sums.

    python bench/mma_probe.py

`--positions` instead checks and times a granule against P = 1, 2, 3, 5 positions a pass (drafted tokens checked
by one pass, PERF.md session 63): the FMAs convert a weight once and multiply-add it P times, then sum P rows
across lanes; the tensor cores put the P positions' three terms in A's other rows (15 of 16 at P = 5), the same
eight mma a granule, and sum a position's three rows with two shuffles. Checked against float64 at P = 5.

`--profile KERNEL` instead launches one of its ring kernels twice at Qwen2.5 gate/up's share with no copies
(the math alone), built with line info, for Nsight Compute to sample the second launch (CuPy names the
source kern.cu: write SOURCE there first, so that ncu embeds it):

    python3 -c "from bench.mma_probe import SOURCE; open('kern.cu', 'w').write(SOURCE)"
    ncu --clock-control none --import-source yes --kernel-name regex:^ring_phase4$ --launch-skip 1 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters -o r python3 bench/mma_probe.py --profile ring_phase4
    ncu --import r.ncu-rep --page source --csv --print-source cuda,sass > r.csv; python3 bench/ncu_source.py lines r.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.coded_probe import OR_BASE, set_base, to_bf16_bits  # noqa: E402
from bench.coded_probe import SOURCE as CODED_SOURCE  # noqa: E402
from bench.stream_probe import SHARES, RingPhases  # noqa: E402

SOURCE = CODED_SOURCE + r"""
// x[k] of the probe's input, k = 0 .. 127 of a granule's columns: exact in fp32, not in bf16
__device__ __forceinline__ float mma_x(int k) { return (k & 1 ? -1.f : 1.f) * (1.f + k * 0x1p-10f + k * 0x1p-20f); }
__device__ __forceinline__ unsigned bf16_bits(float f) {  // round to nearest even (finite f)
    const unsigned u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float bf16_round(float f) { return __uint_as_float(bf16_bits(f) << 16); }
__device__ __forceinline__ unsigned bf16_pair(float lo, float hi) { return bf16_bits(lo) | bf16_bits(hi) << 16; }
// Lane L's A fragments of the 8 k-steps: row m = L / 4 of A is term m of x (0: xh, 1: xm, 2: xl; rows 3-15
// zero), columns 16 s + 2 (L % 4) + {0, 1} (a0) and + {8, 9} (a2); a1, a3 (rows m + 8) are zero.
struct MmaInputs {
    unsigned a0[8], a2[8];
    __device__ explicit MmaInputs(int lane) {
        const int m = lane >> 2, t = lane & 3;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float x = mma_x(16 * s + 2 * t + (j & 1) + (j >> 1) * 8);
                const float h = bf16_round(x), r = x - h, mid = bf16_round(r);
                v[j] = m == 0 ? h : m == 1 ? mid : m == 2 ? r - mid : 0.f;
            }
            a0[s] = bf16_pair(v[0], v[1]), a2[s] = bf16_pair(v[2], v[3]);
        }
    }
};
__device__ __forceinline__ void mma_step(float (&d)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
// A granule of 8 rows x 128 columns: lane L's vector i holds B fragments (b0, b1) of k-steps 2i and 2i + 1
// (row L / 4, columns 16 s + 2 (L % 4) + {0, 1} and + {8, 9}). Two accumulators (even and odd steps) halve
// the chain. Lanes 0-3 end with rows 2 (L % 4) and 2 (L % 4) + 1: r0, r1.
__device__ __forceinline__ void mma_granule(const uint4 (&wv)[4], const MmaInputs& x, float& r0, float& r1) {
    float d[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        mma_step(d, x.a0[2 * i], x.a2[2 * i], wv[i].x, wv[i].y);
        mma_step(e, x.a0[2 * i + 1], x.a2[2 * i + 1], wv[i].z, wv[i].w);
    }
    r0 = d[0] + e[0], r1 = d[1] + e[1];  // term L / 4's part of rows 2 (L % 4), + 1
    r0 += __shfl_down_sync(0xffffffffu, r0, 4) + __shfl_down_sync(0xffffffffu, r0, 8);
    r1 += __shfl_down_sync(0xffffffffu, r1, 4) + __shfl_down_sync(0xffffffffu, r1, 8);
}
struct MmaMath {
    using Inputs = MmaInputs;
    static constexpr int V = 4;
    __device__ static float run(const uint4 (&wv)[V], const Inputs& x) {
        float r0, r1;
        mma_granule(wv, x, r0, r1);
        return r0 + r1;
    }
};
// The kernel's FMAs without the sum across lanes: what a cheaper sum could save at most.
struct UnsummedMath {
    using Inputs = GranuleInputs;
    static constexpr int V = 4;
    __device__ static float run(const uint4 (&wv)[V], const Inputs& x) { return granule_math<false>(wv, x); }
};
// The kernel's FMAs with four granules' sums across lanes done together (a warp's granules are rows of one
// segment): a lane keeps its partials of three granules and, with the fourth's, reduces the four rows by
// exchanging halves (lane ^ 16: two rows a lane), then quarters (lane ^ 8: one row), then three shuffles:
// 6 shuffles for 4 rows instead of 20. Lanes 0, 8, 16, 24 end with rows 0, 1, 2, 3 (lane 0's is returned).
struct BatchedInputs : GranuleInputs {
    mutable float p0 = 0.f, p1 = 0.f, p2 = 0.f;  // the last three granules' partial sums, newest first
    mutable int n = 0;
    __device__ explicit BatchedInputs(int lane) : GranuleInputs(lane) {}
};
__device__ __forceinline__ float sum_four_rows(float r0, float r1, float r2, float r3) {
    const bool hi16 = threadIdx.x & 16, hi8 = threadIdx.x & 8;
    const float q0 = (hi16 ? r2 : r0) + __shfl_xor_sync(0xffffffffu, hi16 ? r0 : r2, 16);
    const float q1 = (hi16 ? r3 : r1) + __shfl_xor_sync(0xffffffffu, hi16 ? r1 : r3, 16);
    float r = (hi8 ? q1 : q0) + __shfl_xor_sync(0xffffffffu, hi8 ? q0 : q1, 8);
#pragma unroll
    for (int m = 4; m > 0; m >>= 1) r += __shfl_xor_sync(0xffffffffu, r, m);
    return r;
}
struct BatchedMath {
    using Inputs = BatchedInputs;
    static constexpr int V = 4;
    __device__ static float run(const uint4 (&wv)[V], const Inputs& x) {
        const float p = granule_math<false>(wv, x);
        if (x.n < 3) {
            x.p2 = x.p1, x.p1 = x.p0, x.p0 = p, ++x.n;
            return p;
        }
        x.n = 0;
        return sum_four_rows(x.p2, x.p1, x.p0, p);
    }
};
#define MMA_RING(NAME, MATH) extern "C" __global__ void NAME(const uint4* src, long long per_block, int math, \
    int early, long long region, int reps, unsigned* counter, u64* out, const unsigned* chase, u64* lat) { \
    ring_phase<4, MATH>(src, per_block, math, early, region, reps, counter, out, chase, lat); }
MMA_RING(mma_ring_phase4, MmaMath) MMA_RING(coded_mma_ring_phase4, Coded<MmaMath>)
MMA_RING(unsummed_ring_phase4, UnsummedMath) MMA_RING(coded_unsummed_ring_phase4, Coded<UnsummedMath>)
MMA_RING(batched_ring_phase4, BatchedMath) MMA_RING(coded_batched_ring_phase4, Coded<BatchedMath>)

// One warp: lane l's four partials in[4 l + r]; out[r] = row r's sum as sum_four_rows leaves it (lane 8 r).
extern "C" __global__ void sum4_check(const float* in, float* out) {
    const int lane = threadIdx.x & 31;
    const float r = sum_four_rows(in[4 * lane], in[4 * lane + 1], in[4 * lane + 2], in[4 * lane + 3]);
    if (lane % 8 == 0) out[lane / 8] = r;
}
// One warp a granule g (8 rows x 128 columns in mma_granule's layout): rows[8 g + r], r = 0 .. 7.
extern "C" __global__ void mma_check(const uint4* w, int ngran, float* rows) {
    const int lane = threadIdx.x & 31, g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= ngran) return;
    const MmaInputs x(lane);
    uint4 wv[4];
    for (int i = 0; i < 4; ++i) wv[i] = w[g * 128 + i * 32 + lane];
    float r0, r1;
    mma_granule(wv, x, r0, r1);
    if (lane < 4) rows[8 * g + 2 * lane] = r0, rows[8 * g + 2 * lane + 1] = r1;
}
// P positions a pass (drafts checked by one pass: PERF.md session 63). Position p's input is the probe's x rotated
// (x_p[k] = x[(k + 37 p) % 128], exact in fp32 all the same), its three bf16 terms in three rows of A: positions 0-1
// in rows 0-5, 2-3 in rows 8-13, 4 in rows 6, 7 and 14, so that a position's rows sum with two shuffles.
__device__ __forceinline__ float mma_xp(int p, int k) { return mma_x((k + 37 * p) & 127); }
__device__ __forceinline__ int position_of_row(int r, int& term) {  // -1: a row of zeros
    if (r < 6) return term = r % 3, r / 3;
    if (r < 8) return term = r - 6, 4;
    if (r < 14) return term = (r - 8) % 3, 2 + (r - 8) / 3;
    return term = 2, r == 14 ? 4 : -1;
}
template <int P>
struct MmaInputsP {
    unsigned a[8][4];  // k-step s: a0 (row m), a1 (row m + 8), a2 (row m, columns + 8), a3 (row m + 8, columns + 8)
    __device__ explicit MmaInputsP(int lane) {
        const int m = lane >> 2, t = lane & 3;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            float v[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int term;
                const int p = position_of_row(m + 8 * h, term);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float x = p >= 0 && p < P ? mma_xp(p, 16 * s + 2 * t + (j & 1) + (j >> 1) * 8) : 0.f;
                    const float hi = bf16_round(x), r = x - hi, mid = bf16_round(r);
                    v[h][j] = term == 0 ? hi : term == 1 ? mid : r - mid;
                }
            }
            a[s][0] = bf16_pair(v[0][0], v[0][1]), a[s][1] = bf16_pair(v[1][0], v[1][1]);
            a[s][2] = bf16_pair(v[0][2], v[0][3]), a[s][3] = bf16_pair(v[1][2], v[1][3]);
        }
    }
};
__device__ __forceinline__ void mma_step4(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A granule (mma_granule's layout) against P positions: lane L (m = L / 4) ends with weight rows 2 (L % 4) and
// + 1 of position 0 (m = 0, top) and 1 (m = 3, top), 2 (m = 0, bottom) and 3 (m = 3, bottom), 4 (m = 6, top).
template <int P>
__device__ __forceinline__ void mma_granule_p(const uint4 (&wv)[4], const MmaInputsP<P>& x, float (&top)[2], float (&bottom)[2]) {
    float d[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        mma_step4(d, x.a[2 * i], wv[i].x, wv[i].y);
        mma_step4(e, x.a[2 * i + 1], wv[i].z, wv[i].w);
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const float up = d[c] + e[c], down = d[2 + c] + e[2 + c];
        const float next = __shfl_down_sync(0xffffffffu, up, 4), after = __shfl_down_sync(0xffffffffu, up, 8);
        top[c] = up + next + (P > 4 && (threadIdx.x & 31) >> 2 == 6 ? down : after);
        bottom[c] = P > 2 ? down + __shfl_down_sync(0xffffffffu, down, 4) + __shfl_down_sync(0xffffffffu, down, 8) : 0.f;
    }
}
template <int P>
struct MmaMathP {
    using Inputs = MmaInputsP<P>;
    static constexpr int V = 4;
    __device__ static float run(const uint4 (&wv)[V], const Inputs& x) {
        float top[2], bottom[2];
        mma_granule_p<P>(wv, x, top, bottom);
        return top[0] + top[1] + bottom[0] + bottom[1];
    }
};
// The kernel's FMAs against P positions: a weight converted once, P FMAs, P sums across lanes.
template <int P>
struct GranuleInputsP {
    float4 a[P][4], b[P][4];
    __device__ explicit GranuleInputsP(int lane) {
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
            for (int i = 0; i < 4; ++i) a[p][i] = make_float4(lane, i, p, 2.f), b[p][i] = make_float4(i, lane, 3.f, p);
    }
};
template <int P>
struct FmaMathP {
    using Inputs = GranuleInputsP<P>;
    static constexpr int V = 4;
    __device__ static float run(const uint4 (&wv)[V], const Inputs& x) {
        float acc[P];
#pragma unroll
        for (int p = 0; p < P; ++p) acc[p] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 w = wv[i];
            const float w0 = __uint_as_float(w.x << 16), w1 = __uint_as_float(w.x & 0xffff0000u), w2 = __uint_as_float(w.y << 16),
                        w3 = __uint_as_float(w.y & 0xffff0000u), w4 = __uint_as_float(w.z << 16),
                        w5 = __uint_as_float(w.z & 0xffff0000u), w6 = __uint_as_float(w.w << 16), w7 = __uint_as_float(w.w & 0xffff0000u);
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const float4 xa = x.a[p][i], xb = x.b[p][i];
                const float s = fmaf(w3, xa.w, fmaf(w2, xa.z, fmaf(w1, xa.y, w0 * xa.x)));
                const float t = fmaf(w7, xb.w, fmaf(w6, xb.z, fmaf(w5, xb.y, w4 * xb.x)));
                acc[p] += s + t;
            }
        }
        float out = 0.f;
#pragma unroll
        for (int p = 0; p < P; ++p) {
#pragma unroll
            for (int m = 16; m > 0; m >>= 1) acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], m);
            out += acc[p];
        }
        return out;
    }
};
#define P_RINGS(P) MMA_RING(mma_ring_p##P, MmaMathP<P>) MMA_RING(fma_ring_p##P, FmaMathP<P>)
P_RINGS(1) P_RINGS(2) P_RINGS(3) P_RINGS(5)
// One warp a granule g: rows[(p ngran + g) 8 + r] = row r of granule g against position p, p < 5.
extern "C" __global__ void mma_check_p5(const uint4* w, int ngran, float* rows) {
    const int lane = threadIdx.x & 31, g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, m = lane >> 2;
    if (g >= ngran) return;
    const MmaInputsP<5> x(lane);
    uint4 wv[4];
    for (int i = 0; i < 4; ++i) wv[i] = w[g * 128 + i * 32 + lane];
    float top[2], bottom[2];
    mma_granule_p<5>(wv, x, top, bottom);
    const int pt = m == 0 ? 0 : m == 3 ? 1 : m == 6 ? 4 : -1, pb = m == 0 ? 2 : m == 3 ? 3 : -1;
    for (int c = 0; c < 2; ++c) {
        if (pt >= 0) rows[(pt * ngran + g) * 8 + 2 * (lane & 3) + c] = top[c];
        if (pb >= 0) rows[(pb * ngran + g) * 8 + 2 * (lane & 3) + c] = bottom[c];
    }
}
"""


def mma_x() -> np.ndarray:
    k = np.arange(128)
    return (np.where(k & 1, -1.0, 1.0) * (1.0 + k * 2.0**-10 + k * 2.0**-20)).astype(np.float32)  # exact: as mma_x


def fragment_layout(w: np.ndarray) -> np.ndarray:
    """bf16 bits [n, 8 rows, 128 columns] -> [n, 4 vectors, 32 lanes, 8 elements] in mma_granule's order."""
    n = w.shape[0]
    out = np.empty((n, 4, 32, 8), np.uint16)
    for lane in range(32):
        row, t = lane // 4, lane % 4
        for i in range(4):
            cols = [16 * s + 2 * t + j for s in (2 * i, 2 * i + 1) for j in (0, 1, 8, 9)]
            out[:, i, lane] = w[:, row, cols]
    return out


def check(cp, mod) -> None:
    rng = np.random.default_rng()
    n = 2048
    bits = to_bf16_bits(rng.standard_normal((n, 8, 128), dtype=np.float32) * np.float32(0.02))
    w = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    x = mma_x().astype(np.float64)
    exact = w @ x
    scale = np.abs(w) @ np.abs(x)
    rows = cp.zeros(8 * n, dtype=cp.float32)
    mod.get_function("mma_check")((n // 8,), (256,), (cp.asarray(fragment_layout(bits)), np.int32(n), rows))
    got = rows.get().reshape(n, 8).astype(np.float64)
    # the kernel's order in fp32: two chains of four a 16-byte vector, vectors added, lanes by shuffles
    wf, xf = w.astype(np.float32), mma_x()
    prod = (wf * xf).reshape(n, 8, 16, 8)  # [granule, row, lane-vector, element]
    s = prod[..., 0] + prod[..., 1] + prod[..., 2] + prod[..., 3]  # (fp32, not the FMA's rounding: for scale)
    t = prod[..., 4] + prod[..., 5] + prod[..., 6] + prod[..., 7]
    fma = (s + t).sum(axis=-1, dtype=np.float32).astype(np.float64)
    err = lambda v: np.max(np.abs(v - exact) / scale)  # noqa: E731
    print(f"mma check, {n} granules of 8 rows x 128 columns: largest |error| / sum |w x|: tensor cores {err(got):.2e}, "
          f"fp32 adds in the kernel's order {err(fma):.2e} (fp32's unit roundoff 6.0e-08)")
    parts = rng.integers(-1000, 1000, (32, 4)).astype(np.float32)  # integers: every order sums them exactly
    four = cp.zeros(4, dtype=cp.float32)
    mod.get_function("sum4_check")((1,), (32,), (cp.asarray(parts), four))
    print(f"four-row sum check: {'equal to' if np.array_equal(four.get(), parts.sum(axis=0)) else 'DIFFERS from'} "
          f"the four rows' sums")


def time_phases(cp, mod) -> None:
    phase = RingPhases(cp, mod)
    set_base(cp, mod, OR_BASE)
    for name, share in SHARES:
        granules = share // 2048
        for math, how in ((1, "weights streamed"), (2, "no copies (math alone)")):
            line = []
            for label, kernel, vectors in (("FMA", "ring_phase4", granules * 128), ("mma", "mma_ring_phase4", granules * 128),
                                           ("12-bit FMA", "coded_add_ring_phase4", granules * 96),
                                           ("12-bit mma", "coded_mma_ring_phase4", granules * 96)):
                line.append(f"{label} {phase(kernel, vectors, math, 0):5.2f} / {phase(kernel, vectors, math, 2):5.2f}")
            line.append(f"FMA unsummed {phase('unsummed_ring_phase4', granules * 128, math, 0):5.2f}")
            line.append(f"12-bit FMA unsummed {phase('coded_unsummed_ring_phase4', granules * 96, math, 0):5.2f}")
            line.append(f"FMA summed by fours {phase('batched_ring_phase4', granules * 128, math, 0):5.2f}")
            line.append(f"12-bit FMA summed by fours {phase('coded_batched_ring_phase4', granules * 96, math, 0):5.2f}")
            line.append(f"FMA again {phase('ring_phase4', granules * 128, math, 0):5.2f}")
            print(f"{name:16s} {granules * 2:4d} KB of bf16 a block, {how:22s}: phase us (the kernel's loop / pipelined), "
                  + ", ".join(line))


def check_positions(cp, mod) -> None:
    """mma_granule_p's five positions against float64: each position's rows are its own x's dot products."""
    rng = np.random.default_rng()
    n = 2048
    bits = to_bf16_bits(rng.standard_normal((n, 8, 128), dtype=np.float32) * np.float32(0.02))
    w = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    xs = np.stack([np.roll(mma_x(), -37 * p) for p in range(5)]).astype(np.float64)  # x_p[k] = x[(k + 37 p) % 128]
    rows = cp.full(5 * 8 * n, np.nan, dtype=cp.float32)  # poisoned: a row the kernel does not write fails the check
    mod.get_function("mma_check_p5")((n // 8,), (256,), (cp.asarray(fragment_layout(bits)), np.int32(n), rows))
    got = rows.get().reshape(5, n, 8).astype(np.float64)
    errors = [np.max(np.abs(got[p] - w @ xs[p]) / (np.abs(w) @ np.abs(xs[p]))) for p in range(5)]
    verdict = "within" if all(e < 1e-6 for e in errors) else "NOT within"  # (a NaN, an unwritten row, is not)
    print("mma check, five positions a pass: largest |error| / sum |w x| by position: "
          + ", ".join(f"{e:.2e}" for e in errors) + f" ({verdict} 1e-6)")


def time_positions(cp, mod) -> None:
    """A product's share through the ring against P positions a pass: the FMAs' math grows with P, the mma's?"""
    phase = RingPhases(cp, mod)
    spills = ", ".join(f"{kind}_ring_p{p} {f.num_regs} registers {f.local_size_bytes} B local"
                       for p in (1, 5) for kind in ("fma", "mma") for f in [mod.get_function(f"{kind}_ring_p{p}")])
    print(f"builds: {spills}")
    for name, share in SHARES:
        granules = share // 2048
        for math, how in ((1, "weights streamed"), (2, "no copies (math alone)")):
            line = [f"P={p}: FMA {phase(f'fma_ring_p{p}', granules * 128, math):5.2f} mma {phase(f'mma_ring_p{p}', granules * 128, math):5.2f}"
                    for p in (1, 2, 3, 5)]
            print(f"{name:16s} {granules * 2:4d} KB of bf16 a block, {how:22s}: phase us, " + ", ".join(line))


def main() -> None:
    import argparse

    import cupy as cp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", metavar="KERNEL", help="launch this ring kernel twice, math alone (under ncu)")
    parser.add_argument("--positions", action="store_true", help="only the P-positions-a-pass check and timing")
    args = parser.parse_args()
    if args.profile:
        mod = cp.RawModule(code=SOURCE, options=("-std=c++17", "-lineinfo"))
        phase = RingPhases(cp, mod)
        set_base(cp, mod, OR_BASE)
        vectors = SHARES[1][1] // 2048 * (96 if "coded" in args.profile else 128)
        for _ in range(2):
            print(f"{args.profile}, {SHARES[1][0]}'s share, math alone: phase {phase(args.profile, vectors, 2):.2f} us")
        return
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    if args.positions:
        check_positions(cp, mod)
        time_positions(cp, mod)
        return
    check(cp, mod)
    time_phases(cp, mod)


if __name__ == "__main__":
    main()
