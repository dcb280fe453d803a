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
decode (rates, launches), the switches' dead time (median, 90th percentile) in us and in plain tokens.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.lookup_acceptance import decode_rate
from bench.random_models import build_hf, loaded_model, random_prompt
from engine import drafts
from engine.backends.cuda import CudaBackend
from engine.sampling import SamplingParams


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
        backend.close()


if __name__ == "__main__":
    main()
