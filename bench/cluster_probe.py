"""What thread block clusters (Hopper) would give the monokernel, measured (timing only).

The decode kernel's blocks meet through L2: a tagged all-to-all hop costs ~0.8-0.9 us on 132
blocks with nothing else running (sync_probe.py), five of them per layer. Blocks of one cluster
sit in one GPC and can read and write each other's shared memory and meet at a hardware
barrier. This probe asks what that costs and what it leaves of the bandwidth:

- co-residency: how many clusters of 2-16 blocks (384 threads, the decode kernel's shared memory)
  the driver says fit at once (cuOccupancyMaxActiveClusters), and whether that many really run
  together (every block waits for all the others, bounded); whether a cooperative launch takes
  a cluster dimension;
- bandwidth: weights streamed by one cluster (one GPC) against the same number of blocks spread
  over the chip, and against the whole grid: through a per-thread cp.async ring as the kernel's
  (96 or 192 KB in flight per block) and through bulk copies (one thread, mbarrier stages), from
  HBM and from L2;
- latency: a cluster barrier (arrive.release + wait.acquire), and an all-to-all hop of an n-word
  vector inside a cluster three ways: every block pushes its slice into every block's shared
  memory then the barrier; every block writes its slice locally, the barrier, then every block
  reads all slices remotely; every block pushes its slice as tagged words (phase, value) and
  polls its own shared memory (no barrier).

    python bench/cluster_probe.py

Launches go through the driver's cuLaunchKernelEx (ctypes): CuPy's RawKernel cannot pass a
cluster dimension.
"""

from __future__ import annotations

import ctypes

SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 now() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned cta_rank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ unsigned n_cta() { unsigned r; asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned remote(unsigned a, unsigned rank) {  // a's twin in block `rank` of the cluster
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ void st_remote4(unsigned a, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" :: "r"(a), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ float4 ld_remote4(unsigned a) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ void st_remote_u2(unsigned a, u64 x, u64 y) {
    asm volatile("st.shared::cluster.v2.u64 [%0], {%1, %2};" :: "r"(a), "l"(x), "l"(y) : "memory");
}
__device__ __forceinline__ void ld_local_u2(unsigned a, u64& x, u64& y) {
    asm volatile("ld.volatile.shared.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "r"(a) : "memory");
}

// Every block waits (bounded) until all blocks of the grid have started: out[0] counts blocks that gave up.
extern "C" __global__ void coresident(unsigned* counter, long long timeout_ns, unsigned* out) {
    if (threadIdx.x != 0) return;
    atomicAdd(counter, 1u);
    const u64 t0 = now();
    unsigned seen = 0;
    while ((seen = atomicAdd(counter, 0u)) < gridDim.x && now() - t0 < (u64)timeout_ns) {}
    if (seen < gridDim.x) atomicAdd(out, 1u);
}

// Weights through a per-thread ring of S 16-byte cp.async slots, as the decode kernel streams
// them (nothing consumed: bandwidth only). Block b reads its `per_block` vectors `reps` times.
template <int S>
__device__ void ring_read(const uint4* src, long long per_block, int reps) {
    extern __shared__ __align__(16) uint4 slots[];
    const uint4* p = src + blockIdx.x * per_block;
    const int T = blockDim.x;
    long long idx = threadIdx.x;
    const long long n = per_block * reps / T;
    for (long long i = 0; i < n; ++i) {
        if (i >= S) asm volatile("cp.async.wait_group %0;" :: "n"(S - 1) : "memory");
        const unsigned d = smem_addr(slots + (i % S) * T + threadIdx.x);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(p + idx) : "memory");
        asm volatile("cp.async.commit_group;" ::: "memory");
        idx += T;
        if (idx >= per_block) idx -= per_block;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}
extern "C" __global__ void ring16(const uint4* src, long long per_block, int reps) { ring_read<16>(src, per_block, reps); }
extern "C" __global__ void ring32(const uint4* src, long long per_block, int reps) { ring_read<32>(src, per_block, reps); }

// Bulk copies: one thread keeps `stages` chunks of `chunk` bytes in flight, each completing on its mbarrier.
extern "C" __global__ void bulk_read(const char* src, long long per_block, int chunk, int stages, int reps) {
    extern __shared__ __align__(128) unsigned char buf[];
    __shared__ __align__(8) u64 bars[16];
    if (threadIdx.x != 0) return;
    const char* p = src + blockIdx.x * per_block;
    const long long n = per_block / chunk * reps, per = per_block / chunk;
    for (int s = 0; s < stages; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bars + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
    auto issue = [&](int s, long long k) {
        const unsigned bar = smem_addr(bars + s);
        asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" :: "r"(bar), "r"(chunk) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(smem_addr(buf + (long long)s * chunk)), "l"(p + (k % per) * chunk), "r"(chunk), "r"(bar) : "memory");
    };
    for (int s = 0; s < stages && s < n; ++s) issue(s, s);
    for (long long k = 0; k < n; ++k) {
        const int s = (int)(k % stages);
        const unsigned parity = (unsigned)((k / stages) & 1), bar = smem_addr(bars + s);
        unsigned ok = 0;
        while (!ok)
            asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                         : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
        if (k + stages < n) issue(s, k + stages);
    }
}

// out[0]: ns per cluster barrier, as block 0 of the grid sees it.
extern "C" __global__ void barrier_loop(int iters, u64* out) {
    for (int i = 0; i < 16; ++i) cluster_sync();
    const u64 t0 = now();
    for (int i = 0; i < iters; ++i) cluster_sync();
    const u64 t1 = now();
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = (t1 - t0) / iters;
}

// An all-to-all hop of an n-float vector (n % (4 * cluster size) == 0) inside each cluster,
// `iters` times in a row; each hop's values depend on what the thread read in the hop before.
// mode 0: push every slice into every block, then the barrier; mode 1: write the own slice,
// the barrier, read every slice remotely; mode 2: push tagged words, poll the own copy (no barrier).
// out[0]: ns per hop (block 0); out[1]: polls that gave up.
extern "C" __global__ void hop_loop(int n, int mode, int iters, u64* out) {
    extern __shared__ __align__(16) float vec[];  // two buffers of n floats, or of n tagged words
    const unsigned rank = cta_rank(), C = n_cta();
    const int nv = n / 4, own = nv / C, T = blockDim.x;  // float4 groups: all, this block's
    float acc = (float)threadIdx.x;
    unsigned gave_up = 0;
    cluster_sync();
    u64 t0 = 0;
    for (int it = -8; it < iters; ++it) {
        if (it == 0) t0 = now();
        const int par = it & 1;
        if (mode == 0) {
            for (int q = threadIdx.x; q < own * (int)C; q += T) {
                const int d = q / own, j = rank * own + q % own;
                const float4 v = make_float4(acc, acc + 1.f, acc + 2.f, (float)it);
                st_remote4(remote(smem_addr(vec + par * n + 4 * j), d), v);
            }
            cluster_sync();
            for (int j = threadIdx.x; j < nv; j += T) {
                const float4 v = *reinterpret_cast<const float4*>(vec + par * n + 4 * j);
                acc += v.x * 1e-9f + v.w;
            }
        } else if (mode == 1) {
            for (int j = threadIdx.x; j < own; j += T)
                *reinterpret_cast<float4*>(vec + par * n + 4 * (rank * own + j)) = make_float4(acc, acc, acc, (float)it);
            cluster_sync();
            for (int j = threadIdx.x; j < nv; j += T) {
                const float4 v = ld_remote4(remote(smem_addr(vec + par * n + 4 * j), j / own));
                acc += v.x * 1e-9f + v.w;
            }
        } else {
            u64* w = reinterpret_cast<u64*>(vec);
            const u64 tag = (u64)(it + 16) << 32;  // words as (tag, value); every tag here > 0
            for (int q = threadIdx.x; q < 2 * own * (int)C; q += T) {  // pairs of words
                const int d = q / (2 * own), j = 4 * rank * own + 2 * (q % (2 * own));
                st_remote_u2(remote(smem_addr(w + par * n + j), d), tag | __float_as_uint(acc), tag | __float_as_uint(acc));
            }
            for (int j = 2 * threadIdx.x; j < n; j += 2 * T) {
                u64 x, y;
                const u64 t1 = now();
                do { ld_local_u2(smem_addr(w + par * n + j), x, y); } while (((x >> 32) != (tag >> 32) || (y >> 32) != (tag >> 32)) && !gave_up && now() - t1 < 20000000ull);
                gave_up += (x >> 32) != (tag >> 32);
                acc += __uint_as_float((unsigned)x) * 1e-9f;
            }
            __syncthreads();  // the block reads next round's other buffer; this one is rewritten two hops on
        }
    }
    const u64 t1 = now();
    cluster_sync();  // no block leaves while another may still touch its shared memory
    if (acc == 1.2345f) out[3] = 1;
    if (gave_up) atomicAdd(out + 1, (u64)gave_up);
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = (t1 - t0) / iters;
}
"""


class _Dim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster", _Dim), ("cooperative", ctypes.c_int)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)),
                ("n_attrs", ctypes.c_uint)]


ATTR_COOPERATIVE, ATTR_CLUSTER = 2, 4  # CUlaunchAttributeID
FUNC_MAX_DYNAMIC_SMEM, FUNC_NON_PORTABLE_CLUSTER = 8, 14  # CUfunction_attribute


class Driver:
    """The few driver calls the probe needs, on the context CuPy made current."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, rc: int, what: str) -> None:
        if rc:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"{what}: {msg.value.decode() if msg.value else rc}")

    def prepare(self, fn, smem: int) -> None:
        self.check(self.lib.cuFuncSetAttribute(ctypes.c_void_p(fn.kernel.ptr), FUNC_MAX_DYNAMIC_SMEM, smem), "max dynamic smem")
        self.check(self.lib.cuFuncSetAttribute(ctypes.c_void_p(fn.kernel.ptr), FUNC_NON_PORTABLE_CLUSTER, 1), "non-portable clusters")

    def _config(self, grid: int, block: int, smem: int, cluster: int, cooperative: bool):
        attrs = (_Attr * 2)()
        n = 0
        if cluster > 1:
            attrs[n].id = ATTR_CLUSTER
            attrs[n].value.cluster = _Dim(cluster, 1, 1)
            n += 1
        if cooperative:
            attrs[n].id = ATTR_COOPERATIVE
            attrs[n].value.cooperative = 1
            n += 1
        cfg = _Config(grid, 1, 1, block, 1, 1, smem, None, attrs, n)
        return cfg, attrs

    def max_active_clusters(self, fn, block: int, smem: int, cluster: int) -> int:
        cfg, _keep = self._config(cluster, block, smem, cluster, False)
        n = ctypes.c_int()
        self.check(self.lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(fn.kernel.ptr), ctypes.byref(cfg)),
                   "max active clusters")
        return n.value

    def launch(self, fn, grid: int, block: int, smem: int, cluster: int, args: list, cooperative: bool = False) -> int:
        """cuLaunchKernelEx; returns the driver's code (0: launched)."""
        cfg, _keep = self._config(grid, block, smem, cluster, cooperative)
        vals = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_uint64(a.data.ptr) for a in args]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        return self.lib.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fn.kernel.ptr), params, None)


def main() -> None:
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    drv = Driver()
    props = cp.cuda.runtime.getDeviceProperties(0)
    nsm = props["multiProcessorCount"]
    smem_max = props["sharedMemPerBlockOptin"]
    thr = 384
    smem = 200 * 1024  # the decode kernel's footprint: one block per multiprocessor
    fns = {name: mod.get_function(name) for name in ("coresident", "ring16", "ring32", "bulk_read", "barrier_loop", "hop_loop")}
    for fn in fns.values():
        drv.prepare(fn, smem)
    sync = cp.cuda.Device().synchronize
    print(f"{props['name'].decode()}: {nsm} SMs, {smem_max // 1024} KB shared memory per block, L2 {props['l2CacheSize'] >> 20} MB")

    # co-residency at the decode kernel's footprint
    counter, gave = cp.zeros(1, cp.uint32), cp.zeros(1, cp.uint32)
    fits = {}
    for c in (1, 2, 4, 8, 16):
        try:
            fits[c] = drv.max_active_clusters(fns["coresident"], thr, smem, c) if c > 1 else nsm
        except RuntimeError as e:
            fits[c] = 0
            print(f"clusters of {c:2d}: {e}")
        if not fits[c]:
            continue
        for coop in (False, True):
            counter.fill(0)
            gave.fill(0)
            rc = drv.launch(fns["coresident"], fits[c] * c, thr, smem, c,
                            [counter, ctypes.c_longlong(50_000_000), gave], cooperative=coop)
            sync()
            print(f"clusters of {c:2d}: {fits[c]:3d} fit ({fits[c] * c} blocks); launched {'cooperative' if coop else 'plain':11s} "
                  + (f"rc {rc}" if rc else f"-> {int(gave.get()[0])} blocks gave up waiting for the others"))

    # bandwidth: one cluster against the same blocks spread, and the whole grid
    big = cp.zeros(2 << 30, dtype=cp.uint8)
    per_block_hbm = (2 << 30) // nsm // (16 * thr) * (16 * thr)  # bytes, whole ring rounds
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def rate(name: str, grid: int, cluster: int, per_block: int, reps: int, args: list) -> str:
        best = 0.0
        for _ in range(3):
            start.record()
            rc = drv.launch(fns[name], grid, thr, smem, cluster, args)
            stop.record()
            stop.synchronize()
            if rc:
                return f"rc {rc}"
            best = max(best, grid * per_block * reps / (cp.cuda.get_elapsed_time(start, stop) * 1e-3) / 1e9)
        return f"{best:7.1f} GB/s ({best / grid:5.1f} per block)"

    for label, grid, cluster in (("1 block", 1, 1), ("8 blocks spread", 8, 1), ("1 cluster of 8", 8, 8),
                                 ("16 blocks spread", 16, 1), ("1 cluster of 16", 16, 16), (f"{nsm} blocks", nsm, 1)):
        cols = []
        for name in ("ring16", "ring32"):
            cols.append(f"{name} {rate(name, grid, cluster, per_block_hbm, 1, [big, ctypes.c_longlong(per_block_hbm // 16), ctypes.c_int(1)])}")
        chunk, stages = 16384, 12
        cols.append(f"bulk 12x16KB {rate('bulk_read', grid, cluster, per_block_hbm, 1, [big, ctypes.c_longlong(per_block_hbm), ctypes.c_int(chunk), ctypes.c_int(stages), ctypes.c_int(1)])}")
        print(f"HBM, {label:17s}: " + "; ".join(cols))
    l2_block = 1 << 20  # 1 MB per block, read 16 times: L2-resident after the first pass
    for label, grid, cluster in (("1 block", 1, 1), ("16 blocks spread", 16, 1), ("1 cluster of 16", 16, 16)):
        r = rate("ring32", grid, cluster, l2_block, 16, [big, ctypes.c_longlong(l2_block // 16), ctypes.c_int(16)])
        b = rate("bulk_read", grid, cluster, l2_block, 16, [big, ctypes.c_longlong(l2_block), ctypes.c_int(16384), ctypes.c_int(12), ctypes.c_int(16)])
        print(f"L2,  {label:17s}: ring32 {r}; bulk 12x16KB {b}")

    # latency inside a cluster
    out = cp.zeros(4, dtype=cp.uint64)
    for c in (2, 4, 8, 16):
        out.fill(0)
        rc = drv.launch(fns["barrier_loop"], c, thr, smem, c, [ctypes.c_int(4000), out])
        sync()
        line = f"cluster of {c:2d}: barrier {int(out.get()[0]) if not rc else f'rc {rc}'} ns"
        for n in (576, 1536, 2048):
            cells = []
            for mode, name in ((0, "push+barrier"), (1, "barrier+pull"), (2, "tagged push")):
                out.fill(0)
                rc = drv.launch(fns["hop_loop"], c, thr, smem, c, [ctypes.c_int(n), ctypes.c_int(mode), ctypes.c_int(2000), out])
                sync()
                o = out.get()
                cells.append(f"{name} {int(o[0])}" + (f" ({int(o[1])} gave up)" if o[1] else "") if not rc else f"{name} rc {rc}")
            line += f"; n={n}: " + ", ".join(cells) + " ns"
        print(line)
    c = 16 if fits[16] else 8
    out.fill(0)
    rc = drv.launch(fns["hop_loop"], fits[c] * c, thr, smem, c, [ctypes.c_int(576), ctypes.c_int(2), ctypes.c_int(2000), out])
    sync()
    print(f"all {fits[c]} clusters of {c} hopping at once (tagged push, n=576): {int(out.get()[0]) if not rc else f'rc {rc}'} ns")


if __name__ == "__main__":
    main()
