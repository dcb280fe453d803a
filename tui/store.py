"""Chats on disk: one SQLite file under the data dir, with a versioned schema.

Every message is committed on its own as it completes, so a crash loses at most the reply in
flight. A file SQLite cannot read is moved aside (never deleted: it is the user's history) and a
fresh one takes its place; `notice` then says where the old one went.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine.errors import KogError

# MIGRATIONS[i] takes the schema from version i to i + 1; the version lives in PRAGMA user_version.
MIGRATIONS = [
    [
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL,
            system TEXT,
            created REAL NOT NULL,
            updated REAL NOT NULL
        )""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            stats TEXT,
            created REAL NOT NULL
        )""",
        "CREATE INDEX messages_by_conversation ON messages(conversation_id, id)",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)
TITLE_CHARS = 60


def default_path() -> Path:
    return paths.data_dir() / "chats.db"


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str
    system: str | None
    created: float
    updated: float
    message_count: int


@dataclass(frozen=True)
class StoredMessage:
    role: str
    content: str
    stats: dict | None  # the reply's GenerationStats.as_dict(), for assistant messages


class ChatStore:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.notice: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._db = self._open()
            except sqlite3.OperationalError:
                raise  # locked, unreadable, disk full: the file itself may be fine, so leave it be
            except sqlite3.DatabaseError as e:  # not a database, or a damaged one
                backup = self._move_aside()
                kept = f"the chat history {self.path} could not be read ({e}); it was kept as {backup}"
                try:
                    self._db = self._open()
                except (OSError, sqlite3.Error) as e:  # (a full disk): the next start would not say where it went
                    raise KogError(f"{kept}, but a new one could not be started: {e}") from None
                self.notice = f"{kept} and a new one started"
        except (OSError, sqlite3.Error) as e:
            raise KogError(f"cannot open the chat history {self.path}: {e}") from None

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)  # autocommit; transactions are explicit
        # text another program (or a flipped bit) left in a legacy encoding must not hide every other chat
        db.text_factory = lambda data: data.decode("utf-8", "replace")
        try:
            db.execute("PRAGMA foreign_keys = ON")
            # quick_check reads every page, so damage deep in the file is found now, not mid-chat.
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("database disk image is malformed")
            self._migrate(db)
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"conversations", "messages"} <= tables:  # a version number over a schema that is not there
                raise sqlite3.DatabaseError(f"its schema lacks the tables of version {SCHEMA_VERSION}")
        except BaseException:
            db.close()
            raise
        return db

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise KogError(
                f"the chat history {self.path} has schema version {version}, newer than this kog "
                f"understands ({SCHEMA_VERSION}): upgrade kog"
            )
        if version == SCHEMA_VERSION:
            return
        with _transaction(db):
            # read again under the write lock: another kog opening the same new file may have migrated it meanwhile
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[target - 1]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")

    def _move_aside(self) -> Path:
        stem = f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
        backup, n = self.path.with_name(stem), 2
        while backup.exists():
            backup, n = self.path.with_name(f"{stem}-{n}"), n + 1
        os.replace(self.path, backup)
        for suffix in ("-wal", "-shm", "-journal"):  # they belong to the old file, not the new one
            sidecar = self.path.with_name(self.path.name + suffix)
            if sidecar.exists():
                os.replace(sidecar, backup.with_name(backup.name + suffix))
        return backup

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        try:
            with _transaction(self._db):
                yield self._db
        except sqlite3.Error as e:
            raise KogError(f"could not save to the chat history {self.path}: {e}") from None

    def create(self, model: str, system: str | None) -> int:
        now = time.time()
        with self._writing() as db:
            cursor = db.execute(
                "INSERT INTO conversations (model, system, created, updated) VALUES (?, ?, ?, ?)",
                (model, system, now, now),
            )
        return cursor.lastrowid

    def add_message(self, conversation_id: int, role: str, content: str, stats: dict | None = None) -> None:
        now = time.time()
        with self._writing() as db:
            db.execute(
                "INSERT INTO messages (conversation_id, role, content, stats, created) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, json.dumps(stats) if stats is not None else None, now),
            )
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
            if role == "user":  # the first user message names the chat
                title = " ".join(content.split())[:TITLE_CHARS]
                db.execute("UPDATE conversations SET title = ? WHERE id = ? AND title = ''", (title, conversation_id))

    def update(self, conversation_id: int, *, model: str | None = None, system: str | None = None) -> None:
        with self._writing() as db:
            if model is not None:
                db.execute("UPDATE conversations SET model = ? WHERE id = ?", (model, conversation_id))
            if system is not None:
                db.execute("UPDATE conversations SET system = ? WHERE id = ?", (system or None, conversation_id))

    def clear(self, conversation_id: int) -> None:
        with self._writing() as db:
            db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            # the title is the first message's words: forgotten with it, and taken from the next one
            db.execute("UPDATE conversations SET title = '' WHERE id = ?", (conversation_id,))

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        try:
            yield self._db
        except sqlite3.Error as e:  # locked by another program, or damaged since it was opened
            raise KogError(f"could not read the chat history {self.path}: {e}") from None

    def get(self, conversation_id: int) -> Conversation:
        with self._reading() as db:
            try:
                row = db.execute(_SELECT + "WHERE c.id = ? GROUP BY c.id", (conversation_id,)).fetchone()
            except OverflowError:  # an id wider than SQLite's integers names no chat
                row = None
        if row is None:
            raise KogError(f"no chat with id {conversation_id} in {self.path}")
        return Conversation(*row)

    def latest(self) -> Conversation | None:
        found = self.conversations()
        return found[0] if found else None

    def conversations(self) -> list[Conversation]:
        """Most recently updated first; chats that never got a message are left out."""
        with self._reading() as db:
            rows = db.execute(_SELECT + "GROUP BY c.id HAVING COUNT(m.id) > 0 ORDER BY c.updated DESC, c.id DESC").fetchall()
        return [Conversation(*row) for row in rows]

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        with self._reading() as db:
            rows = db.execute(
                "SELECT role, content, stats FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
            ).fetchall()
        return [StoredMessage(role, content, _stats(stats)) for role, content, stats in rows]


def _stats(text: str | None) -> dict | None:
    """A message's stats; damaged ones read as none, since they only annotate the message."""
    try:
        stats = json.loads(text) if text else None
    except ValueError:
        return None
    return stats if isinstance(stats, dict) else None


_SELECT = """SELECT c.id, c.title, c.model, c.system, c.created, c.updated, COUNT(m.id)
    FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id """


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")  # a COMMIT that fails (a reader's lock, a full disk) leaves the transaction open
    except BaseException:
        if db.in_transaction:  # (SQLite may have rolled it back itself)
            db.execute("ROLLBACK")
        raise
