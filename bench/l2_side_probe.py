"""Does it matter which half of L2 a hop's words live in? (timing only)

H100/H200's L2 is two partitions, each wired to half of the multiprocessors. A line has one home slice;
a multiprocessor reaching a line homed in the other partition crosses between them. The decode kernel's
hops are all-to-all: every block polls every word of a vector that every block wrote, so about half of
its polls go to the far partition. If far polls cost much more than near ones, a hop whose vector is kept
in two copies, one homed in each partition, each block polling the copy on its own side, could be
shorter (every block still stores its slice into both copies; a store does not wait for its round trip).

1. The map. One block a multiprocessor (its shared memory forces that), one at a time, thread 0 times
   dependent round trips to each of NL consecutive 128-byte lines, two ways: `ld.relaxed.gpu` (what the
   polls issue) and `atom.add.relaxed.gpu` (done at the line's home slice whatever caches it). Cycles a
   round trip, per (multiprocessor, line). The matrix minus its row and column means, split by its
   first singular vectors, gives each multiprocessor and each line a side; printed: the four mean
   latencies (near / far for each side), how much of the interaction the split explains, and how the
   lines' sides alternate with the address (the granularity a kernel could lay vectors out by).
2. A tagged word handed between two blocks and back (no fence, as the decode kernel's tagged words), for each
   pairing of the blocks' sides and the words' side: ns one way.
3. The hop, as sync_probe.py's (every block stores its slice of an n-word tagged vector, then polls all of
   it until every word carries the hop's tag; 2,000 hops in a row, two buffers in turn), with the
   vector's lines chosen from the map: one copy on contiguous lines (the decode kernel's today); two
   copies, one on each side's lines, every block polling the copy on its own side; the same two copies,
   every block polling the other side's (the control: same stores, far polls); every block polling one
   of the two (the stores doubled, the polls as today). ns a hop. If the near copy is not clearly the
   fastest, the partitions are not worth a layout.

    python3 bench/l2_side_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sync_probe import PREAMBLE

SOURCE = PREAMBLE + r"""
__device__ __forceinline__ u64 ld_relaxed(const u64* p) {
    u64 v; asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u64 atom_add(u64* p, u64 x) {
    u64 v; asm volatile("atom.relaxed.gpu.global.add.u64 %0, [%1], %2;" : "=l"(v) : "l"(p), "l"(x) : "memory"); return v; }
__device__ __forceinline__ unsigned ld_relaxed32(const unsigned* p) {
    unsigned v; asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }

// Block b (one a multiprocessor) waits for its turn, then thread 0 times `reps` dependent round trips to
// each of nl lines (lines + 16 i), loads then atomics: cycles[(b * 2 + f) * nl + i]. `zero` is 0 (the
// compiler cannot know: each address depends on the last value). sms[b]: the block's multiprocessor.
extern "C" __global__ void side_map(u64* lines, int nl, int reps, u64 zero, unsigned* turn, unsigned* sms, unsigned* cycles) {
    if (threadIdx.x) return;
    const int b = blockIdx.x;
    while ((int)ld_relaxed32(turn) != b) __nanosleep(200);
    for (int f = 0; f < 2; ++f)
        for (int i = 0; i < nl; ++i) {
            u64* p = lines + 16 * i;
            u64 v = f ? atom_add(p, zero) : ld_relaxed(p);  // in L2 now
            const long long t0 = clock64();
#pragma unroll 1
            for (int k = 0; k < reps; ++k) v = f ? atom_add(p + (v & zero), zero) : ld_relaxed(p + (v & zero));
            const long long t1 = clock64();
            cycles[((long long)b * 2 + f) * nl + i] = (unsigned)((t1 - t0) / reps) + (v == 0x9e3779b9ull);
        }
    sms[b] = smid();
    __threadfence();
    atomicAdd(turn, 1u);
}

// Two blocks hand a tagged word back and forth (st.relaxed / ld.relaxed, no fence, as the decode kernel's
// tagged words): the first block on side s0 and the first other block on side s1 (claim[0], claim[1]), the
// words on lines a (0 -> 1) and c (1 -> 0). out[0]: ns one way (player 0), out[1]: whether both ran.
extern "C" __global__ void handoff(u64* a, u64* c, const unsigned char* side_of, int s0, int s1, int reps, unsigned* claim, u64* out) {
    if (threadIdx.x) return;
    const int side = side_of[smid()];
    int me = -1;
    if (side == s0 && atomicCAS(claim, 0u, 1u) == 0u) me = 0;
    else if (side == s1 && atomicCAS(claim + 1, 0u, 1u) == 0u) me = 1;
    if (me < 0) return;
    bool both = false;  // (a side with no block, or none left: give up rather than hang)
    for (int k = 0; !both && k < (1 << 20); ++k) both = ld_relaxed32(claim) == 1u && ld_relaxed32(claim + 1) == 1u;
    if (!both) return;
    u64* mine = me ? c : a;
    const u64* other = me ? a : c;
    const auto wait = [&](u64 r) {
        for (int k = 0; k < (1 << 20); ++k)
            if (ld_relaxed(other) >= r) return true;
        return false;
    };
    bool ok = true;
    const u64 t0 = now();
    for (u64 r = 1; ok && r <= (u64)reps; ++r) {
        if (me == 1) ok = wait(r);
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(mine), "l"(ok ? r : ~0ull) : "memory");
        if (me == 0) ok = wait(r);
    }
    const u64 t1 = now();
    if (me == 0) out[0] = (t1 - t0) / (2 * reps);
    if (ok) atomicAdd(out + 1, 1ull);
}

// The hop. The vector's copy c of buffer r & 1 lies on the lines table[(r & 1) * 3 + c][0 ..] (16 words
// a line, line k of the table holds words 16 k ..): c 0 contiguous lines, c 1 side 0's, c 2 side 1's.
// mode 0: stores to copy 0, every block polls it; 1: stores to copies 1 and 2, a block polls its own
// side's (side_of[%smid]); 2: the same stores, a block polls the other side's; 3: the same stores,
// every block polls copy 1. out[0]: ns a hop (block 0); out[1]: hops that gave up.
template <int NV>
__device__ void hop_sides(u64* space, const int* table, int tl, const unsigned char* side_of, int n, int mode, int reps,
                          u64* out) {
    const int nb = gridDim.x, b = blockIdx.x, t = threadIdx.x, nt = blockDim.x;
    const int side = side_of[smid()];
    const int r0 = (int)((long long)b * n / nb), r1 = (int)((long long)(b + 1) * n / nb);
    const int polled = mode == 0 ? 0 : mode == 1 ? 1 + side : mode == 2 ? 2 - side : 1;
    const auto word = [&](int parity, int c, int i) { return space + (long long)table[(parity * 3 + c) * tl + i / 16] * 16 + i % 16; };
    unsigned gave_up = 0;
    float acc = 0.f;
    __syncthreads();
    const u64 t0 = now();
    for (unsigned r = 1; r <= (unsigned)reps; ++r) {
        const int parity = r & 1;
        for (int i = r0 + t; i < r1; i += nt) {
            const u64 w = ((u64)r << 32) | __float_as_uint((float)i);
            if (mode == 0) asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(word(parity, 0, i)), "l"(w) : "memory");
            else {
                asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(word(parity, 1, i)), "l"(w) : "memory");
                asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(word(parity, 2, i)), "l"(w) : "memory");
            }
        }
        const u64* src[NV];
        unsigned pending = 0;
#pragma unroll
        for (int q = 0; q < NV; ++q) {
            const int p = t + q * nt;  // pair p: words 2p, 2p + 1 (one line)
            if (p < n / 2) pending |= 1u << q;
            src[q] = word(parity, polled, p < n / 2 ? 2 * p : 0);
        }
        for (int it = 0; __any_sync(0xffffffffu, pending) && it < (1 << 20); ++it) {
            ulonglong2 w[NV];
#pragma unroll
            for (int q = 0; q < NV; ++q)
                if ((pending >> q) & 1u)
                    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[q].x), "=l"(w[q].y) : "l"(src[q]) : "memory");
#pragma unroll
            for (int q = 0; q < NV; ++q)
                if (((pending >> q) & 1u) && (unsigned)(w[q].x >> 32) == r && (unsigned)(w[q].y >> 32) == r) {
                    acc += __uint_as_float((unsigned)w[q].x) + __uint_as_float((unsigned)w[q].y);
                    pending &= ~(1u << q);
                }
        }
        gave_up += !__syncthreads_and(pending == 0);
    }
    const u64 t1 = now();
    if (acc == 1.2345f) out[2] = 1;
    if (gave_up && t == 0) atomicAdd(out + 1, (u64)gave_up);
    if (t == 0 && b == 0) out[0] = (t1 - t0) / reps;
}
extern "C" __global__ void hop_sides_1(u64* space, const int* table, int tl, const unsigned char* side_of, int n, int mode, int reps, u64* out) {
    hop_sides<1>(space, table, tl, side_of, n, mode, reps, out); }
extern "C" __global__ void hop_sides_2(u64* space, const int* table, int tl, const unsigned char* side_of, int n, int mode, int reps, u64* out) {
    hop_sides<2>(space, table, tl, side_of, n, mode, reps, out); }
"""

NL = 2048  # lines mapped (256 KB)
ONE_PER_SM = 150 * 1024  # dynamic shared memory that keeps a second block off a multiprocessor


def split_sides(lat: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Sides of rows (multiprocessors) and columns (lines) from the double-centred matrix's first singular
    vectors, numbered so that a row and a column of the same side are the nearer pairing, and the share of
    the interaction's energy that component holds."""
    r = lat - lat.mean(axis=1, keepdims=True) - lat.mean(axis=0, keepdims=True) + lat.mean()
    u, s, vt = np.linalg.svd(r, full_matrices=False)
    sm_side, line_side = (u[:, 0] > 0).astype(np.uint8), (vt[0] > 0).astype(np.uint8)
    same = (lat[sm_side == 0][:, line_side == 0].mean() + lat[sm_side == 1][:, line_side == 1].mean())
    crossed = (lat[sm_side == 0][:, line_side == 1].mean() + lat[sm_side == 1][:, line_side == 0].mean())
    if same > crossed:
        line_side = 1 - line_side
    return sm_side, line_side, float(s[0] ** 2 / (s ** 2).sum())


def runs(bits: np.ndarray) -> str:
    """How long the runs of one side are along the address, as 'length: count' (the layout's granularity)."""
    edges = np.flatnonzero(np.diff(bits.astype(np.int8))) + 1
    lengths = np.diff(np.concatenate(([0], edges, [bits.size])))
    values, counts = np.unique(lengths, return_counts=True)
    return ", ".join(f"{v}: {c}" for v, c in zip(values[:12], counts[:12])) + (" ..." if values.size > 12 else "")


def main() -> None:
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    nsm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    space = cp.zeros((NL + 6 * 64) * 16, dtype=cp.uint64)  # the mapped lines, then the contiguous copies' (the hop's too)
    turn = cp.zeros(2, dtype=cp.uint32)
    sms = cp.zeros(nsm, dtype=cp.uint32)
    cycles = cp.zeros(nsm * 2 * NL, dtype=cp.uint32)
    side_map = mod.get_function("side_map")
    side_map.max_dynamic_shared_size_bytes = ONE_PER_SM
    side_map((nsm,), (32,), (space, np.int32(NL), np.int32(8), np.uint64(0), turn, sms, cycles), shared_mem=ONE_PER_SM)
    cp.cuda.Device().synchronize()
    sm_of_block = sms.get()
    if np.unique(sm_of_block).size != nsm:
        raise SystemExit(f"the map's blocks did not take one multiprocessor each ({np.unique(sm_of_block).size} of {nsm})")
    lat = cycles.get().reshape(nsm, 2, NL).astype(np.float64)
    sides = {}
    for f, name in ((0, "ld.relaxed.gpu"), (1, "atom.add.relaxed.gpu")):
        m = lat[:, f]
        sm_side, line_side, share = split_sides(m)
        mean = np.array([[m[sm_side == a][:, line_side == c].mean() for c in (0, 1)] for a in (0, 1)])
        print(f"{name}: round trip {m.mean():.0f} cycles (multiprocessors {m.mean(axis=1).min():.0f}-{m.mean(axis=1).max():.0f},"
              f" lines {m.mean(axis=0).min():.0f}-{m.mean(axis=0).max():.0f}); the split holds {share:.0%} of the interaction;"
              f" side 0's {int((sm_side == 0).sum())} multiprocessors to side 0 / 1 lines {mean[0, 0]:.0f} / {mean[0, 1]:.0f},"
              f" side 1's {int((sm_side == 1).sum())} to side 0 / 1 lines {mean[1, 0]:.0f} / {mean[1, 1]:.0f} cycles")
        print(f"  lines' sides by address (first 128): {''.join(map(str, line_side[:128]))}")
        print(f"  runs of one side along the address, lines: {runs(line_side)}")
        print(f"  side 1's multiprocessors (%smid): {sorted(int(s) for s in sm_of_block[sm_side == 1])}")
        sides[f] = (sm_side, line_side, mean[0, 1] - mean[0, 0] + mean[1, 0] - mean[1, 1])
    # the hop's sides from the flavour with the larger near / far gap
    sm_side, line_side, _ = max(sides.values(), key=lambda s: s[2])
    if min(int((line_side == 0).sum()), int((line_side == 1).sum())) < 2 * 3 * 64:
        raise SystemExit("too few lines on one side for the hop's copies")
    side_of = np.zeros(256, dtype=np.uint8)
    side_of[sm_of_block] = sm_side
    side_of = cp.asarray(side_of)
    by_side = [np.flatnonzero(line_side == c) for c in (0, 1)]
    out = cp.zeros(4, dtype=cp.uint64)
    claim = cp.zeros(2, dtype=cp.uint32)
    handoff = mod.get_function("handoff")
    handoff.max_dynamic_shared_size_bytes = ONE_PER_SM
    for s0, s1, label in ((0, 0, "both on side 0"), (1, 1, "both on side 1"), (0, 1, "one on each side")):
        row = []
        for line in (0, 1):
            a, c = (space[int(by_side[line][k]) * 16:] for k in (-1, -2))  # mapped lines the hop's tables do not use
            ns = []
            for _ in range(2):
                claim.fill(0)
                out.fill(0)
                space[:NL * 16].fill(0)
                handoff((nsm,), (32,), (a, c, side_of, np.int32(s0), np.int32(s1), np.int32(2000), claim, out),
                        shared_mem=ONE_PER_SM)
                cp.cuda.Device().synchronize()
                o = out.get()
                ns.append(f"{o[0]}" if o[1] == 2 else "(a player missing)")
            row.append(f"words on side {line}'s lines {' / '.join(ns)} ns")
        print(f"a tagged word handed between two blocks ({label}), one way: {'; '.join(row)}")
    for n, nv in ((576, 1), (1536, 2)):
        tl = (n + 15) // 16  # lines a copy
        table = np.empty((2, 3, tl), dtype=np.int32)
        for parity in (0, 1):  # contiguous lines past the mapped ones; each side's from its list, disjoint per parity
            table[parity, 0] = NL + parity * tl + np.arange(tl)
            table[parity, 1] = by_side[0][parity * tl:(parity + 1) * tl]
            table[parity, 2] = by_side[1][parity * tl:(parity + 1) * tl]
        table = cp.asarray(table.reshape(-1))
        hop = mod.get_function(f"hop_sides_{nv}")
        hop.max_dynamic_shared_size_bytes = ONE_PER_SM
        results = {mode: [] for mode in range(4)}
        for _ in range(3):
            for mode in range(4):
                space.fill(0)
                out.fill(0)
                hop((nsm,), (384,), (space, table, np.int32(tl), side_of, np.int32(n), np.int32(mode), np.int32(2000), out),
                    shared_mem=ONE_PER_SM)
                cp.cuda.Device().synchronize()
                o = out.get()
                results[mode].append(f"{o[0]}" + (f" ({o[1]} gave up)" if o[1] else ""))
        labels = ("one copy, contiguous lines (today)", "two copies, each block polls its own side's",
                  "two copies, each block polls the other side's", "two copies, every block polls side 0's")
        for mode, label in enumerate(labels):
            print(f"hop of a {n}-word tagged vector, {nsm} blocks, {label}: {' / '.join(results[mode])} ns")


if __name__ == "__main__":
    main()
