// Helpers for the batched prefill path (the matrix products themselves go through cuBLAS).
#include "portability.cuh"

// bf16 (as raw uint16) -> fp32, exact.
extern "C" __global__ void kog_bf16_to_f32(const unsigned short* __restrict__ in, float* __restrict__ out,
                                           long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = kog_bf16(in[i]);
}

// fp32 -> bf16 (round to nearest even), for uploading weights.
extern "C" __global__ void kog_f32_to_bf16(const float* __restrict__ in, unsigned short* __restrict__ out,
                                           long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const unsigned u = __float_as_uint(in[i]);
        out[i] = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

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
