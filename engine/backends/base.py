"""The interface every compute backend implements; `Session` is its only caller.

A backend owns the weights on its device and one KV cache. `cached_tokens` is the number
of positions whose keys and values are in the cache; `prefill` appends to it, `truncate`
cuts it back (prefix reuse), and `decode` runs the sample → forward loop, yielding token
ids as they are sampled, until a stop id, `max_tokens`, the context's end, or `cancel()`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator

import numpy as np

from engine.config import ModelConfig
from engine.sampling import SamplingParams


class Backend(ABC):
    name: str  # "cpu", "cuda", ...
    weight_bytes: int  # bytes per weight as the backend stores them (for bytes-per-token figures)
    kv_bytes: int  # bytes per cached key/value element
    greedy_bytes_saved = 0  # bytes a greedy decode step reads fewer than every weight (cuda: the LM head's screen)
    decode_passes = 0  # passes through the model the last decode ran (cuda's drafts: a pass may yield several tokens)
    pass_positions = 1  # positions a greedy decode pass runs (cuda's drafts: up to draft_positions)

    def __init__(self, config: ModelConfig, max_context: int):
        self.config = config
        self.max_context = max_context
        self.cached_tokens = 0
        self._cancel = threading.Event()

    @property
    @abstractmethod
    def device_name(self) -> str:
        """Human-readable device, e.g. 'NVIDIA H200' or 'CPU (2 cores)'."""

    @abstractmethod
    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Run `tokens` at positions cached_tokens.., append their K/V; return the last fp32 logits."""

    @abstractmethod
    def decode(
        self,
        params: SamplingParams,
        history: list[int],
        max_tokens: int,
        stop_ids: set[int],
    ) -> Iterator[int]:
        """Sample from the logits of the last prefill step and continue.

        `history` is every token id in the context (for the repetition penalty). Yielded tokens
        are fed back, so the KV cache always holds the first `cached_tokens` ids of
        history + yielded (the stream's last token is usually not fed). The stream ends after a
        stop id (yielded), `max_tokens` tokens, the context's end, or cancel().
        """

    def truncate(self, length: int) -> None:
        """Forget cached positions >= length (the history was edited or diverged)."""
        self.cached_tokens = min(self.cached_tokens, length)

    def cancel(self) -> None:
        """Stop the current generation within one token; safe to call from any thread. A cancel
        that arrives during prefill makes the following decode yield nothing."""
        self._cancel.set()

    def reset_cancel(self) -> None:
        """Forget an earlier cancel: called as a generation is made, before its stream starts."""
        self._cancel.clear()

    def close(self) -> None:
        """Release device memory."""
