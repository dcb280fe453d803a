"""What a switch between the decode kernel's two builds costs (timing only; random-init models at real shapes).

A drafted decode switches between the plain build and the drafts' build mid-reply (engine/drafts.py): the host
cancels the running kernel, which stops after the pass it is in, and launches the other build from the token it
stopped at; that launch's first step picks the token again and stamps it. The dead time of a switch is that
stamp's time less the stopped launch's last token's: what the decode would not spend without the switch (the
kernel's exit, the host's synchronize, status read, buffer fills and launch, the new kernel's start and its first
step). Here a rule that switches after every token or pass (COPY_MATCH = DRY_PASSES = 0) makes dozens of switches
a reply; the tokens must still be the plain decode's.

    python3 bench/switch_probe.py [--models smollm2-135m,llama-3.2-1b] [--positions 5] [--tokens 256] [--runs 3]

Per model: the plain decode's rate and median token gap, the drafts' build throughout and the eager switching
decode (rates, launches), the switches' dead time (median, 90th percentile) in us and in plain tokens, and the
host's part of it (record_switches).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.lookup_acceptance import decode_rate
from bench.random_models import build_hf, loaded_model, random_prompt
from engine import drafts
from engine.backends import cuda as cuda_backend
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


def record_switches(backend: CudaBackend) -> tuple[list[float], list[float]]:
    """Wrap the backend's launches so that each relaunch appends to the two lists returned its switch's dead time
    (seconds: its first step's stamp, the token again, less the last launch's last token's) and the host's part of
    it (perf_counter: from the host's seeing that the last launch ended to the return of the call that started
    this one: its status and stamps read, the relaunch's fills, parameter block and launch). The rest is the
    kernel's exit after its last token, the host's notice of it, and the new kernel's start up to its first step."""
    dead: list[float] = []
    host: list[float] = []
    ended = [0.0]  # when the host last saw a launch end
    launch, follow = backend._launch, cuda_backend.follow

    def followed(*args, **kwargs):
        yield from follow(*args, **kwargs)
        ended[0] = time.perf_counter()

    def recorded(kernel, *args, **kwargs):
        before = backend.token_times_ns[-1] if len(backend.token_times_ns) else None
        function = kernel.function

        def started(*call, **options):
            function(*call, **options)
            if kwargs.get("repeat") is not None:
                host.append(time.perf_counter() - ended[0])

        kernel.function = started
        try:
            yield from launch(kernel, *args, **kwargs)
        finally:
            kernel.function = function
        if kwargs.get("repeat") is not None and before is not None:
            again = int(backend.tok_time[:1].get()[0])
            dead.append((again - int(before)) * 1e-9)

    backend._launch = recorded
    cuda_backend.follow = followed
    return dead, host


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
        dead, host = record_switches(backend)
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
            assert toks == ref, f"{name}: the switching decode's tokens differ from the plain decode's"
        plain, gap = float(np.median(rates["plain"])), float(np.median(gaps))
        dead_us, host_us = np.asarray(dead) * 1e6, np.asarray(host) * 1e6
        print(f"{name}: plain {plain:.1f} tok/s (median gap {gap * 1e6:.1f} us); drafts' build throughout "
              f"{np.median(rates['throughout']):.1f} tok/s; switching after every token or pass "
              f"{np.median(rates['switching']):.1f} tok/s, {int(np.median(launches))} launches; a switch's dead time "
              f"median {np.median(dead_us):.1f} us ({np.median(dead_us) / (gap * 1e6):.2f} plain tokens), "
              f"p90 {np.percentile(dead_us, 90):.1f} us, over {len(dead_us)} switches; the host's part median "
              f"{np.median(host_us):.1f} us, p90 {np.percentile(host_us, 90):.1f} us")
        backend.close()


if __name__ == "__main__":
    main()
