"""The one format the model answers in, and its parser.

An answer is free text (the model's reasoning, ignored) with one or more actions. An
action starts on its own line with `@` and a tool name; arguments follow on that line:

    @list_files [DIR]
    @read_file PATH [START-END]        1-based, inclusive line numbers
    @search REGEX                      the rest of the line; Python syntax
    @run_tests
    @run_command COMMAND               the rest of the line (only with --allow-shell)
    @edit PATH                         then one or more blocks:
    <<<<<<< SEARCH
    lines copied from the file
    =======
    the lines to put in their place
    >>>>>>> REPLACE
    @edit PATH                         or a fenced block: the whole new file
    ```
    entire file
    ```
    @create_file PATH                  then a fenced block with the new file's contents

Documented tolerances, nothing more: a path may be wrapped in backticks or quotes; the
marker lines may have 5 to 9 of their characters; a ``` fence line right around a group of
SEARCH/REPLACE blocks is ignored; a fenced body ends at the first fence line at least as
long as its opening one (so a file may contain shorter fences). Anything else malformed
rejects the whole answer — nothing in it runs — and the error goes back to the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOLS = ("list_files", "read_file", "search", "run_tests", "run_command", "edit", "create_file")
HEADER = re.compile(r"^@(" + "|".join(TOOLS) + r")(?:[ \t]+(.*?))?\s*$")
SEARCH = re.compile(r"^<{5,9} ?SEARCH\s*$")
DIVIDER = re.compile(r"^={5,9}\s*$")
REPLACE = re.compile(r"^>{5,9} ?REPLACE\s*$")
FENCE = re.compile(r"^(`{3,}|~{3,})[\w+.-]*\s*$")
RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")


@dataclass(frozen=True)
class Action:
    tool: str
    path: str = ""
    arg: str = ""  # list_files: the folder; read_file: "START-END"; search: the regex; run_command: the command
    blocks: tuple[tuple[str, str], ...] = ()  # edit: (search, replace) pairs
    body: str | None = None  # edit (whole file) and create_file: the new contents

    @property
    def writes(self) -> bool:
        return self.tool in ("edit", "create_file")

    def describe(self) -> str:
        """One line, for the display and the log."""
        head = " ".join(p for p in (f"@{self.tool}", self.path, self.arg) if p)
        if self.blocks:
            return f"{head} ({len(self.blocks)} block{'s' * (len(self.blocks) > 1)})"
        if self.body is not None:
            return f"{head} ({len(self.body.splitlines())} lines)"
        return head

    def as_dict(self) -> dict:
        d = {"tool": self.tool, "path": self.path, "arg": self.arg}
        if self.blocks:
            d["blocks"] = [list(b) for b in self.blocks]
        if self.body is not None:
            d["body"] = self.body
        return d


class FormatError(Exception):
    """The answer does not follow the format; the message says where and how."""


def parse(answer: str) -> list[Action]:
    lines = answer.splitlines()
    actions: list[Action] = []
    i = 0
    while i < len(lines):
        header = HEADER.match(lines[i])
        if not header:
            i += 1
            continue
        tool, args = header.group(1), header.group(2) or ""
        where = f"line {i + 1} (@{tool})"
        action, i = _parse_action(tool, args, lines, i + 1, where)
        actions.append(action)
    if not actions:
        raise FormatError("no action found; put each action on its own line starting with @, e.g. `@read_file app.py`")
    return actions


def _parse_action(tool: str, args: str, lines: list[str], i: int, where: str) -> tuple[Action, int]:
    if tool == "run_tests":
        if args:
            raise FormatError(f"{where}: takes no arguments")
        return Action(tool), i
    if tool in ("search", "run_command"):
        if not args:
            raise FormatError(f"{where}: needs {'a regex' if tool == 'search' else 'a command'} on the same line")
        return Action(tool, arg=args), i
    if tool == "list_files":
        words = args.split()
        if len(words) > 1:
            raise FormatError(f"{where}: takes at most one folder")
        return Action(tool, arg=_unquote(words[0]) if words else ""), i
    words = args.split()
    if not words:
        raise FormatError(f"{where}: needs a path on the same line")
    path = _unquote(words[0])
    if tool == "read_file":
        span = " ".join(words[1:])
        if span:
            match = RANGE.match(span)
            if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
                raise FormatError(f"{where}: the line range must be START-END with 1 <= START <= END, got {span!r}")
        return Action(tool, path=path, arg=span.replace(" ", "")), i
    if len(words) > 1:
        raise FormatError(f"{where}: takes only a path on its line; the content goes on the lines below")
    i = _skip_blank(lines, i)
    if tool == "edit" and i < len(lines) and (SEARCH.match(lines[i]) or _fenced_blocks_follow(lines, i)):
        blocks, i = _parse_blocks(lines, i, where)
        return Action(tool, path=path, blocks=tuple(blocks)), i
    if i < len(lines) and FENCE.match(lines[i]):
        body, i = _parse_fenced(lines, i, where)
        return Action(tool, path=path, body=body), i
    expected = "SEARCH/REPLACE blocks or a ``` fenced file" if tool == "edit" else "a ``` fenced block with the contents"
    raise FormatError(f"{where}: expected {expected} on the lines after the header")


def _unquote(word: str) -> str:
    return word.strip("`'\"")


def _skip_blank(lines: list[str], i: int) -> int:
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


def _fenced_blocks_follow(lines: list[str], i: int) -> bool:
    return bool(FENCE.match(lines[i])) and i + 1 < len(lines) and bool(SEARCH.match(lines[i + 1]))


def _parse_blocks(lines: list[str], i: int, where: str) -> tuple[list[tuple[str, str]], int]:
    fenced = bool(FENCE.match(lines[i]))
    i += fenced
    blocks = []
    while i < len(lines) and SEARCH.match(lines[i]):
        start = i
        i += 1
        search, i = _until(lines, i, DIVIDER)
        if i == len(lines):
            raise FormatError(f"{where}: the SEARCH block opened on line {start + 1} has no ======= line")
        replace, i = _until(lines, i + 1, REPLACE)
        if i == len(lines):
            raise FormatError(f"{where}: the SEARCH block opened on line {start + 1} has no >>>>>>> REPLACE line")
        blocks.append((search, replace))
        i = _skip_blank(lines, i + 1)
    if fenced and i < len(lines) and FENCE.match(lines[i]):
        i += 1
    return blocks, i


def _until(lines: list[str], i: int, end: re.Pattern) -> tuple[str, int]:
    """The text of lines[i:] up to the first line matching `end`, each line with its newline."""
    start = i
    while i < len(lines) and not end.match(lines[i]):
        if SEARCH.match(lines[i]):
            raise FormatError(f"line {i + 1}: a new SEARCH block starts before the previous one ended")
        i += 1
    return "".join(line + "\n" for line in lines[start:i]), i


def _parse_fenced(lines: list[str], i: int, where: str) -> tuple[str, int]:
    opening = FENCE.match(lines[i]).group(1)
    start = i + 1
    for j in range(start, len(lines)):
        fence = re.match(r"^(`{3,}|~{3,})\s*$", lines[j])
        if fence and fence.group(1)[0] == opening[0] and len(fence.group(1)) >= len(opening):
            return "".join(line + "\n" for line in lines[start:j]), j + 1
    raise FormatError(f"{where}: the ``` block opened on line {i + 1} is never closed")
