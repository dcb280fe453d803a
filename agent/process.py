"""Run a shell command with a time limit, and kill everything it started when time is up.

The command gets its own process group, so a timeout kills the test runner and every
child it spawned. Output goes to a temporary file rather than a pipe: a grandchild that
escaped the group and still holds the pipe open could otherwise block us forever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Non-interactive settings for anything the agent runs: no pagers, no editors, no prompts.
QUIET_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "true",
    "EDITOR": "true",
    "VISUAL": "true",
    "GIT_TERMINAL_PROMPT": "0",
    "CI": "1",
    "PYTHONDONTWRITEBYTECODE": "1",  # keep __pycache__ out of the user's tree
    "NO_COLOR": "1",
}

POLL_S = 0.1  # how often progress is reported while waiting (a wait with a timeout, not a sleep)
MAX_OUTPUT_BYTES = 4 << 20  # kept from a command's output; the model sees far less anyway
KILL_GRACE_S = 2.0  # SIGTERM first, so runners can clean up; SIGKILL after this


@dataclass
class Completed:
    command: str
    exit_code: int  # -1 when killed on timeout
    output: str  # stdout and stderr interleaved as the command wrote them
    duration_s: float
    timed_out: bool


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM the group so runners can clean up, then SIGKILL whatever is left of it."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return  # the group is empty: the command and all its children are gone
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # children that ignored SIGTERM or outlived the leader
    except ProcessLookupError:
        pass
    process.wait()


def run(
    command: str,
    cwd: Path,
    timeout_s: float,
    progress: Callable[[float, str], None] | None = None,
) -> Completed:
    """Run `command` through the shell in `cwd`; `progress(elapsed, last_line)` while it runs."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as sink:
        process = subprocess.Popen(
            command, shell=True, cwd=cwd, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True, env=os.environ | QUIET_ENV,
        )
        timed_out = False
        try:
            while True:
                elapsed = time.perf_counter() - start
                if elapsed >= timeout_s:
                    timed_out = True
                    break
                try:
                    process.wait(timeout=min(POLL_S, timeout_s - elapsed))
                    break
                except subprocess.TimeoutExpired:
                    if progress is not None:
                        progress(time.perf_counter() - start, _last_line(sink))
        finally:
            # On timeout, Ctrl-C, or a normal exit that left children behind: leave nothing running.
            _kill_group(process)
        output = _captured(sink)
    return Completed(command, -1 if timed_out else process.returncode, output, time.perf_counter() - start, timed_out)


def _read(sink, offset: int, size: int) -> bytes:
    # pread leaves the file offset alone: the child shares it and keeps writing at it.
    return os.pread(sink.fileno(), size, offset)


def _captured(sink) -> str:
    """All the output, or its head and tail when a runaway command wrote more than we keep."""
    size = os.fstat(sink.fileno()).st_size
    if size <= MAX_OUTPUT_BYTES:
        data = _read(sink, 0, size)
    else:
        keep = MAX_OUTPUT_BYTES // 2
        data = _read(sink, 0, keep) + b"\n[... output cut ...]\n" + _read(sink, size - keep, keep)
    return data.decode("utf-8", errors="replace")


def _last_line(sink) -> str:
    """The last non-empty line written so far."""
    size = os.fstat(sink.fileno()).st_size
    tail = _read(sink, max(0, size - 512), 512).decode("utf-8", errors="replace")
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""
