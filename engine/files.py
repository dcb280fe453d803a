"""Writing files a user owns: all or nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from engine.errors import KogError


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it into
    place: readers see the old file or the new one, never half of one."""
    path = Path(path).expanduser()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise KogError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
