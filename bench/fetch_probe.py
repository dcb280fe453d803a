"""Instruction-fetch probe under load: what code that is not in the instruction cache costs a warp
while the whole GPU streams weights, as the decode kernel's ring does (timing only).

bench/sync_probe.py times a 1 KB island of code (64 FMAs) after a ~1 us wait, when the warp last ran
it ~1.2 R KB of code ago, on an idle GPU: a miss cost ~100 cycles per KB there (PERF.md session 13).
The decode kernel's misses would go to L2 while every multiprocessor keeps ~72-96 KB of weights in
flight, where a data load waits ~1.4 us (bench/stream_probe.py). Here warp 0 of every block runs the
same islands (R = 32 .. 192, four passes; cycles per island of block 0, pass 0 cold), while warps 1-11
of every block either idle or stream a 2 GiB buffer with three 1.5 KB `cp.async` granules in flight
a warp (the ring's pattern; ~50 KB a block in flight).

    python bench/fetch_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sync_probe import SOURCE as SYNC_SOURCE

SOURCE = SYNC_SOURCE + r"""
// Warp 0 runs R islands (islands32 above) four times; warps 1..11 stream `big` (nvec 16-byte
// vectors) while it does, where `load` is set: a warp's granule is 32 lanes x 3 vectors, three in flight.
template <int R>
__device__ void fetch_under_load(const uint4* big, long long nvec, int load, u64* out, float* sink) {
    extern __shared__ uint4 slots[];
    __shared__ volatile int done;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) done = 0;
    __syncthreads();
    if (warp == 0) {
        float a[8];
        chains(a);
        for (int p = 0; p < 4; ++p) {
            long long sum = 0;
            islands32<R / 32 - 1>(a, sum);
            if (lane == 0 && blockIdx.x == 0) out[p] = sum / R;
        }
        keep(a, 0.f, sink);
        __syncwarp();
        if (lane == 0) done = 1;
    } else if (load) {
        uint4* const mine = slots + (warp - 1) * 3 * 96;
        const long long step = (long long)gridDim.x * (blockDim.x / 32 - 1) * 96;  // every warp its own granules
        long long v = ((long long)blockIdx.x * (blockDim.x / 32 - 1) + warp - 1) * 96;
        unsigned g = 0;
        for (; !done; ++g) {
            uint4* const s = mine + (g % 3) * 96;
            #pragma unroll
            for (int i = 0; i < 3; ++i) cp16(s + i * 32 + lane, big + v + i * 32 + lane);
            asm volatile("cp.async.commit_group;" ::: "memory");
            asm volatile("cp.async.wait_group 2;" ::: "memory");
            v += step;
            if (v + 96 > nvec) v %= step;
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        if (lane == 0) atomicAdd(out + 4, (u64)g);  // granules streamed
    }
}
extern "C" __global__ void fetch_32(const uint4* big, long long n, int load, u64* out, float* sink) { fetch_under_load<32>(big, n, load, out, sink); }
extern "C" __global__ void fetch_64(const uint4* big, long long n, int load, u64* out, float* sink) { fetch_under_load<64>(big, n, load, out, sink); }
extern "C" __global__ void fetch_128(const uint4* big, long long n, int load, u64* out, float* sink) { fetch_under_load<128>(big, n, load, out, sink); }
extern "C" __global__ void fetch_192(const uint4* big, long long n, int load, u64* out, float* sink) { fetch_under_load<192>(big, n, load, out, sink); }
"""


def main() -> None:
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    nsm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    out = cp.zeros(8, dtype=cp.uint64)
    sink = cp.zeros(1, dtype=cp.float32)
    big = cp.zeros(1 << 31, dtype=cp.uint8)  # 2 GiB: the stream misses L2
    nvec = np.int64(big.size // 16)
    smem = 11 * 3 * 96 * 16
    for rep in range(2):
        for islands in (32, 64, 128, 192):
            fn = mod.get_function(f"fetch_{islands}")
            fn.max_dynamic_shared_size_bytes = smem
            cells = []
            for load in (0, 1):
                out.fill(0)
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                fn((nsm,), (384,), (big, nvec, np.int32(load), out, sink), shared_mem=smem)
                stop.record()
                stop.synchronize()
                o = out.get()
                ms = cp.cuda.get_elapsed_time(start, stop)
                rate = f" ({int(o[4]) * 1536 / ms / 1e9:.2f} TB/s)" if load else ""
                cells.append(f"{'streaming' if load else 'idle'}: {' '.join(str(int(v)) for v in o[:4])}{rate}")
            print(f"run {rep}, {islands} islands (~{1.22 * islands:.0f} KB of code), cycles per island per pass, "
                  f"the other warps {'; '.join(cells)}", flush=True)


if __name__ == "__main__":
    main()
