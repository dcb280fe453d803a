"""How evenly the blocks of a grid finish one product's share of the weights (timing only).

In the decode kernel every block streams a contiguous run of rows per product (Llama-3.2-1B's
gate/up: 496 KB a block), and the slowest block sets the phase: on the big shapes the slowest
block of gate/up ends 2-3 us after the median one (PERF.md sessions 4 and 14), not always the
same block. This probe streams such a phase alone, many times (a grid barrier before each,
fresh memory each time), through a per-thread ring of 16-byte cp.async copies as the kernel's
(96 KB in flight per block), and compares two layouts of the same bytes:

- runs: block b's share is one contiguous run (the kernel's layout): 132 streams far apart;
- interleaved: the share is cut into chunks and chunk c of block b lies at (c * grid + b):
  the grid sweeps one contiguous front of memory together.

For each it prints the phase (last block done - last block started), the median block and the
slowest block, against the bytes at the ceiling measured in the same run. Then the same phases
through the kernel's own ring structure (per-warp slots of 2 KB granules, each granule's math
before its slot is refilled, or the refill first; alone, and with a 13th warp chasing pointers
meanwhile: the round trip a product's stream imposes), then through a pool of slots that one
producer warp fills against a budget of bytes in flight (PERF.md session 17: one warp's 16-byte
copies cannot feed a block; session 48: nor can one lane's bulk copies of 2 KB granules), and last
what an L2 round trip costs the
critical path while the grid streams: one lane per block chases pointers through an L2-resident
ring while the block's other warps keep 11-132 KB in flight, in every block or in every other
block only (is the wait in the block's own memory pipeline, or shared in L2?).

    python bench/stream_probe.py                  # everything
    python bench/stream_probe.py --producer-only  # the kernel's ring against a producer of every copy
"""

from __future__ import annotations

import numpy as np

SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 now() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ u64 evict_first() {  // the L2 policy of the kernel's ring
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
// The block's first `workers` threads meet at a named barrier (a chasing warp beyond them does not).
__device__ __forceinline__ void sync_workers(int workers) { asm volatile("bar.sync 1, %0;" :: "r"(workers) : "memory"); }
// All blocks meet before phase `rep` (bounded); returns when this block starts it.
__device__ __forceinline__ u64 meet(unsigned* counter, int rep, int workers) {
    sync_workers(workers);
    if (threadIdx.x == 0) {
        atomicAdd(counter, 1u);
        const u64 t = now();
        while (atomicAdd(counter, 0u) < gridDim.x * (rep + 1u) && now() - t < 100000000ull) {}
    }
    sync_workers(workers);
    return now();
}
// out[rep][block] = (start, end), once the block's copies have landed.
__device__ __forceinline__ void record(u64* out, int rep, u64 t0, int workers) {
    asm volatile("cp.async.wait_all;" ::: "memory");
    sync_workers(workers);
    if (threadIdx.x == 0) {
        const long long k = 2 * ((long long)rep * gridDim.x + blockIdx.x);
        out[k] = t0, out[k + 1] = now();
    }
}
// One lane chases pointers through an L2-resident ring until the workers are done: lat[block] =
// ns per dependent load while the block's phases ran.
__device__ void chase_while(const volatile int* done, const unsigned* chase, u64* lat) {
    if ((threadIdx.x & 31) != 0) return;
    unsigned i = blockIdx.x, n = 0;
    const u64 t0 = now();
    while (!*done) {
#pragma unroll 1
        for (int k = 0; k < 16; ++k) i = __ldcg(chase + i);
        n += 16;
    }
    lat[blockIdx.x] = (now() - t0) / (n ? n : 1) + (i == 0xffffffffu);
}
// A granule's inputs (any finite values), in registers as mv_run's.
struct GranuleInputs {
    float4 a[4], b[4];
    __device__ explicit GranuleInputs(int lane) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = make_float4(lane, i, 1.f, 2.f), b[i] = make_float4(i, lane, 3.f, 4.f);
    }
};
// A granule's math as mv_run's: bf16 -> fp32 dot products against the inputs, a five-step shuffle sum
// (SUM false: the lane's own partial sum, no shuffles: what the sum across lanes costs).
template <bool SUM = true>
__device__ __forceinline__ float granule_math(const uint4 (&wv)[4], const GranuleInputs& x) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint4 w = wv[i];
        const float4 xa = x.a[i], xb = x.b[i];
        float s0 = __uint_as_float(w.x << 16) * xa.x, t0 = __uint_as_float(w.z << 16) * xb.x;
        s0 = fmaf(__uint_as_float(w.x & 0xffff0000u), xa.y, s0), t0 = fmaf(__uint_as_float(w.z & 0xffff0000u), xb.y, t0);
        s0 = fmaf(__uint_as_float(w.y << 16), xa.z, s0), t0 = fmaf(__uint_as_float(w.w << 16), xb.z, t0);
        s0 = fmaf(__uint_as_float(w.y & 0xffff0000u), xa.w, s0), t0 = fmaf(__uint_as_float(w.w & 0xffff0000u), xb.w, t0);
        acc += s0 + t0;
    }
#pragma unroll
    for (int m = 16; m > 0 && SUM; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    return acc;
}
// Phases 0 .. reps - 1 of the block's `workers` threads: they meet, phase(rep, the block's share of
// that phase's region) runs, and its start and end are recorded.
template <class Phase>
__device__ void each_phase(const uint4* src, long long per_block, long long region, int reps, unsigned* counter, u64* out,
                           int workers, Phase phase) {
    for (int rep = 0; rep < reps; ++rep) {
        const u64 t0 = meet(counter, rep, workers);
        phase(rep, src + (long long)rep * region + (long long)blockIdx.x * per_block);
        record(out, rep, t0, workers);
    }
}
// One 16-byte copy into shared memory, with the ring's L2 policy.
__device__ __forceinline__ void copy16(const void* dst, const uint4* src, u64 policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                 :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "l"(policy) : "memory");
}

// Phase `rep` of many: all blocks meet (counter), then each streams its share of the region
// at `base`; out[rep][b] = (start, end).
extern "C" __global__ void phase_stream(const uint4* src, long long per_block, int log_chunk, int interleaved,
                                        long long region, int reps, unsigned* counter, u64* out) {
    extern __shared__ __align__(16) uint4 slots[];
    constexpr int S = 16;
    const int T = blockDim.x, G = gridDim.x, b = blockIdx.x;
    const long long n = per_block / T;  // copies per thread
    const u64 policy = evict_first();
    for (int rep = 0; rep < reps; ++rep) {
        const u64 t0 = meet(counter, rep, blockDim.x);
        const uint4* base = src + (long long)rep * region;
        for (long long i = 0; i < n; ++i) {
            if (i >= S) asm volatile("cp.async.wait_group %0;" :: "n"(S - 1) : "memory");
            const long long v = i * T + threadIdx.x;  // the block's v-th vector
            const long long at = interleaved ? (((v >> log_chunk) * G + b) << log_chunk) + (v & ((1 << log_chunk) - 1))
                                             : b * per_block + v;
            copy16(slots + (i % S) * T + threadIdx.x, base + at, policy);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        record(out, rep, t0, blockDim.x);
    }
}

// The same phase through the decode kernel's ring (decode_ring.cuh mv_run): warps 0..11 take
// granules warp, warp + 12, ... (V 16-byte vectors a lane: 2 KB of bf16 weights where V = 4),
// RING slots per warp; a granule's math is Math::run against the lane's Math::Inputs (the
// kernel's: Bf16Math); the slot is refilled after the math (refill 0, as the kernel), as soon
// as its weights are in registers (refill 1), or the next granule is taken into registers and its
// slot refilled before this one's math (refill 2: pipelined); math 0 skips the math, math 2 skips the copies
// (the math alone, on whatever the slots hold). A 13th warp, where launched, chases pointers
// meanwhile (chase_while).
constexpr int NWC = 12, SLOT = 128;  // consumer warps; 16-byte vectors per bf16 granule
struct Bf16Math {
    using Inputs = GranuleInputs;
    static constexpr int V = 4;
    __device__ static float run(const uint4 (&wv)[V], const GranuleInputs& x) { return granule_math(wv, x); }
};
template <int RING, class Math>
__device__ void ring_phase(const uint4* src, long long per_block, int math, int early, long long region, int reps,
                           unsigned* counter, u64* out, const unsigned* chase, u64* lat) {
    extern __shared__ __align__(16) uint4 ring_smem[];
    __shared__ volatile float red[4096];  // the math's results: kept, so the math is too
    __shared__ volatile int done;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, workers = NWC * 32;
    if (threadIdx.x == 0) done = 0;
    __syncthreads();
    if (warp >= NWC) return chase_while(&done, chase, lat);
    constexpr int V = Math::V, GRAN = 32 * V;  // 16-byte vectors per granule
    uint4* ring = ring_smem + warp * RING * GRAN;
    const int ngran = (int)(per_block / GRAN);
    const u64 policy = evict_first();
    const typename Math::Inputs x(lane);
    each_phase(src, per_block, region, reps, counter, out, workers, [&](int, const uint4* base) {
        int issued = warp, head = 0, tail = 0;
        auto refill = [&]() {
            if (issued < ngran) {
                uint4* slot = ring + (head % RING) * GRAN;
#pragma unroll
                for (int i = 0; i < V && math != 2; ++i)
                    copy16(slot + i * 32 + lane, base + (long long)issued * GRAN + i * 32 + lane, policy);
                issued += NWC;
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
            ++head;
        };
        auto take = [&](uint4 (&wv)[V]) {  // the oldest granule, once landed, into registers
            asm volatile("cp.async.wait_group %0;" :: "n"(RING - 1) : "memory");
            const uint4* slot = ring + (tail % RING) * GRAN;
#pragma unroll
            for (int i = 0; i < V; ++i) wv[i] = slot[i * 32 + lane];
            ++tail;
        };
        for (int i = 0; i < RING; ++i) refill();
        if (early == 2) {  // pipelined: the next granule taken (and its slot refilled) before this one's math
            uint4 cur[V], nxt[V];
            take(cur);
            refill();
            for (int g = warp; g < ngran; g += NWC) {
                const bool more = g + NWC < ngran;
                if (more) take(nxt), refill();
                float acc = __uint_as_float(cur[0].x ^ cur[V - 1].w);
                if (math) acc = Math::run(cur, x);
                if (lane == 0) red[g & 4095] = acc;
#pragma unroll
                for (int i = 0; i < V; ++i) cur[i] = nxt[i];
            }
            return;
        }
        for (int g = warp; g < ngran; g += NWC) {
            uint4 wv[V];
            take(wv);
            if (early) refill();
            float acc = __uint_as_float(wv[0].x ^ wv[V - 1].w);
            if (math) acc = Math::run(wv, x);  // a branch: `math ? ... : ...` computed it always
            if (lane == 0) red[g & 4095] = acc;
            if (!early) refill();
        }
    });
    if (threadIdx.x == 0) done = 1;
}
extern "C" __global__ void ring_phase4(const uint4* src, long long per_block, int math, int early, long long region,
                                       int reps, unsigned* counter, u64* out, const unsigned* chase, u64* lat) {
    ring_phase<4, Bf16Math>(src, per_block, math, early, region, reps, counter, out, chase, lat);
}

// The same phase fed by a producer warp against a budget of bytes in flight (PERF.md Next 1):
// the 12 consumer warps take granules as ring_phase's (warp w: w, w + 12, ...) from a pool of
// NSLOT 2 KB slots, granule k in slot k % NSLOT; warp 12 issues granule k once its slot is empty
// and fewer than `budget` granules are in flight (issued, not landed), so the pool may hold more
// landed granules than are in flight. Each slot has a `full` mbarrier (the producer's 32 lanes'
// copies arrive on it as they land: cp.async.mbarrier.arrive.noinc) and an `empty` one (the
// consumer's lane 0 arrives once the warp's registers hold the granule). Granule and lap numbers
// run on across phases (k0), so no barrier is re-armed. A wait gives up after ~50 ms and counts
// the failure in err (a bug must not hang the probe).
constexpr int NSLOT = 48;
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ bool mbar_test(u64* m, unsigned parity) {  // has phase `parity` of m completed?
    unsigned r;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(r) : "r"(smem_addr(m)), "r"(parity) : "memory");
    return r != 0;
}
__device__ __forceinline__ bool mbar_try(u64* m, unsigned parity) {  // the same, the thread suspended a while first
    unsigned r;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(r) : "r"(smem_addr(m)), "r"(parity) : "memory");
    return r != 0;
}
// Until phase `parity` of m completes: spinning on test_wait, or (suspend) through try_wait.
__device__ __forceinline__ void mbar_wait(u64* m, unsigned parity, unsigned* err, bool suspend) {
    if (mbar_test(m, parity)) return;
    const u64 t0 = now();
    while (!(suspend ? mbar_try(m, parity) : mbar_test(m, parity)))
        if (now() - t0 > 50000000ull) {
            atomicAdd(err, 1u);
            return;
        }
}
__device__ __forceinline__ void mbar_arrive(u64* m) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(smem_addr(m)) : "memory");
}
// GROUPS 0: the copies tracked by cp.async.mbarrier.arrive.noinc, `budget` granules in flight at
// most; GROUPS n: by commit groups, n in flight at most (cp.async.wait_group n - 1 after each);
// GROUPS -1: one bulk copy a granule issued by the producer's lane 0, completing on the slot's `full`
// barrier (expect_tx), `budget` granules in flight at most: the compute warps issue nothing.
// solo: no consumers, the producer overwrites its slots unread (its own issue rate). NPROD producer warps
// (GROUPS 0 only past one) take granules k = p, p + NPROD, ... each.
template <int GROUPS, int NPROD = 1>
__device__ void budget_phase(const uint4* src, long long per_block, int budget, bool suspend, bool solo, long long region, int reps,
                             unsigned* counter, u64* out, unsigned* err, const unsigned* chase, u64* lat) {
    extern __shared__ __align__(16) uint4 pool[];
    __shared__ volatile float red[4096];
    __shared__ volatile int done;
    __shared__ __align__(8) u64 full[NSLOT], empty[NSLOT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, workers = (NWC + NPROD) * 32;
    constexpr bool BULK = GROUPS < 0;
    static_assert(NPROD == 1 || GROUPS == 0, "several producers: mbarrier arrivals only");
    if (threadIdx.x == 0) {
        done = 0;
        for (int s = 0; s < NSLOT; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(full + s)), "r"(BULK ? 1 : 32) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(empty + s)) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp >= NWC + NPROD) return chase_while(&done, chase, lat);
    const int ngran = (int)(per_block / SLOT);
    const u64 policy = evict_first();
    const GranuleInputs x(lane);
    each_phase(src, per_block, region, reps, counter, out, workers, [&](int rep, const uint4* base) {
        const long long k0 = (long long)rep * ngran;
        if (warp >= NWC) {  // a producer
            const int p = warp - NWC;
            long long landed = k0 + p;  // the oldest of its granules not yet seen landed
            for (int k = p; k < ngran; k += NPROD) {
                const long long kk = k0 + k;
                const int s = (int)(kk % NSLOT);
                const unsigned lap = (unsigned)(kk / NSLOT);
                if (GROUPS > 0) {  // each lane arrives on a granule's `full` once its own copies of it have landed
                    if (lap > 0 && !solo && !mbar_test(empty + s, (lap - 1) & 1u)) {  // the consumers may wait for what landed
                        asm volatile("cp.async.wait_all;" ::: "memory");
                        for (; landed < kk; ++landed) mbar_arrive(full + landed % NSLOT);
                    }
                } else {
                    for (; kk - landed >= budget; landed += NPROD)
                        mbar_wait(full + landed % NSLOT, (unsigned)(landed / NSLOT) & 1u, err, suspend);
                }
                if (lap > 0 && !solo) mbar_wait(empty + s, (lap - 1) & 1u, err, suspend);  // the slot's last granule is taken
                if (BULK) {
                    if (lane == 0) {
                        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                                     :: "r"(smem_addr(full + s)), "r"(SLOT * 16) : "memory");
                        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                                     " [%0], [%1], %2, [%3], %4;"
                                     :: "r"(smem_addr(pool + s * SLOT)), "l"(base + (long long)k * SLOT), "r"(SLOT * 16),
                                        "r"(smem_addr(full + s)), "l"(policy) : "memory");
                    }
                    __syncwarp();
                    continue;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) copy16(pool + s * SLOT + i * 32 + lane, base + (long long)k * SLOT + i * 32 + lane, policy);
                if constexpr (GROUPS > 0) {
                    asm volatile("cp.async.commit_group;" ::: "memory");
                    asm volatile("cp.async.wait_group %0;" :: "n"(GROUPS - 1) : "memory");  // the budget
                    for (; kk - landed >= GROUPS - 1 && landed <= kk; ++landed) mbar_arrive(full + landed % NSLOT);
                } else {
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(smem_addr(full + s)) : "memory");
                }
            }
            if (GROUPS > 0) {
                asm volatile("cp.async.wait_all;" ::: "memory");
                for (; landed < k0 + ngran; ++landed) mbar_arrive(full + landed % NSLOT);
            }
        } else if (!solo) {  // a consumer
            for (int g = warp; g < ngran; g += NWC) {
                const long long kk = k0 + g;
                const int s = (int)(kk % NSLOT);
                mbar_wait(full + s, (unsigned)(kk / NSLOT) & 1u, err, suspend);
                uint4 wv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) wv[i] = pool[s * SLOT + i * 32 + lane];
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + s);
                const float acc = granule_math(wv, x);
                if (lane == 0) red[g & 4095] = acc;
            }
        }
    });
    if (threadIdx.x == 0) done = 1;
}
#define BUDGET(G) extern "C" __global__ void budget_phase_##G(const uint4* src, long long per_block, int budget, \
    int suspend, long long region, int reps, unsigned* counter, u64* out, unsigned* err, const unsigned* chase, u64* lat) { \
    budget_phase<G>(src, per_block, budget, suspend == 1, suspend == 2, region, reps, counter, out, err, chase, lat); }
BUDGET(0) BUDGET(8) BUDGET(16) BUDGET(24) BUDGET(32)
extern "C" __global__ void budget_phase_bulk(const uint4* src, long long per_block, int budget, int suspend,
                                             long long region, int reps, unsigned* counter, u64* out, unsigned* err,
                                             const unsigned* chase, u64* lat) {
    budget_phase<-1>(src, per_block, budget, suspend == 1, suspend == 2, region, reps, counter, out, err, chase, lat);
}
extern "C" __global__ void budget_phase_0x2(const uint4* src, long long per_block, int budget, int suspend,
                                            long long region, int reps, unsigned* counter, u64* out, unsigned* err,
                                            const unsigned* chase, u64* lat) {
    budget_phase<0, 2>(src, per_block, budget, suspend == 1, suspend == 2, region, reps, counter, out, err, chase, lat);
}

// What a round trip to L2 costs the critical path while the weights stream: in every block,
// warps 1.. stream their block's run of the buffer through a ring of S 16-byte copies per thread,
// while warp 0's lane 0 chases pointers through an L2-resident ring (each load depends on the
// one before). out[b] = ns per dependent load; the caller times the whole (S = 0: no stream).
template <int S>
__device__ void loaded_latency(const uint4* src, long long per_block, const unsigned* chase, int n_chase, int quiet_odd,
                               u64* out) {
    extern __shared__ __align__(16) uint4 ring[];
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) {
            unsigned i = blockIdx.x;
            for (int k = 0; k < 64; ++k) i = __ldcg(chase + i);
            const u64 t0 = now();
            for (int k = 0; k < n_chase; ++k) i = __ldcg(chase + i);
            out[blockIdx.x] = (now() - t0) / n_chase + (i == 0xffffffffu);
        }
        return;
    }
    if (S == 0 || (quiet_odd && (blockIdx.x & 1))) return;  // odd blocks only chase: is the wait local or in L2?
    const u64 policy = evict_first();
    const int T = blockDim.x - 32, t = threadIdx.x - 32;
    const uint4* p = src + blockIdx.x * per_block;
    const long long n = per_block / T;
    for (long long i = 0; i < n; ++i) {
        if (i >= S) asm volatile("cp.async.wait_group %0;" :: "n"(S > 0 ? S - 1 : 0) : "memory");
        copy16(ring + (i % (S > 0 ? S : 1)) * T + t, p + i * T + t, policy);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}
#define LOADED(S) extern "C" __global__ void loaded_##S(const uint4* src, long long per_block, const unsigned* chase, \
    int n_chase, int quiet_odd, u64* out) { loaded_latency<S>(src, per_block, chase, n_chase, quiet_odd, out); }
LOADED(0) LOADED(2) LOADED(4) LOADED(8) LOADED(12) LOADED(16) LOADED(24)
"""


def l2_ring(cp):
    """A 256 KB cycle of indices in random order (L2-resident): a pointer chase's ring."""
    n = 1 << 16
    perm = np.random.default_rng(0).permutation(n).astype(np.uint32)
    ring = np.empty(n, np.uint32)
    ring[perm] = np.roll(perm, -1)
    return cp.asarray(ring)


def phase_times(out: np.ndarray, reps: int, nsm: int) -> tuple[float, float, float, float]:
    """Medians over the phases after the first four (warm-up), in us, from each_phase's records:
    the phase (last block done - last block started), a median block's work, the slowest block's
    work, the spread of the blocks' starts."""
    t = out.astype(np.int64).reshape(reps, nsm, 2)[4:]
    work = (t[:, :, 1] - t[:, :, 0]) / 1e3
    phase = (t[:, :, 1].max(axis=1) - t[:, :, 0].max(axis=1)) / 1e3
    starts = (t[:, :, 0].max(axis=1) - t[:, :, 0].min(axis=1)) / 1e3
    return (float(np.median(phase)), float(np.median(work)), float(np.median(work.max(axis=1))),
            float(np.median(starts)))


# A block's share of a product's weights at four shapes (bytes of bf16, 132 blocks)
SHARES = (("Llama gate/up", 507904), ("Qwen2.5 gate/up", 417792), ("Llama down", 253952), ("Llama QKV", 95232))


class RingPhases:
    """Times phases of a kernel with ring_phase4's signature (bench/coded_probe.py, bench/mma_probe.py): one
    block of 384 threads a multiprocessor streams `vectors` 16-byte vectors each, up to 64 phases on fresh
    memory of a 4 GB buffer, no chasing warp; the call returns the median phase in us (phase_times)."""

    THREADS, SMEM = 384, 200 * 1024

    def __init__(self, cp, mod):
        self.cp, self.mod = cp, mod
        self.nsm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
        self.big = cp.zeros(4 << 30, dtype=cp.uint8)
        self.counter = cp.zeros(1, dtype=cp.uint32)
        self.chase, self.lat = cp.zeros(1, dtype=cp.uint32), cp.zeros(self.nsm, dtype=cp.uint64)

    def __call__(self, name: str, vectors: int, math: int, early: int = 0) -> float:
        cp, nsm = self.cp, self.nsm
        kernel = self.mod.get_function(name)
        kernel.max_dynamic_shared_size_bytes = self.SMEM
        region = (nsm * vectors + 4095) // 4096 * 4096
        reps = min(64, (4 << 30) // 16 // region)
        out = cp.zeros(2 * reps * nsm, dtype=cp.uint64)
        self.counter.fill(0)
        kernel((nsm,), (self.THREADS,), (self.big, np.int64(vectors), np.int32(math), np.int32(early), np.int64(region),
                                         np.int32(reps), self.counter, out, self.chase, self.lat), shared_mem=self.SMEM)
        cp.cuda.Device().synchronize()
        return phase_times(out.get(), reps, nsm)[0]


def producer_phases(mod, phases, smem: int, thr: int, err) -> None:
    """SmolLM2's layer share and two of Llama's products through the kernel's ring (12 warps refilling their own
    slots) against producers that issue every copy (one or two warps' 16-byte copies, or one lane's bulk copies),
    the 12 compute warps issuing none; a chasing warp beside each measures an L2 round trip meanwhile."""
    kr = mod.get_function("ring_phase4")
    kr.max_dynamic_shared_size_bytes = smem
    for name, share in (("SmolLM2 layer", 55296),) + SHARES[:1] + SHARES[2:3]:
        per = share // 16 // 128 * 128  # whole 2 KB granules
        line = phases(kr, per, (np.int32(1), np.int32(0)), thr + 32, True)
        print(f"{name:16s} {per * 16 // 1024:4d} KB a block, kernel's ring, math, refill after it: {line}")
        for kernel, budget, suspend, how in (("budget_phase_0", 48, 1, "16-byte copies"),
                                             ("budget_phase_0x2", 48, 1, "two warps' 16-byte"),
                                             ("budget_phase_bulk", 48, 0, "bulk, waits spin"),
                                             ("budget_phase_bulk", 48, 1, "bulk, waits suspend"),
                                             ("budget_phase_bulk", 16, 1, "bulk, waits suspend")):
            kb = mod.get_function(kernel)
            kb.max_dynamic_shared_size_bytes = smem
            err.fill(0)
            producers = 2 if kernel.endswith("x2") else 1
            line = phases(kb, per, (np.int32(budget), np.int32(suspend)), thr + 32 * (producers + 1), True, (err,))
            print(f"{name:16s} {per * 16 // 1024:4d} KB a block, producer, {how:19s}, {budget * 2:2d} KB in flight at most: "
                  f"{line}" + (f"; {int(err.get()[0])} waits gave up" if int(err.get()[0]) else ""))


def main() -> None:
    import argparse

    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producer-only", action="store_true",
                    help="only the kernel's ring against producers of every copy, with a chasing warp")
    args = ap.parse_args()

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    fn = mod.get_function("phase_stream")
    nsm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    thr, smem = 384, 200 * 1024  # one block per multiprocessor, as the decode kernel
    fn.max_dynamic_shared_size_bytes = smem
    big = cp.zeros(4 << 30, dtype=cp.uint8)
    counter = cp.zeros(1, dtype=cp.uint32)
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def fastest(launch) -> float:
        """Seconds of the fastest of three runs of launch()."""
        times = []
        for _ in range(3):
            start.record()
            launch()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
        return min(times)

    # the ceiling in this run: the same kernel, one long phase per block
    per = (4 << 30) // 16 // nsm // thr * thr
    out = cp.zeros(2 * nsm, dtype=cp.uint64)

    def once() -> None:
        counter.fill(0)
        fn((nsm,), (thr,), (big, np.int64(per), np.int32(10), np.int32(0), np.int64(0), np.int32(1), counter, out),
           shared_mem=smem)

    best = nsm * per * 16 / fastest(once) / 1e9
    print(f"{nsm} blocks streaming {nsm * per * 16 >> 20} MB once: {best:.0f} GB/s (the ceiling below)")

    chase = l2_ring(cp)
    lat = cp.zeros(nsm, dtype=cp.uint64)
    err = cp.zeros(1, dtype=cp.uint32)

    def phases(kernel, per: int, args: tuple, threads: int = thr, chased: bool | None = None, extra: tuple = ()) -> str:
        """Up to 64 phases of `per` vectors a block on fresh memory; the first four warm up. A
        kernel with a chasing warp takes (chase, lat) last (`chased` not None), after `extra`;
        where it is launched with that warp (`chased`), the L2 round trip meanwhile is reported."""
        region = (nsm * per + 4095) // 4096 * 4096
        reps = min(64, (4 << 30) // 16 // region)
        out = cp.zeros(2 * reps * nsm, dtype=cp.uint64)
        counter.fill(0)
        tail = extra + (() if chased is None else (chase, lat))
        kernel((nsm,), (threads,), (big, np.int64(per), *args, np.int64(region), np.int32(reps), counter, out, *tail),
               shared_mem=smem)
        cp.cuda.Device().synchronize()
        phase, work, slowest, starts = phase_times(out.get(), reps, nsm)
        return (f"phase {phase:6.2f} us (ideal {nsm * per * 16 / best / 1e3:5.2f}), median block "
                f"{work:6.2f}, slowest {slowest:6.2f}, spread of starts {starts:4.2f}"
                + (f"; L2 round trip meanwhile {np.median(lat.get()):5.0f} ns" if chased else ""))

    if args.producer_only:
        producer_phases(mod, phases, smem, thr, err)
        return
    for name, share in SHARES:
        per = share // 16 // thr * thr  # whole ring rounds
        for layout, log_chunk in (("runs", 0), ("interleaved 2 KB", 7), ("interleaved 8 KB", 9), ("runs", 0)):
            line = phases(fn, per, (np.int32(log_chunk), np.int32(log_chunk > 0)))
            print(f"{name:16s} {per * 16 // 1024:4d} KB a block, {layout:17s}: {line}")
    # the same phases through the kernel's ring structure, alone and with a 13th warp chasing pointers
    kr = mod.get_function("ring_phase4")
    kr.max_dynamic_shared_size_bytes = smem
    for name, share in SHARES[:3]:
        per = share // 16 // 128 * 128  # whole 2 KB granules
        for label, math, early in (("no math", 0, 0), ("math, refill after it", 1, 0), ("math, refill first", 1, 1)):
            for chased in (False, True):
                line = phases(kr, per, (np.int32(math), np.int32(early)), thr + 32 * chased, chased)
                print(f"{name:16s} {per * 16 // 1024:4d} KB a block, kernel's ring, {label:22s}: {line}")
    # the same phases fed by a producer warp against a budget of granules in flight, a chasing warp beside
    for name, share in SHARES[:3]:
        per = share // 16 // 128 * 128
        for groups, budget, suspend in ((0, 16, 0), (0, 16, 1), (0, 48, 1), (8, 8, 1), (16, 16, 1), (32, 32, 1), (8, 8, 2),
                                        (32, 32, 2)):
            kb = mod.get_function(f"budget_phase_{groups}")
            kb.max_dynamic_shared_size_bytes = smem
            how = ("commit groups" if groups else "mbarrier arrive") + (", waits spin", ", waits suspend", ", alone")[suspend]
            line = phases(kb, per, (np.int32(budget), np.int32(suspend)), thr + 64, True, (err,))
            print(f"{name:16s} {per * 16 // 1024:4d} KB a block, producer warp, {how}, {budget * 2:2d} KB in flight at most: "
                  f"{line}" + (f"; {int(err.get()[0])} waits gave up" if int(err.get()[0]) else ""))
    # the critical path's L2 round trip against the ring's depth
    per = (16 << 20) // 16 // 352 * 352  # 16 MB a block, 11 streaming warps: ~240-480 us
    n_chase = 200  # at most ~220 us of chasing: all of it while the stream runs
    for depth in (0, 2, 4, 8, 12, 16, 24):
        k = mod.get_function(f"loaded_{depth}")
        k.max_dynamic_shared_size_bytes = smem
        for quiet_odd in (0, 1):
            streamers = nsm // 2 if quiet_odd else nsm
            secs = fastest(lambda k=k, quiet_odd=quiet_odd: k(
                (nsm,), (thr,), (big, np.int64(per), chase, np.int32(n_chase), np.int32(quiet_odd), lat), shared_mem=smem))
            ns = lat.get().astype(np.int64)
            mine, quiet = (ns[0::2], ns[1::2]) if quiet_odd else (ns, ns)
            stream = f"{streamers * per * 16 / secs / 1e9:5.0f} GB/s" if depth else " none     "
            who = "even blocks stream" if quiet_odd else "every block streams"
            print(f"ring of {depth:2d} copies a thread ({depth * 16 * 352 // 1024:3d} KB a block in flight), {who:19s}: "
                  f"stream {stream}; L2 round trip beside it, median / max ns: in streaming blocks {np.median(mine):5.0f} / "
                  f"{mine.max():5.0f}" + (f", in quiet blocks {np.median(quiet):5.0f} / {quiet.max():5.0f}" if quiet_odd else ""))
            if not depth:
                break


if __name__ == "__main__":
    main()
