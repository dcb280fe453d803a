"""Writing files a user owns: all or nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from engine.paths import expand_user


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes, *, mode: int | None = None, overwrite: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then put it in place:
    readers see the old file or the new one, never half of one.

    `mode`: permission bits (default: those of the file replaced, else 0o666 less the umask).
    `overwrite=False`: raise FileExistsError rather than replace a file, even one that appears
    while writing (the file is linked into place, which fails where replacing would clobber).
    Raises OSError (KogError for a `~user` of no such user); the temporary file never outlives the call.
    """
    path = expand_user(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
    # (the name's first 32 characters: a temporary name must fit where a name of the longest length does)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".kog-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
