// kog monokernel: the whole batch-1 decode loop in ONE persistent cooperative launch.
//
// One block per multiprocessor runs, for every requested token: pick the token from the
// logits (greedy argmax, or the sampler), publish it to host-mapped memory, stop or feed it
// through every layer (RMSNorm -> packed QKV (+bias, q/k norm, RoPE, KV append) -> GQA
// attention over the fp32 cache -> O + residual -> RMSNorm -> packed gate/up + SiLU ->
// down + residual), final norm, LM head, and loop. The host launches it once per generation.
//
// Synchronisation: every block owns one epoch flag. A block finishes a phase, then stores
// the phase number into its flag (release). A consumer waits until the flags of the blocks
// whose output it reads have reached that phase (acquire) -- all of them for a matrix-vector
// product (it reads the whole input vector), only the few producers of its head's q/k/v rows
// for attention. Flags only grow during a launch, so nothing is ever reset mid-run. Before
// waiting, each warp issues the loads of its first weight tiles of the next phase: weights do
// not depend on activations, so HBM keeps streaming across the synchronisation bubble.
//
// Matrix-vector products: each block owns a contiguous range of output rows (the tensor-
// parallel split of a later issue is the same cut one level up); within a block, 16 warps
// take (row, K-segment) granules, each lane streaming U 16-byte weight vectors per granule.
// Partial sums meet in shared memory in a fixed order: results are deterministic.
//
// Every spin-wait is bounded by a watchdog (globaltimer) and gives up when another block
// has already failed; errors land in status[0] and the host turns them into a KogError.
//
// Shapes are compile-time constants (NVRTC compiles one binary per model shape and grid).
#include "portability.cuh"

#ifndef KOG_EXP  // timing experiments only (bench/decode_breakdown.py): 1 no attention math, 2 no weight loads
#define KOG_EXP 0
#endif
#ifndef KOG_H  // defaults: the Llama-3.2-1B shape on a 132-SM H200 (used by the CI compile check)
#define KOG_H 2048
#define KOG_NH 32
#define KOG_NKV 8
#define KOG_D 64
#define KOG_INTER 8192
#define KOG_VOCAB 128256
#define KOG_NL 16
#define KOG_QKV_BIAS 0
#define KOG_QK_NORM 0
#define KOG_EPS 9.999999747378752e-06f
#define KOG_SCALE 0.125f
#define KOG_NBLK 132
#define KOG_TIED 1
#endif

constexpr int H = KOG_H;
constexpr int NH = KOG_NH;
constexpr int NKV = KOG_NKV;
constexpr int D = KOG_D;
constexpr int INTER = KOG_INTER;
constexpr int VOCAB = KOG_VOCAB;
constexpr int NL = KOG_NL;
constexpr int NBLK = KOG_NBLK;
constexpr float EPS = KOG_EPS;
constexpr float SCALE = KOG_SCALE;

constexpr int NTHR = 512;
constexpr int NW = NTHR / KOG_WAVE;
constexpr int G = NH / NKV;  // query heads per kv head
constexpr int QD = NH * D;
constexpr int KVD = NKV * D;
constexpr int NQKV = QD + 2 * KVD;
constexpr int HALF = D / 2;
constexpr int DL = D / KOG_WAVE;  // head dims per lane
constexpr int MAXCH = 32;         // attention chunks per kv head at most
constexpr int AW = 2;             // waves per block that take attention units
constexpr int KT = D + 4;         // padded row of the shared K tile (conflict-free float4 rows)
constexpr int ATT_WAVE = (G + 2) * D + 32 * KT + 32 * D;  // floats of shared memory per attention wave

static_assert(NH % NKV == 0, "query heads must be a multiple of kv heads");
static_assert(D % 64 == 0 && D <= 256, "head_dim must be 64, 128, 192 or 256");
static_assert(H % 8 == 0 && INTER % 8 == 0 && QD % 8 == 0, "dims must be multiples of 8");
constexpr int MAXSTOP = 64;         // stop ids at most
constexpr int FLAGS = 8 * KOG_WAVE;  // flag words the host allocates: a wave polls them all in one round trip
static_assert(NBLK <= FLAGS, "one flag word per block");

// ---- weight layout (bf16 elements); engine/backends/cuda.py mirrors these formulas ----------
constexpr long long OFF_QKV = 0;
constexpr long long OFF_O = OFF_QKV + (long long)NQKV * H;
constexpr long long OFF_GU = OFF_O + (long long)H * QD;  // gate/up rows interleaved: 2j gate, 2j+1 up
constexpr long long OFF_DN = OFF_GU + 2LL * INTER * H;
constexpr long long LSTRIDE = OFF_DN + (long long)H * INTER;
constexpr long long OFF_EMB = (long long)NL * LSTRIDE;
constexpr long long OFF_LMH = KOG_TIED ? OFF_EMB : OFF_EMB + (long long)VOCAB * H;
// small fp32 vectors per layer
constexpr int S_ATTN_NORM = 0;
constexpr int S_MLP_NORM = H;
constexpr int S_BQKV = 2 * H;
constexpr int S_QNORM = S_BQKV + NQKV;
constexpr int S_KNORM = S_QNORM + D;
constexpr int SSTRIDE = S_KNORM + D;
constexpr int S_FINAL = NL * SSTRIDE;

// ---- sampler -----------------------------------------------------------------------------
constexpr int NBINS = 1024;  // probability bins: 16 per octave of p/p_max, 64 octaves
constexpr int CAP = 8192;    // candidates sorted at once
constexpr int VPAD = (VOCAB + 7) / 8 * 8;
constexpr float FIX = 1099511627776.0f;  // 2^40: probabilities as exact-sum fixed point

// ---- status words ------------------------------------------------------------------------
enum { ST_ERROR = 0, ST_OUT = 1, ST_FED = 2, ST_REASON = 3, ST_APPROX = 4, ST_WHERE = 5, ST_BLOCK = 6 };
enum { ERR_TIMEOUT = 1, ERR_BAD_ARGS = 3 };
enum { R_STOP = 1, R_LENGTH = 2, R_CONTEXT = 3, R_CANCEL = 4 };

struct KParams {  // every field 8 bytes; cuda.py builds it as a uint64 array in this order
    const unsigned short* w;
    const float* ws;
    float* kc;
    float* vc;
    const float* rcos;
    const float* rsin;
    float* x;
    float* qkv;
    float* attn;
    float* part;
    float* act;
    float* logits;
    unsigned* keys;
    unsigned short* bins;
    unsigned* hist_cnt;
    kog_u64* hist_mass;
    float* slot_val;
    int* slot_idx;
    unsigned* flags;
    unsigned* attn_cnt;
    int* ctl;
    int* status;
    unsigned* rep_bits;
    const int* stop_ids;
    int* host_tokens;
    const int* host_cancel;
    kog_u64* tok_time;
    long long start_pos, max_tokens, ctx_limit, n_stop, greedy, top_k, seed, timeout_ns, debug_hang,
        use_penalty;
    double temperature, top_p, min_p, penalty;
};

// ---- matrix-vector products --------------------------------------------------------------
__host__ __device__ constexpr int pick_u(int kv) {  // 16-byte vectors per lane per granule: least padding, then widest
    int best = 4, waste = 1 << 30;
    for (int u = 4; u >= 2; --u) {
        int seg = 32 * u, n = (kv + seg - 1) / seg, w = n * seg - kv;
        if (w < waste) { waste = w; best = u; }
    }
    return kv < 64 ? (kv + 31) / 32 : best;
}

template <int K, int NROWS, int RU>
struct Mv {
    static constexpr int KV = K / 8;  // 16-byte vectors per row
    static constexpr int U = pick_u(KV);
    static constexpr int SEGW = 32 * U;
    static constexpr int NSEG = (KV + SEGW - 1) / SEGW;
    static constexpr bool FULL = KV % SEGW == 0;
    static constexpr int NUNITS = NROWS / RU;
    static constexpr int MAXR = (NUNITS + NBLK - 1) / NBLK * RU;
    __device__ static int row0(int b) { return (int)(((long long)b * NUNITS) / NBLK) * RU; }
    __device__ static int owner(int r) {  // the block whose range holds row r
        int u = r / RU;
        return (int)(((long long)(u + 1) * NBLK + NUNITS - 1) / NUNITS) - 1;
    }
};
using MQKV = Mv<H, NQKV, 1>;
using MO = Mv<QD, H, 1>;
using MGU = Mv<H, 2 * INTER, 2>;
using MDN = Mv<INTER, H, 1>;
using MLM = Mv<H, VOCAB, 1>;

template <class M>
struct MvBuf {
    uint4 v[2][M::U];
};

template <class M>
__device__ __forceinline__ void mv_load(MvBuf<M>& B, const uint4* __restrict__ tile, int ngran, int g0, int lane) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int g = g0 + k * NW;
        const int row = g / M::NSEG, seg = g - row * M::NSEG;
#pragma unroll
        for (int i = 0; i < M::U; ++i) {
            const int c = seg * M::SEGW + i * 32 + lane;
            if (KOG_EXP != 2 && g < ngran && (M::FULL || c < M::KV))
                B.v[k][i] = kog_ld_stream_u4(tile + (size_t)row * M::KV + c);
            else
                B.v[k][i] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

__device__ __forceinline__ float dot8(uint4 w, const float* x) {
    const float4 a = *reinterpret_cast<const float4*>(x);
    const float4 b = *reinterpret_cast<const float4*>(x + 4);
    float s = kog_bf16_lo(w.x) * a.x;
    s = fmaf(kog_bf16_hi(w.x), a.y, s);
    s = fmaf(kog_bf16_lo(w.y), a.z, s);
    s = fmaf(kog_bf16_hi(w.y), a.w, s);
    s = fmaf(kog_bf16_lo(w.z), b.x, s);
    s = fmaf(kog_bf16_hi(w.z), b.y, s);
    s = fmaf(kog_bf16_lo(w.w), b.z, s);
    s = fmaf(kog_bf16_hi(w.w), b.w, s);
    return s;
}

template <class M>
__device__ __forceinline__ void mv_compute(const MvBuf<M>& B, const float* xs, float* red, int ngran, int g0, int lane) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int g = g0 + k * NW;
        if (g < ngran) {  // wave-uniform
            const int row = g / M::NSEG, seg = g - row * M::NSEG;
            (void)row;
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < M::U; ++i) {
                const int c = seg * M::SEGW + i * 32 + lane;
                if (M::FULL || c < M::KV) acc += dot8(B.v[k][i], xs + c * 8);
            }
            acc = kog_wave_sum(acc);
            if (lane == 0) red[g] = acc;
        }
    }
}

// Streams the block's tile: B holds the warp's first batch (loaded before the wait).
template <class M>
__device__ __forceinline__ void mv_run(MvBuf<M>& B, const uint4* __restrict__ tile, const float* xs, float* red,
                                       int ngran, int warp, int lane) {
    for (int g0 = warp; g0 < ngran; g0 += 2 * NW) {
        MvBuf<M> N;
        mv_load<M>(N, tile, ngran, g0 + 2 * NW, lane);
        mv_compute<M>(B, xs, red, ngran, g0, lane);
        B = N;
    }
}

template <class M>
__device__ __forceinline__ const uint4* mv_tile(const unsigned short* w, long long off, int b) {
    return reinterpret_cast<const uint4*>(w + off + (long long)M::row0(b) * (M::KV * 8));
}
template <class M>
__device__ __forceinline__ int mv_ngran(int b) {
    return (M::row0(b + 1) - M::row0(b)) * M::NSEG;
}
template <class M>
__device__ __forceinline__ float mv_result(const float* red, int r) {  // row r of the block, fixed order
    float s = red[r * M::NSEG];
#pragma unroll
    for (int j = 1; j < M::NSEG; ++j) s += red[r * M::NSEG + j];
    return s;
}

// ---- shared memory plan (phases never overlap, so they share one region) ------------------
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int MV_RED = cmax(cmax(MQKV::MAXR * MQKV::NSEG, MO::MAXR * MO::NSEG),
                            cmax(cmax(MGU::MAXR * MGU::NSEG, MDN::MAXR * MDN::NSEG), MLM::MAXR * MLM::NSEG));
constexpr int MV_X = cmax(cmax(H, QD), INTER);
constexpr int SM_MV = (MV_X + MV_RED + 3) / 4 * 4;                 // floats
constexpr int SM_ATTN = AW * ATT_WAVE;                             // floats
constexpr int SM_SAMPLE = (NBINS * 24 + CAP * 8) / 4 + 64;         // floats
constexpr int SM_FLOATS = cmax(cmax(SM_MV, SM_ATTN), SM_SAMPLE);
constexpr int SMEM_BYTES = SM_FLOATS * 4;

struct Ctx {  // per-block state, identical copies in every thread
    const KParams* P;
    int b, tid, lane, warp;
    unsigned epoch;
    int step, ev;      // token step; synchronisation events so far in this step (tracing)
    float* sm;         // dynamic region
    float* red16;      // NW floats scratch
    int* sint;         // small ints scratch
};

// ---- synchronisation ---------------------------------------------------------------------
#ifdef KOG_TRACE  // bench/decode_breakdown.py: when every block passed each wait and arrival of step KOG_TRACE
constexpr int TRACE_EV = 1024;
__device__ kog_u64 kog_trace[TRACE_EV * NBLK];
#endif
__device__ __forceinline__ void trace_event(Ctx& c) {
#ifdef KOG_TRACE
    if (c.tid == 0 && c.step == KOG_TRACE && c.ev < TRACE_EV) kog_trace[c.ev * NBLK + c.b] = kog_clock_ns();
    ++c.ev;
#else
    (void)c;
#endif
}

__device__ __noinline__ void fail(const KParams* P, int code, unsigned where) {
    if (atomicCAS(P->status + ST_ERROR, 0, code) == 0) {
        P->status[ST_WHERE] = (int)where;
        P->status[ST_BLOCK] = blockIdx.x;
    }
}

// One wave waits until the flags of three block ranges (empty when hi < lo) reach `target`:
// the producers of a head's q, k and v rows, or one range. Each lane polls eight flag words
// with two vector loads, so one round trip sees every block. Bounded: false on timeout (the
// watchdog) or when another block has failed.
__device__ bool wave_wait3(const Ctx& c, int a0, int a1, int b0, int b1, int c0, int c1, unsigned target) {
    const KParams* P = c.P;
    unsigned mine = 0;  // which of this lane's eight flags matter
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int j = (e < 4 ? 0 : 4 * KOG_WAVE - 4) + 4 * c.lane + e;
        if (j < NBLK && ((j >= a0 && j <= a1) || (j >= b0 && j <= b1) || (j >= c0 && j <= c1))) mine |= 1u << e;
    }
    kog_u64 t0 = 0;
    for (int it = 0;; ++it) {
        const uint4 f = kog_ld_relaxed_u4(P->flags + 4 * c.lane);
        const uint4 h = NBLK > 4 * KOG_WAVE ? kog_ld_relaxed_u4(P->flags + 4 * KOG_WAVE + 4 * c.lane) : f;
        const unsigned v[8] = {f.x, f.y, f.z, f.w, h.x, h.y, h.z, h.w};
        bool ok = true;
#pragma unroll
        for (int e = 0; e < 8; ++e) ok &= !((mine >> e) & 1u) || v[e] >= target;
        if (kog_wave_all(ok)) break;
        if ((it & 31) == 31) {
            int bad = 0;
            if (c.lane == 0) {
                const kog_u64 now = kog_clock_ns();
                if (t0 == 0) t0 = now;
                if (kog_ld_relaxed_s32(P->status + ST_ERROR) != 0) bad = 2;
                else if (now - t0 > (kog_u64)P->timeout_ns) bad = 1;
            }
            bad = kog_shfl(bad, 0);
            if (bad) {
                if (bad == 1 && c.lane == 0) fail(P, ERR_TIMEOUT, target);
                return false;
            }
        }
    }
    kog_fence_acqrel();  // acquire: what the producers wrote before their flags is visible now
    return true;
}

__device__ __forceinline__ bool wave_wait(const Ctx& c, int lo, int hi, unsigned target) {
    return wave_wait3(c, lo, hi, 0, -1, 0, -1, target);
}

// All threads: wait for every block to finish phase `target`.
__device__ bool wait_all(Ctx& c, unsigned target) {
    const bool ok = c.warp == 0 ? wave_wait(c, 0, NBLK - 1, target) : true;
    const bool all = __syncthreads_and(ok);
    trace_event(c);
    return all;
}

// All threads: this block is done with the current phase.
__device__ __forceinline__ void arrive(Ctx& c) {
    ++c.epoch;
    __syncthreads();
    trace_event(c);
    if (c.tid == 0) kog_st_release_u32(c.P->flags + c.b, c.epoch);  // release covers the block (bar.sync)
}

// ---- block reductions --------------------------------------------------------------------
__device__ float block_sum(const Ctx& c, float v) {
    v = kog_wave_sum(v);
    if (c.lane == 0) c.red16[c.warp] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NW; ++i) s += c.red16[i];
    __syncthreads();
    return s;
}

// RMSNorm of a global fp32 vector (or of an embedding row) into shared memory. Every load a
// thread needs is issued before the first is used: one round trip, not one per element.
__device__ void stage_norm(const Ctx& c, float* xs, const float* src, const unsigned short* emb_row, const float* w) {
    constexpr int N4 = H / 4, NV = (N4 + NTHR - 1) / NTHR;
    float4 v[NV], g[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int i = c.tid + k * NTHR;
        if (i < N4) {
            if (emb_row) {
                const uint2 e = __ldg(reinterpret_cast<const uint2*>(emb_row) + i);
                v[k] = make_float4(kog_bf16_lo(e.x), kog_bf16_hi(e.x), kog_bf16_lo(e.y), kog_bf16_hi(e.y));
            } else {
                v[k] = kog_ldcg_f4(reinterpret_cast<const float4*>(src) + i);
            }
            g[k] = __ldg(reinterpret_cast<const float4*>(w) + i);
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k)
        if (c.tid + k * NTHR < N4) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    ss = block_sum(c, ss);
    const float s = sqrtf(ss / (float)H + EPS);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int i = c.tid + k * NTHR;
        if (i < N4)
            reinterpret_cast<float4*>(xs)[i] =
                make_float4(v[k].x / s * g[k].x, v[k].y / s * g[k].y, v[k].z / s * g[k].z, v[k].w / s * g[k].w);
    }
    __syncthreads();
}

// N floats another phase wrote, into shared memory (all loads in flight at once).
template <int N>
__device__ void stage_copy(const Ctx& c, float* xs, const float* src) {
    constexpr int N4 = N / 4, NV = (N4 + NTHR - 1) / NTHR;
    float4 v[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k)
        if (c.tid + k * NTHR < N4) v[k] = kog_ldcg_f4(reinterpret_cast<const float4*>(src) + c.tid + k * NTHR);
#pragma unroll
    for (int k = 0; k < NV; ++k)
        if (c.tid + k * NTHR < N4) reinterpret_cast<float4*>(xs)[c.tid + k * NTHR] = v[k];
    __syncthreads();
}

// ---- logits -> token ---------------------------------------------------------------------
__device__ __forceinline__ float penalized(const KParams* P, int r, float v) {
    if (P->use_penalty) {
        const unsigned bits = kog_ldcg_u32(P->rep_bits + (r >> 5));
        if (bits & (1u << (r & 31))) {
            const float pen = (float)P->penalty;
            v = v > 0.f ? v / pen : v * pen;
        }
    }
    return v;
}
__device__ __forceinline__ unsigned fkey(float s) {  // order-preserving float -> uint
    const unsigned u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float fkey_inv(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {  // argmax, first index wins ties
    return v > bv || (v == bv && i < bi);
}

struct Best {
    float v;
    int i;
};
__device__ __forceinline__ void best_wave(Best& x) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        const float ov = __shfl_xor_sync(KOG_FULL_MASK, x.v, m);
        const int oi = __shfl_xor_sync(KOG_FULL_MASK, x.i, m);
        if (better(ov, oi, x.v, x.i)) x.v = ov, x.i = oi;
    }
}
// greedy: (penalized value, index); sampling: (key as float bits ignored) -> we keep the key max
__device__ void publish_block_best(const Ctx& c, Best x) {
    best_wave(x);
    float* sv = c.red16;
    int* si = c.sint + 8;
    if (c.lane == 0) sv[c.warp] = x.v, si[c.warp] = x.i;
    __syncthreads();
    if (c.tid == 0) {
        Best y = {sv[0], si[0]};
        for (int w = 1; w < NW; ++w)
            if (better(sv[w], si[w], y.v, y.i)) y.v = sv[w], y.i = si[w];
        c.P->slot_val[c.b] = y.v;
        c.P->slot_idx[c.b] = y.i;
    }
    __syncthreads();
}

// One wave: the best (value, index) over every block's published candidate.
__device__ Best gather_best(const Ctx& c) {
    Best x = {-KOG_INF, 0x7fffffff};
#pragma unroll
    for (int j = c.lane; j < NBLK; j += KOG_WAVE) {
        const float v = kog_ldcg(c.P->slot_val + j);
        const int i = kog_ldcg_s32(c.P->slot_idx + j);
        if (better(v, i, x.v, x.i)) x.v = v, x.i = i;
    }
    best_wave(x);
    return x;
}

// Per row of the LM head (or of the prefill logits at step 0).
__device__ __forceinline__ void post_logit(const KParams* P, bool greedy, int r, float raw, Best& best) {
    const float v = penalized(P, r, raw);
    if (greedy) {
        if (better(v, r, best.v, best.i)) best.v = v, best.i = r;
    } else {
        const unsigned k = fkey(v / (float)P->temperature);
        P->keys[r] = k;
        const float kf = __uint_as_float(k >> 1);  // monotone stand-in for the key
        if (better(kf, r, best.v, best.i)) best.v = kf, best.i = r;
    }
}

// ---- the sampler (block 0): exact sorted-order semantics of engine/sampling.py -----------------
__device__ __forceinline__ kog_u64 mix64(kog_u64 x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
__device__ __forceinline__ double uniform01(kog_u64 seed, kog_u64 step) {
    const kog_u64 h = mix64(mix64(seed) + step * 0x9E3779B97F4A7C15ull);
    return (double)(h >> 40) / 16777216.0;
}
__device__ __forceinline__ float prob_of(unsigned key, float smax) { return expf(fkey_inv(key) - smax); }
__device__ __forceinline__ kog_u64 fix_of(float p) { return (kog_u64)__float2ull_rz(p * FIX); }
__device__ __forceinline__ int bin_of(float p) {
    const unsigned q = 0x3F800000u - min(__float_as_uint(p), 0x3F800000u);
    return (int)min(q >> 19, (unsigned)(NBINS - 1));
}

// P phase (all blocks): probabilities relative to the max, their bins and the bin histogram.
__device__ void sample_bins(const Ctx& c, float smax) {
    const KParams* P = c.P;
    unsigned* hc = reinterpret_cast<unsigned*>(c.sm);
    kog_u64* hm = reinterpret_cast<kog_u64*>(c.sm + NBINS + 2);  // 8-byte aligned (NBINS even)
    for (int i = c.tid; i < NBINS; i += NTHR) hc[i] = 0, hm[i] = 0;
    __syncthreads();
    const int r0 = MLM::row0(c.b), r1 = MLM::row0(c.b + 1);
    for (int r = r0 + c.tid; r < r1; r += NTHR) {
        const float p = prob_of(kog_ldcg_u32(P->keys + r), smax);
        const int bin = bin_of(p);
        P->bins[r] = (unsigned short)bin;
        atomicAdd(hc + bin, 1u);
        atomicAdd(hm + bin, fix_of(p));
    }
    __syncthreads();
    for (int i = c.tid; i < NBINS; i += NTHR)
        if (hc[i]) {
            atomicAdd(P->hist_cnt + i, hc[i]);
            atomicAdd(P->hist_mass + i, hm[i]);
        }
}

struct SampleSmem {
    unsigned* cnt;     // [NBINS] per bin, then inclusive prefix
    kog_u64* mass;     // [NBINS]
    unsigned* ckey;    // [CAP]
    int* cidx;         // [CAP]
    kog_u64* scan;     // [NW] scratch
    int* misc;         // [16]
};
__device__ SampleSmem sample_smem(const Ctx& c) {
    SampleSmem s;
    char* base = reinterpret_cast<char*>(c.sm);
    s.mass = reinterpret_cast<kog_u64*>(base);
    s.cnt = reinterpret_cast<unsigned*>(base + NBINS * 8);
    s.ckey = reinterpret_cast<unsigned*>(base + NBINS * 12);
    s.cidx = reinterpret_cast<int*>(base + NBINS * 12 + CAP * 4);
    s.scan = reinterpret_cast<kog_u64*>(base + NBINS * 12 + CAP * 8);
    s.misc = reinterpret_cast<int*>(base + NBINS * 12 + CAP * 8 + NW * 8);
    return s;
}
static_assert(NBINS * 12 + CAP * 8 + NW * 8 + 64 <= SM_SAMPLE * 4, "sampler shared memory");

// Block-wide exclusive scan of one u64 per thread (thread order).
__device__ kog_u64 block_excl_scan(const Ctx& c, kog_u64 v, kog_u64* scratch, kog_u64* total) {
    kog_u64 inc = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const kog_u64 o = kog_shfl_up(inc, d);
        if (c.lane >= d) inc += o;
    }
    if (c.lane == 31) scratch[c.warp] = inc;
    __syncthreads();
    kog_u64 before = 0, all = 0;
    for (int w = 0; w < NW; ++w) {
        if (w < c.warp) before += scratch[w];
        all += scratch[w];
    }
    __syncthreads();
    if (total) *total = all;
    return before + inc - v;
}

struct Sel {
    int found, idx;
    long long pos;     // position in sorted order
    kog_u64 mass_incl; // mass of positions 0..pos
};

// First sorted position where the running count (mode 0) or mass (mode 1) reaches T
// (>= T, or > T when strict). Sorted order: key descending, index ascending.
__device__ Sel select(const Ctx& c, SampleSmem& s, int mode, kog_u64 T, bool strict, float smax) {
    const KParams* P = c.P;
    auto cross = [&](kog_u64 cum) { return strict ? cum > T : cum >= T; };
    // 1. the bin where it happens
    if (c.tid == 0) s.misc[0] = -1;
    __syncthreads();
    for (int b = c.tid; b < NBINS; b += NTHR) {
        const kog_u64 cum = mode == 0 ? (kog_u64)s.cnt[b] : s.mass[b];
        const kog_u64 prev = b == 0 ? 0 : (mode == 0 ? (kog_u64)s.cnt[b - 1] : s.mass[b - 1]);
        if (cross(cum) && (b == 0 || !cross(prev))) s.misc[0] = b;
    }
    __syncthreads();
    const int bstar = s.misc[0];
    Sel r = {0, -1, -1, 0};
    __syncthreads();
    if (bstar < 0) return r;
    const kog_u64 cnt_before = bstar ? s.cnt[bstar - 1] : 0;
    const kog_u64 mass_before = bstar ? s.mass[bstar - 1] : 0;
    // 2. gather that bin's members
    if (c.tid == 0) s.misc[1] = 0;
    __syncthreads();
    const uint4* bins4 = reinterpret_cast<const uint4*>(P->bins);
    for (int q = c.tid; q < VPAD / 8; q += NTHR) {
        const uint4 v = kog_ldcg_u4(bins4 + q);
        const unsigned w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const unsigned bb = (w4[j >> 1] >> ((j & 1) * 16)) & 0xffffu;
            if ((int)bb == bstar) {
                const int i = q * 8 + j;
                const int at = atomicAdd(s.misc + 1, 1);
                if (at < CAP) s.ckey[at] = kog_ldcg_u32(P->keys + i), s.cidx[at] = i;
            }
        }
    }
    __syncthreads();
    int n = s.misc[1];
    if (n > CAP) {
        if (c.tid == 0) atomicAdd(P->status + ST_APPROX, 1);
        n = CAP;
    }
    int n2 = 2;
    while (n2 < n) n2 <<= 1;
    for (int i = n + c.tid; i < n2; i += NTHR) s.ckey[i] = 0u, s.cidx[i] = 0x7fffffff;
    __syncthreads();
    // 3. bitonic sort into sorted order
    for (int k = 2; k <= n2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = c.tid; i < n2; i += NTHR) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const unsigned ka = s.ckey[i], kb = s.ckey[ixj];
                    const int ia = s.cidx[i], ib = s.cidx[ixj];
                    const bool b_first = kb > ka || (kb == ka && ib < ia);
                    const bool a_first = !b_first;
                    const bool swap = ((i & k) == 0) ? b_first : a_first;
                    if (swap) s.ckey[i] = kb, s.ckey[ixj] = ka, s.cidx[i] = ib, s.cidx[ixj] = ia;
                }
            }
            __syncthreads();
        }
    }
    // 4. running sums inside the bin
    const int per = (n + NTHR - 1) / NTHR;
    const int a0 = min(n, c.tid * per), a1 = min(n, a0 + per);
    kog_u64 mine = 0;
    for (int i = a0; i < a1; ++i) mine += mode == 0 ? 1ull : fix_of(prob_of(s.ckey[i], smax));
    const kog_u64 excl = block_excl_scan(c, mine, s.scan, nullptr);
    if (c.tid == 0) s.misc[2] = -1;
    __syncthreads();
    {
        kog_u64 run = (mode == 0 ? cnt_before : mass_before) + excl;
        for (int i = a0; i < a1; ++i) {
            const kog_u64 before = run;
            run += mode == 0 ? 1ull : fix_of(prob_of(s.ckey[i], smax));
            if (cross(run) && !cross(before)) s.misc[2] = i;
        }
    }
    __syncthreads();
    const int j = s.misc[2];
    if (j < 0) {  // only when the bin overflowed CAP
        __syncthreads();
        return r;
    }
    // mass up to and including j
    kog_u64 part = 0;
    for (int i = c.tid; i <= j; i += NTHR) part += fix_of(prob_of(s.ckey[i], smax));
    kog_u64 tot = 0;
    block_excl_scan(c, part, s.scan, &tot);
    r.found = 1;
    r.idx = s.cidx[j];
    r.pos = (long long)cnt_before + j;
    r.mass_incl = mass_before + tot;
    __syncthreads();
    return r;
}

// Count of elements with p >= thr (a sorted prefix): bins above thr's bin, plus members of it.
__device__ long long count_at_least(const Ctx& c, SampleSmem& s, float thr, float smax) {
    const int bm = bin_of(thr);
    if (c.tid == 0) s.misc[3] = 0;
    __syncthreads();
    const unsigned short* bins = c.P->bins;
    int mine = 0;
    const uint4* bins4 = reinterpret_cast<const uint4*>(bins);
    for (int q = c.tid; q < VPAD / 8; q += NTHR) {
        const uint4 v = kog_ldcg_u4(bins4 + q);
        const unsigned w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const unsigned bb = (w4[j >> 1] >> ((j & 1) * 16)) & 0xffffu;
            if ((int)bb == bm && prob_of(kog_ldcg_u32(c.P->keys + q * 8 + j), smax) >= thr) ++mine;
        }
    }
    atomicAdd(s.misc + 3, mine);
    __syncthreads();
    const long long n = (long long)(bm ? s.cnt[bm - 1] : 0) + s.misc[3];
    __syncthreads();
    return n;
}

// Block 0 only: the whole sampling rule of engine/sampling.py over the bins of this step.
__device__ int sample_token(const Ctx& c, int step, float smax) {
    const KParams* P = c.P;
    SampleSmem s = sample_smem(c);
    // histogram -> inclusive prefix sums; clear the global histogram for the next step
    const int per = NBINS / NTHR;  // 2
    unsigned cl[per];
    kog_u64 ml[per];
    kog_u64 csum = 0, msum = 0;
#pragma unroll
    for (int k = 0; k < per; ++k) {
        const int b = c.tid * per + k;
        cl[k] = kog_ldcg_u32(P->hist_cnt + b);
        ml[k] = kog_ldcg_u64(P->hist_mass + b);
        P->hist_cnt[b] = 0;
        P->hist_mass[b] = 0;
        csum += cl[k];
        msum += ml[k];
    }
    kog_u64 ctot, mtot;
    kog_u64 cex = block_excl_scan(c, csum, s.scan, &ctot);
    kog_u64 mex = block_excl_scan(c, msum, s.scan, &mtot);
#pragma unroll
    for (int k = 0; k < per; ++k) {
        const int b = c.tid * per + k;
        cex += cl[k];
        mex += ml[k];
        s.cnt[b] = (unsigned)cex;
        s.mass[b] = mex;
    }
    __syncthreads();
    const long long V = (long long)ctot;
    const kog_u64 Z = mtot;
    const long long top_k = P->top_k;
    const double top_p = P->top_p, min_p = P->min_p;

    const long long kept_k = (top_k > 0 && top_k < V) ? top_k : V;
    kog_u64 Zk = Z;
    if (kept_k < V) Zk = select(c, s, 0, (kog_u64)kept_k, false, smax).mass_incl;
    long long keep = kept_k;
    if (top_p < 1.0) {
        const Sel t = select(c, s, 1, (kog_u64)(top_p * (double)Zk), false, smax);
        if (t.found && t.pos + 1 < keep) keep = t.pos + 1;
    }
    if (min_p > 0.0) {
        const long long m = count_at_least(c, s, (float)min_p, smax);
        if (m < keep) keep = m > 0 ? m : 1;
    }
    kog_u64 kept_mass = Z;
    if (keep == kept_k) kept_mass = Zk;
    if (keep < kept_k) kept_mass = select(c, s, 0, (kog_u64)keep, false, smax).mass_incl;
    const double u = uniform01((kog_u64)P->seed, (kog_u64)step);
    Sel t = select(c, s, 1, (kog_u64)(u * (double)kept_mass), true, smax);
    if (!t.found || t.pos >= keep) t = select(c, s, 0, (kog_u64)keep, false, smax);
    return t.found ? t.idx : 0;
}

// ---- attention ---------------------------------------------------------------------------
// One wave per (kv head, chunk of positions): the group's query heads against the chunk;
// chunks of one head meet through partial (max, sum, acc) records, combined by the last one.
__device__ bool attention(Ctx& c, int l, int pos, unsigned epoch_qkv) {
    const KParams* P = c.P;
    const int L = pos + 1;
    const int CH = 32 * ((L + 32 * MAXCH - 1) / (32 * MAXCH));
    const int nch = (L + CH - 1) / CH;
    const int nunits = NKV * nch;
    const int lane = c.lane;
    if (c.warp >= AW) return true;
    float* qs = c.sm + c.warp * ATT_WAVE;
    float* ks = qs + G * D;
    float* vs = ks + D;
    float* kt = vs + D;        // [32][KT] K rows of the current tile
    float* vt = kt + 32 * KT;  // [32][D]  V rows
    const float* wl = P->ws + (long long)l * SSTRIDE;
    const float* cs = P->rcos + (long long)pos * HALF;
    const float* sn = P->rsin + (long long)pos * HALF;
    for (int u = c.b + NBLK * c.warp; u < nunits; u += NBLK * AW) {
        const int g = u / nch, ch = u - g * nch;
        const bool last = ch == nch - 1;
        // wait for the blocks that produce this head's q, k, v rows
        const int q0 = g * G * D, k0 = QD + g * D, v0 = QD + KVD + g * D;
        if (!wave_wait3(c, MQKV::owner(q0), MQKV::owner(q0 + G * D - 1), MQKV::owner(k0), MQKV::owner(k0 + D - 1),
                        MQKV::owner(v0), MQKV::owner(v0 + D - 1), epoch_qkv))
            return false;

        // every q/k/v value and RoPE factor this wave needs, loaded in one round trip
        float qv[G][DL], kv[DL], vv[DL], co[DL / 2], si[DL / 2];
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
            for (int i = 0; i < DL; ++i) qv[h][i] = kog_ldcg(P->qkv + q0 + h * D + lane + 32 * i);
#pragma unroll
        for (int i = 0; i < DL; ++i) {
            kv[i] = last ? kog_ldcg(P->qkv + k0 + lane + 32 * i) : 0.f;
            vv[i] = last ? kog_ldcg(P->qkv + v0 + lane + 32 * i) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < DL / 2; ++i) co[i] = __ldg(cs + lane + 32 * i), si[i] = __ldg(sn + lane + 32 * i);

        auto prep = [&](float (&v)[DL], const float* normw, float* out) {  // (norm) + RoPE of one head
#if KOG_QK_NORM
            float ss = 0.f;
#pragma unroll
            for (int i = 0; i < DL; ++i) ss += v[i] * v[i];
            ss = kog_wave_sum(ss);
            const float rn = sqrtf(ss / (float)D + EPS);
#pragma unroll
            for (int i = 0; i < DL; ++i) v[i] = v[i] / rn * normw[lane + 32 * i];
#else
            (void)normw;
#endif
#pragma unroll
            for (int i = 0; i < DL / 2; ++i) {
                const int d = lane + 32 * i;
                const float x1 = v[i], x2 = v[i + DL / 2];
                out[d] = __fadd_rn(__fmul_rn(x1, co[i]), __fmul_rn(-x2, si[i]));
                out[d + HALF] = __fadd_rn(__fmul_rn(x2, co[i]), __fmul_rn(x1, si[i]));
            }
        };
#pragma unroll
        for (int h = 0; h < G; ++h) prep(qv[h], wl + S_QNORM, qs + h * D);
        const long long ctx = P->ctx_limit;  // cache positions per (layer, kv head)
        float* kbase = P->kc + ((long long)(l * NKV + g) * ctx) * D;
        float* vbase = P->vc + ((long long)(l * NKV + g) * ctx) * D;
        if (last) {
            prep(kv, wl + S_KNORM, ks);
#pragma unroll
            for (int i = 0; i < DL; ++i) vs[lane + 32 * i] = vv[i];
            kog_wave_sync();
#pragma unroll
            for (int i = 0; i < DL; ++i) {
                kbase[(long long)pos * D + lane + 32 * i] = ks[lane + 32 * i];
                vbase[(long long)pos * D + lane + 32 * i] = vs[lane + 32 * i];
            }
        }
        kog_wave_sync();

        float m[G], lsum[G], acc[G][DL];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            m[h] = -KOG_INF, lsum[h] = 0.f;
#pragma unroll
            for (int i = 0; i < DL; ++i) acc[h][i] = 0.f;
        }
        const int p0 = ch * CH, p1 = KOG_EXP == 1 ? p0 : min(L, p0 + CH);
        for (int base = p0; base < p1; base += 32) {
            const int nv = min(32, p1 - base);
            // the whole tile in one round trip: K and V rows are contiguous in the cache
            for (int q = lane; q < nv * (D / 4); q += 32) {
                const int r = q / (D / 4), c4 = q - r * (D / 4);
                kog_cp_async16(kt + r * KT + 4 * c4, kbase + (long long)(base + r) * D + 4 * c4);
                kog_cp_async16(vt + r * D + 4 * c4, vbase + (long long)(base + r) * D + 4 * c4);
            }
            kog_cp_async_wait();
            kog_wave_sync();
            if (pos >= base && pos < base + nv) {  // the new row: take this wave's own copy
#pragma unroll
                for (int i = 0; i < DL; ++i) {
                    kt[(pos - base) * KT + lane + 32 * i] = ks[lane + 32 * i];
                    vt[(pos - base) * D + lane + 32 * i] = vs[lane + 32 * i];
                }
                kog_wave_sync();
            }
            const bool valid = lane < nv;
            float s[G];
#pragma unroll
            for (int h = 0; h < G; ++h) s[h] = 0.f;
            if (valid) {
                const float* kp = kt + lane * KT;
#pragma unroll 8
                for (int d4 = 0; d4 < D / 4; ++d4) {
                    const float4 kv = *reinterpret_cast<const float4*>(kp + 4 * d4);
#pragma unroll
                    for (int h = 0; h < G; ++h) {
                        const float4 qv = *reinterpret_cast<const float4*>(qs + h * D + 4 * d4);
                        s[h] = fmaf(kv.x, qv.x, s[h]);
                        s[h] = fmaf(kv.y, qv.y, s[h]);
                        s[h] = fmaf(kv.z, qv.z, s[h]);
                        s[h] = fmaf(kv.w, qv.w, s[h]);
                    }
                }
            }
            float pe[G];
#pragma unroll
            for (int h = 0; h < G; ++h) {
                const float sv = valid ? s[h] * SCALE : -KOG_INF;
                const float mn = fmaxf(m[h], kog_wave_max(sv));
                const float corr = expf(m[h] - mn);
                pe[h] = valid ? expf(sv - mn) : 0.f;
                lsum[h] = lsum[h] * corr + kog_wave_sum(pe[h]);
#pragma unroll
                for (int i = 0; i < DL; ++i) acc[h][i] *= corr;
                m[h] = mn;
            }
            for (int j = 0; j < nv; ++j) {
                float vv[DL];
#pragma unroll
                for (int i = 0; i < DL; ++i) vv[i] = vt[j * D + lane + 32 * i];
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    const float w = kog_shfl(pe[h], j);
#pragma unroll
                    for (int i = 0; i < DL; ++i) acc[h][i] = fmaf(w, vv[i], acc[h][i]);
                }
            }
            kog_wave_sync();  // the tile buffers are refilled next iteration
        }
        if (nch == 1) {
#pragma unroll
            for (int h = 0; h < G; ++h)
#pragma unroll
                for (int i = 0; i < DL; ++i) P->attn[(g * G + h) * D + lane + 32 * i] = acc[h][i] / lsum[h];
        } else {
            float* pr = P->part + ((long long)(g * MAXCH + ch) * G) * (D + 2);
#pragma unroll
            for (int h = 0; h < G; ++h) {
#pragma unroll
                for (int i = 0; i < DL; ++i) pr[h * (D + 2) + lane + 32 * i] = acc[h][i];
                if (lane == 0) pr[h * (D + 2) + D] = m[h], pr[h * (D + 2) + D + 1] = lsum[h];
            }
            kog_fence_acqrel();
            kog_wave_sync();
            unsigned old = 0;
            if (lane == 0) old = atomicAdd(P->attn_cnt + g, 1u);
            old = kog_shfl(old, 0);
            if (old == (unsigned)(nch - 1)) {  // the last chunk of this head combines them all
                kog_fence_acqrel();
                const float* pg = P->part + ((long long)(g * MAXCH) * G) * (D + 2);
                const long long cs_ = (long long)G * (D + 2);  // one chunk's records
                float mc[G], lc[G];  // lane = chunk: every chunk's (max, sum) in one round trip
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    mc[h] = lane < nch ? kog_ldcg(pg + lane * cs_ + h * (D + 2) + D) : -KOG_INF;
                    lc[h] = lane < nch ? kog_ldcg(pg + lane * cs_ + h * (D + 2) + D + 1) : 0.f;
                }
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    const float* ph = pg + h * (D + 2);
                    const float M = kog_wave_max(mc[h]);
                    const float wc = lane < nch ? expf(mc[h] - M) : 0.f;
                    const float Ls = kog_wave_sum(wc * lc[h]);
                    float o[DL];
#pragma unroll
                    for (int i = 0; i < DL; ++i) o[i] = 0.f;
#pragma unroll 8
                    for (int cc = 0; cc < nch; ++cc) {
                        const float w = kog_shfl(wc, cc);
#pragma unroll
                        for (int i = 0; i < DL; ++i) o[i] = fmaf(w, kog_ldcg(ph + cc * cs_ + lane + 32 * i), o[i]);
                    }
#pragma unroll
                    for (int i = 0; i < DL; ++i) P->attn[(g * G + h) * D + lane + 32 * i] = o[i] / Ls;
                }
                if (lane == 0) P->attn_cnt[g] = 0;
            }
        }
        kog_wave_sync();
    }
    return true;
}

// ---- one token through the model ---------------------------------------------------------
__device__ bool forward(Ctx& c, int token, int pos, MvBuf<MQKV>& bq, bool greedy, float* xown) {
    const KParams* P = c.P;
    float* xs = c.sm;
    float* red = c.sm + MV_X;
    const int b = c.b, warp = c.warp, lane = c.lane;
    const unsigned short* w = P->w;
    for (int l = 0; l < NL; ++l) {
        const long long wl = (long long)l * LSTRIDE;
        const float* sl = P->ws + (long long)l * SSTRIDE;
        // --- QKV
        if (l == 0) {
            const unsigned short* emb = w + OFF_EMB + (long long)token * H;
            for (int r = c.tid; r < MO::row0(b + 1) - MO::row0(b); r += NTHR) xown[r] = kog_bf16(emb[MO::row0(b) + r]);
            stage_norm(c, xs, nullptr, emb, sl + S_ATTN_NORM);
        } else {
            if (!wait_all(c, c.epoch)) return false;
            stage_norm(c, xs, P->x, nullptr, sl + S_ATTN_NORM);
        }
        {
            const int ng = mv_ngran<MQKV>(b);
            mv_run<MQKV>(bq, mv_tile<MQKV>(w, wl + OFF_QKV, b), xs, red, ng, warp, lane);
            __syncthreads();
            const int r0 = MQKV::row0(b), nr = MQKV::row0(b + 1) - r0;
            for (int r = c.tid; r < nr; r += NTHR) {
                float v = mv_result<MQKV>(red, r);
#if KOG_QKV_BIAS
                v += sl[S_BQKV + r0 + r];
#endif
                P->qkv[r0 + r] = v;
            }
        }
        arrive(c);
        const unsigned e_qkv = c.epoch;
        // --- attention (waits only for its own head's producers)
        const bool att_ok = attention(c, l, pos, e_qkv);
        MvBuf<MO> bo;
        mv_load<MO>(bo, mv_tile<MO>(w, wl + OFF_O, b), mv_ngran<MO>(b), warp, lane);
        if (!__syncthreads_and(att_ok)) return false;  // every warp reaches the barrier, failed or not
        arrive(c);
        // --- O projection + residual
        if (!wait_all(c, c.epoch)) return false;
        stage_copy<QD>(c, xs, P->attn);
        MvBuf<MGU> bg;
        {
            const int ng = mv_ngran<MO>(b);
            mv_run<MO>(bo, mv_tile<MO>(w, wl + OFF_O, b), xs, red, ng, warp, lane);
            mv_load<MGU>(bg, mv_tile<MGU>(w, wl + OFF_GU, b), mv_ngran<MGU>(b), warp, lane);
            __syncthreads();
            const int r0 = MO::row0(b), nr = MO::row0(b + 1) - r0;
            for (int r = c.tid; r < nr; r += NTHR) P->x[r0 + r] = xown[r] = xown[r] + mv_result<MO>(red, r);
        }
        arrive(c);
        // --- gate/up + SiLU
        if (!wait_all(c, c.epoch)) return false;
        stage_norm(c, xs, P->x, nullptr, sl + S_MLP_NORM);
        MvBuf<MDN> bd;
        {
            const int ng = mv_ngran<MGU>(b);
            mv_run<MGU>(bg, mv_tile<MGU>(w, wl + OFF_GU, b), xs, red, ng, warp, lane);
            mv_load<MDN>(bd, mv_tile<MDN>(w, wl + OFF_DN, b), mv_ngran<MDN>(b), warp, lane);
            __syncthreads();
            const int r0 = MGU::row0(b), np = (MGU::row0(b + 1) - r0) / 2;
            for (int j = c.tid; j < np; j += NTHR) {
                const float gt = mv_result<MGU>(red, 2 * j), up = mv_result<MGU>(red, 2 * j + 1);
                P->act[r0 / 2 + j] = gt / (1.0f + expf(-gt)) * up;
            }
        }
        arrive(c);
        // --- down + residual
        if (!wait_all(c, c.epoch)) return false;
        stage_copy<INTER>(c, xs, P->act);
        {
            const int ng = mv_ngran<MDN>(b);
            mv_run<MDN>(bd, mv_tile<MDN>(w, wl + OFF_DN, b), xs, red, ng, warp, lane);
            if (l + 1 < NL) mv_load<MQKV>(bq, mv_tile<MQKV>(w, wl + LSTRIDE + OFF_QKV, b), mv_ngran<MQKV>(b), warp, lane);
            __syncthreads();
            const int r0 = MDN::row0(b), nr = MDN::row0(b + 1) - r0;
            for (int r = c.tid; r < nr; r += NTHR) P->x[r0 + r] = xown[r] = xown[r] + mv_result<MDN>(red, r);
        }
        arrive(c);
    }
    // --- final norm + LM head (+ per-block argmax / sampling keys)
    MvBuf<MLM> bl;
    mv_load<MLM>(bl, mv_tile<MLM>(w, OFF_LMH, b), mv_ngran<MLM>(b), warp, lane);
    int cancel = 0;
    if (b == 0 && c.tid == 0) cancel = kog_ld_sys_s32(P->host_cancel);
    if (!wait_all(c, c.epoch)) return false;
    stage_norm(c, xs, P->x, nullptr, P->ws + S_FINAL);
    {
        const int ng = mv_ngran<MLM>(b);
        mv_run<MLM>(bl, mv_tile<MLM>(w, OFF_LMH, b), xs, red, ng, warp, lane);
        mv_load<MQKV>(bq, mv_tile<MQKV>(w, OFF_QKV, b), mv_ngran<MQKV>(b), warp, lane);
        __syncthreads();
        const int r0 = MLM::row0(b), nr = MLM::row0(b + 1) - r0;
        Best best = {-KOG_INF, 0x7fffffff};
        for (int r = c.tid; r < nr; r += NTHR) {
            const float v = mv_result<MLM>(red, r);
            P->logits[r0 + r] = v;
            post_logit(P, greedy, r0 + r, v, best);
        }
        publish_block_best(c, best);
    }
    if (b == 0 && c.tid == 0) P->ctl[1] = cancel;
    arrive(c);
    return true;
}

// ---- token choice ------------------------------------------------------------------------
__device__ bool choose_token(Ctx& c, int step, bool greedy, int& token, int& cancel) {
    const KParams* P = c.P;
    if (step == 0) {  // logits came from prefill: scan them like the LM head epilogue would
        int cf = 0;
        if (c.b == 0 && c.tid == 0) cf = kog_ld_sys_s32(P->host_cancel);
        const int r0 = MLM::row0(c.b), r1 = MLM::row0(c.b + 1);
        Best best = {-KOG_INF, 0x7fffffff};
        for (int r = r0 + c.tid; r < r1; r += NTHR) post_logit(P, greedy, r, kog_ldcg(P->logits + r), best);
        publish_block_best(c, best);
        if (c.b == 0 && c.tid == 0) P->ctl[1] = cf;
        arrive(c);
    }
    if (!wait_all(c, c.epoch)) return false;
    if (greedy) {
        if (c.warp == 0) {
            const Best x = gather_best(c);
            if (c.lane == 0) c.sint[1] = x.i, c.sint[2] = kog_ldcg_s32(P->ctl + 1);
        }
        __syncthreads();
        token = c.sint[1];
        cancel = c.sint[2];
        __syncthreads();
        return true;
    }
    // sampling: max key -> probabilities and bins (all blocks) -> block 0 samples
    if (c.warp == 0) {
        const Best x = gather_best(c);
        if (c.lane == 0) c.sint[3] = x.i;
    }
    __syncthreads();
    const float smax = fkey_inv(kog_ldcg_u32(P->keys + c.sint[3]));
    __syncthreads();
    sample_bins(c, smax);
    arrive(c);
    if (c.b == 0) {
        if (!wait_all(c, c.epoch)) return false;
        const int t = sample_token(c, step, smax);
        if (c.tid == 0) {
            P->ctl[0] = t;
            P->ctl[1] = kog_ld_sys_s32(P->host_cancel);
        }
        arrive(c);
    } else {
        arrive(c);
        if (c.warp == 0) {
            const bool ok = wave_wait(c, 0, 0, c.epoch);
            if (c.lane == 0) c.sint[0] = ok;
        }
        __syncthreads();
        const bool ok = c.sint[0];
        __syncthreads();
        if (!ok) return false;
    }
    token = kog_ldcg_s32(P->ctl + 0);
    cancel = kog_ldcg_s32(P->ctl + 1);
    __syncthreads();
    return true;
}

extern "C" __global__ void __launch_bounds__(NTHR, 1) kog_decode(const KParams* __restrict__ P) {
    extern __shared__ __align__(16) float kog_smem[];
    __shared__ float red16[NW];
    __shared__ int sint[8 + NW];
    __shared__ float xown[MO::MAXR];  // this block's rows of the residual stream
    __shared__ int stops[MAXSTOP];
    Ctx c;
    c.P = P;
    c.b = blockIdx.x;
    c.tid = threadIdx.x;
    c.lane = threadIdx.x & 31;
    c.warp = threadIdx.x >> 5;
    c.epoch = 0;
    c.sm = kog_smem;
    c.red16 = red16;
    c.sint = sint;
    if (gridDim.x != NBLK || blockDim.x != NTHR) {
        if (c.tid == 0) fail(P, ERR_BAD_ARGS, 0);
        return;
    }
    const bool greedy = P->greedy != 0;
    const int n_stop = min((int)P->n_stop, MAXSTOP);
    for (int i = c.tid; i < n_stop; i += NTHR) stops[i] = P->stop_ids[i];
    __syncthreads();
    MvBuf<MQKV> bq;  // first weight tiles of the next token, loaded while the token is chosen
    mv_load<MQKV>(bq, mv_tile<MQKV>(P->w, OFF_QKV, c.b), mv_ngran<MQKV>(c.b), c.warp, c.lane);

    bool ok = true;
    if (P->debug_hang && c.b == 0) {  // test knob: wait for a flag that never comes
        if (c.warp == 0) wave_wait(c, 0, 0, 0xffffffffu);
        ok = false;
    }
    int pos = (int)P->start_pos, fed = 0, out = 0, reason = 0;
    for (int step = 0; ok; ++step) {
        int token = 0, cancel = 0;
        c.step = step;
        c.ev = 0;
        if (!choose_token(c, step, greedy, token, cancel)) {
            ok = false;
            break;
        }
        if ((unsigned)token >= (unsigned)VOCAB) token = 0;  // NaN logits must not index past the table
        out = step + 1;
        if (c.b == 0 && c.tid == 0) {
            // the host reads a slot once it is no longer -1: one store, no system fence on the
            // critical path (block 0's next phase would wait for it)
            kog_st_relaxed_sys_s32(P->host_tokens + step, token);
            P->tok_time[step] = kog_clock_ns();
            if (P->use_penalty) atomicOr(P->rep_bits + (token >> 5), 1u << (token & 31));
        }
        bool is_stop = false;
        for (int i = 0; i < n_stop; ++i) is_stop |= stops[i] == token;
        if (is_stop) reason = R_STOP;
        else if (step == (int)P->max_tokens - 1) reason = R_LENGTH;
        else if (pos + 1 >= (int)P->ctx_limit) reason = R_CONTEXT;
        else if (cancel) reason = R_CANCEL;
        if (reason) break;
        if (!forward(c, token, pos, bq, greedy, xown)) {
            ok = false;
            break;
        }
        ++pos;
        ++fed;
    }
    if (c.b == 0 && c.tid == 0) {
        P->status[ST_OUT] = out;
        P->status[ST_FED] = fed;
        P->status[ST_REASON] = reason;
        if (!ok) atomicCAS(P->status + ST_ERROR, 0, 2);
    }
}

// Constants the host checks against its own layout before trusting a binary.
extern "C" __global__ void kog_info(long long* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        out[0] = LSTRIDE;
        out[1] = OFF_EMB;
        out[2] = OFF_LMH;
        out[3] = SSTRIDE;
        out[4] = S_FINAL;
        out[5] = SMEM_BYTES;
        out[6] = NTHR;
        out[7] = NBLK;
        out[8] = sizeof(KParams);
        out[9] = NBINS;
        out[10] = VPAD;
        out[11] = MAXCH;
        out[12] = FLAGS;
        out[13] = MAXSTOP;
    }
}
