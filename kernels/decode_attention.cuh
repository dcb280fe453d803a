// Part of the decode monokernel (kernels/decode.cu): attention over the KV cache.
// Included by decode.cu after decode_common.cuh (the shape constants and Ctx); not standalone.
#pragma once

// ---- attention ---------------------------------------------------------------------------
// A block-unit is one kv head (or a group of its query heads, att_unit_of) over a run of
// 32-position tiles. Inside it, warp w takes query head w % gh of the unit's gh and tile w / gh of
// each round, so a tile's K/V rows are loaded into shared memory once for the heads that read
// them; the old tiles' loads are issued before waiting for this token's q/k/v (they do not
// depend on it). Each warp keeps an online softmax state; the warps of a head merge in shared
// memory, and when a head's tiles span several blocks every unit publishes its partial (acc,
// max, sum) records as tagged words, which the units merge a head each (att_merge; no counter,
// no fence), or, where a head spans at most CM_MAX units, every block as it stages O's input
// (stage_attn_merged).
// With ATT_EARLY the unit's first round of tiles is issued ahead (att_prefetch, ATT_EARLY_AT: at the
// layer's start, before its QKV input is polled, or where no stash takes the room, after the layer
// before's O product), so that it lands before the attention instead of delaying the q/k/v gather.

__device__ __forceinline__ float* att_stage(const Ctx& c, int s) {  // stage s of the K/V tiles
    return c.sm + ATT_T0 + (ATT_STAGES - 1 - s) * (TBR * TILE_F);
}
__device__ __forceinline__ float* att_cache(float* cache, const KParams* P, int l, int g) {  // (layer, kv head)'s rows
    return cache + (long long)(l * NKV + g) * P->ctx_limit * D;
}

// All threads of the block: cp.async the K/V rows of this round's tiles that hold older
// positions. The V rows from the pass's first position `pos` on are zeros instead (their K rows are never read):
// P x V then reads every row of the tile at a fixed offset (their weights are 0, or a new
// row's, whose product with the pass's v is added after).
__device__ __forceinline__ void att_load_tiles(Ctx& c, const float* kbase, const float* vbase, int tile0,
                                               int ntiles, int pos, float* tiles) {
    for (int q = c.tid; q < ntiles * 32 * (D / 4); q += NTHR) {
        const int k = q / (32 * (D / 4)), rem = q - k * (32 * (D / 4));
        const int r = rem / (D / 4), c4 = rem - r * (D / 4);
        const int p = (tile0 + k) * 32 + r;
        float* kt = tiles + k * TILE_F;
        if (p < pos) {  // the new positions come from shared memory (the pass's k and v)
            kog_cp_async16(kt + r * KT + 4 * c4, kbase + (long long)p * D + 4 * c4);
            kog_cp_async16(kt + 32 * KT + r * D + 4 * c4, vbase + (long long)p * D + 4 * c4);
        } else {
            *reinterpret_cast<float4*>(kt + 32 * KT + r * D + 4 * c4) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    commit_group(c);
}

// ATT_EARLY: the unit's first round of tiles of layer l, issued ahead of its attention (forward(); the pass's
// positions pos .. pos + pass_positions<NP>(c) - 1).
template <int NP>
__device__ __forceinline__ void att_prefetch(Ctx& c, int l, int pos) {
    AttUnit a;
    const int npos = pass_positions<NP>(c);
    if (!ATT_EARLY || !att_unit_of(c.b, pos + npos - 1, npos, a)) return;  // block-uniform
    att_load_tiles(c, att_cache(c.P->kc, c.P, l, a.g), att_cache(c.P->vc, c.P, l, a.g), a.t0, min(TBR, a.t1 - a.t0),
                   pos, att_stage(c, 0));
    c.st.tiles_group = c.st.groups;
}

// Where a kv head's (or head group's) tiles span several units, every unit publishes its (acc,
// max, sum) record per query head as tagged words, and unit j merges the heads h with h % nbc ==
// j with all its warps (a warp with one record: att_merge_whole): each warp adds a run of the
// records, weighted, and the head's first warp sums the runs in order (deterministic). A long
// context's merge (Qwen2.5 at 4k: 66 records of 128 values per head) is then spread over up to gh
// blocks and NW warps each; with one warp per head it took ~17-20 us a layer (PERF.md session 20).
// A warp's records, each with its max and sum, are copied into its part of the K/V tiles' region
// (free once the tiles are done), MERGE_CHW per round trip, issued before the maxima are settled:
// records published long ago then cost one round trip, and a record copied before it was published
// is gathered again.
constexpr int MERGE_WORDS = ATT_STAGES * TBR * TILE_F / 2;  // 8-byte words of the stages
constexpr int MERGE_CHW = cmin(KOG_WAVE, MERGE_WORDS / (NW * (D + 2)));  // records per copy round of a warp
static_assert(MERGE_CHW >= 1, "room to stage the attention records");

// The maximum Mx of all nbc records' maxima, and L, the records' sums weighted by exp(max - Mx)
// (a wave of records a round trip; every warp of a head the same, in the same order).
__device__ __forceinline__ bool merge_max_sum(const Ctx& c, int r0, int nbc, unsigned tag, float& Mx, float& L) {
    bool ok = true;
    Mx = -KOG_INF, L = 0.f;
    for (int j0 = 0; j0 < nbc; j0 += KOG_WAVE) {
        const int j = j0 + c.lane;
        const bool has = j < nbc;
        // the max and sum as one 16-byte load (bench/sync_probe.py: a line in flight loaded again costs ~0.3 us)
        ulonglong2 w = {0, 0};
        const kog_u64* const ms = hop_word(c, rec_at(r0 + (has ? j : 0) * G) + D);
        if (has) w = kog_ld_tagged2(ms);
        ok &= settle_tagged(c, w, ms, tag, has);
        const float mj = has ? kog_value_of(w.x) : -KOG_INF, lj = has ? kog_value_of(w.y) : 0.f;
        const float Mn = fmaxf(Mx, kog_wave_max(mj));
        L = L * (j0 == 0 ? 0.f : expf(Mx - Mn)) + kog_wave_sum(has ? expf(mj - Mn) * lj : 0.f);
        Mx = Mn;
    }
    return ok;
}

// One record of a head into o, weighted by exp(its max - Mx), from its words as loaded (x: the
// values a lane reads, wm: the max); a record loaded before it was published is gathered again.
__device__ __forceinline__ bool merge_record(const Ctx& c, const kog_u64* rec, kog_u64 wm, const kog_u64 (&x)[DL],
                                             unsigned tag, float Mx, float (&o)[DL]) {
    float v[DL];
    bool fresh = tag_ready(wm, tag), ok = true;
#pragma unroll
    for (int i = 0; i < DL; ++i) {
        fresh &= tag_ready(x[i], tag);
        v[i] = kog_value_of(x[i]);
    }
    if (!kog_wave_all(fresh)) {
        if (!kog_wave_all(tag_ready(wm, tag))) {  // (a settled max is not loaded again)
            wm = kog_ld_tagged(rec + D);
            ok = settle_tagged(c, wm, rec + D, tag);
        }
        ok = ok && gather_tagged_lane<DL>(c, v, rec, tag);
    }
    const float wt = expf(kog_value_of(wm) - Mx);
#pragma unroll
    for (int i = 0; i < DL; ++i) o[i] = fmaf(wt, v[i], o[i]);
    return ok;
}

// With at most one record a warp (short contexts): each warp polls its record's values, max and sum
// together into registers (no cp.async, which would wait behind the ring's refills in flight), so that
// a record published late costs one round trip after it lands (polling its max and sum, then loading
// its values took two: Qwen2.5 +1.1%, Llama +0.5%, PERF.md session 51), stages them in shared memory,
// and the head's first warp weights them in order (deterministic, and the same sums as att_merge's
// staged path, bit for bit). All threads of the unit: `rec` this warp's record (`has`), `first` the
// head's first warp (its records follow in `scratch`), `out` the merged head (a row of the hop space).
__device__ bool att_merge_whole(const Ctx& c, const kog_u64* rec, bool has, bool first, int nbc, kog_u64* out, unsigned tag,
                                float* scratch) {
    constexpr int RS = D + 2;  // a staged record: D values, max, sum
    const int lane = c.lane;
    bool ok = true;
    if (has) {
        kog_u64 x[DL];
        ulonglong2 ms;
        kog_u64 t0 = 0;
        for (int it = 1;; ++it) {
#pragma unroll
            for (int i = 0; i < DL; ++i) x[i] = kog_ld_tagged(rec + lane + 32 * i);
            ms = kog_ld_tagged2(rec + D);
            bool fresh = tag_ready(ms.x, tag) && tag_ready(ms.y, tag);
#pragma unroll
            for (int i = 0; i < DL; ++i) fresh &= tag_ready(x[i], tag);
            if (kog_wave_all(fresh)) break;
            if (!poll_again(c, it, t0, tag)) {
                ok = false;
                break;
            }
        }
#pragma unroll
        for (int i = 0; i < DL; ++i) scratch[c.warp * RS + lane + 32 * i] = kog_value_of(x[i]);
        if (lane == 0) scratch[c.warp * RS + D] = kog_value_of(ms.x), scratch[c.warp * RS + D + 1] = kog_value_of(ms.y);
    }
    __syncthreads();
    if (first) {  // the largest max, then the records weighted in order: the same sums as att_merge's
        // (merge_max_sum's wave sum, merge_record's rounded products added in order), bit for bit
        const float* st = scratch + c.warp * RS;
        const bool has_j = lane < nbc;  // (nbc <= NW here)
        const float mj = has_j ? st[lane * RS + D] : -KOG_INF, lj = has_j ? st[lane * RS + D + 1] : 0.f;
        const float Mx = kog_wave_max(mj);
        const float L = kog_wave_sum(has_j ? expf(mj - Mx) * lj : 0.f);
        float o[DL];
#pragma unroll
        for (int i = 0; i < DL; ++i) o[i] = 0.f;
        for (int j = 0; j < nbc; ++j) {
            const float wt = expf(st[j * RS + D] - Mx);
#pragma unroll
            for (int i = 0; i < DL; ++i) o[i] = o[i] + __fmul_rn(wt, st[j * RS + lane + 32 * i]);
        }
#pragma unroll
        for (int i = 0; i < DL; ++i) hop_store(out + lane + 32 * i, o[i] / L, tag);
    }
    return ok;
}

// All threads of a unit bc of nbc > 1 (kv head g, query heads h0 ..): merge the records of the
// heads it owns into the attention's output (HV_ATTN) of the pass's position p. `scratch`: NW * (D + 2) floats
// of shared memory, free here.
__device__ bool att_merge(const Ctx& c, int p, int g, int h0, int gh, int bc, int nbc, unsigned tag, float* scratch) {
    constexpr int RS = D + 2;  // a staged record: D values, max, sum
    const int nh = bc < gh ? (gh - 1 - bc) / nbc + 1 : 0;  // heads bc, bc + nbc, ... (block-uniform)
    if (nh == 0) return true;
    const int wph = NW / nh, hi = c.warp / wph, part = c.warp - hi * wph, lane = c.lane;
    const bool merging = hi < nh;  // warp-uniform
    const int h = h0 + bc + hi * nbc;
    if (KOG_EXP == 5) {  // timing only: publish at once, without the other units' records
        if (merging && part == 0)
            for (int i = 0; i < DL; ++i) hop_st_tagged(c, HV_ATTN + p * QD + (g * G + h) * D + lane + 32 * i, 0.f, tag);
        return true;
    }
    const int r0 = (p * NKV + g) * MAXCH * G + h;  // unit 0's record of head h (unit j's: r0 + j G)
    const int chunk = (nbc + wph - 1) / wph, jlo = min(nbc, part * chunk), jhi = min(nbc, jlo + chunk);
    if (chunk == 1) {
        const bool has = merging && jlo < jhi;  // (a warp without a record points at unit 0's: never read)
        return att_merge_whole(c, hop_word(c, rec_at(r0 + (has ? jlo : 0) * G)), has, merging && part == 0, nbc,
                               hop_word(c, HV_ATTN + p * QD + (g * G + h) * D), tag, scratch);
    }
    kog_u64* stage = reinterpret_cast<kog_u64*>(c.sm + ATT_T0) + c.warp * MERGE_CHW * RS;
    float o[DL], Mx = 0.f, L = 0.f;
#pragma unroll
    for (int i = 0; i < DL; ++i) o[i] = 0.f;
    bool ok = true;
    if (merging && jlo < jhi) {  // (the head's first warp always has records)
        for (int jb = jlo; jb < jhi; jb += MERGE_CHW) {
            const int m = min(MERGE_CHW, jhi - jb);
            for (int q = lane; q < m * (RS / 2); q += KOG_WAVE) {  // 16 bytes: two words
                const int k = q / (RS / 2), e = 2 * (q - k * (RS / 2));
                kog_cp_async16(stage + k * RS + e, hop_word(c, rec_at(r0 + (jb + k) * G)) + e);
            }
            if (jb == jlo) ok &= merge_max_sum(c, r0, nbc, tag, Mx, L);  // while the first round's copies fly
            kog_cp_async_wait();  // also waits for this warp's ring refills in flight (groups complete in order)
            kog_wave_sync();
            for (int k = 0; k < m; ++k) {
                kog_u64 x[DL];
#pragma unroll
                for (int i = 0; i < DL; ++i) x[i] = stage[k * RS + lane + 32 * i];
                ok &= merge_record(c, hop_word(c, rec_at(r0 + (jb + k) * G)), stage[k * RS + D], x, tag, Mx, o);
            }
            kog_wave_sync();  // the stage is refilled next round
        }
    }
    if (merging) {
#pragma unroll
        for (int i = 0; i < DL; ++i) scratch[c.warp * (D + 2) + lane + 32 * i] = o[i];
    }
    __syncthreads();
    if (merging && part == 0) {  // the runs in order
#pragma unroll
        for (int i = 0; i < DL; ++i) o[i] = 0.f;
        for (int run = 0; run < wph; ++run)
#pragma unroll
            for (int i = 0; i < DL; ++i) o[i] += scratch[(c.warp + run) * (D + 2) + lane + 32 * i];
        kog_u64* const out = hop_word(c, HV_ATTN + p * QD + (g * G + h) * D);
#pragma unroll
        for (int i = 0; i < DL; ++i) hop_store(out + lane + 32 * i, o[i] / L, tag);
    }
    return ok;
}

// One warp's part of a tile, folded into its online softmax state (m, lsum, acc): rows sub x PP .. of the
// tile at position base, S lanes a row (lane r + PP x s takes row r's 16-byte chunks s, s + S, ..: the 8 lanes
// of a shared-memory phase read 8 rows, conflict-free). Straight-line code, no branches per row. Rows from jn
// on are the pass's new positions pos, pos + 1, .. where this tile holds them: their k comes from shared memory
// (ks, a row a position), their v after the tile's rows. The query's context ends at L - 1 (the unit's position):
// rows past it get weight 0 (exact zeros below). NP: the positions the pass's code is built for.
template <int S, int NP>
__device__ __forceinline__ void att_tile(int lane, const float* tiles, int kslot, const float* q, const float* ks, const float* vs, float* pw,
                                         int base, int sub, int L, int pos, float& m, float& lsum, float (&acc)[DL]) {
    constexpr int PP = 32 / S;  // the warp's rows
    static_assert(S <= 8 && (D / 4) % S == 0, "a warp takes at least four rows, a lane whole 16-byte chunks");
    const int nv = min(32, L - base), off = pos - base, jn = min(max(off, 0), 32), p0 = sub * PP;
    if (S > 1 && p0 >= nv) return;  // warp-uniform: none of its rows is in the context
    const float* kt = tiles + kslot * TILE_F;
    const float* vt = kt + 32 * KT;
    const int r = S == 1 ? lane : lane % PP, sc = S == 1 ? 0 : lane / PP, row = p0 + r;
    const bool valid = row < nv;
    const float* kp = row < jn ? kt + row * KT : ks + min(row - off, NP - 1) * D;
    float s4[4] = {0.f, 0.f, 0.f, 0.f};  // four partial sums: short dependency chains
#pragma unroll
    for (int j = 0; j < D / 4 / S; ++j) {
        const int d4 = sc + S * j;
        const float4 kv = *reinterpret_cast<const float4*>(kp + 4 * d4);
        const float4 qv = *reinterpret_cast<const float4*>(q + 4 * d4);
        s4[j & 3] = fmaf(kv.x, qv.x, s4[j & 3]);
        s4[j & 3] = fmaf(kv.y, qv.y, s4[j & 3]);
        s4[j & 3] = fmaf(kv.z, qv.z, s4[j & 3]);
        s4[j & 3] = fmaf(kv.w, qv.w, s4[j & 3]);
    }
    float dot = (s4[0] + s4[1]) + (s4[2] + s4[3]);
#pragma unroll
    for (int x = PP; x < 32; x <<= 1) dot += kog_shfl_xor(dot, x);  // the row's S lanes (the same sum in each)
    const float sv = valid ? dot * SCALE : -KOG_INF;
    const float mn = fmaxf(m, kog_wave_max(sv));
    const float corr = NP > 1 && mn == -KOG_INF ? 1.f : expf(m - mn);  // (a unit none of whose rows is in the query's context yet)
    const float pe = valid ? expf(sv - mn) : 0.f;
    lsum = lsum * corr + kog_wave_sum(sc == 0 ? pe : 0.f);  // each row once
#pragma unroll
    for (int i = 0; i < DL; ++i) acc[i] *= corr;
    m = mn;
    // P x V: the weights through shared memory (four per read), rows in order. The tile's V rows
    // from jn on are zeros (att_load_tiles), so each adds exactly 0 there and the new rows' products
    // come last, as if in place: the same sums as reading them in order (but for the sign of a zero).
    if (sc == 0) pw[r] = pe;
    kog_wave_sync();
#pragma unroll
    for (int j4 = 0; j4 < PP / 4; ++j4) {
        const float4 w4 = reinterpret_cast<const float4*>(pw)[j4];
        const float wj[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
            for (int i = 0; i < DL; ++i) acc[i] = fmaf(wj[jj], vt[(p0 + 4 * j4 + jj) * D + lane + 32 * i], acc[i]);
    }
#pragma unroll
    for (int j = 0; j < NP; ++j) {  // the new positions in the query's context among the warp's rows (warp-uniform)
        const int rn = off + j;
        if (rn >= p0 && rn < p0 + PP && rn < nv) {
            const float wn = pw[rn - p0];
#pragma unroll
            for (int i = 0; i < DL; ++i) acc[i] = fmaf(wn, vs[j * D + lane + 32 * i], acc[i]);
        }
    }
    kog_wave_sync();  // pw is rewritten next round
}

// The pass's positions pos .. pos + pass_positions<NP>(c) - 1: this block's unit (if any) runs one of them
// (DRAFTS: positions past the context's end are computed, but no cache row of theirs is written, and they read
// the last position's RoPE row).
template <int NP>
__device__ bool attention(Ctx& c, int l, int pos, unsigned epoch_qkv) {
    const KParams* P = c.P;
    const int npos = pass_positions<NP>(c), last = pos + npos - 1;
    AttUnit a;
    if (!att_unit_of(c.b, last, npos, a)) return true;  // block-uniform: this block has no unit
    const int u = c.b, g = a.g, bc = a.bc, nbc = a.nbc, t0 = a.t0, t1 = a.t1, gh = a.gh, h0 = a.h0, qp = a.p;
    const int L = pos + qp + 1;  // the unit's query position is L - 1
    const bool has_new = pos / 32 < t1;  // this unit's last tile holds a new position
    // (with has_new) one unit per kv head appends the pass's k and v to the cache: the last position's, whose
    // context holds every new row (two units where the new rows span two: the same rows)
    const bool writes_kv = h0 == 0 && qp == npos - 1;
    const int lane = c.lane, warp = c.warp;
    // this warp's query head (of the unit's gh), tile slot and part of the tile (att_split)
    const int split = att_split(gh), hq = warp % gh, jslot = warp / gh;
    const int kslot = ATT_SPLIT_MAX > 1 ? jslot % TBR : jslot, sub = ATT_SPLIT_MAX > 1 ? jslot / TBR : 0;
    const bool busy = ATT_SPLIT_MAX > 1 ? sub < split : kslot < TBR;
    trace_att(c, l, u, 0);

    float* qs = c.sm;             // [gh][D] roped queries (room for G)
    float* ks = qs + G * D;       // [NPOS][D] the pass's k (roped), v
    float* vs = ks + NPOS * D;
    float* rec = vs + NPOS * D;   // [NW][D + 2] per-warp (acc, max, sum)
    float* pbuf = rec + NW * (D + 2);  // [NW][32] per-warp softmax weights of a tile
    float* kbase = att_cache(P->kc, P, l, g);
    float* vbase = att_cache(P->vc, P, l, g);
    if (!ATT_EARLY) att_load_tiles(c, kbase, vbase, t0, min(TBR, t1 - t0), pos, att_stage(c, 0));

    // the pass's q/k/v, straight from the tagged words the QKV phase wrote: the unit's position's q, every
    // position's k and v
    const int q0 = g * G * D, k0 = QD + g * D, v0 = QD + KVD + g * D;
    const int ctx = (int)P->ctx_limit;
    constexpr int KVR = NP;  // k / v rows a warp gathers
    bool ok = true;
    if (warp < gh || (has_new && warp < gh + 2)) {  // warp h < gh: query head h0 + h; gh: k; gh + 1: v
        const bool is_q = warp < gh;
        const int row0 = is_q ? q0 + (h0 + warp) * D : (warp == gh ? k0 : v0);
        // the rope rows before the gather: their round trip then hides in the wait (at layer 0 they
        // come from HBM, the LM head's stream having passed: PERF.md session 21)
        float v[KVR][DL], co[KVR][DL / 2], si[KVR][DL / 2];
        const kog_u64* src[KVR];
        const int rows = is_q ? 1 : npos;  // (warp-uniform: a query warp takes its position's row)
#pragma unroll
        for (int j = 0; j < KVR; ++j) {
            const int p = is_q ? qp : min(j, rows - 1);  // (rows past the pass's: its last, gathered again)
            if (j < rows) {
                const long long at = (long long)(NP == 1 ? pos : min(pos + p, ctx - 1)) * HALF;
#pragma unroll
                for (int i = 0; i < DL / 2; ++i)
                    co[j][i] = __ldg(P->rcos + at + lane + 32 * i), si[j][i] = __ldg(P->rsin + at + lane + 32 * i);
            }
            src[j] = hop_word(c, HV_QKV + p * NQKV + row0);
        }
        if (KOG_EXP == 6) {  // timing only: whatever the words hold now (what the q/k/v hop costs the attention)
#pragma unroll
            for (int j = 0; j < KVR; ++j)
#pragma unroll
                for (int i = 0; i < DL; ++i)
                    if (j < rows) v[j][i] = kog_value_of(kog_ld_tagged(src[j] + lane + 32 * i));
        } else if (KVR == 1 || rows == 1) {
            ok = gather_tagged_lane<DL>(c, v[0], src[0], epoch_qkv);
        } else {
            ok = gather_tagged_lane<DL, KVR>(c, v, src, epoch_qkv);
        }
        trace_att(c, l, u, 1);
#pragma unroll
        for (int j = 0; j < KVR; ++j) {
            if (j >= rows) break;
            const bool keep = writes_kv && (NP == 1 || pos + j < ctx);  // (no cache row past the context)
            if (warp == gh + 1) {
#pragma unroll
                for (int i = 0; i < DL; ++i) {
                    vs[j * D + lane + 32 * i] = v[j][i];
                    if (keep) vbase[(long long)(pos + j) * D + lane + 32 * i] = v[j][i];
                }
            } else {
#if KOG_QK_NORM
                const float* normw = P->ws + (long long)l * SSTRIDE + (is_q ? S_QNORM : S_KNORM);
                float ss = 0.f;
#pragma unroll
                for (int i = 0; i < DL; ++i) ss += v[j][i] * v[j][i];
                ss = kog_wave_sum(ss);
                const float rn = sqrtf(ss / (float)D + EPS);
#pragma unroll
                for (int i = 0; i < DL; ++i) v[j][i] = v[j][i] / rn * normw[lane + 32 * i];
#endif
                float* out = is_q ? qs + warp * D : ks + j * D;
#pragma unroll
                for (int i = 0; i < DL / 2; ++i) {
                    const int d = lane + 32 * i;
                    const float x1 = v[j][i], x2 = v[j][i + DL / 2];
                    out[d] = __fadd_rn(__fmul_rn(x1, co[j][i]), __fmul_rn(-x2, si[j][i]));
                    out[d + HALF] = __fadd_rn(__fmul_rn(x2, co[j][i]), __fmul_rn(x1, si[j][i]));
                }
                if (warp == gh && keep) {
                    kog_wave_sync();
#pragma unroll
                    for (int i = 0; i < DL; ++i) kbase[(long long)(pos + j) * D + lane + 32 * i] = ks[j * D + lane + 32 * i];
                }
            }
        }
    }
    if (!__syncthreads_and(ok)) return false;
    trace_att(c, l, u, 2);

    float m = -KOG_INF, lsum = 0.f, acc[DL];
#pragma unroll
    for (int i = 0; i < DL; ++i) acc[i] = 0.f;
    const float* q = qs + hq * D;
    for (int r0 = t0, k = 0; r0 < t1; r0 += TBR, ++k) {
        float* round_tiles = att_stage(c, k % ATT_STAGES);
        // the next round's tiles: with two stages, into the other stage now (its last reader
        // passed the barrier that ended the previous round); with one, this round's, only now
        const bool ahead = ATT_STAGES == 2 && r0 + TBR < t1;
        if (ahead) att_load_tiles(c, kbase, vbase, r0 + TBR, min(TBR, t1 - r0 - TBR), pos, att_stage(c, (k + 1) % 2));
        else if (ATT_STAGES == 1 && r0 != t0) att_load_tiles(c, kbase, vbase, r0, min(TBR, t1 - r0), pos, round_tiles);
        if (ATT_EARLY && k == 0) kog_cp_async_wait_pending_dyn(c.st.groups - c.st.tiles_group);  // not the ring's refills
        else if (ahead) kog_cp_async_wait_pending<1>();  // all but the group just issued
        else kog_cp_async_wait_all();
        __syncthreads();
        trace_att(c, l, u, 6);
        const int tile = r0 + kslot;
        if (busy && tile < t1 && KOG_EXP != 1) {  // warp-uniform
            float* const pw = pbuf + warp * 32;
            if (ATT_SPLIT_MAX >= 8 && split == 8) att_tile<8, NP>(lane, round_tiles, kslot, q, ks, vs, pw, tile * 32, sub, L, pos, m, lsum, acc);
            else if (ATT_SPLIT_MAX >= 4 && split == 4) att_tile<4, NP>(lane, round_tiles, kslot, q, ks, vs, pw, tile * 32, sub, L, pos, m, lsum, acc);
            else if (ATT_SPLIT_MAX >= 2 && split == 2) att_tile<2, NP>(lane, round_tiles, kslot, q, ks, vs, pw, tile * 32, sub, L, pos, m, lsum, acc);
            else att_tile<1, NP>(lane, round_tiles, kslot, q, ks, vs, pw, tile * 32, sub, L, pos, m, lsum, acc);
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
    // the warps of a head with a tile slot (slots past TBR x split took no tile)
    constexpr int SLOTS_MAX = ATT_RMAX > 0 ? TBR * ATT_SPLIT_MAX : NW / G;
    const int slots = ATT_RMAX > 0 ? TBR * split : SLOTS_MAX;
    if (warp < gh) {
        const float mw = lane < slots ? rec[(lane * gh + warp) * (D + 2) + D] : -KOG_INF;
        const float lw = lane < slots ? rec[(lane * gh + warp) * (D + 2) + D + 1] : 0.f;
        const float M = kog_wave_max(mw);
        const float wc = lane < slots && mw > -KOG_INF ? expf(mw - M) : 0.f;
        const float Ls = kog_wave_sum(wc * lw);
        float o[DL];
#pragma unroll
        for (int i = 0; i < DL; ++i) o[i] = 0.f;
#pragma unroll
        for (int j = 0; j < SLOTS_MAX; ++j) {
            if (j >= slots) break;  // block-uniform
            const float w = kog_shfl(wc, j);
#pragma unroll
            for (int i = 0; i < DL; ++i) o[i] = fmaf(w, rec[(j * gh + warp) * (D + 2) + lane + 32 * i], o[i]);
        }
        if (nbc == 1) {
            kog_u64* const attn_out = hop_word(c, HV_ATTN + qp * QD + (g * G + h0 + warp) * D);
#pragma unroll
            for (int i = 0; i < DL; ++i) hop_store(attn_out + lane + 32 * i, o[i] / Ls, epoch_qkv + 1);
        } else {  // this unit's record of the head, for the units that merge
            kog_u64* const pr = hop_word(c, rec_at(((qp * NKV + g) * MAXCH + bc) * G + h0 + warp));
#pragma unroll
            for (int i = 0; i < DL; ++i) hop_store(pr + lane + 32 * i, o[i], epoch_qkv + 1);
            if (lane == 0) hop_store(pr + D, M, epoch_qkv + 1), hop_store(pr + D + 1, Ls, epoch_qkv + 1);
        }
    }
    if (nbc > 1 && !merged_in_o<NP>(nbc)) {  // (else every block merges the records: stage_attn_merged)
        trace_att(c, l, u, 4);
        __syncthreads();  // rec was read above: the merge's partial sums go there
        ok &= att_merge(c, qp, g, h0, gh, bc, nbc, epoch_qkv + 1, rec);
    }
    trace_att(c, l, u, 5);
    return __syncthreads_and(ok);
}

// Where a kv head's (or head group's) tiles span 2 .. CM_MAX units, no unit merges the
// records: every block merges them as it stages O's input, each thread its own pairs of the
// attention vector, with no warp collective (the units' hop and the merging unit's work leave the
// attention's critical path; O's gather takes 2 x nbc words a pair instead of one).
__device__ __forceinline__ int att_units_now(int pos) {  // units per kv head (group) where the context's last position is pos
    AttUnit a{};
    att_unit_of(0, pos, 1, a);  // (block 0 always has a unit; O's gather merges a pass of one position's)
    return a.nbc;
}
// All threads: O's input (QD values, split layout at xs) merged from the nbc units' records. False on timeout.
// (A pass of one position: merged_in_o.)
__device__ bool stage_attn_merged(const Ctx& c, float* xs, int nbc, unsigned tag) {
    using T = Tagged<QD>;
    unsigned pending = 0;
#pragma unroll
    for (int k = 0; k < T::NV; ++k)
        if (T::has(c.tid, k)) pending |= 1u << k;
    kog_u64 t0 = 0;
    bool ok = true;
    kog_u64* const hop = c.P->hop;
    for (int it = 1;; ++it) {
        ulonglong2 vw[T::NV][cmax(CM_MAX, 1)], sw[T::NV][cmax(CM_MAX, 1)];
#pragma unroll
        for (int k = 0; k < T::NV; ++k)
            if ((pending >> k) & 1u) {
                const int e = 2 * (c.tid + k * NTHR), hh = e / D, d = e - hh * D;  // query head hh, dims d, d + 1
                const int r0 = (hh / G) * MAXCH * G + hh % G;  // unit 0's record (unit u's: r0 + u G)
#pragma unroll
                for (int u = 0; u < CM_MAX; ++u)
                    if (u < nbc) {
                        const kog_u64* const rec = hop_word(hop, rec_at(r0 + u * G));
                        vw[k][u] = kog_ld_tagged2(rec + d), sw[k][u] = kog_ld_tagged2(rec + D);
                    }
            }
#pragma unroll
        for (int k = 0; k < T::NV; ++k)
            if ((pending >> k) & 1u) {
                bool ready = true;
#pragma unroll
                for (int u = 0; u < CM_MAX; ++u)
                    if (u < nbc) ready &= tag_ready(vw[k][u].x, tag) & tag_ready(vw[k][u].y, tag) & tag_ready(sw[k][u].x, tag) & tag_ready(sw[k][u].y, tag);
                if (!ready) continue;
                // the units in order: the largest max, then the weighted sums (deterministic)
                float mx = -KOG_INF;
#pragma unroll
                for (int u = 0; u < CM_MAX; ++u)
                    if (u < nbc) mx = fmaxf(mx, kog_value_of(sw[k][u].x));
                float L = 0.f, o0 = 0.f, o1 = 0.f;
#pragma unroll
                for (int u = 0; u < CM_MAX; ++u)
                    if (u < nbc) {
                        const float wt = expf(kog_value_of(sw[k][u].x) - mx);
                        L = fmaf(wt, kog_value_of(sw[k][u].y), L);
                        o0 = fmaf(wt, kog_value_of(vw[k][u].x), o0), o1 = fmaf(wt, kog_value_of(vw[k][u].y), o1);
                    }
                *reinterpret_cast<float2*>(xs + xs_index(2 * (c.tid + k * NTHR))) = make_float2(o0 / L, o1 / L);
                pending &= ~(1u << k);
            }
        if (!kog_wave_any(pending)) break;
        if (!poll_again(c, it, t0, tag)) {
            ok = false;
            break;
        }
    }
    return __syncthreads_and(ok);
}
