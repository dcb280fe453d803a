"""The L2 partitions a GPU's multiprocessors and memory sit by, mapped by timing (kernels/l2_sides.cu).

H100/H200's L2 is two partitions, each wired to half of the multiprocessors; every 4 KB chunk of memory is
homed in one of them, and a round trip to the other partition's lines takes longer (an atomic on H200: ~310
cycles near, ~500 far). The decode kernel keeps the vectors its blocks hand each other in two copies, one on
each partition's chunks, and each block polls its own partition's (kernels/decode_common.cuh, the hop
space). Where no two partitions show (another GPU), or the timings disagree with themselves, the copies go
on any chunks: slower by a store a word, never wrong -- every copy gets every store.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK_WORDS = 512  # 8-byte words of a chunk (4 KB): the grain of the partitions' address map
CHUNK_LINES = 32  # 128-byte lines of a chunk
SAMPLED_LINES = (0, 11, 21, 31)  # lines of a chunk timed: a chunk whose lines disagree is not used
REPS = 8  # dependent round trips a line
MIN_GAP = 60  # cycles between near and far round trips below which the partitions are not told apart
PROBE_CHUNKS = 64  # chunks of the buffer that maps the multiprocessors
SM_LINES = 4  # lines of each side a multiprocessor times
ONE_PER_SM = 150 * 1024  # dynamic shared memory that keeps a second block off a multiprocessor
SM_IDS = 256  # %smid values the kernel's table covers


@dataclass
class HopSpace:
    """The decode kernel's hop space in `copies` copies of `chunks` chunks: `arena` (uint64 words, chunk
    aligned), `hop_map` ([copies, chunks] uint16: copy k's chunk j is chunk hop_map[k, j] of the arena) and
    `sm_side` ([256] uint8: the copy a multiprocessor polls), on the device; `host_map`: hop_map on the host.
    `sided`: the copies lie on the two partitions."""

    arena: object
    hop_map: object
    sm_side: object
    host_map: np.ndarray
    sided: bool

    def words(self, start: int, n: int, copy: int = 0) -> np.ndarray:
        """Words start .. start + n - 1 of one copy, to the host (tests)."""
        v = np.arange(start, start + n)
        return self.arena.get()[self.host_map[copy][v // CHUNK_WORDS].astype(np.int64) * CHUNK_WORDS + v % CHUNK_WORDS]


def _chunk_aligned_zeros(cp, chunks: int, align: int = 1):
    """A zeroed array of `chunks` whole chunks (uint64 words), starting on a multiple of `align` chunks."""
    raw = cp.zeros((chunks + align) * CHUNK_WORDS, dtype=cp.uint64)
    skip = (-raw.data.ptr // 8) % (align * CHUNK_WORDS)
    return raw[skip : skip + chunks * CHUNK_WORDS]


def round_trip_kernel(module):
    """kernels/l2_sides.cu's timing kernel, from its module, set to take one multiprocessor a block."""
    kernel = module.get_function("kog_l2_round_trips")
    kernel.max_dynamic_shared_size_bytes = ONE_PER_SM
    return kernel


def round_trips(cp, kernel, lines, idx: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Cycles a round trip to each line of idx ([blocks, n] line numbers), from one block a multiprocessor,
    and each block's multiprocessor."""
    n = idx.shape[1]
    d_idx = cp.asarray(np.ascontiguousarray(idx, dtype=np.int32))
    sms = cp.zeros(blocks, dtype=cp.uint32)
    cycles = cp.zeros(blocks * n, dtype=cp.uint32)
    kernel((blocks,), (32,), (lines, d_idx, np.int32(n), np.int32(REPS), np.uint64(0), sms, cycles),
           shared_mem=ONE_PER_SM)
    return cycles.get().reshape(blocks, n).astype(np.float64), sms.get()


def _near_far(lat: np.ndarray) -> tuple[float, float]:
    """The two levels of a set of round trips (two means), or equal ones where there is one."""
    lo, hi = float(lat.min()), float(lat.max())
    for _ in range(20):
        cut = (lo + hi) / 2
        if not (lat < cut).any() or (lat < cut).all():
            return float(lat.mean()), float(lat.mean())
        lo, hi = float(lat[lat < cut].mean()), float(lat[lat >= cut].mean())
    return lo, hi


def _chunk_sides(cp, kernel, arena, nchunks: int) -> tuple[np.ndarray, int] | None:
    """Each chunk's side as seen from one multiprocessor (0 near, 1 far, -1 its lines disagree), and that
    multiprocessor's %smid; None where no two levels show."""
    idx = (np.arange(nchunks)[:, None] * CHUNK_LINES + np.array(SAMPLED_LINES)[None, :]).reshape(1, -1)
    lat, sms = round_trips(cp, kernel, arena, idx, 1)
    near, far = _near_far(lat)
    if far - near < MIN_GAP:
        return None
    far_line = (lat[0] >= (near + far) / 2).reshape(nchunks, len(SAMPLED_LINES))
    sides = np.where(far_line.all(axis=1), 1, np.where(far_line.any(axis=1), -1, 0))
    return sides, int(sms[0])


def _sm_sides(cp, kernel, nsm: int) -> np.ndarray | None:
    """[256] uint8: the side of each multiprocessor (0: the side of the one that mapped the probe's
    chunks), or None where the partitions do not show or the timings disagree."""
    probe = _chunk_aligned_zeros(cp, PROBE_CHUNKS)
    mapped = _chunk_sides(cp, kernel, probe, PROBE_CHUNKS)
    if mapped is None:
        return None
    sides, ref_sm = mapped
    by_side = [np.flatnonzero(sides == s) for s in (0, 1)]
    if min(len(by_side[0]), len(by_side[1])) < 2:
        return None
    # every block its own lines: SM_LINES of chunks on the mapper's side, SM_LINES of the other's
    k = np.arange(nsm * SM_LINES)
    idx = np.concatenate([(by_side[s][k % len(by_side[s])] * CHUNK_LINES + (k // len(by_side[s])) % CHUNK_LINES)
                          .reshape(nsm, SM_LINES) for s in (0, 1)], axis=1)
    lat, sms = round_trips(cp, kernel, probe, idx, nsm)
    gap = lat[:, SM_LINES:].mean(axis=1) - lat[:, :SM_LINES].mean(axis=1)  # far side minus the mapper's side
    if (np.abs(gap) < MIN_GAP).any() or len(np.unique(sms)) != nsm or ref_sm not in sms:
        return None
    out = np.zeros(SM_IDS, dtype=np.uint8)
    out[sms % SM_IDS] = (gap < 0).astype(np.uint8)
    if out[ref_sm % SM_IDS] != 0:
        return None
    return out


def paired_map(sides: np.ndarray, mapper_side: int, chunks: int) -> np.ndarray | None:
    """[2, chunks] uint16: the chunks of the two copies, copy k's on side k, pair by pair (chunks 2i and 2i + 1
    on different sides: copy 1's chunk is copy 0's ^ 1), from each chunk's side as the multiprocessor that
    timed them saw it (0 near, 1 far, -1 unclear) and that multiprocessor's side; None where too few pairs
    are split."""
    a, b = sides[0::2], sides[1::2]
    split = np.flatnonzero((a >= 0) & (b >= 0) & (a != b))[:chunks]
    if len(split) < chunks:
        return None
    side0 = 2 * split + (a[split] ^ mapper_side)  # the pair's chunk on side 0: the first where it is on side 0
    return np.stack([side0, side0 ^ 1]).astype(np.uint16)


def hop_space(cp, module, words: int, copies: int, nsm: int) -> HopSpace:
    """The decode kernel's hop space of `words` words in `copies` copies, placed by partition where the
    GPU shows two (module: kernels/l2_sides.cu's). With two copies their chunks pair up, as the kernel
    reads them: copy 1's chunk j is copy 0's neighbour in their 8 KB (chunk ^ 1), so that a store finds the
    other copy's word without a second lookup; on H200 every 8 KB holds one chunk of each partition."""
    chunks = (words + CHUNK_WORDS - 1) // CHUNK_WORDS
    kernel = round_trip_kernel(module)
    sm_side = _sm_sides(cp, kernel, nsm) if copies == 2 else None
    spare = 16 if sm_side is not None else 0  # pairs not split between the partitions, if any
    total = copies * (chunks + spare)
    arena = _chunk_aligned_zeros(cp, total, align=copies)
    pairs = np.arange(chunks) * copies
    host_map = np.stack([pairs + k for k in range(copies)]).astype(np.uint16)
    sided = False
    if sm_side is not None:
        mapped = _chunk_sides(cp, kernel, arena, total)
        if mapped is not None:
            sides, ref_sm = mapped
            paired = paired_map(sides, int(sm_side[ref_sm % SM_IDS]), chunks)
            if paired is not None:
                host_map, sided = paired, True
    if not sided:
        sm_side = np.zeros(SM_IDS, dtype=np.uint8)
    return HopSpace(arena=arena, hop_map=cp.asarray(host_map), sm_side=cp.asarray(sm_side), host_map=host_map,
                    sided=sided)
