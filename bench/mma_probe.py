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

from bench.coded_probe import OR_BASE, encode, set_base, to_bf16_bits  # noqa: E402
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


def main() -> None:
    import argparse

    import cupy as cp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", metavar="KERNEL", help="launch this ring kernel twice, math alone (under ncu)")
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
    check(cp, mod)
    time_phases(cp, mod)


if __name__ == "__main__":
    main()
