"""Address-translation probe: what a TLB miss costs the decode kernel's loads on the current GPU (timing only).

1. One thread chases dependent L2-hit loads (`ld.global.cg`) through n addresses `stride` bytes apart
   (n = 1..2048; stride 64 KB, inside few pages, and 2 MB, a page each if pages are 2 MB): ns per load.
   The steps say how many pages the translation caches hold and what a miss costs at each level. Then
   the same with every multiprocessor chasing the same pages at once (their own lines in them), as the
   decode kernel's blocks all read the same matrices at about the same time.
2. Every block streams as the decode kernel's ring does: each warp issues its granules (32 lanes x 3
   16-byte cp.async, 1.5 KB) three in flight, waiting for the oldest before issuing the next. A block's
   stream crosses 128 regions (one token of SmolLM2: 30 layers x 4 matrices and the head), one granule a
   warp per region. Laid out as the packed weights are (the blocks' tiles of a matrix side by side, each
   matrix ~1.8 MB past the last: a new page at every region) or block-major (a block's regions adjacent: a
   new page every ~100 regions). Prints us per sweep (the slowest block) and the mean and longest time a
   warp spends issuing one granule, for each layout.

    python bench/tlb_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sync_probe import PREAMBLE, random_cycle

SOURCE = PREAMBLE + r"""
__device__ __forceinline__ long long ld_cg(const long long* p) {
    long long v; asm volatile("ld.global.cg.s64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }

// Element k of a chase sits at k * stride plus a line offset that spreads the elements over L2's sets,
// plus `lane` lines (each block's own line in the same pages).
__device__ __forceinline__ long long chase_at(int k, long long stride, int lane) {
    return (long long)k * stride + (long long)((k * 37) & 127) * 256 + (long long)lane * 128;
}
extern "C" __global__ void chase_setup(long long* base, const int* nxt, int n, long long stride, int lanes) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    for (int lane = 0; lane < lanes; ++lane)
        base[chase_at(k, stride, lane) / 8] = chase_at(nxt[k], stride, lane);
}
// Thread 0 of each block chases its own lines (block b: line b); out[b] ns per dependent load.
extern "C" __global__ void chase(const long long* base, int n, u64* out) {
    if (threadIdx.x) return;
    long long off = chase_at(0, 0, blockIdx.x);
#pragma unroll 1
    for (int k = 0; k < 2 * n; ++k) off = ld_cg(base + off / 8);  // warm: lines in L2, pages in the TLBs that hold them
    __syncthreads();
    const u64 t0 = now();
#pragma unroll 1
    for (int k = 0; k < 2048; ++k) off = ld_cg(base + off / 8);
    const u64 t1 = now();
    out[blockIdx.x] = (t1 - t0) / 2048 + (off == -1);
}

// The ring's stream. Warp w of block b, granule j (region j): 32 lanes x 3 16-byte vectors from
// region_at(j) + b * block_stride + w * 1536 bytes. out[2 b]: the block's sweep in ns; out[2 b + 1]: the
// longest issue of one granule by any of its warps (ns); issue[b * 12 + w]: the warp's summed issue time.
extern "C" __global__ void __launch_bounds__(384) stream(const char* w, int nreg, long long region_stride,
                                                        long long block_stride, int sweeps, u64* out, u64* issue) {
    extern __shared__ uint4 ring[];  // 12 warps x 3 slots x 96 vectors
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const char* mine = w + blockIdx.x * block_stride + warp * 1536 + lane * 16;
    u64 longest = 0, summed = 0;
    __syncthreads();
    const u64 t0 = now();
    int slot = 0;
#pragma unroll 1
    for (int j = 0; j < sweeps * nreg; ++j) {
        if (j >= 3) asm volatile("cp.async.wait_group 2;" ::: "memory");
        const char* src = mine + (long long)(j % nreg) * region_stride;
        const u64 a = now();
#pragma unroll
        for (int i = 0; i < 3; ++i) cp16(&ring[(warp * 3 + slot) * 96 + i * 32 + lane], src + i * 512);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const u64 d = now() - a;
        summed += d, longest = d > longest ? d : longest;
        slot = slot == 2 ? 0 : slot + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    const u64 t1 = now();
    if (lane == 0) {
        issue[blockIdx.x * 12 + warp] = summed;
        atomicMax(&out[2 * blockIdx.x + 1], longest);
    }
    if (threadIdx.x == 0) out[2 * blockIdx.x] = t1 - t0;
}
"""


def main() -> None:
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    nsm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    buf = cp.zeros(4200 << 20, dtype=cp.uint8)  # 2048 pages of 2 MB and some
    base = buf.data.ptr
    out = cp.zeros(2 * nsm, dtype=cp.uint64)
    for stride in (64 << 10, 2 << 20):
        for blocks in (1, nsm):
            row = []
            for n in (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048):
                if n * stride + nsm * 128 + 128 * 256 > buf.size:
                    continue
                nxt = cp.asarray(random_cycle(n, np.int32, seed=n))
                mod.get_function("chase_setup")(((n + 255) // 256,), (256,), (base, nxt, np.int32(n), np.int64(stride),
                                                                            np.int32(blocks)))
                out.fill(0)
                mod.get_function("chase")((blocks,), (32,), (base, np.int32(n), out))
                cp.cuda.Device().synchronize()
                o = out.get()[:blocks]
                row.append(f"{n}: {int(o[0])}" + (f" (mean {o.mean():.0f})" if blocks > 1 else ""))
            print(f"L2-hit dependent load, ns, by pages touched, {stride >> 10} KB apart, {blocks} block(s) chasing: "
                  + "; ".join(row))

    nreg, region_bytes = 128, 12 * 1536
    issue = cp.zeros(nsm * 12, dtype=cp.uint64)
    layouts = (("packed (a matrix's tiles side by side)", nsm * region_bytes + 4096, region_bytes),
               ("block-major (a block's regions adjacent)", region_bytes, nreg * region_bytes))
    sweeps = 8
    streamer = mod.get_function("stream")
    streamer.max_dynamic_shared_size_bytes = 12 * 3 * 1536
    for rep in range(3):
        for label, region_stride, block_stride in layouts:
            out.fill(0)
            streamer((nsm,), (384,), (base, np.int32(nreg), np.int64(region_stride), np.int64(block_stride),
                                     np.int32(sweeps), out, issue), shared_mem=12 * 3 * 1536)
            cp.cuda.Device().synchronize()
            o = out.get().reshape(nsm, 2)
            per_granule = issue.get().astype(np.float64) / (sweeps * nreg)
            gb = nsm * 12 * 1536 * nreg * sweeps / (o[:, 0].max() * 1e-9) / 1e9
            if rep:
                print(f"stream, {label}: {o[:, 0].max() / sweeps / 1e3:.1f} us a sweep of {nreg} regions ({gb:.0f} GB/s);"
                      f" a granule's issue mean {per_granule.mean():.0f} ns, longest {int(o[:, 1].max())} ns")


if __name__ == "__main__":
    main()
