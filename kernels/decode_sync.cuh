// Part of the decode monokernel (kernels/decode.cu): synchronisation between blocks (flags, tagged words), tracing, staging of input vectors.
// Included by decode.cu after decode_common.cuh (the shape constants and Ctx); not standalone.
#pragma once

// ---- synchronisation ---------------------------------------------------------------------
#ifdef KOG_TRACE  // bench/decode_breakdown.py: when every block passed each wait and arrival of step KOG_TRACE
constexpr int TRACE_EV = 1024;
__device__ kog_u64 kog_trace[TRACE_EV * NBLK];
__device__ long long kog_trace_clk[TRACE_EV];  // block 0's cycle counter at the same events: the SM clock
#endif
#ifdef KOG_TRACE
#ifndef KOG_TRACE_LAYER  // the layer whose attention units, products and refills are traced
#define KOG_TRACE_LAYER (NL / 2)
#endif
__device__ unsigned kog_trace_sm[NBLK];  // the multiprocessor each block runs on
constexpr int TRACE_ATT = 8;  // stamps per attention unit of the traced layer
__device__ kog_u64 kog_trace_att[NBLK * TRACE_ATT];
#endif
// lane 0 of an attention unit's wave: stamp k of unit u (traced layer of the traced step)
__device__ __forceinline__ void trace_att(const Ctx& c, int l, int u, int k) {
#ifdef KOG_TRACE
    if (c.lane == 0 && c.step == KOG_TRACE && l == KOG_TRACE_LAYER) kog_trace_att[u * TRACE_ATT + k] = kog_clock_ns();
#else
    (void)c, (void)l, (void)u, (void)k;
#endif
}
#ifdef KOG_TRACE
// stamps per warp per product of the traced layer, k: 0 entered, 1 refills issued and inputs loaded,
// 2 first granule landed, 3 granules done, 4 block's sums in, 5 results stored, 6 last granule
// landed, 7 its math done, 8 held refills issued (bench/decode_breakdown.py MV_STAMPS names 1-8)
constexpr int TRACE_MV = 9;
__device__ kog_u64 kog_trace_mv[4 * NBLK * NW * TRACE_MV];
// stamps per warp in the traced layer's two RMSNorms (0: the layer input's, 1: gate/up's), k: 0 entered,
// 1 the warp's words in, 2 the block's words in, 3 sum of squares done, 4 staged (NORM_STAMPS in
// bench/decode_breakdown.py)
constexpr int TRACE_NORM = 5;
__device__ kog_u64 kog_trace_norm[2 * NBLK * NW * TRACE_NORM];
// lane 0 of every warp: stamp k of `which` (a product, a norm) in an array of STAMPS per warp
template <int STAMPS>
__device__ __forceinline__ void trace_warp(const Ctx& c, kog_u64* stamps, int which, int k) {
    if (c.lane == 0 && c.step == KOG_TRACE && c.layer == KOG_TRACE_LAYER)
        stamps[((which * NBLK + c.b) * NW + c.warp) * STAMPS + k] = kog_clock_ns();
}
#endif
// stamp k of product `mat` (MAT_QKV .. MAT_DN; the LM head is not traced) of the traced layer of the traced step
__device__ __forceinline__ void trace_mv(const Ctx& c, int mat, int k) {
#ifdef KOG_TRACE
    if (mat < 4) trace_warp<TRACE_MV>(c, kog_trace_mv, mat, k);
#else
    (void)c, (void)mat, (void)k;
#endif
}
// the two RMSNorms of a layer, as trace_norm names them
enum { NORM_UNTRACED = -1, NORM_LAYER_INPUT = 0, NORM_GATE_UP = 1 };
// stamp k of norm `which` (NORM_UNTRACED: none) of the traced layer of the traced step
__device__ __forceinline__ void trace_norm(const Ctx& c, int which, int k) {
#ifdef KOG_TRACE
    if (which >= 0) trace_warp<TRACE_NORM>(c, kog_trace_norm, which, k);
#else
    (void)c, (void)which, (void)k;
#endif
}
#ifdef KOG_TRACE
#ifndef KOG_TRACE_RING  // 0: the refills go unstamped (what those stamps cost the traced products' refills)
#define KOG_TRACE_RING 1
#endif
// refills each warp issues while the traced step runs the traced layer: when, and the warp's
// 16-byte pieces | the matrix << 8 | 1 << 11 for the next layer's (bench/decode_breakdown.py:
// the weight stream's demand, and when each matrix's refills went out)
constexpr int TRACE_RING = 256;
__device__ kog_u64 kog_trace_ring[NBLK * NW * TRACE_RING];
__device__ unsigned short kog_trace_ring_n[NBLK * NW * TRACE_RING];
#endif
__device__ __forceinline__ void trace_ring(Ctx& c, int pieces, int mat, int layer) {
#ifdef KOG_TRACE
    if (KOG_TRACE_RING && c.step == KOG_TRACE && c.layer == KOG_TRACE_LAYER && c.st.traced < TRACE_RING) {  // warp-uniform
        if (c.lane == 0) {
            const int k = (c.b * NW + c.warp) * TRACE_RING + c.st.traced;
            kog_trace_ring[k] = kog_clock_ns();
            kog_trace_ring_n[k] = (unsigned short)(pieces | mat << 8 | (layer != c.layer) << 11);
        }
        ++c.st.traced;
    }
#else
    (void)c, (void)pieces, (void)mat, (void)layer;
#endif
}
__device__ __forceinline__ void trace_sm(const Ctx& c) {
#ifdef KOG_TRACE
    if (c.tid == 0) kog_trace_sm[c.b] = kog_sm_id();
#else
    (void)c;
#endif
}
__device__ __forceinline__ void trace_event(Ctx& c) {
#ifdef KOG_TRACE
    if (c.tid == 0 && c.step == KOG_TRACE && c.ev < TRACE_EV) {
        kog_trace[c.ev * NBLK + c.b] = kog_clock_ns();
        if (c.b == 0) kog_trace_clk[c.ev] = kog_cycles();
    }
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
    for (int it = 0; KOG_EXP != 4; ++it) {
        const uint4 f = kog_ld_relaxed_u4(P->flags + 4 * c.lane);
        const uint4 h = NBLK > 4 * KOG_WAVE ? kog_ld_relaxed_u4(P->flags + 4 * KOG_WAVE + 4 * c.lane) : f;
        const unsigned v[8] = {f.x, f.y, f.z, f.w, h.x, h.y, h.z, h.w};
        bool ok = true;
#pragma unroll
        for (int e = 0; e < 8; ++e) ok &= !((mine >> e) & 1u) || v[e] >= target;
        if (kog_wave_all(ok)) break;
        if (KOG_POLL_NS) kog_sleep_ns(KOG_POLL_NS);
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

// ---- the hop space (decode_common.cuh) --------------------------------------------------------
// The chunks of the block's copy (its own L2 partition's), as each chunk's shift: its chunk j is chunk
// j + kog_hop_shift[j] of P->hop. The two copies' chunks pair up: the other copy's chunk j is the
// neighbour of this one's in their 8 KB (the host maps the hop space so: engine/backends/l2_sides.py).
__shared__ short kog_hop_shift[HOP_COPIES > 1 ? HOP_CHUNKS : 1];
// All threads, once at the start: the map row of this block's multiprocessor.
__device__ __forceinline__ void hop_map_load(const Ctx& c) {
    if (HOP_COPIES == 1) return;
    const unsigned short* row = c.P->hop_map + c.P->sm_side[kog_sm_id() & 255] * HOP_CHUNKS;
    for (int j = c.tid; j < HOP_CHUNKS; j += NTHR) kog_hop_shift[j] = (short)(row[j] - j);
}
// Word v of the hop space (at `hop`: P->hop, loaded once before a poll loop, whose loads' memory clobbers
// would load it again each round), in the copy the block polls.
__device__ __forceinline__ kog_u64* hop_word(kog_u64* hop, int v) {
    if (HOP_COPIES == 1) return hop + v;
    return hop + (v + kog_hop_shift[(unsigned)v / HOP_CHUNK] * HOP_CHUNK);
}
__device__ __forceinline__ kog_u64* hop_word(const Ctx& c, int v) { return hop_word(c.P->hop, v); }
// The same word in the other copy: the paired chunk's.
__device__ __forceinline__ kog_u64* hop_other(kog_u64* p) {
    return reinterpret_cast<kog_u64*>(reinterpret_cast<unsigned long long>(p) ^ (HOP_CHUNK * 8));
}
// Publish a tagged word, found in the block's copy as p, in every copy.
__device__ __forceinline__ void hop_store(kog_u64* p, float x, unsigned tag) {
    kog_st_tagged(p, x, tag);
    if (HOP_COPIES > 1) kog_st_tagged(hop_other(p), x, tag);
}
// Publish word v of a tagged vector, in every copy.
__device__ __forceinline__ void hop_st_tagged(const Ctx& c, int v, float x, unsigned tag) { hop_store(hop_word(c, v), x, tag); }
// Add to summed word v (the summed words below), in every copy: each copy gets every add.
__device__ __forceinline__ void hop_red_add(const Ctx& c, int v, kog_u64 d) {
    kog_u64* const p = hop_word(c, v);
    kog_red_add_u64(p, d);
    if (HOP_COPIES > 1) kog_red_add_u64(hop_other(p), d);
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

struct TagWord {  // how a consumer reads a tagged word
    __device__ static unsigned tag(kog_u64 w) { return kog_tag_of(w); }
    __device__ static float value(kog_u64 w) { return kog_value_of(w); }
    __device__ static void seen(int, kog_u64, int) {}  // (see SumWord)
};

// ---- summed words (DN_SPLIT > 1) ----------------------------------------------------------
// Where down is split by columns, the residual stream as the next layer's norm reads it lives in
// summed words (HV_XSUM in the hop space): each element only ever grows by atomic adds done in L2 -- O's row
// owners add their rows' change, each of down's slices its partial sums. A word holds the number
// of adds so far (top 8 bits, modulo 256) and the sum in fixed point (low 56 bits, two's
// complement, 2^-SUM_FRAC units): integer adds are exact and commute, so the sum does not depend
// on which add lands first (deterministic), and the count tells a consumer the word is complete:
// the data is its own flag again, and the next norm reads down's slices one hop after they end
// (the owners used to gather and add the slices' parts: a hop more; PERF.md v33). A word changes
// only after every block has read its last value (O's adds need every head's attention, which
// needs every block's QKV product), so a count never runs past what a reader waits for.
// Every state of a word (any subset of a layer's adds, landed in any order) must stay inside the
// field, |sum| < 2^(55 - SUM_FRAC) = 2^27, or its count reads wrong and the next norm waits for the
// watchdog: so the stream after O is kept within SUM_X_MAX and a slice's part within SUM_PART_MAX
// (NaN and inf land on a bound: garbage tokens, as before, not a hang). Both lie far above any
// model's residual stream and down's outputs.
constexpr int SUM_FRAC = 28;
constexpr float SUM_X_MAX = 33554432.0f;  // 2^25
constexpr float SUM_PART_MAX = 524288.0f;  // 2^19
static_assert(SUM_X_MAX + 2.0f * DN_SPLIT * SUM_PART_MAX < 134217728.0f, "a word's every state fits its field");
__device__ __forceinline__ long long sum_fixed(float v, float lim) {
    return __float2ll_rn(fminf(fmaxf(v, -lim), lim) * (float)(1 << SUM_FRAC));
}
__device__ __forceinline__ float sum_float(long long v) { return (float)v * (1.0f / (float)(1 << SUM_FRAC)); }
__device__ __forceinline__ kog_u64 sum_add(long long d) { return (1ull << 56) + (kog_u64)d; }  // one add of d
// What a summed word reads after `layers` layers of this launch: O and every slice add once a layer.
__device__ __forceinline__ unsigned sum_tag(int layers) { return (unsigned)(layers * (DN_SPLIT + 1)) & 255u; }
// The block's rows of the residual stream (O's rows) in fixed point, as its last norm read them, a row of
// them a position: O's owners add their change against this value.
__shared__ long long kog_xfix[NPOS][MO::MAXR];
// Element e of NP positions' vectors of n elements each ([position][element]): its position.
template <int n, int NP>
__device__ __forceinline__ int position_of(int e) { return NP == 1 ? 0 : e / n; }
struct SumWord {  // how a consumer reads a summed word
    __device__ static long long fixed(kog_u64 w) { return (long long)(w << 8) >> 8; }
    __device__ static unsigned tag(kog_u64 w) { return (unsigned)((w + (1ull << 55)) >> 56); }
    __device__ static float value(kog_u64 w) { return sum_float(fixed(w)); }
    // element e of the pass's positions' streams was read as w: the block's own rows keep their exact value
    __device__ static void seen(int e, kog_u64 w, int b) {
        const int p = position_of<H, NPOS>(e), r = e - p * H - MO::row0(b);  // (a pass of one position: e < H)
        if (r >= 0 && r < MO::row1(b) - MO::row0(b)) kog_xfix[p][r] = fixed(w);
    }
};

// A word carries the phase a consumer waits for (KOG_EXP 4: any word will do).
template <class W = TagWord>
__device__ __forceinline__ bool tag_ready(kog_u64 w, unsigned tag) { return KOG_EXP == 4 || W::tag(w) == tag; }

// Tagged waits poll with the whole wave: it loops until no lane misses a word, and leaves the loop
// as one. A wave whose lanes leave one by one reconverges after the loop at a cost: a hop ending in
// a barrier takes ~0.1 us longer, and one ending in a warp collective (a wave sum) ~0.4 us longer
// (bench/sync_probe.py, PERF.md session 30).
// After poll round `it` left words missing in the wave: back off (KOG_POLL_NS) and, every 64th
// round, check the watchdog (lane 0; t0: when the wait began, 0 until first checked). False, in
// every lane alike: give up.
__device__ __forceinline__ bool poll_again(const Ctx& c, int it, kog_u64& t0, unsigned tag) {
    if (KOG_POLL_NS) kog_sleep_ns(KOG_POLL_NS);
    if ((it & 63) == 0) {
        bool late = false;
        if (c.lane == 0) {
            if (t0 == 0) t0 = kog_clock_ns();
            else late = tagged_timeout(c.P, t0, tag);
        }
        return !kog_wave_any(late);
    }
    return true;
}

// One tagged word, or two adjacent ones loaded as one (16-byte aligned): their load, and whether all carry `tag`.
__device__ __forceinline__ void load_tagged(kog_u64& w, const kog_u64* p) { w = kog_ld_tagged(p); }
__device__ __forceinline__ void load_tagged(ulonglong2& w, const kog_u64* p) { w = kog_ld_tagged2(p); }
__device__ __forceinline__ bool all_ready(kog_u64 w, unsigned tag) { return tag_ready(w, tag); }
__device__ __forceinline__ bool all_ready(const ulonglong2& w, unsigned tag) { return tag_ready(w.x, tag) && tag_ready(w.y, tag); }

// Every lane of a wave: tagged words loaded ahead from p (already published, as a rule; lanes with
// `has` false have none): if they do not carry `tag` yet, poll them until they do. False on timeout.
template <class Words>
__device__ __forceinline__ bool settle_tagged(const Ctx& c, Words& w, const kog_u64* p, unsigned tag, bool has = true) {
    kog_u64 t0 = 0;
    for (int it = 1; kog_wave_any(has && !all_ready(w, tag)); ++it) {
        if (!poll_again(c, it, t0, tag)) return false;
        if (has && !all_ready(w, tag)) load_tagged(w, p);
    }
    return true;
}

template <int N>
struct Tagged {  // one thread's pairs of an N-vector: pair k holds elements 2 (tid + k NTHR) + {0, 1}
    static constexpr int N2 = N / 2, NV = (N2 + NTHR - 1) / NTHR;
    static_assert(N % 2 == 0 && NV <= 32, "tagged vector size");
    float2 v[NV];
    __device__ static bool has(int tid, int k) { return tid + k * NTHR < N2; }
};

// Every thread: its pairs K0 .. K0 + NK - 1 of the tagged N-vector at hop word src that lie in its first `words`
// words, once they carry `tag` (all loads of a round in flight together; a round re-reads only what was not
// ready), each handed to put(k, e, value): pair k, its first element e. False on timeout.
template <int N, class W, int K0, int NK, class Put>
__device__ bool gather_tagged_run(const Ctx& c, int src, unsigned tag, int words, const Put& put) {
    using T = Tagged<N>;
    unsigned pending = 0;
#pragma unroll
    for (int k = 0; k < NK; ++k)
        if (T::has(c.tid, K0 + k) && (words == N || 2 * (c.tid + (K0 + k) * NTHR) < words)) pending |= 1u << k;
    kog_u64 t0 = 0;
    kog_u64* const hop = c.P->hop;
    for (int it = 1;; ++it) {  // (a wave with nothing to wait for passes one round of no loads)
        ulonglong2 w[NK];
#pragma unroll
        for (int k = 0; k < NK; ++k)
            if ((pending >> k) & 1u) w[k] = kog_ld_tagged2(hop_word(hop, src + 2 * (c.tid + (K0 + k) * NTHR)));
        const auto take = [&](int k) {  // pair K0 + k is ready: its values out
            const int e = 2 * (c.tid + (K0 + k) * NTHR);
            put(K0 + k, e, make_float2(W::value(w[k].x), W::value(w[k].y)));
            W::seen(e, w[k].x, c.b), W::seen(e + 1, w[k].y, c.b);
        };
        // Two words per thread: first one test over both, which needs both loads, then the words'
        // own checks. Without it ptxas put the first word's check between the two loads (Qwen2.5,
        // SmolLM2's act: two round trips per round); with it, nvcc 13 keeps the loads together on
        // the four shapes (bench/sass_audit.py). Three words per thread were together already, and
        // the test there only cost spills.
        constexpr bool FIRST_ALL = NK == 2;
        unsigned stale = 0;
#pragma unroll
        for (int k = 0; k < NK; ++k)
            if (FIRST_ALL && ((pending >> k) & 1u)) stale |= (W::tag(w[k].x) ^ tag) | (W::tag(w[k].y) ^ tag);
        if (KOG_EXP == 4 || (FIRST_ALL && stale == 0)) {
#pragma unroll
            for (int k = 0; k < NK; ++k)
                if ((pending >> k) & 1u) take(k);
            pending = 0;
        } else {
#pragma unroll
            for (int k = 0; k < NK; ++k)
                if (((pending >> k) & 1u) && tag_ready<W>(w[k].x, tag) && tag_ready<W>(w[k].y, tag)) {
                    take(k);
                    pending &= ~(1u << k);
                }
        }
        if (!kog_wave_any(pending)) break;
        if (!poll_again(c, it, t0, tag)) return false;
    }
    return true;
}

// Pairs in flight a thread at most: a longer vector (NPOS positions' rows) is gathered GATHER_PAIRS pairs at a
// time, so that its loads do not crowd the registers (each run after the first mostly finds its words ready:
// one round trip more). The plain decode's vectors take one run on every registry shape (Qwen3-8B's x: 6). The
// drafts' build takes four: fewer of its spills, and both kinds of pass faster than at six (PERF.md session 66).
constexpr int GATHER_PAIRS = KOG_GATHER_PAIRS > 0 ? KOG_GATHER_PAIRS : DRAFTS ? 4 : 6;
template <int N, class W, int RUN, int K0, class Put>
__device__ __forceinline__ bool gather_tagged_from(const Ctx& c, int src, unsigned tag, int words, const Put& put) {
    constexpr int NK = cmin(RUN, Tagged<N>::NV - K0);
    if (!gather_tagged_run<N, W, K0, NK>(c, src, tag, words, put)) return false;
    if constexpr (K0 + NK < Tagged<N>::NV) return gather_tagged_from<N, W, RUN, K0 + NK>(c, src, tag, words, put);
    return true;
}
// Every thread: its pairs of the tagged N-vector at hop word src (of its first `words` words: NP positions'
// rows, of which the pass feeds fewer), once they carry `tag`. False on timeout.
template <int N, class W = TagWord>
__device__ bool gather_tagged(const Ctx& c, Tagged<N>& out, int src, unsigned tag, int words = N) {
    return gather_tagged_from<N, W, GATHER_PAIRS, 0>(c, src, tag, words, [&](int k, int, float2 v) { out.v[k] = v; });
}
// GATHER_TO_XS (the drafts' build, a pass of several positions; 0 turns it off): stage_norm and stage_copy put
// each pair into the product's input region as it lands, so that a thread holds no pairs in registers and takes
// GATHER_TO_XS pairs a run instead of GATHER_PAIRS: a five-position vector of Llama's shape is 14 pairs a thread,
// four runs of four (each a round trip beside the weight stream, PERF.md session 67), two runs at 8 (session 68).
// By shape, eight where the positions' hidden vector takes more than one run of GATHER_PAIRS: where it takes one
// (SmolLM2), passes without a draft lost 3.5% and the real weights' drafted decode 0-1.5% (session 68).
constexpr int GATHER_TO_XS = KOG_GATHER_TO_XS >= 0 ? KOG_GATHER_TO_XS
                             : Tagged<NPOS * H>::NV > GATHER_PAIRS ? 8 : 0;
template <int NP>
__device__ __forceinline__ constexpr bool gathers_to_xs() { return NP > 1 && GATHER_TO_XS > 0; }
// Position p's element e (of n a position) in the product's input region.
template <int n>
__device__ __forceinline__ float2* xs_pair(float* xs, int p, int e) {
    return reinterpret_cast<float2*>(xs + p * MV_X + xs_index(e - p * n));
}
// Whether a thread's pair k of NP positions' N-vectors is one of the pass's (pass_positions).
template <int N, int NP>
__device__ __forceinline__ bool pass_pair(const Ctx& c, int k) {
    return Tagged<NP * N>::has(c.tid, k) && (NP == 1 || 2 * (c.tid + k * NTHR) < pass_positions<NP>(c) * N);
}

// One thread: n values at src[r][STRIDE i] of each of R rows (words of a row in one chunk; the rows anywhere)
// once they carry `tag` (every load of a round in flight together; every lane of the wave calls it, as every
// tagged wait: see poll_again).
template <int n, int STRIDE, int R>
__device__ bool gather_tagged_strided(const Ctx& c, float (&v)[R][n], const kog_u64* const (&src)[R], unsigned tag) {
    static_assert(R * n <= 32, "a pending bit a word");
    unsigned pending = 0xffffffffu >> (32 - R * n);
    kog_u64 t0 = 0;
    for (int it = 1;; ++it) {
        kog_u64 w[R][n];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < n; ++i)
                if ((pending >> (r * n + i)) & 1u) w[r][i] = kog_ld_tagged(src[r] + STRIDE * i);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < n; ++i)
                if (((pending >> (r * n + i)) & 1u) && tag_ready(w[r][i], tag)) {
                    v[r][i] = kog_value_of(w[r][i]);
                    pending &= ~(1u << (r * n + i));
                }
        if (!kog_wave_any(pending)) break;
        if (!poll_again(c, it, t0, tag)) return false;
    }
    return true;
}

// One lane: n values at src[r][lane + 32 i] of each of R rows once they carry `tag`.
template <int n, int R>
__device__ __forceinline__ bool gather_tagged_lane(const Ctx& c, float (&v)[R][n], const kog_u64* const (&src)[R], unsigned tag) {
    const kog_u64* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = src[r] + c.lane;
    return gather_tagged_strided<n, KOG_WAVE, R>(c, v, rows, tag);
}
template <int n>
__device__ __forceinline__ bool gather_tagged_lane(const Ctx& c, float (&v)[n], const kog_u64* src, unsigned tag) {
    const kog_u64* const rows[1] = {src};
    return gather_tagged_lane<n, 1>(c, reinterpret_cast<float (&)[1][n]>(v), rows, tag);
}

// RMSNorm of the residual stream (tagged or summed words W at hop word src: NP positions' rows, or the
// embedding rows of the pass's tokens at layer 0) into shared memory (position p's in the split layout of
// xs_index at xs + p MV_X); `traced` names it for trace_norm.
template <int NP, class W = TagWord>
__device__ bool stage_norm(const Ctx& c, float* xs, int src, unsigned tag, const int* tokens, const float* w,
                           int traced = NORM_UNTRACED) {
    using T = Tagged<NP * H>;
    constexpr bool IN_XS = gathers_to_xs<NP>();
    T x;
    float ss[NP];  // the positions' sums of squares: from the gather on where it adds them (IN_XS), else after it
    if constexpr (IN_XS) {
#pragma unroll
        for (int p = 0; p < NP; ++p) ss[p] = 0.f;
    }
    const auto put_in_xs = [&](int, int e, float2 v) {  // (IN_XS) the pair in place, its square in its position's sum
        const int p = position_of<H, NP>(e);
        *xs_pair<H>(xs, p, e) = v;
        const float s2 = v.x * v.x + v.y * v.y;
#pragma unroll
        for (int q = 0; q < NP; ++q) ss[q] += q == p ? s2 : 0.f;
    };
    bool ok = true;
    // the words gathered: the pass's positions' (KOG_EXP 18: its first position's only, garbage tokens)
    const int words = (KOG_EXP == 18 ? 1 : pass_positions<NP>(c)) * H;
    trace_norm(c, traced, 0);
    if (tokens) {
#pragma unroll
        for (int k = 0; k < T::NV; ++k)
            if (pass_pair<H, NP>(c, k)) {
                const int e = 2 * (c.tid + k * NTHR), p = position_of<H, NP>(e);
                const unsigned short* const row = c.P->w + OFF_EMB + (long long)tokens[p] * H;
                const unsigned v = __ldg(reinterpret_cast<const unsigned*>(row + e - p * H));
                if constexpr (IN_XS) put_in_xs(k, e, make_float2(kog_bf16_lo(v), kog_bf16_hi(v)));
                else x.v[k] = make_float2(kog_bf16_lo(v), kog_bf16_hi(v));
            }
    } else if constexpr (IN_XS) {
        ok = gather_tagged_from<NP * H, W, GATHER_TO_XS, 0>(c, src, tag, words, put_in_xs);
    } else {
        ok = gather_tagged<NP * H, W>(c, x, src, tag, words);
    }
    trace_norm(c, traced, 1);
    float2 g[T::NV];
    if constexpr (!IN_XS) {
#pragma unroll
        for (int p = 0; p < NP; ++p) ss[p] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (pass_pair<H, NP>(c, k)) {
            const int e = 2 * (c.tid + k * NTHR), p = position_of<H, NP>(e);
            g[k] = __ldg(reinterpret_cast<const float2*>(w + e - p * H));
            if constexpr (!IN_XS) {
                const float s2 = x.v[k].x * x.v[k].x + x.v[k].y * x.v[k].y;
#pragma unroll
                for (int q = 0; q < NP; ++q) ss[q] += q == p ? s2 : 0.f;
            }
        }
    // the wave sums before the barrier: the wave left its poll loop as one (PERF.md session 30)
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        if (p >= pass_positions<NP>(c)) break;  // (block-uniform)
        ss[p] = kog_wave_sum(ss[p]);
        if (c.lane == 0) c.red16[p * NW + c.warp] = ss[p];
    }
    if (!__syncthreads_and(ok)) return false;
    trace_norm(c, traced, 2);
    float r[NP] = {};
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        if (p >= pass_positions<NP>(c)) break;  // (block-uniform)
        float sp = 0.f;
#pragma unroll
        for (int i = 0; i < NW; ++i) sp += c.red16[p * NW + i];  // (the staging barrier below guards red16's reuse)
        // one reciprocal square root and a multiply an element (as transformers does), not a square root
        // and a division: they sit between the input's arrival and the product (PERF.md v36)
        r[p] = rsqrtf(sp / (float)H + EPS);
    }
    trace_norm(c, traced, 3);
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (pass_pair<H, NP>(c, k)) {
            const int e = 2 * (c.tid + k * NTHR), p = position_of<H, NP>(e);
            float rp = r[0];
#pragma unroll
            for (int q = 1; q < NP; ++q) rp = q == p ? r[q] : rp;
            const float2 v = IN_XS ? *xs_pair<H>(xs, p, e) : x.v[k];  // (IN_XS: this thread's own store)
            *xs_pair<H>(xs, p, e) = make_float2(v.x * rp * g[k].x, v.y * rp * g[k].y);
        }
    __syncthreads();
    trace_norm(c, traced, 4);
    return true;
}

// NP positions' tagged N-vectors (at hop word src, [position][element]) into shared memory (position p's in
// the split layout at xs + p MV_X).
template <int N, int NP>
__device__ bool stage_copy(const Ctx& c, float* xs, int src, unsigned tag) {
    if constexpr (gathers_to_xs<NP>()) {
        const bool ok = gather_tagged_from<NP * N, TagWord, GATHER_TO_XS, 0>(
            c, src, tag, pass_positions<NP>(c) * N, [&](int, int e, float2 v) { *xs_pair<N>(xs, position_of<N, NP>(e), e) = v; });
        return __syncthreads_and(ok);
    }
    using T = Tagged<NP * N>;
    T x;
    const bool ok = gather_tagged<NP * N>(c, x, src, tag, pass_positions<NP>(c) * N);
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (pass_pair<N, NP>(c, k)) {
            const int e = 2 * (c.tid + k * NTHR), p = position_of<N, NP>(e);
            *xs_pair<N>(xs, p, e) = x.v[k];
        }
    return __syncthreads_and(ok);
}
