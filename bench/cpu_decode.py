"""CPU decode benchmark for the default model: kog's numpy backend beside transformers eager.

Same workload for both, each in its own process (so peak RSS is its own): the cached default
model, a 32-token prompt, greedy, 128 generated tokens, one warm-up, median of 5 runs, decode
time only (first token to last). Also the time to load the cached model. Not a test: speed
lives here, measured beside its peer in the same run.

    python bench/cpu_decode.py [--runs 5] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

PROMPT_TOKENS = 32


def prompt_ids(vocab: int) -> list[int]:
    return [(i * 7919) % (vocab - 1000) + 500 for i in range(PROMPT_TOKENS)]


def run_kog(runs: int, tokens: int) -> dict:
    from engine.api import load, open_session
    from engine.registry import Registry, installed

    load(None, progress=False)  # pulls and converts on the very first run; not what is timed
    start = time.perf_counter()
    model = load(None, progress=False)
    load_s = time.perf_counter() - start
    rates = []
    for _ in range(runs + 1):
        session = open_session(model, device="cpu", context=1024)
        generation = session.complete(prompt_ids(model.config.vocab_size), max_tokens=tokens)
        for _ in generation:
            pass
        rates.append(generation.stats.decode_tok_s)
    assert installed(Registry().default())
    return {"load_s": load_s, "tok_s": rates[1:], "tokens": generation.token_ids}


def run_transformers(runs: int, tokens: int) -> dict:
    import torch
    import transformers

    from engine.benchmark import cache_argument
    from engine.registry import Registry, local_path

    path = local_path(Registry().default())
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    rates = []
    for _ in range(runs + 1):
        ids, out = torch.tensor([prompt_ids(model.config.vocab_size)]), []
        cache = cache_argument(model, transformers.DynamicCache())
        with torch.inference_mode():
            for step in range(tokens):
                if step == 1:
                    first = time.perf_counter()
                result = model(ids, use_cache=True, **cache)
                out.append(int(result.logits[0, -1].argmax()))
                ids = torch.tensor([[out[-1]]])
        rates.append((tokens - 1) / (time.perf_counter() - first))
    return {"tok_s": rates[1:], "tokens": out, "threads": torch.get_num_threads()}


def measure(name: str, runs: int, tokens: int) -> dict:
    result = (run_kog if name == "kog" else run_transformers)(runs, tokens)
    if name == "kog":
        from engine.api import load

        result["bytes_per_token"] = load(None, progress=False).config.weights_read_per_token() * 4  # fp32
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--phase", choices=["kog", "transformers"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(measure(args.phase, args.runs, args.tokens)))
        return
    from engine.hardware import read_bandwidth_gb_s

    bandwidth = read_bandwidth_gb_s("cpu")
    results = {}
    for name in ("kog", "transformers"):
        cmd = [sys.executable, __file__, "--phase", name, "--runs", str(args.runs), "--tokens", str(args.tokens)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    kog, ref = results["kog"], results["transformers"]
    kog_rate, ref_rate = statistics.median(kog["tok_s"]), statistics.median(ref["tok_s"])
    print(f"default model, CPU, {PROMPT_TOKENS}-token prompt, {args.tokens} greedy tokens, median of {args.runs}")
    print(f"  kog cpu backend      {kog_rate:7.1f} tok/s  (runs {', '.join(f'{r:.1f}' for r in kog['tok_s'])})  peak RSS {kog['peak_rss_mb']:.0f} MB")
    print(f"  transformers eager   {ref_rate:7.1f} tok/s  (runs {', '.join(f'{r:.1f}' for r in ref['tok_s'])})  peak RSS {ref['peak_rss_mb']:.0f} MB  torch threads {ref['threads']}")
    print(f"  ratio kog / transformers: {kog_rate / ref_rate:.2f}x")
    gb_per_token = kog["bytes_per_token"] / 1e9
    print(f"  bytes per token {gb_per_token:.3f} GB (fp32); measured read bandwidth {bandwidth:.1f} GB/s "
          f"-> limit {bandwidth / gb_per_token:.1f} tok/s; kog MBU {kog_rate * gb_per_token / bandwidth:.0%}")
    print(f"  load of the cached default model: {kog['load_s']:.2f} s")
    print(f"  greedy tokens identical: {kog['tokens'] == ref['tokens']}")


if __name__ == "__main__":
    main()
