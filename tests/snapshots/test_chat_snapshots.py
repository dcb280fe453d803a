"""Snapshots of the chat's screens (pytest-textual-snapshot; `--snapshot-update` to accept changes).

The model is the synthetic token source (see chat_helpers), so its name and device are fixed;
KOG_HOME points at an empty folder, so which models look installed is fixed too.
"""

from __future__ import annotations

import pytest
from chat_helpers import (
    SYNTHETIC_MODEL,
    SyntheticTokenSource,
    loaded,
    send,
    synthetic_opener,
    wait_for,
    wait_ready,
)

from tui.app import ChatApp, ChatOptions
from tui.store import ChatStore

SIZE = (100, 30)
REPLY = """Use slicing, which returns a reversed copy:

```python
def reverse(xs: list[int]) -> list[int]:
    return xs[::-1]
```

`xs.reverse()` reverses **in place** instead."""


@pytest.fixture
def app(default_gguf, tmp_path, monkeypatch):
    model = loaded(default_gguf)
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    store = ChatStore(tmp_path / "chats.db")
    chat = store.create(SYNTHETIC_MODEL, None)
    store.add_message(chat, "user", "How do I reverse a list in Python?")
    store.add_message(chat, "assistant", REPLY)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))
    return ChatApp(ChatOptions(resume=chat), store, session_opener=opener)


async def ready(pilot):
    pilot.app.prompt.cursor_blink = False  # a blinking cursor makes two snapshots of one screen
    await wait_ready(pilot, pilot.app)


def test_main_screen(app, snap_compare):
    assert snap_compare(app, terminal_size=SIZE, run_before=ready)


def test_model_picker(app, snap_compare, tmp_path):
    # one hub model present, the rest (the default included) not
    (tmp_path / "home" / "cache" / "models" / "qwen3-0.6b").mkdir(parents=True)
    (tmp_path / "home" / "cache" / "models" / "qwen3-0.6b" / "config.json").write_text("{}")
    assert snap_compare(app, press=["ctrl+t"], terminal_size=SIZE, run_before=ready)


def test_error_message(app, snap_compare):
    async def bad_input(pilot):
        await ready(pilot)
        await send(pilot, pilot.app, "/temp hot")
        await send(pilot, pilot.app, "/frobnicate")
        await wait_for(pilot, lambda: len(pilot.app.conversation.query("ErrorLine")) == 2, 10, "two error lines")

    assert snap_compare(app, terminal_size=SIZE, run_before=bad_input)
