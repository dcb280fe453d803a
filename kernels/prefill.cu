// The batched prefill (engine/backends/cuda_prefill.py drives it), about nine launches a layer:
//
//   add_rms_split  x += (previous product), RMSNorm(x) -> three bf16 terms  (one block per row)
//   cuBLAS         [3n, K] bf16 terms x bf16 weights^T -> [3n, N] fp32       (tensor cores)
//   qkv_rope       sum the terms + bias, q/k RMSNorm, RoPE, K/V into the cache, q out
//   attn           causal GQA attention over the fp32 cache -> three bf16 terms
//   cuBLAS O, add_rms_split, cuBLAS gate/up, silu_split, cuBLAS down
//
// Why three terms: an fp32 activation X is exactly Xh + Xm + Xl up to 2^-24 relative, with each
// term a bf16 number; a bf16 x bf16 product is exact in fp32, so one tensor-core GEMM of the
// stacked terms against the bf16 weights, summed in fp32, is an fp32 product to within fp32
// rounding -- the CPU reference's math -- at tensor-core speed.
#include "portability.cuh"

// fp32 -> bf16 bits, round to nearest even
__device__ __forceinline__ unsigned short kog_to_bf16(float v) {
    const unsigned u = __float_as_uint(v);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// v -> three bf16 terms at out[0], out[slice], out[2 * slice]; each remainder is exact in fp32
__device__ __forceinline__ void kog_split3(float v, unsigned short* out, long long slice) {
    const unsigned short h = kog_to_bf16(v);
    const float r1 = v - kog_bf16(h);
    const unsigned short m = kog_to_bf16(r1);
    const float r2 = r1 - kog_bf16(m);
    out[0] = h;
    out[slice] = m;
    out[2 * slice] = kog_to_bf16(r2);
}

// the three slices of a split product at one element, smallest first (less rounding)
__device__ __forceinline__ float kog_sum3(const float* c, long long slice) {
    return c[0] + (c[slice] + c[2 * slice]);
}

template <int NT>
__device__ __forceinline__ float kog_block_sum(float v, float* red) {
    v = kog_wave_sum(v);
    const int w = threadIdx.x / KOG_WAVE, lane = threadIdx.x % KOG_WAVE;
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < NT / KOG_WAVE ? red[lane] : 0.f;
    v = kog_wave_sum(v);
    __syncthreads();  // red is reused by the next call
    return v;
}

// fp32 -> bf16 (round to nearest even), for uploading weights.
extern "C" __global__ void kog_f32_to_bf16(const float* __restrict__ in, unsigned short* __restrict__ out,
                                           long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = kog_to_bf16(in[i]);
}

// x[r] = embedding row ids[r] in fp32 (exact); one block per row
extern "C" __global__ void kog_embed(const int* __restrict__ ids, const unsigned short* __restrict__ emb,
                                     float* __restrict__ x, int h) {
    const unsigned short* src = emb + (long long)ids[blockIdx.x] * h;
    float* dst = x + (long long)blockIdx.x * h;
    for (int k = threadIdx.x; k < h; k += blockDim.x) dst[k] = kog_bf16(src[k]);
}

constexpr int RMS_THR = 256;

// Row r = row0 + block: x[r] += c (the three slices of the previous product, when c is given),
// then y = x[r] / sqrt(mean(x^2) + eps) * w -- written as three bf16 terms into xs [3n, h], or as
// fp32 into yf[block] when yf is given (the final norm of the last row).
extern "C" __global__ void __launch_bounds__(RMS_THR)
kog_add_rms_split(const float* __restrict__ c, float* __restrict__ x, const float* __restrict__ w,
                  unsigned short* __restrict__ xs, float* __restrict__ yf, int n, int h, int row0, float eps) {
    __shared__ float red[RMS_THR / KOG_WAVE];
    const int r = row0 + blockIdx.x;
    const long long slice = (long long)n * h;
    float* xr = x + (long long)r * h;
    float ss = 0.f;
    for (int k = threadIdx.x; k < h; k += RMS_THR) {
        float v = xr[k];
        if (c) {
            v = v + kog_sum3(c + (long long)r * h + k, slice);
            xr[k] = v;
        }
        ss = fmaf(v, v, ss);
    }
    ss = kog_block_sum<RMS_THR>(ss, red);
    const float rn = sqrtf(ss / (float)h + eps);
    for (int k = threadIdx.x; k < h; k += RMS_THR) {
        const float y = xr[k] / rn * w[k];
        if (yf)
            yf[(long long)blockIdx.x * h + k] = y;
        else
            kog_split3(y, xs + (long long)r * h + k, slice);
    }
}

// One wave per (row, head) of the QKV product c [3n, nqkv] (q heads, then k heads, then v
// heads): sum the slices (+ bias), q/k RMSNorm, RoPE at position start + row; q goes to
// q [n, nh * D], k and v into the layer's cache [nkv, max_ctx, D]. Lane l holds dims l + 32 j,
// so each RoPE pair (i, i + D/2) sits in one lane.
template <int D>
__device__ __forceinline__ void qkv_rope(const float* __restrict__ c, int n, int start, const float* __restrict__ bias,
                                         const float* __restrict__ qnw, const float* __restrict__ knw,
                                         const float* __restrict__ rcos, const float* __restrict__ rsin,
                                         float* __restrict__ kc, float* __restrict__ vc, int max_ctx,
                                         float* __restrict__ q, int nh, int nkv, float eps) {
    constexpr int J = D / KOG_WAVE, HJ = J / 2, HALF = D / 2;
    const int lane = threadIdx.x % KOG_WAVE;
    const int head = blockIdx.x * (blockDim.x / KOG_WAVE) + threadIdx.x / KOG_WAVE;
    const int r = blockIdx.y, pos = start + r;
    if (head >= nh + 2 * nkv) return;
    const int nqkv = (nh + 2 * nkv) * D;
    const long long slice = (long long)n * nqkv;
    const float* cr = c + (long long)r * nqkv + head * D;
    float v[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int i = head * D + j * KOG_WAVE + lane;
        v[j] = kog_sum3(cr + j * KOG_WAVE + lane, slice);
        if (bias) v[j] = v[j] + bias[i];
    }
    if (head < nh + nkv) {
        if (qnw) {  // per-head RMSNorm (Qwen3)
            const float* nw = head < nh ? qnw : knw;
            float ss = 0.f;
#pragma unroll
            for (int j = 0; j < J; ++j) ss = fmaf(v[j], v[j], ss);
            ss = kog_wave_sum(ss);
            const float rn = sqrtf(ss / (float)D + eps);
#pragma unroll
            for (int j = 0; j < J; ++j) v[j] = v[j] / rn * nw[j * KOG_WAVE + lane];
        }
        const float* cs = rcos + (long long)pos * HALF;
        const float* sn = rsin + (long long)pos * HALF;
#pragma unroll
        for (int j = 0; j < HJ; ++j) {
            const int i = j * KOG_WAVE + lane;
            const float a = v[j], b = v[j + HJ];
            v[j] = a * cs[i] - b * sn[i];
            v[j + HJ] = b * cs[i] + a * sn[i];
        }
    }
    float* dst;
    if (head < nh)
        dst = q + (long long)r * nh * D + head * D;
    else if (head < nh + nkv)
        dst = kc + ((long long)(head - nh) * max_ctx + pos) * D;
    else
        dst = vc + ((long long)(head - nh - nkv) * max_ctx + pos) * D;
#pragma unroll
    for (int j = 0; j < J; ++j) dst[j * KOG_WAVE + lane] = v[j];
}

// gate/up product c [3n, 2 * inter] (row 2j gate j, row 2j+1 up j) -> silu(gate) * up as three
// bf16 terms into xs [3n, inter]
extern "C" __global__ void kog_silu_split(const float* __restrict__ c, unsigned short* __restrict__ xs, int n,
                                          int inter) {
    const long long total = (long long)n * inter;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long cs = 2 * total;
        const float2 s0 = *(const float2*)(c + 2 * e);
        const float2 s1 = *(const float2*)(c + cs + 2 * e);
        const float2 s2 = *(const float2*)(c + 2 * cs + 2 * e);
        const float g = s0.x + (s1.x + s2.x), u = s0.y + (s1.y + s2.y);
        kog_split3(g / (1.0f + expf(-g)) * u, xs + e, total);
    }
}

// ---- attention ---------------------------------------------------------------------------
// One block per (query head, 64-row query tile): 256 threads as a 16 x 16 grid; thread (ty, tx)
// owns query rows 4 ty .. 4 ty + 3 and, in each 64-key tile, keys tx + 16 j (scores) and dims
// 4 tx + 64 jj .. + 3 (output). Q, K, V and the probabilities (over K's tile once the scores
// are done: two blocks of 256 threads fit one multiprocessor at head_dim 128) pass through
// shared memory with rows padded by 4 floats (float4 reads without bank conflicts); softmax is
// online (running max and sum per row), all fp32 with fmaf/expf as the reference computes it.
constexpr int ABM = 64, ABN = 64, ATHR = 256;

template <int D>
__device__ __forceinline__ void attn(const float* __restrict__ q, const float* __restrict__ kc,
                                     const float* __restrict__ vc, unsigned short* __restrict__ out, int n,
                                     int start, int nh, int nkv, int max_ctx, float scale) {
    constexpr int DP = D + 4, PP = ABM + 4, OJ = D / 64;
    extern __shared__ float4 smem4[];
    float* Qs = (float*)smem4;
    float* Ks = Qs + ABM * DP;
    float* Vs = Ks + ABN * DP;
    float* Ps = Ks;  // ABN x (ABM + 4) <= ABN x DP
    const int head = blockIdx.x, kvh = head / (nh / nkv);
    const int r0 = (gridDim.y - 1 - blockIdx.y) * ABM;  // the longest rows start first
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int qd = nh * D;
    const int kmax = start + min(r0 + ABM, n) - 1;  // the last key any row of this tile sees
    const float* kh = kc + (long long)kvh * max_ctx * D;
    const float* vh = vc + (long long)kvh * max_ctx * D;

    for (int f = tid; f < ABM * D / 4; f += ATHR) {
        const int row = f / (D / 4), c4 = f % (D / 4);
        float* dst = Qs + row * DP + c4 * 4;
        if (r0 + row < n)
            kog_cp_async16(dst, q + (long long)(r0 + row) * qd + head * D + c4 * 4);
        else
            *(float4*)dst = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    int qpos[4];
    float m[4], l[4], o[4][4 * OJ];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        qpos[i] = min(start + r0 + ty * 4 + i, kmax);  // padding rows past n behave as the last row
        m[i] = -KOG_INF;
        l[i] = 0.f;
#pragma unroll
        for (int d = 0; d < 4 * OJ; ++d) o[i][d] = 0.f;
    }

    for (int k0 = 0; k0 <= kmax; k0 += ABN) {
        __syncthreads();  // the previous tile's K, V and P are consumed
        for (int f = tid; f < ABN * D / 4; f += ATHR) {
            const int row = f / (D / 4), c4 = f % (D / 4);
            float* kd = Ks + row * DP + c4 * 4;
            float* vd = Vs + row * DP + c4 * 4;
            if (k0 + row <= kmax) {
                kog_cp_async16(kd, kh + (long long)(k0 + row) * D + c4 * 4);
                kog_cp_async16(vd, vh + (long long)(k0 + row) * D + c4 * 4);
            } else {  // past the tile's last key: zeros, never the cache's unwritten rows
                *(float4*)kd = make_float4(0.f, 0.f, 0.f, 0.f);
                *(float4*)vd = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
        kog_cp_async_wait();
        __syncthreads();

        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
#pragma unroll 4
        for (int d = 0; d < D; d += 4) {
            float4 a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = *(const float4*)(Qs + (ty * 4 + i) * DP + d);
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = *(const float4*)(Ks + (tx + 16 * j) * DP + d);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    s[i][j] = fmaf(a[i].x, b[j].x, s[i][j]);
                    s[i][j] = fmaf(a[i].y, b[j].y, s[i][j]);
                    s[i][j] = fmaf(a[i].z, b[j].z, s[i][j]);
                    s[i][j] = fmaf(a[i].w, b[j].w, s[i][j]);
                }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float mx = -KOG_INF;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                s[i][j] = k0 + tx + 16 * j <= qpos[i] ? s[i][j] * scale : -KOG_INF;
                mx = fmaxf(mx, s[i][j]);
            }
#pragma unroll
            for (int x = 8; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(KOG_FULL_MASK, mx, x));
            const float mn = fmaxf(m[i], mx);  // finite: key 0 is in the first tile of every row
            const float corr = expf(m[i] - mn);
            m[i] = mn;
            l[i] *= corr;
#pragma unroll
            for (int d = 0; d < 4 * OJ; ++d) o[i][d] *= corr;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                s[i][j] = expf(s[i][j] - mn);
                l[i] += s[i][j];
            }
        }
        __syncthreads();  // every score is read out of Ks before P overwrites it
#pragma unroll
        for (int j = 0; j < 4; ++j)
            *(float4*)(Ps + (tx + 16 * j) * PP + ty * 4) = make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
        __syncthreads();

#pragma unroll 4
        for (int k = 0; k < ABN; ++k) {
            const float4 p = *(const float4*)(Ps + k * PP + ty * 4);
            const float pv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
            for (int jj = 0; jj < OJ; ++jj) {
                const float4 v = *(const float4*)(Vs + k * DP + jj * 64 + tx * 4);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    o[i][jj * 4 + 0] = fmaf(pv[i], v.x, o[i][jj * 4 + 0]);
                    o[i][jj * 4 + 1] = fmaf(pv[i], v.y, o[i][jj * 4 + 1]);
                    o[i][jj * 4 + 2] = fmaf(pv[i], v.z, o[i][jj * 4 + 2]);
                    o[i][jj * 4 + 3] = fmaf(pv[i], v.w, o[i][jj * 4 + 3]);
                }
            }
        }
    }

    const long long slice = (long long)n * qd;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float sum = l[i];
#pragma unroll
        for (int x = 8; x > 0; x >>= 1) sum += __shfl_xor_sync(KOG_FULL_MASK, sum, x);
        const int r = r0 + ty * 4 + i;
        if (r >= n) continue;
        unsigned short* dst = out + (long long)r * qd + head * D + tx * 4;
#pragma unroll
        for (int jj = 0; jj < OJ; ++jj)
#pragma unroll
            for (int e = 0; e < 4; ++e) kog_split3(o[i][jj * 4 + e] / sum, dst + jj * 64 + e, slice);
    }
}

// one entry point per head size (64, 128, 192, 256)
#define KOG_PREFILL_D(D)                                                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
    kog_qkv_rope_d##D(const float* c, int n, int start, const float* bias, const float* qnw, const float* knw,     \
                      const float* rcos, const float* rsin, float* kc, float* vc, int max_ctx, float* q, int nh,   \
                      int nkv, float eps) {                                                                         \
        qkv_rope<D>(c, n, start, bias, qnw, knw, rcos, rsin, kc, vc, max_ctx, q, nh, nkv, eps);                    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATHR)                                                             \
    kog_attn_d##D(const float* q, const float* kc, const float* vc, unsigned short* out, int n, int start, int nh, \
                  int nkv, int max_ctx, float scale) {                                                             \
        attn<D>(q, kc, vc, out, n, start, nh, nkv, max_ctx, scale);                                                \
    }
KOG_PREFILL_D(64)
KOG_PREFILL_D(128)
KOG_PREFILL_D(192)
KOG_PREFILL_D(256)

// logits[r] = sum_k W[r][k] * x[k] for a bf16 matrix, one wave per row (the prefill's LM head).
extern "C" __global__ void kog_gemv_bf16(const unsigned short* __restrict__ w, const float* __restrict__ x,
                                         float* __restrict__ y, int rows, int cols) {
    const int wave = (blockIdx.x * blockDim.x + threadIdx.x) / KOG_WAVE;
    const int lane = threadIdx.x % KOG_WAVE;
    if (wave >= rows) return;
    const unsigned short* row = w + (long long)wave * cols;
    float acc = 0.f;
    for (int k = lane; k < cols; k += KOG_WAVE) acc = fmaf(kog_bf16(row[k]), x[k], acc);
    acc = kog_wave_sum(acc);
    if (lane == 0) y[wave] = acc;
}
