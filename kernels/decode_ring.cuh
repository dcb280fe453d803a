// Part of the decode monokernel (kernels/decode.cu): the weight ring and the matrix-vector products it feeds.
// Included by decode.cu after decode_common.cuh (the shape constants and Ctx); not standalone.
#pragma once

// ---- the weight ring ---------------------------------------------------------------------
// Each warp streams its granules of every matrix, in the order the forward pass consumes them
// (per layer QKV, O, gate/up, down; then the LM head; then layer 0 of the next token), through
// RING shared-memory slots with cp.async: RING granules stay in flight at all times, across
// phase boundaries and waits (weights do not depend on activations), so HBM keeps streaming
// into a phase's wait for its input. A slot is refilled only when a product empties it, so
// the ring covers ~3 us of a wait; the big shapes' attention and hops wait ~12 us per layer,
// where the stash below adds a few more granules per warp, paced (weights issued in bulk inside
// those waits slow their round trips more than they save: PERF.md sessions 14, 19). Each lane
// copies and later reads only its own 16-byte pieces, so a slot needs no barrier, only the
// lane's own cp.async.wait_group.

// KOG_EXP 12 (timing only, garbage weights): the weights stream from kog_side_w, laid out by L2 partition. A block
// pair's tiles of a matrix share a region of 8 KB pairs of chunks (source_of: `tile` holds the region's address
// and the block's partition), each block taking its own partition's chunk of every pair; granule g of the tile
// lies in chunk g / n, place g % n, where n of them fit a chunk. The lane's first piece of granule g.
#if KOG_EXP == 12
__device__ __forceinline__ const uint4* side_granule(const Ctx& c, int g) {
    const int sh = side_shift(c.st.src.u);
    const unsigned long long t = reinterpret_cast<unsigned long long>(c.st.src.tile);
    const unsigned long long pair = (t & ~8191ull) + ((unsigned long long)(g >> sh) << 13);
    const unsigned first = ((unsigned)__popcll(pair & kog_side_mask) & 1u) ^ kog_side_flip;
    return reinterpret_cast<const uint4*>(pair + ((first ^ (unsigned)(t >> 12 & 1)) << 12)) + (g & ((1 << sh) - 1)) * c.st.src.u * KOG_WAVE
           + c.lane;
}
#define KOG_STREAM_W(c) reinterpret_cast<const unsigned short*>(kog_side_w)
#else
#define KOG_STREAM_W(c) ((c).P->w)
#endif

// A stream moves on to the warp's first granule of the next matrix in forward order.
__device__ __forceinline__ void next_matrix(Stream& s, const unsigned short* w, int b, int warp) {
    if (KOG_EXP == 10) s.mat = MAT_LM;  // timing only: the layers' weights stand resident (mv_run)
    else if (s.mat == MAT_LM) s.mat = MAT_QKV, s.layer = 0;
    else if (s.mat == MAT_DN && s.layer == NL - 1) s.mat = MAT_LM;
    else if (s.mat == MAT_DN) s.mat = MAT_QKV, ++s.layer;
    else ++s.mat;
    s.src = stream_source(s.mat, s.layer, w, b, warp, s.lm8);
    s.g = warp;
}

// The stream on its next granule: past a matrix's last one, on the next matrix's first. Never
// ends: every warp has LM head granules.
__device__ __forceinline__ void stream_settle(Ctx& c) {
    while (c.st.g >= c.st.src.ngran) next_matrix(c.st, KOG_STREAM_W(c), c.b, c.warp);
}

// KOG_EXP 8 (timing only; 9: gate/up and down only): a layer matrix's granule copies only its first
// three quarters of vectors (i * 32 + lane < 24 u: vectors 0 .. 3u/4 - 1 whole, then the first lanes' of the next), as many bytes
// as 12-bit weights would fill it with (bench/coded_probe.py), in whole 32-byte sectors.
// Its products also decode every 16-byte vector as 12-bit weights would be decoded (two words of low
// bytes and one of codes into a bf16 vector: bench/coded_probe.py's decode8, `add` form), so that the
// timing carries that math too.
__device__ __forceinline__ constexpr bool coded_for_timing(int mat) {
    return (KOG_EXP == 8 && mat != MAT_LM) || (KOG_EXP == 9 && (mat == MAT_GU || mat == MAT_DN));
}
__device__ __forceinline__ bool copies_three_quarters(const Stream& s, int i, int lane) {
    return !coded_for_timing(s.mat) || i * KOG_WAVE + lane < 24 * s.src.u;
}
__device__ __forceinline__ uint4 decode_as_12bit(uint4 v, unsigned base4) {
    const unsigned sa = v.z & 0x87878787u, ob = (v.z >> 4) & 0x07070707u, sb = (v.z << 4) & 0x80808080u;
    const unsigned ha = sa + base4, hb = ob + sb + base4;
    return make_uint4(__byte_perm(v.x, ha, 0x5140), __byte_perm(v.x, ha, 0x7362), __byte_perm(v.y, hb, 0x5140),
                      __byte_perm(v.y, hb, 0x7362));
}

// An MMA granule (Mv::MMA): the warp's i-th of M's is granule `chunk` of strip `seg` of 16-row tile `tile`.
struct MmaGranule {
    int tile, seg, chunk;  // rows 16 tile .. 16 tile + 15, columns 64 mma_col(m) .. + 63 of the block's
};
template <class M>
__device__ __forceinline__ MmaGranule mma_granule(int i, int warp) {
    if constexpr (M::NCH % M::NSEG == 0) {
        const int strip = i / M::CH * NW + warp, tile = strip / M::NSEG;
        return {tile, strip - tile * M::NSEG, i % M::CH};
    } else {  // uneven strips: the warp's are all of seg warp % NSEG, of CH or CH + 1 granules (constant divisors)
        const int len = M::strip_len(warp), j = len == M::CH ? i / M::CH : i / (M::CH + 1);
        return {(j * NW + warp) / M::NSEG, warp % M::NSEG, i - j * len};
    }
}
template <class M>
__device__ __forceinline__ int mma_col(const MmaGranule& m) {  // the granule's column of 64 in its row's
    if constexpr (M::NCH % M::NSEG == 0) return m.seg * M::CH + m.chunk;
    return M::seg_col(m.seg) + m.chunk;
}
// Where 16-byte vector v (of 8) of row r (of 16) of an MMA granule lies in its slot: a row's vectors are permuted
// by the row, so that the eight rows' reads of one column of vectors (mma_granule_product) meet no bank twice.
__device__ __forceinline__ int mma_slot_index(int r, int v) { return r * 8 + (v ^ (r & 7)); }
// Issue the warp's next granule of M (Mv::MMA) into `slot`: 16 rows of 128 bytes (past the block's rows: its last
// row again, from L2).
template <class M>
__device__ __forceinline__ void stream_next_mma(Ctx& c, uint4* slot) {
    Stream& s = c.st;
    const MmaGranule m = mma_granule<M>(s.g / NW, c.warp);
    const int last = M::row1(c.b) - M::row0(c.b) - 1;
    const uint4* const src = s.src.tile + mma_col<M>(m) * 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = i * KOG_WAVE + c.lane, r = j >> 3, v = j & 7;
        kog_cp_async16_evict_first(slot + mma_slot_index(r, v), src + (size_t)min(16 * m.tile + r, last) * M::ROWV + v, c.l2_policy);
    }
    commit_group(c);
    trace_ring(c, 4 * KOG_WAVE, s.mat, s.layer);
    s.g += NW;
}

// Issue the warp's next granule of the stream into `slot` (one commit group per granule).
// pad: a partial granule's unused columns get zeros (the stash's slots hold stale floats there,
// the ring's only weights: ring_start).
__device__ __forceinline__ void stream_next(Ctx& c, uint4* slot, bool pad = false) {
    stream_settle(c);
    Stream& s = c.st;
    if (MLM::MMA && s.mat == MAT_LM && !(LM_SCREEN && s.lm8)) return stream_next_mma<MLM>(c, slot);
    if (MGU::MMA && s.mat == MAT_GU) return stream_next_mma<MGU>(c, slot);
    if (MDN::MMA && s.mat == MAT_DN) return stream_next_mma<MDN>(c, slot);
    const int row = s.src.nseg == 1 ? s.g : (int)__umulhi((unsigned)s.g, s.src.nseg_inv);  // no division
    const int seg = s.g - row * s.src.nseg;
    const int col0 = seg * KOG_WAVE * s.src.u + c.lane;
    // (rows `kv` vectors apart but down's where its slices lie in the layout's longer rows: DN_LAYOUT)
    const int rowv = DN_LAYOUT != DN_SPLIT && s.mat == MAT_DN ? MDN::ROWV : s.src.kv;
    const uint4* src = s.src.tile + (size_t)row * rowv + col0;
#if KOG_EXP == 12
    src = side_granule(c, s.g);
#endif
#pragma unroll
    for (int i = 0; i < SLOT / KOG_WAVE; ++i)
        if (KOG_EXP != 2 && i < s.src.u && col0 + i * KOG_WAVE < s.src.kv && copies_three_quarters(s, i, c.lane)) {
            if (KOG_EXP == 3) kog_cp_async16(slot + i * KOG_WAVE + c.lane, src + i * KOG_WAVE);
            else kog_cp_async16_evict_first(slot + i * KOG_WAVE + c.lane, src + i * KOG_WAVE, c.l2_policy);
        } else if (pad) {
            slot[i * KOG_WAVE + c.lane] = make_uint4(0u, 0u, 0u, 0u);
        }
    commit_group(c);
    trace_ring(c, min(KOG_WAVE * s.src.u, s.src.kv - seg * KOG_WAVE * s.src.u), s.mat, s.layer);
    s.g += NW;
}

// Issue the warp's next granule into the ring slot freed last.
__device__ __forceinline__ void ring_issue(Ctx& c) {
    stream_next(c, c.ring + (c.st.head % RING) * SLOT);
    ++c.st.head;
}

// STASH: where HBM would idle until the next big product (the attention and its hops before
// gate/up, ~8 us a layer on the big shapes; gate/up's last blocks and the act hop before down,
// ~3.5 us: PERF.md sessions 14, 19), each warp issues its next STASH granules of that product
// (past those already in its ring) into its stash slots. Weights in flight lengthen every L2
// round trip of the chain meanwhile (session 16: ~0.2 us at 22 KB a block, ~0.5 at 44 KB, ~1.4 at
// the ring's 96 KB), so a `paced` warp keeps at most STASH_PACE of them in flight (its wait
// covers the ring's older refills too: groups complete in order); a block that stashes right
// before its next step (the O hop, after the attention blocks' O rows) issues them at once. The
// product takes the stash in stream order (mv_run).
__device__ __forceinline__ uint4* stash_slot(const Ctx& c, int i) {
    if (STASH_XS && i == STASH)  // gate/up's extra granule, in a gap of the input region
        return reinterpret_cast<uint4*>(c.sm + (c.warp < XS_GAP_A ? XS_GAP0 + c.warp * XS_SLOT_F
                                                                  : XHALF + XS_GAP0 + (c.warp - XS_GAP_A) * XS_SLOT_F));
    return reinterpret_cast<uint4*>(c.sm + STASH_AT) + (c.warp * STASH + i) * SLOT;
}
template <int MAT>
__device__ __forceinline__ void stash_fill(Ctx& c, bool paced) {
    stream_settle(c);  // the ring may have ended on a matrix's last granule
    Stream& s = c.st;
    s.stash_g0 = s.g;
    constexpr int N = STASH + (MAT == MAT_GU ? STASH_XS : 0);
    s.stash_n = s.mat == MAT && s.layer == c.layer ? min(N, (s.src.ngran - s.g + NW - 1) / NW) : 0;
    for (int i = 0; i < s.stash_n; ++i) {
        if (paced && i >= STASH_PACE) kog_cp_async_wait_pending<STASH_PACE - 1>();
        stream_next(c, stash_slot(c, i), true);
    }
    s.stash_group = s.groups;
}

__device__ void ring_start(Ctx& c) {
    // zeros first: a partial granule's unused columns are then finite weights (stale or zero),
    // which mv_run reads with zero inputs instead of branching around them. (LM_SCREEN's int8 bytes
    // read as bf16 can be inf or NaN: on the shapes it runs, full granules refill every slot after
    // the LM head before any partial one reads it; a shape where that fails needs its partial
    // granules padded, PERF.md session 35.)
    for (int i = c.lane; i < RING * SLOT; i += KOG_WAVE) c.ring[i] = make_uint4(0u, 0u, 0u, 0u);
    c.l2_policy = kog_l2_evict_first();
    c.st.mat = MAT_QKV, c.st.layer = 0, c.st.g = c.warp, c.st.head = 0, c.st.tail = 0, c.st.held = 0, c.st.groups = 0;
    c.st.stash_g0 = 0, c.st.stash_n = 0, c.st.stash_group = 0;
#ifdef KOG_TRACE
    c.st.traced = 0;
#endif
    c.st.lm8 = screens_lm_head(c.P);
    if (KOG_EXP == 10) c.st.mat = MAT_LM;
    c.st.src = stream_source(c.st.mat, 0, KOG_STREAM_W(c), c.b, c.warp, c.st.lm8);
    for (int i = 0; i < RING; ++i) ring_issue(c);
}

// HOLD: issue the refills a phase's end held back.
__device__ __forceinline__ void ring_release(Ctx& c) {
    for (; HOLD && c.st.held; --c.st.held) ring_issue(c);
}

// KOG_RELEASE_CLOCK (timing experiments, bench/decode_breakdown.py `release-clock`): per product QKV .. down,
// the cycles warps spend in its start's ring_release, the releases and the refills they issue, summed
// over the launch -- untraced, unlike the trace's "held refills issued" stamp. Each warp keeps its own
// 32-bit sums in shared memory with plain adds (64-bit shared atomics are compare-and-swap loops that
// cost the build ~20%: PERF.md session 44), added into kog_release_clk once a launch.
#ifdef KOG_RELEASE_CLOCK
constexpr int RCLK_WORDS = 3 * MAT_LM;  // (cycles, releases, refills) of each product QKV .. down
__device__ kog_u64 kog_release_clk[RCLK_WORDS];
__shared__ unsigned kog_release_sm[NW * RCLK_WORDS];
#endif
__device__ __forceinline__ void release_clock_start(const Ctx& c) {
#ifdef KOG_RELEASE_CLOCK
    for (int i = c.tid; i < NW * RCLK_WORDS; i += NTHR) kog_release_sm[i] = 0u;
#else
    (void)c;
#endif
}
template <int MAT>
__device__ __forceinline__ void ring_release_timed(Ctx& c) {
#ifdef KOG_RELEASE_CLOCK
    const unsigned t0 = (unsigned)clock();
    const unsigned held = c.st.held;
    ring_release(c);
    if (MAT < MAT_LM && c.lane == 0) {
        unsigned* s = kog_release_sm + c.warp * RCLK_WORDS + 3 * MAT;
        s[0] += (unsigned)clock() - t0, s[1] += 1u, s[2] += held;
    }
#else
    ring_release(c);
#endif
}
__device__ __forceinline__ void release_clock_flush(const Ctx& c) {  // all threads, at the launch's end
#ifdef KOG_RELEASE_CLOCK
    __syncthreads();
    if (c.tid < RCLK_WORDS) {
        kog_u64 sum = 0;
        for (int w = 0; w < NW; ++w) sum += kog_release_sm[w * RCLK_WORDS + c.tid];
        atomicAdd(kog_release_clk + c.tid, sum);
    }
#else
    (void)c;
#endif
}

// One MMA granule (Mv::MMA; the warp's g-th of mv_run) times the pass's positions' inputs on the tensor cores: the
// granule's 16 rows are A, the positions' 64 inputs B (a position a column), in four products of 16 columns. Lane
// 4 q + t takes the columns 4t .. 4t + 3 of each 16 for A's and B's columns 2t, 2t + 1, 2t + 8, 2t + 9 (the sum
// over the 16 is the same): rows q and q + 8 of A in one 8-byte read each, position q's four inputs in one 16-byte
// read. The inputs are fp32, so each is split into bf16 hi + lo (hi: x rounded, lo: x - hi rounded; hi + lo lies
// within 2^-17 of x), two products summed in fp32; the strip's last granule stores its 16 rows' sums in red.
template <class M, int NP>
__device__ __forceinline__ void mma_granule_product(const Ctx& c, const uint4* slot, int g, const float* xs, float* red,
                                                    float (&hi)[4], float (&lo)[4]) {
    const int q = c.lane >> 2, t = c.lane & 3, npos = pass_positions<NP>(c);
    const MmaGranule m = mma_granule<M>(g / NW, c.warp);
    const uint2* const w2 = reinterpret_cast<const uint2*>(slot);
    const float* const xq = xs + q * MV_X;
    const int e0 = mma_col<M>(m) * 64 + 4 * t;  // this lane's first input of the granule
    kog_wave_sync();  // every lane has waited for its own copies; the reads below cross lanes
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
        const int v = 2 * kt + (t >> 1);
        const uint2 ra = w2[2 * mma_slot_index(q, v) + (t & 1)], rb = w2[2 * mma_slot_index(q + 8, v) + (t & 1)];
        const unsigned a[4] = {ra.x, rb.x, ra.y, rb.y};
        unsigned bh0 = 0u, bh1 = 0u, bl0 = 0u, bl1 = 0u;
        if (q < npos) {
            const float4 x = *reinterpret_cast<const float4*>(xq + xs_index(e0 + 16 * kt));
            bh0 = kog_bf16x2_rn(x.x, x.y), bh1 = kog_bf16x2_rn(x.z, x.w);
            bl0 = kog_bf16x2_rn(x.x - kog_bf16_lo(bh0), x.y - kog_bf16_hi(bh0));
            bl1 = kog_bf16x2_rn(x.z - kog_bf16_lo(bh1), x.w - kog_bf16_hi(bh1));
        }
        kog_mma_bf16(hi, a, bh0, bh1);
        kog_mma_bf16(lo, a, bl0, bl1);
    }
    if (m.chunk == M::strip_len(c.warp) - 1) {  // the strip's last granule
        const int nr = M::row1(c.b) - M::row0(c.b);
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // (row q + 8 (k / 2), position 2t + k % 2)
            const int r = 16 * m.tile + q + 8 * (k >> 1), p = 2 * t + (k & 1);
            if (p < npos && r < nr) red[p * MV_RED + r * M::NSEG + m.seg] = hi[k] + lo[k];
            hi[k] = lo[k] = 0.f;
        }
    }
}

// One MMA granule (as mma_granule_product) times one position's input in FMAs (a pass without a draft,
// KOG_MMA_ONE_FMA): the tensor cores would spend two chains of eight products a granule on one column of B. Lane
// 2r + h takes row r's vectors 4h .. 4h + 3 (a quarter warp's eight reads meet no bank twice), its neighbour's half
// by one shuffle; the row's sum over the strip builds up in `acc` and the strip's last granule stores it in red.
template <class M>
__device__ __forceinline__ void fma_granule_product(const Ctx& c, const uint4* slot, int g, const float* xs, float* red,
                                                    float& acc) {
    const int r = c.lane >> 1, h = c.lane & 1;
    const MmaGranule m = mma_granule<M>(g / NW, c.warp);
    const int col0 = mma_col<M>(m) * 8 + 4 * h;  // this lane's first 16-byte weight vector's column
    kog_wave_sync();  // every lane has waited for its own copies; the reads below cross lanes
    uint4 wv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) wv[i] = slot[mma_slot_index(r, 4 * h + i)];
    float d[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = dot8(wv[i], xs_lo(xs, col0 + i), xs_hi(xs, col0 + i));
    acc += (d[0] + d[1]) + (d[2] + d[3]);
    if (m.chunk == M::strip_len(c.warp) - 1) {  // the strip's last granule
        const float sum = acc + kog_shfl_xor(acc, 1);
        const int row = 16 * m.tile + r, nr = M::row1(c.b) - M::row0(c.b);
        if (h == 0 && row < nr) red[row * M::NSEG + m.seg] = sum;
        acc = 0.f;
    }
}

// The block's rows of matrix M times xs (shared memory) -> per-granule sums in red: each warp
// takes granules warp, warp + NW, ... from the ring, refilling it as it goes. Where NW is a
// multiple of the segments per row, every granule of a warp covers the same K-segment, so each
// lane keeps its 8U inputs in registers for the whole product: shared memory then serves only
// the weights (per 16-byte weight vector, 16 bytes read instead of 48), which is what bounds
// how fast a warp empties its ring slots.
// M::INT8 (the LM head's int8 rows, LM_SCREEN): each lane holds its inputs as 16-bit fixed point
// (quantize_x4 with 1 / s_x = inv_sx), and a granule's sum is exact integer math until it is
// written to red as a float.
// M::MMA (the drafts' build, KOG_MMA): granules of 16 rows, on the tensor cores (mma_granule_product); a pass
// without a draft multiplies them in FMAs (fma_granule_product, KOG_MMA_ONE_FMA).
// NP > 1 (a pass's code built for NP positions, decode.cu): position p's input at xs + p MV_X, its sums at
// red + p MV_RED, for the pass's c.npos positions; the inputs are read from shared memory (NP positions' inputs
// would not fit the registers: the LM head's five in registers lost 2x, PERF.md session 64).
// CHUNK > 0 (the LM head where its sums are chunked, LM_CHUNK): only granules g0 .. g0 + CHUNK - 1, their sums at
// red + g - g0.
template <class M, int MAT, int NP, int CHUNK = 0>  // MAT: which of the stream's matrices M is (MAT_QKV .. MAT_LM)
__device__ __forceinline__ void mv_run(Ctx& c, const float* xs, float* red, float inv_sx = 0.f, int g0 = 0) {
    // KOG_EXP 10 (timing only, garbage tokens): a layer product reads the warp's first ring slot as it
    // stands, with no wait, refill or release: what a layer whose weights were resident would cost
    // (KOG_PRODUCT_WARPS: its granules over that many warps only)
    constexpr bool RESIDENT = KOG_EXP == 10 && MAT != MAT_LM;
    constexpr int NWP = RESIDENT && KOG_PRODUCT_WARPS > 0 ? KOG_PRODUCT_WARPS : NW;
    static_assert(KOG_PRODUCT_WARPS == 0 || (KOG_EXP == 10 && !STASH && KOG_PRODUCT_WARPS <= NW),
                  "KOG_PRODUCT_WARPS: with resident layer weights (KOG_EXP 10) and no stash only");
    constexpr bool X_IN_REGS = !M::MMA && NWP % M::NSEG == 0 && (NP == 1 || M::INT8);  // (int8 rows: LM_SCREEN, one position)
    static_assert(X_IN_REGS || !M::INT8, "int8 rows read their inputs from registers only");
    static_assert(CHUNK == 0 || (!M::MMA && !M::INT8 && !M::LANE_SUMS && CHUNK % NW == 0), "a chunk: whole rounds of FMA granules");
    const int ngran = CHUNK ? min(g0 + CHUNK, mv_ngran<M>(c.b, c.warp)) : NWP == NW || c.warp < NWP ? mv_ngran<M>(c.b, c.warp) : 0;
    constexpr bool STASHED = STASH && (MAT == MAT_GU || (STASH_DN && MAT == MAT_DN));
    trace_mv(c, MAT, 0);
    if (STASHED && c.st.stash_n) kog_cp_async_wait_pending_dyn(c.st.groups - c.st.stash_group);  // the stash has landed
    if (!RESIDENT) ring_release_timed<MAT>(c);  // the input is staged: refill now
    trace_mv(c, MAT, 8);
    constexpr int UF = M::INT8 ? 1 : M::U, UI = M::INT8 ? M::U : 1;  // the arrays a product does not use: 1
#if KOG_EXP == 8 || KOG_EXP == 9
    const unsigned base4 = 0x34343434u + (unsigned)(c.b >> 16);  // a window's base in every byte: in a register, not a constant
#endif
    float4 xa[UF], xb[UF];
    uint4 xh[UI], xl[UI];  // M::INT8: inputs 16 col .. 16 col + 15, their h and l bytes
    if (X_IN_REGS) {
        const int seg = c.warp % M::NSEG;
#pragma unroll
        for (int i = 0; i < M::U; ++i) {
            const int col = seg * M::SEGW + i * KOG_WAVE + c.lane;
            const bool in = M::FULL || col < M::KV;
            const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
            if constexpr (M::INT8) {
                const int c8 = M::ROWS8 == 1 ? col : col % M::KV8;  // the vector's column in its int8 row
                const float4 x[4] = {in ? xs_lo(xs, 2 * c8) : zero, in ? xs_hi(xs, 2 * c8) : zero,
                                     in ? xs_lo(xs, 2 * c8 + 1) : zero, in ? xs_hi(xs, 2 * c8 + 1) : zero};
                quantize_x4(x[0], inv_sx, xh[i].x, xl[i].x);
                quantize_x4(x[1], inv_sx, xh[i].y, xl[i].y);
                quantize_x4(x[2], inv_sx, xh[i].z, xl[i].z);
                quantize_x4(x[3], inv_sx, xh[i].w, xl[i].w);
            } else {
                xa[i] = in ? xs_lo(xs, col) : zero;
                xb[i] = in ? xs_hi(xs, col) : zero;
            }
        }
    }
    trace_mv(c, MAT, 1);
    float mma_hi[4] = {}, mma_lo[4] = {};  // M::MMA: the warp's strip's sums so far
    for (int g = (CHUNK ? g0 : 0) + c.warp; g < ngran; g += NWP) {
        // the stash holds granules stash_g0, stash_g0 + NW, ... (warp-uniform); the ring the others, in order
        const bool stashed = STASHED && (unsigned)(g - c.st.stash_g0) < (unsigned)(c.st.stash_n * NW);
        if (!stashed && !RESIDENT) kog_cp_async_wait_pending<RING - 1>();  // the oldest granule has landed
        if (g == c.warp) trace_mv(c, MAT, 2);
        if (g + NWP >= ngran) trace_mv(c, MAT, 6);  // the last granule's wait is over
        const uint4* slot = stashed ? stash_slot(c, (g - c.st.stash_g0) / NW) : RESIDENT ? c.ring : c.ring + (c.st.tail % RING) * SLOT;
        if constexpr (M::MMA && NP == 1 && KOG_MMA_ONE_FMA) {
            fma_granule_product<M>(c, slot, g, xs, red, mma_hi[0]);  // (its strip's sum so far in mma_hi[0])
        } else if constexpr (M::MMA) {
            mma_granule_product<M, NP>(c, slot, g, xs, red, mma_hi, mma_lo);
        } else {
            const int seg = X_IN_REGS ? c.warp % M::NSEG : g % M::NSEG;
            // the U loads first, then U independent dot products: with inputs in registers a column
            // past the row has zero inputs (its slot words are finite, see ring_start), so no branch
            uint4 wv[M::U];
#pragma unroll
            for (int i = 0; i < M::U; ++i)
                if (X_IN_REGS || M::FULL || seg * M::SEGW + i * KOG_WAVE + c.lane < M::KV) wv[i] = slot[i * KOG_WAVE + c.lane];
            if constexpr (M::INT8) {  // (zero inputs past the row: its slot's stale bytes add nothing)
                int sh[M::U], sl[M::U];
#pragma unroll
                for (int i = 0; i < M::U; ++i) sh[i] = sl[i] = 0, dot16_i8(wv[i], xh[i], xl[i], sh[i], sl[i]);
#pragma unroll
                for (int j = 0; j < M::ROWS8; ++j) {  // the granule's int8 row j: the sum of its vectors
                    int a = 0, b = 0;
#pragma unroll
                    for (int i = 0; i < M::U; ++i) {
                        const int v = seg * M::SEGW + i * KOG_WAVE + c.lane;  // (past the rows: zero sums, the last row's)
                        const bool in_j = M::ROWS8 == 1 || min(v / M::KV8, M::ROWS8 - 1) == j;
                        a += in_j ? sh[i] : 0, b += in_j ? sl[i] : 0;
                    }
                    a = kog_wave_sum_i32(a), b = kog_wave_sum_i32(b);
                    if (c.lane == 0) red[g * M::ROWS8 + j] = (float)(256LL * a + b);
                }
            } else {
#if KOG_EXP == 8 || KOG_EXP == 9
                if (coded_for_timing(MAT)) {
#pragma unroll
                    for (int i = 0; i < M::U; ++i) wv[i] = decode_as_12bit(wv[i], base4);
                }
#endif
#pragma unroll
                for (int p = 0; p < NP; ++p) {
                    if (p >= pass_positions<NP>(c) || (KOG_EXP == 15 && p > 0)) break;  // (block-uniform)
                    const float* const xp = xs + p * MV_X;
                    float d[M::U];
#pragma unroll
                    for (int i = 0; i < M::U; ++i) {
                        const int col = seg * M::SEGW + i * KOG_WAVE + c.lane;
                        d[i] = X_IN_REGS ? dot8(wv[i], xa[i], xb[i])
                             : M::FULL || col < M::KV ? dot8(wv[i], xs_lo(xp, col), xs_hi(xp, col)) : 0.f;
                    }
                    float acc = d[0];
#pragma unroll
                    for (int i = 1; i < M::U; ++i) acc += d[i];
                    float* const rp = red + p * MV_RED;
                    if (M::LANE_SUMS) {
                        rp[g * LANE_STRIDE + c.lane] = acc;
                    } else {
                        acc = kog_wave_sum(acc);
                        if (c.lane == 0) rp[CHUNK ? g - g0 : g] = acc;
                    }
                }
            }
        }
        if (g + NWP >= ngran) trace_mv(c, MAT, 7);  // its math is done (its refill next)
        if (stashed || RESIDENT) continue;  // no ring slot emptied
        ++c.st.tail;
        // HOLD: a refill for a later matrix waits (an empty commit group stands in for it, so
        // that the wait above still finds RING groups after the oldest). Never after the LM head:
        // the next token's first weights stream while it is chosen.
        constexpr bool HOLDS = MAT != MAT_LM && (HOLD >> MAT & 1);
        if (HOLDS && (c.st.g >= c.st.src.ngran || c.st.mat != MAT)) commit_group(c), ++c.st.held;
        else ring_issue(c);
    }
    if (STASHED) c.st.stash_n = 0;
    trace_mv(c, MAT, 3);
}
