"""What the loop needs from a model, whichever serves it: a streamed reply with live stats.

Two clients implement it: `LocalClient` (the engine's Session, in process) and
`OpenAIClient` (any OpenAI-compatible endpoint over HTTP). The loop sees only this.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


@dataclass
class ReplyStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens the model already had cached (local prefix reuse)
    generated_tokens: int = 0
    ttft_s: float = 0.0  # request to first token
    decode_s: float = 0.0  # first token to last
    stop_reason: str = ""

    @property
    def decode_tok_s(self) -> float:
        return (self.generated_tokens - 1) / self.decode_s if self.decode_s > 0 and self.generated_tokens > 1 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens, "reused_tokens": self.reused_tokens,
            "generated_tokens": self.generated_tokens, "ttft_s": self.ttft_s, "decode_s": self.decode_s,
            "decode_tok_s": self.decode_tok_s, "stop_reason": self.stop_reason,
        }


class Reply(Protocol):
    """Iterate for text pieces as they arrive; `stats` is live while it runs."""

    stats: ReplyStats

    def __iter__(self) -> Iterator[str]: ...

    def cancel(self) -> None: ...


class ModelClient(Protocol):
    name: str
    context_size: int  # tokens the prompt and the reply share

    def count_tokens(self, text: str) -> int: ...

    def prompt_tokens(self, system: str, messages: list[dict]) -> int:
        """What sending this conversation would cost in tokens (exact locally, estimated over HTTP)."""

    def generate(self, system: str, messages: list[dict], max_tokens: int, deadline: float | None = None) -> Reply:
        """`deadline` (a time.perf_counter() value): the reply ends by then, cancelled, even where no text comes."""
