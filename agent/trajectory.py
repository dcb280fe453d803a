"""The run's log: one JSON object per line, appended and flushed as each thing happens.

Records, by "type": "start" (repository, model, options, test command, the system
message), "tests" (a test run outside a step: the first one), "step" (the exact messages
sent, the model's output, the parsed actions or the format error, each tool result, the
tests after the edits, generation stats, timings), "end" (the summary, diff included).
A crash leaves every record up to it on disk; `kog agent replay` renders any prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import KogError


class Trajectory:
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as e:
            raise KogError(f"cannot write the log {path}: {e.strerror}") from None

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read(path: Path) -> list[dict]:
    path = Path(path)
    try:
        # (a log cut inside a character still reads: the cut line is dropped below)
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise KogError(f"no such log: {path}") from None
    except OSError as e:
        raise KogError(f"cannot read {path}: {e.strerror or e}") from None
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if records and number == len(lines) and not text.endswith("\n"):
                break  # the record being written when the run stopped: the prefix before it stands
            raise KogError(f"{path}:{number} is not a JSON line; is this a kog agent log?") from None
        if not isinstance(record, dict) or "type" not in record:
            raise KogError(f"{path}:{number} is not a kog agent record")
        records.append(record)
    if not records:
        raise KogError(f"{path} is empty")
    return records
