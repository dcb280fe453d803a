"""`kog chat` as users start it: a real process, and a real terminal (tmux) for the full screen."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from engine import paths

KOG = [sys.executable, "-m", "kogcli"]


def kog(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*KOG, *args], capture_output=True, text=True, timeout=120, env=os.environ | env)


@pytest.fixture
def home(tmp_path):
    """A KOG_HOME of its own for the chats, sharing the models already pulled."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "cache").symlink_to(paths.cache_dir(), target_is_directory=True)
    return home


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "smollm2-135m-instruc"], "did you mean smollm2-135m-instruct"),
        (["--resume", "999"], "no chat with id 999"),
        (["--resume"], "there is no saved chat to resume"),
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    ],
)
def test_command_line_mistakes_are_one_line(home, args, message):
    result = kog("chat", *args, env={"KOG_HOME": str(home)})
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == f"error: {message}" or (
        result.stderr.count("\n") == 1 and message in result.stderr and result.stderr.startswith("error:"))
    assert "Traceback" not in result.stderr


class Tmux:
    """One tmux server on a private socket, so nothing else's sessions are touched."""

    def __init__(self, name: str):
        self.base = ["tmux", "-L", name]

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=30)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "chat").stdout

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.screen())
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} never appeared; the screen:\n{self.screen()}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_chat_in_a_real_terminal(default_gguf, home, tmp_path):
    rc_file = tmp_path / "rc"
    chat = shlex.join(["env", f"KOG_HOME={home}", *KOG, "chat", "--device", "cpu", "--max-tokens", "8"])
    tmux = Tmux(f"kog-test-{os.getpid()}")
    try:
        started = tmux("new-session", "-d", "-s", "chat", "-x", "110", "-y", "30", f"{chat}; echo $? > {rc_file}")
        assert started.returncode == 0, started.stderr
        tmux.wait_for(r"ready │[\s\S]*smollm2-135m-instruct", 60)  # the status line may wrap
        tmux("send-keys", "-t", "chat", "-l", "Name a primary color.")
        tmux("send-keys", "-t", "chat", "Enter")
        tmux.wait_for(r"(?m)^\s*you\s*$", 10)
        rate = tmux.wait_for(r"ready │ decode ([\d.,]+) tok/s", 120)
        assert float(rate.group(1).replace(",", "")) > 0
        screen = tmux.screen()
        reply = screen.split("kog", 1)[1].split("▊")[0].strip()  # between the reply's label and the input box
        assert reply and "Name a primary color." in screen
        tmux("send-keys", "-t", "chat", "C-q")
        deadline = time.monotonic() + 20
        while not rc_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rc_file.read_text().strip() == "0"
    finally:
        tmux("kill-server")
