"""What a switch between the decode kernel's two builds costs (timing only; random-init models at real shapes).

A drafted decode switches between the plain build and the drafts' build mid-reply (engine/drafts.py): the host
cancels the running kernel, which stops after the pass it is in, and queues the other build behind it, with the
hand-over kernel between them (kernels/hand_over.cu); the second launch's first step picks the first's last token
again and stamps it. The dead time of a switch (the backend's switch_gaps_ns) is that stamp's time less the
stopped launch's last token's: what the decode would not spend without the switch (the kernel's exit, the
buffer fills and hand-over queued behind it, the new kernel's start and its first step). Here a rule that switches after every token or pass (COPY_MATCH = DRY_PASSES = 0) makes dozens of switches
a reply; the tokens must still be the plain decode's.

    python3 bench/switch_probe.py [--models smollm2-135m,llama-3.2-1b] [--positions 5] [--tokens 256] [--runs 3]

Per model: the plain decode's rate and median token gap, the drafts' build throughout and the eager switching
decode (rates, launches), the switches' dead time (median, 90th percentile) in us and in plain tokens; then the
same switching decode with clock stamps queued among its launches, and its switches split into pieces (SeamStamps).
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.lookup_acceptance import decode_rate
from bench.random_models import build_hf, loaded_model, random_prompt
from engine import drafts
from engine.backends.cuda import KERNEL_DIR, CudaBackend
from engine.sampling import SamplingParams

_STAMP_SRC = r"""
#include "portability.cuh"
extern "C" __global__ void kog_probe_stamp(kog_u64* at) { *at = kog_clock_ns(); }
"""
PIECES = ("tail", "fills", "params", "hand-over", "head")


class SeamStamps:
    """Splits each switch's dead time (bench only): tiny kernels that stamp the GPU's clock are queued among the
    launches' own work, and the launches' first and last token stamps are kept. Between the stopped launch's last
    token and the next launch's repeated first one: `tail` (the stopped kernel's exit), `fills` (its successor's
    two buffer fills), `params` (the parameter block's copy), `hand-over` (the hand-over kernel) and `head` (the
    new kernel's start and its first step). Each piece also holds one stamp kernel's own few us."""

    def __init__(self, backend: CudaBackend, positions: int) -> None:
        self.backend = backend
        self.kernel = backend.cp.RawKernel(_STAMP_SRC, "kog_probe_stamp",
                                           options=("-std=c++17", f"--include-path={KERNEL_DIR}"))
        self.at = backend.cp.zeros(4096, dtype=backend.cp.uint64)
        self.stamps: list[str] = []  # in stream order: B, C before and after a parameter copy; D, A a launch
        self.tokens: list[tuple[int, int]] = []  # each launch's first and last token stamps
        fill, finish = backend._fill_params, backend._finish

        def stamped_fill(*args, **kwargs):
            self._stamp("B")
            fill(*args, **kwargs)
            self._stamp("C")

        def kept_finish(run):
            st = finish(run)
            n = int(st[1])
            if n and not st[0]:
                times = run.slot.tok_time[:n].get(stream=backend._reader)
                self.tokens.append((int(times[0]), int(times[-1])))
            return st

        backend._fill_params, backend._finish = stamped_fill, kept_finish
        backend.draft_positions = positions
        for kernel in (backend._main, backend._drafts_kernel()):
            kernel.function = self._stamped_launch(kernel.function)

    def _stamp(self, what: str) -> None:
        self.kernel((1,), (1,), (self.at[len(self.stamps) :],), stream=self.backend.stream)
        self.stamps.append(what)

    def _stamped_launch(self, function):
        def launch(*args, **kwargs):
            self._stamp("D")
            function(*args, **kwargs)
            self._stamp("A")

        return launch

    def reset(self) -> None:
        self.stamps, self.tokens = [], []

    def pieces(self) -> dict[str, list[float]]:
        """The last decode's switches, each split into PIECES (us)."""
        at = self.at[: len(self.stamps)].get().astype(np.int64)
        launches = [at[i : i + 4] for i in range(0, len(self.stamps), 4)]  # each launch's B, C, D, A
        assert self.stamps == ["B", "C", "D", "A"] * len(launches)
        out: dict[str, list[float]] = {p: [] for p in PIECES}
        for k in range(len(self.tokens) - 1):
            (_, last), (first, _) = self.tokens[k], self.tokens[k + 1]
            a = launches[k][3]
            b, c, d, _ = launches[k + 1]
            for piece, ns in zip(PIECES, (a - last, b - a, c - b, d - c, first - d)):
                out[piece].append(ns * 1e-3)
        return out


def decode(backend: CudaBackend, positions: int, switching: bool, prompt: list[int], tokens: int) -> list[int]:
    """The tokens of one greedy decode from a fresh prefill."""
    backend.draft_positions, backend.switch_builds = positions, switching
    backend.truncate(0)
    backend.prefill(prompt)
    out = list(backend.decode(SamplingParams(), prompt, tokens, set()))
    backend.draft_positions, backend.switch_builds = 1, False
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    parser.add_argument("--positions", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    drafts.COPY_MATCH = drafts.DRY_PASSES = 0  # switch after every token of the plain build, every pass of the other
    for name in args.models.split(","):
        lm = loaded_model(build_hf(name, 1, device="cuda"), name)
        backend = CudaBackend(lm, 1024, draft_positions=args.positions)
        rng = np.random.default_rng(1)
        half = random_prompt(lm.config.vocab_size, 16, rng)
        prompt = half + half  # (a prompt that repeats itself: some passes draft)
        for positions, switching in ((1, False), (args.positions, False), (args.positions, True)):  # warm-up
            decode(backend, positions, switching, prompt, 16)
        dead = []
        rates = {"plain": [], "throughout": [], "switching": []}
        gaps, launches = [], []
        for _ in range(args.runs):
            ref = decode(backend, 1, False, prompt, args.tokens)
            rates["plain"].append(decode_rate(backend))
            gaps.extend(np.diff(backend.token_times_ns.astype(np.float64)) * 1e-9)
            toks = decode(backend, args.positions, False, prompt, args.tokens)
            rates["throughout"].append(decode_rate(backend))
            assert toks == ref, f"{name}: the drafts' build's tokens differ from the plain decode's"
            toks = decode(backend, args.positions, True, prompt, args.tokens)
            rates["switching"].append(decode_rate(backend))
            launches.append(backend.last_status["launches"])
            dead.extend(backend.switch_gaps_ns)
            assert toks == ref, f"{name}: the switching decode's tokens differ from the plain decode's"
        plain, gap = float(np.median(rates["plain"])), float(np.median(gaps))
        dead_us = np.asarray(dead) * 1e-3
        print(f"{name}: plain {plain:.1f} tok/s (median gap {gap * 1e6:.1f} us); drafts' build throughout "
              f"{np.median(rates['throughout']):.1f} tok/s; switching after every token or pass "
              f"{np.median(rates['switching']):.1f} tok/s, {int(np.median(launches))} launches; a switch's dead time "
              f"median {np.median(dead_us):.1f} us ({np.median(dead_us) / (gap * 1e6):.2f} plain tokens), "
              f"p90 {np.percentile(dead_us, 90):.1f} us, over {len(dead_us)} switches")
        stamps = SeamStamps(backend, args.positions)  # (last: its stamps stay in the launches' way)
        split: dict[str, list[float]] = {piece: [] for piece in PIECES}
        for _ in range(args.runs):
            stamps.reset()
            toks = decode(backend, args.positions, True, prompt, args.tokens)
            assert toks == ref, f"{name}: the stamped switching decode's tokens differ from the plain decode's"
            for piece, us in stamps.pieces().items():
                split[piece].extend(us)
        total = np.sum([split[piece] for piece in PIECES], axis=0)
        print(f"  a switch, split (median us over {len(total)}; {np.median(total):.1f} in all with the stamps): "
              + ", ".join(f"{piece} {np.median(split[piece]):.1f}" for piece in PIECES))
        backend.close()


if __name__ == "__main__":
    main()
