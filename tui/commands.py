"""Slash commands: what the user can type besides a message, parsed into (name, argument)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from engine.errors import KogError

# name -> (argument shown in /help or "", whether the argument is required, what it does)
COMMANDS = {
    "new": ("", False, "start a new chat (this one stays in the list)"),
    "chats": ("", False, "open a saved chat"),
    "model": ("[NAME]", False, "switch model; without NAME, pick one from the list"),
    "system": ("TEXT", False, "set the system message (empty clears it)"),
    "temp": ("NUMBER", True, "sampling temperature, 0 = greedy"),
    "clear": ("", False, "forget this chat's messages (asks first)"),
    "export": ("PATH", True, "save this chat as Markdown"),
    "copy": ("", False, "copy the last code block of the last reply"),
    "help": ("", False, "this list"),
}


@dataclass(frozen=True)
class Command:
    name: str
    arg: str


def parse(text: str) -> Command | None:
    """The command in `text`, or None when it is a message ("//..." sends a message starting with "/")."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    # the name ends at any white space: "/system", Shift+Enter, then a system message of several lines
    name, arg = re.fullmatch(r"/(\S*)\s*(.*)", text, re.DOTALL).groups()
    name, arg = name.lower(), arg.strip()
    if name not in COMMANDS:
        raise KogError(f"unknown command /{name}; /help lists the commands")
    usage, required, _ = COMMANDS[name]
    if required and not arg:
        raise KogError(f"/{name} needs {usage}, as in: /{name} {usage}")
    if not usage and arg:
        raise KogError(f"/{name} takes no argument")
    return Command(name, arg)


def message_text(text: str) -> str:
    """What a typed line sends as a message: "//x" is the escape for "/x"."""
    return text[1:] if text.startswith("//") else text


def temperature(arg: str) -> float:
    """The number in `/temp NUMBER`; SamplingParams checks its range."""
    try:
        value = float(arg)
    except ValueError:
        raise KogError(f"/temp needs a number, got {arg!r}") from None
    if not math.isfinite(value):
        raise KogError(f"/temp needs a finite number, got {arg!r}")
    return value + 0.0  # (-0 is 0: "temperature -0" would read as a mistake)


def help_markdown() -> str:
    rows = [f"| `/{name}{' ' + usage if usage else ''}` | {what} |" for name, (usage, _, what) in COMMANDS.items()]
    keys = [
        "| Enter | send |", "| Shift+Enter, Ctrl+J | new line |", "| Esc, Ctrl+C | stop the reply |",
        "| Ctrl+N | new chat |", "| Ctrl+O | saved chats |", "| Ctrl+T | models |",
        "| Ctrl+B | copy the last code block |", "| Ctrl+Q | quit |",
    ]
    return "\n".join(["| command | what it does |", "| --- | --- |", *rows, "", "| key | |", "| --- | --- |", *keys])
