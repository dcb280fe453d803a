"""Does a block stream weights faster from chunks homed in its own L2 partition? (timing only)

Every 4 KB chunk of memory is homed in one of the H200's two L2 partitions, and a round trip to the far
one takes ~200 cycles more (engine/backends/l2_sides.py maps them). The decode kernel's blocks stream their
weight tiles from contiguous runs, so half of every block's bytes come from the far partition. If the same
bytes streamed faster, or landed sooner, from the near one, a layout that puts each block's tiles on its
own side's chunks (block roles assigned by %smid at launch) could raise the read ceiling or shorten each
product's first granule. This probe maps the partitions' chunks of a 1 GiB buffer, then:

1. Streams the buffer with one block a multiprocessor, each block reading a list of 4 KB chunks with
   16-byte non-coherent loads, `depth` loads in flight a thread (512 threads), four ways that read the
   same bytes: `runs` (each block a contiguous run: the kernel's layout), `stripes` (chunk c to block
   c mod grid), `near` (each side's chunks split over that side's multiprocessors), `far` (over the other
   side's). GB/s of the whole grid, median of several passes, alternating.
2. Times cold lines (L2 flushed by streaming another buffer first): one lane a multiprocessor chains
   dependent loads through lines of near chunks, then of far ones. Cycles a load.

3. Fits the map to what a kernel could compute (`page_fit`): a mask of address bits 12-20 and one bit a 2 MB page.

    python3 bench/side_stream_probe.py [--map-only]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.backends.l2_sides import (CHUNK_LINES, CHUNK_WORDS, ONE_PER_SM, SM_IDS, _near_far, _sm_sides, round_trip_kernel,
                                      round_trips)

SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// The block on multiprocessor s reads chunks lists[starts[slot] ..][: counts[slot]] (slot = slot_of[s]), `reps`
// times; 512 threads, two chunks a round, DEPTH rounds' loads in flight a thread. sink: keeps the loads.
template <int DEPTH>
__device__ void stream(const uint4* buf, const int* lists, const int* starts, const int* counts,
                       const int* slot_of, int reps, unsigned* sink) {
    const int slot = slot_of[smid()];
    const int* list = lists + starts[slot];
    const int n = counts[slot], half = threadIdx.x >> 8, lane = threadIdx.x & 255;
    unsigned acc = 0;
    for (int r = 0; r < reps; ++r)
        for (int i = half; i < n; i += 2 * DEPTH) {
            uint4 v[DEPTH];
#pragma unroll
            for (int u = 0; u < DEPTH; ++u) {
                const int k = i + 2 * u;
                v[u] = k < n ? ld_stream(buf + (long long)list[k] * 256 + lane) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < DEPTH; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}
extern "C" __global__ void stream4(const uint4* b, const int* l, const int* s, const int* c, const int* o, int r, unsigned* k) { stream<4>(b, l, s, c, o, r, k); }
extern "C" __global__ void stream8(const uint4* b, const int* l, const int* s, const int* c, const int* o, int r, unsigned* k) { stream<8>(b, l, s, c, o, r, k); }
extern "C" __global__ void stream16(const uint4* b, const int* l, const int* s, const int* c, const int* o, int r, unsigned* k) { stream<16>(b, l, s, c, o, r, k); }

// Lane 0 of the block on multiprocessor s chains dependent loads (ld.global.cg: L2, not L1) through n lines
// of near chunks, then n of far ones (lines[slot][0..2n), 16 words a line): cycles[slot][0..1] a load.
extern "C" __global__ void cold_chain(const u64* buf, const int* lines, int n, const int* slot_of, u64 zero, unsigned* cycles) {
    if (threadIdx.x) return;
    const int slot = slot_of[smid()];
    u64 v = 0;
    for (int f = 0; f < 2; ++f) {
        const int* my = lines + (long long)slot * 2 * n + f * n;
        const long long t0 = clock64();
        for (int i = 0; i < n; ++i) {
            const u64* p = buf + 16ll * my[i] + (v & zero);
            asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        }
        cycles[slot * 2 + f] = (unsigned)((clock64() - t0) / n) + (v == 0x9e3779b9ull);
    }
}
"""

BUF_CHUNKS = 1 << 18  # 1 GiB of 4 KB chunks
PASSES = 4  # passes over the buffer a timed launch
ROUNDS = 5  # timed launches of each layout, alternating
CHAIN = 32  # cold lines chained a side


def chunk_sides(cp, kernel, buf_words, sm_side: np.ndarray, nsm: int) -> np.ndarray:
    """The side (0/1, -1 unclear) of every chunk of the buffer: each block times one line of its share of
    the chunks (block b: chunks b, b + nsm, ...), near or far from its own multiprocessor."""
    nchunks = buf_words.size // CHUNK_WORDS
    per = nchunks // nsm
    chunks = np.arange(per * nsm).reshape(per, nsm).T  # [block, i]
    lat, got_sms = round_trips(cp, kernel, buf_words, chunks * CHUNK_LINES + 7, nsm)
    block_side = sm_side[got_sms % SM_IDS].astype(np.int64)
    out = np.full(nchunks, -1, dtype=np.int64)
    for b in range(nsm):
        near, far = _near_far(lat[b])
        cut = (near + far) / 2
        far_line = lat[b] >= cut
        clear = np.abs(lat[b] - cut) > (far - near) / 4
        out[chunks[b][clear]] = block_side[b] ^ far_line[clear]
    return out


def parity_table(nbits: int) -> np.ndarray:
    """parity(v) for every v of nbits bits: the fits below look masks' parities up by index."""
    return np.array([bin(v).count("1") & 1 for v in range(1 << nbits)], dtype=np.int64)


def best_page_mask(side: np.ndarray, low: np.ndarray, page: np.ndarray, nbits: int) -> tuple[int, int, np.ndarray]:
    """The mask m of the nbits in-page address bits `low` with side = parity(low & m) xor one bit a page that
    explains most of `side`: (how many it explains, m, each page's bit in np.unique(page)'s order)."""
    pages, page_ix = np.unique(page, return_inverse=True)
    parity = parity_table(nbits)
    total = np.bincount(page_ix, minlength=len(pages))
    best = (-1, 0, np.zeros(len(pages), dtype=np.int64))
    for m in range(1, 1 << nbits):
        ones = np.bincount(page_ix, weights=side ^ parity[low & m], minlength=len(pages))
        agree = int(np.maximum(ones, total - ones).sum())
        if agree > best[0]:
            best = (agree, m, (2 * ones > total).astype(np.int64))
    return best


def page_fit(csides: np.ndarray, base: int) -> str:
    """How much of the chunks' sides a weight layout could compute instead of look up: within each 2 MB page
    (the GPU's large page, where virtual and physical addresses share bits 12-20) the best single mask m of
    those bits with side = parity(chunk bits & m) xor one bit a page, fitted over every mask; the share of
    the clear chunks it explains, and of the pages it explains whole."""
    first = base >> 12
    idx = np.arange(first, first + len(csides))
    keep = (csides >= 0) & (idx >> 9 >= (first + 511) >> 9) & (idx >> 9 < (first + len(csides)) >> 9)  # whole pages
    low, page, side = (idx & 511)[keep], (idx >> 9)[keep], csides[keep]
    agree, m, bits = best_page_mask(side, low, page, 9)
    pages, page_ix = np.unique(page, return_inverse=True)
    parity = parity_table(9)
    whole = np.mean(np.bincount(page_ix, weights=side ^ parity[low & m] ^ bits[page_ix], minlength=len(pages)) == 0)
    return (f"best mask of address bits 12-20: {m:#05x} (bits {[b + 12 for b in range(9) if m >> b & 1]}), one bit a 2 MB "
            f"page: explains {agree / len(side) * 100:.2f}% of {len(side)} clear chunks, {whole * 100:.1f}% of {len(pages)} pages whole")


def lists_for(assign: list[np.ndarray], sms_by_slot: np.ndarray):
    """Device arrays of per-slot chunk lists (slot k runs on multiprocessor sms_by_slot[k])."""
    counts = np.array([len(a) for a in assign], dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    slot_of = np.zeros(SM_IDS, dtype=np.int32)
    slot_of[sms_by_slot] = np.arange(len(sms_by_slot))
    return np.concatenate(assign).astype(np.int32), starts, counts, slot_of


def main() -> None:
    import cupy as cp

    from engine.backends.cuda import compile_kernels

    dev = cp.cuda.Device()
    nsm = dev.attributes["MultiProcessorCount"]
    arch = f"{dev.compute_capability}"
    l2mod = cp.RawModule(path=str(compile_kernels("l2_sides.cu", {}, arch)))
    rt = round_trip_kernel(l2mod)
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17", f"--gpu-architecture=sm_{arch}"))
    print(f"{dev.pci_bus_id}: {nsm} multiprocessors, arch sm_{arch}")

    sm_side = _sm_sides(cp, rt, nsm)
    if sm_side is None:
        print("no two L2 partitions show on this GPU: nothing to probe")
        return
    # the multiprocessors that exist (one block each: which %smid values come up)
    probe = cp.zeros(16 * CHUNK_WORDS, dtype=cp.uint64)
    sms = np.sort(round_trips(cp, rt, probe, np.zeros((nsm, 1), dtype=np.int32), nsm)[1].astype(np.int64))
    sides = sm_side[sms % SM_IDS].astype(np.int64)
    print(f"multiprocessors by side: {np.sum(sides == 0)} / {np.sum(sides == 1)}")

    buf = cp.zeros(BUF_CHUNKS * CHUNK_WORDS, dtype=cp.uint64)
    buf[:] = cp.arange(buf.size, dtype=cp.uint64)
    csides = chunk_sides(cp, rt, buf, sm_side, nsm)
    n0, n1, nu = (csides == 0).sum(), (csides == 1).sum(), (csides == -1).sum()
    print(f"chunks of 1 GiB by side: {n0} / {n1}, unclear {nu}; "
          f"8 KB pairs split between the sides: {np.mean(csides[0::2] != csides[1::2]) * 100:.1f}%")

    print(page_fit(csides, buf.data.ptr))
    if "--map-only" in sys.argv:
        return

    known = np.flatnonzero(csides >= 0)
    by_side = [np.flatnonzero(csides == s) for s in (0, 1)]
    sm_of_side = [sms[sides == s] for s in (0, 1)]
    layouts = {}
    per = len(known) // nsm
    layouts["runs"] = lists_for([known[k * per:(k + 1) * per] for k in range(nsm)], sms)
    layouts["stripes"] = lists_for([known[k::nsm] for k in range(nsm)], sms)
    for name, flip in (("near", 0), ("far", 1)):
        assign, order = [], []
        for s in (0, 1):
            mine = sm_of_side[s ^ flip]
            assign += [by_side[s][k::len(mine)] for k in range(len(mine))]
            order += list(mine)
        layouts[name] = lists_for(assign, np.array(order))
    dev_layouts = {k: tuple(cp.asarray(a) for a in v) for k, v in layouts.items()}
    sink = cp.zeros(1, dtype=cp.uint32)
    uint4_buf = buf.view(cp.uint32)
    for depth in (4, 8, 16):
        kernel = mod.get_function(f"stream{depth}")
        kernel.max_dynamic_shared_size_bytes = ONE_PER_SM
        times = {k: [] for k in layouts}
        for _ in range(ROUNDS):
            for name, (lists, starts, counts, slot_of) in dev_layouts.items():
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                kernel((nsm,), (512,), (uint4_buf, lists, starts, counts, slot_of, np.int32(PASSES), sink),
                       shared_mem=ONE_PER_SM)
                b.record()
                b.synchronize()
                times[name].append(cp.cuda.get_elapsed_time(a, b) / 1e3)
        cells = []
        for name in layouts:
            nbytes = int(layouts[name][2].sum()) * 4096 * PASSES
            cells.append(f"{name} {nbytes / np.median(times[name]) / 1e9:,.0f}")
        print(f"stream, {depth} x 16 B in flight a thread ({depth * 16 * 512 // 1024} KB a block), GB/s: " + "; ".join(cells))

    # cold lines: flush L2 by streaming another 256 MB, then each multiprocessor chains near and far lines
    flush = cp.ones(1 << 25, dtype=cp.uint64)
    chain = mod.get_function("cold_chain")
    chain.max_dynamic_shared_size_bytes = ONE_PER_SM
    rng = np.random.default_rng(0)
    res = []
    for _ in range(3):
        lines = np.zeros((nsm, 2, CHAIN), dtype=np.int32)
        for k, s in enumerate(sides):
            for f in (0, 1):
                pick = rng.choice(by_side[s ^ f], CHAIN, replace=False)
                lines[k, f] = pick * CHUNK_LINES + rng.integers(0, CHUNK_LINES, CHAIN)
        slot_of = np.zeros(SM_IDS, dtype=np.int32)
        slot_of[sms] = np.arange(nsm)
        cycles = cp.zeros(nsm * 2, dtype=cp.uint32)
        float(flush.sum())
        chain((nsm,), (32,), (buf, cp.asarray(lines), np.int32(CHAIN), cp.asarray(slot_of), np.uint64(0), cycles),
              shared_mem=ONE_PER_SM)
        res.append(cycles.get().reshape(nsm, 2))
    c = np.concatenate(res)
    print(f"cold line, cycles a dependent load (median over multiprocessors): near {np.median(c[:, 0]):.0f}, "
          f"far {np.median(c[:, 1]):.0f}")


if __name__ == "__main__":
    main()
