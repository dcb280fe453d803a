"""The CUDA backend against the CPU reference and transformers, on random-init models at the
real shapes of SmolLM2-135M, Llama-3.2-1B, Qwen2.5-1.5B and Qwen3-1.7B (built on the device,
no download; weights rounded to bf16 so every side computes with the same numbers).

Greedy tokens must be identical; the one allowance is a step where the reference itself has
a near-tie (top-2 logits closer than TIE x their spread), where fp32 summation order alone
may pick either. Transformers is checked teacher-forced on the GPU's own sequence, so such a
step does not end the comparison. Fresh random weights and prompts each run (seed printed;
KOG_TEST_SEED reproduces one). Buffers are NaN-poisoned before the kernel runs.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

cp = pytest.importorskip("cupy")


def _gpu_count() -> int:
    try:
        return cp.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver, no device
        return 0


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() == 0, reason="needs a CUDA GPU")]
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench.lookup_acceptance import passes as lookup_passes  # noqa: E402
from bench.random_models import SHAPES, build_hf, loaded_model, random_prompt, round_to_bf16  # noqa: E402
from engine.backends.cpu import CpuBackend  # noqa: E402
from engine.backends.cuda import CudaBackend  # noqa: E402
from engine.errors import KogError  # noqa: E402
from engine.sampling import SamplingParams, sample  # noqa: E402
from tests.conftest import TIE  # noqa: E402

SEED = int(os.environ.get("KOG_TEST_SEED", time.time_ns() % (1 << 31)))
N_GEN = 128
PROMPT = 32
CPU_TOKENS = {"smollm2-135m": N_GEN}  # the numpy reference is slow at 1-2B parameters
CPU_TOKENS_DEFAULT = 16
MODELS = [m for m in os.environ.get("KOG_TEST_MODELS", ",".join(SHAPES)).split(",") if m]
SMALL = "smollm2-135m"
GREEDY = SamplingParams()


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    name = request.param
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    seed = (SEED + zlib.crc32(name.encode())) % (1 << 31)
    print(f"\n[{name}] seed {seed} (KOG_TEST_SEED={SEED})")
    hf = build_hf(name, seed, device="cuda")
    lm = loaded_model(hf, name)
    t = time.perf_counter()
    gpu = CudaBackend(lm, 1024)
    print(f"[{name}] CudaBackend ready in {time.perf_counter() - t:.1f} s: {gpu.device_name}, "
          f"{gpu.nblk} blocks, {gpu.k_decode.num_regs} regs, {gpu.smem} B smem, "
          f"{gpu.k_decode.local_size_bytes} B local")
    rng = np.random.default_rng(seed)
    prompt = random_prompt(lm.config.vocab_size, PROMPT, rng)
    yield dict(name=name, hf=hf, lm=lm, gpu=gpu, seed=seed, prompt=prompt, rng=rng, greedy=None, cpu=None)
    gpu.close()
    del hf
    torch.cuda.empty_cache()


# Positions a reference pass takes at once: over an 8k window in one pass, fp32 eager attention's scores and every
# position's logits want more than a 7B / 8B shape leaves free on an 80 GB card.
HF_CHUNK = 2048


def _hf_logits(hf, ids: list[int], first: int) -> np.ndarray:
    """Transformers logits at positions first.. of `ids` (teacher forcing), fp32: HF_CHUNK positions a pass through
    transformers' own KV cache, logits only where asked."""
    rows, cache = [], None
    with torch.no_grad():
        for start in range(0, len(ids), HF_CHUNK):
            chunk = ids[start : start + HF_CHUNK]
            keep = start + len(chunk) - max(start, first)  # this chunk's positions from `first` on
            out = hf(torch.tensor([chunk], device=hf.device), past_key_values=cache, use_cache=True,
                     logits_to_keep=max(keep, 1))
            cache = out.past_key_values
            if keep > 0:
                rows.append(out.logits[0, -keep:].float().cpu().numpy())
    return np.concatenate(rows)


def _cpu(m) -> CpuBackend:
    if m["cpu"] is None:
        m["cpu"] = CpuBackend(m["lm"], PROMPT + N_GEN + 1)
    m["cpu"].truncate(0)
    return m["cpu"]


def _fresh(gpu: CudaBackend, prompt: list[int]) -> np.ndarray:
    gpu.reset_cancel()
    gpu.truncate(0)
    gpu.poison()
    logits = gpu.prefill(prompt)
    gpu.poison()
    return logits


def _greedy(m) -> list[int]:
    if m["greedy"] is None:
        gpu, prompt = m["gpu"], m["prompt"]
        _fresh(gpu, prompt)
        t = time.perf_counter()
        toks = list(gpu.decode(GREEDY, prompt, N_GEN, set()))
        dt = time.perf_counter() - t
        st = gpu.last_status
        times = gpu.token_times_ns.astype(np.float64)
        rate = (len(times) - 1) / ((times[-1] - times[0]) * 1e-9) if len(times) > 1 else 0.0
        print(f"[{m['name']}] {len(toks)} greedy tokens in {dt * 1e3:.1f} ms host time, {rate:.0f} tok/s in-kernel; "
              f"status {st}; distinct {len(set(toks))}")
        assert st["error"] == 0
        assert len(toks) == N_GEN and st["reason"] == 2
        assert gpu.cached_tokens == PROMPT + N_GEN - 1
        m["greedy"] = toks
    return m["greedy"]


def _check_against(toks: list[int], logits: np.ndarray, what: str) -> None:
    ties = []
    for i, (t, row) in enumerate(zip(toks, logits)):
        best = int(np.argmax(row))
        if best != t:
            margin = float(row[best] - row[t])
            assert margin <= TIE * float(row.std()), (
                f"{what}: step {i}: GPU picked {t}, reference {best} by a margin of {margin:.4g} "
                f"(logit std {row.std():.3g}); seed {SEED}"
            )
            ties.append(i)
    srt = np.sort(logits, axis=-1)
    print(f"  vs {what}: {len(toks) - len(ties)}/{len(toks)} identical, near-ties at {ties}, "
          f"smallest top-2 margin {float((srt[:, -1] - srt[:, -2]).min()):.3g}")
    assert len(ties) <= 2


def test_prefill_logits_match(model):
    hf, gpu, prompt = model["hf"], model["gpu"], model["prompt"]
    logits = _fresh(gpu, prompt)
    assert np.isfinite(logits).all()
    ref = _hf_logits(hf, prompt, PROMPT - 1)[0]
    cref = _cpu(model).prefill(prompt)
    print(f"  prefill logits: rel err vs transformers {_rel(logits, ref):.2e}, vs CPU {_rel(logits, cref):.2e}")
    assert _rel(logits, ref) < 1e-4
    assert _rel(logits, cref) < 1e-4
    assert int(np.argmax(logits)) == int(np.argmax(cref)) or cref.max() - cref[np.argmax(logits)] < TIE * cref.std()


def test_prefill_in_two_parts_matches_one_pass(model):
    """Prefix reuse: a prompt longer than one 64-row attention tile (and not a multiple of it),
    prefilled as 70 + 81 tokens, leaves the cache and logits of one pass; both match the CPU."""
    gpu, lm = model["gpu"], model["lm"]
    n, cut = 151, 70
    prompt = random_prompt(lm.config.vocab_size, n, model["rng"])
    whole = _fresh(gpu, prompt)
    kc, vc = gpu.kc[:, :, :n].get(), gpu.vc[:, :, :n].get()
    gpu.truncate(0)
    gpu.poison()
    gpu.prefill(prompt[:cut])
    gpu.poison()  # nothing past the first part may be read
    parts = gpu.prefill(prompt[cut:])
    cref = _cpu(model).prefill(prompt)
    print(f"  two-part prefill: logits rel {_rel(parts, whole):.2e}, K {_rel(gpu.kc[:, :, :n].get(), kc):.2e}, "
          f"V {_rel(gpu.vc[:, :, :n].get(), vc):.2e}; one pass vs CPU {_rel(whole, cref):.2e}")
    assert gpu.cached_tokens == n
    assert np.isfinite(parts).all()
    # cuBLAS may pick other kernels (another summation order) for other row counts: the two
    # passes agree to fp32 rounding, not bit for bit (1.2e-5 seen on the Qwen2.5 shape)
    assert _rel(parts, whole) < 1e-4
    assert _rel(gpu.kc[:, :, :n].get(), kc) < 1e-4
    assert _rel(gpu.vc[:, :, :n].get(), vc) < 1e-4
    assert _rel(whole, cref) < 1e-4


def test_hop_copies_are_near_their_pollers(model):
    """H100/H200: the hop space's two copies lie on the two L2 partitions, and every multiprocessor's own copy
    (the one its block polls) answers its round trips sooner than the other copy, timed afresh."""
    from engine.backends.l2_sides import CHUNK_LINES, MIN_GAP, round_trip_kernel, round_trips

    gpu = model["gpu"]
    if not any(n in gpu.device_name for n in ("H100", "H200")):
        pytest.skip("the two L2 partitions are mapped on H100/H200")
    hop = gpu.hop
    assert hop.sided and gpu.kernel_info["hop_copies"] == 2
    cp, n = gpu.cp, 4
    chunks = hop.host_map.shape[1]
    k = np.arange(gpu.nsm * n)
    idx = np.concatenate([(hop.host_map[c][k % chunks].astype(np.int64) * CHUNK_LINES + (7 * k) % CHUNK_LINES)
                          .reshape(gpu.nsm, n) for c in (0, 1)], axis=1)
    with gpu.device:
        lat, sms = round_trips(cp, round_trip_kernel(gpu.l2mod), hop.arena, idx, gpu.nsm)
    side = hop.sm_side.get()[sms]
    own = np.where(side == 0, lat[:, :n].mean(axis=1), lat[:, n:].mean(axis=1))
    other = np.where(side == 0, lat[:, n:].mean(axis=1), lat[:, :n].mean(axis=1))
    print(f"  round trips: own copy {own.mean():.0f} cycles, the other {other.mean():.0f}")
    assert (own + MIN_GAP < other).all()


def test_decode_step_matches(model):
    """One kernel forward: its logits and the K/V it appends, against transformers and prefill. (A
    repetition penalty makes the LM head compute every logit: greedy decoding without one may screen
    the rows in int8 and leave no logits behind, kernels' LM_SCREEN.)"""
    hf, gpu, prompt = model["hf"], model["gpu"], model["prompt"]
    _fresh(gpu, prompt)
    toks = list(gpu.decode(SamplingParams(repetition_penalty=1.05), prompt, 2, set()))
    assert len(toks) == 2 and gpu.last_status["error"] == 0
    assert gpu.cached_tokens == PROMPT + 1
    step = gpu.logits.get()
    ref = _hf_logits(hf, prompt + toks[:1], PROMPT)[0]
    H = gpu.config.hidden_size
    words = gpu.hop.words(0, H)  # the residual stream: the hop space's first words (kernels: HV_X)
    if gpu.kernel_info["hop_copies"] == 2:
        assert (gpu.hop.words(0, H, copy=1) == words).all(), "every copy of the hop space gets every store"
    x = (words & 0xFFFFFFFF).astype(np.uint32).view(np.float32)  # tagged words: the value half
    with torch.no_grad():
        hs = hf(torch.tensor([prompt + toks[:1]], device="cuda"), output_hidden_states=True).hidden_states
    cands = {f"hidden[{i}]": hs[i][0, -1].float().cpu().numpy() for i in (-2, -1)}
    print(f"  decode-step logits rel err {_rel(step, ref):.2e}; residual x vs "
          + ", ".join(f"{k} {_rel(x, v):.2e}" for k, v in cands.items()))
    assert np.isfinite(step).all()
    assert _rel(step, ref) < 1e-3
    # the K/V the kernel appended at position PROMPT equals what the batched prefill writes
    kk = gpu.kc[:, :, PROMPT].get()
    vv = gpu.vc[:, :, PROMPT].get()
    gpu.truncate(PROMPT)
    gpu.prefill(toks[:1])
    print(f"  kernel K/V vs prefill K/V: rel err {_rel(kk, gpu.kc[:, :, PROMPT].get()):.2e} / "
          f"{_rel(vv, gpu.vc[:, :, PROMPT].get()):.2e}")
    assert _rel(kk, gpu.kc[:, :, PROMPT].get()) < 1e-4
    assert _rel(vv, gpu.vc[:, :, PROMPT].get()) < 1e-4


def test_greedy_matches_transformers(model):
    toks = _greedy(model)
    ref = _hf_logits(model["hf"], model["prompt"] + toks, PROMPT - 1)[:-1]
    _check_against(toks, ref, "transformers")


def test_greedy_matches_cpu_reference(model):
    toks = _greedy(model)
    n = CPU_TOKENS.get(model["name"], CPU_TOKENS_DEFAULT)
    cpu = _cpu(model)
    cpu.prefill(model["prompt"])
    ref = list(cpu.decode(GREEDY, model["prompt"], n, set()))
    same = next((i for i, (a, b) in enumerate(zip(toks, ref)) if a != b), n)
    print(f"  vs CPU reference: first {same}/{n} identical")
    if same < n:  # accepted only at a near-tie of the reference (same prefix, so same state)
        row = _hf_logits(model["hf"], model["prompt"] + toks[:same], PROMPT + same - 1)[0]
        margin = abs(float(row[toks[same]] - row[ref[same]]))
        assert margin <= TIE * float(row.std()), f"diverged from the CPU at step {same} (margin {margin:.3g})"


DRAFT_POSITIONS = 5  # a drafted pass: the chosen token and four drafts


def _decode_with_drafts(gpu: CudaBackend, positions: int, prompt: list[int], n: int, stops: set[int],
                        switch: bool = False):
    """A greedy decode from a fresh prefill of `prompt`, up to `positions` positions a pass, by the drafts' build
    throughout (its own passes counted) or switching builds (`switch`): (tokens, status, cached, the positions a
    pass it ran)."""
    switch_default = gpu.switch_builds
    gpu.draft_positions, gpu.switch_builds = positions, switch
    try:
        _fresh(gpu, prompt)
        toks = list(gpu.decode(GREEDY, prompt, n, stops))
        ran = gpu.pass_positions
    finally:
        gpu.draft_positions, gpu.switch_builds = 1, switch_default
    assert gpu.last_status["error"] == 0
    return toks, gpu.last_status, gpu.cached_tokens, ran


def _check_drafts(gpu: CudaBackend, hf, prompt: list[int], what: str) -> list[int]:
    """A decode of up to DRAFT_POSITIONS positions a pass against the plain decode from `prompt`: the same greedy
    tokens (up to a near-tie of transformers' logits), the same cache, and exactly the passes the draft rule
    predicts from them. Returns the plain decode's tokens."""
    plain, _, cached_plain, _ = _decode_with_drafts(gpu, 1, prompt, N_GEN, set())
    toks, st, cached, ran = _decode_with_drafts(gpu, DRAFT_POSITIONS, prompt, N_GEN, set())
    passes = lookup_passes(prompt + toks[:1], toks[1:], ran - 1, 4)[0]  # (the first token: prefill's)
    kept = len(toks) - 1 - passes
    print(f"  drafts, {what} prompt, {ran} positions a pass: {len(toks)} tokens in {st['passes']} passes "
          f"({kept} drafts kept); cached {cached} vs plain {cached_plain}")
    assert st["passes"] == passes
    same = next((i for i, (a, b) in enumerate(zip(toks, plain)) if a != b), None)
    if same is None:
        assert len(toks) == len(plain) == N_GEN and cached == cached_plain
    else:  # accepted only at a near-tie (fp32 summation order: a pass's attention units may differ)
        row = _hf_logits(hf, prompt + toks[:same], len(prompt) + same - 1)[0]
        margin = abs(float(row[toks[same]] - row[plain[same]]))
        assert margin <= TIE * float(row.std()), f"{what}: drafts parted from the plain decode at {same}"
    return plain


def test_drafts_keep_the_plain_tokens(model):
    """A pass over the chosen token and up to four drafts copied from the context yields the plain decode's
    greedy tokens, leaves the same cache, and takes exactly the passes the draft rule predicts from them: on
    the fixture's random prompt, on a prompt that repeats itself, and with a stop id met inside a pass."""
    gpu, lm, hf = model["gpu"], model["lm"], model["hf"]
    half = random_prompt(lm.config.vocab_size, PROMPT // 2, model["rng"])
    _check_drafts(gpu, hf, model["prompt"], "random")
    plain = _check_drafts(gpu, hf, half + half, "repeated")
    stop = plain[N_GEN // 2]  # (the repeated prompt's tokens)
    first = plain.index(stop)
    toks, st, cached, _ = _decode_with_drafts(gpu, DRAFT_POSITIONS, half + half, N_GEN, {stop})
    assert toks == plain[: first + 1] and st["reason"] == 1
    assert cached == PROMPT + first, "every token before the stop id is in the cache, the stop id not"


def test_switching_builds_keeps_the_plain_tokens(model, monkeypatch):
    """A drafted decode that switches between the plain build and the drafts' build mid-reply yields the plain
    decode's tokens and cache: with a rule that switches after every token or pass (dozens of launches, each going
    on from the token the last one stopped at), then with the product's rule and a stop id met on the way."""
    from engine import drafts

    gpu, lm, hf = model["gpu"], model["lm"], model["hf"]
    half = random_prompt(lm.config.vocab_size, PROMPT // 2, model["rng"])
    prompt = half + half
    plain, _, cached_plain, _ = _decode_with_drafts(gpu, 1, prompt, N_GEN, set())
    with monkeypatch.context() as eager:
        eager.setattr(drafts, "COPY_MATCH", 0)
        eager.setattr(drafts, "DRY_PASSES", 0)
        toks, st, cached, _ = _decode_with_drafts(gpu, DRAFT_POSITIONS, prompt, N_GEN, set(), switch=True)
    eager_toks = toks
    print(f"  switching after every token or pass: {len(toks)} tokens, {st['launches']} launches, {st['passes']} passes; "
          f"cached {cached} vs plain {cached_plain}")
    assert st["launches"] > 8 and st["tokens"] == len(toks) == len(gpu.token_times_ns)
    same = next((i for i, (a, b) in enumerate(zip(toks, plain)) if a != b), None)
    if same is None:
        assert len(toks) == len(plain) == N_GEN and cached == cached_plain and st["reason"] == 2
    else:  # accepted only at a near-tie (fp32 summation order: a drafted pass's attention units may differ)
        row = _hf_logits(hf, prompt + toks[:same], len(prompt) + same - 1)[0]
        margin = abs(float(row[toks[same]] - row[plain[same]]))
        assert margin <= TIE * float(row.std()), f"switching builds parted from the plain decode at {same}"
    with monkeypatch.context() as eager:  # a cancel, then a consumer that stops, each with a launch queued
        eager.setattr(drafts, "COPY_MATCH", 0)
        eager.setattr(drafts, "DRY_PASSES", 0)
        eager.setattr(gpu, "draft_positions", DRAFT_POSITIONS)
        eager.setattr(gpu, "switch_builds", True)
        _fresh(gpu, prompt)
        got = []
        for t in gpu.decode(GREEDY, prompt, N_GEN, set()):
            got.append(t)
            if len(got) == 10:
                gpu.cancel()
        st = gpu.last_status
        assert st["error"] == 0 and st["reason"] == 4 and 10 <= len(got) < N_GEN and got == eager_toks[: len(got)]
        assert gpu.cached_tokens == PROMPT + st["fed"]
        _fresh(gpu, prompt)
        stream = gpu.decode(GREEDY, prompt, N_GEN, set())
        got = [next(stream) for _ in range(10)]
        stream.close()
        assert got == eager_toks[:10] and gpu.last_status["error"] == 0
    rules = {"eager": (0, 0, eager_toks), "the product's": (drafts.COPY_MATCH, drafts.DRY_PASSES, plain)}
    for rule, (copy_match, dry_passes, ref) in rules.items():  # (ref: the same rule's tokens, near-ties and all)
        stop = ref[N_GEN // 2]
        first = ref.index(stop)
        with monkeypatch.context() as chosen:  # (eager: the stop id ends a launch with the next one queued behind it)
            chosen.setattr(drafts, "COPY_MATCH", copy_match)
            chosen.setattr(drafts, "DRY_PASSES", dry_passes)
            toks, st, cached, _ = _decode_with_drafts(gpu, DRAFT_POSITIONS, prompt, N_GEN, {stop}, switch=True)
        print(f"  {rule} rule, stop id at {first}: {st['launches']} launches, {st['passes']} passes")
        assert toks == ref[: first + 1] and st["reason"] == 1
        assert cached == PROMPT + first, "every token before the stop id is in the cache, the stop id not"


def test_drafts_take_the_positions_that_fit(model):
    """Where the positions asked do not fit a block's shared memory (here: a 32-block grid's larger shares, on
    which Qwen3-1.7B fits four of five), the backend builds the most that do, and they keep the plain tokens
    on a prompt that repeats itself."""
    if model["name"] != "qwen3-1.7b":
        pytest.skip("a 32-block grid refuses five positions on Qwen3-1.7B")
    gpu = CudaBackend(model["lm"], 1024, draft_positions=DRAFT_POSITIONS, defines={"KOG_NBLK": "32"})
    try:
        assert 2 <= gpu.pass_positions < DRAFT_POSITIONS
        half = random_prompt(model["lm"].config.vocab_size, PROMPT // 2, model["rng"])
        _check_drafts(gpu, model["hf"], half + half, "repeated")
    finally:
        gpu.close()


def test_sampler_matches_reference(model):
    """The first sampled token from the same logits, for many seeds and every processor."""
    if model["name"] != SMALL:
        pytest.skip("sampler semantics are shape-independent: checked on the small model")
    gpu, prompt = model["gpu"], model["prompt"]
    logits = _fresh(gpu, prompt)
    history = np.asarray(prompt, dtype=np.int64)
    configs = [
        dict(temperature=0.8),
        dict(temperature=1.0, top_k=40),
        dict(temperature=0.7, top_p=0.9),
        dict(temperature=1.5, min_p=0.05),
        dict(temperature=0.9, top_k=200, top_p=0.95, min_p=0.01, repetition_penalty=1.3),
        dict(temperature=4.0),  # nearly flat: large probability bins
        dict(temperature=4.0, top_p=0.5),
        dict(temperature=0.05, top_k=3),
    ]
    bad = []
    for cfg in configs:
        for seed in range(8):
            params = SamplingParams(seed=seed * 7919 + 1, **cfg)
            got = list(gpu.decode(params, prompt, 1, set()))
            assert gpu.last_status["error"] == 0 and gpu.cached_tokens == PROMPT
            expected = sample(logits, params, history, 0)
            if got != [expected]:
                bad.append((cfg, seed, got, expected))
    total = len(configs) * 8
    print(f"  sampler: {total - len(bad)}/{total} identical to the reference; approx={gpu.last_status['approx']}")
    assert not bad, f"sampler differs from the sampling rule: {bad[:4]}"


def test_same_seed_same_tokens(model):
    """Also on a shape whose residual stream meets in summed words (down split by columns: Llama),
    where the adds land in any order: their integer sums must not depend on it."""
    if model["name"] not in (SMALL, "llama-3.2-1b"):
        pytest.skip("checked on two models")
    gpu, prompt = model["gpu"], model["prompt"]
    # Llama's 128k-token vocabulary, its random logits nearly flat, can put the top-p cut in a bin
    # of more candidates than the sampler sorts at once (status 'approx'): top-k keeps it among the top
    top_k = 0 if model["name"] == SMALL else 40
    params = SamplingParams(temperature=0.8, top_p=0.95, top_k=top_k, seed=1234)
    runs = []
    for p in (params, params, dataclasses.replace(params, seed=99)):
        _fresh(gpu, prompt)
        runs.append(list(gpu.decode(p, prompt, 64, set())))
        assert gpu.last_status["error"] == 0 and gpu.last_status["approx"] == 0
    print(f"  sampled run: distinct {len(set(runs[0]))}")
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stop_ids_and_max_tokens(model):
    if model["name"] != SMALL:
        pytest.skip("checked on the small model")
    gpu, prompt = model["gpu"], model["prompt"]
    toks = _greedy(model)
    stop = toks[10]
    first = toks.index(stop)
    _fresh(gpu, prompt)
    got = list(gpu.decode(GREEDY, prompt, N_GEN, {stop}))
    assert got == toks[: first + 1] and gpu.last_status["reason"] == 1
    assert gpu.cached_tokens == PROMPT + first


def test_cancel_then_new_generation(model):
    if model["name"] not in (SMALL, "llama-3.2-1b"):
        pytest.skip("checked on two models")
    gpu, prompt = model["gpu"], model["prompt"]
    toks = _greedy(model)
    _fresh(gpu, prompt)
    got = []
    for t in gpu.decode(GREEDY, prompt, 900, set()):
        got.append(t)
        if len(got) == 10:
            gpu.cancel()
    st = gpu.last_status
    print(f"  cancelled after {len(got)} tokens (status {st})")
    assert st["error"] == 0 and st["reason"] == 4
    assert 10 <= len(got) < 900
    assert got == toks[: len(got)]
    assert gpu.cached_tokens == PROMPT + st["fed"]
    _fresh(gpu, prompt)
    again = list(gpu.decode(GREEDY, prompt, 16, set()))
    assert again == toks[:16]


def test_watchdog_timeout_is_an_error_not_a_hang(model):
    if model["name"] != SMALL:
        pytest.skip("checked on the small model")
    gpu, prompt = model["gpu"], model["prompt"]
    toks = _greedy(model)
    _fresh(gpu, prompt)
    t = time.perf_counter()
    with pytest.raises(KogError, match="watchdog"):
        list(gpu.decode(GREEDY, prompt, 16, set(), debug="hang", watchdog_s=0.05))
    assert time.perf_counter() - t < 10
    with pytest.raises(KogError):  # no logits until the next prefill
        list(gpu.decode(GREEDY, prompt, 4, set()))
    _fresh(gpu, prompt)
    assert list(gpu.decode(GREEDY, prompt, 16, set())) == toks[:16]


# A device fault ends the process's CUDA context, so it runs in a process of its own.
_FAULT_SCRIPT = """
import sys
import numpy as np
from bench.random_models import build_hf, loaded_model, random_prompt
from engine.backends.cuda import CudaBackend
from engine.backends.cuda_fault import end_process_after_fault
from engine.errors import KogError
from engine.sampling import SamplingParams
lm = loaded_model(build_hf(sys.argv[1], int(sys.argv[2])), sys.argv[1])
gpu = CudaBackend(lm, 256)
prompt = random_prompt(lm.config.vocab_size, 8, np.random.default_rng(int(sys.argv[2])))
gpu.prefill(prompt)
for attempt in ("decode", "next decode"):
    try:
        list(gpu.decode(SamplingParams(), prompt, 16, set(), debug="fault"))
        print(attempt, "ended without an error")
    except KogError as e:
        print(attempt, "KogError:", e)
try:
    gpu.prefill(prompt)
    print("prefill worked")
except KogError as e:
    print("prefill KogError:", e)
end_process_after_fault(0)  # as the kog command does
print("the process went on")
"""


def test_device_fault_is_an_error_not_a_hang(model):
    if model["name"] != SMALL:
        pytest.skip("checked on the small model")
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", _FAULT_SCRIPT, SMALL, str(model["seed"])], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    print(run.stdout, run.stderr[-2000:], f"{time.perf_counter() - t:.1f} s")
    assert run.returncode == 0
    lines = run.stdout.splitlines()
    assert len(lines) == 3 and all("KogError: the GPU faulted during decode" in ln for ln in lines)
    assert "misaligned" in lines[0].lower()
    # nor at exit, from CuPy's destructors on the dead context
    assert "Traceback" not in run.stderr and "Error in" not in run.stderr


def test_long_context_to_the_window_end(model):
    """An 8k window: a long random prompt, then decode until the context is full. On every shape:
    the attention's plan at long contexts (units per kv head, rounds, stages) differs by shape."""
    ctx = 8192
    gpu = CudaBackend(model["lm"], ctx)
    prompt = random_prompt(model["lm"].config.vocab_size, ctx - 40, model["rng"])
    _fresh(gpu, prompt)
    toks = list(gpu.decode(GREEDY, prompt, 1000, set()))
    st = gpu.last_status
    print(f"  8k window: {len(toks)} tokens, status {st}")
    assert st["error"] == 0 and st["reason"] == 3
    assert len(toks) == 40 and gpu.cached_tokens == ctx - 1
    gpu.close()  # its weights and 8k cache: room for the reference's
    ref = _hf_logits(model["hf"], prompt + toks, len(prompt) - 1)[:-1]
    _check_against(toks, ref, "transformers at 8k")


def test_attention_plan_switches(model):
    """Decode across contexts where the attention's plan changes. On Qwen2.5 a kv head's query
    heads are split over 6, then 3, then 2 blocks (ATT_RMAX in decode_common.cuh), switching at
    positions 704, 1408 and 2112, then v25's plan; on every shape the units per kv head grow there.
    Greedy tokens against transformers on each side of each switch."""
    gpu = CudaBackend(model["lm"], 2200)
    for n in (690, 1395, 2100):
        prompt = random_prompt(model["lm"].config.vocab_size, n, model["rng"])
        _fresh(gpu, prompt)
        toks = list(gpu.decode(GREEDY, prompt, 24, set()))
        assert gpu.last_status["error"] == 0 and len(toks) == 24
        ref = _hf_logits(model["hf"], prompt + toks, n - 1)[:-1]
        _check_against(toks, ref, f"transformers after a {n}-token prompt")
    gpu.close()


@pytest.mark.parametrize("name", [m for m in (SMALL, "llama-3.2-1b") if m in MODELS])
def test_untied_lm_head(name):
    """A model with an LM head of its own (the registry's Qwen2.5-Coder-7B and Qwen3-8B; the target shapes are
    all tied): SmolLM2's shape (a bf16 head) and Llama's (the int8 screen), untied, greedy tokens against
    transformers."""
    seed = (SEED + zlib.crc32(f"{name} untied".encode())) % (1 << 31)
    hf = build_hf(name, seed, device="cuda", untied=True)
    lm = loaded_model(hf, name)
    assert "lm_head.weight" in lm.weights
    gpu = CudaBackend(lm, 256)
    prompt = random_prompt(lm.config.vocab_size, PROMPT, np.random.default_rng(seed))
    _fresh(gpu, prompt)
    toks = list(gpu.decode(GREEDY, prompt, N_GEN, set()))
    assert gpu.last_status["error"] == 0 and len(toks) == N_GEN
    _check_against(toks, _hf_logits(hf, prompt + toks, PROMPT - 1)[:-1], f"transformers, untied {name}")
    gpu.close()
    del hf
    torch.cuda.empty_cache()


def test_real_default_model_matches_the_cpu_reference(default_gguf):
    """SmolLM2-135M-Instruct's real weights, a real chat prompt: 128 greedy tokens."""
    from dataclasses import replace

    from engine.loader import load_model

    real = load_model(default_gguf)
    model = replace(real, weights={k: round_to_bf16(v) for k, v in real.weights.items()})
    prompt = model.tokenizer.encode_chat([{"role": "user", "content": "Write a Python function that merges two sorted lists."}])
    gpu, cpu = CudaBackend(model, 1024), CpuBackend(model, 1024)
    gpu.poison()
    gpu.prefill(prompt)
    cpu.prefill(prompt)
    ours = list(gpu.decode(GREEDY, prompt, N_GEN, set()))
    reference = list(cpu.decode(GREEDY, prompt, N_GEN, set()))
    gpu.close()
    same = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), N_GEN)
    print(f"  real weights: first {same}/{N_GEN} greedy tokens identical: {model.tokenizer.decode(ours[:40])!r}")
    assert ours == reference


def test_real_default_model_drafts_keep_the_replies(default_gguf):
    """`kog bench --drafts`'s workload on SmolLM2's real weights: each reply decoded five positions a pass is the plain
    decode's, and the agent's fix, which copies its file, takes fewer passes than tokens."""
    from agent.workloads import PROMPTS
    from engine.benchmark import run_drafts
    from engine.loader import load_model

    runs = {r.prompt: r for r in run_drafts(load_model(default_gguf), PROMPTS, 5, 160, 1)}
    for r in runs.values():
        print(f"  {r.prompt}: {r.tokens} tokens in {r.passes + 1} passes, tokens {'identical' if r.identical else 'DIFFERENT'}")
    assert set(runs) == set(PROMPTS) and all(r.identical and r.positions == 5 for r in runs.values())
    agent = runs["agent"]
    assert agent.tokens > 16 and agent.passes < (agent.tokens - 1) * 2 / 3  # (3.9 tokens a pass over 256 tokens, H100)
