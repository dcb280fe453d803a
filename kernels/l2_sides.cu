// The L2 partitions' map (engine/backends/l2_sides.py): timed round trips from a multiprocessor to lines of a
// buffer. An atomic is done at the line's home slice whatever caches it, so its round trip says which L2
// partition homes the line, near or far from the multiprocessor (H200: ~310 cycles near, ~500 far).
#include "portability.cuh"

// Block b times `reps` dependent atomic round trips from thread 0 to each of its n lines (line idx[b * n + i]
// of `lines`, 16 words a line): cycles[b * n + i]; sms[b]: its multiprocessor. `zero` is 0 (the compiler
// cannot know: each address depends on the value the last atomic returned).
extern "C" __global__ void kog_l2_round_trips(kog_u64* lines, const int* idx, int n, int reps, kog_u64 zero,
                                              unsigned* sms, unsigned* cycles) {
    if (threadIdx.x) return;
    const int b = blockIdx.x;
    for (int i = 0; i < n; ++i) {
        kog_u64* p = lines + 16ll * idx[b * n + i];
        kog_u64 v = atomicAdd(p, zero);  // (the line's first touch, untimed)
        const long long t0 = kog_cycles();
#pragma unroll 1
        for (int k = 0; k < reps; ++k) v = atomicAdd(p + (v & zero), zero);
        cycles[b * n + i] = (unsigned)((kog_cycles() - t0) / reps) + (v == 0x9e3779b9ull);
    }
    sms[b] = kog_sm_id();
}
