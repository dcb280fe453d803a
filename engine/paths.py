"""Where kog keeps its files: models under the XDG cache dir, chats under the XDG data dir.

`KOG_HOME` overrides both (one folder holding `cache/` and `data/`), which is also what the
tests use to stay out of the user's home.
"""

import os
from pathlib import Path

from engine.errors import KogError


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / fallback


def expand_user(path: str | Path) -> Path:
    """`path` with a leading `~` or `~user` made the home folder it names."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # no such user, or no home folder to be found
        raise KogError(f"{path}: no home folder found for its ~") from None


def cache_dir() -> Path:
    home = os.environ.get("KOG_HOME")
    return Path(home) / "cache" if home else _xdg("XDG_CACHE_HOME", ".cache") / "kog"


def data_dir() -> Path:
    home = os.environ.get("KOG_HOME")
    return Path(home) / "data" if home else _xdg("XDG_DATA_HOME", ".local/share") / "kog"


def models_dir() -> Path:
    return cache_dir() / "models"


def make_dir(path: Path) -> Path:
    """`path` as a folder, made if missing; one line of error where it cannot be (KOG_HOME a file, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KogError(f"cannot create the folder {path}: {e.strerror or e}") from None
    return path
