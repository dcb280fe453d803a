"""Lossless 12-bit weights: can a product stream them at the rate of their bytes? (timing only)

A bf16 weight [s e7..e1 | e0 m6..m0] keeps its low byte as it is; its high byte, where e7..e1 lies in
B..B+7 (a window of 16 binades), becomes a 4-bit code (s, e7..e1 - B). With B = 56 for every matrix
(|w| in [2^-15, 2)) the code unpacks with bitwise operations only (`or`); with B chosen per matrix
(`add`, one more instruction per 4 weights) far fewer weights fall outside the window. Those
(escapes) would need a correction list (not built here). A granule then holds the same weights in
1.5 KB instead of 2 KB, and a lane's math rebuilds its bf16 words exactly before the kernel's dot
products, at ~9-11 more integer instructions per 8 weights (the kernel's: ~17).

The probe first checks the decode on random weights in the window (edges included), for both ways:
every decoded vector equals its bf16 source and every coded granule's sum equals the bf16 granule's
bit for bit. Then it times phases of the same weights per block through bench/stream_probe.py's ring
(the decode kernel's ring structure, 12 warps): as bf16 granules (4 slots a warp, 96 KB in flight)
and as coded ones (4 slots, 72 KB; 5 slots, 90 KB; `add` at 4 slots), with the kernel's math and
without, at four shapes' shares of a product, and prints each phase and the weights streamed per
second against bf16's.
`--escapes` prints instead (CPU only) how many weights fall outside the window, fixed or per matrix:
for N(0, 1/K) weights as kog's synthetic models draw them at the fan-ins K of the shapes kog is
measured at, and with `--gguf FILE` for that model's layer matrices.

    python bench/coded_probe.py [--escapes [--gguf FILE]]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stream_probe import SOURCE as STREAM_SOURCE  # noqa: E402
from bench.stream_probe import SHARES, RingPhases  # noqa: E402

OR_BASE = 56  # the fixed window's lowest e7..e1: |w| in [2^-15, 2)

SOURCE = STREAM_SOURCE + r"""
// A lane's 32 weights of a granule (the bf16 granule's 4 vectors) as 3 vectors: two of low bytes
// (bf16 vector 2j's in .x .y, 2j + 1's in .z .w) and one of codes (word i: bf16 vector i's 8 codes;
// byte k holds element k's code in bits 7, 2..0 and element k + 4's in bits 3, 6..4, so that both
// unpack with a few bitwise operations). base4: the window's B in every byte; ADD: B is any value
// (an add), else it is 56 (an or: its low three bits are free).
template <bool ADD>
__device__ __forceinline__ uint4 decode8(unsigned lo0, unsigned lo1, unsigned code, unsigned base4) {
    const unsigned sa = code & 0x87878787u, ob = (code >> 4) & 0x07070707u, sb = (code << 4) & 0x80808080u;
    const unsigned ha = ADD ? sa + base4 : sa | 0x38383838u;  // elements 0..3's high bytes (no carry: B + 7 < 128)
    const unsigned hb = ADD ? ob + sb + base4 : ob | sb | 0x38383838u;  // 4..7's
    return make_uint4(__byte_perm(lo0, ha, 0x5140), __byte_perm(lo0, ha, 0x7362),
                      __byte_perm(lo1, hb, 0x5140), __byte_perm(lo1, hb, 0x7362));
}
template <bool ADD>
__device__ __forceinline__ void decode_granule(const uint4 (&cv)[3], uint4 (&wv)[4], unsigned base4) {
    wv[0] = decode8<ADD>(cv[0].x, cv[0].y, cv[2].x, base4);
    wv[1] = decode8<ADD>(cv[0].z, cv[0].w, cv[2].y, base4);
    wv[2] = decode8<ADD>(cv[1].x, cv[1].y, cv[2].z, base4);
    wv[3] = decode8<ADD>(cv[1].z, cv[1].w, cv[2].w, base4);
}
__constant__ unsigned coded_base4;  // the `add` window's B in every byte: an operand, as a kernel parameter would be
// Math (a granule's math on bf16 vectors, bench/stream_probe.py's ring_phase) on coded granules: decoded first.
template <class Math, bool ADD = true>
struct Coded {
    using Inputs = typename Math::Inputs;
    static constexpr int V = 3;
    __device__ static float run(const uint4 (&cv)[V], const Inputs& x) {
        uint4 wv[4];
        decode_granule<ADD>(cv, wv, coded_base4);
        return Math::run(wv, x);
    }
};
#define CODED_RING(NAME, R, ADD) extern "C" __global__ void NAME(const uint4* src, long long per_block, int math, \
    int early, long long region, int reps, unsigned* counter, u64* out, const unsigned* chase, u64* lat) { \
    ring_phase<R, Coded<Bf16Math, ADD>>(src, per_block, math, early, region, reps, counter, out, chase, lat); }
CODED_RING(coded_ring_phase4, 4, false) CODED_RING(coded_ring_phase5, 5, false) CODED_RING(coded_add_ring_phase4, 4, true)

// One warp a granule g: sums[2g] its bf16 math, sums[2g + 1] its coded math; decoded: its vectors rebuilt.
template <bool ADD>
__device__ void coded_check(const uint4* bf16, const uint4* coded, int ngran, float* sums, uint4* decoded) {
    const int lane = threadIdx.x & 31, g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= ngran) return;
    const GranuleInputs x(lane);
    uint4 wv[4], cv[3], dv[4];
    for (int i = 0; i < 4; ++i) wv[i] = bf16[g * 128 + i * 32 + lane];
    for (int i = 0; i < 3; ++i) cv[i] = coded[g * 96 + i * 32 + lane];
    decode_granule<ADD>(cv, dv, coded_base4);
    for (int i = 0; i < 4; ++i) decoded[g * 128 + i * 32 + lane] = dv[i];
    const float a = granule_math(wv, x), b = Coded<Bf16Math, ADD>::run(cv, x);
    if (lane == 0) sums[2 * g] = a, sums[2 * g + 1] = b;
}
extern "C" __global__ void coded_check_or(const uint4* bf16, const uint4* coded, int ngran, float* sums, uint4* decoded) {
    coded_check<false>(bf16, coded, ngran, sums, decoded);
}
extern "C" __global__ void coded_check_add(const uint4* bf16, const uint4* coded, int ngran, float* sums, uint4* decoded) {
    coded_check<true>(bf16, coded, ngran, sums, decoded);
}
"""


def escapes(bits: np.ndarray, base: int = OR_BASE) -> np.ndarray:
    """Which bf16 weights (uint16 bits) lie outside the window of e7..e1 in base .. base + 7."""
    e = ((bits >> 8) & 0x7F).astype(np.int32)
    return (e < base) | (e > base + 7)


def encode(granules: np.ndarray, base: int = OR_BASE) -> np.ndarray:
    """bf16 granules (uint16 [n, 4 vectors, 32 lanes, 8 elements], no escapes) -> coded granules
    (uint8 [n, 3 vectors, 32 lanes, 16 bytes]) in decode8's layout."""
    assert not escapes(granules, base).any()
    n = granules.shape[0]
    lo = (granules & 0xFF).astype(np.uint8)  # [n, 4, 32, 8]
    hi = granules >> 8
    code = ((hi >> 7) << 3 | ((hi & 0x7F) - base)).astype(np.uint8)  # s o2 o1 o0
    out = np.empty((n, 3, 32, 16), np.uint8)
    out[:, 0] = np.concatenate([lo[:, 0], lo[:, 1]], axis=-1)
    out[:, 1] = np.concatenate([lo[:, 2], lo[:, 3]], axis=-1)
    a, b = code[..., :4], code[..., 4:]  # element k and k + 4 share byte k of vector i's word
    byte = (a >> 3) << 7 | (a & 7) | (b >> 3) << 3 | (b & 7) << 4
    out[:, 2] = byte.transpose(0, 2, 1, 3).reshape(n, 32, 16)
    return out


def to_bf16_bits(w: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(w, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def window_weights(rng: np.random.Generator, shape: tuple[int, ...], base: int) -> np.ndarray:
    """bf16 bits of normal weights centred in the window, escapes redrawn inside it, its edges included."""
    bits = to_bf16_bits(rng.standard_normal(shape, dtype=np.float32) * np.float32(2.0 ** (2 * base - 127 + 10)))
    out = escapes(bits, base)
    k = int(out.sum())
    bits[out] = (rng.integers(0, 2, k) << 15 | (base + rng.integers(0, 8, k)) << 8 | rng.integers(0, 256, k)).astype(np.uint16)
    top, bottom = (base + 7) << 8 | 0xFF, base << 8  # the largest and the smallest magnitude in the window
    bits.reshape(-1)[:4] = [top, 0x8000 | top, bottom, 0x8000 | bottom]
    return bits


def set_base(cp, mod, base: int) -> None:
    cp.ndarray((1,), cp.uint32, mod.get_global("coded_base4"))[...] = base * 0x01010101


def check(cp, mod) -> None:
    rng = np.random.default_rng()
    n = 4096
    for how, base in (("or", OR_BASE), ("add", 52)):
        src = window_weights(rng, (n, 4, 32, 8), base)
        coded = encode(src, base)
        set_base(cp, mod, base)
        sums = cp.zeros(2 * n, dtype=cp.float32)
        decoded = cp.zeros(src.size // 2, dtype=cp.uint32)
        mod.get_function(f"coded_check_{how}")((n // 8,), (256,), (cp.asarray(src), cp.asarray(coded), np.int32(n), sums,
                                                                   decoded))
        back = decoded.get().view(np.uint16).reshape(src.shape)
        s = sums.get().reshape(n, 2).view(np.uint32)
        print(f"decode check ({how}, window e7..e1 {base}..{base + 7}), {n} granules ({src.size:,} weights): decoded "
              f"vectors differing from their source: {int((back != src).any(axis=(1, 2, 3)).sum())}; coded sums "
              f"differing from the bf16 sums bit for bit: {int((s[:, 0] != s[:, 1]).sum())}")


def time_phases(cp, mod) -> None:
    phase = RingPhases(cp, mod)
    set_base(cp, mod, OR_BASE)
    for name, share in SHARES:
        granules = share // 2048
        weights = phase.nsm * granules * 1024
        for math in (1, 0):
            base = None
            for label, kernel, vectors in (("bf16, 4 slots (96 KB)", "ring_phase4", granules * 128),
                                           ("coded, 4 slots (72 KB)", "coded_ring_phase4", granules * 96),
                                           ("coded, 5 slots (90 KB)", "coded_ring_phase5", granules * 96),
                                           ("coded add, 4 slots", "coded_add_ring_phase4", granules * 96),
                                           ("bf16, 4 slots (96 KB)", "ring_phase4", granules * 128)):
                us = phase(kernel, vectors, math)
                base = base or us
                print(f"{name:16s} {granules * 2:4d} KB of bf16 a block, {'math   ' if math else 'no math'}, {label:22s}: "
                      f"phase {us:6.2f} us, {weights / us / 1e3:6.1f} G weights/s ({2 * weights / us / 1e3:5.0f} GB/s "
                      f"as bf16), {base / us:4.2f}x the first bf16")


def best_base(bits: np.ndarray) -> int:
    """The window (lowest e7..e1) that holds the most of these bf16 weights."""
    counts = np.bincount(((bits >> 8) & 0x7F).ravel(), minlength=128)
    return int(np.argmax(np.convolve(counts, np.ones(8, np.int64), "valid")))


def escape_report(matrices) -> None:
    """matrices: (name, bf16 bits) pairs; per pair and in all, the weights outside the fixed window and
    outside the pair's own best window."""
    total = fixed = own = 0
    for name, bits in matrices:
        base = best_base(bits)
        f, o = int(escapes(bits).sum()), int(escapes(bits, base).sum())
        total, fixed, own = total + bits.size, fixed + f, own + o
        print(f"  {name}: {bits.size:,} weights; outside the fixed window {f / bits.size:.2e}, outside its own "
              f"(e7..e1 from {base}) {o / bits.size:.2e}")
    print(f"  all: {total:,} weights; outside the fixed window {fixed / total:.2e}, outside their own {own / total:.2e}")


def synthetic_matrices():
    """N(0, 1/K) weights (engine/synthetic.py's draw) at the fan-ins of the shapes kog is measured at."""
    rng = np.random.default_rng(0)
    for k, where in ((576, "SmolLM2 QKV, O, gate/up"), (1536, "SmolLM2 down; Qwen2.5 QKV, O, gate/up"),
                     (2048, "Llama QKV, O, gate/up; Qwen3 QKV, O, gate/up"), (6144, "Qwen3 down"),
                     (8192, "Llama down"), (8960, "Qwen2.5 down")):
        yield f"K {k} ({where})", to_bf16_bits(rng.standard_normal(1 << 22, dtype=np.float32) / np.float32(np.sqrt(k)))


def gguf_matrices(path: Path):
    from engine.loaders import gguf_file

    reader = gguf_file.open_reader(path)
    for name, w in gguf_file.read_weights(reader, gguf_file.read_config(reader, path), path).items():
        if w.ndim == 2 and "embed" not in name and "lm_head" not in name:
            yield name, to_bf16_bits(w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--escapes", action="store_true", help="print how many weights fall outside the window (CPU)")
    parser.add_argument("--gguf", type=Path, help="with --escapes: this model's layer matrices")
    args = parser.parse_args()
    if args.escapes:
        print(f"{args.gguf.name if args.gguf else 'synthetic N(0, 1/K) weights'}:")
        return escape_report(gguf_matrices(args.gguf) if args.gguf else synthetic_matrices())
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    check(cp, mod)
    time_phases(cp, mod)


if __name__ == "__main__":
    main()
