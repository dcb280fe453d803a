"""How fast a word one multiprocessor stores is seen by another, by store and poll flavour (timing only).

A hop of the decode kernel is a relaxed 8-byte store of a tagged word by one block and relaxed polls of
it by the others. Here two blocks on different multiprocessors hand a counter back and forth 2,000 times
(each waits to see the other's r, then stores its own r): ns one way, for the partner on each of 8
multiprocessors spread over the chip (min / median / max). Flavours, writer / poller: the kernel's
st.relaxed.gpu / ld.relaxed.gpu; volatile; write-through (.wt) stores; atomic
exchange or red.add stores; polls by an atomic or of 0 (performed at L2); st.release / ld.acquire; and
system scope (weak loads are left out: nothing makes a weak poll see a store). Then out and back: block 0
stores r, every other block polls it and answers on its own line, block 0's lanes poll all answers; r
stored once (one line polled by all) or on each block's own line: ns a round. Last, the kernel's flavour
with two polls in flight, issued 100-450 cycles apart, against one; and the round's two legs timed apart
by the global timer stamped into 8-byte words (the decode kernel's word size), with 1-131 answering
blocks whose answers take a line each or share lines eight a line.

    python bench/store_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sync_probe import PREAMBLE

FLAVOURS = ("st.relaxed.gpu / ld.relaxed.gpu (the kernel's)", "st.volatile / ld.volatile", "st.wt / ld.relaxed.gpu",
            "atom.exch / ld.relaxed.gpu", "red.add / ld.relaxed.gpu",
            "st.relaxed.gpu / atom.or 0", "st.release.gpu / ld.acquire.gpu", "st.relaxed.sys / ld.relaxed.sys")

SOURCE = PREAMBLE + r"""
__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }

template <int F>
__device__ __forceinline__ void put(unsigned* p, unsigned r) {  // publish r (the word held r - 1)
    unsigned old;
    switch (F) {
        case 0: asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(r) : "memory"); break;
        case 1: asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(r) : "memory"); break;
        case 2: asm volatile("st.global.wt.u32 [%0], %1;" ::"l"(p), "r"(r) : "memory"); break;
        case 3: asm volatile("atom.relaxed.gpu.global.exch.b32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(r) : "memory"); break;
        case 4: asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory"); break;
        case 5: asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(r) : "memory"); break;
        case 6: asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(r) : "memory"); break;
        default: asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(r) : "memory"); break;
    }
}
template <int F>
__device__ __forceinline__ unsigned get(const unsigned* p) {
    unsigned v;
    switch (F) {
        case 1: asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); break;
        case 5: asm volatile("atom.relaxed.gpu.global.or.b32 %0, [%1], 0;" : "=r"(v) : "l"(p) : "memory"); break;
        case 6: asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); break;
        case 7: asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); break;
        default: asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); break;
    }
    return v;
}

// Wait until *p >= r. stagger > 0: two polls in flight, issued `stagger` clock cycles apart, so that
// a word that lands just after one poll passed L2 is seen by the next half a round trip sooner.
__device__ __forceinline__ void spin(int cycles) {
    const long long t = clock64();
    while (clock64() - t < cycles) {}
}
template <int F>
__device__ __forceinline__ void wait_at_least(const unsigned* p, unsigned r, int stagger) {
    if (stagger == 0) {
        while (get<F>(p) < r) {}
        return;
    }
    unsigned a = get<F>(p);
    spin(stagger);
    for (;;) {
        const unsigned b = get<F>(p);  // in flight while a is checked
        if (a >= r) return;
        spin(stagger);
        a = get<F>(p);
        if (b >= r) return;
        spin(stagger);
    }
}

// Blocks 0 and `partner` (one a multiprocessor) hand r back and forth; words 64 lines apart.
// out[0]: ns one way; out[1], out[2]: the two blocks' multiprocessors.
template <int F>
__device__ void pingpong(unsigned* words, int partner, u64* out, int stagger) {
    const int me = blockIdx.x;
    if (threadIdx.x != 0 || (me != 0 && me != partner)) return;
    unsigned* mine = words + (me ? 2048 : 0);
    const unsigned* other = words + (me ? 0 : 2048);
    const u64 t0 = now();
    for (unsigned r = 1; r <= 2000; ++r) {
        if (me == 0) {
            put<F>(mine, r);
            wait_at_least<F>(other, r, stagger);
        } else {
            wait_at_least<F>(other, r, stagger);
            put<F>(mine, r);
        }
    }
    const u64 t1 = now();
    if (me == 0) out[0] = (t1 - t0) / 4000, out[1] = smid();
    else out[2] = smid();
}

// Block 0 stores r; every other block polls it and answers r on its own line; block 0's lanes poll
// the answers, each lane all of its lines a round (as the kernel's gathers). SPREAD: block 0's lanes
// store r on each block's own line instead of one line that all poll. out[0]: ns a round.
template <int F, bool SPREAD>
__device__ void fan(unsigned* words, u64* out, int stagger) {
    const int me = blockIdx.x, n = gridDim.x, lane = threadIdx.x;
    unsigned* const answers = words + 32 * 1024;
    const u64 t0 = now();
    for (unsigned r = 1; r <= 500; ++r) {
        if (me == 0) {
            if (SPREAD) {
                for (int j = 1 + lane; j < n; j += 32) put<F>(words + 32 * j, r);
            } else if (lane == 0) {
                put<F>(words, r);
            }
            for (bool all = false; !all;) {
                all = true;
                for (int j = 1 + lane; j < n; j += 32) all &= get<F>(answers + 32 * j) >= r;
                all = __all_sync(0xffffffffu, all);
            }
        } else if (lane == 0) {
            wait_at_least<F>(words + (SPREAD ? 32 * me : 0), r, stagger);
            put<F>(answers + 32 * me, r);
        }
    }
    const u64 t1 = now();
    if (me == 0 && lane == 0) out[0] = (t1 - t0) / 500;
}

// The two legs of that round apart, in the kernel's flavour with 8-byte words (r high, the writer's
// globaltimer low, as the decode kernel's tagged words carry a tag beside the value): each of the
// other blocks measures how long block 0's word took to reach it (out), and block 0 how long after
// the last answer was stored it had seen them all (back). out[0]: summed out-leg ns over rounds and
// blocks; out[2]: summed back-leg ns; out[3 + r]: round r's slowest out-leg.
__device__ __forceinline__ void put64(u64* p, u64 v) { asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ u64 get64(const u64* p) {
    u64 v; asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u64 stamped(unsigned r) { return (u64)r << 32 | (unsigned)now(); }
__device__ __forceinline__ unsigned since(u64 word) { return (unsigned)now() - (unsigned)word; }  // mod 2^32 ns
// `apart`: u64 words between two blocks' answers (16: a line each; 1: eight a line); blocks >= n answer nothing.
extern "C" __global__ void legs(u64* words, u64* out, int n, int apart) {
    const int me = blockIdx.x, lane = threadIdx.x;
    if (me >= n) return;
    u64* const answers = words + 16 * 1024;
    u64 out_sum = 0, back_sum = 0;
    for (unsigned r = 1; r <= 500; ++r) {
        if (me == 0) {
            if (lane == 0) put64(words, stamped(r));
            unsigned last_store = 0;  // the latest answer's globaltimer (low bits)
            for (bool all = false; !all;) {
                all = true;
                for (int j = 1 + lane; j < n; j += 32) {
                    const u64 w = get64(answers + apart * j);
                    if ((unsigned)(w >> 32) < r) all = false;
                    else if ((int)((unsigned)w - last_store) > 0 || last_store == 0) last_store = (unsigned)w;
                }
                all = __all_sync(0xffffffffu, all);
            }
            const unsigned done = (unsigned)now();
            unsigned latest = last_store;
            bool has = 1 + lane < n;  // lanes past the answering blocks hold no stamp
            for (int o = 16; o > 0; o /= 2) {
                const unsigned other = __shfl_xor_sync(0xffffffffu, latest, o);
                const bool other_has = __shfl_xor_sync(0xffffffffu, has, o);
                if (other_has && (!has || (int)(other - latest) > 0)) latest = other;
                has |= other_has;
            }
            back_sum += done - latest;
        } else if (lane == 0) {
            u64 w;
            while ((unsigned)((w = get64(words)) >> 32) < r) {}
            const unsigned leg = since(w);
            out_sum += leg;
            atomicMax(&out[3 + r], (u64)leg);  // the round's slowest out-leg, summed once the kernel is done
            put64(answers + apart * me, stamped(r));
        }
        __syncwarp();
    }
    if (lane == 0 && me > 0) atomicAdd(&out[0], out_sum);
    if (lane == 0 && me == 0) out[2] = back_sum;
}

#define FLAVOUR(F) \
    extern "C" __global__ void pingpong_##F(unsigned* w, int partner, u64* out, int stagger) { \
        pingpong<F>(w, partner, out, stagger); } \
    extern "C" __global__ void fan_##F(unsigned* w, u64* out, int stagger) { fan<F, false>(w, out, stagger); } \
    extern "C" __global__ void fan_spread_##F(unsigned* w, u64* out, int stagger) { fan<F, true>(w, out, stagger); }
FLAVOUR(0) FLAVOUR(1) FLAVOUR(2) FLAVOUR(3) FLAVOUR(4) FLAVOUR(5) FLAVOUR(6) FLAVOUR(7)
"""


def main() -> None:
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    nsm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    words = cp.zeros(1 << 16, dtype=cp.uint32)
    out = cp.zeros(4 + 500, dtype=cp.uint64)
    partners = np.linspace(1, nsm - 1, 8).astype(int)
    smem = 150 << 10  # one block a multiprocessor
    for f in range(len(FLAVOURS)):
        for name in (f"pingpong_{f}", f"fan_{f}", f"fan_spread_{f}"):
            mod.get_function(name).max_dynamic_shared_size_bytes = smem

    def one_way_ns(f: int, stagger: int) -> list[int]:
        times = []
        for p in partners:
            words.fill(0)
            mod.get_function(f"pingpong_{f}")((nsm,), (32,), (words, np.int32(p), out, np.int32(stagger)), shared_mem=smem)
            cp.cuda.Device().synchronize()
            o = out.get()
            assert o[1] != o[2], "the two blocks share a multiprocessor"
            times.append(int(o[0]))
        return times

    def round_ns(kernel: str, stagger: int) -> int:
        best = []
        for _ in range(3):
            words.fill(0)
            mod.get_function(kernel)((nsm,), (32,), (words, out, np.int32(stagger)), shared_mem=smem)
            cp.cuda.Device().synchronize()
            best.append(int(out.get()[0]))
        return min(best)

    for f, label in enumerate(FLAVOURS):
        t = one_way_ns(f, 0)
        print(f"{label}: one way {min(t)} / {int(np.median(t))} / {max(t)} ns (min / median / max over 8 partners);"
              f" out to {nsm - 1} blocks and back {round_ns(f'fan_{f}', 0)} ns a round through one polled line,"
              f" {round_ns(f'fan_spread_{f}', 0)} ns through a line each")
    for stagger in (0, 100, 200, 300, 450):
        t = one_way_ns(0, stagger)
        print(f"the kernel's flavour, {'one poll' if stagger == 0 else f'two polls {stagger} cycles apart'} in flight:"
              f" one way {min(t)} / {int(np.median(t))} / {max(t)} ns; out to {nsm - 1} blocks and back"
              f" {round_ns('fan_0', stagger)} ns a round")
    legs = mod.get_function("legs")
    legs.max_dynamic_shared_size_bytes = smem
    for n, apart in ((nsm, 16), (nsm, 1), (65, 16), (33, 16), (33, 1), (9, 16), (9, 1), (2, 16)):
        words.fill(0)
        out.fill(0)
        legs((nsm,), (32,), (words, out, np.int32(n), np.int32(apart)), shared_mem=smem)
        cp.cuda.Device().synchronize()
        o = out.get()
        print(f"the round's legs with {n - 1} answering blocks, answers {'a line each' if apart == 16 else 'eight a line'}"
              f" (8-byte stamped words): out {o[0] / 500 / (n - 1):.0f} ns on average, the slowest block"
              f" {o[4:].mean():.0f} ns; back (the last answer stored to all seen) {o[2] / 500:.0f} ns")


if __name__ == "__main__":
    main()
