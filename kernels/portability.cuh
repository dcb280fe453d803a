// kog portability layer: everything vendor-specific the kernels use lives here, so a HIP
// build later needs this header's other half, not a second copy of the kernels.
//
// What the kernels rely on:
//   - wave (warp) size KOG_WAVE and full-wave masks; shuffles, votes and sums over a wave
//   - four-way int8 dot products (the LM head's int8 screen)
//   - a warp-wide bf16 matrix product with fp32 sums, 16 x 16 times 16 x 8 (the drafts' build's products of
//     several positions; a HIP build maps it to an MFMA of its own fragment layout)
//   - memory-model primitives: relaxed/acquire loads, release stores, gpu- and system-scope
//     fences (the flags between blocks and the token stream to host-mapped memory)
//   - 8-byte atomic adds done in L2 without a return value (the residual stream's summed words)
//   - a nanosecond clock for watchdogs and token timestamps
//   - 16-byte asynchronous copies global -> shared (the weight ring, attention tiles), the
//     weights' marked evict-first in L2 (read once per token: they must not push out the KV
//     cache and the vectors blocks hand each other)
//   - L2-only ("cache global") loads for data other blocks wrote during this launch: L1 is
//     not coherent across multiprocessors, so a plain load could hit a stale line
// No standard headers: NVRTC compiles this without a host toolchain.
#pragma once

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#error "kog: the HIP half of portability.cuh is not written yet (wave 64, __hip_atomic_*, s_memrealtime)"
#else

#define KOG_WAVE 32
#define KOG_FULL_MASK 0xffffffffu
#define KOG_INF __int_as_float(0x7f800000)

typedef unsigned long long kog_u64;

// ---- waves -------------------------------------------------------------------------------
__device__ __forceinline__ float kog_wave_sum(float v) {
#pragma unroll
    for (int m = KOG_WAVE / 2; m > 0; m >>= 1) v += __shfl_xor_sync(KOG_FULL_MASK, v, m);
    return v;
}
// The maximum in one instruction (redux.sync, sm_80 on): integer keys that order like the floats
// (negative floats' magnitude bits flipped; the map is its own inverse). Exact, like fmaxf.
__device__ __forceinline__ float kog_wave_max(float v) {
    const int i = __float_as_int(v);
    int k = i >= 0 ? i : i ^ 0x7fffffff;
    asm volatile("redux.sync.max.s32 %0, %0, %1;" : "+r"(k) : "r"(KOG_FULL_MASK));
    return __int_as_float(k >= 0 ? k : k ^ 0x7fffffff);
}
__device__ __forceinline__ int kog_wave_sum_i32(int v) { return __reduce_add_sync(KOG_FULL_MASK, v); }  // exact
// c + the four signed byte products of a and b (dp4a)
__device__ __forceinline__ int kog_dot4_i8(unsigned a, unsigned b, int c) { return __dp4a((int)a, (int)b, c); }
template <typename T>
__device__ __forceinline__ T kog_shfl(T v, int src) { return __shfl_sync(KOG_FULL_MASK, v, src); }
template <typename T>
__device__ __forceinline__ T kog_shfl_xor(T v, int m) { return __shfl_xor_sync(KOG_FULL_MASK, v, m); }
template <typename T>
__device__ __forceinline__ T kog_shfl_up(T v, int d) { return __shfl_up_sync(KOG_FULL_MASK, v, d); }
__device__ __forceinline__ bool kog_wave_all(bool p) { return __all_sync(KOG_FULL_MASK, p); }
__device__ __forceinline__ bool kog_wave_any(bool p) { return __any_sync(KOG_FULL_MASK, p); }
__device__ __forceinline__ unsigned kog_wave_ballot(bool p) { return __ballot_sync(KOG_FULL_MASK, p); }  // bit per lane
__device__ __forceinline__ void kog_wave_sync() { __syncwarp(); }

// ---- memory model ------------------------------------------------------------------------
__device__ __forceinline__ int kog_ld_relaxed_s32(const int* p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Four flag words in one round trip (polling many producers at once).
__device__ __forceinline__ uint4 kog_ld_relaxed_u4(const unsigned* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
// Self-validating 8-byte words: (tag << 32) | value bits, written and read whole (an aligned
// 8-byte access is single-copy atomic), so a consumer polls the data itself: no flag, no fence.
__device__ __forceinline__ void kog_st_tagged(kog_u64* p, float v, unsigned tag) {
    const kog_u64 w = ((kog_u64)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ kog_u64 kog_ld_tagged(const kog_u64* p) {
    kog_u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ ulonglong2 kog_ld_tagged2(const kog_u64* p) {  // two adjacent words, 16-byte aligned
    ulonglong2 v;
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
    return v;
}
// An add to an 8-byte word, done in L2 (fire and forget: nothing comes back to the thread).
__device__ __forceinline__ void kog_red_add_u64(kog_u64* p, kog_u64 v) {
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned kog_tag_of(kog_u64 w) { return (unsigned)(w >> 32); }
__device__ __forceinline__ float kog_value_of(kog_u64 w) { return __uint_as_float((unsigned)w); }
__device__ __forceinline__ void kog_st_release_u32(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// host-mapped memory (pinned, reached over the bus): system scope
__device__ __forceinline__ int kog_ld_sys_s32(const int* p) {
    int v;
    asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void kog_st_relaxed_sys_s32(int* p, int v) {
    asm volatile("st.relaxed.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// acquire/release ordering at gpu scope: enough for flag/message passing (no total order needed)
__device__ __forceinline__ void kog_fence_acqrel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

__device__ __forceinline__ unsigned kog_sm_id() {  // the multiprocessor a block runs on (its L2 partition, tracing)
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
__device__ __forceinline__ void kog_sleep_ns(unsigned ns) { __nanosleep(ns); }  // a poll's back-off

__device__ __forceinline__ long long kog_cycles() { return clock64(); }  // the multiprocessor's clock (tracing)
__device__ __forceinline__ kog_u64 kog_clock_ns() {
    kog_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---- loads -------------------------------------------------------------------------------
// Data written by other blocks of this launch: bypass L1 (ld.global.cg). These are ordinary
// loads to the compiler, so several can be in flight at once; they cannot move above an
// acquire fence or a barrier, which are compiler memory barriers.
__device__ __forceinline__ float kog_ldcg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ unsigned kog_ldcg_u32(const unsigned* p) { return __ldcg(p); }
__device__ __forceinline__ int kog_ldcg_s32(const int* p) { return __ldcg(p); }
__device__ __forceinline__ kog_u64 kog_ldcg_u64(const kog_u64* p) { return __ldcg(p); }
__device__ __forceinline__ uint4 kog_ldcg_u4(const uint4* p) { return __ldcg(p); }

// 16-byte asynchronous global -> shared copies (L2 only), completed by kog_cp_async_wait.
__device__ __forceinline__ void kog_cp_async16(void* smem_dst, const void* gmem_src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gmem_src) : "memory");
}
// The same, marked evict-first in L2 (policy from kog_l2_evict_first).
__device__ __forceinline__ void kog_cp_async16_evict_first(void* smem_dst, const void* gmem_src, kog_u64 policy) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(d), "l"(gmem_src), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ kog_u64 kog_l2_evict_first() {
    kog_u64 p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ void kog_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void kog_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
template <int N>  // until at most N of this thread's newest commit groups are still in flight
__device__ __forceinline__ void kog_cp_async_wait_pending() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
// The same for an n known at run time (past 7: all but the newest 7, which waits a little longer).
__device__ __forceinline__ void kog_cp_async_wait_pending_dyn(unsigned n) {
    switch (n) {
        case 0: kog_cp_async_wait_pending<0>(); break;
        case 1: kog_cp_async_wait_pending<1>(); break;
        case 2: kog_cp_async_wait_pending<2>(); break;
        case 3: kog_cp_async_wait_pending<3>(); break;
        case 4: kog_cp_async_wait_pending<4>(); break;
        case 5: kog_cp_async_wait_pending<5>(); break;
        case 6: kog_cp_async_wait_pending<6>(); break;
        default: kog_cp_async_wait_pending<7>(); break;
    }
}
__device__ __forceinline__ void kog_cp_async_wait() {
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}

// ---- numbers -----------------------------------------------------------------------------
__device__ __forceinline__ float kog_bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float kog_bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float kog_bf16(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
// lo, hi rounded to bf16 (to nearest even), packed: lo in the low half
__device__ __forceinline__ unsigned kog_bf16x2_rn(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// ---- warp matrix products ----------------------------------------------------------------
// d += A B over the wave: A 16 x 16 (rows m, k), B 16 x 8 (k, columns n), bf16 pairs with the lower k in the low
// half; lane l = 4 g + t holds a = {A[g][2t, 2t+1], A[g+8][2t, 2t+1], A[g][2t+8, 2t+9], A[g+8][2t+8, 2t+9]},
// b = {B[2t, 2t+1][g], B[2t+8, 2t+9][g]} and d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}.
__device__ __forceinline__ void kog_mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
