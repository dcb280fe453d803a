"""Where the decode kernel's warps stand, per source line, from Nsight Compute's warp-state sampling.

Two steps on the GPU machine (ncu is there; its report is read there or here):

    ln -sf kernels/*.cu kernels/*.cuh .   # ncu embeds the sources it finds by NVRTC's file names
    ncu --clock-control none --import-source yes --kernel-name regex:kog_decode --launch-skip 1 \\
        --launch-count 1 --section WarpStateStats --section SourceCounters -o $OUT/r \\
        python3 bench/ncu_source.py run qwen2.5-1.5b --tokens 64 [--define KOG_ATT_RMAX=0]
    ncu --import $OUT/r.ncu-rep --page source --csv --print-source cuda,sass > $OUT/r.csv
    python3 bench/ncu_source.py lines $OUT/r.csv [--top 60] [--file decode_attention.cuh --from 160 --to 345]

`run` decodes a random-init model at a real shape twice with the decode kernel built with
-lineinfo (the first launch warms up; ncu profiles the second). `lines` adds up the samples of
each source line and names its three largest stall reasons.

What the samples are: where each sampled warp was and why it did not issue, summed over the
whole launch. In this kernel most warps spend most of their time waiting (for weights, flags,
other blocks' words), so a line with many samples is where the waiting happens, not necessarily
what the token's critical path pays for: two changes that moved samples away (the tagged
vectors' addresses kept in shared memory, per-lane sums in every product) both ran slower
(PERF.md session 18). Cost a line's share with a same-process timing (decode_breakdown.py).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(model: str, tokens: int, defines: dict[str, str]) -> None:
    import numpy as np

    from bench.random_models import gpu_timing_model, random_prompt
    from engine.backends.cuda import CudaBackend
    from engine.sampling import SamplingParams

    lm = gpu_timing_model(model)
    prompt = random_prompt(lm.config.vocab_size, 32, np.random.default_rng(7))
    be = CudaBackend(lm, 32 + 512, defines=defines, nvrtc_options=("-lineinfo",))
    for _ in range(2):  # ncu --launch-skip 1: the second launch is the profiled one
        be.truncate(0)
        be.prefill(prompt)
        list(be.decode(SamplingParams(), prompt, tokens, set()))
    ts = be.token_times_ns.astype(np.float64) * 1e-9
    print(f"{model}: {len(ts)} tokens, {(len(ts) - 1) / (ts[-1] - ts[0]):.0f} tok/s (as profiled)")
    be.close()


def source_lines(report_csv: Path) -> list[tuple[int, str, int, str, dict[str, int]]]:
    """(samples, file, line, source, {stall reason: samples}) of every source line in an
    `ncu --page source --csv --print-source cuda,sass` export."""
    out = []
    name, columns = None, {}
    with open(report_csv, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":
                name = Path(row[1]).name
            elif row[0] == "Line No":
                columns = {h: i for i, h in enumerate(row) if i >= 2}
            elif row[0].isdigit() and columns:  # a source line (its SASS rows start with an empty cell)
                samples = row[columns["Warp Stall Sampling (All Samples)"]]
                if not samples.isdigit():
                    continue
                stalls = {h[6:]: int(row[i]) for h, i in columns.items()
                          if h.startswith("stall_") and "Not Issued" not in h and row[i].isdigit()}
                out.append((int(samples), name, int(row[0]), row[1].strip(), stalls))
    return out


def lines(report_csv: Path, top: int, file: str | None, first: int, last: int) -> None:
    rows = source_lines(report_csv)
    total = sum(r[0] for r in rows) or 1
    print(f"{total} samples over {len(rows)} source lines")
    chosen = [r for r in rows if file is None or (r[1] == file and first <= r[2] <= last)]
    for samples, name, line, src, stalls in sorted(chosen, key=lambda r: -r[0])[:top]:
        reasons = " ".join(f"{k}:{v / max(samples, 1):.0%}" for k, v in sorted(stalls.items(), key=lambda x: -x[1])[:3])
        print(f"{samples / total:6.1%} {samples:8d}  {name}:{line:<4d} {src[:72]:72s} {reasons}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="decode twice with line info (run it under ncu)")
    r.add_argument("model", help="a shape of bench/random_models.py (smollm2-135m, llama-3.2-1b, ...)")
    r.add_argument("--tokens", type=int, default=64)
    r.add_argument("--define", action="append", default=[], metavar="NAME=VALUE", help="an extra kernel macro")
    s = sub.add_parser("lines", help="samples per source line of an ncu source export")
    s.add_argument("csv", type=Path)
    s.add_argument("--top", type=int, default=50)
    s.add_argument("--file", help="only this source file (e.g. decode_attention.cuh)")
    s.add_argument("--from", dest="first", type=int, default=0)
    s.add_argument("--to", dest="last", type=int, default=1 << 30)
    args = ap.parse_args()
    if args.cmd == "run":
        bad = [d for d in args.define if "=" not in d]
        if bad:
            ap.error(f"--define needs NAME=VALUE, got {bad[0]!r}")
        run(args.model, args.tokens, dict(d.split("=", 1) for d in args.define))
    else:
        if not args.csv.is_file():
            ap.error(f"no such file: {args.csv}")
        lines(args.csv, args.top, args.file, args.first, args.last)


if __name__ == "__main__":
    main()
