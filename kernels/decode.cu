// kog monokernel: the whole batch-1 decode loop in ONE persistent cooperative launch.
//
// One block per multiprocessor runs, for every requested token: pick the token from the
// logits (greedy argmax, or the sampler), publish it to host-mapped memory, stop or feed it
// through every layer (RMSNorm -> packed QKV (+bias, q/k norm, RoPE, KV append) -> GQA
// attention over the fp32 cache -> O + residual -> RMSNorm -> packed gate/up + SiLU ->
// down + residual), final norm, LM head, and loop. The host launches it once per generation.
//
// Synchronisation: the vectors that cross blocks inside a layer (x, q/k/v, attention output,
// SiLU(gate)*up) travel as tagged 8-byte words (phase, value); a consumer spins on exactly the
// words it reads until they carry the phase it expects -- the data is its own flag: one round
// trip, no fences. Where SiLU(gate)*up is long, down is split by columns, so that a block reads
// only a slice of it (decode_common.cuh DN_SPLIT); the slices' partial sums then meet in summed
// words, which count their adds (decode_sync.cuh): the same one round trip. Token boundaries (LM head
// -> token choice) use per-block epoch flags (release store / acquire poll). Phase numbers only
// grow during a launch, so nothing is reset mid-run.
// Weights stream through a per-warp shared-memory ring (decode_ring.cuh) that runs
// ahead across phases: they do not depend on activations, so HBM keeps streaming into a
// phase's wait for its input, as far as the ring reaches (~3 us of HBM time); on the big shapes
// a stash of a few more granules per warp, issued inside the waits before gate/up and down, adds
// ~2 us a wait.
//
// Matrix-vector products: each block owns a contiguous range of output rows (the tensor-
// parallel split of a later issue is the same cut one level up); within a block, the warps
// take (row, K-segment) granules, each lane streaming U 16-byte weight vectors per granule.
// Partial sums meet in shared memory in a fixed order: results are deterministic.
//
// Every spin-wait is bounded by a watchdog (globaltimer) and gives up when another block
// has already failed; errors land in status[0] and the host turns them into a KogError.
//
// Shapes are compile-time constants (NVRTC compiles one binary per model shape and grid).
// The parts: decode_common.cuh (shape, weight layout, parameters, shared memory, context),
// decode_ring.cuh (weight streaming, matrix-vector products), decode_sync.cuh (flags, tagged
// words, staging), decode_sampler.cuh (logits -> token), decode_attention.cuh; this file: one
// token through the model, the token choice and the kernel itself.
#include "decode_common.cuh"
#include "decode_sync.cuh"
#include "decode_ring.cuh"
#include "decode_sampler.cuh"
#include "decode_attention.cuh"

// Timing experiments only (KOG_ICACHE_KB, KOG_ICACHE_LAYER_KB): KB kilobytes of straight-line machine code
// (four FMA chains), to see whether the code a token or a layer runs outgrows the instruction cache.
template <int KB>
__device__ __forceinline__ void run_filler_code(const Ctx& c) {
    if (KB <= 0) return;
    float a0 = c.tid, a1 = a0 + 1.f, a2 = a0 + 2.f, a3 = a0 + 3.f;
#pragma unroll
    for (int i = 0; i < KB * 16; ++i) {
        asm volatile("fma.rn.f32 %0, %0, 0f3F800347, 0f3F000000;" : "+f"(a0));
        asm volatile("fma.rn.f32 %0, %0, 0f3F800347, 0f3F000000;" : "+f"(a1));
        asm volatile("fma.rn.f32 %0, %0, 0f3F800347, 0f3F000000;" : "+f"(a2));
        asm volatile("fma.rn.f32 %0, %0, 0f3F800347, 0f3F000000;" : "+f"(a3));
    }
    if (a0 + a1 + a2 + a3 == 1.2345f) c.red16[0] = a0;  // never: keeps the chains
}

// ---- one pass through the model: a token, or up to NPOS positions (DRAFTS) --------------
// forward<NP> and what it calls are built twice where DRAFTS: NP = 1 runs a pass without a draft on the plain
// decode's code, NP = NPOS a pass with one (pass_positions). The layouts (hop space, shared memory) are NPOS's in
// both.
using XOwn = float[NPOS][MO::MAXR];  // this block's rows of the residual stream, a row of them a position

// Item i of a loop over the pass's positions' rows, n rows a position, taken position-major by all threads (so
// that a product's epilogue keeps the pass's positions times the threads busy): its position; its row is
// i - position x n.
template <int NP>
__device__ __forceinline__ int item_position(int i, int n) { return NP == 1 ? 0 : i / n; }

// The block's rows of an H-row product (O, down) into its slice of the residual stream, which
// every block then reads as tagged words of the next phase.
template <class M, int NP>
__device__ __forceinline__ void add_to_residual(const Ctx& c, const float* red, XOwn& xown) {
    const int r0 = M::row0(c.b), nr = M::row0(c.b + 1) - r0;
    for (int i = c.tid; i < pass_positions<NP>(c) * nr; i += NTHR) {
        const int p = item_position<NP>(i, nr), r = i - p * nr;
        xown[p][r] += mv_result<M>(red + p * MV_RED, r);
        hop_st_tagged(c, HV_X + p * H + r0 + r, xown[p][r], c.epoch + 1);
    }
}

// DN_SPLIT > 1: O's rows of the residual stream, kept in fixed point (kog_xfix), published twice:
// as tagged words for the gate/up norm, and as their change added to the summed words, to which
// down's slices then add their partial sums (decode_sync.cuh). A token's first layer starts from
// its embedding row (xown) where the summed words still hold the last token's stream.
// (A block that takes no QKV rows, QKV_SKIP, runs an attention unit instead, which O's adds need too.)
// DRAFTS: the words of the positions a pass does not feed take the count of the pass's adds in one add, at its
// first layer; the next pass that reads them comes after the token choice's release and acquire, so it finds
// them counted (v50 added 0 to each from O and every down slice, every layer).
static_assert(NQKV >= NBLK - QKV_SKIP, "every block reads the stream before its QKV rows: no O add can come before that read");
template <int NP>
__device__ __forceinline__ void add_o_summed(const Ctx& c, const float* red, const XOwn& xown, int l) {
    constexpr long long XMAX = (long long)SUM_X_MAX << SUM_FRAC;
    constexpr kog_u64 PASS_ADDS = (kog_u64)(NL * (DN_SPLIT + 1) & 255) << 56;  // a pass's adds to a word, counted
    const int r0 = MO::row0(c.b), nr = MO::row1(c.b) - r0, npos = pass_positions<NP>(c);
    if (DRAFTS && l == 0)
        for (int i = npos * nr + c.tid; i < NPOS * nr; i += NTHR) hop_red_add(c, HV_XSUM + i / nr * H + r0 + i % nr, PASS_ADDS);
    for (int i = c.tid; i < npos * nr; i += NTHR) {
        const int p = item_position<NP>(i, nr), r = i - p * nr;
        const long long x0 = l == 0 ? sum_fixed(xown[p][r], SUM_X_MAX) : kog_xfix[p][r];
        const long long x = min(max(x0 + sum_fixed(mv_result<MO>(red + p * MV_RED, r), SUM_X_MAX), -XMAX), XMAX);
        hop_st_tagged(c, HV_X + p * H + r0 + r, sum_float(x), c.epoch + 1);
        hop_red_add(c, HV_XSUM + p * H + r0 + r, sum_add(x - kog_xfix[p][r]));
        kog_xfix[p][r] = x;
    }
}

// Word j of SiLU(gate)*up of the pass's position p: [down's slice][position][element] (each block of down
// gathers its slice's NPOS rows in one run).
__device__ __forceinline__ int act_word(int p, int j) { return HV_ACT + (j / DN_K * NPOS + p) * DN_K + j % DN_K; }

// RMSNorm of the residual stream after `layers` layers of this launch (before QKV, or the final
// norm): where down is split its slices' sums meet in the summed words; else down's owners
// published the tagged words. (The final norm is traced as a layer input too, in layer NL - 1,
// which bench/decode_breakdown.py never traces.)
template <int NP>
__device__ __forceinline__ bool stage_norm_layer_input(const Ctx& c, float* xs, int layers, const float* w) {
    if (DN_SPLIT > 1) return stage_norm<NP, SumWord>(c, xs, HV_XSUM, sum_tag(layers), nullptr, w, NORM_LAYER_INPUT);
    return stage_norm<NP>(c, xs, HV_X, c.epoch, nullptr, w, NORM_LAYER_INPUT);
}

// LM_SCREEN (decode_common.cuh), all threads: the block's LM head rows screened in int8, the exact logits
// of those whose upper bound reaches the block's largest lower bound, and the block's best of them published
// as the full LM head publishes it. The token's row is among them: in its block its upper bound reaches its
// exact logit, which no lower bound of that block exceeds. (Against every block's bound, exchanged, fewer
// rows are recomputed, but that exchange is one hop more; PERF.md session 37.)
__device__ void lm_screen_pick(Ctx& c, const float* xs, float* red) {
    const KParams* P = c.P;
    constexpr int R8 = MLM8::ROWS8;  // int8 rows of a product row: block b's int8 rows are R8 row0(b) ..
    const int r0 = R8 * MLM8::row0(c.b), nr = R8 * MLM8::row0(c.b + 1) - r0;
    constexpr int QN = (R8 * MLM8::MAXR + NTHR - 1) / NTHR;
    float4 q[QN];  // (s_r, e_r, t_r, 0) of this thread's rows, loaded while the product streams
#pragma unroll
    for (int k = 0; k < QN; ++k)
        q[k] = c.tid + k * NTHR < nr ? __ldg(reinterpret_cast<const float4*>(P->ws + S_LMQ) + r0 + c.tid + k * NTHR)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
    // max |x| of the product's input (both halves of the split layout) sets its fixed point's step s_x
    // (max |x| / s_x = LM8_XQ; a floor keeps s_x a normal float)
    float mx = 0.f;
    for (int e = c.tid; e < H / 2; e += NTHR) mx = fmaxf(mx, fmaxf(fabsf(xs[e]), fabsf(xs[XHALF + e])));
    mx = kog_wave_max(mx);
    float* const red_mx = red + MLM8::RED;  // past the rows' sums (MV_RED)
    float* const red_ss = red_mx + NW;
    if (c.lane == 0) red_mx[c.warp] = mx;
    __syncthreads();
    mx = 0.f;
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, red_mx[w]);
    const float sx = fmaxf(mx, 1e-30f) * (1.f / LM8_XQ);
    mv_run<MLM8, MAT_LM, 1>(c, xs, red, 1.f / sx);
    // |x|^2 of x times a power of two near 1 / max |x| (exact), so that no square underflows or overflows
    const int ebits = __float_as_int(fminf(fmaxf(mx, 1e-30f), 1e30f)) & 0x7f800000;
    const float p2 = __int_as_float(0x7f000000 - ebits);  // 2^-k, max |x| in [2^k, 2^(k+1))
    float ss = 0.f;
    for (int e = c.tid; e < H / 2; e += NTHR) {
        const float a = xs[e] * p2, b = xs[XHALF + e] * p2;
        ss = fmaf(a, a, fmaf(b, b, ss));
    }
    ss = kog_wave_sum(ss);
    if (c.lane == 0) red_ss[c.warp] = ss;
    __syncthreads();  // every warp's row sums are in red
    ss = 0.f;
    for (int w = 0; w < NW; ++w) ss += red_ss[w];
    const float xn = sqrtf(ss) * __int_as_float(ebits);  // |x|
    // (rows whose bound is NaN stay candidates: the test below is "not below")
    const float tiny = __int_as_float(2 * H + 16);  // (2H + 16) 2^-149: fp32's rounding below the normal floats
    float lo = -KOG_INF;
#pragma unroll
    for (int k = 0; k < QN; ++k) {
        const int r = c.tid + k * NTHR;
        if (r < nr) {
            // (s_x times the row's sum first: both normal, so s_r's product rounds after, not before, the sum)
            const float a = q[k].x * (sx * mv_result<MLM8>(red, r)), bound = xn * q[k].y + (sx * q[k].z + tiny);
            lo = fmaxf(lo, a - bound);
            red[r * MLM8::NSEG] = a + bound;
        }
    }
    lo = kog_wave_max(lo);
    if (c.lane == 0) c.red16[c.warp] = lo;
    __syncthreads();
    float lo_all = c.red16[0];  // the block's largest lower bound
    for (int w = 1; w < NW; ++w) lo_all = fmaxf(lo_all, c.red16[w]);
    __syncthreads();  // publish_block_best writes red16
    // the rows that can still be the argmax, exactly: a warp a row, from its bf16 weights
    Best best = {-KOG_INF, 0x7fffffff};
    const uint4* const lmh = reinterpret_cast<const uint4*>(P->w + OFF_LMH);
    for (int base = c.warp * KOG_WAVE; base < nr; base += NTHR) {
        unsigned cand = kog_wave_ballot(base + c.lane < nr && !(red[(base + c.lane) * MLM8::NSEG] < lo_all));
        while (cand) {
            const int row = r0 + base + __ffs(cand) - 1;
            cand &= cand - 1;
            const uint4* const wr = lmh + (long long)row * (H / 8);
            float acc = 0.f;
            if (KOG_EXP == 7) {  // timing only: the screened bound stands for the exact logit (no bf16 row read)
                acc = red[(row - r0) * MLM8::NSEG];
            } else {
                for (int v = c.lane; v < H / 8; v += KOG_WAVE) acc += dot8(kog_ldcg_u4(wr + v), xs_lo(xs, v), xs_hi(xs, v));
                acc = kog_wave_sum(acc);
            }
            if (better(acc, row, best.v, best.i)) best.v = acc, best.i = row;
        }
    }
    publish_block_best(c, best);
}

// The pass's tokens (shared memory) at positions pos .. pos + pass_positions<NP>(c) - 1. Always inlined: built as
// a call of its own (as nvcc chose for forward<NPOS> at some knobs' settings), its frame lives in local memory and
// every pass loses 13-30% (PERF.md sessions 65, 66).
template <int NP>
__device__ __forceinline__ bool forward(Ctx& c, const int* tokens, int pos, bool greedy, XOwn& xown) {
    const KParams* P = c.P;
    float* xs = c.sm;
    float* red = c.sm + NPOS * MV_X;
    const int b = c.b;
    const unsigned short* w = P->w;
    const int npos = pass_positions<NP>(c), last = pos + npos - 1;  // the context's last position this pass
    // the attention's units per kv head depend on the position alone: whether O's gather merges them
    const int nbc_now = CM_MAX > 1 && NP == 1 ? att_units_now(last) : 1;
    const bool o_merges = nbc_now > 1 && merged_in_o<NP>(nbc_now);
    for (int l = 0; l < NL; ++l) {
        c.layer = l;
        const float* sl = P->ws + (long long)l * SSTRIDE;
        // --- QKV
        if (ATT_EARLY_AT == 2 || (ATT_EARLY_AT >= 3 && l == 0)) att_prefetch<NP>(c, l, pos);  // they land during the hop and the QKV product
        if (l == 0) {
            const int nr = MO::row0(b + 1) - MO::row0(b);
            for (int i = c.tid; i < npos * nr; i += NTHR) {
                const int p = item_position<NP>(i, nr), r = i - p * nr;
                xown[p][r] = kog_bf16(w[OFF_EMB + (long long)tokens[p] * H + MO::row0(b) + r]);
            }
            stage_norm<NP>(c, xs, HV_X, 0, tokens, sl + S_ATTN_NORM);
        } else {
            if (!stage_norm_layer_input<NP>(c, xs, c.step * NL + l, sl + S_ATTN_NORM)) return false;
            trace_event(c);
        }
        if (ATT_EARLY_AT == 1) att_prefetch<NP>(c, l, pos);
        {
            mv_run<MQKV, MAT_QKV, NP>(c, xs, red);
            __syncthreads();
            trace_mv(c, MAT_QKV, 4);
            const int r0 = MQKV::row0(b), nr = MQKV::row0(b + 1) - r0;
            for (int i = c.tid; i < npos * nr; i += NTHR) {
                const int p = item_position<NP>(i, nr), r = i - p * nr;
                float v = mv_result<MQKV>(red + p * MV_RED, r);
#if KOG_QKV_BIAS
                v += sl[S_BQKV + r0 + r];
#endif
                hop_st_tagged(c, HV_QKV + p * NQKV + r0 + r, v, c.epoch + 1);
            }
            trace_mv(c, MAT_QKV, 5);
        }
        end_phase(c);
        const unsigned e_qkv = c.epoch;
        // --- attention (reads only its own kv head's q/k/v)
        const bool att_ok = attention<NP>(c, l, pos, e_qkv);
        if (HOLD >> MAT_QKV & 1) ring_release(c);
        AttUnit unit;
        const bool att_work = att_unit_of(b, last, npos, unit);
        if (!att_work) run_filler_code<KOG_ICACHE_LAYER_KB>(c);  // (a block without attention work waits here anyway)
        if (STASH && (!att_work || STASH_ATT == 1)) stash_fill<MAT_GU>(c, !att_work);  // paced where the block had no attention work
        if (!__syncthreads_and(att_ok)) return false;  // every warp reaches the barrier, failed or not
        end_phase(c);
        // --- O projection + residual
        // (KOG_EXP 11, timing only: O's product takes its input as it stands, so that only the attention
        // blocks' own O rows follow their attention: what folding O into the attention could gain at most)
        if (KOG_EXP != 11 && !(o_merges ? stage_attn_merged(c, xs, nbc_now, c.epoch) : stage_copy<QD, NP>(c, xs, HV_ATTN, c.epoch)))
            return false;
        trace_event(c);
        {
            mv_run<MO, MAT_O, NP>(c, xs, red);
            __syncthreads();
            trace_mv(c, MAT_O, 4);
            if (DN_SPLIT == 1) add_to_residual<MO, NP>(c, red, xown);
            else add_o_summed<NP>(c, red, xown, l);
            trace_mv(c, MAT_O, 5);
        }
        if (STASH && att_work && STASH_ATT >= 2) stash_fill<MAT_GU>(c, STASH_ATT == 3);
        end_phase(c);
        if (ATT_EARLY_AT == 3 && l + 1 < NL) att_prefetch<NP>(c, l + 1, pos);  // (the tiles a layer reads were final before this token)
        // --- gate/up + SiLU
        // (KOG_EXP 13, timing only: gate/up's product takes its input as it stands, so that it follows the block's
        // own O rows: what folding O into gate/up, W' = Wgu diag(w2) Wo, could gain at most; PERF.md session 61)
        if (KOG_EXP != 13 && !stage_norm<NP>(c, xs, HV_X, c.epoch, nullptr, sl + S_MLP_NORM, NORM_GATE_UP)) return false;
        trace_event(c);
        {
            mv_run<MGU, MAT_GU, NP>(c, xs, red);
            __syncthreads();
            trace_mv(c, MAT_GU, 4);
            const int r0 = MGU::row0(b), np = (MGU::row0(b + 1) - r0) / 2;
            for (int i = c.tid; i < npos * np; i += NTHR) {
                const int p = item_position<NP>(i, np), j = i - p * np;
                const float gt = mv_result<MGU>(red + p * MV_RED, 2 * j), up = mv_result<MGU>(red + p * MV_RED, 2 * j + 1);
                const float a = gt / (1.0f + expf(-gt)) * up;
                hop_st_tagged(c, act_word(p, r0 / 2 + j), a, c.epoch + 1);
            }
            trace_mv(c, MAT_GU, 5);
        }
        end_phase(c);
        if (ATT_EARLY_AT == 4 && l + 1 < NL) att_prefetch<NP>(c, l + 1, pos);
        if (STASH && STASH_DN) stash_fill<MAT_DN>(c, STASH_DN == 2);
        // --- down + residual
        // (KOG_EXP 14, timing only: down's product takes its slice of act as it stands: the gate/up -> down hop gone)
        if (KOG_EXP != 14 && !stage_copy<DN_K, NP>(c, xs, act_word(0, MDN::group(b) * DN_K), c.epoch)) return false;  // the block's slice
        trace_event(c);
        {
            mv_run<MDN, MAT_DN, NP>(c, xs, red);
            __syncthreads();
            trace_mv(c, MAT_DN, 4);
            if (DN_SPLIT == 1) {
                add_to_residual<MDN, NP>(c, red, xown);
            } else {
                const int r0 = MDN::row0(b), nr = MDN::row1(b) - r0;
                for (int i = c.tid; i < npos * nr; i += NTHR) {
                    const int p = item_position<NP>(i, nr), r = i - p * nr;
                    hop_red_add(c, HV_XSUM + p * H + r0 + r, sum_add(sum_fixed(mv_result<MDN>(red + p * MV_RED, r), SUM_PART_MAX)));
                }
            }
            trace_mv(c, MAT_DN, 5);
        }
        end_phase(c);
    }
    // --- final norm + LM head (+ per-block argmax / sampling keys)
    int cancel = 0;
    if (b == 0 && c.tid == 0) cancel = kog_ld_sys_s32(P->host_cancel);
    if (!stage_norm_layer_input<NP>(c, xs, (c.step + 1) * NL, P->ws + S_FINAL)) return false;
    trace_event(c);
    if (LM_SCREEN && NP == 1 && c.st.lm8) {
        lm_screen_pick(c, xs, red);
    } else {
        const int r0 = MLM::row0(b), nr = MLM::row0(b + 1) - r0;
        Best best[NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) best[p] = {-KOG_INF, 0x7fffffff};
        const auto post_rows = [&](int k0, int n) {  // the logits of the block's rows k0 .. k0 + n - 1, sums at red
            for (int i = c.tid; i < npos * n; i += NTHR) {
                const int p = item_position<NP>(i, n), r = i - p * n;
                const float v = mv_result<MLM>(red + p * MV_RED, r);
                if (!DRAFTS) P->logits[r0 + k0 + r] = v;  // (DRAFTS: greedy, so no logits are kept)
#pragma unroll
                for (int q = 0; q < NP; ++q)
                    if (q == p) post_logit(P, greedy, r0 + k0 + r, v, best[q]);
            }
        };
        if constexpr (LM_WHOLE) {
            mv_run<MLM, MAT_LM, NP>(c, xs, red);
            __syncthreads();
            post_rows(0, nr);
        } else {
            constexpr int ROWS = LM_CHUNK / MLM::NSEG;
            for (int k0 = 0; k0 < nr; k0 += ROWS) {
                mv_run<MLM, MAT_LM, NP, LM_CHUNK>(c, xs, red, 0.f, k0 * MLM::NSEG);
                __syncthreads();
                post_rows(k0, min(ROWS, nr - k0));
                __syncthreads();  // the next chunk's sums take these' place
            }
        }
        publish_block_bests(c, best);
    }
    if (b == 0 && c.tid == 0) P->ctl[1] = cancel;
    run_filler_code<KOG_ICACHE_KB>(c);
    arrive(c);
    return true;
}

// ---- token choice ------------------------------------------------------------------------
// chosen[p]: the token after position p of the pass (greedy; at step 0 and when sampling, chosen[0] only).
__device__ bool choose_token(Ctx& c, int step, bool greedy, int* chosen, int& cancel) {
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
        static_assert(NPOS <= NW, "a warp gathers a position's best");
        if (c.warp < c.npos) {  // (the last pass's positions: a pass without a draft published one best)
            const Best x = gather_best(c, c.warp);
            if (c.lane == 0) chosen[c.warp] = x.i;
            if (c.warp == 0 && c.lane == 0) c.sint[2] = kog_ldcg_s32(P->ctl + 1);
        }
        __syncthreads();
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
    const int t = kog_ldcg_s32(P->ctl + 0);
    cancel = kog_ldcg_s32(P->ctl + 1);
    __syncthreads();  // (every thread has read chosen[0] before it is written again)
    if (c.tid == 0) chosen[0] = t;
    __syncthreads();
    return true;
}

// ---- drafts (DRAFTS) -----------------------------------------------------------------------
// All threads: the draft for the pass whose first token sits at position pos (context_ids[0 .. pos] hold the context):
// the tokens that followed the latest earlier occurrence of the context's last n tokens, n from DRAFT_NGRAM down
// to DRAFT_MIN_MATCH (bench/lookup_acceptance.py's rule), at most NPOS - 1 of them and as many as the context holds after that
// occurrence, into tokens[1 ..]; the rest of tokens[] repeat tokens[0]. Returns how many were drafted (0: no
// such suffix occurs earlier). The candidates' ends are scanned from the latest back, a round of DRAFT_ROUND at a
// time, until a round holds an occurrence of all DRAFT_NGRAM tokens. Every block runs it alike (the blocks
// need the draft at once: no hop).
constexpr int DRAFT_NGRAM = 4;
// An occurrence that matches the last token alone is mostly a wrong draft on prose, and a pass with a draft
// costs more than one without: two tokens matched gave free prose 0.88x the plain decode's rate against 0.75x
// with one, and agent text 1.66x against 1.58x (SmolLM2's real weights, H100, PERF.md session 65).
#ifndef KOG_DRAFT_MIN_MATCH  // (timing experiments: another rule; DRAFT_NGRAM + 1: never a draft, every pass one position)
#define KOG_DRAFT_MIN_MATCH 2
#endif
#ifndef KOG_DRAFT_ALWAYS  // timing experiments: 1, every pass drafts NPOS - 1 tokens (the tokens the rule finds, then the
#define KOG_DRAFT_ALWAYS 0  // chosen token again): what a pass of NPOS positions costs, whatever the text (the same tokens)
#endif
constexpr int DRAFT_MIN_MATCH = KOG_DRAFT_MIN_MATCH;
constexpr int DRAFT_PER_THREAD = 4;
constexpr int DRAFT_ROUND = DRAFT_PER_THREAD * NTHR;
__device__ int draft_search(const Ctx& c, int pos, int* tokens, int* best_key) {
    const int* const ids = c.P->context_ids;
    int tail[DRAFT_NGRAM];  // the context's last tokens, latest first (-1: before the context)
#pragma unroll
    for (int i = 0; i < DRAFT_NGRAM; ++i) tail[i] = pos - i >= 0 ? kog_ldcg_s32(ids + pos - i) : -1;
    if (c.tid == 0) *best_key = 0;
    __syncthreads();
    for (int top = pos - 1; top >= 0; top -= DRAFT_ROUND) {
        int key = 0;  // (matched tokens) << 24 | the occurrence's end, the largest of this thread's ends
#pragma unroll
        for (int k = 0; k < DRAFT_PER_THREAD; ++k) {
            const int e = top - c.tid - k * NTHR;  // an end before the last token
            int h[DRAFT_NGRAM];
#pragma unroll
            for (int i = 0; i < DRAFT_NGRAM; ++i) h[i] = e - i >= 0 ? kog_ldcg_s32(ids + e - i) : -2;
            int n = 0;
#pragma unroll
            for (int i = 0; i < DRAFT_NGRAM; ++i) n += n == i && h[i] == tail[i];
            if (n > 0) key = max(key, n << 24 | e);
        }
        if (key) atomicMax(best_key, key);
        __syncthreads();
        const int best = *best_key;
        __syncthreads();  // (read by all before the next round's adds)
        if (best >> 24 == DRAFT_NGRAM) break;
    }
    const int best = *best_key, e = best & 0xffffff;
    const int n = best >> 24 >= DRAFT_MIN_MATCH ? min(NPOS - 1, pos - e) : 0;
    for (int j = 1 + c.tid; j < NPOS; j += NTHR) tokens[j] = j <= n ? kog_ldcg_s32(ids + e + j) : tokens[0];
    __syncthreads();
    return KOG_DRAFT_ALWAYS ? NPOS - 1 : n;
}

extern "C" __global__ void __launch_bounds__(NTHR, 1) kog_decode(const KParams* __restrict__ P) {
    extern __shared__ __align__(SMEM_ALIGN) float kog_smem[];  // the compiler pads the static part
    __shared__ float red16[NPOS * NW];
    __shared__ int sint[8 + NPOS * NW];
    __shared__ XOwn xown;
    __shared__ int stops[MAXSTOP];
    __shared__ int pass_tokens[NPOS];  // the pass's tokens: the last chosen, then the draft (DRAFTS)
    __shared__ int chosen[NPOS];       // the token after each of the pass's positions
    __shared__ int draft_key;
    Ctx c;
    c.P = P;
    c.b = blockIdx.x;
    c.tid = threadIdx.x;
    c.lane = threadIdx.x & 31;
    c.warp = threadIdx.x >> 5;
    c.epoch = 0;
    c.step = -1, c.layer = -1;  // no token yet: ring_start's refills are not traced
    c.npos = 1;
    c.sm = kog_smem;
    c.red16 = red16;
    c.sint = sint;
    if (gridDim.x != NBLK || blockDim.x != NTHR || (DRAFTS && (!P->greedy || P->use_penalty))) {
        if (c.tid == 0) fail(P, ERR_BAD_ARGS, 0);
        return;
    }
    trace_sm(c);
    const bool greedy = P->greedy != 0;
    const int n_stop = min((int)P->n_stop, MAXSTOP);
    for (int i = c.tid; i < n_stop; i += NTHR) stops[i] = P->stop_ids[i];
    for (int r = c.tid; r < NPOS * MO::MAXR; r += NTHR) kog_xfix[r / MO::MAXR][r % MO::MAXR] = 0;  // the summed words start at 0 (cuda.py)
    release_clock_start(c);
    hop_map_load(c);
    __syncthreads();
    c.ring = reinterpret_cast<uint4*>(kog_smem + SM_FLOATS) + c.warp * RING * SLOT;
    ring_start(c);  // the first token's weights stream while it is chosen

    bool ok = true;
    if (P->debug == DEBUG_HANG && c.b == 0) {  // test knob: wait for a flag that never comes
        if (c.warp == 0) wave_wait(c, 0, 0, 0xffffffffu);
        ok = false;
    }
    if (P->debug == DEBUG_FAULT && c.b == 0 && c.tid == 0)  // test knob: a misaligned 16-byte store
        *reinterpret_cast<float4*>(kog_smem + 3) = make_float4(0.f, 0.f, 0.f, 0.f);
    // pos: where the next token is fed. A pass feeds pass_tokens at pos .. pos + c.npos - 1 (its chosen token and
    // its draft); chosen[j] follows position pos + j, and is the plain decode's token there while the drafts before
    // it were chosen too.
    int pos = (int)P->start_pos, fed = 0, out = 0, reason = 0, passes = 0, drafted = 0;
    for (int step = 0; ok; ++step) {
        int cancel = 0;
        c.step = step;
        c.ev = 0;
        if (!choose_token(c, step, greedy, chosen, cancel)) {
            ok = false;
            break;
        }
        int kept = 0;  // draft tokens the pass confirmed
        while (kept < drafted && pass_tokens[1 + kept] == chosen[kept]) ++kept;
        int token = 0, j = 0;
        for (; j <= kept && !reason; ++j) {  // the pass's tokens, each checked as the plain decode checks it
            token = chosen[j];
            if ((unsigned)token >= (unsigned)VOCAB) token = 0;  // NaN logits must not index past the table
            ++out;
            if (c.b == 0 && c.tid == 0) {
                // the host reads a slot once it is no longer -1: one store, no system fence on the
                // critical path (block 0's next phase would wait for it)
                kog_st_relaxed_sys_s32(P->host_tokens + out - 1, token);
                P->tok_time[out - 1] = kog_clock_ns();
                if (P->use_penalty) atomicOr(P->rep_bits + (token >> 5), 1u << (token & 31));
            }
            if (DRAFTS && c.tid == 0) P->context_ids[pos + j] = token;  // (every block: its draft search reads it)
            bool is_stop = false;
            for (int i = 0; i < n_stop; ++i) is_stop |= stops[i] == token;
            if (is_stop) reason = R_STOP;
            else if (out == (int)P->max_tokens) reason = R_LENGTH;
            else if (pos + j + 1 >= (int)P->ctx_limit) reason = R_CONTEXT;
            else if (cancel) reason = R_CANCEL;
        }
        // the kept drafts before the last token are in the cache
        fed += j - 1;
        pos += j - 1;
        if (reason) break;
        if (c.tid == 0) pass_tokens[0] = token;  // (the checks above read pass_tokens[1 ..] only)
        __syncthreads();
        if (DRAFTS) drafted = KOG_EXP == 16 ? 0 : KOG_EXP == 17 ? P->max_tokens < 0 : draft_search(c, pos, pass_tokens, &draft_key);
        c.npos = 1 + drafted;
        if (DRAFTS && LM_SCREEN) c.st.lm8 = !drafted && screens_lm_head(P);  // (its stream reaches the LM head in this pass)
        if (!(DRAFTS && KOG_EXP != 16 && drafted ? forward<NPOS>(c, pass_tokens, pos, greedy, xown) : forward<1>(c, pass_tokens, pos, greedy, xown))) {
            ok = false;
            break;
        }
        ++pos;
        ++fed;
        ++passes;
    }
    if (c.b == 0 && c.tid == 0) {
        P->status[ST_OUT] = out;
        P->status[ST_FED] = fed;
        P->status[ST_REASON] = reason;
        P->status[ST_PASSES] = passes;
        if (!ok) atomicCAS(P->status + ST_ERROR, 0, 2);
    }
    release_clock_flush(c);
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
        out[11] = HOP_WORDS;
        out[12] = FLAGS;
        out[13] = MAXSTOP;
        out[14] = DN_LAYOUT;  // the host lays down's weights out in its slices
        out[15] = HOP_COPIES;
        out[16] = LM_SCREEN;  // the weights hold the LM head's int8 rows at OFF_LM8, their constants at S_LMQ
        out[17] = NPOS;
    }
}
