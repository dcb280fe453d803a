// kog monokernel: the whole batch-1 decode loop in ONE persistent cooperative launch.
//
// One block per multiprocessor runs, for every requested token: pick the token from the
// logits (greedy argmax, or the sampler), publish it to host-mapped memory, stop or feed it
// through every layer (RMSNorm -> packed QKV (+bias, q/k norm, RoPE, KV append) -> GQA
// attention over the fp32 cache -> O + residual -> RMSNorm -> packed gate/up + SiLU ->
// down + residual), final norm, LM head, and loop. The host launches it once per generation.
//
// Synchronisation: the short vectors that cross blocks inside a layer (x, q/k/v, attention
// output, a short SiLU(gate)*up) travel as tagged 8-byte words (phase, value); a consumer
// spins on exactly the words it reads until they carry the phase it expects -- the data is its
// own flag: one round trip, no fences. A long SiLU(gate)*up (polling it would flood L2) and
// token boundaries (LM head -> token choice) use per-block epoch flags (release store /
// acquire poll). Phase numbers only grow during a launch, so nothing is reset mid-run.
// Weights stream through a per-warp shared-memory ring (see "the weight ring") that runs
// ahead across phases: they do not depend on activations, so HBM keeps streaming while a
// phase waits for its input.
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

#ifndef KOG_EXP  // timing experiments only (bench/decode_breakdown.py): 1 no attention math, 2 no weight
#define KOG_EXP 0  // loads, 3 weights without the L2 evict-first hint
#endif
#ifndef KOG_RING  // weight granules in flight per warp (2 KB each)
#define KOG_RING 4
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
constexpr int MAXCH = NBLK / NKV;  // attention block-units per kv head at most
constexpr int KT = D + 4;          // padded row of the shared K tile (conflict-free float4 rows)
constexpr int TILE_F = 32 * KT + 32 * D;  // floats of one K/V tile in shared memory
constexpr int ATT_FIXED = (G + 2) * D + NW * (D + 2) + 4;
constexpr int ATT_BUDGET = 24000;  // floats of shared memory the attention phase may take (94 KB)
constexpr int TBR = (ATT_BUDGET - ATT_FIXED) / TILE_F < NW / G ? (ATT_BUDGET - ATT_FIXED) / TILE_F : NW / G;  // tiles per round
static_assert(G + 2 <= NW && TBR >= 1, "a block holds one kv head's query heads, k and v");

static_assert(NH % NKV == 0, "query heads must be a multiple of kv heads");
static_assert(D % 64 == 0 && D <= 256, "head_dim must be 64, 128, 192 or 256");
static_assert(H % 8 == 0 && INTER % 8 == 0 && QD % 8 == 0, "dims must be multiples of 8");
// A long SiLU(gate)*up vector goes behind the flags instead: 132 blocks polling 64 KB of tagged
// words each flood L2 (Llama shape: 5.5 us per layer tagged, 1.8 us flagged; SmolLM2: 0.8 vs 2.2).
constexpr bool ACT_TAGGED = INTER <= 4096;
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
    kog_u64* x;     // tagged words (phase, value): the vectors that cross blocks
    kog_u64* qkv;
    kog_u64* attn;
    float* part;
    kog_u64* act;   // SiLU(gate)*up: tagged words, or (ACT_TAGGED false) plain floats behind the flags
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
};
using MQKV = Mv<H, NQKV, 1>;
using MO = Mv<QD, H, 1>;
using MGU = Mv<H, 2 * INTER, 2>;
using MDN = Mv<INTER, H, 1>;
using MLM = Mv<H, VOCAB, 1>;

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
constexpr int SM_ATTN = ATT_FIXED + TBR * TILE_F;                 // floats
constexpr int SM_SAMPLE = (NBINS * 24 + CAP * 8) / 4 + 64;         // floats
constexpr int SM_FLOATS = cmax(cmax(SM_MV, SM_ATTN), SM_SAMPLE);
// the weight ring lives beside that region: it streams across every phase
constexpr int RING = KOG_RING;       // granules in flight per warp
constexpr int SLOT = 4 * KOG_WAVE;   // 16-byte vectors per granule slot (U <= 4)
constexpr int SMEM_BYTES = SM_FLOATS * 4 + NW * RING * SLOT * 16;
static_assert(SMEM_BYTES <= 227 * 1024 - 2048, "shared memory per block");

// ---- the weight ring ---------------------------------------------------------------------
// Each warp streams its granules of every matrix, in the order the forward pass consumes them
// (per layer QKV, O, gate/up, down; then the LM head; then layer 0 of the next token), through
// RING shared-memory slots with cp.async: RING granules stay in flight at all times, across
// phase boundaries and waits (weights do not depend on activations), so HBM keeps streaming
// while a phase waits for its input. Each lane copies and later reads only its own 16-byte
// pieces, so a slot needs no barrier, only the lane's own cp.async.wait_group.
struct Source {  // the block's tile of one matrix
    const uint4* tile;
    int ngran, kv, nseg, u;
};
template <class M>
__device__ __forceinline__ Source source_of(const unsigned short* w, long long off, int b) {
    static_assert(M::U <= SLOT / KOG_WAVE, "granule wider than a ring slot");
    return {mv_tile<M>(w, off, b), mv_ngran<M>(b), M::KV, M::NSEG, M::U};
}
__device__ __forceinline__ Source stream_source(int mat, int layer, const unsigned short* w, int b) {
    const long long wl = (long long)layer * LSTRIDE;
    switch (mat) {
        case 0: return source_of<MQKV>(w, wl + OFF_QKV, b);
        case 1: return source_of<MO>(w, wl + OFF_O, b);
        case 2: return source_of<MGU>(w, wl + OFF_GU, b);
        case 3: return source_of<MDN>(w, wl + OFF_DN, b);
        default: return source_of<MLM>(w, OFF_LMH, b);
    }
}

struct Stream {  // the next granule this warp issues, and the ring's counters
    Source src;
    int mat, layer, g;  // mat: 0 QKV, 1 O, 2 gate/up, 3 down, 4 LM head
    unsigned head, tail;  // granules issued / consumed
};

struct Ctx {  // per-block state, identical copies in every thread (the stream: in every lane of a warp)
    const KParams* P;
    int b, tid, lane, warp;
    unsigned epoch;
    int step, ev;      // token step; synchronisation events so far in this step (tracing)
    float* sm;         // dynamic region
    float* red16;      // NW floats scratch
    int* sint;         // small ints scratch
    uint4* ring;       // this warp's RING slots
    kog_u64 l2_policy;  // evict-first: streamed weights must not push the KV cache out of L2
    Stream st;
};

__device__ __forceinline__ void stream_next_matrix(Ctx& c) {  // inlined: Ctx must stay in registers
    Stream& s = c.st;
    if (s.mat == 4) s.mat = 0, s.layer = 0;
    else if (s.mat == 3 && s.layer == NL - 1) s.mat = 4;
    else if (s.mat == 3) s.mat = 0, ++s.layer;
    else ++s.mat;
    s.src = stream_source(s.mat, s.layer, c.P->w, c.b);
    s.g = c.warp;
}

// Issue the warp's next granule into the slot freed last (one commit group per granule).
__device__ __forceinline__ void ring_issue(Ctx& c) {
    Stream& s = c.st;
    while (s.g >= s.src.ngran) stream_next_matrix(c);  // ends: every warp has LM head granules
    uint4* slot = c.ring + (s.head % RING) * SLOT;
    const int row = s.g / s.src.nseg, seg = s.g - row * s.src.nseg;
    const int col0 = seg * KOG_WAVE * s.src.u + c.lane;
    const uint4* src = s.src.tile + (size_t)row * s.src.kv + col0;
#pragma unroll
    for (int i = 0; i < SLOT / KOG_WAVE; ++i)
        if (KOG_EXP != 2 && i < s.src.u && col0 + i * KOG_WAVE < s.src.kv) {
            if (KOG_EXP == 3) kog_cp_async16(slot + i * KOG_WAVE + c.lane, src + i * KOG_WAVE);
            else kog_cp_async16_evict_first(slot + i * KOG_WAVE + c.lane, src + i * KOG_WAVE, c.l2_policy);
        }
    kog_cp_async_commit();
    ++s.head;
    s.g += NW;
}

__device__ void ring_start(Ctx& c) {
    c.l2_policy = kog_l2_evict_first();
    c.st.mat = 0, c.st.layer = 0, c.st.g = c.warp, c.st.head = 0, c.st.tail = 0;
    c.st.src = stream_source(0, 0, c.P->w, c.b);
    for (int i = 0; i < RING; ++i) ring_issue(c);
}

// The block's rows of matrix M times xs (shared memory) -> per-granule sums in red: each warp
// takes granules warp, warp + NW, ... from the ring, refilling it as it goes.
template <class M>
__device__ __forceinline__ void mv_run(Ctx& c, const float* xs, float* red) {
    const int ngran = mv_ngran<M>(c.b);
    for (int g = c.warp; g < ngran; g += NW) {
        kog_cp_async_wait_pending<RING - 1>();  // the oldest granule has landed
        const uint4* slot = c.ring + (c.st.tail % RING) * SLOT;
        const int row = g / M::NSEG, seg = g - row * M::NSEG;
        (void)row;
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < M::U; ++i) {
            const int col = seg * M::SEGW + i * KOG_WAVE + c.lane;
            if (M::FULL || col < M::KV) acc += dot8(slot[i * KOG_WAVE + c.lane], xs + col * 8);
        }
        acc = kog_wave_sum(acc);
        if (c.lane == 0) red[g] = acc;
        ++c.st.tail;
        ring_issue(c);
    }
}

// ---- synchronisation ---------------------------------------------------------------------
#ifdef KOG_TRACE  // bench/decode_breakdown.py: when every block passed each wait and arrival of step KOG_TRACE
constexpr int TRACE_EV = 1024;
__device__ kog_u64 kog_trace[TRACE_EV * NBLK];
#endif
#ifdef KOG_TRACE
constexpr int TRACE_ATT = 8;  // stamps per attention unit of the middle layer
__device__ kog_u64 kog_trace_att[NBLK * TRACE_ATT];
#endif
// lane 0 of an attention unit's wave: stamp k of unit u (middle layer of the traced step)
__device__ __forceinline__ void trace_att(const Ctx& c, int l, int u, int k) {
#ifdef KOG_TRACE
    if (c.lane == 0 && c.step == KOG_TRACE && l == NL / 2) kog_trace_att[u * TRACE_ATT + k] = kog_clock_ns();
#else
    (void)c, (void)l, (void)u, (void)k;
#endif
}
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

// One wave waits until the flags of blocks lo..hi reach `target`. Each lane polls eight flag
// words with two vector loads, so one round trip sees every block. Bounded: false on timeout
// (the watchdog) or when another block has failed.
__device__ bool wave_wait(const Ctx& c, int lo, int hi, unsigned target) {
    const KParams* P = c.P;
    unsigned mine = 0;  // which of this lane's eight flags matter
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int j = (e < 4 ? 0 : 4 * KOG_WAVE - 4) + 4 * c.lane + e;
        if (j < NBLK && j >= lo && j <= hi) mine |= 1u << e;
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

// All threads: wait for every block to finish phase `target`.
__device__ bool wait_all(Ctx& c, unsigned target) {
    const bool ok = c.warp == 0 ? wave_wait(c, 0, NBLK - 1, target) : true;
    const bool all = __syncthreads_and(ok);
    trace_event(c);
    return all;
}

// All threads: this block is done with the current phase (its outputs are tagged words).
__device__ __forceinline__ void end_phase(Ctx& c) {
    ++c.epoch;
    __syncthreads();
    trace_event(c);
}

// All threads: this block is done with the current phase, and says so in its flag.
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

// ---- tagged vectors ----------------------------------------------------------------------
// x, qkv, attn (and a short act) cross blocks as tagged words: the producer stores (phase, value) in one
// 8-byte word, and a consumer spins on the words it needs until each carries the phase it
// expects. The data is its own flag: one round trip from producer to consumer, no fences.
// Buffers are reused every layer; a word is only overwritten after every block has read it
// (each overwrite depends, through the phases between, on every block's read).
// True when a tagged wait that began at t0 must give up (watchdog, or another block failed).
__device__ __noinline__ bool tagged_timeout(const KParams* P, kog_u64 t0, unsigned tag) {
    if (kog_ld_relaxed_s32(P->status + ST_ERROR) != 0) return true;
    if (kog_clock_ns() - t0 > (kog_u64)P->timeout_ns) {
        fail(P, ERR_TIMEOUT, tag);
        return true;
    }
    return false;
}

template <int N>
struct Tagged {  // one thread's pairs of an N-vector: pair k holds elements 2 (tid + k NTHR) + {0, 1}
    static constexpr int N2 = N / 2, NV = (N2 + NTHR - 1) / NTHR;
    static_assert(N % 2 == 0 && NV <= 32, "tagged vector size");
    float2 v[NV];
    __device__ static bool has(int tid, int k) { return tid + k * NTHR < N2; }
};

// Every thread: its pairs of the tagged N-vector at src, once they carry `tag` (all loads of
// a round in flight together; a round re-reads only what was not ready). False on timeout.
template <int N>
__device__ bool gather_tagged(const Ctx& c, Tagged<N>& out, const kog_u64* src, unsigned tag) {
    using T = Tagged<N>;
    unsigned pending = 0;
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (T::has(c.tid, k)) pending |= 1u << k;
    kog_u64 t0 = 0;
    for (int it = 1; pending; ++it) {
        ulonglong2 w[T::NV];
#pragma unroll
        for (int k = 0; k < T::NV; ++k)
            if ((pending >> k) & 1u) w[k] = kog_ld_tagged2(src + 2 * (c.tid + k * NTHR));
#pragma unroll
        for (int k = 0; k < T::NV; ++k)
            if (((pending >> k) & 1u) && kog_tag_of(w[k].x) == tag && kog_tag_of(w[k].y) == tag) {
                out.v[k] = make_float2(kog_value_of(w[k].x), kog_value_of(w[k].y));
                pending &= ~(1u << k);
            }
        if (pending && (it & 63) == 0) {
            if (t0 == 0) t0 = kog_clock_ns();
            else if (tagged_timeout(c.P, t0, tag)) return false;
        }
    }
    return true;
}

// One lane: n values at src[lane + 32 i] once they carry `tag`.
template <int n>
__device__ bool gather_tagged_lane(const Ctx& c, float (&v)[n], const kog_u64* src, unsigned tag) {
    unsigned pending = (1u << n) - 1;
    kog_u64 t0 = 0;
    for (int it = 1; pending; ++it) {
        kog_u64 w[n];
#pragma unroll
        for (int i = 0; i < n; ++i)
            if ((pending >> i) & 1u) w[i] = kog_ld_tagged(src + c.lane + KOG_WAVE * i);
#pragma unroll
        for (int i = 0; i < n; ++i)
            if (((pending >> i) & 1u) && kog_tag_of(w[i]) == tag) {
                v[i] = kog_value_of(w[i]);
                pending &= ~(1u << i);
            }
        if (pending && (it & 63) == 0) {
            if (t0 == 0) t0 = kog_clock_ns();
            else if (tagged_timeout(c.P, t0, tag)) return false;
        }
    }
    return true;
}

// RMSNorm of the residual stream (tagged, or an embedding row at layer 0) into shared memory.
__device__ bool stage_norm(const Ctx& c, float* xs, const kog_u64* src, unsigned tag, const unsigned short* emb_row,
                           const float* w) {
    using T = Tagged<H>;
    T x;
    bool ok = true;
    if (emb_row) {
#pragma unroll
        for (int k = 0; k < T::NV; ++k)
            if (T::has(c.tid, k)) {
                const unsigned e = __ldg(reinterpret_cast<const unsigned*>(emb_row) + c.tid + k * NTHR);
                x.v[k] = make_float2(kog_bf16_lo(e), kog_bf16_hi(e));
            }
    } else {
        ok = gather_tagged<H>(c, x, src, tag);
    }
    float2 g[T::NV];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (T::has(c.tid, k)) {
            g[k] = __ldg(reinterpret_cast<const float2*>(w) + c.tid + k * NTHR);
            ss += x.v[k].x * x.v[k].x + x.v[k].y * x.v[k].y;
        }
    if (!__syncthreads_and(ok)) return false;
    ss = block_sum(c, ss);
    const float s = sqrtf(ss / (float)H + EPS);
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (T::has(c.tid, k))
            reinterpret_cast<float2*>(xs)[c.tid + k * NTHR] = make_float2(x.v[k].x / s * g[k].x, x.v[k].y / s * g[k].y);
    __syncthreads();
    return true;
}

// N floats behind the flags (wait_all first) into shared memory, every load in flight at once.
template <int N>
__device__ void stage_copy_plain(const Ctx& c, float* xs, const float* src) {
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

// A tagged N-vector into shared memory.
template <int N>
__device__ bool stage_copy(const Ctx& c, float* xs, const kog_u64* src, unsigned tag) {
    using T = Tagged<N>;
    T x;
    const bool ok = gather_tagged<N>(c, x, src, tag);
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (T::has(c.tid, k)) reinterpret_cast<float2*>(xs)[c.tid + k * NTHR] = x.v[k];
    return __syncthreads_and(ok);
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
// A block-unit is one kv head over a run of 32-position tiles. Inside it, warp w takes query
// head w % G of the group and tile w / G of each round, so a tile's K/V rows are loaded into
// shared memory once for the G heads that read them; the old tiles' loads are issued before
// waiting for this token's q/k/v (they do not depend on it). Each warp keeps an online
// softmax state; the warps of a head merge in shared memory, and when a kv head spans several
// blocks their partial (max, sum, acc) records meet in global memory, merged by the last one.
__device__ __forceinline__ int att_units_per_head(int ntile, int& tpu) {
    const int want = min((ntile + TBR - 1) / TBR, NBLK / NKV);
    tpu = (ntile + want - 1) / want;  // tiles per block-unit
    return (ntile + tpu - 1) / tpu;   // no empty unit
}

// All threads of the block: cp.async the K/V rows of this round's tiles (older positions only).
__device__ __forceinline__ void att_load_tiles(const Ctx& c, const float* kbase, const float* vbase, int tile0,
                                               int ntiles, int L, float* tiles) {
    const int pos = L - 1;
    for (int q = c.tid; q < ntiles * 32 * (D / 4); q += NTHR) {
        const int k = q / (32 * (D / 4)), rem = q - k * (32 * (D / 4));
        const int r = rem / (D / 4), c4 = rem - r * (D / 4);
        const int p = (tile0 + k) * 32 + r;
        if (p < pos) {  // the new position comes from shared memory (this token's k and v)
            float* kt = tiles + k * TILE_F;
            kog_cp_async16(kt + r * KT + 4 * c4, kbase + (long long)p * D + 4 * c4);
            kog_cp_async16(kt + 32 * KT + r * D + 4 * c4, vbase + (long long)p * D + 4 * c4);
        }
    }
    kog_cp_async_commit();
}

__device__ bool attention(Ctx& c, int l, int pos, unsigned epoch_qkv) {
    const KParams* P = c.P;
    const int L = pos + 1, ntile = (L + 31) / 32;
    int tpu;
    const int nbc = att_units_per_head(ntile, tpu);
    if (c.b >= NKV * nbc) return true;  // block-uniform: this block has no unit
    const int u = c.b, g = u / nbc, bc = u - g * nbc;
    const int t0 = bc * tpu, t1 = min(ntile, t0 + tpu);
    const bool has_new = pos / 32 < t1;  // this unit's last tile holds the new position
    const int lane = c.lane, warp = c.warp;
    const int hq = warp % G, kslot = warp / G;  // this warp's query head and tile slot
    trace_att(c, l, u, 0);

    float* qs = c.sm;          // [G][D] roped queries
    float* ks = qs + G * D;    // [D] this token's k (roped), v
    float* vs = ks + D;
    float* rec = vs + D;       // [NW][D + 2] per-warp (acc, max, sum)
    float* tiles = rec + NW * (D + 2);  // [TBR] x {K [32][KT], V [32][D]}
    int* flag = reinterpret_cast<int*>(tiles + TBR * TILE_F);
    const long long ctx = P->ctx_limit;  // cache positions per (layer, kv head)
    float* kbase = P->kc + ((long long)(l * NKV + g) * ctx) * D;
    float* vbase = P->vc + ((long long)(l * NKV + g) * ctx) * D;
    att_load_tiles(c, kbase, vbase, t0, min(TBR, t1 - t0), L, tiles);

    // this token's q/k/v, straight from the tagged words the QKV phase wrote
    const int q0 = g * G * D, k0 = QD + g * D, v0 = QD + KVD + g * D;
    bool ok = true;
    if (warp < G || (has_new && warp < G + 2)) {  // warp h < G: query head h; G: k; G + 1: v
        const int row0 = warp < G ? q0 + warp * D : (warp == G ? k0 : v0);
        float v[DL], co[DL / 2], si[DL / 2];
        ok = gather_tagged_lane<DL>(c, v, P->qkv + row0, epoch_qkv);
        trace_att(c, l, u, 1);
#pragma unroll
        for (int i = 0; i < DL / 2; ++i)
            co[i] = __ldg(P->rcos + (long long)pos * HALF + lane + 32 * i),
            si[i] = __ldg(P->rsin + (long long)pos * HALF + lane + 32 * i);
        if (warp == G + 1) {
#pragma unroll
            for (int i = 0; i < DL; ++i) {
                vs[lane + 32 * i] = v[i];
                vbase[(long long)pos * D + lane + 32 * i] = v[i];
            }
        } else {
#if KOG_QK_NORM
            const float* normw = P->ws + (long long)l * SSTRIDE + (warp < G ? S_QNORM : S_KNORM);
            float ss = 0.f;
#pragma unroll
            for (int i = 0; i < DL; ++i) ss += v[i] * v[i];
            ss = kog_wave_sum(ss);
            const float rn = sqrtf(ss / (float)D + EPS);
#pragma unroll
            for (int i = 0; i < DL; ++i) v[i] = v[i] / rn * normw[lane + 32 * i];
#endif
            float* out = warp < G ? qs + warp * D : ks;
#pragma unroll
            for (int i = 0; i < DL / 2; ++i) {
                const int d = lane + 32 * i;
                const float x1 = v[i], x2 = v[i + DL / 2];
                out[d] = __fadd_rn(__fmul_rn(x1, co[i]), __fmul_rn(-x2, si[i]));
                out[d + HALF] = __fadd_rn(__fmul_rn(x2, co[i]), __fmul_rn(x1, si[i]));
            }
            if (warp == G) {
                kog_wave_sync();
#pragma unroll
                for (int i = 0; i < DL; ++i) kbase[(long long)pos * D + lane + 32 * i] = ks[lane + 32 * i];
            }
        }
    }
    if (!__syncthreads_and(ok)) return false;
    trace_att(c, l, u, 2);

    float m = -KOG_INF, lsum = 0.f, acc[DL];
#pragma unroll
    for (int i = 0; i < DL; ++i) acc[i] = 0.f;
    const float* q = qs + hq * D;
    for (int r0 = t0; r0 < t1; r0 += TBR) {
        if (r0 != t0) att_load_tiles(c, kbase, vbase, r0, min(TBR, t1 - r0), L, tiles);
        kog_cp_async_wait_all();
        __syncthreads();
        trace_att(c, l, u, 6);
        const int tile = r0 + kslot;
        if (kslot < TBR && tile < t1 && KOG_EXP != 1) {  // warp-uniform
            const int base = tile * 32, nv = min(32, L - base);
            const float* kt = tiles + kslot * TILE_F;
            const float* vt = kt + 32 * KT;
            const bool valid = lane < nv;
            const float* kp = base + lane == pos ? ks : kt + lane * KT;
            float s4[4] = {0.f, 0.f, 0.f, 0.f};  // four partial sums: short dependency chains
            if (valid) {
#pragma unroll
                for (int d4 = 0; d4 < D / 4; ++d4) {
                    const float4 kv = *reinterpret_cast<const float4*>(kp + 4 * d4);
                    const float4 qv = *reinterpret_cast<const float4*>(q + 4 * d4);
                    s4[d4 & 3] = fmaf(kv.x, qv.x, s4[d4 & 3]);
                    s4[d4 & 3] = fmaf(kv.y, qv.y, s4[d4 & 3]);
                    s4[d4 & 3] = fmaf(kv.z, qv.z, s4[d4 & 3]);
                    s4[d4 & 3] = fmaf(kv.w, qv.w, s4[d4 & 3]);
                }
            }
            const float sv = valid ? ((s4[0] + s4[1]) + (s4[2] + s4[3])) * SCALE : -KOG_INF;
            const float mn = fmaxf(m, kog_wave_max(sv));
            const float corr = expf(m - mn);
            const float pe = valid ? expf(sv - mn) : 0.f;
            lsum = lsum * corr + kog_wave_sum(pe);
#pragma unroll
            for (int i = 0; i < DL; ++i) acc[i] *= corr;
            m = mn;
            const int jnew = pos - base;  // the new position's row (when in this tile) is in vs
#pragma unroll
            for (int j = 0; j < 32; ++j) {  // unrolled: the shuffles overlap
                const float w = kog_shfl(pe, j);
                if (j < nv) {
                    const float* vrow = j == jnew ? vs : vt + j * D;
#pragma unroll
                    for (int i = 0; i < DL; ++i) acc[i] = fmaf(w, vrow[lane + 32 * i], acc[i]);
                }
            }
        }
        trace_att(c, l, u, 7);
        __syncthreads();  // the tile buffers are refilled next round
    }
    trace_att(c, l, u, 3);

    // merge the warps of each head (fixed order: deterministic)
#pragma unroll
    for (int i = 0; i < DL; ++i) rec[warp * (D + 2) + lane + 32 * i] = acc[i];
    if (lane == 0) rec[warp * (D + 2) + D] = m, rec[warp * (D + 2) + D + 1] = lsum;
    __syncthreads();
    constexpr int SLOTS = NW / G;  // warps per head
    if (warp < G) {
        const float mw = lane < SLOTS ? rec[(lane * G + warp) * (D + 2) + D] : -KOG_INF;
        const float lw = lane < SLOTS ? rec[(lane * G + warp) * (D + 2) + D + 1] : 0.f;
        const float M = kog_wave_max(mw);
        const float wc = lane < SLOTS && mw > -KOG_INF ? expf(mw - M) : 0.f;
        const float Ls = kog_wave_sum(wc * lw);
        float o[DL];
#pragma unroll
        for (int i = 0; i < DL; ++i) o[i] = 0.f;
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) {
            const float w = kog_shfl(wc, j);
#pragma unroll
            for (int i = 0; i < DL; ++i) o[i] = fmaf(w, rec[(j * G + warp) * (D + 2) + lane + 32 * i], o[i]);
        }
        if (nbc == 1) {
#pragma unroll
            for (int i = 0; i < DL; ++i) kog_st_tagged(P->attn + (g * G + warp) * D + lane + 32 * i, o[i] / Ls, epoch_qkv + 1);
        } else {
            float* pr = P->part + ((long long)(g * MAXCH + bc) * G + warp) * (D + 2);
#pragma unroll
            for (int i = 0; i < DL; ++i) pr[lane + 32 * i] = o[i];
            if (lane == 0) pr[D] = M, pr[D + 1] = Ls;
        }
    }
    if (nbc == 1) {
        trace_att(c, l, u, 5);
        return true;
    }
    // several blocks per kv head: the last to publish merges every block's record
    __syncthreads();
    if (c.tid == 0) {
        kog_fence_acqrel();  // release the block's records (ordered before by the barrier)
        *flag = atomicAdd(P->attn_cnt + g, 1u) == (unsigned)(nbc - 1);
        if (*flag) kog_fence_acqrel();  // acquire the other blocks' records
    }
    __syncthreads();
    trace_att(c, l, u, 4);
    if (*flag && warp < G) {
        const float* ph = P->part + ((long long)(g * MAXCH) * G + warp) * (D + 2);
        constexpr long long CS = (long long)G * (D + 2);  // one block-unit's records
        float o[DL];
#pragma unroll
        for (int i = 0; i < DL; ++i) o[i] = 0.f;
        float M = -KOG_INF, Ls = 0.f;
        for (int j0 = 0; j0 < nbc; j0 += KOG_WAVE) {  // lane = block-unit, a wave of them at a time
            const int j = j0 + lane;
            const float mj = j < nbc ? kog_ldcg(ph + j * CS + D) : -KOG_INF;
            const float lj = j < nbc ? kog_ldcg(ph + j * CS + D + 1) : 0.f;
            const float Mn = fmaxf(M, kog_wave_max(mj));
            const float corr = expf(M - Mn);
            const float wj = j < nbc ? expf(mj - Mn) : 0.f;
            Ls = Ls * corr + kog_wave_sum(wj * lj);
#pragma unroll
            for (int i = 0; i < DL; ++i) o[i] *= corr;
            const int n = min(KOG_WAVE, nbc - j0);
#pragma unroll 8
            for (int jj = 0; jj < n; ++jj) {
                const float w = kog_shfl(wj, jj);
#pragma unroll
                for (int i = 0; i < DL; ++i) o[i] = fmaf(w, kog_ldcg(ph + (j0 + jj) * CS + lane + 32 * i), o[i]);
            }
            M = Mn;
        }
#pragma unroll
        for (int i = 0; i < DL; ++i) kog_st_tagged(P->attn + (g * G + warp) * D + lane + 32 * i, o[i] / Ls, epoch_qkv + 1);
        if (warp == 0 && lane == 0) P->attn_cnt[g] = 0;
    }
    trace_att(c, l, u, 5);
    return true;
}

// ---- one token through the model ---------------------------------------------------------
__device__ bool forward(Ctx& c, int token, int pos, bool greedy, float* xown) {
    const KParams* P = c.P;
    float* xs = c.sm;
    float* red = c.sm + MV_X;
    const int b = c.b;
    const unsigned short* w = P->w;
    for (int l = 0; l < NL; ++l) {
        const float* sl = P->ws + (long long)l * SSTRIDE;
        // --- QKV
        if (l == 0) {
            const unsigned short* emb = w + OFF_EMB + (long long)token * H;
            for (int r = c.tid; r < MO::row0(b + 1) - MO::row0(b); r += NTHR) xown[r] = kog_bf16(emb[MO::row0(b) + r]);
            stage_norm(c, xs, nullptr, 0, emb, sl + S_ATTN_NORM);
        } else {
            if (!stage_norm(c, xs, P->x, c.epoch, nullptr, sl + S_ATTN_NORM)) return false;
            trace_event(c);
        }
        {
            mv_run<MQKV>(c, xs, red);
            __syncthreads();
            const int r0 = MQKV::row0(b), nr = MQKV::row0(b + 1) - r0;
            for (int r = c.tid; r < nr; r += NTHR) {
                float v = mv_result<MQKV>(red, r);
#if KOG_QKV_BIAS
                v += sl[S_BQKV + r0 + r];
#endif
                kog_st_tagged(P->qkv + r0 + r, v, c.epoch + 1);
            }
        }
        end_phase(c);
        const unsigned e_qkv = c.epoch;
        // --- attention (reads only its own kv head's q/k/v)
        const bool att_ok = attention(c, l, pos, e_qkv);
        if (!__syncthreads_and(att_ok)) return false;  // every warp reaches the barrier, failed or not
        end_phase(c);
        // --- O projection + residual
        if (!stage_copy<QD>(c, xs, P->attn, c.epoch)) return false;
        trace_event(c);
        {
            mv_run<MO>(c, xs, red);
            __syncthreads();
            const int r0 = MO::row0(b), nr = MO::row0(b + 1) - r0;
            for (int r = c.tid; r < nr; r += NTHR) {
                xown[r] += mv_result<MO>(red, r);
                kog_st_tagged(P->x + r0 + r, xown[r], c.epoch + 1);
            }
        }
        end_phase(c);
        // --- gate/up + SiLU
        if (!stage_norm(c, xs, P->x, c.epoch, nullptr, sl + S_MLP_NORM)) return false;
        trace_event(c);
        {
            mv_run<MGU>(c, xs, red);
            __syncthreads();
            const int r0 = MGU::row0(b), np = (MGU::row0(b + 1) - r0) / 2;
            for (int j = c.tid; j < np; j += NTHR) {
                const float gt = mv_result<MGU>(red, 2 * j), up = mv_result<MGU>(red, 2 * j + 1);
                const float a = gt / (1.0f + expf(-gt)) * up;
                if (ACT_TAGGED) kog_st_tagged(P->act + r0 / 2 + j, a, c.epoch + 1);
                else reinterpret_cast<float*>(P->act)[r0 / 2 + j] = a;
            }
        }
        if (ACT_TAGGED) end_phase(c);
        else arrive(c);
        // --- down + residual
        if (ACT_TAGGED) {
            if (!stage_copy<INTER>(c, xs, P->act, c.epoch)) return false;
            trace_event(c);
        } else {
            if (!wait_all(c, c.epoch)) return false;
            stage_copy_plain<INTER>(c, xs, reinterpret_cast<const float*>(P->act));
        }
        {
            mv_run<MDN>(c, xs, red);
            __syncthreads();
            const int r0 = MDN::row0(b), nr = MDN::row0(b + 1) - r0;
            for (int r = c.tid; r < nr; r += NTHR) {
                xown[r] += mv_result<MDN>(red, r);
                kog_st_tagged(P->x + r0 + r, xown[r], c.epoch + 1);
            }
        }
        end_phase(c);
    }
    // --- final norm + LM head (+ per-block argmax / sampling keys)
    int cancel = 0;
    if (b == 0 && c.tid == 0) cancel = kog_ld_sys_s32(P->host_cancel);
    if (!stage_norm(c, xs, P->x, c.epoch, nullptr, P->ws + S_FINAL)) return false;
    trace_event(c);
    {
        mv_run<MLM>(c, xs, red);
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
    c.ring = reinterpret_cast<uint4*>(kog_smem + SM_FLOATS) + c.warp * RING * SLOT;
    ring_start(c);  // the first token's weights stream while it is chosen

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
        if (!forward(c, token, pos, greedy, xown)) {
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
    kog_cp_async_wait_all();  // the ring's last prefetches land before the block exits
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
