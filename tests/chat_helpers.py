"""Shared by the chat tests: polling waits for Pilot, and a synthetic token stream.

`SyntheticTokenSource` is a TEST DOUBLE of the engine's token stream: a Backend that computes
nothing and replays given token ids at a set rate. It plugs into a real `Session`, so the text,
the stop handling and every counter the UI shows come from the engine's own code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.backends.base import Backend
from engine.model import LoadedModel
from engine.session import Session
from tui.app import ChatApp, ChatOptions
from tui.store import ChatStore
from tui.widgets.conversation import ErrorLine, MessageView, ReplyView

SYNTHETIC_MODEL = "synthetic-model"


@functools.cache
def loaded(path: Path) -> LoadedModel:
    """The model at `path`, loaded once per test run (its weights are memory-mapped). Call it
    before pointing KOG_HOME elsewhere: a GGUF's converted copy lives under the cache dir."""
    from engine.api import load

    return load(str(path), progress=False)


def run(coro):
    return asyncio.run(coro)


async def wait_for(pilot, condition: Callable[[], object], timeout: float = 60.0, what: str = "condition"):
    """Poll `condition` between UI updates until it is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; {app_state(pilot.app)}")
        await pilot.pause(0.02)


def app_state(app) -> str:
    """What a timed-out wait saw: enough to tell a stuck stream from a send that never started."""
    if not isinstance(app, ChatApp):
        return f"app {app!r}"
    generation = app.generation
    stats = generation.stats if generation is not None else app._last_stats
    notes = [n.message for n in app._notifications]
    return (
        f"generation {'running' if generation is not None else 'none'}, stats {stats}, "
        f"session {'open' if app.session else 'none'}, loading {app.loading!r}, focused {app.focused!r}, "
        f"prompt {app.prompt.text!r}, errors {errors(app)}, notifications {notes}, "
        f"messages {[m['role'] for m in app.messages]}"
    )


class SyntheticTokenSource(Backend):
    """TEST DOUBLE: replays `ids` at `rate` tokens per second, on an absolute schedule.

    Token i is due at start + i / rate; a consumer that falls behind gets the overdue tokens at
    once, so the measured rate drops below `rate` only if the consumer cannot keep up overall.
    """

    name = "synthetic"

    def __init__(self, model: LoadedModel, ids: list[int], rate: float, max_context: int = 1 << 16):
        super().__init__(model.config, max_context)
        self.ids, self.rate = list(ids), rate
        self.finished_at: float | None = None  # perf_counter() after the last token was taken

    @property
    def device_name(self) -> str:
        return "test double"

    def prefill(self, tokens: list[int]) -> np.ndarray:
        self.cached_tokens += len(tokens)
        return np.zeros(self.config.vocab_size, dtype=np.float32)

    def decode(self, params, history, max_tokens, stop_ids):
        start = time.perf_counter()
        for i, token in enumerate(self.ids[:max_tokens]):
            if self._cancel.is_set():
                return
            delay = start + i / self.rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            yield token
            self.cached_tokens += 1
        self.finished_at = time.perf_counter()


def synthetic_opener(model: LoadedModel, make_source: Callable[[LoadedModel], Backend]):
    """A session opener for ChatApp that runs `model`'s tokenizer over a synthetic source."""
    named = dataclasses.replace(model, name=SYNTHETIC_MODEL)

    def open_session(target, device, context, system, drafts):
        return Session(named, make_source(named), system=system)

    return open_session


def reply_ids(model: LoadedModel, text: str) -> list[int]:
    """The ids a model would emit to say `text` and then stop."""
    return model.tokenizer.encode(text) + [min(model.stop_ids)]


def chat_app(db: Path, opener=None, **options) -> ChatApp:
    """A ChatApp on the real engine, or on `opener` (then under a name no registry has, so that
    the app never offers to download it)."""
    if opener is None:
        return ChatApp(ChatOptions(**options), ChatStore(db))
    return ChatApp(ChatOptions(**({"model": SYNTHETIC_MODEL} | options)), ChatStore(db), session_opener=opener)


async def send(pilot, app: ChatApp, text: str) -> None:
    app.prompt.load_text(text)
    await pilot.press("enter")


async def wait_ready(pilot, app: ChatApp, timeout: float = 60.0) -> None:
    await wait_for(pilot, lambda: app.session is not None, timeout, "the model to load")


async def wait_reply(pilot, app: ChatApp, timeout: float = 120.0) -> None:
    await wait_for(pilot, lambda: app.generation is None, timeout, "the reply to finish")


def shown_messages(app: ChatApp) -> list[tuple[str, str]]:
    return [(view.role, view.text) for view in app.conversation.query(MessageView)]


def last_reply(app: ChatApp) -> ReplyView:
    return app.conversation.query(ReplyView).last()


def errors(app: ChatApp) -> list[str]:
    return [line.message for line in app.conversation.query(ErrorLine)]
