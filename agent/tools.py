"""What each action does to the repository, and what the model is told about it.

Every path goes through the Workspace (confinement, test-file rule, checkpoint, atomic
write). A result carries the full text for the model and a one-line brief that replaces
it when old output is dropped to keep the conversation inside the window. `run_tests` is
not here: the loop runs the tests itself, once per step, after the edits.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

import regex  # the search tool's patterns come from the model: `regex` bounds a match's time, `re` cannot

from agent import budget, process
from agent.actions import Action
from agent.edits import apply_blocks, in_style_of, lines_of
from agent.errors import ToolError
from agent.workspace import Workspace

MAX_MATCHES = 60
# One search over the repository: a pattern that backtracks without end, (x|xx)+y over a row of x's, would
# otherwise hold the run (and Ctrl+C: `re` does not look at signals while it matches) for ever.
SEARCH_TIME_S = 5.0
COUNT = re.compile(r"\{(?:\d+|\d*,\d*)\}")  # a brace that opens {m}, {m,n}, {,n} or {,}: a count for `re`
# Programs that wait for a person: with no terminal they hang until the timeout, so refuse them.
INTERACTIVE = {"vi", "vim", "nvim", "nano", "emacs", "pico", "less", "more", "most", "man", "top", "htop",
               "watch", "ssh", "telnet", "ftp", "sftp", "tmux", "screen", "mysql", "psql", "sqlite3", "gdb", "pdb"}
REPLS = {"python", "python3", "node", "irb", "ipython", "bash", "sh", "zsh", "fish", "ghci"}
# git subcommands that ask per hunk with these flags (git log -p, by contrast, just prints)
GIT_PROMPTING = {"add", "checkout", "reset", "stash", "restore", "commit", "rebase", "clean"}
GIT_PROMPT_FLAGS = {"-i", "--interactive", "-p", "--patch"}


@dataclass
class Result:
    ok: bool
    text: str  # what the model reads
    brief: str  # what is left of it once old output is dropped
    changed: bool = False  # the repository's files may differ now

    def as_dict(self) -> dict:
        return {"ok": self.ok, "text": self.text, "brief": self.brief, "changed": self.changed}


def _as_re_reads_it(pattern: str) -> str:
    """The model's pattern with the meaning Python's `re` gives it, for the `regex` package. To `re` a brace that
    opens no count is a literal; `regex` instead reads a brace pair holding one of the letters e, i, d and s (as in
    an f-string's `{e}`) as a fuzzy-matching constraint. So every such brace is escaped here."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("\\N{", i):  # a character by name, \N{EM DASH}: copied whole
            end = pattern.find("}", i)
            end = len(pattern) - 1 if end < 0 else end
            out.append(pattern[i : end + 1])
            i = end + 1
        elif pattern[i] == "\\":
            out.append(pattern[i : i + 2])
            i += 2
        else:
            out.append("\\{" if pattern[i] == "{" and not COUNT.match(pattern, i) else pattern[i])
            i += 1
    return "".join(out)


class Tools:
    def __init__(
        self,
        workspace: Workspace,
        count_tokens: Callable[[str], int],
        output_budget: int,
        allow_shell: bool = False,
        command_timeout_s: float = 120.0,
    ):
        self.workspace = workspace
        self.count = count_tokens
        self.output_budget = output_budget  # tokens any one result may take
        self.allow_shell = allow_shell
        self.command_timeout_s = command_timeout_s

    def run(self, action: Action, time_left_s: float | None = None) -> Result:
        try:
            return getattr(self, f"_{action.tool}")(action, time_left_s)
        except ToolError as e:
            return Result(False, f"error: {e}", f"{action.describe()}: error: {e}")
        except OSError as e:  # the file system's refusal (a name too long, a file where a folder must be): the model's to fix
            why = f"{action.path or action.arg}: {e.strerror or e}"
            return Result(False, f"error: {why}", f"{action.describe()}: error: {why}")

    # --- looking -----------------------------------------------------------------------------

    def _list_files(self, action: Action, _) -> Result:
        folder = action.arg.strip("/")
        if folder:
            real = self.workspace.resolve(folder)
            if not real.is_dir():
                raise ToolError(f"{folder}: not a folder")
            folder = self.workspace.relative(real)
            folder = "" if folder == "." else folder  # the root itself, as `@list_files .` names it
        files = [f for f in self.workspace.files() if not folder or f.startswith(folder + "/")]
        if not files:
            return Result(True, "no files", f"{action.describe()}: no files")
        text = budget.head("\n".join(files), self.output_budget, self.count)
        return Result(True, text, f"{action.describe()}: {len(files)} files")

    def _read_file(self, action: Action, _) -> Result:
        text = self.workspace.read_text(action.path)
        lines = lines_of(text)
        first, last = 1, len(lines)
        if action.arg:
            first, last = (int(n) for n in action.arg.split("-"))
            if first > max(1, len(lines)):
                raise ToolError(f"{action.path} has {len(lines)} lines; line {first} does not exist")
            last = min(last, len(lines))
        body = "".join(lines[first - 1 : last])
        shown = budget.head(body, self.output_budget, self.count)
        span = f"lines {first}-{last} of {len(lines)}"
        note = "" if shown == body else " (cut to fit; read a narrower range for the rest)"
        return Result(True, f"{action.path} ({span}){note}:\n{shown}", f"{action.describe()}: read {span}")

    def _search(self, action: Action, _) -> Result:
        try:
            pattern = regex.compile(_as_re_reads_it(action.arg))
        except regex.error as e:
            raise ToolError(f"bad regex {action.arg!r}: {e}") from None
        too_slow = ToolError(f"the regex {action.arg!r} took over {SEARCH_TIME_S:g} s (it backtracks too much); "
                             f"use a simpler one")
        matches = []
        deadline = time.monotonic() + SEARCH_TIME_S
        for path in self.workspace.files():
            try:
                text = self.workspace.read_text(path)
            except ToolError:
                continue  # binary, too large, or a link out of the repository
            for number, line in enumerate((line.rstrip("\r\n") for line in lines_of(text)), 1):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise too_slow
                try:
                    found = pattern.search(line, timeout=left)
                except TimeoutError:
                    raise too_slow from None
                if found:
                    matches.append(f"{path}:{number}: {line.strip()[:200]}")
        if not matches:
            return Result(True, "no matches", f"{action.describe()}: no matches")
        shown = matches[:MAX_MATCHES]
        more = f"\n[... {len(matches) - MAX_MATCHES} more matches; narrow the regex]" if len(matches) > MAX_MATCHES else ""
        text = budget.head("\n".join(shown), self.output_budget, self.count) + more
        return Result(True, text, f"{action.describe()}: {len(matches)} matches")

    # --- changing ----------------------------------------------------------------------------

    def _edit(self, action: Action, _) -> Result:
        old = self.workspace.read_text(action.path)
        new = in_style_of(old, action.body) if action.body is not None else apply_blocks(old, list(action.blocks), action.path)
        if new == old:
            raise ToolError(f"{action.path}: the edit changes nothing")
        self.workspace.write_text(action.path, new)
        return self._written(action, old, new)

    def _create_file(self, action: Action, _) -> Result:
        if self.workspace.resolve(action.path).exists():
            raise ToolError(f"{action.path} already exists; change it with @edit")
        self.workspace.write_text(action.path, action.body)
        return self._written(action, "", action.body)

    def _written(self, action: Action, old: str, new: str) -> Result:
        delta = len(new.splitlines()) - len(old.splitlines())
        what = f"{action.path}: {'created' if action.tool == 'create_file' else 'edited'} ({delta:+d} lines)"
        return Result(True, what, f"{action.describe()}: {what}", changed=True)

    def _run_command(self, action: Action, time_left_s: float | None) -> Result:
        if not self.allow_shell:
            raise ToolError("@run_command is off (the user did not pass --allow-shell); use the other tools")
        refusal = interactive(action.arg)
        if refusal:
            raise ToolError(refusal)
        self.workspace.before_change()
        timeout = self.command_timeout_s if time_left_s is None else max(1.0, min(self.command_timeout_s, time_left_s))
        done = process.run(action.arg, self.workspace.root, timeout)
        self.workspace.changed()
        status = f"killed after {timeout:.0f} s" if done.timed_out else f"exit {done.exit_code}"
        output = budget.head_tail(done.output, self.output_budget, self.count) or "(no output)"
        return Result(done.exit_code == 0, f"$ {action.arg}\n({status})\n{output}", f"{action.describe()}: {status}", changed=True)


def interactive(command: str) -> str | None:
    """Why `command` would wait for a person, or None when it runs on its own."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        return f"cannot parse the command: {e}"
    if not words:
        return "empty command"
    program = words[0].rsplit("/", 1)[-1]
    if program in INTERACTIVE:
        return f"{program} is interactive; there is no terminal to answer it"
    if program in REPLS and len(words) == 1:
        return f"{program} without arguments starts an interactive session; pass a script or -c"
    if program == "git" and len(words) > 1 and words[1] in GIT_PROMPTING and GIT_PROMPT_FLAGS & set(words[2:]):
        return f"git {words[1]} with -i/-p asks questions; there is no terminal to answer them"
    return None
