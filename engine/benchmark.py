"""Single-request decode benchmark: kog and its peers on one workload, measured the same way.

Every backend gets the same prompt ids, greedy decoding, a fixed number of generated tokens
(end-of-sequence ignored), one warm-up run and `repetitions` timed runs. Decode rate counts
the tokens after the first over the time from the first to the last, so prefill (TTFT) is
reported separately. Peers are Hugging Face transformers, eager and — on a GPU — with a
static KV cache and one decode step captured as a CUDA graph. Before a rate is believed the
backends must agree on the first greedy tokens, up to a step where the reference's own logits
tie (`apply_gate`).
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from engine.config import ModelConfig
from engine.errors import KogError
from engine.model import LoadedModel
from engine.sampling import SamplingParams

GATE_TOKENS = 8  # greedy tokens every backend must share with the reference
TIE_STEPS = 2  # logits within this many of their dtype's steps (at the maximum's magnitude) of the maximum are a tie


@dataclass(frozen=True)
class Workload:
    context: int  # prompt tokens prefilled before decoding (32, 1k, 4k: "context already in the cache")
    generate: int  # tokens decoded per run
    repetitions: int  # timed runs, after one warm-up


@dataclass
class Sample:
    decode_tok_s: float
    ttft_s: float
    prefill_tok_s: float
    latency_p50_ms: float
    latency_p99_ms: float


@dataclass
class BackendRun:
    backend: str  # "kog-cuda", "kog-cpu", "transformers-eager", "transformers-graph"
    model: str
    synthetic: bool
    context: int
    generate: int
    bytes_per_token: int
    samples: list[Sample] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the greedy tokens of the first run
    # per gated step of the first run, the tokens its logits cannot tell from the one it took
    # (a reference that reports them lets a backend take another at that step: apply_gate)
    ties: list[list[int]] = field(default_factory=list)
    excluded: str | None = None  # why the correctness gate left it out

    def median(self, name: str) -> float:
        return statistics.median(getattr(s, name) for s in self.samples)

    def spread(self, name: str) -> tuple[float, float]:
        values = [getattr(s, name) for s in self.samples]
        return min(values), max(values)

    def mbu(self, bandwidth_gb_s: float) -> float:
        return self.median("decode_tok_s") * self.bytes_per_token / (bandwidth_gb_s * 1e9)

    def as_dict(self) -> dict:
        return asdict(self)


def bytes_per_token(config: ModelConfig, weight_bytes: int, kv_bytes: int, context: int, generate: int) -> int:
    """Bytes one decode step reads: all weights, plus the K and V of the mean context length."""
    mean_context = context + generate / 2
    kv = 2 * config.num_layers * config.num_kv_heads * config.head_dim * kv_bytes * mean_context
    return int(config.weights_read_per_token() * weight_bytes + kv)


def prompt_ids(config: ModelConfig, length: int, run: int) -> list[int]:
    """Deterministic ids spread over the vocabulary; the first differs per run so that no run
    reuses the previous run's KV cache."""
    rng = np.random.default_rng(length)
    ids = rng.integers(256, config.vocab_size - 256, size=length).tolist()
    ids[0] = 256 + run
    return ids


def _sample(token_times: list[float], start: float, prompt_tokens: int) -> Sample:
    gaps = np.diff(token_times)
    return Sample(
        decode_tok_s=len(gaps) / (token_times[-1] - token_times[0]),
        ttft_s=token_times[0] - start,
        prefill_tok_s=prompt_tokens / (token_times[0] - start),
        latency_p50_ms=float(np.percentile(gaps, 50)) * 1e3,
        latency_p99_ms=float(np.percentile(gaps, 99)) * 1e3,
    )


def run_kog(model: LoadedModel, device: str, workload: Workload, synthetic: bool) -> BackendRun:
    from engine.api import open_session

    session = open_session(model, device=device, context=workload.context + workload.generate + 1)
    backend = session.backend
    result = BackendRun(
        backend=f"kog-{backend.name}", model=model.name, synthetic=synthetic, context=workload.context,
        generate=workload.generate,
        bytes_per_token=bytes_per_token(model.config, backend.weight_bytes, backend.kv_bytes, workload.context, workload.generate)
        - backend.greedy_bytes_saved,  # the runs below decode greedily
    )
    for run in range(workload.repetitions + 1):
        prompt = prompt_ids(model.config, workload.context, run)
        start = time.perf_counter()
        generation = session.complete(prompt, SamplingParams(), workload.generate, stop_at_eos=False)
        times = [event.time for event in generation if event.id >= 0]
        if run == 0:
            result.tokens = generation.token_ids
        else:
            result.samples.append(_sample(times, start, len(prompt)))
    backend.close()
    return result


@dataclass
class DraftRun:
    """One prompt's reply decoded plainly and with drafted passes on the same backend (`kog bench --drafts`)."""

    model: str
    prompt: str  # the workload's name for it
    positions: int  # positions a drafted pass ran (fewer than asked where more do not fit the GPU)
    tokens: int  # tokens in the reply
    passes: int  # drafted passes after the reply's first token (that one comes from the prefill)
    identical: bool  # the drafted reply is the plain one, token for token
    plain: list[Sample] = field(default_factory=list)
    drafted: list[Sample] = field(default_factory=list)

    def rate(self, drafted: bool) -> float:
        return statistics.median(s.decode_tok_s for s in (self.drafted if drafted else self.plain))

    def as_dict(self) -> dict:
        return asdict(self)


def drafts_context(model: LoadedModel, prompts: dict[str, tuple[str | None, str]], max_tokens: int) -> int:
    """The context run_drafts needs: its longest prompt and a whole reply (a KogError where the model holds less)."""
    longest = max(len(model.tokenizer.encode_chat([{"role": "system", "content": system}] * bool(system)
                                                  + [{"role": "user", "content": text}], add_generation_prompt=True))
                  for system, text in prompts.values())
    if longest + max_tokens > model.config.max_context:
        raise KogError(f"{model.name}: the drafts workload's longest prompt ({longest} tokens) + {max_tokens} exceeds "
                       f"its {model.config.max_context}")
    return longest + max_tokens


def run_drafts(model: LoadedModel, prompts: dict[str, tuple[str | None, str]], positions: int, max_tokens: int,
               repetitions: int) -> list[DraftRun]:
    """Each prompt's greedy reply (to its end of turn, max_tokens at most) decoded one position a pass and
    `positions` a pass (CUDA: up to positions - 1 tokens copied from the context checked in each pass), one
    warm-up of each, then the two in turn. A reply needs two tokens to have a decode rate."""
    from engine.api import open_session
    from engine.session import Session

    context = drafts_context(model, prompts, max_tokens)
    backend = open_session(model, device="cuda", context=context, draft_positions=positions).backend

    def reply(system: str | None, text: str, n: int) -> tuple[list[int], list[float], int]:
        """The reply's tokens, when each reached the host, and the prompt's length (n positions a pass)."""
        backend.draft_positions = n
        generation = Session(model, backend, system=system).send(text, SamplingParams(), max_tokens)
        times = [event.time for event in generation if event.id >= 0]
        return generation.token_ids, times, generation.stats.prompt_tokens

    def sample(system: str | None, text: str, n: int) -> Sample:
        start = time.perf_counter()
        _, times, prompt_tokens = reply(system, text, n)
        return _sample(times, start, prompt_tokens)

    runs = []
    try:
        for name, (system, text) in prompts.items():
            tokens = reply(system, text, 1)[0]
            if len(tokens) < 2:
                raise KogError(f"{model.name}: its reply to the drafts workload's '{name}' prompt is one token: "
                               "no decode to time")
            drafted = reply(system, text, positions)[0]
            run = DraftRun(model=model.name, prompt=name, positions=backend.pass_positions, tokens=len(tokens),
                           passes=backend.decode_passes, identical=drafted == tokens)
            for _ in range(repetitions):
                run.plain.append(sample(system, text, 1))
                run.drafted.append(sample(system, text, positions))
            runs.append(run)
    finally:
        backend.close()
    return runs


def _transformers_model(model: LoadedModel, device: str):
    import torch
    import transformers

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fields = model.config.to_hf()
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    state = {k: torch.tensor(v) for k, v in model.weights.items() if k != "rope_freqs.weight"}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"weights do not fit the transformers model: {missing or unexpected}")
    return hf


def run_transformers(model: LoadedModel, device: str, workload: Workload, synthetic: bool, graph: bool) -> BackendRun:
    """transformers on the same weights: eager, or (cuda) static cache + CUDA graph."""
    import torch

    hf = _transformers_model(model, device)
    weight_bytes = 2 if device == "cuda" else 4
    result = BackendRun(
        backend="transformers-graph" if graph else "transformers-eager", model=model.name, synthetic=synthetic,
        context=workload.context, generate=workload.generate,
        bytes_per_token=bytes_per_token(model.config, weight_bytes, weight_bytes, workload.context, workload.generate),
    )
    step = _graph_decoder(hf, model.config, workload) if graph else _eager_decoder(hf)
    with torch.inference_mode():
        for run in range(workload.repetitions + 1):
            prompt = prompt_ids(model.config, workload.context, run)
            start = time.perf_counter()
            tokens, sample = step(prompt, workload.generate, start, result.ties if run == 0 else None)
            if run == 0:
                result.tokens = tokens
            else:
                result.samples.append(sample)
    del hf
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def cache_argument(hf, cache) -> dict:
    """The keyword argument that hands `cache` to a transformers model's forward: `cache` from
    transformers 5.2x on (`past_key_values` still works there, with a warning, until its removal),
    `past_key_values` before."""
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    return {name: cache}


def _eager_decoder(hf):
    import torch
    from transformers import DynamicCache

    device = hf.device

    def decode(prompt: list[int], n: int, start: float, ties: list | None = None):
        ids, tokens, times = torch.tensor([prompt], device=device), [], []
        cache = cache_argument(hf, DynamicCache())  # filled in place, step by step
        for _ in range(n):
            out = hf(ids, use_cache=True, **cache)
            logits = out.logits[0, -1]
            tokens.append(int(logits.argmax()))  # the host needs the token: a sync, as in generate()
            times.append(time.perf_counter())
            if ties is not None and len(ties) < GATE_TOKENS:  # the untimed first run only
                ties.append(_ties(logits))
            ids = torch.tensor([[tokens[-1]]], device=device)
        return tokens, _sample(times, start, len(prompt))

    return decode


def _ties(logits) -> list[int]:
    """The tokens whose logits lie within TIE_STEPS steps of the logits' dtype (bf16: 2^-7 of the
    magnitude) of the maximum: at that precision their order is rounding, not the model."""
    import torch

    top = logits.max().float()
    step = torch.finfo(logits.dtype).eps * 2.0 ** torch.floor(torch.log2(top.abs().clamp(min=1.0)))
    return sorted(torch.nonzero(logits.float() >= top - TIE_STEPS * step).flatten().tolist())


def _graph_decoder(hf, config: ModelConfig, workload: Workload):
    """One decode step on a static KV cache, captured once as a CUDA graph and replayed per token.

    The strongest form of this peer: replays are queued back to back and the tokens collected
    on the device, with one synchronization at the end (so per-token latency is the mean)."""
    import torch
    from transformers import StaticCache

    total = workload.context + workload.generate + 1
    cache = StaticCache(config=hf.config, max_cache_len=total)
    cache_kwargs = cache_argument(hf, cache)
    position = torch.zeros(1, dtype=torch.long, device="cuda")
    tokens = torch.zeros(total + 1, dtype=torch.long, device="cuda")  # tokens[p] is the token at position p

    def step():
        logits = hf(input_ids=tokens[position].view(1, 1), cache_position=position, use_cache=True, **cache_kwargs).logits
        tokens[position + 1] = logits[0, -1].argmax()
        position.add_(1)

    def prefill(prompt: list[int]):
        cache.reset()
        ids = torch.tensor([prompt], device="cuda")
        logits = hf(input_ids=ids, cache_position=torch.arange(len(prompt), device="cuda"), use_cache=True, **cache_kwargs).logits
        tokens[len(prompt)] = logits[0, -1].argmax()
        position.fill_(len(prompt))

    warm_prompt = prompt_ids(config, workload.context, 0)
    prefill(warm_prompt)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    prefill(warm_prompt)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def decode(prompt: list[int], n: int, start: float, ties: list | None = None):  # ties: none (no logits reach the host)
        prefill(prompt)
        first_token = int(tokens[len(prompt)])  # the first token reaches the host: TTFT
        first = time.perf_counter()
        for _ in range(n - 1):
            graph.replay()
        torch.cuda.synchronize()
        decode_s = time.perf_counter() - first
        mean_ms = decode_s / (n - 1) * 1e3
        sample = Sample(
            decode_tok_s=(n - 1) / decode_s, ttft_s=first - start, prefill_tok_s=len(prompt) / (first - start),
            latency_p50_ms=mean_ms, latency_p99_ms=mean_ms,
        )
        out = tokens[len(prompt) : len(prompt) + n].tolist()
        assert out[0] == first_token
        return out, sample

    return decode


def agrees(run: BackendRun, reference: BackendRun) -> bool:
    """The run's first greedy tokens are the reference's, up to a step where the reference had a
    tie (bf16 transformers on random weights ties often: logits near 8 are 0.0625 apart) and the
    run took another of the tied tokens; past that the two continue from different text."""
    for i, (mine, theirs) in enumerate(zip(run.tokens[:GATE_TOKENS], reference.tokens[:GATE_TOKENS])):
        if mine != theirs:
            return i < len(reference.ties) and mine in reference.ties[i]
    return len(run.tokens[:GATE_TOKENS]) == len(reference.tokens[:GATE_TOKENS])


def apply_gate(runs: list[BackendRun]) -> None:
    """Exclude every run whose first greedy tokens differ from the reference's (agrees): transformers
    eager where present (the independent implementation), else the first run."""
    if not runs:
        return
    reference = next((r for r in runs if r.backend == "transformers-eager"), runs[0])
    for run in runs:
        if not agrees(run, reference):
            run.excluded = (
                f"greedy tokens differ from {reference.backend} "
                f"({run.tokens[:GATE_TOKENS]} vs {reference.tokens[:GATE_TOKENS]})"
            )
