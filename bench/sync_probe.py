"""Latency probes for the monokernel's building blocks on the current GPU (timing only).

Prints, in nanoseconds: a block barrier; a barrier right after issuing global loads that are
still in flight (does bar.sync wait for them?) and after cp.async copies still in flight; an
L2-hit load (pointer chase); a flag handed between two blocks (one way); a gpu-scope
acquire/release fence with and without stores in flight; a local-memory load (a spilled register's
reload) right after an acquire fence or load, against one without, and as the block's local
footprint grows beside 0-220 KB of shared memory; the SM clock under load; what a
pass over 16-256 KB of straight-line code costs cold and warm (instruction fetch: the decode
kernel is 270 KB of machine code), and what a 1 KB stretch of code costs after a wait when the
warp last ran it 39-234 KB of code ago; and whether an L2 prefetch works:
every block asks L2 for 128 KB (one thread's bulk `cp.async.bulk.prefetch.L2`, or every
thread's `prefetch.global.L2` per line), waits 10 us, then reads it; against reading 128 KB
no one asked for. Runs last, in its own launch: the decode kernel hung with bulk prefetches.
Before it, the hop alone: every block stores its slice of an n-word tagged vector and then
gathers all of it, as the decode kernel's hops do, many hops in a row (n = 576 .. 8960 as in
the four shapes, on all multiprocessors or a quarter of them, polls back to back or sleeping
100 ns after a miss, the vector stored once or in 2-8 copies that different blocks poll): what one
hop costs with no weights streaming and no math, and whether the polls' own traffic slows it;
and the same hop through summed words (red.add, a count in the top byte), with 1, 3 or 7 adds a word;
and the 576-word hop with a wave sum, a shared store or both between its polls and its barrier, against none
(with and without a call inside the poll loop, as the decode kernel's watchdog), with lanes that leave the
poll loop one by one and with a wave that polls until all its lanes are in (the decode kernel's since v37);
and the 576-word hop read from 1-3 copies with a max and sum word each, as O's gather merges the attention
units' records (since v38), with that word in several places and loaded by lane 0 alone or late.

    python bench/sync_probe.py
"""

from __future__ import annotations

import numpy as np

# What every probe's source starts with (bench/*_probe.py): the global timer, and a 16-byte cp.async into shared memory.
PREAMBLE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 now() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ void cp16(void* dst, const void* src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
"""

SOURCE = PREAMBLE + r"""
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v; asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v; }

// out[0]: barrier alone; out[1]: barrier with loads in flight; out[2]: barrier with cp.async in flight
extern "C" __global__ void probe_barrier(const uint4* __restrict__ big, u64* out, unsigned* sink) {
    __shared__ __align__(16) uint4 buf[512 * 4];
    const int t = threadIdx.x;
    const size_t base = (size_t)blockIdx.x * 512 * 64 + t;
    u64 a = 0, b = 0, c = 0;
    unsigned acc = 0;
    for (int rep = 0; rep < 16; ++rep) {
        const size_t off = base + (size_t)rep * gridDim.x * 512 * 64;
        __syncthreads();
        u64 t0 = now();
        __syncthreads();
        u64 t1 = now();
        a += t1 - t0;
        uint4 v[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = ld_stream(big + off + i * 512);
        u64 t2 = now();
        __syncthreads();
        u64 t3 = now();
        b += t3 - t2;
        #pragma unroll
        for (int i = 0; i < 4; ++i) acc += v[i].x ^ v[i].w;
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < 4; ++i) cp16(buf + t * 4 + i, big + off + 16 * 512 + i * 512);
        asm volatile("cp.async.commit_group;" ::: "memory");
        u64 t4 = now();
        __syncthreads();
        u64 t5 = now();
        c += t5 - t4;
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        acc += buf[t * 4].x;
    }
    if (acc == 0x12345678u) sink[0] = acc;
    if (t == 0 && blockIdx.x == 0) { out[0] = a / 16; out[1] = b / 16; out[2] = c / 16; }
}

// pointer chase over an L2-resident ring: out[0] = ns per dependent load
extern "C" __global__ void probe_l2(const unsigned* ring, int n, u64* out) {
    unsigned i = 0;
    for (int k = 0; k < 256; ++k) i = __ldcg(ring + i);  // warm
    u64 t0 = now();
    for (int k = 0; k < 4096; ++k) i = __ldcg(ring + i);
    u64 t1 = now();
    out[0] = (t1 - t0) / 4096;
    out[1] = i;
}

// two blocks hand a flag back and forth: out[0] = ns per one-way hand-over
extern "C" __global__ void probe_pingpong(unsigned* flags, u64* out, int far) {
    if (threadIdx.x != 0) return;
    const int me = blockIdx.x;
    unsigned* mine = flags + (me ? far : 0);
    unsigned* other = flags + (me ? 0 : far);
    u64 t0 = now();
    for (unsigned r = 1; r <= 2000; ++r) {
        if (me == 0) {
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(mine), "r"(r) : "memory");
            unsigned v; do { asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(other) : "memory"); } while (v < r);
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        } else {
            unsigned v; do { asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(other) : "memory"); } while (v < r);
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(mine), "r"(r) : "memory");
        }
    }
    u64 t1 = now();
    if (me == 0) out[0] = (t1 - t0) / 4000;
}

// fence.acq_rel.gpu cost: out[0] alone, out[1] after 8 stores per thread
extern "C" __global__ void probe_fence(float* scratch, u64* out) {
    u64 a = 0, b = 0;
    for (int rep = 0; rep < 64; ++rep) {
        u64 t0 = now();
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        u64 t1 = now();
        #pragma unroll
        for (int i = 0; i < 8; ++i) scratch[(size_t)blockIdx.x * 4096 + threadIdx.x + i * 512] = (float)rep;
        u64 t2 = now();
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        u64 t3 = now();
        a += t1 - t0;
        b += t3 - t2;
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) { out[0] = a / 64; out[1] = b / 64; }
}

// A local-memory load (where spilled registers live) right after an acquire: one thread chases
// indices through a local array. out[0] ns per dependent local load; out[1] with fence.acq_rel.gpu
// before each; out[2] with an ld.acquire.gpu of a flag before each; out[3] the fence alone.
extern "C" __global__ void probe_local_acquire(const int* perm, const unsigned* flag, u64* out) {
    int loc[256];  // indexed at run time: in local memory
    for (int k = 0; k < 256; ++k) loc[k] = perm[k];
    int i = 0;
#pragma unroll 1
    for (int k = 0; k < 256; ++k) i = loc[i];  // warm
    const u64 t0 = now();
#pragma unroll 1
    for (int k = 0; k < 1024; ++k) i = loc[i];
    const u64 t1 = now();
#pragma unroll 1
    for (int k = 0; k < 1024; ++k) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        i = loc[i];
    }
    const u64 t2 = now();
    unsigned f = 0;
#pragma unroll 1
    for (int k = 0; k < 1024; ++k) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag + (i & 1)) : "memory");
        f += v;
        i = loc[i];
    }
    const u64 t3 = now();
#pragma unroll 1
    for (int k = 0; k < 1024; ++k) asm volatile("fence.acq_rel.gpu;" ::: "memory");
    const u64 t4 = now();
    out[0] = (t1 - t0) / 1024, out[1] = (t2 - t1) / 1024, out[2] = (t3 - t2) / 1024, out[3] = (t4 - t3) / 1024;
    out[4] = i + f;
}

// Spilled registers' reach: every thread of a 384-thread block chases through its own local array
// of W words (the block's local footprint: W * 4 * 384 bytes, like a stack frame of that size), with
// the block's dynamic shared memory (unused) as large as the launch asks: the L1 left beside it shrinks.
// out[0] ns per dependent local load (thread 0).
template <int W>
__device__ void local_footprint(const int* next, u64* out) {
    int loc[W];  // indexed at run time: in local memory
    for (int k = 0; k < W; ++k) loc[k] = next[k];
    int i = 0;
#pragma unroll 1
    for (int k = 0; k < 4 * W; ++k) i = loc[i];  // warm
    __syncthreads();
    const u64 t0 = now();
#pragma unroll 1
    for (int k = 0; k < 1024; ++k) i = loc[i];
    const u64 t1 = now();
    if (threadIdx.x == 0) out[0] = (t1 - t0) / 1024, out[1] = i;
}
extern "C" __global__ void probe_local_8(const int* next, u64* out) { local_footprint<8>(next, out); }
extern "C" __global__ void probe_local_32(const int* next, u64* out) { local_footprint<32>(next, out); }
extern "C" __global__ void probe_local_64(const int* next, u64* out) { local_footprint<64>(next, out); }
extern "C" __global__ void probe_local_128(const int* next, u64* out) { local_footprint<128>(next, out); }

// The SM clock while every multiprocessor spins: out[0] cycles and out[1] ns over ~200 us.
extern "C" __global__ void probe_clock(u64* out) {
    const u64 t0 = now();
    const long long c0 = clock64();
    while (now() - t0 < 200000) {}
    const long long c1 = clock64();
    const u64 t1 = now();
    if (threadIdx.x == 0 && blockIdx.x == 0) { out[0] = c1 - c0; out[1] = t1 - t0; }
}

// The FMA chains of the instruction-fetch probes: start values, and a store no one reads (so the
// chains are not optimised away).
__device__ __forceinline__ void chains(float (&a)[8]) {
    #pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = threadIdx.x * 1e-3f + i;
}
__device__ __forceinline__ void keep(const float (&a)[8], float s, float* sink) {
    #pragma unroll
    for (int i = 0; i < 8; ++i) s += a[i];
    if (s == 1.2345f) sink[0] = s;
}

// Instruction fetch: N independent-chain FMAs of straight-line code (16 bytes each), run four
// times in one launch; out[p] = cycles of pass p (pass 0 fetches the code, the rest may hit).
template <int N>
__device__ void icache_body(u64* out, float* sink) {
    float a[8];
    chains(a);
    for (int p = 0; p < 4; ++p) {
        const long long c0 = clock64();
        #pragma unroll
        for (int i = 0; i < N; ++i) a[i & 7] = fmaf(a[i & 7], 1.0001f, 0.5f);
        const long long c1 = clock64();
        if (threadIdx.x == 0 && blockIdx.x == 0) out[p] = c1 - c0;
    }
    keep(a, 0.f, sink);
}
extern "C" __global__ void probe_icache_16k(u64* out, float* sink) { icache_body<1024>(out, sink); }
extern "C" __global__ void probe_icache_64k(u64* out, float* sink) { icache_body<4096>(out, sink); }
extern "C" __global__ void probe_icache_128k(u64* out, float* sink) { icache_body<8192>(out, sink); }
extern "C" __global__ void probe_icache_256k(u64* out, float* sink) { icache_body<16384>(out, sink); }

// A warp that waits, then runs code it last ran ~1.2 R KB of code ago (the monokernel's phases: a
// wait, then a stretch of code not run since the previous layer). R islands of 64 FMAs (1 KB),
// each after a ~1 us spin; four passes; out[p] = mean cycles of an island in pass p (block 0,
// warp 0). 384 threads and ~200 KB of shared memory per block, like the decode kernel.
template <int K>  // islands 32K .. 32K + 31, then (recursively) the 32 before them: straight-line code
__device__ __forceinline__ void islands32(float (&a)[8], long long& sum) {
    #pragma unroll
    for (int r = 0; r < 32; ++r) {
        const long long s0 = clock64();
        while (clock64() - s0 < 2000) {}
        const long long c0 = clock64();
        #pragma unroll
        for (int i = 0; i < 64; ++i) a[i & 7] = fmaf(a[i & 7], 1.0001f + (K * 32 + r) * 1e-7f, 0.5f);
        sum += clock64() - c0;
    }
    if constexpr (K > 0) islands32<K - 1>(a, sum);
}
template <int R>
__device__ void icache_islands(u64* out, float* sink) {
    extern __shared__ float pad[];
    float a[8];
    chains(a);
    for (int p = 0; p < 4; ++p) {
        long long sum = 0;
        islands32<R / 32 - 1>(a, sum);
        if (threadIdx.x == 0 && blockIdx.x == 0) out[p] = sum / R;
    }
    keep(a, pad[threadIdx.x], sink);
}
extern "C" __global__ void probe_islands_32(u64* out, float* sink) { icache_islands<32>(out, sink); }
extern "C" __global__ void probe_islands_64(u64* out, float* sink) { icache_islands<64>(out, sink); }
extern "C" __global__ void probe_islands_96(u64* out, float* sink) { icache_islands<96>(out, sink); }
extern "C" __global__ void probe_islands_128(u64* out, float* sink) { icache_islands<128>(out, sink); }
extern "C" __global__ void probe_islands_192(u64* out, float* sink) { icache_islands<192>(out, sink); }

// An all-to-all hop chain: every block stores its slice of an n-word tagged vector (tag r, as
// kog_st_tagged), then every thread polls its pairs of the whole vector until they carry r, all
// of a round's loads in flight (as gather_tagged); reps hops in a row. Two buffers in turn: a
// block can only store hop r + 2 after every block stored hop r + 1, so after every block read
// hop r. copies > 1: every block stores its slice into that many copies of the vector, and block
// b polls copy b % copies (fewer pollers per L2 line). sleep_ns > 0: a poll round that misses
// sleeps that long. SUMMED: the same hop through summed words, as the decode kernel's residual
// stream (decode_sync.cuh): the blocks form k groups (k = copies), each group's blocks split the n
// words among them and add (red.add.u64, count + 1 in the top byte) to them, and the polls wait
// until a word's count reads the hop's k adds: what a hop costs when its words are atomic adds done
// in L2 rather than stores (k = 1), and when each takes k adds from k blocks (down's slices: 3-7).
// COLLECT, what runs between the poll loop and the barrier that ends the hop: 0 nothing; 1 each warp
// sums its values (five shuffles) and lane 0 stores the sum to shared memory, as an RMSNorm's sum of
// squares would (the decode kernel lost ~10% with that shape: PERF.md session 29); 2 the shuffles
// only; 3 the shared store only (every lane its own value, as stage_copy stores its words); 4 a
// __syncwarp only; 5 nothing, but the barrier is __syncthreads_and (as the decode kernel's hops end,
// with their watchdog's verdict). WATCHDOG: every 64th poll round calls a function that is not inlined, as the
// decode kernel's polls do (its watchdog), which puts a call inside the loop's divergent code.
// CONVERGED: the warp polls until none of its lanes misses a word (a vote a round), so that it leaves
// the loop as one instead of lane by lane. NREC > 0: the vector is stored in NREC copies and every
// block polls all of them, with one more 16-byte word a copy (the same for all 32 lanes), as O's gather
// reads the attention units' records and their max and sum (stage_attn_merged). MS, where that word
// lies and who loads it: 0 the warp's first pair (lane 0 loads it twice); 1 the same, loaded by lane 0
// only and shuffled; 2 each lane's own pair again (a second load of the same words); 3 the next warp's
// first pair (words this warp does not load otherwise); 4 as 3, but loaded only once the lane's values
// are in (a dependent round trip, fewer loads a round); 5 the vector's first pair for every warp (one
// line loaded by all the block's warps in one round: does the cost grow with the loads of a line?). The
// hop grows with the loads a poll round issues (PERF.md session 33).
// out[0] = ns per hop (block 0); out[1] = hops that gave up (a bound on the rounds keeps a bug
// from hanging the device); out[2] stays 0 (the watchdog's flag).
__device__ __noinline__ bool probe_watchdog(const u64* out) { return *(volatile const u64*)(out + 2) != 0; }
__device__ __forceinline__ void ld_poll2(const u64* p, u64& x, u64& y) {  // two tagged words, as the decode kernel polls them
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
}
template <int NV, bool SUMMED, int COLLECT = 0, bool WATCHDOG = false, bool CONVERGED = false, int NREC = 0, int MS = 0>
__device__ void hop_chain(u64* vec, int n, int copies, int reps, int sleep_ns, u64* out, float* sink) {
    __shared__ float warp_sums[32];
    constexpr int NC = NREC > 0 ? NREC : 1;  // copies a pair is read from
    const int nb = gridDim.x, b = blockIdx.x, t = threadIdx.x, nt = blockDim.x;
    const int k = SUMMED ? copies : 1, ncopy = SUMMED ? 1 : NREC > 0 ? NREC : copies;
    const int g = b % k, j = b / k, ng = (nb - g + k - 1) / k;  // group g's blocks: g, g + k, ...
    const int r0 = (int)((long long)j * n / ng), r1 = (int)((long long)(j + 1) * n / ng);
    float acc = 0.f;
    unsigned gave_up = 0;
    __syncthreads();
    const u64 t0 = now();
    for (unsigned r = 1; r <= (unsigned)reps; ++r) {
        u64* buf = vec + (size_t)(r & 1) * ncopy * n;
        for (int i = r0 + t; i < r1; i += nt)
            for (int c = 0; c < ncopy; ++c)
                if (SUMMED) asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(buf + i), "l"((1ull << 56) + (u64)(i + g)) : "memory");
                else asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(buf + c * n + i), "l"(((u64)r << 32) | __float_as_uint((float)i)) : "memory");
        const u64* v = buf + (b % ncopy) * n;
        const unsigned want = SUMMED ? ((r + 1) / 2 * (unsigned)k) & 255u : r;  // a buffer's (r + 1) / 2-th hop
        const auto tag = [&](u64 w) { return SUMMED ? (unsigned)((w + (1ull << 55)) >> 56) : (unsigned)(w >> 32); };
        unsigned pending = 0;
        #pragma unroll
        for (int q = 0; q < NV; ++q)
            if (t + q * nt < n / 2) pending |= 1u << q;
        for (int it = 0; (CONVERGED ? __any_sync(0xffffffffu, pending) : pending) && it < (1 << 20); ++it) {
            ulonglong2 w[NV][NC], ms[NV][NC];
            #pragma unroll
            for (int q = 0; q < NV; ++q)
                if ((pending >> q) & 1u)
                    #pragma unroll
                    for (int c = 0; c < NC; ++c) {
                        const u64* vc = NREC > 0 ? buf + c * n : v;
                        ld_poll2(vc + 2 * (t + q * nt), w[q][c].x, w[q][c].y);
                        if (NREC > 0 && MS != 4 && (MS != 1 || (t & 31) == 0))
                            ld_poll2(vc + 2 * (MS == 2 ? t + q * nt : MS == 3 ? (((t + q * nt) & ~31) + 32) % (n / 2)
                                               : MS == 5 ? 0 : (t + q * nt) & ~31),
                                 ms[q][c].x, ms[q][c].y);
                    }
            if (MS == 4)  // the max and sum words only once the values are in: a dependent round trip
                #pragma unroll
                for (int q = 0; q < NV; ++q) {
                    bool in = ((pending >> q) & 1u) != 0;
                    #pragma unroll
                    for (int c = 0; c < NC; ++c) in &= tag(w[q][c].x) == want && tag(w[q][c].y) == want;
                    #pragma unroll
                    for (int c = 0; c < NC; ++c)
                        if (in) ld_poll2(buf + c * n + 2 * ((((t + q * nt) & ~31) + 32) % (n / 2)), ms[q][c].x, ms[q][c].y);
                        else ms[q][c].x = ms[q][c].y = 0;
                }
            if (MS == 1)
                #pragma unroll
                for (int q = 0; q < NV; ++q)
                    #pragma unroll
                    for (int c = 0; c < NC; ++c)
                        ms[q][c].x = __shfl_sync(0xffffffffu, ms[q][c].x, 0), ms[q][c].y = __shfl_sync(0xffffffffu, ms[q][c].y, 0);
            const auto ready = [&](int q) {
                bool all = true;
                #pragma unroll
                for (int c = 0; c < NC; ++c) {
                    all &= tag(w[q][c].x) == want && tag(w[q][c].y) == want;
                    if (NREC > 0) all &= tag(ms[q][c].x) == want && tag(ms[q][c].y) == want;
                }
                return all;
            };
            unsigned stale = 0;
            #pragma unroll
            for (int q = 0; q < NV; ++q)
                if ((pending >> q) & 1u) stale |= !ready(q);
            #pragma unroll
            for (int q = 0; q < NV; ++q)
                if (((pending >> q) & 1u) && (stale == 0 || ready(q))) {
                    #pragma unroll
                    for (int c = 0; c < NC; ++c) {
                        acc += __uint_as_float((unsigned)w[q][c].x) + __uint_as_float((unsigned)w[q][c].y);
                        if (NREC > 0) acc += __uint_as_float((unsigned)ms[q][c].x) * __uint_as_float((unsigned)ms[q][c].y);  // (all 16 bytes used: one load)
                    }
                    pending &= ~(1u << q);
                }
            if (pending && sleep_ns) __nanosleep(sleep_ns);
            if (WATCHDOG && pending && (it & 63) == 63 && probe_watchdog(out)) break;
        }
        gave_up += pending != 0;
        float w = acc;
        if (COLLECT == 1 || COLLECT == 2) {
            #pragma unroll
            for (int m = 16; m > 0; m >>= 1) w += __shfl_xor_sync(0xffffffffu, w, m);
        }
        if (COLLECT == 1 && (t & 31) == 0) warp_sums[t >> 5] = w;
        if (COLLECT == 2) acc = w;
        if (COLLECT == 3) warp_sums[t & 31] = w;
        if (COLLECT == 4) __syncwarp();
        if (COLLECT == 5) gave_up += !__syncthreads_and(pending == 0);
        else __syncthreads();
        if (COLLECT == 1 || COLLECT == 3) acc += warp_sums[(t >> 5) ^ 1];  // (read back only so that the sum is kept: timing, not values)
    }
    const u64 t1 = now();
    if (acc == 1.2345f) sink[0] = acc;
    if (gave_up) atomicAdd(out + 1, (u64)gave_up);
    if (t == 0 && b == 0) out[0] = (t1 - t0) / reps;
}
#define HOP_VARIANT(NAME, ...) \
    extern "C" __global__ void NAME(u64* vec, int n, int copies, int reps, int sleep_ns, u64* out, float* sink) { \
        hop_chain<__VA_ARGS__>(vec, n, copies, reps, sleep_ns, out, sink); }
HOP_VARIANT(probe_hop_1, 1, false)
HOP_VARIANT(probe_hop_2, 2, false)
HOP_VARIANT(probe_hop_3, 3, false)
HOP_VARIANT(probe_hop_12, 12, false)
HOP_VARIANT(probe_hop_1_collect, 1, false, 1)
HOP_VARIANT(probe_hop_1_shuffles, 1, false, 2)
HOP_VARIANT(probe_hop_1_store, 1, false, 3)
HOP_VARIANT(probe_hop_1_syncwarp, 1, false, 4)
HOP_VARIANT(probe_hop_1_barrier_and, 1, false, 5)
HOP_VARIANT(probe_hop_1_watchdog, 1, false, 0, true)
HOP_VARIANT(probe_hop_1_watchdog_collect, 1, false, 1, true)
HOP_VARIANT(probe_hop_1_converged, 1, false, 0, false, true)
HOP_VARIANT(probe_hop_1_converged_collect, 1, false, 1, false, true)
HOP_VARIANT(probe_hop_1_converged_store, 1, false, 3, false, true)
HOP_VARIANT(probe_hop_1_converged_barrier_and, 1, false, 5, false, true)
HOP_VARIANT(probe_hop_2_converged_barrier_and, 2, false, 5, false, true)
HOP_VARIANT(probe_hop_3_converged_barrier_and, 3, false, 5, false, true)
HOP_VARIANT(probe_hop_1_watchdog_converged_collect, 1, false, 1, true, true)
HOP_VARIANT(probe_rec_1, 1, false, 5, false, true, 1)
HOP_VARIANT(probe_rec_2, 1, false, 5, false, true, 2)
HOP_VARIANT(probe_rec_3, 1, false, 5, false, true, 3)
HOP_VARIANT(probe_rec_1_lane0, 1, false, 5, false, true, 1, 1)
HOP_VARIANT(probe_rec_2_lane0, 1, false, 5, false, true, 2, 1)
HOP_VARIANT(probe_rec_1_own, 1, false, 5, false, true, 1, 2)
HOP_VARIANT(probe_rec_1_apart, 1, false, 5, false, true, 1, 3)
HOP_VARIANT(probe_rec_2_apart, 1, false, 5, false, true, 2, 3)
HOP_VARIANT(probe_rec_3_apart, 1, false, 5, false, true, 3, 3)
HOP_VARIANT(probe_rec_1_late, 1, false, 5, false, true, 1, 4)
HOP_VARIANT(probe_rec_2_late, 1, false, 5, false, true, 2, 4)
HOP_VARIANT(probe_rec_3_late, 1, false, 5, false, true, 3, 4)
HOP_VARIANT(probe_rec_1_one_line, 1, false, 5, false, true, 1, 5)
HOP_VARIANT(probe_sum_1, 1, true)
HOP_VARIANT(probe_sum_2, 2, true)
HOP_VARIANT(probe_sum_3, 3, true)

// L2 prefetch of 128 KB per block (mode 1: one thread, 16 KB bulk prefetches; mode 2: every
// thread, one prefetch.global.L2 per 128-byte line; mode 0: none), 10 us, then all of it read.
// out[0]: ns to issue the prefetches; out[1]: ns to read the 128 KB (block 0).
extern "C" __global__ void probe_prefetch(const uint4* __restrict__ big, u64* out, unsigned* sink, int mode, long long first) {
    constexpr int REG = 8192;  // uint4 per block: 128 KB
    const uint4* region = big + (size_t)(first + blockIdx.x) * REG;
    const int t = threadIdx.x;
    __syncthreads();
    const u64 t0 = now();
    if (mode == 1 && t == 0) {
        for (int i = 0; i < REG; i += 1024)  // 16 KB pieces
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(region + i), "r"(16384) : "memory");
    } else if (mode == 2) {
        for (int l = t; l < REG / 8; l += blockDim.x) asm volatile("prefetch.global.L2 [%0];" ::"l"(region + l * 8) : "memory");
    }
    const u64 t1 = now();
    __syncthreads();
    while (now() < t1 + 10000) {}
    __syncthreads();
    const u64 t2 = now();
    unsigned acc = 0;
    uint4 v[REG / 512];
    #pragma unroll
    for (int i = 0; i < REG / 512; ++i) v[i] = __ldcg(region + t + i * 512);
    #pragma unroll
    for (int i = 0; i < REG / 512; ++i) acc += v[i].x ^ v[i].w;
    __syncthreads();
    const u64 t3 = now();
    if (acc == 0x12345678u) sink[0] = acc;
    if (t == 0 && blockIdx.x == 0) { out[0] = t1 - t0; out[1] = t3 - t2; }
}
"""


def random_cycle(n: int, dtype, seed: int) -> np.ndarray:
    """next[i] for one cycle through all n indices in random order (a dependent pointer chase)."""
    order = np.random.default_rng(seed).permutation(n)
    nxt = np.empty(n, dtype)
    nxt[order] = np.roll(order, -1)
    return nxt


def main() -> None:
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    nsm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    out = cp.zeros(8, dtype=cp.uint64)
    big = cp.zeros((nsm * 512 * 64 * 17 + 4096) * 4, dtype=cp.uint32)
    sink = cp.zeros(1, dtype=cp.uint32)
    for _ in range(2):
        mod.get_function("probe_barrier")((nsm,), (512,), (big, out, sink))
    cp.cuda.Device().synchronize()
    o = out.get()
    print(f"barrier alone {o[0]} ns; with 4x16B global loads in flight {o[1]} ns; with cp.async in flight {o[2]} ns")
    ring = cp.asarray(random_cycle(1 << 16, np.uint32, seed=0))  # 256 KB: L2-resident
    for _ in range(2):
        mod.get_function("probe_l2")((1,), (1,), (ring, np.int32(ring.size), out))
    cp.cuda.Device().synchronize()
    print(f"L2-hit dependent load {out.get()[0]} ns")
    flags = cp.zeros(4096, dtype=cp.uint32)
    for far in (32, 2048):
        flags.fill(0)
        mod.get_function("probe_pingpong")((2,), (32,), (flags, out, np.int32(far)))
        cp.cuda.Device().synchronize()
        print(f"flag hand-over one way (flags {far * 4} B apart) {out.get()[0]} ns")
    scratch = cp.zeros(nsm * 4096, dtype=cp.float32)
    mod.get_function("probe_fence")((nsm,), (512,), (scratch, out))
    cp.cuda.Device().synchronize()
    o = out.get()
    print(f"fence.acq_rel.gpu alone {o[0]} ns; after 8 stores per thread {o[1]} ns")
    local_cycle = cp.asarray(random_cycle(256, np.int32, seed=1))
    for _ in range(2):
        mod.get_function("probe_local_acquire")((1,), (1,), (local_cycle, flags, out))
    cp.cuda.Device().synchronize()
    o = out.get()
    print(f"dependent local-memory load {o[0]} ns; after fence.acq_rel.gpu {o[1]} ns; after ld.acquire.gpu {o[2]} ns;"
          f" the fence alone {o[3]} ns")
    for smem_kb in (0, 100, 181, 220):  # 181: SmolLM2's decode block
        times = []
        for words in (8, 32, 64, 128):
            fn = mod.get_function(f"probe_local_{words}")
            fn.max_dynamic_shared_size_bytes = smem_kb * 1024
            fn((1,), (384,), (cp.asarray(random_cycle(words, np.int32, seed=2)), out), shared_mem=smem_kb * 1024)
            cp.cuda.Device().synchronize()
            times.append(f"{words * 4 * 384 // 1024} KB {out.get()[0]} ns")
        print(f"local load, 384 threads, {smem_kb} KB shared memory a block, by the block's local footprint: {'; '.join(times)}")
    mod.get_function("probe_clock")((nsm,), (32,), (out,))
    cp.cuda.Device().synchronize()
    o = out.get()
    print(f"SM clock while spinning: {o[0] / o[1] * 1e3:.0f} MHz")
    fsink = cp.zeros(1, dtype=cp.float32)
    for size, fmas in (("16k", 1024), ("64k", 4096), ("128k", 8192), ("256k", 16384)):
        mod.get_function(f"probe_icache_{size}")((nsm,), (128,), (out, fsink))
        cp.cuda.Device().synchronize()
        o = out.get()
        print(f"{size}B of straight-line code ({fmas} FMAs): cycles per pass {' '.join(str(int(v)) for v in o[:4])}")
    for n in (32, 64, 96, 128, 192):  # an island with its wait is ~1.2 KB of machine code
        fn = mod.get_function(f"probe_islands_{n}")
        fn.max_dynamic_shared_size_bytes = 200 * 1024
        fn((nsm,), (384,), (out, fsink), shared_mem=200 * 1024)
        cp.cuda.Device().synchronize()
        o = out.get()
        print(f"{n} islands of 64 FMAs (~{1.22 * n:.0f} KB of code), each after a 1 us wait: cycles per island per pass "
              f"{' '.join(str(int(v)) for v in o[:4])}")
    hop_threads = 384  # the decode kernel's block on the big shapes; n / 2 pairs over them: NV pairs per thread
    vec = cp.zeros(2 * 8 * 8960, dtype=cp.uint64)
    for n, nv in ((576, 1), (1536, 2), (2048, 3), (8960, 12)):
        for grid, copies, sleep_ns in ((nsm, 1, 0), (nsm // 4, 1, 0), (nsm, 1, 100), (nsm, 2, 0), (nsm, 4, 0), (nsm, 8, 0)):
            vec.fill(0)
            out.fill(0)
            mod.get_function(f"probe_hop_{nv}")((grid,), (hop_threads,), (vec, np.int32(n), np.int32(copies), np.int32(2000),
                                                                          np.int32(sleep_ns), out, fsink))
            cp.cuda.Device().synchronize()
            o = out.get()
            print(f"hop of a {n}-word tagged vector, {grid} blocks, {copies} cop{'y' if copies == 1 else 'ies'}, polls "
                  f"{'back to back' if not sleep_ns else f'sleeping {sleep_ns} ns'}: {o[0]} ns" + (f" ({o[1]} gave up)" if o[1] else ""))
    def hop_chain_ns(kernel: str, threads: int, n: int = 576) -> str:  # one hop chain of n words (SmolLM2's 576) on every SM
        vec.fill(0)
        out.fill(0)
        mod.get_function(kernel)((nsm,), (threads,), (vec, np.int32(n), np.int32(1), np.int32(2000), np.int32(0), out, fsink))
        cp.cuda.Device().synchronize()
        o = out.get()
        return f"{o[0]} ns" + (f" ({o[1]} gave up)" if o[1] else "")

    for threads in (384, 512):  # SmolLM2's hop at both block sizes: the barrier right after the polls, or after a wave sum
        for kernel, label in (("probe_hop_1", "the barrier right after the polls"),
                              ("probe_hop_1_collect", "a wave sum and a shared store before the barrier"),
                              ("probe_hop_1_shuffles", "a wave sum (no store) before the barrier"),
                              ("probe_hop_1_store", "a shared store (no wave sum) before the barrier"),
                              ("probe_hop_1_syncwarp", "a __syncwarp before the barrier"),
                              ("probe_hop_1_barrier_and", "the barrier right after the polls, as __syncthreads_and"),
                              ("probe_hop_1_watchdog", "a call every 64th poll round, the barrier right after the polls"),
                              ("probe_hop_1_watchdog_collect", "a call every 64th poll round, a wave sum and a store before the barrier"),
                              ("probe_hop_1_converged", "warps poll until all lanes are in, the barrier right after"),
                              ("probe_hop_1_converged_collect", "warps poll until all lanes are in, a wave sum and a store before the barrier"),
                              ("probe_hop_1_converged_store", "warps poll until all lanes are in, a shared store before the barrier"),
                              ("probe_hop_1_converged_barrier_and", "warps poll until all lanes are in, __syncthreads_and right after"),
                              ("probe_hop_1_watchdog_converged_collect", "warps poll until all lanes are in, a call every 64th round, a wave sum and a store")):
            print(f"hop of a 576-word tagged vector, {nsm} blocks of {threads} threads, {label}: {hop_chain_ns(kernel, threads)}")
    for kernel, label in (("probe_hop_1_converged_barrier_and", "one copy (stage_copy)"),
                          ("probe_rec_1", "one copy and its max and sum"),
                          ("probe_rec_2", "2 copies and their max and sum (stage_attn_merged, 2 units)"),
                          ("probe_rec_3", "3 copies and their max and sum (3 units)"),
                          ("probe_rec_1_lane0", "one copy, its max and sum loaded by lane 0 and shuffled"),
                          ("probe_rec_2_lane0", "2 copies, their max and sum loaded by lane 0 and shuffled"),
                          ("probe_rec_1_own", "one copy, and each lane's own pair loaded twice"),
                          ("probe_rec_1_apart", "one copy and a max and sum word the warp does not load otherwise"),
                          ("probe_rec_2_apart", "2 copies and max and sum words the warp does not load otherwise"),
                          ("probe_rec_3_apart", "3 copies and max and sum words the warp does not load otherwise"),
                          ("probe_rec_1_late", "one copy, the max and sum words apart loaded once the values are in"),
                          ("probe_rec_2_late", "2 copies, the max and sum words apart loaded once the values are in"),
                          ("probe_rec_3_late", "3 copies, the max and sum words apart loaded once the values are in"),
                          ("probe_rec_1_one_line", "one copy and a max and sum word that every warp of the block loads")):
        print(f"hop of a 576-word tagged vector, {nsm} blocks, every block polls {label}: {hop_chain_ns(kernel, hop_threads)}")
    for n, nv in ((1536, 2), (2048, 3)):  # the big shapes' hops, as the decode kernel's waits poll since v37
        for kernel, label in ((f"probe_hop_{nv}", "polls lane by lane, the barrier right after"),
                              (f"probe_hop_{nv}_converged_barrier_and", "warps poll until all lanes are in, __syncthreads_and right after")):
            print(f"hop of a {n}-word tagged vector, {nsm} blocks, {nv} pairs a thread, {label}: {hop_chain_ns(kernel, hop_threads, n)}")
    for n, nv in ((576, 1), (1536, 2), (2048, 3)):
        for k in (1, 3, 7):
            vec.fill(0)
            out.fill(0)
            mod.get_function(f"probe_sum_{nv}")((nsm,), (hop_threads,), (vec, np.int32(n), np.int32(k), np.int32(2000),
                                                                       np.int32(0), out, fsink))
            cp.cuda.Device().synchronize()
            o = out.get()
            print(f"hop of a {n}-word summed vector, {nsm} blocks, {k} add{'' if k == 1 else 's'} a word: {o[0]} ns"
                  + (f" ({o[1]} gave up)" if o[1] else ""))
    regions = big.size * 4 // (128 * 1024)
    for rep, (mode, label) in enumerate([(0, "no prefetch"), (1, "bulk prefetch (one thread)"),
                                         (2, "per-line prefetch (every thread)")] * 2):
        first = (rep * nsm) % (regions - nsm)  # fresh regions each launch: the buffer is many times L2
        mod.get_function("probe_prefetch")((nsm,), (512,), (big, out, sink, np.int32(mode), np.int64(first)))
        cp.cuda.Device().synchronize()
        o = out.get()
        if rep >= 3:
            print(f"128 KB per block after {label}: issue {o[0]} ns, read {o[1]} ns")


if __name__ == "__main__":
    main()
