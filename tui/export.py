"""A chat as a Markdown file, written atomically and never over a file that is already there."""

from __future__ import annotations

import time
from pathlib import Path

from engine.errors import KogError
from engine.files import write_atomic
from engine.paths import expand_user


def to_markdown(title: str, model: str, system: str | None, messages: list[dict]) -> str:
    lines = [f"# {title or 'kog chat'}", "", f"*{model} · exported {time.strftime('%Y-%m-%d %H:%M')}*", ""]
    if system:
        lines += ["## System", "", system, ""]
    for message in messages:
        lines += [f"## {message['role'].capitalize()}", "", message["content"], ""]
    return "\n".join(lines)


def write_new(path: Path, text: str) -> Path:
    """Write `text` to `path`, which must not exist yet; a crash leaves either nothing or all of it."""
    path = expand_user(path)
    try:
        if path.exists():
            raise KogError(f"{path} already exists; export to a new name (nothing was overwritten)")
        if not path.parent.is_dir():
            raise KogError(f"no such directory: {path.parent}")
        write_atomic(path, text.encode("utf-8"), overwrite=False)
    except FileExistsError:
        raise KogError(f"{path} already exists; export to a new name (nothing was overwritten)") from None
    except OSError as e:
        raise KogError(f"cannot write {path}: {e.strerror}") from None
    return path
