"""What a drafted pass costs against a plain one (timing only; random-init models at real shapes).

The drafts' build of the decode kernel (engine/backends/cuda.py draft_positions) feeds each pass the chosen
token and up to N - 1 draft tokens copied from the context. Random weights say nothing of how many drafts a
real model keeps (bench/lookup_acceptance.py measures that on real weights), but they do time a pass: the
decode's rate over its passes against the plain decode's rate over its tokens, in one process, alternated.

    python3 bench/drafts_probe.py [--models smollm2-135m,llama-3.2-1b] [--positions 5] [--tokens 256] [--runs 3]

Per model: plain tok/s; drafted tok/s, passes, and a pass's time against a plain token's (the pass cost).
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.lookup_acceptance import decode_rate
from bench.random_models import build_hf, loaded_model, random_prompt
from engine.backends.cuda import CudaBackend
from engine.sampling import SamplingParams


def timed(backend: CudaBackend, positions: int, prompt: list[int], tokens: int) -> tuple[list[int], float, int]:
    """(tokens, in-kernel tok/s, passes) of one greedy decode from a fresh prefill."""
    backend.draft_positions = positions
    backend.truncate(0)
    backend.prefill(prompt)
    out = list(backend.decode(SamplingParams(), prompt, tokens, set()))
    backend.draft_positions = 1
    return out, decode_rate(backend), backend.last_status["passes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    parser.add_argument("--positions", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for name in args.models.split(","):
        lm = loaded_model(build_hf(name, 1, device="cuda"), name)
        backend = CudaBackend(lm, 1024, draft_positions=args.positions)
        backend.switch_builds = False  # the drafts' build's own passes, every one of them
        if backend.pass_positions != args.positions:
            raise SystemExit(f"{name}: {args.positions} positions a pass do not fit this GPU's shared memory "
                             f"({backend.pass_positions} do)")
        prompt = random_prompt(lm.config.vocab_size, 32, np.random.default_rng(1))
        timed(backend, args.positions, prompt, 16)  # the drafts' build, and a warm-up of both
        timed(backend, 1, prompt, 16)
        plain, drafted = [], []
        for _ in range(args.runs):
            ref, rate, _ = timed(backend, 1, prompt, args.tokens)
            plain.append(rate)
            toks, rate, passes = timed(backend, args.positions, prompt, args.tokens)
            drafted.append((rate, passes))
            assert toks == ref, f"{name}: the drafted decode's tokens differ from the plain decode's"
        p = float(np.median(plain))
        d, passes = sorted(drafted)[len(drafted) // 2]
        # a pass's time over a plain token's: (tokens / drafted rate / passes) / (1 / plain rate)
        cost = (len(ref) - 1) / d / max(passes, 1) * p
        print(f"{name}: plain {p:.1f} tok/s; {args.positions} positions a pass {d:.1f} tok/s ({d / p:.2f}x), "
              f"{passes} passes for {len(ref)} tokens ({(len(ref) - 1) / max(passes, 1):.2f} a pass); "
              f"a pass costs {cost:.2f}x a plain token")
        backend.close()


if __name__ == "__main__":
    main()
