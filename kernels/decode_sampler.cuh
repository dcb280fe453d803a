// Part of the decode monokernel (kernels/decode.cu): logits to token: greedy argmax and the exact sampler.
// Included by decode.cu after decode_common.cuh (the shape constants and Ctx); not standalone.
#pragma once

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
// greedy: (penalized value, index); sampling: (key as float bits ignored) -> we keep the key max.
// The block's best of each of the pass's first N positions: position p's in slot p NBLK + b.
template <int N>
__device__ void publish_block_bests(const Ctx& c, Best (&x)[N]) {
    float* sv = c.red16;  // [N][NW]
    int* si = c.sint + 8;
#pragma unroll
    for (int p = 0; p < N; ++p) {
        best_wave(x[p]);
        if (c.lane == 0) sv[p * NW + c.warp] = x[p].v, si[p * NW + c.warp] = x[p].i;
    }
    __syncthreads();
    if (c.tid < N) {
        const int p = c.tid;
        Best y = {sv[p * NW], si[p * NW]};
        for (int w = 1; w < NW; ++w)
            if (better(sv[p * NW + w], si[p * NW + w], y.v, y.i)) y.v = sv[p * NW + w], y.i = si[p * NW + w];
        c.P->slot_val[p * NBLK + c.b] = y.v;
        c.P->slot_idx[p * NBLK + c.b] = y.i;
    }
    __syncthreads();
}
__device__ __forceinline__ void publish_block_best(const Ctx& c, Best x) {  // the pass's first position
    Best xs[1] = {x};
    publish_block_bests(c, xs);
}

// One wave: the best (value, index) over every block's published candidate (of position p).
__device__ Best gather_best(const Ctx& c, int p = 0) {
    Best x = {-KOG_INF, 0x7fffffff};
#pragma unroll
    for (int j = c.lane; j < NBLK; j += KOG_WAVE) {
        const float v = kog_ldcg(c.P->slot_val + p * NBLK + j);
        const int i = kog_ldcg_s32(c.P->slot_idx + p * NBLK + j);
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

// Every thread: f(i) for each vocabulary index i (strided over the block) whose bin is `bin`.
template <class F>
__device__ __forceinline__ void for_each_in_bin(const Ctx& c, int bin, F f) {
    const uint4* bins4 = reinterpret_cast<const uint4*>(c.P->bins);  // 8 bins (uint16) per load
    for (int q = c.tid; q < VPAD / 8; q += NTHR) {
        const uint4 v = kog_ldcg_u4(bins4 + q);
        const unsigned w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if ((int)((w4[j >> 1] >> ((j & 1) * 16)) & 0xffffu) == bin) f(q * 8 + j);
    }
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
    for_each_in_bin(c, bstar, [&](int i) {
        const int at = atomicAdd(s.misc + 1, 1);
        if (at < CAP) s.ckey[at] = kog_ldcg_u32(P->keys + i), s.cidx[at] = i;
    });
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
    int mine = 0;
    for_each_in_bin(c, bm, [&](int i) {
        if (prob_of(kog_ldcg_u32(c.P->keys + i), smax) >= thr) ++mine;
    });
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
    constexpr int per = (NBINS + NTHR - 1) / NTHR;  // bins per thread, in thread order
    unsigned cl[per];
    kog_u64 ml[per];
    kog_u64 csum = 0, msum = 0;
#pragma unroll
    for (int k = 0; k < per; ++k) {
        const int b = c.tid * per + k;
        cl[k] = 0, ml[k] = 0;
        if (b < NBINS) {
            cl[k] = kog_ldcg_u32(P->hist_cnt + b);
            ml[k] = kog_ldcg_u64(P->hist_mass + b);
            P->hist_cnt[b] = 0;
            P->hist_mass[b] = 0;
        }
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
        if (b < NBINS) s.cnt[b] = (unsigned)cex, s.mass[b] = mex;
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
