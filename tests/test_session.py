"""Session: prefix reuse, history edits, cancellation, limits, stats — on the CPU reference."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch")

from engine.api import drafts_note, open_session  # noqa: E402
from engine.errors import KogError  # noqa: E402
from engine.loader import load_model  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from tests.conftest import make_tiny_model  # noqa: E402


@pytest.fixture
def tiny(tmp_path, seed):
    make_tiny_model(tmp_path, "llama", seed)
    return load_model(tmp_path)


def run(generation) -> list[int]:
    for _ in generation:
        pass
    return generation.token_ids


def test_second_turn_reuses_the_cache_and_matches_a_fresh_prefill(tiny):
    session = open_session(tiny, device="cpu", context=512, system="be brief")
    run(session.send("hello world", max_tokens=12))
    second = session.send("the quick brown fox", max_tokens=12)
    reused_tokens = run(second)
    assert second.stats.reused_tokens > 0
    assert second.stats.prefill_tokens < second.stats.prompt_tokens

    fresh = open_session(tiny, device="cpu", context=512, system="be brief")
    fresh.set_messages(session.messages[:-2])
    fresh_second = fresh.send("the quick brown fox", max_tokens=12)
    assert run(fresh_second) == reused_tokens
    assert fresh_second.stats.reused_tokens == 0


def test_editing_history_cuts_the_cache_back(tiny):
    session = open_session(tiny, device="cpu", context=512)
    run(session.send("hello world", max_tokens=8))
    run(session.send("def f(x): return x", max_tokens=8))
    session.set_messages(session.messages[:2])  # drop the second exchange, ask something else
    edited = session.send("lazy dog", max_tokens=10)
    tokens = run(edited)
    assert 0 < edited.stats.reused_tokens < edited.stats.prompt_tokens

    fresh = open_session(tiny, device="cpu", context=512)
    fresh.set_messages(session.messages[:2])
    assert run(fresh.send("lazy dog", max_tokens=10)) == tokens


def test_raw_completion_reuses_a_shared_prefix(tiny, seed):
    prompt = np.random.default_rng(seed).integers(0, 300, 40).tolist()
    session = open_session(tiny, device="cpu", context=512)
    run(session.complete(prompt, max_tokens=5))
    edited = prompt[:30] + [(prompt[30] + 1) % 300, 8, 9]  # differs from token 30 on, whatever the seed
    again = session.complete(edited, max_tokens=20)
    tokens = run(again)
    assert again.stats.reused_tokens == 30
    fresh = open_session(tiny, device="cpu", context=512)
    assert run(fresh.complete(edited, max_tokens=20)) == tokens


def test_cancel_from_another_thread_then_generate_again(tiny, seed):
    session = open_session(tiny, device="cpu", context=512)
    generation = session.complete([1, 2, 3], max_tokens=400, stop_at_eos=False)
    seen = []
    for event in generation:
        seen.append(event.id)
        if len(seen) == 5:
            threading.Thread(target=generation.cancel).start()
    assert 5 <= len(seen) < 400
    assert generation.stats.stop_reason == "cancelled"
    follow_up = session.complete([1, 2, 3, 4], max_tokens=6, stop_at_eos=False)
    assert len(run(follow_up)) == 6
    assert follow_up.stats.stop_reason == "length"


def test_stop_token_ends_the_reply(tiny, monkeypatch):
    free = run(open_session(tiny, device="cpu", context=512).complete([1, 2, 3], max_tokens=10, stop_at_eos=False))
    stop = free[4]  # declare a token the model is about to produce a stop token
    monkeypatch.setattr(tiny.tokenizer, "stop_ids", {stop})
    monkeypatch.setattr(tiny.config, "eos_token_ids", [])
    generation = open_session(tiny, device="cpu", context=512).complete([1, 2, 3], max_tokens=10)
    events = list(generation)
    assert generation.token_ids == free[: free.index(stop) + 1]
    assert generation.stats.stop_reason == "stop"
    assert [e.text for e in events if e.id == stop] == [""]


def test_prompt_longer_than_the_context(tiny):
    session = open_session(tiny, device="cpu", context=32)
    with pytest.raises(KogError, match="context holds 32"):
        session.complete(list(range(40)))


def test_generation_stops_at_the_end_of_the_context(tiny):
    session = open_session(tiny, device="cpu", context=32)
    generation = session.complete(list(range(20)), max_tokens=100, stop_at_eos=False)
    assert len(run(generation)) == 12
    assert generation.stats.stop_reason == "context"


def test_a_context_too_large_for_memory_says_to_shrink_it(tiny):
    from engine.backends.cpu import CpuBackend

    with pytest.raises(KogError, match=r"out of memory for the KV cache of a 10,000,000,000,000-token context .*--context"):
        CpuBackend(tiny, 10**13)


def test_stats_are_filled(tiny):
    session = open_session(tiny, device="cpu", context=256)
    generation = session.complete(list(range(10)), max_tokens=20, stop_at_eos=False)
    events = list(generation)
    stats = generation.stats.as_dict()
    assert stats["generated_tokens"] == 20 == len([e for e in events if e.id >= 0])
    assert stats["prompt_tokens"] == 10 and stats["reused_tokens"] == 0
    assert stats["ttft_s"] > 0 and stats["decode_tok_s"] > 0 and stats["prefill_tok_s"] > 0
    assert 0 < stats["latency_p50_ms"] <= stats["latency_p99_ms"]
    assert stats["decode_passes"] == 19, "one pass a token after the prefill's (CPU: no drafts)"
    assert "".join(e.text for e in events) == generation.text
    times = [e.time for e in events]
    assert times == sorted(times)


def test_same_seed_same_sampled_reply(tiny):
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=1234)
    first = run(open_session(tiny, device="cpu", context=256).complete([5, 6, 7], params, max_tokens=30))
    second = run(open_session(tiny, device="cpu", context=256).complete([5, 6, 7], params, max_tokens=30))
    assert first == second


def test_a_cancel_during_prefill_stops_the_generation(tiny):
    session = open_session(tiny, device="cpu", context=512)
    generation = session.complete(list(range(200)), max_tokens=50, stop_at_eos=False)
    events = iter(generation)
    real_prefill = session.backend.prefill

    def prefill_then_cancel(tokens):
        logits = real_prefill(tokens)
        generation.cancel()  # as if the user pressed Esc while the prompt was being read
        return logits

    session.backend.prefill = prefill_then_cancel
    assert list(events) == []
    assert generation.stats.stop_reason == "cancelled"
    session.backend.prefill = real_prefill
    assert len(run(session.complete([1, 2, 3], max_tokens=4, stop_at_eos=False))) == 4


def test_a_cancel_before_the_stream_starts_is_kept(tiny):
    session = open_session(tiny, device="cpu", context=512)
    generation = session.complete(list(range(3, 200)), max_tokens=50, stop_at_eos=False)
    generation.cancel()  # Esc before the thread that reads the stream has begun
    assert run(generation) == [] and generation.stats.stop_reason == "cancelled"
    assert generation.stats.prefill_tokens == 0
    assert len(run(session.complete([1, 2, 3], max_tokens=4, stop_at_eos=False))) == 4  # the next one runs


def test_a_cancel_stops_a_long_prefill_within_a_chunk(tiny):
    session = open_session(tiny, device="cpu", context=1024)
    generation = session.complete([3 + i % 300 for i in range(900)], max_tokens=5, stop_at_eos=False)
    events = iter(generation)
    backend, real_forward, chunks = session.backend, session.backend._forward, []

    def forward_then_cancel(tokens):
        chunks.append(len(tokens))
        if len(chunks) == 2:
            generation.cancel()  # Esc while the second chunk of the prompt is read
        return real_forward(tokens)

    backend._forward = forward_then_cancel
    assert list(events) == [] and generation.stats.stop_reason == "cancelled"
    assert len(chunks) == 2 and backend.cached_tokens == sum(chunks)
    assert generation.stats.prefill_tokens == sum(chunks) < generation.stats.prompt_tokens  # the rate is of those read
    backend._forward = real_forward
    # what was read stays cached, and the next turn goes on from it
    again = session.complete([3 + i % 300 for i in range(900)], max_tokens=3, stop_at_eos=False)
    assert len(run(again)) == 3 and again.stats.reused_tokens == sum(chunks)


def test_drafts_note_says_when_fewer_positions_a_pass_run():
    """The front ends' line where the GPU fits fewer positions a drafted pass than --drafts asked; none otherwise."""
    assert drafts_note("qwen3-8b", 5, 5) is None and drafts_note("qwen3-8b", 1, 1) is None
    assert drafts_note("qwen3-8b", 5, 3).endswith("using 3, not 5")
    assert drafts_note("qwen3-8b", 5, 1).endswith("decoding one position a pass, not 5")


def test_drafts_default_only_where_the_decode_checks_drafts():
    """The front ends' --drafts where none is given: the drafts' build only for greedy decoding without a repetition
    penalty on CUDA (a sampled or penalized decode runs the plain build, so its compile would be for nothing)."""
    from engine.backends import DEFAULT_DRAFTS, resolve_drafts

    assert resolve_drafts(None, "cuda", SamplingParams()) == DEFAULT_DRAFTS > 1
    assert resolve_drafts(None, "cpu", SamplingParams()) == 1
    assert resolve_drafts(None, "cuda", SamplingParams(temperature=0.7)) == 1
    assert resolve_drafts(None, "cuda", SamplingParams(repetition_penalty=1.1)) == 1
    assert resolve_drafts(3, "cuda", SamplingParams(temperature=0.7)) == 3  # (asked: as asked)
