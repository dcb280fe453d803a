"""Where a decoded token's time goes: the monokernel timed with stages left out (timing only,
the tokens are garbage). KOG_EXP=1 skips the attention math, 2 skips the weight loads
(matrix math on zeros: what remains is synchronisation and per-phase overhead).

    python bench/decode_breakdown.py [--models smollm2-135m,llama-3.2-1b]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.random_models import build_hf, loaded_model, random_prompt  # noqa: E402

VARIANTS = {"full": {}, "no-attention": {"KOG_EXP": "1"}, "no-weight-loads": {"KOG_EXP": "2"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    args = ap.parse_args()
    import torch

    from engine.backends.cuda import CudaBackend
    from engine.sampling import SamplingParams

    for name in args.models.split(","):
        hf = build_hf(name, 7, device="cuda")
        lm = loaded_model(hf, name)
        del hf
        torch.cuda.empty_cache()
        prompt = random_prompt(lm.config.vocab_size, 32, np.random.default_rng(7))
        line = []
        for label, defines in VARIANTS.items():
            be = CudaBackend(lm, 512, defines=defines)
            rates = []
            for _ in range(4):
                be.truncate(0)
                be.prefill(prompt)
                list(be.decode(SamplingParams(), prompt, 256, set()))
                ts = be.token_times_ns.astype(np.float64) * 1e-9
                rates.append((len(ts) - 1) / (ts[-1] - ts[0]))
            r = float(np.median(rates[1:]))
            line.append(f"{label} {r:.0f} tok/s ({1e6 / r:.0f} us/token)")
            be.close()
        print(f"{name}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
