"""The engine's own model, in process, through `Session` only.

The loop re-sends the whole conversation every step; `Session` finds the prefix its KV
cache already holds and prefills only the new tokens, so a step costs about what its new
tool output and answer cost, not the whole history.
"""

from __future__ import annotations

from collections.abc import Iterator

from agent.client import ReplyStats
from engine.api import load, open_session
from engine.sampling import SamplingParams
from engine.session import Generation, Session


class LocalReply:
    def __init__(self, generation: Generation):
        self._generation = generation
        self.stats = ReplyStats(prompt_tokens=generation.stats.prompt_tokens)

    def __iter__(self) -> Iterator[str]:
        live = self._generation.stats
        for event in self._generation:
            self.stats.reused_tokens = live.reused_tokens
            self.stats.generated_tokens = live.generated_tokens
            self.stats.ttft_s = live.ttft_s
            self.stats.decode_s = live.decode_s
            if event.text:
                yield event.text
        self.stats.stop_reason = live.stop_reason

    def cancel(self) -> None:
        self._generation.cancel()


class LocalClient:
    def __init__(self, session: Session, name: str, params: SamplingParams = SamplingParams()):
        self.session = session
        self.name = name
        self.params = params
        self.context_size = session.context_size
        self._tokenizer = session.model.tokenizer

    @classmethod
    def open(cls, model: str | None, device: str, context: int | None, params: SamplingParams,
             draft_positions: int = 1) -> LocalClient:
        loaded = load(model)
        return cls(open_session(loaded, device=device, context=context, draft_positions=draft_positions), loaded.name, params)

    @property
    def device(self) -> str:
        return self.session.backend.device_name

    def close(self) -> None:
        self.session.backend.close()

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text))

    def prompt_tokens(self, system: str, messages: list[dict]) -> int:
        conversation = [{"role": "system", "content": system}, *messages]
        return len(self._tokenizer.encode_chat(conversation, add_generation_prompt=True))

    def generate(self, system: str, messages: list[dict], max_tokens: int, deadline: float | None = None) -> LocalReply:
        # (`deadline`: the loop checks it at every token, which the engine here never stops sending)
        self.session.system = system
        self.session.set_messages(messages[:-1])
        return LocalReply(self.session.send(messages[-1]["content"], self.params, max_tokens))
