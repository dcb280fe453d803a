"""Where a decoded token's time goes.

Two views of the monokernel on random-init models at real shapes (timing only):
- variants: KOG_EXP=1 skips the attention math, 2 skips the weight loads (matrix math on
  zeros: what remains is synchronisation and per-phase overhead), 3 streams the weights
  without the L2 evict-first hint, 4 drops every wait between blocks (garbage tokens: the
  streaming and the math alone), 5 lets the attention units' merge publish at once, 6 lets the
  attention take q/k/v without waiting for them, 7 lets the LM head's int8 screen pick by its bounds
  (no bf16 row read), 8 streams three quarters of the layers' weight bytes and decodes every vector
  as 12-bit weights would be (garbage tokens: what lossless 12-bit weights would save, their escapes
  aside); KOG_RING=n keeps n granules in flight per warp;
  KOG_POLL_NS=n makes a poll of other blocks' words sleep n ns before looking again (the
  polls read L2 beside the weight stream); KOG_U=n forces n 16-byte vectors per lane per granule;
  KOG_LANE_SUMS=n keeps per-lane sums in shared memory in products of at most n granules per warp
  (0: every granule summed by shuffles); KOG_ATT_RMAX=n splits a kv head's query heads over blocks
  where the attention units then take at most n rounds of tiles (0: never; by shape by default);
  KOG_ATT_SPLIT=n lets a (query head, tile) pair take up to n warps where the pairs leave warps idle (1: a
  warp a pair);
  KOG_STASH=n stashes n more gate/up granules per warp inside the attention's gap (0: none),
  KOG_STASH_PACE=n keeps at most n of them in flight in a warp whose block had no attention work,
  KOG_STASH_ATT=0|1|2|3 stashes in blocks with attention work never, after it, after their O rows, or
  after them paced (by shape by default), KOG_QKV_SKIP=n leaves blocks 0..n-1, which run the
  attention at every position, without QKV rows (by shape by default),
  KOG_STASH_DN=0|1|2 stashes down's granules once gate/up is done never, at once or paced,
  KOG_STASH_XS=0|1 drops or takes gate/up's extra stash granule in the input region's gaps (where they
  fit); it also sizes that region (0: for down's column slice, whose room may add a stash granule);
  KOG_DN_SPLIT=n cuts down's columns into n slices, each on its own group of blocks (1: unsplit,
  every block gathers all of SiLU(gate)*up; by shape by default);
  KOG_HOLD=mask (bit 0 QKV .. 3 down) forces the kernel's HOLD: while a matrix in the mask is
  consumed, ring refills for a later matrix wait until the next product's input is staged
  (QKV's: until the block's attention work is done); hold-none: refills never wait;
  KOG_NBLK=n runs a grid of n blocks instead of one per multiprocessor; KOG_ICACHE_KB=n runs n KB more
  straight-line code once a token (after the LM head), KOG_ICACHE_LAYER_KB=n once a layer (by the blocks
  without attention work, while the attention runs): how much room the code leaves in the instruction cache;
  KOG_PRODUCT_WARPS=n (with KOG_EXP=10, the layers' weights resident) runs the layer products on n warps only:
  what giving warps over to a producer of the weights would cost the chain;
  --context n sets the prompt's length (32: the bench protocol; longer to time the attention);
  a version is another kernels/ folder (--version NAME=DIR, repeatable; --baseline DIR names
  it "baseline"), timed in the same run: the machines differ by a few percent from call to
  call, so compare versions only side by side (and a version may read ~0.5% under the tree's own
  build of the same kernels: PERF.md session 15); "a+b" combines variants a and b (of different
  knobs), and a version with variants (baseline+no-weight-loads: the baseline without loads). Make one with
  `mkdir -p .bench/v8 && git archive REV kernels | tar -x -C .bench/v8` (git ignores .bench:
  carry it to the GPU machine); its parameter block must match engine/backends/cuda.py (kernels
  before v33 are refused: they wrote DN_SPLIT x H partial sums where the host now keeps H words);
- a trace of one token (KOG_TRACE=step): every block stamps %globaltimer when it passes each
  wait and each arrival (block 0 its cycle counter too: the SM clock over the token); per phase
  of a middle layer this prints the work (ready -> done,
  median and slowest block) and the hop (last producer done -> consumers ready); inside each
  product of the traced layer (--trace-layer, by default the middle one), when each warp passed its steps (refills issued, first granule landed,
  granules done, the block's sums in, results stored; the last granule landed and its math done,
  before its refill is issued or held; when the refills held back for the product were issued,
  before its inputs are loaded); inside the layer's two norms, when each warp passed their steps (its words
  in, the block's, the sum of squares, staged); and the weight stream's demand while that layer runs (the
  bytes of the refills all warps issued, per 0.5 us, beside when each phase's last block passed;
  in layer 0 'choose ready' stands for 'qkv ready'; `--trace no-ring-stamps` leaves the refills unstamped,
  to see what their stamps cost the products' steps); untraced, the variant `release-clock` (KOG_RELEASE_CLOCK)
  prints the mean cycles a warp spends releasing held refills at each product's start.

    python bench/decode_breakdown.py [--models smollm2-135m,llama-3.2-1b] [--variants full,no-L2-hint] [--context 32]
        [--trace full|none|VERSION] [--trace-layer N] [--version v8=.bench/v8/kernels --variants full,v8]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.random_models import gpu_timing_model, random_prompt

VARIANTS = {
    "full": {},
    "no-attention": {"KOG_EXP": "1"},
    "no-weight-loads": {"KOG_EXP": "2"},
    "no-L2-hint": {"KOG_EXP": "3"},
    "no-waits": {"KOG_EXP": "4"},
    "no-merge-wait": {"KOG_EXP": "5"},
    "no-qkv-wait": {"KOG_EXP": "6"},  # the attention takes q/k/v as they stand (garbage: what their hop costs it)
    "bytes-75": {"KOG_EXP": "8"},  # the layers' granules three quarters copied and decoded (garbage: bench/coded_probe.py)
    "bytes-75-mlp": {"KOG_EXP": "9"},  # the same for gate/up and down only
    "layers-resident": {"KOG_EXP": "10"},  # layer products read stale ring slots: no copies, waits or refills (garbage)
    "no-o-wait": {"KOG_EXP": "11"},  # O's product takes its input as it stands (garbage: O folded into the attention at best)
    "no-gu-wait": {"KOG_EXP": "13"},  # gate/up's product takes its input as it stands (garbage: O folded into gate/up at best)
    "no-dn-wait": {"KOG_EXP": "14"},  # down's product takes its slice of act as it stands (garbage: the gate/up -> down hop's worth)
    "lm8-no-rows": {"KOG_LM_SCREEN": "1", "KOG_EXP": "7"},  # the screen recomputes no bf16 rows (tokens may differ: what their reads cost)
    "ring-2": {"KOG_RING": "2"},
    "ring-3": {"KOG_RING": "3"},
    "ring-4": {"KOG_RING": "4"},
    "ring-5": {"KOG_RING": "5"},  # (Qwen2.5's 1.5 KB granules: 90 KB a block, the stash what still fits)
    "poll-100": {"KOG_POLL_NS": "100"},
    "poll-300": {"KOG_POLL_NS": "300"},
    "lm-screen-0": {"KOG_LM_SCREEN": "0"},  # greedy decoding reads every bf16 row of the LM head / screens
    "lm-screen-1": {"KOG_LM_SCREEN": "1"},  # them in int8 first (the default by shape: KOG_LM_SCREEN -1)
    "lm8-never": {"KOG_LM_SCREEN": "1", "KOG_LM8_NEVER": "1"},  # the screened build streaming the bf16 head
    "u-2": {"KOG_U": "2"},
    "u-3": {"KOG_U": "3"},
    "u-4": {"KOG_U": "4"},
    "nthr-256": {"KOG_NTHR": "256"},  # the ring follows the block size (KOG_RING: 96 KB per block)
    "nthr-384": {"KOG_NTHR": "384"},
    "nthr-512": {"KOG_NTHR": "512"},
    "att-tbr-1": {"KOG_ATT_TBR": "1"},  # attention tiles per round (units per kv head follow)
    "att-tbr-2": {"KOG_ATT_TBR": "2"},
    "att-tbr-3": {"KOG_ATT_TBR": "3"},
    "att-tbr-4": {"KOG_ATT_TBR": "4"},
    "att-tbr-2-cm-5": {"KOG_ATT_TBR": "2", "KOG_CM": "5"},  # two tiles a round, no unit merges up to 5 units
    "att-split-1": {"KOG_ATT_SPLIT": "1"},  # a warp a (query head, tile) pair (v45); -2 / -4: a tile's rows over up to
    "att-split-2": {"KOG_ATT_SPLIT": "2"},  # 2 / 4 warps where pairs leave warps idle (the default splits by shape)
    "att-split-4": {"KOG_ATT_SPLIT": "4"},
    "qkv-skip-0": {"KOG_QKV_SKIP": "0"},  # every block takes QKV rows (the default but where G x D reaches 512)
    "qkv-skip-3": {"KOG_QKV_SKIP": "3"},  # blocks 0-2 (attention units at every position) take none
    "qkv-skip-8": {"KOG_QKV_SKIP": "8"},  # ... blocks 0-7 (Llama, Qwen3: every kv head's first unit)
    "qkv-skip-12": {"KOG_QKV_SKIP": "12"},  # ... blocks 0-11 (Qwen2.5's default: every head group's first unit)
    "att-rmax-0": {"KOG_ATT_RMAX": "0"},  # every attention unit takes all query heads of its kv head
    "att-rmax-1": {"KOG_ATT_RMAX": "1"},  # query heads split over blocks where units take one round of tiles
    "att-rmax-2": {"KOG_ATT_RMAX": "2"},  # ... at most two rounds
    "att-rmax-3": {"KOG_ATT_RMAX": "3"},  # ... at most three rounds
    "cm-0": {"KOG_CM": "0"},  # the attention units merge their records (no block merges them as it stages O's input)
    "cm-2": {"KOG_CM": "2"},  # every block merges the attention units' records where a kv head spans 2 units
    "cm-3": {"KOG_CM": "3"},  # ... 2-3 units
    "cm-5": {"KOG_CM": "5"},  # ... 2-5 units
    "rec-pad-0": {"KOG_REC_PAD": "0"},  # the attention records in global memory packed (D + 2 words) / padded to
    "rec-pad-1": {"KOG_REC_PAD": "1"},  # whole 128-byte lines (the default pads by shape: KOG_REC_PAD -1, 2 where O merges the units)
    "rec-pad-2": {"KOG_REC_PAD": "2"},  # ... or to 2 D words, a power of two: packed into the hop space's chunks by shifts
    "att-early-0": {"KOG_ATT_EARLY": "0"},  # the first K/V tiles issued at the attention's start
    "att-early-1": {"KOG_ATT_EARLY": "1"},  # ... before the QKV product, after its input's poll
    "att-early-2": {"KOG_ATT_EARLY": "2"},  # ... before the layer's input poll (the default where blocks stash)
    "att-early-3": {"KOG_ATT_EARLY": "3"},  # ... the next layer's after O's product (the default where none does)
    "att-early-4": {"KOG_ATT_EARLY": "4"},  # ... the next layer's after gate/up's product (no stash)
    "lane-sums-0": {"KOG_LANE_SUMS": "0"},  # every granule's sum by shuffles (no per-lane sums)
    "lane-sums-2": {"KOG_LANE_SUMS": "2"},  # per-lane sums only in products of up to 2 granules per warp (v24)
    "lane-sums-4": {"KOG_LANE_SUMS": "4"},  # ... of up to 4 (v25, the default)
    "lane-sums-12": {"KOG_LANE_SUMS": "12"},  # ... of up to 12 (down on every big shape)
    "stash-0": {"KOG_STASH": "0"},  # no gate/up granules stashed inside the attention's gap
    "stash-1": {"KOG_STASH": "1"},  # one per warp (24 KB a block of 2 KB granules)
    "stash-2": {"KOG_STASH": "2"},
    "stash-3": {"KOG_STASH": "3"},
    "stash-4": {"KOG_STASH": "4"},  # (with ring-3: 96 KB of stash beside a 72 KB ring)
    "stash-5": {"KOG_STASH": "5"},  # (Qwen2.5's default since v34: five 1.5 KB granules, 90 KB)
    "stash-6": {"KOG_STASH": "6"},
    "stash-7": {"KOG_STASH": "7"},
    "slot-4": {"KOG_SLOT_U": "4"},  # ring and stash slots of 2 KB whatever the granules (v33)
    "stash-pace-2": {"KOG_STASH_PACE": "2"},  # a paced stashing warp keeps two granules in flight
    "stash-pace-3": {"KOG_STASH_PACE": "3"},  # ... three
    "stash-att-0": {"KOG_STASH_ATT": "0"},  # blocks with attention work stash nothing (the default where G x D reaches 512)
    "stash-att-1": {"KOG_STASH_ATT": "1"},  # ... stash gate/up right after the attention
    "stash-att-2": {"KOG_STASH_ATT": "2"},  # ... after their O rows (the default but where G x D reaches 512)
    "stash-att-3": {"KOG_STASH_ATT": "3"},  # ... after their O rows, paced
    "stash-dn-0": {"KOG_STASH_DN": "0"},  # no down granules stashed
    "stash-dn-1": {"KOG_STASH_DN": "1"},  # down's granules stashed once gate/up is done, at once
    "stash-dn-2": {"KOG_STASH_DN": "2"},  # ... paced (the default)
    "stash-xs-0": {"KOG_STASH_XS": "0"},  # no extra gate/up granule in the input region's gaps
    "stash-xs-1": {"KOG_STASH_XS": "1"},  # ... one, where they fit (the default on some shapes)
    "dn-split-1": {"KOG_DN_SPLIT": "1"},  # down unsplit: every block gathers all of act (tagged)
    **{f"dn-split-{n}": {"KOG_DN_SPLIT": str(n)} for n in (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)},  # down's column slices
    # (with npos-n) SmolLM2's drafts' build as the host would make it with down in two slices of whole rows
    "dn-halves": {"KOG_DRAFTS_DN_HALVES": "1", "KOG_DN_LAYOUT": "1"},
    **{f"grid-{n}": {"KOG_NBLK": str(n)} for n in (33, 44, 66, 88, 100, 114, 120)},  # blocks (fewer than SMs)
    **{f"icache-{n}": {"KOG_ICACHE_KB": str(n)} for n in (4, 8, 16, 32, 64)},  # n KB more machine code a token
    **{f"icache-layer-{n}": {"KOG_ICACHE_LAYER_KB": str(n)} for n in (4, 8, 16, 32, 64)},  # ... a layer (no-attention blocks)
    "no-ring-stamps": {"KOG_TRACE_RING": "0"},  # (for --trace) the refills unstamped: what the stamps cost the products
    "release-clock": {"KOG_RELEASE_CLOCK": "1"},  # cycles a warp spends releasing held refills at each product's start
    "hop-copies-1": {"KOG_HOP_COPIES": "1"},  # the vectors that cross blocks in one copy, not one per L2 partition
    **{f"npos-{n}": {"KOG_NPOS": str(n)} for n in range(2, 9)},  # the drafts' build as the main one: n positions a pass
    **{f"draft-match-{n}": {"KOG_DRAFT_MIN_MATCH": str(n)} for n in (1, 3)},  # (with npos-n) a draft needs n tokens matched (default 2)
    "draft-never": {"KOG_DRAFT_MIN_MATCH": "5"},  # (with npos-n) no pass drafts: what a one-position pass of that build costs
    "draft-always": {"KOG_DRAFT_ALWAYS": "1"},  # (with npos-n) every pass drafts n - 1 tokens: what an n-position pass costs
    "one-position-math": {"KOG_EXP": "15"},  # (with npos-n+draft-always) the products' dot products of the first position
    # only (garbage tokens): what the other positions' math costs a pass
    "no-draft-code": {"KOG_EXP": "16"},  # (with npos-n) no draft search, no n-position code: what the build's layouts cost
    "no-draft-search": {"KOG_EXP": "17"},  # (with npos-n) no draft search, the n-position code built, never run
    "norms-one-position": {"KOG_EXP": "18"},  # (with npos-n+draft-always) the norms gather the first position's words
    # only (garbage tokens): what the other positions' words cost the norms' gathers
    "fma-products": {"KOG_MMA": "0"},  # (with npos-n) every product in FMAs (the default below H = 1,024)
    "mma-lm-head": {"KOG_MMA": "1"},  # (with npos-n) the LM head's bf16 rows on the tensor cores
    "mma-layers": {"KOG_MMA": "2"},  # (with npos-n) those, gate/up and down on the tensor cores
    "mma-one-mma": {"KOG_MMA_ONE_FMA": "0"},  # (with npos-n) a pass without a draft on the tensor cores too
    **{f"gather-pairs-{n}": {"KOG_GATHER_PAIRS": str(n)} for n in (3, 4)},  # (with npos-n) long gathers n pairs a thread at a time: fewer spills
    # (with npos-n) the long gathers put each pair into the products' input region as it lands, n pairs a run
    # (0: held in registers, GATHER_PAIRS a run)
    **{f"gather-to-xs-{n}": {"KOG_GATHER_TO_XS": str(n)} for n in (0, 8, 16)},
    "hop-far": {},  # (set on the host: HOST_CHANGES) every block polls the far partition's copy, the same machine code
    "weights-near": {"KOG_EXP": "12"},  # (and HOST_CHANGES) garbage weights from a buffer laid out by L2 partition,
    # each block streaming only its own partition's chunks: what a weight layout by partition would gain
    "weights-far": {"KOG_EXP": "12"},  # its controls: the same, each block streaming only the other partition's chunks,
    "weights-mixed": {"KOG_EXP": "12"},  # ... or the two partitions' in turn (as the weights' own layout does)
    "product-warps-10": {"KOG_PRODUCT_WARPS": "10"},  # (with layers-resident only) the layer products on 10 warps
    "hold-none": {"KOG_HOLD": "0"},
    "hold-qkv": {"KOG_HOLD": "1"},
    "hold-o": {"KOG_HOLD": "2"},
    "hold-qkv-o": {"KOG_HOLD": "3"},
    "hold-gu": {"KOG_HOLD": "4"},
    "hold-dn": {"KOG_HOLD": "8"},
    "hold": {"KOG_HOLD": "14"},
    "hold-all": {"KOG_HOLD": "15"},
    "hold-o-gu": {"KOG_HOLD": "6"},
    "hold-o-dn": {"KOG_HOLD": "10"},
    "hold-gu-dn": {"KOG_HOLD": "12"},
}
TRACE_STEP = 64  # kernels/decode.cu: the traced token (KOG_TRACE)
TRACE_EV = 1024  # kernels/decode.cu: TRACE_EV


# The events of one layer, in kernel order (greedy decoding), each named by what ends there.
LAYER_EVENTS = ("qkv ready", "qkv done", "attention done", "o ready", "o done", "gate/up ready", "gate/up done",
                "down ready", "down done")


def layer_event(layer: int, name: str) -> int:
    """The row of kog_trace where a layer passed an event: 'choose ready' comes first, then the
    layer's events, but for layer 0's 'qkv ready' (its input is the embedding row: 'choose
    ready' stands for it)."""
    return len(LAYER_EVENTS) * layer + LAYER_EVENTS.index(name)


def decode_rates(be, prompt, runs: int = 4) -> tuple[float, float, list[tuple[int, float]], float]:
    """Median decode rate after a warm-up run, the median p99 / p50 of the gaps between passes, the last run's
    slow steps (step, us: gaps over 1.15x the median) and the median us a pass through the model (a drafts'
    build's passes feed several tokens), all from the kernel's own stamps (host delivery left out)."""
    from engine.sampling import SamplingParams

    rates, tails, pass_us = [], [], []
    for _ in range(runs):
        be.truncate(0)
        be.prefill(prompt)
        list(be.decode(SamplingParams(), prompt, 256, set()))
        ts = be.token_times_ns.astype(np.float64) * 1e-9
        gaps = np.diff(ts)
        rates.append((len(ts) - 1) / (ts[-1] - ts[0]))
        pass_us.append((ts[-1] - ts[0]) * 1e6 / be.decode_passes)  # (the passes between the first token and the last)
        # a pass's kept drafts are stamped within ns of its first token: the tail is the passes' (where most passes
        # keep drafts, the median gap between tokens is such a stamp's, and p99 / p50 read thousands of times over)
        between = gaps > 0.05 * pass_us[-1] * 1e-6
        tails.append(np.percentile(gaps[between], 99) / np.percentile(gaps[between], 50))
    slow = [(int(i) + 1, float(gaps[i]) * 1e6) for i in np.flatnonzero(gaps > 1.15 * np.median(gaps[between]))]
    return float(np.median(rates[1:])), float(np.median(tails[1:])), slow, float(np.median(pass_us[1:]))


def release_clock(be, reset: bool = False) -> str:
    """KOG_RELEASE_CLOCK builds: per product, the mean cycles a warp spent in the held refills' release at its
    start and the refills a release issued, over the launches since the last reset."""
    import cupy as cp

    clk = cp.ndarray((3 * len(MV_NAMES),), cp.uint64, be.mod.get_global("kog_release_clk"))  # RCLK_WORDS
    if reset:
        clk.fill(0)
        return ""
    v = clk.get().astype(np.float64).reshape(-1, 3)  # (cycles, releases, refills) per product
    return "; ".join(f"{name} {c / max(n, 1):.0f} cycles a release ({h / max(n, 1):.2f} refills)"
                     for name, (c, n, h) in zip(MV_NAMES, v))


def trace(be, prompt, layers: int, traced: int) -> None:
    """Per-phase work and hops of token TRACE_STEP, averaged over the middle layers."""
    import cupy as cp

    from engine.sampling import SamplingParams

    be.truncate(0)
    be.prefill(prompt)
    list(be.decode(SamplingParams(), prompt, TRACE_STEP + 8, set()))
    ptr = be.mod.get_global("kog_trace")
    t = cp.ndarray((TRACE_EV, be.nblk), cp.uint64, ptr).get().astype(np.int64)
    # events: choose ready, then per layer its events (layer 0 without 'qkv ready'); then lm ready/done
    first = 1  # after the choose wait
    per_layer = []
    for layer in range(layers):
        n = len(LAYER_EVENTS) - (layer == 0)
        ev = t[first : first + n]
        if layer > 0:
            per_layer.append(ev)
        first += n
    mid = per_layer[len(per_layer) // 4 : 3 * len(per_layer) // 4] or per_layer
    clk = cp.ndarray((TRACE_EV,), cp.int64, be.mod.get_global("kog_trace_clk")).get()
    mhz = (clk[first + 1] - clk[0]) / (t[first + 1, 0] - t[0, 0]) * 1e3  # block 0's cycles over its ns
    print(f"  token {TRACE_STEP}: whole token {(t[first + 1].max() - t[0].max()) / 1e3:.1f} us "
          f"(lm head ready -> done {(t[first + 1].max() - t[first].max()) / 1e3:.1f} us; block 0's SM clock "
          f"{mhz:.0f} MHz); per middle layer (mean of {len(mid)}):")
    for a in range(len(LAYER_EVENTS) - 1):
        work = np.array([e[a + 1] - e[a] for e in mid]) / 1e3  # [layer, block]
        crit = np.array([e[a + 1].max() - e[a].max() for e in mid]) / 1e3
        print_stretch(f"{LAYER_EVENTS[a]} -> {LAYER_EVENTS[a + 1]}", work, crit)
        if LAYER_EVENTS[a].endswith("ready") and LAYER_EVENTS[a + 1].endswith("done"):  # a matrix phase
            slowest_blocks(work, np.array([e[a] - e[a].max() for e in mid]) / 1e3)
    work, crit = hop_into_next_layer(per_layer)
    print_stretch("down done -> qkv ready (next)", work, crit)
    layer = np.array([e[-1].max() - e[0].max() for e in mid]).mean() / 1e3
    print(f"    layer: {layer:.2f} us ('qkv ready' -> 'down done'; {layer + crit.mean():.2f} with the hop above)")
    layer0_done, last_done = t[layer_event(0, LAYER_EVENTS[-1])].max(), t[first - 1].max()
    layer0 = " ".join(f"{name} +{(t[layer_event(0, name)].max() - t[0].max()) / 1e3:.2f}" for name in LAYER_EVENTS[1:])
    print(f"    layer 0's phases, last block (us from 'choose ready'): {layer0}")
    print(f"    the token's stretches (last block): choose ready -> layer 0 done {(layer0_done - t[0].max()) / 1e3:.2f} us; "
          f"layers 1-{layers - 1} {(last_done - layer0_done) / 1e3:.1f} us; last down done -> lm head ready "
          f"{(t[first].max() - last_done) / 1e3:.2f} us")
    print("    each layer, 'qkv ready' -> 'down done' (us): " + " ".join(f"{(e[-1].max() - e[0].max()) / 1e3:.1f}" for e in per_layer))
    lm = (t[first + 1] - t[first]) / 1e3  # per block, ready -> done
    print(f"    {'lm head ready -> lm head done':32s} median block {np.median(lm):6.2f} us  slowest {lm.max():6.2f} us  "
          f"(the critical path above)")
    slowest_blocks(lm[None, :], (t[first] - t[first].max())[None, :] / 1e3)
    ev = LAYER_EVENTS.index  # per block, mean over the middle layers
    gu = np.array([e[ev("gate/up done")] - e[ev("gate/up ready")] for e in mid]).mean(axis=0) / 1e3
    dn = np.array([e[ev("down done")] - e[ev("down ready")] for e in mid]).mean(axis=0) / 1e3
    slow_multiprocessors(be, {"gate/up": gu, "down": dn, "lm head": lm})
    attention_units(be, t, traced)
    norm_steps(be, t, traced)
    product_steps(be, traced)
    ring_demand(be, t, traced)


def print_stretch(name: str, work, crit) -> None:
    """One line of the per-layer table: work [layer, block] and critical path [layer], us."""
    print(f"    {name:32s} median block {np.median(work):6.2f} us  slowest {work.max(axis=1).mean():6.2f} us  "
          f"critical path {crit.mean():6.2f} us")


def slow_multiprocessors(be, work: dict) -> None:
    """Whether a block's streaming speed is its multiprocessor's: the rank correlation of the
    blocks' work between the big products, and the multiprocessors (%smid) of each product's
    ten slowest blocks (compare them across runs: a block lands on another one each launch)."""
    import cupy as cp

    sm = cp.ndarray((be.nblk,), cp.uint32, be.mod.get_global("kog_trace_sm")).get()
    rank = {name: np.argsort(np.argsort(w)) for name, w in work.items()}
    names = list(work)
    pairs = [f"{a} ~ {b} {np.corrcoef(rank[a], rank[b])[0, 1]:+.2f}" for i, a in enumerate(names) for b in names[i + 1 :]]
    print("    per-block work, rank correlation: " + "; ".join(pairs))
    for name, w in work.items():
        print(f"    {name}: the ten slowest blocks' multiprocessors " + " ".join(str(sm[b]) for b in np.argsort(-w)[:10]))


def hop_into_next_layer(per_layer: list) -> tuple:
    """The hop from a layer's 'down done' to the next layer's 'qkv ready' (the layer-input norm),
    over the middle pairs of consecutive layers: per block [pair, block] and on the critical path
    (last 'down done' -> last 'qkv ready') per pair, us. per_layer: each layer's events in
    LAYER_EVENTS order, [event, block] ns."""
    pairs = list(itertools.pairwise(per_layer))
    mid = pairs[len(pairs) // 4 : 3 * len(pairs) // 4] or pairs
    work = np.array([nxt[0] - cur[-1] for cur, nxt in mid]) / 1e3
    crit = np.array([nxt[0].max() - cur[-1].max() for cur, nxt in mid]) / 1e3
    return work, crit


def slowest_blocks(work, ready) -> None:
    """Whether the blocks that end a matrix phase last are the same in every layer: the five
    slowest by mean work, how often each is among the ten slowest of a layer, and how long
    before the last block it started; then the blocks that started last (work and ready:
    [layer, block], us)."""
    mean = work.mean(axis=0)
    among = (np.argsort(np.argsort(-work, axis=1), axis=1) < 10).mean(axis=0)
    top = np.argsort(-mean)[:5]
    print("      slowest blocks (mean work, among the 10 slowest, start before the last): " + "; ".join(
        f"{b}: {mean[b]:.2f} us, {among[b]:.0%}, {-ready[:, b].mean():.2f} us" for b in top)
        + f"; all blocks: {np.median(mean):.2f} us, start {-np.median(ready):.2f} us")
    late = np.argsort(ready.mean(axis=0))[::-1][:8]
    print("      last to start (block: mean us before the last): " + "; ".join(f"{b}: {-ready[:, b].mean():.2f}" for b in late))


# kernels/decode.cu trace_att stamps, in the order they happen (the last round's, for 6 and 7)
ATT_STAMPS = ((0, "start"), (1, "inputs ready"), (2, "q/k/v prepared"), (6, "round: tiles in place"),
              (7, "round: math done"), (3, "tiles done"), (4, "records published"), (5, "end"))


def attention_units(be, t, layer: int) -> None:
    """The attention units of the traced layer, from the last block's 'qkv done' of that layer."""
    import cupy as cp

    ptr = be.mod.get_global("kog_trace_att")
    a = cp.ndarray((be.nblk, 8), cp.uint64, ptr).get().astype(np.int64)
    qkv_done = t[layer_event(layer, "qkv done")].max()
    units = a[a[:, 0] > 0]
    rel = (units - qkv_done) / 1e3
    print(f"  attention block-units of layer {layer}: {len(units)}; stamps after the last 'qkv done' (median / max us):")
    for k, name in ATT_STAMPS:
        col = rel[:, k][units[:, k] > 0]
        if col.size:
            print(f"    {name:20s} {np.median(col):7.2f} / {col.max():7.2f}")


# kernels/decode.cu trace_mv stamps per warp of each product of the traced layer
MV_STAMPS = ("refills released, inputs loaded", "first granule landed", "granules done", "block's sums in",
             "results stored", "last granule landed", "last granule's math done", "held refills issued")
MV_NAMES = ("qkv", "o", "gate/up", "down")


def product_steps(be, layer: int) -> None:
    """Inside each product of the traced layer: per warp, how long after entering mv_run it
    passed each step (median / max over blocks and warps, us)."""
    import cupy as cp

    nw = be.nthr // 32
    ptr = be.mod.get_global("kog_trace_mv")
    a = cp.ndarray((4, be.nblk, nw, len(MV_STAMPS) + 1), cp.uint64, ptr).get().astype(np.int64)
    print(f"  inside the products of layer {layer}, per warp after entering the product (median / max us):")
    for m, name in enumerate(MV_NAMES):
        rel = (a[m, :, :, 1:] - a[m, :, :, :1]) / 1e3
        cells = []
        for k, step in enumerate(MV_STAMPS):
            col = rel[:, :, k][a[m, :, :, k + 1] > 0]
            cells.append(f"{step} {np.median(col):.2f} / {col.max():.2f}" if col.size else f"{step} -")
        print(f"    {name:8s} " + "; ".join(cells))


# kernels/decode_sync.cuh trace_norm stamps per warp of the traced layer's two RMSNorms
NORM_STAMPS = ("entered", "warp's words in", "block's words in", "sum of squares done", "staged")
NORM_NAMES = (("layer input", "down done", -1), ("gate/up input", "o done", 0))  # what each norm follows, in which layer


def norm_steps(be, t, layer: int) -> None:
    """Inside the traced layer's two norms (the hops into QKV and into gate/up): per warp, when it
    passed each step, after the last block's producing phase ended (median / max over blocks and
    warps, us)."""
    import cupy as cp

    nw = be.nthr // 32
    a = cp.ndarray((2, be.nblk, nw, len(NORM_STAMPS)), cp.uint64, be.mod.get_global("kog_trace_norm")).get().astype(np.int64)
    print(f"  inside the norms of layer {layer}, per warp after the producers' last block (median / max us):")
    for m, (name, after, shift) in enumerate(NORM_NAMES):
        if layer + shift < 0:
            continue
        rel = (a[m] - t[layer_event(layer + shift, after)].max()) / 1e3
        cells = [f"{step} {np.median(rel[:, :, k]):.2f} / {rel[:, :, k].max():.2f}" for k, step in enumerate(NORM_STAMPS)]
        print(f"    {name} (after '{after}'): " + "; ".join(cells))


TRACE_RING = 256  # kernels/decode_sync.cuh: refills recorded per warp
RING_BIN_US = 0.5


def ring_demand(be, t, layer: int) -> None:
    """The refills every warp issued while the traced layer ran (kog_trace_ring: issue times,
    kog_trace_ring_n: the warp's 16-byte pieces), as TB/s per RING_BIN_US. Each block records from
    its own start of the layer to its own end of it, so only the window in which every block
    records is shown: from the layer's last 'qkv ready' to its first 'down done'. Beside it, when
    each phase's last block passed. Where demand stops, HBM idles once the ring's granules in
    flight have landed."""
    import cupy as cp

    n = be.nblk * (be.nthr // 32) * TRACE_RING
    stamps = cp.ndarray((n,), cp.uint64, be.mod.get_global("kog_trace_ring")).get().astype(np.int64)
    pieces = cp.ndarray((n,), cp.uint16, be.mod.get_global("kog_trace_ring_n")).get().astype(np.int64)
    if not stamps.any():
        print("  refills not stamped (KOG_TRACE_RING=0)")
        return
    first = layer_event(layer, "qkv ready")
    t0, t1 = t[first].max(), t[layer_event(layer, "down done")].min()  # every block records between these
    if t1 <= t0:
        return
    keep = (stamps >= t0) & (stamps < t1)
    when = (stamps[keep] - t0) / 1e3  # us
    nbytes = (pieces[keep] & 0xFF) * 16
    edges = np.arange(0.0, (t1 - t0) / 1e3 + 1e-9, RING_BIN_US)
    per_bin, _ = np.histogram(when, bins=edges, weights=nbytes)
    rates = per_bin / (RING_BIN_US * 1e-6) / 1e12
    print(f"  refills issued in layer {layer} while every block ran it ({(t1 - t0) / 1e3:.1f} us): "
          f"{nbytes.sum() / 1e6:.1f} MB; TB/s per {RING_BIN_US} us from its last 'qkv ready':")
    print("    " + " ".join(f"{e:+.1f}:{r:.1f}" for e, r in zip(edges[:-1], rates)))
    phases = " ".join(f"{name} {(t[first + k].max() - t0) / 1e3:+.2f}" for k, name in enumerate(LAYER_EVENTS))
    print(f"    its phases, last block (us): {phases}")
    recorded = stamps > 0  # every refill of the layer, each block's whole stretch of it
    which = pieces[recorded] >> 8
    issued = (stamps[recorded] - t0) / 1e3
    cells = []
    for code in sorted(set(which.tolist())):
        mat, ahead = code & 7, code >> 3
        at = issued[which == code]
        name = f"{MV_NAMES[mat] if mat < len(MV_NAMES) else 'lm head'}{' (next layer)' if ahead else ''}"
        cells.append(f"{name} {np.percentile(at, 5):+.2f} / {np.median(at):+.2f} / {np.percentile(at, 95):+.2f}")
    print("    refills issued per matrix, us from the last 'qkv ready' (5th percentile / median / 95th): " + "; ".join(cells))


def poll_far_copy(be) -> None:
    """Every block polls the hop space's copy on the other L2 partition (the control of the near copies)."""
    if not be.hop.sided:
        raise SystemExit("hop-far: this GPU's hop space is not laid out by partition")
    be.hop.sm_side[:] = 1 - be.hop.sm_side


def side_formula(sides: np.ndarray, base: int) -> tuple[int, int, str]:
    """The (mask, flip) with parity(pair address & mask) ^ flip = the partition of each 8 KB pair's first chunk
    (sides: every chunk's, -1 unclear; base: the first chunk's address, 8 KB aligned): a mask of bits 13-20 with
    one bit a 2 MB page, then the pages' bits fitted as the parity of the page address's bits that vary here."""
    a, b = sides[0::2], sides[1::2]
    first = np.where(a >= 0, a, np.where(b >= 0, 1 - b, -1))
    addr = base + (np.arange(len(first), dtype=np.int64) << 13)
    clear = first >= 0
    low, page, bit = (addr >> 13 & 255)[clear], (addr >> 21)[clear], first[clear]
    from bench.side_stream_probe import best_page_mask, parity_table

    _, low_mask, page_bit = best_page_mask(bit, low, page, 8)
    pages = np.unique(page)
    parity = parity_table(14)
    varying = np.bitwise_or.reduce(pages ^ pages[0])
    bits = [b for b in range(40) if varying >> b & 1][:14]  # the page address bits that vary over the buffer
    packed = sum(((pages >> b & 1) << i) for i, b in enumerate(bits))  # those bits, side by side
    fits = [(np.sum(page_bit == parity[packed & m] ^ k), m, k) for m in range(1 << len(bits)) for k in (0, 1)]
    agree_pages, packed_mask, flip = max(fits)
    high_mask = sum(1 << b for i, b in enumerate(bits) if packed_mask >> i & 1)
    mask = low_mask << 13 | high_mask << 21
    explained = np.mean((parity_of(addr[clear], mask) ^ flip) == bit)
    return mask, flip, (f"pairs' partitions = parity(address & {mask:#x}) ^ {flip}: explains {explained * 100:.2f}% of "
                        f"{clear.sum()} clear pairs, {agree_pages} of {len(pages)} pages")


def parity_of(values: np.ndarray, mask: int) -> np.ndarray:
    """parity(value & mask) of each value (addresses: any width up to 63 bits)."""
    v = (values & mask).astype(np.uint64)
    out = np.zeros(len(v), dtype=np.int64)
    while v.any():
        out ^= (v & np.uint64(1)).astype(np.int64)
        v >>= np.uint64(1)
    return out


def weights_by_side(be, far: bool = False, mixed: bool = False) -> None:
    """KOG_EXP 12's globals (kernels: side_granule): a buffer of 8 KB pairs of chunks, holding random finite bf16
    weights, whose partitions are mapped by timing and fitted to a formula of the address the kernel computes, and
    each multiprocessor's role: the block pair whose region its block streams, a pair's two on the two partitions
    (role parity: its partition)."""
    import cupy as cp

    from bench.side_stream_probe import chunk_sides
    from engine.backends.l2_sides import _chunk_aligned_zeros, round_trip_kernel, round_trips

    if not be.hop.sided:
        raise SystemExit("weights-near: this GPU shows no two L2 partitions")
    rt = round_trip_kernel(be.l2mod)
    sm_side = be.hop.sm_side.get()
    nbytes = int(cp.ndarray((1,), cp.int64, be.mod.get_global("kog_side_bytes")).get()[0])  # the regions (source_of)
    buf = _chunk_aligned_zeros(cp, (nbytes + 8191) // 8192 * 2, align=64)
    sides = chunk_sides(cp, rt, buf, sm_side, be.nsm)
    mask, flip, fit = side_formula(sides, buf.data.ptr)
    if mixed:  # a bit outside the fitted mask: a block reads its own partition's chunk of every other 16 KB
        mask ^= next(1 << b for b in range(13, 21) if not mask >> b & 1)
    flip ^= far
    # the share of the chunks the blocks read that lie on their own partition (of the clear ones)
    pair_addr = buf.data.ptr + (np.arange(len(sides) // 2, dtype=np.int64) << 13)
    first = parity_of(pair_addr, mask) ^ flip
    read = [sides[2 * np.arange(len(first)) + (first ^ s)] for s in (0, 1)]
    near = sum(np.sum(r == s) for s, r in enumerate(read)) / sum(np.sum(r >= 0) for r in read)
    cp.ElementwiseKernel("", "uint64 y", "unsigned long long h = (i + 1) * 0x9E3779B97F4A7C15ull; h ^= h >> 29;"
                         "y = (h & 0x80FF80FF80FF80FFull) | 0x3C003C003C003C00ull;", "kog_bf16_noise")(buf)  # +-2^-7..2^-5
    sms = np.unique(round_trips(cp, rt, buf, np.zeros((be.nsm, 1), dtype=np.int32), be.nsm)[1].astype(np.int64))
    by_side = [sms[sm_side[sms % 256] == s] for s in (0, 1)]
    if len(by_side[0]) != len(by_side[1]) or len(sms) != be.nblk:
        raise SystemExit(f"weights-near: {len(by_side[0])} / {len(by_side[1])} multiprocessors by partition")
    role = np.zeros(256, dtype=np.uint8)
    for s in (0, 1):
        role[by_side[s] % 256] = 2 * np.arange(len(by_side[s])) + s
    print(f"weights-near: {nbytes / 1e9:.2f} GB, unclear chunks {np.mean(sides < 0) * 100:.1f}%; {fit}; "
          f"chunks read on the block's own partition {near * 100:.1f}%")
    be.side_buffers = (buf,)  # (kept alive with the backend)
    cp.ndarray((1,), cp.uint64, be.mod.get_global("kog_side_w"))[0] = buf.data.ptr
    cp.ndarray((1,), cp.uint64, be.mod.get_global("kog_side_mask"))[0] = mask
    cp.ndarray((1,), cp.uint32, be.mod.get_global("kog_side_flip"))[0] = flip
    cp.ndarray((256,), cp.uint8, be.mod.get_global("kog_block_role"))[:] = cp.asarray(role)


HOST_CHANGES = {"hop-far": poll_far_copy, "weights-near": weights_by_side,
                "weights-far": lambda be: weights_by_side(be, far=True),
                "weights-mixed": lambda be: weights_by_side(be, mixed=True)}  # variants made on the built backend


def parse_versions(specs: list[str]) -> dict[str, Path]:
    """--version NAME=DIR (and --baseline DIR, the version named 'baseline') -> {name: dir}."""
    versions = {}
    for spec in specs:
        name, _, folder = spec.rpartition("=")
        name = name or "baseline"
        if name in VARIANTS or "+" in name or "," in name:
            raise ValueError(f"version name {name!r} is taken by a variant or has '+' or ','")
        if not (Path(folder) / "decode.cu").is_file():
            raise ValueError(f"version {name!r}: {folder} has no decode.cu")
        versions[name] = Path(folder).resolve()
    return versions


def build(lm, label: str, versions: dict[str, Path], context: int, traced_layer: int | None = None):
    """The backend of a label: 'a+b' combines variants a and b, and at most one part names a
    version (another kernels/ folder) instead of the current one."""
    from engine.backends.cuda import CudaBackend

    parts = label.split("+")
    folders = [versions[p] for p in parts if p in versions]
    defines = {}
    for part in parts:
        if part not in versions:
            defines.update(VARIANTS[part])
    if traced_layer is not None:
        defines["KOG_TRACE"] = str(TRACE_STEP)
        defines["KOG_TRACE_LAYER"] = str(traced_layer)
    be = CudaBackend(lm, context + 512, defines=defines, kernel_dir=folders[0] if folders else None)
    for part in parts:
        if part in HOST_CHANGES:
            HOST_CHANGES[part](be)
    return be


def check_label(label: str, versions: dict[str, Path]) -> str | None:
    """What is wrong with a label, or None."""
    parts = label.split("+")
    unknown = [p for p in parts if p not in VARIANTS and p not in versions]
    if unknown:
        return f"unknown variant or version {unknown[0]!r} (variants: {', '.join(VARIANTS)})"
    if sum(p in versions for p in parts) > 1:
        return f"{label!r} names two versions"
    seen: dict[str, str] = {}
    for p in parts:
        for macro, value in VARIANTS.get(p, {}).items():
            if seen.setdefault(macro, value) != value:  # the later part would silently win
                return f"{label!r} sets {macro} twice (variants of one knob do not combine)"
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="which variants to time ('' for the trace only)")
    ap.add_argument("--context", type=int, default=32, help="prompt tokens before the 256 decoded ones")
    ap.add_argument("--trace", default="full", help="the variant whose token is traced ('none': no trace)")
    ap.add_argument("--trace-layer", type=int, default=None,
                    help="the layer whose attention units, products and refills are traced (default: the middle one)")
    ap.add_argument("--version", action="append", default=[], metavar="NAME=DIR",
                    help="another version of kernels/, timed as variant NAME (repeatable)")
    ap.add_argument("--baseline", action="append", default=[], metavar="DIR", help="the same as --version baseline=DIR")
    args = ap.parse_args()
    try:
        versions = parse_versions(args.version + [f"baseline={d}" for d in args.baseline])
    except ValueError as e:
        ap.error(str(e))
    labels = list(filter(None, args.variants.split(",")))
    for label in labels + ([args.trace] if args.trace != "none" else []):
        if problem := check_label(label, versions):
            ap.error(problem)
    for name in args.models.split(","):
        lm = gpu_timing_model(name)
        prompt = random_prompt(lm.config.vocab_size, args.context, np.random.default_rng(7))
        line = []
        if args.trace != "none":
            layers = lm.config.num_layers
            traced = layers // 2 if args.trace_layer is None else args.trace_layer
            if not 0 <= traced < layers - 1:  # (the last layer's refill stamps would run on into the LM head)
                ap.error(f"--trace-layer {traced}: {name} can trace layers 0-{layers - 2}")
            be = build(lm, args.trace, versions, args.context, traced_layer=traced)
            r, _, _, _ = decode_rates(be, prompt)
            line.append(f"traced build ({args.trace}) {r:.0f} tok/s ({1e6 / r:.0f} us/token)")
            trace(be, prompt, layers, traced)
            be.close()
        for label in labels:
            be = build(lm, label, versions, args.context)
            clocked = "release-clock" in label.split("+")
            if clocked:
                release_clock(be, reset=True)
            r, tail, slow, pass_us = decode_rates(be, prompt)
            k = be.k_decode  # the device's own build (its NVRTC may allocate registers unlike a local nvcc)
            passes = f", {pass_us:.0f} us a pass" if be.kernel_info["positions"] > 1 else ""  # (npos-n: the main build drafts)
            line.append(f"{label} {r:.0f} tok/s ({1e6 / r:.0f} us/token{passes}, kernel p99 {tail - 1:+.0%} over p50; "
                        f"{k.num_regs} registers, {k.local_size_bytes} B local a thread)"
                        + (f"; release at the products' start: {release_clock(be)}" if clocked else ""))
            if slow:  # where a shape's tail comes from: which steps (the context is the prompt's length + step)
                print(f"  {name}: {label}: last run's slow steps (us): "
                      + ", ".join(f"{step} ({us:.0f})" for step, us in slow[:24]), flush=True)
            be.close()
            print(f"  {name}: {line[-1]}", flush=True)
        print(f"{name}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
