"""Greedy tokens of kernel variants against the tree's default build, on a random-init model at a
real shape: a timing knob must not change a single token (exit status 1 where one does). With
--sampled, sampled tokens too (temperature, top-p, a fixed seed: the logits are the same sums in the
same order, so the in-kernel sampler must draw the same tokens).

Each prompt length is a fresh random prompt; every build decodes 256 tokens after it, so a prompt of
160 tokens runs positions 160-415 (where the attention's units per kv head change with the position,
both of its merges are covered). Variants and their `+` combinations are bench/decode_breakdown.py's.

    python bench/variant_tokens.py --model llama-3.2-1b --variants cm-2,rec-pad-1 [--contexts 32,160]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_breakdown import build, check_label
from bench.random_models import gpu_timing_model, random_prompt

TOKENS = 256


def decoded_tokens(lm, label: str, prompt: list[int], modes: dict) -> dict[str, list[int]]:
    """One build's tokens after the prompt, for each mode's sampling parameters."""
    be = build(lm, label, {}, len(prompt))
    try:
        out = {}
        for mode, params in modes.items():
            be.truncate(0)
            be.prefill(prompt)
            out[mode] = [int(t) for t in be.decode(params, prompt, TOKENS, set())]
        return out
    finally:
        be.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--variants", required=True, help="comma-separated variants, each against the default build")
    ap.add_argument("--contexts", default="32,160", help="prompt lengths, comma-separated")
    ap.add_argument("--sampled", action="store_true", help="sampled tokens as well as greedy ones")
    args = ap.parse_args()
    labels = [v for v in args.variants.split(",") if v]
    for label in labels:
        if problem := check_label(label, {}):
            ap.error(problem)
    from engine.sampling import SamplingParams

    modes = {"greedy": SamplingParams()}
    if args.sampled:
        modes["sampled"] = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    lm = gpu_timing_model(args.model)
    same = True
    for ctx in (int(c) for c in args.contexts.split(",")):
        prompt = random_prompt(lm.config.vocab_size, ctx, np.random.default_rng(11 + ctx))
        reference = decoded_tokens(lm, "full", prompt, modes)
        for label in labels:
            decoded = decoded_tokens(lm, label, prompt, modes)
            for mode, tokens in decoded.items():
                first = next((i for i, (a, b) in enumerate(zip(tokens, reference[mode])) if a != b), None)
                if first is None and len(tokens) != len(reference[mode]):
                    first = min(len(tokens), len(reference[mode]))
                same &= first is None
                verdict = "identical" if first is None else f"DIFFERENT from token {first}"
                print(f"{args.model}, {ctx}-token prompt, {mode}, {label}: {verdict} ({len(tokens)} tokens)", flush=True)
    print(f"{args.model}: {'all identical' if same else 'TOKENS DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
