// Part of the decode monokernel (kernels/decode.cu): the shape as compile-time constants, the
// weight layout, the parameter block, the shared-memory plan and the per-block context.
#pragma once
#include "portability.cuh"
#include "decode_status.cuh"

#ifndef KOG_EXP  // timing experiments only (bench/decode_breakdown.py): 1 no attention math, 2 no weight
#define KOG_EXP 0  // loads, 3 weights without the L2 evict-first hint, 4 no waits between blocks (garbage
#endif             // tokens: what streaming and the math cost when no block waits for another), 5 the
                   // attention units' merge publishes at once (garbage: what waiting for the records costs),
                   // 6 the attention takes q/k/v without waiting for them, 7 the LM head's screen reads no bf16 rows,
                   // 8 the layers' weights stream three quarters of their bytes and are decoded as 12-bit weights
                   // (garbage tokens: what lossless 12-bit weights would cost and save), 9 the same for
                   // gate/up and down only, 10 the layers' weights stand resident (no copies, waits, refills),
                   // 11 O's product does not wait for the attention (the attn -> O hop gone), 12 the layers'
                   // and LM head's weights streamed from a second buffer laid out by L2 partition (garbage
                   // tokens: what a block pair's tiles sharing 8 KB pairs, each block its own partition's
                   // chunk of every pair, would stream: side_granule in decode_ring.cuh), 13 gate/up's product
                   // does not wait for O (the O -> gate/up hop gone), 14 down's does not wait for gate/up, 15 a
                   // pass of several positions runs the products' math for its first position only (garbage
                   // tokens: what the other positions' dot products cost; with KOG_DRAFT_ALWAYS), 16 the drafts'
                   // build with neither its draft search nor its several-position code (every pass one position:
                   // what its layouts cost a pass without a draft), 17 no draft search, the several-position
                   // code built but never run (what the search costs, and with 16 what that code's registers cost),
                   // 18 a pass of several positions gathers its norms' inputs of its first position only (garbage
                   // tokens: what the other positions' tagged words cost the two norms; with KOG_DRAFT_ALWAYS)
#ifndef KOG_NTHR  // timing experiments: threads per block (0: NTHR below)
#define KOG_NTHR 0
#endif
#ifndef KOG_RING  // timing experiments: weight granules in flight per warp (0: RING below)
#define KOG_RING 0
#endif
#ifndef KOG_POLL_NS  // timing experiments: ns a poll of other blocks' words sleeps before it looks again
#define KOG_POLL_NS 0  // (0: it looks again at once); polls read L2, beside the weight stream
#endif
#ifndef KOG_LM_SCREEN  // greedy decoding without penalties screens the LM head's rows in int8: 0 no, 1 yes,
#define KOG_LM_SCREEN -1  // -1 by shape (LM_SCREEN below)
#endif
#ifndef KOG_HOLD  // timing experiments: HOLD below forced to this mask (0: no holds)
#define KOG_HOLD -1
#endif
#ifndef KOG_ATT_TBR  // timing experiments: attention tiles per round (0: TBR below)
#define KOG_ATT_TBR 0
#endif
#ifndef KOG_ATT_SPLIT  // timing experiments: warps a (query head, tile) pair takes at most (ATT_SPLIT_MAX below;
#define KOG_ATT_SPLIT -1  // -1: by shape, 1: a warp a pair)
#endif
#ifndef KOG_LANE_SUMS  // timing experiments: granules per warp at most where a product keeps lane sums (Mv::LANE_SUMS;
#define KOG_LANE_SUMS 4   // 0: every product sums its granules by shuffles)
#endif
#ifndef KOG_ATT_RMAX  // timing experiments: ATT_RMAX below forced to this (-1: by shape)
#define KOG_ATT_RMAX -1
#endif
#ifndef KOG_CM  // timing experiments: CM_MAX below forced to this (-1: by shape)
#define KOG_CM -1
#endif
#ifndef KOG_STASH  // timing experiments: STASH below forced to this (-1: by shape)
#define KOG_STASH -1
#endif
#ifndef KOG_STASH_ATT  // timing experiments: where a block that ran the attention stashes gate/up (STASH_ATT below; -1: by shape)
#define KOG_STASH_ATT -1
#endif
#ifndef KOG_STASH_DN  // timing experiments: down's stash (STASH_DN below; -1: by shape)
#define KOG_STASH_DN -1
#endif
#ifndef KOG_SLOT_U  // timing experiments: 16-byte vectors per lane a ring or stash slot holds (0: SLOT below)
#define KOG_SLOT_U 0
#endif
#ifndef KOG_STASH_XS  // timing experiments: gate/up's extra stash granule in the input region's gaps, where they fit (-1: by shape)
#define KOG_STASH_XS -1
#endif
#ifndef KOG_STASH_PACE  // timing experiments: a stashing warp's granules in flight at most (STASH_PACE below)
#define KOG_STASH_PACE 1
#endif
#ifndef KOG_DN_SPLIT  // timing experiments: DN_SPLIT below forced to this (-1: by shape; 1: down unsplit)
#define KOG_DN_SPLIT -1
#endif
#ifndef KOG_DN_LAYOUT  // the column slices down's weights are laid out in (DN_LAYOUT below; -1: DN_SPLIT's own)
#define KOG_DN_LAYOUT -1
#endif
#ifndef KOG_DRAFTS_DN_HALVES  // 1: the drafts' build cuts down in two where the plain build leaves it whole on a small
#define KOG_DRAFTS_DN_HALVES 0  // shape (DN_SPLIT below; tokens checked, no gain on real replies: off)
#endif
#ifndef KOG_ATT_EARLY  // timing experiments: when an attention block issues its first round of K/V tiles (ATT_EARLY_AT
#define KOG_ATT_EARLY -1  // below): 2 before the layer's QKV input is polled, 1 after that (before the QKV product),
#endif                    // 0 at the attention's start; 3 the next layer's after O's product, 4 after gate/up's
                          // (a token's first layer's at its start, as 2); -1 by shape
#ifndef KOG_GATHER_PAIRS  // timing experiments: pairs in flight a thread in a tagged gather (GATHER_PAIRS, decode_sync.cuh;
#define KOG_GATHER_PAIRS 0  // 0: by build)
#endif
#ifndef KOG_GATHER_TO_XS  // the drafts' build's gathers of several positions (norms, O's and down's inputs) put each
#define KOG_GATHER_TO_XS -1  // pair into the product's input region as it lands, n pairs a thread in flight
#endif  // (GATHER_TO_XS, decode_sync.cuh; 0: no, GATHER_PAIRS held in registers; -1: by shape)
#ifndef KOG_REC_PAD  // the attention records (HV_PART): 0 packed, 1 padded to whole 128-byte lines, 2 padded to 2 D
#define KOG_REC_PAD -1  // words (whole lines and a power of two), -1 by shape (REC_W below)
#endif
#ifndef KOG_QKV_SKIP  // timing experiments: leading blocks that take no QKV rows (QKV_SKIP below; -1: by shape)
#define KOG_QKV_SKIP -1
#endif
#ifndef KOG_PRODUCT_WARPS  // timing experiments, with KOG_EXP 10 only: the layer products' granules over this many warps
#define KOG_PRODUCT_WARPS 0  // (0: all)
#endif
#ifndef KOG_ICACHE_KB  // timing experiments: n KB of straight-line code (64 FMAs a KB) run once a token, after the LM head,
#define KOG_ICACHE_KB 0   // to see whether the per-token code outgrows the instruction cache (bench/fetch_probe.py)
#endif
#ifndef KOG_ICACHE_LAYER_KB  // ... run once a layer by the blocks without attention work, while the attention runs
#define KOG_ICACHE_LAYER_KB 0
#endif
#ifndef KOG_HOP_COPIES  // copies of the vectors that cross blocks: 2, one homed in each L2 partition (the hop space
#define KOG_HOP_COPIES 2  // below; engine/backends/l2_sides.py maps them), or 1 (one copy, wherever its lines are homed)
#endif
#ifndef KOG_MMA  // the drafts' build: which products run on the tensor cores (Mv::MMA): 0 none, 1 the LM head's bf16 rows,
#define KOG_MMA -1  // 2 those and gate/up and down; -1 by shape (MMA_PRODUCTS below)
#endif
#ifndef KOG_MMA_ONE_FMA  // a pass without a draft multiplies the tensor cores' granules (Mv::MMA) on them (0) or in
#define KOG_MMA_ONE_FMA 1  // FMAs (1: such a pass 4-10% faster on the 1-7B shapes, PERF.md session 78)
#endif
#ifndef KOG_NPOS  // positions a pass: 1 the plain decode; n > 1 a pass checks n - 1 draft tokens copied from the context
#define KOG_NPOS 1  // (greedy only; the tokens are the plain decode's: decode.cu, drafts)
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
// Positions a pass. Where NPOS > 1, every vector that crosses blocks, every product's input and sums and the
// attention's queries come NPOS times, one per position (position p's words follow position p - 1's); a pass
// feeds the chosen token and up to NPOS - 1 draft tokens copied from the context, and keeps the drafts up to the
// first the model would not have chosen (decode.cu). The weights stream once a pass.
constexpr int NPOS = KOG_NPOS;
constexpr bool DRAFTS = NPOS > 1;
static_assert(NPOS >= 1 && NPOS <= 8, "positions a pass");
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }

// Threads per block: 384 leaves 168 registers per thread (512 caps them at 128, with spills).
// 256 would keep Llama-3.2-1B's down inputs in registers (8 granules per row: 8 warps, not 12)
// and ran +1.4% there at a 32-token context, but -0.7% at 1k and -1.6% at 4k (PERF.md v15).
constexpr int NTHR = KOG_NTHR > 0 ? KOG_NTHR : 384;
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
constexpr int ATT_TILES = (G * D + 2 * NPOS * D + NW * (D + 2) + NW * 32 + 31) / 32 * 32;  // where the K/V tiles start (floats)
// A kv head's query heads span G x D >= 512 values (of the four shapes, Qwen2.5's 6 x 128). Several
// measured defaults split on this (ATT_RMAX, QKV_SKIP, STASH_ATT, STASH_DN, STASH_XS): a split the
// timings drew, not one the model explains.
constexpr bool WIDE_KV_GROUP = G * D >= 512;
// Rounds of tiles an attention unit takes at most where a kv head's query heads are split over
// several blocks (att_unit_of; 0: never split). A block's tile math grows with the (query head,
// tile) pairs it runs and with D: Qwen2.5 (G = 6, D = 128) took 2.2 us a round with 12 pairs and
// 1.5 with 6, SmolLM2 (3, 64) 1.3 us with 9. Splitting Qwen2.5's heads gained +0.9%, where SmolLM2
// lost 4% and Llama (4, 64) moved +0.3% (PERF.md session 18): so only where G x D reaches 512.
constexpr int ATT_RMAX = KOG_ATT_RMAX >= 0 ? KOG_ATT_RMAX : WIDE_KV_GROUP ? 1 : 0;
// Where a kv head's tiles span 2 .. CM_MAX units, no unit merges the records: every block merges
// them as it stages O's input (stage_attn_merged, decode_attention.cuh). Only where a thread
// stages one pair of O's input: SmolLM2 (QD 576) gained +3.7% at a 32-token prompt and +3.9% at
// 160 with 3; with 5 it lost 2.5%, and Llama lost 12.6% with 3 (spills; PERF.md session 32). (Only in a pass
// of one position: in a pass of several a thread would stage several pairs, and the units merge themselves.)
constexpr int CM_MAX = KOG_CM >= 0 ? KOG_CM : QD <= 2 * NTHR ? 3 : 0;
// Whether a kv head's nbc (> 1) units are merged by every block as it stages O's input, in a pass whose code is
// built for NP positions.
template <int NP>
__host__ __device__ __forceinline__ constexpr bool merged_in_o(int nbc) { return NP == 1 && CM_MAX > 1 && nbc <= CM_MAX; }
// Words of one (unit, query head) record of the attention (at HV_PART): D values, the max and the sum.
// By shape: where O's gather merges the units' records (CM_MAX), padded to whole 128-byte lines, so that the
// warps reading different heads' records never load the same line in one round: in
// bench/sync_probe.py a second load of a line that another load of the same multiprocessor has in
// flight costs the hop ~0.3 us; SmolLM2 gained +0.9 to +2.9% at a 32-token prompt, +1.6 to +2.2% at 160
// (PERF.md sessions 33-34). Padded further to 2 D words, rec_at packs them into chunks by shifts, not a
// division (SmolLM2 +0.5% at 32, +0.3% at 1,000: sessions 56-57). The units' own merge (the big shapes)
// reads even padded (session 34).
constexpr int REC_PAD = KOG_REC_PAD >= 0 ? KOG_REC_PAD : CM_MAX > 0 ? 2 : 0;
constexpr int REC_W = REC_PAD == 2 ? 2 * D : REC_PAD == 1 ? (D + 2 + 15) / 16 * 16 : D + 2;
constexpr int ATT_BUDGET = 24000;  // floats of shared memory the attention phase may take (94 KB)
// Tiles per round. Where O's gather merges the units (CM_MAX), at most 3: SmolLM2's 9 busy warps of
// 12 against 4 tiles gained +0.5% at a 32-token prompt, +2.1% at 1,000 and 0 at 4k (the means of
// two sessions' timings, PERF.md sessions 32-33).
constexpr int TBR = KOG_ATT_TBR > 0 ? KOG_ATT_TBR
                  : cmin(cmin((ATT_BUDGET - ATT_TILES) / TILE_F, NW / G), CM_MAX > 0 ? 3 : NW);
static_assert(G + 2 <= NW && TBR >= 1 && TBR <= NW / G, "a block holds one kv head's query heads, k and v, and a round's tiles");
// Where a unit's gh x TBR (query head, tile) pairs leave warps idle (Qwen2.5's one-head groups: 2
// pairs on 12 warps; Qwen3: 4), a tile's positions are split over `split` warps, `split` lanes a
// position (att_tile), so that its math runs in 1 / split of the steps (Qwen3 +1.1%, Qwen2.5 even
// untraced and its attention 0.45 us shorter traced: PERF.md session 51). Powers of two up to
// ATT_SPLIT_MAX; with whole head groups (ATT_RMAX 0) gh is G at every position and the split fixed.
__host__ __device__ constexpr int pow2_floor(int x) { return x >= 32 ? 32 : x >= 16 ? 16 : x >= 8 ? 8 : x >= 4 ? 4 : x >= 2 ? 2 : 1; }
constexpr int ATT_SPLIT_BY_SHAPE = cmin(8, pow2_floor(NW / ((ATT_RMAX > 0 ? 1 : G) * TBR)));  // (att_tile: four rows a warp at least)
constexpr int ATT_SPLIT_MAX = KOG_ATT_SPLIT > 0 ? cmin(pow2_floor(KOG_ATT_SPLIT), ATT_SPLIT_BY_SHAPE) : ATT_SPLIT_BY_SHAPE;
// (a constant where no split applies, so that those shapes' code is the unsplit one)
__device__ __forceinline__ int att_split(int gh) { return ATT_SPLIT_MAX == 1 ? 1 : cmin(ATT_SPLIT_MAX, pow2_floor(NW / (gh * TBR))); }

// ---- the attention's plan: which blocks run which (position, kv head, query heads, tiles) ----
// Each of a pass's npos positions has its own units (a unit runs one query position, as the plain decode's), so
// that a pass's attention spreads over npos times the blocks (a pass of one position: the plain decode's plan).
__host__ __device__ __forceinline__ constexpr int att_units_per_head(int ntile, int npos, int& tpu) {
    const int want = cmin((ntile + TBR - 1) / TBR, NBLK / (NKV * npos));
    tpu = (ntile + want - 1) / want;  // tiles per block-unit
    return (ntile + tpu - 1) / tpu;   // no empty unit
}

struct AttUnit {  // a block's attention unit for one pass: the pass's position p, kv head g, its query heads h0 .. h0 + gh - 1,
    int p, g, h0, gh, bc, nbc, t0, t1;  // unit bc of nbc, tiles [t0, t1)
};
// Block b's unit when the pass of npos positions ends at position pos (every position's units take the tiles of
// the last's plan; a position's query reads those of its rows that are in its context); false where the block
// has none. While the
// context is short (ATT_RMAX), a kv head's query heads are split over several blocks, the most
// groups whose units take at most ATT_RMAX rounds of tiles and fit the grid: each block then
// runs fewer (head, tile) pairs, and its units need no merge where one unit covers every tile.
__host__ __device__ __forceinline__ constexpr bool att_unit_of(int b, int pos, int npos, AttUnit& a) {
    const int ntile = (pos + 32) / 32;
    int groups = 1, tpu = 0;
    if (ATT_RMAX > 0) {
        constexpr int RMAX = cmax(ATT_RMAX, 1);  // (ATT_RMAX > 0 here: no division by zero in dead code)
        const int want = ((ntile + TBR - 1) / TBR + RMAX - 1) / RMAX;  // units per (kv head, group)
#pragma unroll
        for (int h = G; h > 1; --h)
            if (groups == 1 && G % h == 0 && npos * NKV * h * want <= NBLK) groups = h;
        if (groups > 1) tpu = (ntile + want - 1) / want, a.nbc = (ntile + tpu - 1) / tpu;
    }
    if (groups == 1) a.nbc = att_units_per_head(ntile, npos, tpu);
    const int per_g = groups * a.nbc, per_p = NKV * per_g;
    if (b >= npos * per_p) return false;
    a.p = npos == 1 ? 0 : b / per_p;
    b -= a.p * per_p;
    a.g = b / per_g;
    const int r = b - a.g * per_g, hg = groups > 1 ? r / a.nbc : 0;
    a.bc = r - hg * a.nbc;
    a.gh = G / groups, a.h0 = hg * a.gh;
    a.t0 = a.bc * tpu, a.t1 = cmin(ntile, a.t0 + tpu);
    return true;
}
// Blocks 0 .. att_min_blocks() - 1 run an attention unit at every position, in every pass (units take the
// grid's first blocks). Past TBR x RMAX x NBLK tiles a kv head's query heads form one group of about
// NBLK / NKV units, more than the fewest, so the plans up to there decide it (a 16-block grid takes
// 10 on Qwen2.5 where one tile takes 12: the fewest is not always at one tile).
__host__ __device__ constexpr int att_min_blocks() {
    int least = NBLK;
    for (int npos = 1; npos <= NPOS; ++npos)
        for (int t = 1; t <= TBR * cmax(ATT_RMAX, 1) * NBLK; ++t) {
            AttUnit a{};
            att_unit_of(0, 32 * (t - 1), npos, a);  // block 0 always has a unit; its group holds nbc of them
            least = cmin(least, npos * NKV * (G / a.gh) * a.nbc);
        }
    return least;
}
// QKV_SKIP: the first blocks, which run the attention at every position, take no QKV rows: their
// layer-input poll waits behind their early K/V tiles (ATT_EARLY), so they start QKV ~0.4 us after
// the median block (PERF.md session 28). Measured: Qwen2.5 (12 blocks) +0.4%, Llama (8) -0.6%,
// SmolLM2 (3) -1%: where G x D reaches 512, like ATT_RMAX's split.
constexpr int QKV_SKIP = KOG_QKV_SKIP >= 0 ? KOG_QKV_SKIP : WIDE_KV_GROUP ? att_min_blocks() : 0;
// (att_min_blocks() only where blocks skip: its loops pass the compiler's constant-evaluation limit on some
// shapes at eight positions a pass, SmolLM2-1.7B's 32 kv heads)
static_assert(QKV_SKIP >= 0 && (QKV_SKIP == 0 || QKV_SKIP <= att_min_blocks()), "only blocks that always run the attention skip QKV");
// Where two rounds' tiles fit (ATT_BUDGET2 beside the 96 KB ring), a unit of several rounds loads
// the next round's tiles while it computes this one's (long contexts: PERF.md v16).
constexpr int ATT_BUDGET2 = 30000;  // floats (117 KB)
constexpr int ATT_STAGES = ATT_TILES + 2 * TBR * TILE_F <= ATT_BUDGET2 ? 2 : 1;

static_assert(NH % NKV == 0, "query heads must be a multiple of kv heads");
static_assert(D % 64 == 0 && D <= 256, "head_dim must be 64, 128, 192 or 256");
static_assert(H % 8 == 0 && INTER % 8 == 0 && QD % 8 == 0, "dims must be multiples of 8");
// Down split by columns. SiLU(gate)*up crosses blocks as tagged words; where it is too long for
// every block to gather (INTER > 4096: all of a long act, tagged, flooded L2 -- Llama: 5.5 us a
// layer), down's columns are cut into DN_SPLIT slices of at most H columns, and each
// slice goes to its own group of blocks, which split down's rows among them. A block then gathers
// only its slice of act (no more words than the x it gathers for each norm), and adds partial
// sums of its rows to the residual stream's summed words (decode_sync.cuh): exact fixed-point adds,
// so the result does not depend on their order.
// Measured (PERF.md session 23) against act behind per-block flags and copied whole (v29): Llama
// +3.0% (4 slices; 16 slices -2%), Qwen2.5 +3.6% (7; 10 +2%, 5 -2%), Qwen3 0 (3; 4 -3%); SmolLM2,
// whose whole act is one cheap tagged hop, -8% with 3 slices. Down's weights are laid out
// per slice of the plain build's split: [DN_LAYOUT][H][INTER / DN_LAYOUT]. A shape without such a split (INTER / 8 with no
// divisor up to 32 that fits) takes the fewest slices a block can gather (Tagged: 64 words a
// thread at most): correct, and slower.
// The drafts' build reads down in the plain build's layout (DN_LAYOUT: the host passes its split), and may split it
// further. Where the plain build leaves down whole on a small shape (H < 1,024), every block of the drafts' build
// gathers five positions' act; in two slices (KOG_DRAFTS_DN_HALVES) SmolLM2-135M's five-position passes were 4.1%
// faster and its passes without a draft 2.4% slower (split forced with weights laid out to match, PERF.md session 79;
// over the plain layout -4.6% / +1.8%, session 81), yet its real replies were no faster (session 81); Llama-3.2-1B in
// two or eight slices instead of its four: both kinds 2-9% slower.
__host__ __device__ constexpr int dn_split_of(int inter, int most) {  // fewest slices of at most `most` columns, whole 16-byte vectors
    for (int n = 1; n <= 32; ++n)
        if (inter / 8 % n == 0 && inter / n <= most) return n;
    return 0;
}
constexpr int DN_SPLIT = KOG_DN_SPLIT > 0 ? KOG_DN_SPLIT
                       : INTER <= 4096 ? (DRAFTS && KOG_DRAFTS_DN_HALVES && H < 1024 && INTER / 8 % 2 == 0 ? 2 : 1)
                       : dn_split_of(INTER, H) ? dn_split_of(INTER, H) : dn_split_of(INTER, 64 * NTHR);
constexpr int DN_K = INTER / DN_SPLIT;  // columns of a slice
static_assert(DN_SPLIT >= 1 && DN_K * DN_SPLIT == INTER && DN_K % 8 == 0 && DN_SPLIT <= 32, "down's column slices");
constexpr int DN_LAYOUT = KOG_DN_LAYOUT > 0 ? KOG_DN_LAYOUT : DN_SPLIT;  // [DN_LAYOUT][H][INTER / DN_LAYOUT]
static_assert(DN_SPLIT % DN_LAYOUT == 0, "each slice inside one of the layout's");

// ---- the hop space -------------------------------------------------------------------------
// The vectors that cross blocks (tagged and summed words) live in one space of HOP_WORDS words. H100/H200's
// L2 is two partitions, each wired to half of the multiprocessors; every line is homed in one of them, and a
// round trip to a line of the other partition takes longer (bench/l2_side_probe.py on H200: an atomic ~310
// cycles near, ~500 far; the map's grain is 4 KB). Every hop is all-to-all, so half of its polls went far.
// With HOP_COPIES 2 the space is kept twice, each copy on lines of one partition, chunk by chunk
// (engine/backends/l2_sides.py maps the chunks and the multiprocessors once at load): a producer stores
// into both copies (a store does not wait for its round trip) and a consumer polls its own partition's.
// The probe's all-to-all hop of 576 words: 884 ns in one copy, 762 ns polled near (902 polled far).
// Words of a vector that a consumer loads together (16-byte pairs, a record's max and sum) never straddle
// a chunk: vectors start on whole lines, pairs on even words; nor do the rows below.
constexpr int HOP_COPIES = KOG_HOP_COPIES;
static_assert(HOP_COPIES == 1 || HOP_COPIES == 2, "one copy of the hop space, or one per L2 partition");
constexpr int HOP_CHUNK = 512;  // words (4 KB) of a chunk: the grain of the partitions' address map
__host__ __device__ constexpr int whole_lines(int words) { return (words + 15) / 16 * 16; }  // (16 words a 128-byte line)
__host__ __device__ constexpr int whole_chunks(int words) { return (words + HOP_CHUNK - 1) / HOP_CHUNK * HOP_CHUNK; }
// A row a consumer reads from its first word's address (a head's q, k, v or attention output, a record) lies in
// one chunk: q/k/v and the attention's output start on a chunk, and the records are packed whole into chunks.
static_assert(HOP_COPIES == 1 || HOP_CHUNK % D == 0, "a head's row in one chunk (cuda.py: one copy for other head sizes)");
constexpr int REC_PER_CHUNK = HOP_CHUNK / REC_W;
constexpr int NREC = NKV * MAXCH * G;  // records of a position: [kv head][unit][query head]
// Each vector holds NPOS positions' rows, [position][element]; SiLU(gate)*up [down's slice][position][element].
constexpr int HV_X = 0;  // where each vector starts: the residual stream (tagged) ...
constexpr int HV_QKV = whole_chunks(HV_X + NPOS * H);
constexpr int HV_ATTN = whole_chunks(HV_QKV + NPOS * NQKV);
constexpr int HV_PART = whole_chunks(HV_ATTN + NPOS * QD);  // the attention units' records
constexpr int HV_ACT = HV_PART + (NPOS * NREC + REC_PER_CHUNK - 1) / REC_PER_CHUNK * HOP_CHUNK;  // SiLU(gate)*up
constexpr int HV_XSUM = HV_ACT + whole_lines(NPOS * INTER);  // DN_SPLIT > 1: the residual stream as summed words
constexpr int HOP_WORDS = HV_XSUM + whole_lines(DN_SPLIT > 1 ? NPOS * H : 0);
// Record r's first word (r: ((position x NKV + kv head) x MAXCH + unit) x G + query head).
__host__ __device__ constexpr int rec_at(int r) { return HV_PART + r / REC_PER_CHUNK * HOP_CHUNK + r % REC_PER_CHUNK * REC_W; }
constexpr int HOP_CHUNKS = (HOP_WORDS + HOP_CHUNK - 1) / HOP_CHUNK;
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
// LM_SCREEN: greedy decoding (without a repetition penalty) streams an int8 copy of the LM head
// instead of its bf16 rows, half the bytes: row r holds q = round(w / s_r) in [-127, 127] with s_r =
// max |w_r| / 127. Each block quantizes the input too, to 16-bit fixed point x ~ s_x (256 h + l) with
// h and l int8, so that a row's q . (256 h + l) is exact integer math (four-way byte dot products,
// two per 4 weights) and a 16-byte vector costs 8 instructions. The screened logit s_r s_x (q_r .
// x_q) then lies within |x| e_r + s_x t_r (+ fp32's subnormal rounding) of the exact logit in any
// fp32 summation order (host, lm_screen_rows: e_r covers |w_r - s_r q_r| and the exact sums'
// rounding, t_r the input's quantization and the screened logit's own rounding), so only rows whose
// upper bound reaches the largest lower bound of their block's rows can be the argmax; those rows' exact logits are then
// computed from the bf16 rows (lm_screen_pick, decode.cu), and the token is their argmax, ties to the
// first index (as the candidates' recompute sums a row: the full head sums in another order, so at
// fp32 near-ties the two may differ, as any two summation orders may). Sampling and penalties read
// every bf16 row as before. The int8 rows' granules carry as many vectors as the bf16 rows' (an
// input vector is 8 registers of bytes, as a bf16 row's is 8 of floats; short rows in pairs, MLM8).
// By shape, rows of at least 1,536 values: after a screened head SmolLM2's weight copies issue slower for
// the whole token, for a reason not yet known (PERF.md v42-v44, session 38).
// DRAFTS: a pass without a draft screens (its one position); a pass with one reads the bf16 rows.
constexpr bool LM_SCREEN = KOG_LM_SCREEN >= 0 ? KOG_LM_SCREEN != 0 : H >= 1536 && H % 16 == 0;
constexpr long long OFF_LM8 = OFF_LMH + (long long)VOCAB * H;  // the int8 rows (bf16 units: two per element pair)
static_assert(!LM_SCREEN || H % 16 == 0, "the int8 rows as whole 16-byte vectors");
// small fp32 vectors per layer
constexpr int S_ATTN_NORM = 0;
constexpr int S_MLP_NORM = H;
constexpr int S_BQKV = 2 * H;
constexpr int S_QNORM = S_BQKV + NQKV;
constexpr int S_KNORM = S_QNORM + D;
constexpr int SSTRIDE = S_KNORM + D;
constexpr int S_FINAL = NL * SSTRIDE;
constexpr int S_LMQ = (S_FINAL + H + 3) / 4 * 4;  // LM_SCREEN: per LM head row, 16-byte aligned: (s_r, e_r, t_r, 0)

// ---- sampler -----------------------------------------------------------------------------
constexpr int NBINS = 1024;  // probability bins: 16 per octave of p/p_max, 64 octaves
constexpr int CAP = 8192;    // candidates sorted at once
constexpr int VPAD = (VOCAB + 7) / 8 * 8;
constexpr float FIX = 1099511627776.0f;  // 2^40: probabilities as exact-sum fixed point

// ---- status words (decode_status.cuh) and the tests' knobs --------------------------------
enum { DEBUG_HANG = 1, DEBUG_FAULT = 2 };  // the tests' failure knobs (Params::debug)

struct KParams {  // every field 8 bytes; cuda.py builds it as a uint64 array in this order
    const unsigned short* w;
    const float* ws;
    float* kc;
    float* vc;
    const float* rcos;
    const float* rsin;
    kog_u64* hop;  // the hop space's chunks (HOP_COPIES x HOP_CHUNKS of them, in some order)
    const unsigned short* hop_map;  // [HOP_COPIES][HOP_CHUNKS]: copy k's chunk j is chunk hop_map[k][j] of hop (copy 1's
                                    // chunk j: copy 0's ^ 1, its neighbour in their 8 KB)
    const unsigned char* sm_side;  // [256]: the copy a multiprocessor (%smid) polls, its L2 partition
    float* logits;
    unsigned* keys;
    unsigned short* bins;
    unsigned* hist_cnt;
    kog_u64* hist_mass;
    float* slot_val;
    int* slot_idx;
    unsigned* flags;
    int* ctl;
    int* status;
    unsigned* rep_bits;
    const int* stop_ids;
    int* host_tokens;
    const int* host_cancel;
    kog_u64* tok_time;
    int* context_ids;  // DRAFTS: the context's tokens, the prompt's from the host, the pass's kept tokens from the kernel
    long long start_pos, max_tokens, ctx_limit, n_stop, greedy, top_k, seed, timeout_ns, debug,
        use_penalty;
    double temperature, top_p, min_p, penalty;
};

// ---- matrix-vector products --------------------------------------------------------------
// 16-byte vectors per lane per granule of a product whose rows hold kv of them, with nw warps per
// block: least padding; then a segment count (granules per row) that divides nw, so that every
// granule a warp takes covers the same columns and its inputs stay in registers (mv_run); then
// the widest.
__host__ __device__ constexpr int pick_u(int kv, int nw) {
#ifdef KOG_U  // timing experiments: U forced (where a row is that long)
    return kv < 32 * KOG_U ? (kv + 31) / 32 : KOG_U;
#endif
    int best = 4, waste = 1 << 30;
    bool fits = false;
    for (int u = 4; u >= 2; --u) {
        const int seg = 32 * u, n = (kv + seg - 1) / seg, w = n * seg - kv;
        if (w < waste || (w == waste && !fits && nw % n == 0)) waste = w, best = u, fits = nw % n == 0;
    }
    return kv < 64 ? (kv + 31) / 32 : best;
}
// MMA products: strip seg of n that a row of nch 64-column granules is cut into starts at this granule (lengths a
// granule apart where n does not divide nch).
__host__ __device__ constexpr int strip_start(int seg, int nch, int n) { return seg * nch / n; }
// The granules the busiest warp takes where each 16-row tile of such a product is cut into n strips, and warp w takes
// strips w, w + nw, ...: strips of equal length where n divides nch, else (n divides nw) each warp always on the same
// strip of a tile's.
__host__ __device__ constexpr int mma_busiest(int tiles, int nch, int nw, int n) {
    int most = 0;
    for (int w = 0; w < nw && w < tiles * n; ++w) {
        const int seg = w % n;
        most = cmax(most, (tiles * n - w + nw - 1) / nw * (strip_start(seg + 1, nch, n) - strip_start(seg, nch, n)));
    }
    return most;
}
// The strips of such a tile: the fewest granules the busiest warp takes, then the fewest strips (their sums meet in
// shared memory, at most 2,048 a position). Strips of equal length first; uneven ones only where the busiest warp takes
// fewer granules: Qwen2.5-Coder-7B's down slices of 37 granules a row, in 14 tiles a block, left two warps of twelve
// two whole tiles each (74 granules against a mean of 43; 49 in six strips).
__host__ __device__ constexpr int mma_strips(int tiles, int nch, int nw, int maxr) {
    int best = 1, most = 1 << 30;
    for (int uneven = 0; uneven < 2; ++uneven)
        for (int n = 1; n <= nch; ++n)
            if ((uneven ? nch % n != 0 && nw % n == 0 : nch % n == 0) && maxr * n <= 2048) {
                const int m = mma_busiest(tiles, nch, nw, n);
                if (m < most) most = m, best = n;
            }
    return best;
}
constexpr int LANE_STRIDE = 36;  // floats per granule of lane sums: 16-byte rows, conflict-free float4 reads
// Which products of the drafts' build run on the tensor cores (KOG_MMA's codes). Their math costs little there, but
// their granules stream slower than the FMA products' (PERF.md session 67): gate/up, down and the LM head on them make
// a five-position pass 12-30% faster and a pass without a draft 4-9% slower, its granules multiplied in FMAs
// (KOG_MMA_ONE_FMA; H100, sessions 76-78: Llama-3.2-1B, Qwen3-1.7B, Qwen2.5-1.5B, Qwen2.5-Coder-7B). A drafted
// decode runs the plain build where the text copies nothing (engine/drafts.py), so ~75% of the drafts' build's passes
// draft (SmolLM2's real replies, 16 prompts), past the 9-30% where the tensor cores break even: on by default from
// H = 1,024; not on the smallest shapes, whose passes are latency chains (SmolLM2-135M: its real replies 0-2% slower
// with them, session 77).
constexpr int MMA_PRODUCTS = KOG_MMA >= 0 ? KOG_MMA : H >= 1024 ? 2 : 0;
template <int K, int NROWS, int RU, int GROUPS = 1, int SKIP = 0, int I8 = 0, int MMA_FROM = 3, int ROWK = K>
struct Mv {  // GROUPS > 1: a matrix of GROUPS column slices ([GROUPS][NROWS][K]), each on its own group of blocks;
             // SKIP: blocks 0 .. SKIP - 1 take no rows (GROUPS 1 only); I8 > 0: rows of 2K int8 weights, each
             // I8 consecutive int8 rows of 2K / I8 (LM_SCREEN); MMA_FROM: the least MMA_PRODUCTS that puts it on the
             // tensor cores; ROWK: the elements of a row as laid out (a slice's rows lie in longer ones where
             // the layout has fewer slices: DN_LAYOUT)
    static constexpr bool INT8 = I8 > 0;
    static constexpr int ROWS8 = cmax(I8, 1);  // int8 rows in a row of the product
    static constexpr int KV = K / 8;  // 16-byte vectors per row
    static constexpr int ROWV = ROWK / 8;  // ... per row as laid out: the stride between rows
    static_assert(ROWK % K == 0 && (GROUPS == 1 || ROWK / K <= GROUPS), "a slice's rows lie in the layout's rows");
    static constexpr int KV8 = KV / ROWS8;  // ... per int8 row
    static constexpr int NUNITS = NROWS / RU;
    static constexpr int NB_LO = (NBLK - SKIP) / GROUPS, NB_HI = (NBLK + GROUPS - 1) / GROUPS;  // blocks of a group
    static_assert(NB_LO >= 1 && (SKIP == 0 || GROUPS == 1), "a block for every column slice");
    static constexpr int MAXR = (NUNITS + NB_LO - 1) / NB_LO * RU;
    // MMA (the drafts' build, MMA_PRODUCTS): a granule is 16 rows times 64 columns, multiplied on the tensor cores
    // (mma_granule_product); a block's 16-row tiles are cut into NSEG strips of a row's granules (mma_strips), and
    // each warp takes whole strips
    static constexpr bool MMA = DRAFTS && !INT8 && MMA_PRODUCTS >= MMA_FROM && MAXR >= 16 && K % 64 == 0;
    static constexpr int TILES = (MAXR + 15) / 16;
    static constexpr int U = MMA ? 4 : pick_u(KV, NW);
    static constexpr int SEGW = 32 * U;
    static constexpr int NCH = K / 64;  // MMA: granules a row
    static constexpr int NSEG = MMA ? mma_strips(TILES, NCH, NW, MAXR) : (KV + SEGW - 1) / SEGW;
    static constexpr int CH = NCH / NSEG;  // MMA: granules of the shortest strip
    static_assert(!MMA || NCH % NSEG == 0 || NW % NSEG == 0, "uneven strips: each warp on one strip of a tile's");
    // MMA: strip seg of a tile holds its row's granules seg_col(seg) .. seg_col(seg + 1) - 1
    __host__ __device__ static constexpr int seg_col(int seg) { return strip_start(seg, NCH, NSEG); }
    // ... and warp w's strips are of strip_len(w) granules (uneven strips: all of seg w % NSEG)
    __device__ static int strip_len(int warp) {
        if constexpr (NCH % NSEG == 0) return CH;
        return seg_col(warp % NSEG + 1) - seg_col(warp % NSEG);
    }
    static constexpr bool FULL = KV % SEGW == 0;
    // Where a warp takes at most four granules (SmolLM2's four layer products, QKV and O on the
    // big shapes but Qwen3's QKV), each lane leaves its partial sum in shared memory and the
    // block's sum adds the 32 of a granule: a granule's dependency chain then ends at its dot
    // products, without a five-step shuffle sum (~150 cycles), and the epilogue's add of 32 values
    // costs less (PERF.md v24, v25: SmolLM2 +2%, Llama +0.6%). Gate/up, down and the LM head
    // stream many granules a warp, and their shuffles hide behind the weight stream.
    static constexpr bool LANE_SUMS = !MMA && MAXR * NSEG <= KOG_LANE_SUMS * NW;
    static constexpr int RED = MAXR * NSEG * ROWS8 * (LANE_SUMS ? LANE_STRIDE : 1);  // floats of the per-granule sums
    // Block b's group (its column slice) holds blocks first(k) .. first(k + 1) - 1.
    __device__ static int group(int b) { return GROUPS == 1 ? 0 : b * GROUPS / NBLK; }
    __device__ static int first(int k) { return (k * NBLK + GROUPS - 1) / GROUPS; }
    // block b's rows: row0(b) .. row1(b) - 1 of its group's NROWS
    __device__ static int row_at(int b, int end) {
        if (GROUPS == 1) return SKIP > 0 && b + end <= SKIP ? 0 : (int)(((long long)(b + end - SKIP) * NUNITS) / (NBLK - SKIP)) * RU;
        const int k = group(b), j = b - first(k) + end;
        return (first(k + 1) - first(k) == NB_LO ? j * NUNITS / NB_LO : j * NUNITS / NB_HI) * RU;  // constant divisors
    }
    __device__ static int row0(int b) { return row_at(b, 0); }
    __device__ static int row1(int b) { return row_at(b, 1); }
    __device__ static long long tile_at(int b) {  // elements: the layout's slice of b's group, then its columns in it
        const int slices = ROWK / K, k = group(b);
        return ((long long)(k / slices) * NROWS + row0(b)) * ROWK + k % slices * K;
    }
};
using MQKV = Mv<H, NQKV, 1, 1, QKV_SKIP>;
using MO = Mv<QD, H, 1>;
using MGU = Mv<H, 2 * INTER, 2, 1, 0, 0, 2>;
using MDN = Mv<DN_K, H, 1, DN_SPLIT, 0, 0, 2, INTER / DN_LAYOUT>;
using MLM = Mv<H, VOCAB, 1, 1, 0, 0, 1>;
// The same rows, int8 (LM_SCREEN). An int8 row shorter than the narrowest granule (64 vectors: H < 1024)
// would leave most of its granule's lanes idle, so that the head streams no faster than in bf16: two rows
// then share a granule, which carries as many bytes as a bf16 row's.
constexpr int LM8_ROWS = H / 16 < 64 && VOCAB % 2 == 0 ? 2 : 1;
using MLM8 = Mv<H / 2 * LM8_ROWS, VOCAB / LM8_ROWS, 1, 1, 0, LM8_ROWS>;
static_assert(!LM_SCREEN || (NW % MLM8::NSEG == 0 && !MLM8::LANE_SUMS && MLM8::U <= 4),
              "int8 inputs in registers; a granule's two integer sums fit 32 bits");
static_assert(MLM8::ROWS8 == 1 || MLM8::NSEG == 1, "a granule of paired int8 rows covers both rows whole");
static_assert(!LM_SCREEN || MLM8::NSEG <= (H / 16 + 63) / 64, "the host's t_r covers this many segments' adds");

// The input vector of a product, staged in shared memory split in two halves: elements 8j..8j+3
// at float4 j of the first half, 8j+4..8j+7 at float4 j of the second. A wave reading the eight
// inputs of 32 consecutive weight vectors then reads consecutive 16-byte words (no bank
// conflicts; interleaved, every such read took two passes).
// Sized for the longest input (H, QD, or down's DN_K columns of SiLU(gate)*up); where gate/up's
// extra stash granule is wanted (STASH_XS: it lives in the gaps O's and gate/up's inputs leave), for
// all of SiLU(gate)*up. The room a short region frees goes to the stash (STASH_FIT).
// Where NPOS > 1, the region holds NPOS such inputs, position p's at p MV_X (no gaps taken).
constexpr bool XS_WANTED = !DRAFTS && (KOG_STASH_XS == 1 || (KOG_STASH_XS < 0 && !WIDE_KV_GROUP));
constexpr int MV_X = cmax(cmax(H, QD), XS_WANTED ? INTER : DN_K);  // a multiple of 8: the sums after it start on 16 bytes
static_assert(cmax(cmax(H, QD), DN_K) <= MV_X && MV_X % 8 == 0, "every product's input fits the input region");
constexpr int XHALF = MV_X / 2;
__device__ __forceinline__ int xs_index(int e) {  // where element e lives (e % 4 == 0 or 2: a float4 / float2 store)
    return (e & 4 ? XHALF : 0) + (e >> 3) * 4 + (e & 3);
}

// A weight vector . its 8 inputs a, b: two chains of four (a product's granule is a dependency
// chain, so its length is what a warp waits for).
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
    float s = kog_bf16_lo(w.x) * a.x, t = kog_bf16_lo(w.z) * b.x;
    s = fmaf(kog_bf16_hi(w.x), a.y, s), t = fmaf(kog_bf16_hi(w.z), b.y, t);
    s = fmaf(kog_bf16_lo(w.y), a.z, s), t = fmaf(kog_bf16_lo(w.w), b.z, t);
    s = fmaf(kog_bf16_hi(w.y), a.w, s), t = fmaf(kog_bf16_hi(w.w), b.w, t);
    return s + t;
}
// LM_SCREEN: the inputs as 16-bit fixed point, x / s_x ~ 256 h + l with h, l int8, four inputs' h and
// l bytes packed into a word each. s_x = max |x| / LM8_XQ in fp32, so x / s_x rounds to at most 32,512
// and lies within 0.504 of it (half a step, and fp32's rounding of s_x, 1 / s_x and x / s_x): the
// host's t_r (lm_screen_rows) is built on both figures.
constexpr float LM8_XQ = 32512.f;
__device__ __forceinline__ void quantize_x4(float4 x, float inv_sx, unsigned& h, unsigned& l) {
    const float v[4] = {x.x, x.y, x.z, x.w};
    h = l = 0u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int q = min(max(__float2int_rn(v[k] * inv_sx), -32639), 32639);  // NaN -> 0; h stays in [-127, 127]
        const int lo = ((q + 128) & 255) - 128, hi = (q - lo) >> 8;
        l |= (unsigned)(lo & 255) << (8 * k), h |= (unsigned)(hi & 255) << (8 * k);
    }
}
// A vector of 16 int8 weights . its inputs' h and l bytes, exact: four-way byte dot products.
__device__ __forceinline__ void dot16_i8(uint4 w, uint4 h, uint4 l, int& sh, int& sl) {
    sh = kog_dot4_i8(w.x, h.x, sh), sl = kog_dot4_i8(w.x, l.x, sl);
    sh = kog_dot4_i8(w.y, h.y, sh), sl = kog_dot4_i8(w.y, l.y, sl);
    sh = kog_dot4_i8(w.z, h.z, sh), sl = kog_dot4_i8(w.z, l.z, sl);
    sh = kog_dot4_i8(w.w, h.w, sh), sl = kog_dot4_i8(w.w, l.w, sl);
}
__device__ __forceinline__ float4 xs_lo(const float* xs, int col) {  // inputs 8col..8col+3 of weight vector col
    return reinterpret_cast<const float4*>(xs)[col];
}
__device__ __forceinline__ float4 xs_hi(const float* xs, int col) {  // inputs 8col+4..8col+7
    return reinterpret_cast<const float4*>(xs + XHALF)[col];
}

template <class M>
__device__ __forceinline__ const uint4* mv_tile(const unsigned short* w, long long off, int b) {
    return reinterpret_cast<const uint4*>(w + off + M::tile_at(b));
}
// The granules of warp `warp` are g = warp + NW i for g below this (M::MMA: warp w takes strips w, w + NW, ...,
// strip_len(w) granules each; else every warp takes every NW-th of the block's).
template <class M>
__device__ __forceinline__ int mv_ngran(int b, int warp) {
    const int nr = M::row1(b) - M::row0(b);
    if constexpr (M::MMA) return warp + NW * M::strip_len(warp) * (((nr + 15) / 16 * M::NSEG - warp + NW - 1) / NW);
    return nr * M::NSEG;
}
template <class M>
__device__ __forceinline__ float mv_result(const float* red, int r) {  // row r of the block, fixed order
    if (M::LANE_SUMS) {
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < M::NSEG; ++j) {
            const float4* p = reinterpret_cast<const float4*>(red + (r * M::NSEG + j) * LANE_STRIDE);
            float4 a = p[0], b = p[1];  // two float4 chains of adds: four lanes' sums each
#pragma unroll
            for (int i = 2; i < 8; i += 2) {
                const float4 u = p[i], v = p[i + 1];
                a = make_float4(a.x + u.x, a.y + u.y, a.z + u.z, a.w + u.w);
                b = make_float4(b.x + v.x, b.y + v.y, b.z + v.z, b.w + v.w);
            }
            s += ((a.x + b.x) + (a.y + b.y)) + ((a.z + b.z) + (a.w + b.w));
        }
        return s;
    }
    float s = red[r * M::NSEG];
#pragma unroll
    for (int j = 1; j < M::NSEG; ++j) s += red[r * M::NSEG + j];
    return s;
}

// ---- shared memory plan (phases never overlap, so they share one region) ------------------
constexpr int SM_SAMPLE = (NBINS * 24 + CAP * 8) / 4 + 64;         // floats
// Copies into shared memory stream at full rate only into aligned lines (PERF.md v11: the ring
// 1 KB-aligned ran 6-18% faster than 64-96 bytes past a 128-byte line, where the static
// variables had left it): the kernel declares the dynamic region SMEM_ALIGN-aligned (the
// compiler pads the static part), and the ring after the region starts aligned too.
constexpr int SMEM_ALIGN = 1024;  // bytes
// the weight ring lives beside that region (aligned like it): it streams across every phase.
// Granules in flight per warp: four, 96 KB per block of 2 KB granules (72 KB of Qwen2.5's 1.5 KB), which
// the big shapes' products need to keep HBM busy. Where a block's share of a whole layer fits in three per warp (SmolLM2), three: the ring
// still runs a layer ahead, and each hop's L2 round trips, which queue behind the weights in
// flight, get shorter (bench/stream_probe.py; PERF.md session 16: +0.8% at 32 tokens, +3% at 1k).
constexpr int SLOT_MAX = 4 * KOG_WAVE;  // 16-byte vectors of the widest granule (U = 4): 2 KB
constexpr long long LAYER_SHARE = 2 * LSTRIDE / NBLK;  // bytes of one layer's weights a block streams
constexpr int RING = KOG_RING > 0 ? KOG_RING : LAYER_SHARE <= NW * 3 * SLOT_MAX * 16 ? 3 : 1536 / NTHR;
constexpr bool LAYER_IN_RING = LAYER_SHARE <= NW * RING * SLOT_MAX * 16;
// 16-byte vectors per slot of the ring and the stash: 2 KB, or where blocks stash (the layer does
// not fit the ring), the shape's widest granule, the int8 LM head's included. Qwen2.5's products all
// take 1.5 KB granules: its 2 KB slots were a quarter empty, and the room freed takes a fifth stash
// granule per warp (PERF.md v34: +0.5%; SmolLM2, which stashes nothing, measured -0.3% with 1.5 KB
// slots, within noise: left at 2 KB).
constexpr int SLOT = KOG_SLOT_U > 0 ? KOG_SLOT_U * KOG_WAVE
                   : LAYER_IN_RING ? SLOT_MAX
                   : cmax(cmax(cmax(MQKV::U, MO::U), cmax(cmax(MGU::U, MDN::U), MLM::U)), LM_SCREEN ? MLM8::U : 0) * KOG_WAVE;
constexpr int RING_BYTES = NW * RING * SLOT * 16;  // the block's slots of weights in flight
// The stash (decode_ring.cuh stash_fill): STASH more granules per warp of gate/up, issued once a
// block's attention work is done, and of down (STASH_DN), issued once gate/up is done, into shared
// memory past the products' inputs and sums (the K/V tiles' place: the next layer's first tiles
// land there after down). Where a block's share of a layer fits the ring (SmolLM2) the ring
// already runs a layer ahead: no stash. STASH_ATT: a block with attention work stashes gate/up 0
// never, 1 after the attention, 2 after its O rows (3: the same, paced): 2, but none where G x D
// reaches 512 (Qwen2.5, whose head groups put 12-60 units on the grid at short contexts: +0.9%
// without it since v34's slots, Llama -1.5% at v27; its unpaced bytes delay those blocks' gate/up
// poll, PERF.md session 28); STASH_DN: 0 no down stash, 1 at once, 2 paced: paced, but none where
// G x D reaches 512 (Qwen2.5: +1% without it since down is split, Llama -0.5%; measured splits,
// like ATT_RMAX's).
// 96 KB of slots a block (four 2 KB granules per warp, five of 1.5 KB: PERF.md v34, where six and
// seven lost), or as many as fit beside the ring (grids of fewer blocks have larger shares and
// inputs: the stash shrinks there, down to none).
// bytes of shared memory per block, the static part's 2 KB and the hop map's copy (decode_sync.cuh) kept free
constexpr int SMEM_LIMIT = 227 * 1024 - 2048 - (HOP_COPIES > 1 ? HOP_CHUNKS * 2 : 0);
// The products' sums, every granule's, NPOS positions' MV_RED apart (LM_SCREEN: the warps' input maxima and sums of
// squares after the int8 rows' sums). The LM head's are the most (Qwen3-8B: a block's 1,152 rows x 4 granules, gate/up's
// 752). Where NPOS positions' inputs and such sums would not fit beside the ring (the drafts' build of Qwen3-4B/8B and
// Qwen2.5-7B), the LM head runs in chunks of LM_CHUNK granules (whole rows, a multiple of NW: every warp keeps its
// granules), each chunk's rows reduced before the next chunk's sums land in their place: the same sums, in the same
// order, in a region sized for the layers' products.
__host__ __device__ constexpr int red_floats(int lm) {
    return (cmax(cmax(cmax(MQKV::RED, MO::RED), cmax(cmax(MGU::RED, MDN::RED), lm)), LM_SCREEN ? MLM8::RED + 2 * NW : 0) + 3) / 4 * 4;
}
__host__ __device__ constexpr int sm_mv_floats(int red) { return (NPOS * (MV_X + red) + 3) / 4 * 4; }
constexpr bool LM_WHOLE = !DRAFTS || MLM::MMA
                       || (sm_mv_floats(red_floats(MLM::RED)) * 4 + SMEM_ALIGN - 1) / SMEM_ALIGN * SMEM_ALIGN + RING_BYTES <= SMEM_LIMIT;
constexpr int LM_ROUND = NW % MLM::NSEG == 0 ? NW : NW * MLM::NSEG;  // granules: whole rows, whole rounds of the warps
constexpr int LM_CHUNK = LM_WHOLE ? MLM::RED : cmax(LM_ROUND, red_floats(0) / LM_ROUND * LM_ROUND);
static_assert(LM_WHOLE || (!MLM::LANE_SUMS && MLM::ROWS8 == 1), "a chunk's sums: one float a granule");
constexpr int MV_RED = red_floats(LM_CHUNK);
constexpr int SM_MV = sm_mv_floats(MV_RED);       // floats: NPOS inputs, then NPOS sums (MV_RED apart)
// The K/V tiles' stages: round k of a unit uses stage k % ATT_STAGES, stage 0 on top. With
// ATT_EARLY, stage 0 lies past the products' region, so that the first round's tiles can land
// while the block still waits for its QKV input and runs the QKV product (att_prefetch; with
// ATT_EARLY_AT 3, while it runs the layer before's gate/up and down too).
// (Not by default with drafts: on the big shapes NPOS products' inputs and sums leave no room past them; SmolLM2's
// drafts' build fits them, KOG_ATT_EARLY 3, not yet timed.)
constexpr bool ATT_EARLY = KOG_ATT_EARLY > 0 || (KOG_ATT_EARLY < 0 && !DRAFTS);
static_assert(KOG_ATT_EARLY >= -1 && KOG_ATT_EARLY <= 4, "KOG_ATT_EARLY: -1 .. 4 (forward() issues the tiles)");
constexpr int ATT_T0 = ATT_EARLY ? cmax(ATT_TILES, (SM_MV + 31) / 32 * 32 - (ATT_STAGES - 1) * TBR * TILE_F) : ATT_TILES;
constexpr int SM_ATTN = ATT_T0 + ATT_STAGES * TBR * TILE_F;      // floats
constexpr int STASH_AT = (SM_MV + SMEM_ALIGN / 4 - 1) / (SMEM_ALIGN / 4) * (SMEM_ALIGN / 4);  // floats
constexpr int STASH_FIT = cmax(0, ((SMEM_LIMIT - RING_BYTES) / SMEM_ALIGN * (SMEM_ALIGN / 4) - STASH_AT) / (NW * SLOT * 4));
constexpr int STASH = KOG_STASH >= 0 ? KOG_STASH : LAYER_IN_RING ? 0 : cmin(96 * 1024 / (NW * SLOT * 16), STASH_FIT);
constexpr int STASH_ATT = KOG_STASH_ATT >= 0 ? KOG_STASH_ATT : WIDE_KV_GROUP ? 0 : 2;
constexpr int STASH_DN = KOG_STASH_DN >= 0 ? KOG_STASH_DN : WIDE_KV_GROUP ? 0 : 2;
constexpr int STASH_PACE = KOG_STASH_PACE;
// While O and gate/up run, their inputs (max(H, QD) elements) leave a gap in each half of the
// input region, up to MV_X (sized for all of SiLU(gate)*up where the granule is wanted): where they
// hold a 2 KB slot for every warp, gate/up's stash may take one granule more per warp there
// (STASH_XS). Measured (PERF.md session 19): Llama +0.6%, Qwen2.5 -0.7% (whose gaps fitted then); G x D
// < 512 tells the two apart, a measured split like ATT_RMAX's, not an understood one. Since v32 the
// same rule sizes the region, so Qwen2.5's has no gaps (its room went to a 4th stash granule).
constexpr int XS_SLOT_F = SLOT * 4;  // floats of a slot
constexpr int XS_GAP0 = (cmax(H, QD) / 2 + XS_SLOT_F - 1) / XS_SLOT_F * XS_SLOT_F;  // first free float of the first half
constexpr int XS_GAP_A = (XHALF - XS_GAP0) / XS_SLOT_F;  // whole slots in the first half's gap
constexpr int XS_GAP_B = (MV_X - XHALF - XS_GAP0) / XS_SLOT_F;  // ... the second half's
constexpr bool XS_FITS = XS_GAP_A > 0 && XS_GAP_A + XS_GAP_B >= NW;
constexpr int STASH_XS = STASH && XS_FITS && XS_WANTED ? 1 : 0;
constexpr int SM_FLOATS = (cmax(cmax(cmax(SM_MV, SM_ATTN), SM_SAMPLE), STASH_AT + STASH * NW * SLOT * 4) + SMEM_ALIGN / 4 - 1)
                        / (SMEM_ALIGN / 4) * (SMEM_ALIGN / 4);
constexpr int SMEM_BYTES = SM_FLOATS * 4 + RING_BYTES;
static_assert(SM_FLOATS * 4 % SMEM_ALIGN == 0 && ATT_T0 % 32 == 0 && TILE_F % 32 == 0, "the ring and the K/V tiles start on whole lines");
static_assert(!ATT_EARLY || ATT_T0 + (ATT_STAGES - 1) * TBR * TILE_F >= SM_MV, "stage 0 clear of the products' region");
static_assert(STASH_PACE >= 1, "a stashing warp keeps at least one granule in flight");
// Where an attention block issues its first round of K/V tiles (KOG_ATT_EARLY's codes). A block moves
// ~120 GB/s from L2, and issuing copies waits on that: issued before the layer's input poll (2), the
// tiles kept that poll waiting (the attention blocks entered the norm ~0.7 us late: PERF.md, Next 00b (d)); issued
// after the layer before's O product (3), inside the hop to gate/up, where every block waits anyway:
// SmolLM2 +1.0 to +2.3% at 32- and 1,000-token prompts (session 47). Where blocks stash (the big shapes)
// the stash holds that room from then on: 2.
constexpr int ATT_EARLY_AT = KOG_ATT_EARLY >= 0 ? KOG_ATT_EARLY : STASH ? 2 : 3;
static_assert(ATT_EARLY_AT < 3 || !STASH, "the next layer's tiles land where the stash would");
static_assert(SMEM_BYTES <= SMEM_LIMIT, "shared memory per block");

// The weight ring's state (the ring itself: decode_ring.cuh).
struct Source {  // the block's tile of one matrix
    const uint4* tile;
    int ngran, kv, nseg, u;
    unsigned nseg_inv;  // ceil(2^32 / nseg) where nseg > 1: granule g's row is umulhi(g, nseg_inv) (exact: g < 2^32 / nseg)
};
#if KOG_EXP == 12  // timing only, set by bench/decode_breakdown.py's weights-near (decode_ring.cuh: side_granule)
__device__ const char* kog_side_w;  // the weights laid out by L2 partition, 256 KB aligned
// the partition of the first chunk of the 8 KB pair at address a: parity(a & kog_side_mask) ^ kog_side_flip (fitted
// by the host to the timed map: bits 13-20 inside a 2 MB page, bits 21 on across pages)
__constant__ unsigned long long kog_side_mask;
__constant__ unsigned kog_side_flip;
__device__ unsigned char kog_block_role[256];  // by %smid: the tiles' region a block streams, its parity its partition
#endif
// KOG_EXP 12 (w: kog_side_w; base: the matrix's first region in kog_side_w): `tile` is the role's block pair's
// region, of as many 8 KB pairs of chunks as the largest tile's granules fill on one side, with the role's
// partition in bit 12. The block streams its own number of granules (the garbage weights' rows are its own rows).
__host__ __device__ constexpr int side_shift(int u) { return u == 1 ? 3 : u == 2 ? 2 : 1; }  // log2 of granules a 4 KB chunk holds
template <class M>
__host__ __device__ constexpr long long side_region() { return 8192ll * ((M::MAXR * M::NSEG + (1 << side_shift(M::U)) - 1) >> side_shift(M::U)); }
constexpr long long SIDE_PAIRS = (NBLK + 1) / 2;
constexpr long long SIDE_LAYER = SIDE_PAIRS * (side_region<MQKV>() + side_region<MO>() + side_region<MGU>() + side_region<MDN>());
#if KOG_EXP == 12
__device__ long long kog_side_bytes = NL * SIDE_LAYER + SIDE_PAIRS * (side_region<MLM>() + side_region<MLM8>());  // (the host reads it)
#endif
template <class M>
__device__ __forceinline__ Source source_of(const unsigned short* w, long long off, int b, int warp, long long base, int role) {
    static_assert(M::U <= SLOT / KOG_WAVE, "granule wider than a ring slot");
    constexpr unsigned inv = M::NSEG > 1 ? (unsigned)((0x100000000ull + M::NSEG - 1) / M::NSEG) : 0u;  // 2^32 would wrap
#if KOG_EXP == 12
    (void)off;
    const unsigned long long region = reinterpret_cast<unsigned long long>(w) + base + role / 2 * side_region<M>();
    return {reinterpret_cast<const uint4*>(region | (role & 1) << 12), mv_ngran<M>(b, warp), M::KV, M::NSEG, M::U, inv};
#else
    (void)base, (void)role;
    return {mv_tile<M>(w, off, b), mv_ngran<M>(b, warp), M::KV, M::NSEG, M::U, inv};
#endif
}
// The matrices in the order the forward pass (and so the weight stream) takes them.
enum { MAT_QKV = 0, MAT_O = 1, MAT_GU = 2, MAT_DN = 3, MAT_LM = 4 };
// The matrices (bit MAT_QKV .. MAT_DN) whose consumption holds the ring's refills for the next
// matrix until that product's input is staged (QKV's: until the block's attention is done), so
// the input's polls are not queued behind 96 KB of weight loads per block (PERF.md v12). Gate/up's
// always wait (the O -> gate/up hop). Where a whole layer's weights per block fit in the ring
// every phase's do: a refill issued early there gains nothing and delays the next input.
constexpr int HOLD = KOG_HOLD >= 0 ? KOG_HOLD
                   : LAYER_IN_RING ? 1 << MAT_O | 1 << MAT_GU | 1 << MAT_DN : 1 << MAT_O;
__device__ __forceinline__ Source stream_source(int mat, int layer, const unsigned short* w, int b, int warp, bool lm8) {
    const long long wl = (long long)layer * LSTRIDE;
#if KOG_EXP == 12
    const int role = kog_block_role[kog_sm_id() % 256];
    const long long sl = layer * SIDE_LAYER, q = SIDE_PAIRS * side_region<MQKV>(), o = q + SIDE_PAIRS * side_region<MO>();
    const long long lm = NL * SIDE_LAYER, lm8x = lm + SIDE_PAIRS * side_region<MLM>();
#else
    constexpr long long sl = 0, q = 0, o = 0, lm = 0, lm8x = 0;
    constexpr int role = 0;
#endif
    switch (mat) {
        case MAT_QKV: return source_of<MQKV>(w, wl + OFF_QKV, b, warp, sl, role);
        case MAT_O: return source_of<MO>(w, wl + OFF_O, b, warp, sl + q, role);
        case MAT_GU: return source_of<MGU>(w, wl + OFF_GU, b, warp, sl + o, role);
        case MAT_DN: return source_of<MDN>(w, wl + OFF_DN, b, warp, sl + o + SIDE_PAIRS * side_region<MGU>(), role);
        default: return LM_SCREEN && lm8 ? source_of<MLM8>(w, OFF_LM8, b, warp, lm8x, role) : source_of<MLM>(w, OFF_LMH, b, warp, lm, role);
    }
}

struct Stream {  // the next granule this warp issues, and the ring's counters
    Source src;
    int mat, layer, g;  // mat: MAT_QKV .. MAT_LM
    unsigned head, tail;  // granules issued / consumed
    unsigned held;        // refills owed (HOLD)
    unsigned groups;      // cp.async commit groups so far (this thread's)
    unsigned tiles_group;  // groups right after the attention's first tiles were committed (ATT_EARLY)
    int stash_g0, stash_n;  // STASH: the next product's granules stash_g0, stash_g0 + NW, ... (stash_n of them) wait in the stash
    unsigned stash_group;   // groups right after the stash's last was committed
    bool lm8;               // LM_SCREEN and this pass screens: the LM head streams its int8 rows
#ifdef KOG_TRACE
    unsigned traced;       // refills recorded by trace_ring
#endif
};
// Whether a launch's LM head may stream its int8 rows (LM_SCREEN: greedy, no penalty); DRAFTS: in the passes
// without a draft only.
__device__ __forceinline__ bool screens_lm_head(const KParams* P) {
#ifdef KOG_LM8_NEVER  // timing experiments: a screened build that never screens (PERF.md session 37)
    return false;
#else
    return LM_SCREEN && P->greedy && !P->use_penalty;
#endif
}

struct Ctx {  // per-block state, identical copies in every thread (the stream: in every lane of a warp)
    const KParams* P;
    int b, tid, lane, warp;
    unsigned epoch;
    int step, ev;      // token step; synchronisation events so far in this step (tracing)
    int layer;         // the layer forward() is in (tracing)
    float* sm;         // dynamic region
    float* red16;      // NW floats scratch
    int* sint;         // small ints scratch
    uint4* ring;       // this warp's RING slots
    kog_u64 l2_policy;  // evict-first: streamed weights must not push the KV cache out of L2
    Stream st;
    int npos;          // the pass's positions, 1 + its draft tokens (pass_positions)
};
// A pass's code is built for NP positions (the template parameter NP of forward() and what it calls): 1, a pass
// without a draft, which runs the plain decode's code and attention plan; or NPOS (DRAFTS), a pass with a draft,
// which feeds its c.npos positions, the chosen token and the draft's (the positions past them take no work).
template <int NP>
__device__ __forceinline__ int pass_positions(const Ctx& c) { return NP == 1 ? 1 : c.npos; }

// The ring's and the K/V tiles' cp.async commit groups go through here: the attention's first
// wait counts the groups committed after its tiles (ATT_EARLY). Only the records' merge commits
// beside it (att_merge: a commit and wait for all), after that wait, so the count between the
// tiles and the wait stays exact.
__device__ __forceinline__ void commit_group(Ctx& c) {
    kog_cp_async_commit();
    ++c.st.groups;
}
