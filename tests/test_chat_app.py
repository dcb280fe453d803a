"""`kog chat` through Textual's Pilot: the real default model on the CPU backend, and a synthetic
token stream (a test double, see chat_helpers) where the UI itself is under test."""

from __future__ import annotations

import asyncio
import threading
import time

from chat_helpers import (
    SYNTHETIC_MODEL,
    SyntheticTokenSource,
    chat_app,
    errors,
    last_reply,
    loaded,
    reply_ids,
    run,
    send,
    shown_messages,
    synthetic_opener,
    wait_for,
    wait_ready,
    wait_reply,
)

from textual.widgets import OptionList, Static

from tui.screens.chats import ChatList
from tui.screens.confirm import Confirm
from tui.screens.models import ModelPicker
from tui.screens.code import CodeView
from tui.store import ChatStore
from tui.widgets.conversation import MessageView
from tui.widgets.prompt import PromptInput

# Markdown with prose, a list and a code block, so the streamed view re-parses every kind of block.
STREAM_TEXT = """## Reversing a list

Python offers *three* common ways, each with its own trade-offs:

1. `reversed(xs)` gives an iterator and copies nothing.
2. `xs[::-1]` builds a new list.
3. `xs.reverse()` works in place.

```python
def reverse(xs: list[int]) -> list[int]:
    out = []
    for x in xs:
        out.insert(0, x)  # quadratic, but plain
    return out
```

"""


def test_ui_keeps_up_with_a_5000_tok_s_stream(default_gguf, tmp_path):
    model = loaded(default_gguf)
    rate = 5000.0
    text = STREAM_TEXT * 70
    ids = reply_ids(model, text)
    assert len(ids) >= 8000  # about two seconds of stream
    sources = []

    def source(model):
        sources.append(SyntheticTokenSource(model, ids, rate))
        return sources[-1]

    async def scenario():
        app = chat_app(tmp_path / "chats.db", synthetic_opener(model, source), max_tokens=len(ids))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_ready(pilot, app)
            # Posted rather than typed: Pilot's key presses wait for the app to go idle.
            app.prompt.post_message(PromptInput.Submitted("Show me how to reverse a list."))
            await wait_for(pilot, lambda: app.generation, 10, "the reply to start")
            shown_lengths = set()
            while app.generation is not None:  # the view grows while the stream runs
                shown_lengths.add(len(last_reply(app).text))
                await asyncio.sleep(0.02)  # not pilot.pause(), which forces extra screen updates
            await wait_for(pilot, lambda: app.status.info.state == "ready", 10, "the reply to be finished")
            await pilot.pause(0)  # and painted
            lag = time.perf_counter() - sources[0].finished_at
            stats = app._last_stats
            return shown_lengths, lag, stats, app.status.info, str(app.status.render()), app.messages, last_reply(app)

    shown_lengths, lag, stats, info, status_line, messages, reply = run(scenario())
    assert stats.generated_tokens == len(ids) and stats.stop_reason == "stop"
    assert messages[-1] == {"role": "assistant", "content": text}  # complete and exact
    assert reply.text == text and reply.finished
    assert len(shown_lengths) >= 3, "the reply was not shown while it streamed"
    assert lag < 3.0, f"the UI finished {lag:.2f} s after the stream"
    # the UI may take the interpreter from the source's thread now and then, but never for long
    assert stats.decode_tok_s > 0.6 * rate, f"the UI held the stream back to {stats.decode_tok_s:.0f} tok/s"
    # the rate shown is the source's own, within 5%
    assert abs(info.decode_tok_s - stats.decode_tok_s) / stats.decode_tok_s < 0.05
    assert f"decode {info.decode_tok_s:,.0f} tok/s" in status_line


def test_view_follows_the_stream_only_from_the_bottom(default_gguf, tmp_path):
    model = loaded(default_gguf)
    ids = reply_ids(model, STREAM_TEXT * 20)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, ids, 400.0))

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener, max_tokens=len(ids))
        async with app.run_test(size=(100, 24)) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "go")
            view = app.conversation
            await wait_for(pilot, lambda: view.max_scroll_y > 10, 30, "the reply to overflow the view")
            assert view.scroll_y >= view.max_scroll_y - 1  # following the stream
            view.scroll_home(animate=False)  # the user scrolls up to read
            grown = view.max_scroll_y
            await wait_for(pilot, lambda: view.max_scroll_y > grown + 10, 30, "more text")
            assert view.scroll_y == 0, "new text pulled the view away from where the user was reading"
            view.scroll_end(animate=False)  # back at the bottom: following again
            grown = view.max_scroll_y
            await wait_for(pilot, lambda: view.max_scroll_y > grown + 10, 30, "more text")
            assert view.scroll_y >= view.max_scroll_y - 1
            await pilot.press("escape")
            await wait_reply(pilot, app)

    run(scenario())


def test_reply_streams_with_live_rate_reuses_the_cache_and_resumes(default_gguf, tmp_path):
    db = tmp_path / "chats.db"

    async def first_run():
        app = chat_app(db, device="cpu", max_tokens=8)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "Name a primary color.")
            # (streaming itself is measured by the 5,000 tok/s test; an 8-token reply can end
            # between two refreshes of a busy machine)
            await wait_for(pilot, lambda: last_reply(app).text, 120, "the reply text")
            await wait_reply(pilot, app)
            first = app._last_stats
            assert first.generated_tokens > 0 and app.messages[-1]["content"]
            assert app.status.info.decode_tok_s > 0 and "tok/s" in str(app.status.render())

            await send(pilot, app, "And another one?")
            await wait_reply(pilot, app)
            second = app._last_stats
            # the first turn's tokens were not prefilled again
            assert second.reused_tokens >= first.prompt_tokens
            assert app.status.info.reused_tokens == second.reused_tokens
            assert f"({second.reused_tokens:,} reused)" in str(app.status.render())
            shown = shown_messages(app)
            await pilot.press("ctrl+q")
        return app.chat_id, shown

    chat_id, shown = run(first_run())
    assert [role for role, _ in shown] == ["user", "assistant", "user", "assistant"]

    async def resumed():
        app = chat_app(db, device="cpu", resume=chat_id)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            return shown_messages(app), app.messages

    shown_again, messages = run(resumed())
    assert shown_again == shown
    assert [(m["role"], m["content"]) for m in messages] == shown


def test_escape_stops_at_once_and_keeps_the_partial_reply(default_gguf, tmp_path):
    async def scenario():
        app = chat_app(tmp_path / "chats.db", device="cpu", max_tokens=200)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "Write a long story about a dragon who learns to code.")
            await wait_for(pilot, lambda: app.generation and app.generation.stats.generated_tokens >= 3, 120, "tokens")
            generation = app.generation
            at_escape = generation.stats.generated_tokens
            await pilot.press("escape")
            await wait_reply(pilot, app, timeout=30)
            stopped = generation.stats
            assert stopped.stop_reason == "cancelled"
            assert stopped.generated_tokens <= at_escape + 2
            partial = app.messages[-1]["content"]
            assert partial and partial == generation.text == last_reply(app).text
            assert "stopped" in str(last_reply(app).query_one("Label").render())
            assert app.store.messages(app.chat_id)[-1].content == partial

            # (a reply long enough that Ctrl+C below finds it still streaming)
            await send(pilot, app, "Thanks. Now write another long story, about a cat who learns to sail.")
            await wait_for(pilot, lambda: app.generation and app.generation.stats.generated_tokens, 60, "a token")
            # the history, partial reply included, came from the cache
            assert app.generation.stats.reused_tokens >= stopped.prompt_tokens + stopped.generated_tokens - 2
            await pilot.press("ctrl+c")  # stops a reply too
            await wait_reply(pilot, app, timeout=30)
            assert app._last_stats.stop_reason == "cancelled"
            return app.chat_id

    chat_id = run(scenario())

    async def resumed():  # the stopped replies still say so
        app = chat_app(tmp_path / "chats.db", device="cpu", resume=chat_id)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            return [str(v.query_one("Label").render()) for v in app.query(MessageView) if v.role == "assistant"]

    titles = run(resumed())  # (the second stop may come before any text: then it left no reply)
    assert titles and set(titles) == {"kog · stopped"}


def test_a_prompt_longer_than_the_context_is_refused_and_kept(default_gguf, tmp_path):
    async def scenario():
        app = chat_app(tmp_path / "chats.db", device="cpu", context=64)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            long_prompt = "word " * 200
            await send(pilot, app, long_prompt)
            await wait_for(pilot, lambda: errors(app), 10, "an error line")
            assert "context holds 64" in errors(app)[0]
            assert app.prompt.text == long_prompt  # nothing the user typed is lost
            assert app.generation is None and app.messages == []
            await send(pilot, app, "/help")  # still running, still answering
            await wait_for(pilot, lambda: "/export PATH" in app.conversation.query("NoticeView").last().text, 10)

    run(scenario())


def test_context_above_the_models_maximum_is_a_notice_and_the_chat_runs(default_gguf, tmp_path):
    async def scenario():
        app = chat_app(tmp_path / "chats.db", device="cpu", context=100_000)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            notes = [n.message for n in app._notifications]
            assert any("holds at most 8,192 tokens of context" in n for n in notes), notes
            assert app.session.context_size == 8192

    run(scenario())


def test_unknown_model_is_an_error_line_and_the_current_model_stays(default_gguf, tmp_path):
    async def scenario():
        app = chat_app(tmp_path / "chats.db", device="cpu")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            session = app.session
            await send(pilot, app, "/model smollm2-135m-instruc")
            await wait_for(pilot, lambda: errors(app), 20, "an error line")
            assert "unknown model 'smollm2-135m-instruc'" in errors(app)[0]
            assert "did you mean smollm2-135m-instruct" in errors(app)[0]
            assert app.session is session and app.loading is None

    run(scenario())


def test_a_model_named_on_the_command_line_that_cannot_load_ends_the_app_with_its_error(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")

    async def scenario():
        app = chat_app(tmp_path / "chats.db", device="cpu", model=str(broken))
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.startup_error, 20, "the load to fail")
        assert "corrupt or truncated GGUF file" in app.startup_error and app.return_code == 1

    run(scenario())


def test_a_model_that_fails_after_a_declined_startup_download_is_only_an_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")

    async def scenario():
        app = chat_app(tmp_path / "chats.db", device="cpu", model="qwen3-0.6b")  # not installed: the app asks
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, Confirm), 10, "the question")
            await pilot.press("n")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, 10, "the question to close")
            await send(pilot, app, f"/model {broken}")
            await wait_for(pilot, lambda: errors(app), 20, "the load to fail")
            assert app.startup_error is None and app.is_running  # typed in the app: the app goes on

    run(scenario())


def test_slash_commands_end_to_end(default_gguf, tmp_path, monkeypatch):
    model = loaded(default_gguf)
    reply = "Here:\n\n```python\nprint('hi')\n```\n"
    ids = reply_ids(model, reply)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, ids, 2000.0))
    monkeypatch.setenv("PATH", str(tmp_path))  # no clipboard tool to be found
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener, system="Be brief.")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "/temp 0.7")
            assert app.params.temperature == 0.7
            await send(pilot, app, "Print hi in Python.")
            await wait_reply(pilot, app)
            first_chat = app.chat_id
            assert app.store.get(first_chat).system == "Be brief."

            await send(pilot, app, "/copy")  # no clipboard here: the code is shown to select
            await wait_for(pilot, lambda: isinstance(app.screen, CodeView), 10, "the code view")
            assert app.screen.code == "print('hi')\n" and app.clipboard == "print('hi')\n"
            await pilot.press("escape")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, 10, "the code view to close")

            await send(pilot, app, f"/export {tmp_path / 'chat.md'}")
            await wait_for(pilot, lambda: (tmp_path / "chat.md").exists(), 10, "the export")
            exported = (tmp_path / "chat.md").read_text()
            assert "## System\n\nBe brief." in exported and "Print hi in Python." in exported and reply in exported
            await send(pilot, app, f"/export {tmp_path / 'chat.md'}")  # never over the user's file
            await wait_for(pilot, lambda: errors(app), 10, "an error line")
            assert "already exists" in errors(app)[-1]

            assert app.status.info.context_tokens > 0
            await send(pilot, app, "/new")
            await wait_for(pilot, lambda: not shown_messages(app), 10, "an empty chat")
            await wait_for(pilot, lambda: app.status.info.context_tokens == 0, 10, "an empty context shown")
            await send(pilot, app, "/system Answer in French.")
            await send(pilot, app, "Again.")
            await wait_reply(pilot, app)
            second_chat = app.chat_id
            assert second_chat != first_chat and app.store.get(second_chat).system == "Answer in French."

            await send(pilot, app, "/chats")  # open the first chat from the list
            await wait_for(pilot, lambda: isinstance(app.screen, ChatList), 10, "the chat list")
            assert [c.id for c in app.screen.chats] == [second_chat, first_chat]
            await pilot.press("down", "enter")
            await wait_for(pilot, lambda: app.chat_id == first_chat, 10, "the first chat")
            assert shown_messages(app)[0] == ("user", "Print hi in Python.") and app.system == "Be brief."
            conversation = [{"role": "system", "content": "Be brief."}] + app.messages
            size = len(app.session.model.tokenizer.encode_chat(conversation, add_generation_prompt=False))
            await wait_for(pilot, lambda: app.status.info.context_tokens == size, 10, "the opened chat's size")

            await send(pilot, app, "/clear")  # asks first: "n" keeps everything
            await wait_for(pilot, lambda: isinstance(app.screen, Confirm), 10, "the question")
            await pilot.press("n")
            await wait_for(pilot, lambda: not isinstance(app.screen, Confirm), 10, "the question to close")
            assert shown_messages(app) and app.store.messages(first_chat)
            await send(pilot, app, "/clear")
            await wait_for(pilot, lambda: isinstance(app.screen, Confirm), 10, "the question")
            await pilot.press("y")
            await wait_for(pilot, lambda: not shown_messages(app), 10, "the chat to clear")
            assert app.messages == [] and app.store.messages(first_chat) == []
            await wait_for(pilot, lambda: app.status.info.context_tokens == 0, 10, "an empty context shown")

    run(scenario())


def test_a_corrupt_history_is_reported_in_the_app(default_gguf, tmp_path):
    model = loaded(default_gguf)
    db = tmp_path / "chats.db"
    db.write_bytes(b"not a database, but the user's history all the same" * 100)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))

    async def scenario():
        app = chat_app(db, opener)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            return errors(app)

    shown = run(scenario())
    backups = list(tmp_path.glob("chats.db.corrupt-*"))
    expected = (f"the chat history {db} could not be read (file is not a database); "
                f"it was kept as {backups[0]} and a new one started")
    assert len(backups) == 1 and shown == [expected]


def test_an_engine_failure_is_a_message_and_the_app_keeps_going(default_gguf, tmp_path):
    model = loaded(default_gguf)
    class FailingSource(SyntheticTokenSource):
        def decode(self, *args):
            yield from super().decode(*args)
            raise RuntimeError("device lost")

    ids = reply_ids(model, "partial answer")[:-1]
    opener = synthetic_opener(model, lambda m: FailingSource(m, ids, 1000.0))

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "hi")
            await wait_reply(pilot, app)
            assert errors(app) == ["the engine failed: RuntimeError: device lost"]
            assert app.messages[-1] == {"role": "assistant", "content": "partial answer"}
            await send(pilot, app, "again")  # the next turn works
            await wait_reply(pilot, app)
            assert len(errors(app)) == 2 and len(app.messages) == 4

    run(scenario())


def test_quitting_mid_reply_keeps_the_partial_reply(default_gguf, tmp_path):
    model = loaded(default_gguf)
    ids = reply_ids(model, STREAM_TEXT * 20)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, ids, 200.0))
    db = tmp_path / "chats.db"

    async def scenario():
        app = chat_app(db, opener, max_tokens=len(ids))
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await pilot.press("escape", "ctrl+c")  # with no reply to stop, these do nothing
            assert app.is_running and len(app.screen_stack) == 1
            await pilot.press("a", "ctrl+j", "b")  # a new line, not a send
            assert app.prompt.text == "a\nb" and not app.messages
            await send(pilot, app, "go")
            await wait_for(pilot, lambda: app.generation and app.generation.stats.generated_tokens > 20, 30, "tokens")
            await pilot.press("ctrl+q")
        return app.chat_id

    chat_id = run(scenario())
    saved = ChatStore(db).messages(chat_id)
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].stats["stop_reason"] == "cancelled" and STREAM_TEXT.startswith(saved[1].content[:20])


def test_a_message_sent_while_another_model_loads_waits_for_it(default_gguf, tmp_path):
    model = loaded(default_gguf)
    ids = reply_ids(model, "Hello there.")
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, ids, 1000.0))
    release, opened = threading.Event(), []

    def slow_second_load(*args):
        if opened:
            release.wait(30)
        opened.append(args[0])
        return opener(*args)

    async def scenario():
        app = chat_app(tmp_path / "chats.db", slow_second_load)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "Hi.")
            await wait_reply(pilot, app)
            await send(pilot, app, "/model another-model")
            await wait_for(pilot, lambda: app.loading, 10, "the load to start")
            await send(pilot, app, "Still there?")  # the old model is about to be closed: not now
            await pilot.pause(0.1)
            notes = [n.message for n in app._notifications]
            assert app.generation is None and "the model is still loading (another-model)" in notes
            assert app.prompt.text == "Still there?" and len(app.messages) == 2
            release.set()
            await wait_for(pilot, lambda: not app.loading, 10, "the load to end")
            assert app._last_stats is None  # the last model's rates are not shown beside the new one's name
            await send(pilot, app, "Still there?")
            await wait_reply(pilot, app)
            assert [m["role"] for m in app.messages] == ["user", "assistant"] * 2  # the history kept

            await send(pilot, app, "/system Stop after [/INST]")  # user text in a notice is text, not markup
            await wait_for(pilot, lambda: app.system == "Stop after [/INST]", 10, "the system message")
            await send(pilot, app, "Code:\n    x = <div>")
            await wait_reply(pilot, app)
            shown = str(app.conversation.query(MessageView).filter(".-user").last().query(Static).last().render())
            assert shown == "Code:\n    x = <div>"  # as typed: lines, indentation and tags kept

    run(scenario())


def test_a_chat_with_a_model_from_a_path_resumes_with_it(default_gguf, tmp_path):
    model = loaded(default_gguf)  # loaded by path: no registry name to find it by
    ids = reply_ids(model, "Hello there.")
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, ids, 1000.0))
    targets = []

    def recording(*args):
        targets.append(args[0])
        return opener(*args)

    async def chat(**options):
        app = chat_app(tmp_path / "chats.db", recording, **options)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            if "resume" not in options:
                await send(pilot, app, "Hi.")
                await wait_reply(pilot, app)
            return app.chat_id

    chat_id = run(chat())
    assert ChatStore(tmp_path / "chats.db").get(chat_id).model == model.target == str(default_gguf.resolve())
    run(chat(model=None, resume=chat_id))
    assert targets[-1] == model.target


def test_a_terminal_a_few_columns_wide_does_not_crash_the_app(default_gguf, tmp_path):
    model = loaded(default_gguf)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))

    async def scenario(width, key):
        app = chat_app(tmp_path / "chats.db", opener)
        async with app.run_test(size=(width, 20)) as pilot:
            await wait_ready(pilot, app)
            await pilot.press(key)  # the models or chats dialog
            await pilot.pause(0.1)
            return app.is_running

    for width in (1, 3, 8):
        for key in ("ctrl+t", "ctrl+o"):
            assert run(scenario(width, key))


def screen_text(app) -> str:
    """Every character the screen would send to the terminal, styles left out."""
    return "".join(segment.text for strip in app.screen._compositor.render_update(full=True).strips for segment in strip)


def test_control_characters_in_a_chat_never_reach_the_terminal(default_gguf, tmp_path, monkeypatch):
    model = loaded(default_gguf)
    # ESC ] 2 retitles the terminal window, ESC [ 2J wipes the screen, SO swaps the character set
    reply = "Done \x1b[2J.\n\n```\nx = 1\x1b]2;title\x1b\\\n```\n"
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, reply_ids(m, reply), 1000.0))
    store = ChatStore(tmp_path / "chats.db")
    saved = store.create(SYNTHETIC_MODEL, None)
    store.add_message(saved, "user", "Say \x1b]2;pwned\x1b\\ \x0eit")
    store.add_message(saved, "assistant", "Said \x9b31m it.")
    store.close()
    monkeypatch.setenv("PATH", str(tmp_path))  # no clipboard tool: Ctrl+B shows the code
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener, resume=saved)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "Again.")
            await wait_reply(pilot, app)
            assert "\x1b[2J" in app.messages[-1]["content"]  # the text itself is kept, only its display differs
            shown = [screen_text(app)]
            await pilot.press("ctrl+b")
            await wait_for(pilot, lambda: isinstance(app.screen, CodeView), 10, "the code view")
            shown.append(screen_text(app))
            await pilot.press("escape", "ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatList), 10, "the chat list")
            shown.append(screen_text(app))
            return shown

    for screen in run(scenario()):
        assert not set(screen) & {"\x1b", "\x0e", "\x9b"}
    assert [m.content for m in ChatStore(tmp_path / "chats.db").messages(saved)][0] == "Say \x1b]2;pwned\x1b\\ \x0eit"


def test_control_characters_in_a_notification_never_reach_the_terminal(default_gguf, tmp_path):
    model = loaded(default_gguf)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))
    store = ChatStore(tmp_path / "chats.db")
    saved = store.create(SYNTHETIC_MODEL, None)
    store.add_message(saved, "user", "Hi.")
    store.close()
    system = "Be \x1b]2;pwned\x1b\\ brief."  # as `kog chat --resume --system "$(cat file)"` may pass it

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener, resume=saved, system=system)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            assert app.system == system
            return [n.message for n in app._notifications]  # (toasts are not drawn under Pilot)

    assert run(scenario()) == ["system message: Be \u241b]2;pwned\u241b\\ brief."]


def test_picking_the_model_in_use_keeps_it_loaded(default_gguf, tmp_path):
    async def scenario():
        app = chat_app(tmp_path / "chats.db", device="cpu")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            session = app.session
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), 10, "the picker")
            options = app.screen.query_one(OptionList)
            options.highlighted = options.get_option_index(session.model.target)
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, 10, "the picker to close")
            await pilot.pause()
            # not loaded again: that would drop the cache and the last reply's rates
            assert app.session is session and app.loading is None
            assert f"{session.model.target} is already in use" in [n.message for n in app._notifications]

    run(scenario())


def test_the_chat_asks_the_engine_for_drafted_passes(default_gguf, tmp_path):
    """--drafts reaches the engine (default: 1 off CUDA), and a GPU that fits fewer positions a pass says so."""
    model = loaded(default_gguf)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, reply_ids(model, "Hi."), 1000.0))
    asked = []

    def recording(*args):
        asked.append(args[4])
        return opener(*args)  # (a source that runs one position a pass)

    async def scenario(drafts):
        app = chat_app(tmp_path / f"chats-{drafts}.db", recording, device="cpu", drafts=drafts)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            return [n.message for n in app._notifications]

    assert not any("drafted passes" in note for note in run(scenario(None)))
    assert any(note.endswith("decoding one position a pass, not 4") for note in run(scenario(4)))
    assert asked == [1, 4]
