"""The chat's parts that need no screen: the SQLite store, Markdown export, slash commands,
code-block extraction and the status line."""

from __future__ import annotations

import functools
import os
import sqlite3

import pytest
from pathlib import Path

from engine.errors import KogError
from tui import commands
from tui.clipboard import last_code_block
from tui.export import to_markdown, write_new
from tui.store import SCHEMA_VERSION, ChatStore
from tui.widgets.conversation import settled_length
from tui.widgets.status import StatusInfo, render_status


def test_messages_are_committed_as_they_complete(tmp_path):
    db = tmp_path / "chats.db"
    store = ChatStore(db)
    chat = store.create("smollm2-135m-instruct", "Be brief.")
    store.add_message(chat, "user", "Name   a\ncolor.")
    store.add_message(chat, "assistant", "Red.", {"decode_tok_s": 20.5})
    # a second connection, as after a crash, sees both without any close or flush
    other = sqlite3.connect(db)
    assert other.execute("SELECT role, content FROM messages ORDER BY id").fetchall() == [
        ("user", "Name   a\ncolor."), ("assistant", "Red.")]
    assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    other.close()
    got = store.get(chat)
    assert (got.title, got.model, got.system) == ("Name a color.", "smollm2-135m-instruct", "Be brief.")
    assert got.message_count == 2
    assert [m.stats for m in store.messages(chat)] == [None, {"decode_tok_s": 20.5}]
    store.close()


def test_chats_are_listed_newest_first_without_empty_ones(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    first, empty, second = store.create("m", None), store.create("m", None), store.create("m", None)
    store.add_message(first, "user", "one")
    store.add_message(second, "user", "two")
    store.add_message(first, "assistant", "again")  # first is now the latest
    assert [c.id for c in store.conversations()] == [first, second]
    assert store.latest().id == first
    store.clear(first)
    assert [c.id for c in store.conversations()] == [second]
    assert store.get(first).title == ""  # the cleared first message named it: the name goes too
    store.add_message(first, "user", "three")
    assert store.get(first).title == "three"
    store.clear(first)
    assert store.get(empty).message_count == 0
    with pytest.raises(KogError, match="no chat with id 999"):
        store.get(999)


def test_a_corrupt_history_is_kept_aside_and_a_fresh_one_started(tmp_path):
    db = tmp_path / "chats.db"
    garbage = os.urandom(4096)
    db.write_bytes(garbage)
    store = ChatStore(db)
    backups = list(tmp_path.glob("chats.db.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == garbage  # the user's file, untouched
    assert str(backups[0]) in store.notice and "new one" in store.notice
    chat = store.create("m", None)
    store.add_message(chat, "user", "works")
    assert store.messages(chat)[0].content == "works"
    store.close()
    assert ChatStore(db).notice is None  # the fresh file is sound


def test_a_corrupt_history_that_cannot_be_replaced_says_where_it_was_kept(tmp_path, monkeypatch):
    db = tmp_path / "chats.db"
    db.write_bytes(b"not a database" * 100)
    real_open, opened = ChatStore._open, []

    def open_on_a_full_disk(store):
        opened.append(None)
        if len(opened) > 1:  # the fresh file, once the corrupt one is moved aside
            raise sqlite3.OperationalError("database or disk is full")
        return real_open(store)

    monkeypatch.setattr(ChatStore, "_open", open_on_a_full_disk)
    with pytest.raises(KogError) as raised:
        ChatStore(db)
    backups = list(tmp_path.glob("chats.db.corrupt-*"))
    assert len(backups) == 1 and str(raised.value) == (
        f"the chat history {db} could not be read (file is not a database); it was kept as {backups[0]}, "
        "but a new one could not be started: database or disk is full")


def test_a_damaged_page_is_found_at_open(tmp_path):
    db = tmp_path / "chats.db"
    store = ChatStore(db)
    chat = store.create("m", None)
    for i in range(200):
        store.add_message(chat, "user", f"message {i} " + "x" * 200)
    store.close()
    data = bytearray(db.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 512] = os.urandom(512)  # past the header, inside the tables
    db.write_bytes(bytes(data))
    reopened = ChatStore(db)
    assert reopened.notice is not None and reopened.conversations() == []


def test_a_version_without_its_tables_is_kept_aside(tmp_path):
    db = tmp_path / "chats.db"
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")  # the number, but none of the tables
    con.close()
    store = ChatStore(db)
    assert "lacks the tables" in store.notice and len(list(tmp_path.glob("chats.db.corrupt-*"))) == 1
    assert store.conversations() == []


def test_text_that_is_not_utf8_hides_no_chat(tmp_path):
    db = tmp_path / "chats.db"
    store = ChatStore(db)
    good, bad = store.create("m", None), store.create("m", None)
    store.add_message(good, "user", "good")
    store.add_message(bad, "user", "café")
    store._db.execute("UPDATE conversations SET title = CAST(X'636166e9' AS TEXT) WHERE id = ?", (bad,))  # latin-1
    store._db.execute("UPDATE messages SET content = CAST(X'636166e9' AS TEXT) WHERE conversation_id = ?", (bad,))
    store.close()
    store = ChatStore(db)
    assert [c.title for c in store.conversations()] == ["caf\ufffd", "good"]
    assert store.messages(bad)[0].content == "caf\ufffd"
    store.close()


def test_damaged_stats_read_as_none(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    chat = store.create("m", None)
    for stats in ('{"stop_reason": "sto', "[1]", '{"stop_reason": "length"}'):
        store.add_message(chat, "assistant", "reply", {})
        store._db.execute("UPDATE messages SET stats = ? WHERE id = (SELECT MAX(id) FROM messages)", (stats,))
    assert [m.stats for m in store.messages(chat)] == [None, None, {"stop_reason": "length"}]
    store.close()


def test_a_history_that_cannot_be_opened_is_left_alone(tmp_path):
    (tmp_path / "chats.db").mkdir()  # sqlite cannot open a directory, which is no sign of corruption
    with pytest.raises(KogError, match="cannot open the chat history"):
        ChatStore(tmp_path / "chats.db")
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_history_from_a_newer_kog_is_left_alone(tmp_path):
    db = tmp_path / "chats.db"
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(KogError, match="newer than this kog"):
        ChatStore(db)
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_export_writes_markdown_atomically_and_never_overwrites(tmp_path):
    text = to_markdown("Colors", "smollm2", "Be brief.", [
        {"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "```\nred\n```"}])
    assert text.startswith("# Colors\n") and "## System\n\nBe brief." in text
    assert text.index("## User\n\nName a color.") < text.index("## Assistant\n\n```\nred\n```")
    path = write_new(tmp_path / "chat.md", text)
    assert path.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.md"]  # no temporary left behind
    path.write_text("the user's own notes")
    with pytest.raises(KogError, match="already exists"):
        write_new(path, text)
    assert path.read_text() == "the user's own notes"
    with pytest.raises(KogError, match="no such directory"):
        write_new(tmp_path / "missing" / "chat.md", text)
    with pytest.raises(KogError, match="cannot write .*File name too long"):  # a check that cannot even stat it
        write_new(tmp_path / ("a" * 300 + ".md"), text)
    longest = tmp_path / ("a" * 252 + ".md")  # 255 bytes: the longest name there is, its temporary one too
    assert write_new(longest, text).read_text() == text
    with pytest.raises(KogError, match="no home folder found"):
        write_new(Path("~no-such-user-of-kog/chat.md"), text)


def test_a_history_another_program_locks_is_an_error_not_a_crash(tmp_path):
    db = tmp_path / "chats.db"
    store = ChatStore(db)
    chat = store.create("m", None)
    store.add_message(chat, "user", "hi")
    store._db.execute("PRAGMA busy_timeout = 100")  # not the 5 s a user would wait
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        for read in (lambda: store.get(chat), store.conversations, lambda: store.messages(chat)):
            with pytest.raises(KogError, match="could not read the chat history .*locked"):
                read()
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.messages(chat)[0].content == "hi"
    with pytest.raises(KogError, match="no chat with id 99999999999999999999999"):
        store.get(99999999999999999999999)
    store.close()


def test_a_save_that_cannot_commit_leaves_the_history_writable(tmp_path):
    db = tmp_path / "chats.db"
    store = ChatStore(db)
    chat = store.create("m", None)
    store._db.execute("PRAGMA busy_timeout = 100")
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM messages").fetchall()  # its shared lock lets the write start but not commit
    try:
        with pytest.raises(KogError, match="could not save to the chat history .*locked"):
            store.add_message(chat, "user", "lost")
    finally:
        reader.execute("ROLLBACK")
        reader.close()
    store.add_message(chat, "user", "saved")  # the failed write left no transaction behind to block this one
    store.close()
    assert [m.content for m in ChatStore(db).messages(chat)] == ["saved"]


def test_two_kogs_opening_a_new_history_at_once_both_open_it(tmp_path, monkeypatch):
    db = tmp_path / "chats.db"
    others = []

    class Racing(sqlite3.Connection):
        def execute(self, sql, *args):
            if sql == "BEGIN IMMEDIATE" and not others:  # the other kog migrates between this one's look and its lock
                others.append(None)
                others[0] = ChatStore(db)
            return super().execute(sql, *args)

    monkeypatch.setattr(sqlite3, "connect", functools.partial(sqlite3.connect, factory=Racing))
    store = ChatStore(db)
    assert others[0].conversations() == store.conversations() == []
    chat = store.create("m", None)
    store.add_message(chat, "user", "hi")
    assert others[0].messages(chat)[0].content == "hi"
    store.close()
    others[0].close()


def test_slash_commands():
    assert commands.parse("hello /new") is None
    assert commands.parse("//etc/hosts is a file") is None
    assert commands.message_text("//etc/hosts is a file") == "/etc/hosts is a file"
    assert commands.parse("/model  qwen3-0.6b ") == commands.Command("model", "qwen3-0.6b")
    assert commands.parse("/model") == commands.Command("model", "")
    assert commands.parse("/system") == commands.Command("system", "")
    assert commands.parse("/EXPORT chat.md") == commands.Command("export", "chat.md")
    for bad, message in [("/frobnicate", "unknown command /frobnicate"), ("/temp", "/temp needs NUMBER, as in: /temp NUMBER"),
                         ("/export", "/export needs PATH"), ("/new now", "/new takes no argument")]:
        with pytest.raises(KogError, match=message):
            commands.parse(bad)
    assert commands.temperature("0.7") == 0.7
    assert str(commands.temperature("-0")) == "0.0"
    for bad in ("hot", "nan", "inf"):
        with pytest.raises(KogError, match="/temp needs"):
            commands.temperature(bad)
    help_text = commands.help_markdown()
    assert all(f"/{name}" in help_text for name in commands.COMMANDS)


def test_a_command_name_ends_at_any_white_space():
    assert commands.parse("/system\nBe brief.\nAlways.") == commands.Command("system", "Be brief.\nAlways.")
    assert commands.parse("/temp\t0.5") == commands.Command("temp", "0.5")
    with pytest.raises(KogError, match="^unknown command /; "):
        commands.parse("/")


def test_last_code_block():
    reply = "First:\n\n```python\nprint(1)\n```\n\nThen:\n\n```\nprint(2)\nprint(3)\n```\n"
    assert last_code_block(reply) == "print(2)\nprint(3)\n"
    assert last_code_block("no code `inline` only") is None


def test_streamed_markdown_settles_whole_blocks_only():
    text = "# Title\n\nA paragraph\nstill going.\n\n```python\ndef f():\n\n    return 1\n"
    cut = settled_length(text)
    assert text[:cut] == "# Title\n\nA paragraph\nstill going.\n\n"  # the open code block is not settled
    assert settled_length("one paragraph, still growing") == 0
    listing = "1. one\n\n2. two\n\n"
    assert settled_length(listing) == 0  # a list is one block until something follows it


def test_status_line():
    idle = render_status(StatusInfo("ready", model="m", backend="cpu", device="CPU (2 cores)", context_size=8192))
    assert idle == "ready │ decode – tok/s │ TTFT – │ prefill – tok/s │ ctx 0/8,192 │ m │ cpu · CPU (2 cores)"
    busy = render_status(StatusInfo("generating", decode_tok_s=1234.5, ttft_s=0.0123, prefill_tok_s=20.25,
                                    reused_tokens=1500, context_tokens=2048, context_size=8192))
    assert busy == "generating │ decode 1,234 tok/s │ TTFT 12 ms │ prefill 20.2 tok/s (1,500 reused) │ ctx 2,048/8,192"
