"""`Session`: one conversation, its KV cache, and generation as a stream of token events.

Every front end (chat UI, agent, CLI, benchmark) talks to the engine only through this
module. A new turn renders the whole conversation, finds the longest prefix already in the
KV cache and prefills only the rest — the agent re-sends long contexts every step, so this
is where most of its prompt time goes away. Editing history is just rendering a different
conversation: the cache is cut back to the first differing token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from engine.backends.base import Backend
from engine.errors import KogError
from engine.model import LoadedModel
from engine.sampling import SamplingParams
from engine.tokenizer import IncrementalDecoder


@dataclass(frozen=True)
class TokenEvent:
    id: int
    text: str  # the newly completed text; "" while a multi-byte character is incomplete
    time: float  # time.perf_counter() when the token reached the host


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose K/V were already cached
    prefill_tokens: int = 0  # prompt tokens run through the model: the rest, or fewer where a cancel stopped it
    generated_tokens: int = 0
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0  # first token to last token
    stop_reason: str = ""  # "stop" | "length" | "context" | "cancelled"
    decode_passes: int = 0  # passes through the model after the first token (drafts: fewer than the tokens after it)
    token_latencies_s: list[float] = field(default_factory=list, repr=False)

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return len(self.token_latencies_s) / self.decode_s if self.decode_s > 0 else 0.0

    def latency_ms(self, percentile: float) -> float:
        if not self.token_latencies_s:
            return 0.0
        return float(np.percentile(self.token_latencies_s, percentile)) * 1e3

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["token_latencies_s"]
        d |= {
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "latency_p50_ms": self.latency_ms(50),
            "latency_p99_ms": self.latency_ms(99),
        }
        return d


class Generation:
    """An iterator of `TokenEvent`s; `stats` and `text` are live while it runs."""

    def __init__(
        self,
        session: "Session",
        prompt_ids: list[int],
        params: SamplingParams,
        max_tokens: int,
        requested_tokens: int,
        on_done: Callable[["Generation"], None] | None,
        stop_ids: set[int],
    ):
        self._session = session
        self._prompt_ids = prompt_ids
        self._params = params
        self._max_tokens = max_tokens  # requested_tokens, capped by the room left in the context
        self._requested_tokens = requested_tokens
        self._on_done = on_done
        self._stop_ids = stop_ids
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self.token_ids: list[int] = []
        self.text = ""
        self._started = False
        # here, not as the stream starts: a cancel from now on stops it, even one before its thread has begun
        session.backend.reset_cancel()

    def __iter__(self) -> Iterator[TokenEvent]:
        if self._started:
            raise RuntimeError("a Generation can be iterated once")
        self._started = True
        return self._run()

    def cancel(self) -> None:
        """Stop within one token; safe from any thread."""
        self._session.backend.cancel()

    def _run(self) -> Iterator[TokenEvent]:
        session, backend, stats = self._session, self._session.backend, self.stats
        tokenizer = session.model.tokenizer
        stop_ids = self._stop_ids
        decoder = IncrementalDecoder(tokenizer, skip_special_tokens=True)
        last = None
        stats.stop_reason = "cancelled"
        try:
            start = time.perf_counter()
            stats.reused_tokens = session._prepare_cache(self._prompt_ids)
            backend.prefill(self._prompt_ids[stats.reused_tokens :])
            stats.prefill_s = time.perf_counter() - start
            stats.prefill_tokens = backend.cached_tokens - stats.reused_tokens
            for token in backend.decode(self._params, self._prompt_ids, self._max_tokens, stop_ids):
                now = time.perf_counter()
                if last is None:
                    stats.ttft_s = now - start
                else:
                    stats.token_latencies_s.append(now - last)
                    stats.decode_s = now - (start + stats.ttft_s)
                last = now
                self.token_ids.append(token)
                stats.generated_tokens = len(self.token_ids)
                piece = "" if token in stop_ids else decoder.push(token)
                self.text += piece
                yield TokenEvent(token, piece, now)
                if token in stop_ids:
                    stats.stop_reason = "stop"
            stats.decode_passes = backend.decode_passes
            tail = decoder.flush()
            if tail:
                self.text += tail
                yield TokenEvent(-1, tail, time.perf_counter())
            if stats.stop_reason != "stop" and len(self.token_ids) >= self._max_tokens:
                stats.stop_reason = "length" if self._max_tokens == self._requested_tokens else "context"
        finally:
            session._cached_ids = (self._prompt_ids + self.token_ids)[: backend.cached_tokens]
            if self._on_done is not None:
                self._on_done(self)


class Session:
    """One conversation with one model on one backend."""

    def __init__(self, model: LoadedModel, backend: Backend, system: str | None = None):
        self.model = model
        self.backend = backend
        self.system = system
        self.messages: list[dict] = []
        self._cached_ids: list[int] = []  # the token ids whose K/V the backend holds

    @property
    def context_size(self) -> int:
        return self.backend.max_context

    @property
    def context_tokens(self) -> int:
        return len(self._cached_ids)

    def conversation(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def send(self, text: str, params: SamplingParams = SamplingParams(), max_tokens: int = 512) -> Generation:
        """Add a user turn and answer it; the reply joins `messages` when the stream ends."""
        conversation = self.conversation() + [{"role": "user", "content": text}]
        prompt = self.model.tokenizer.encode_chat(conversation, add_generation_prompt=True)
        reply = lambda g: self.messages.append({"role": "assistant", "content": g.text})  # noqa: E731
        generation = self._generate(prompt, params, max_tokens, on_done=reply)
        self.messages.append({"role": "user", "content": text})
        return generation

    def complete(
        self,
        prompt_ids: list[int],
        params: SamplingParams = SamplingParams(),
        max_tokens: int = 512,
        stop_at_eos: bool = True,
    ) -> Generation:
        """Continue raw token ids (no chat template); prefix reuse applies all the same.

        `stop_at_eos=False` generates exactly max_tokens (benchmarks need a fixed length)."""
        return self._generate(list(prompt_ids), params, max_tokens, stop_ids=None if stop_at_eos else set())

    def set_messages(self, messages: list[dict]) -> None:
        """Replace the history (edit, undo, /clear); the cache is cut back lazily on the next turn."""
        self.messages = list(messages)

    def _generate(self, prompt: list[int], params: SamplingParams, max_tokens: int, on_done=None, stop_ids=None) -> Generation:
        if not prompt:
            raise KogError("empty prompt")
        room = self.context_size - len(prompt)
        if room < 1:
            raise KogError(f"the prompt is {len(prompt)} tokens but the context holds {self.context_size}")
        if max_tokens < 1:
            raise KogError(f"max tokens must be >= 1, got {max_tokens}")
        stops = self.model.stop_ids if stop_ids is None else stop_ids
        return Generation(self, prompt, params, min(max_tokens, room), max_tokens, on_done, stops)

    def _prepare_cache(self, prompt: list[int]) -> int:
        """Cut the cache back to the longest prefix it shares with `prompt`; return its length."""
        limit = min(len(self._cached_ids), len(prompt) - 1)  # prefill at least one token for logits
        common = 0
        while common < limit and self._cached_ids[common] == prompt[common]:
            common += 1
        self.backend.truncate(common)
        self._cached_ids = self._cached_ids[:common]
        return common
