"""How a run looks: a live status line while it works, a few lines per step, the summary.

Everything shown is rendered from the same records the trajectory log holds, so
`kog agent replay` draws a finished run exactly as it looked live (and with `full`, also
every model output and tool result). `--quiet` shows the summary alone, `--json` prints
it as one JSON object on stdout for scripts.
"""

from __future__ import annotations

import json
import time

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.syntax import Syntax
from rich.text import Text

from engine.errors import KogError

STATUS_EVERY_S = 0.05  # redraw the status line at most this often; tokens arrive faster


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 100 else f"{s / 60:.1f} min"


def _indent(text: str, style: str = "dim") -> Text:
    return Text("".join(f"    {line}\n" for line in text.rstrip("\n").splitlines()) or "    (empty)\n", style=style)


def output_console() -> Console:
    """Standard output for a run: wrapped to a terminal's width, but into a file or a pipe (a CI log) each line stays
    one line."""
    console = Console(highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def render(record: dict, full: bool = False) -> list[RenderableType]:
    kind = record.get("type")
    if kind == "start":
        line = Text.assemble(("kog agent", "bold"), f" · {record['repo']}", " (dry run: nothing is written)" if record.get("dry_run") else "")
        detail = (f"model {record['model']}" + (f" on {record['device']}" if record.get("device") else "")
                  + f" · context {record['context_size']} · tests: {record['test_command']} ({record['test_source']})")
        return [line, Text(detail, style="dim")]
    if kind == "tests":
        tests = record["tests"]
        return [Text(f"tests {record['label']}: {tests['headline']} ({_seconds(tests['duration_s'])})",
                     style="green" if tests["green"] else "yellow")]
    if kind == "step":
        return _step(record, full)
    if kind == "end":
        return summary(record["summary"])
    return []


def _step(record: dict, full: bool) -> list[RenderableType]:
    g = record["generation"]
    out: list[RenderableType] = [Text.assemble(
        (f"step {record['step']}", "bold cyan"),
        f" · {g['generated_tokens']} tok · {g['decode_tok_s']:.1f} tok/s · TTFT {g['ttft_s'] * 1e3:.0f} ms"
        f" · {g['prompt_tokens']} prompt ({g['reused_tokens']} cached) · {_seconds(g['wall_s'])}",
    )]
    if full:
        out.append(_indent(record["output"]))
    if "format_error" in record:
        out.append(Text(f"  ✗ malformed answer: {record['format_error']}", style="red"))
        return out
    if record.get("repeated"):
        described = "; ".join(a["tool"] + (" " + a["path"] if a["path"] else "") for a in record["actions"])
        out.append(Text(f"  ✗ the same actions again in the same state ({described}): stopping", style="red"))
        return out
    for result in record.get("results", []):
        mark, style = ("✓", "green") if result["ok"] else ("✗", "red")
        out.append(Text(f"  {mark} {result['brief']}", style=style))
        if full:
            out.append(_indent(result["text"]))
    tests = record.get("tests")
    if tests:
        out.append(Text(f"  tests: {tests['headline']} ({_seconds(tests['duration_s'])})",
                        style="green" if tests["green"] else "yellow"))
        if full:
            out.append(_indent(tests["output"]))
    return out


def summary(s: dict) -> list[RenderableType]:
    before, after = s["tests_before"], s["tests_after"]
    verdict = ("fixed: the tests pass" if s["fixed"] and s["steps"] else "the tests already pass" if s["fixed"]
               else f"not fixed (stopped: {s['stop_reason']})")
    out: list[RenderableType] = [Text(f"── {verdict}" + (" [dry run]" if s.get("dry_run") else ""),
                                      style="bold green" if s["fixed"] else "bold red")]
    if before:
        out.append(Text(f"tests: before {before['headline']} → after {after['headline']}"))
    out.append(Text(
        f"{s['steps']} step{'s' * (s['steps'] != 1)} · {s['generated_tokens']} tokens generated · generating {_seconds(s['generation_s'])}"
        f" · testing {_seconds(s['tests_s'])} · {s['decode_tok_s']:.1f} tok/s decode"
        f" ({s['tok_s']:.1f} tok/s with prompt processing) · {_seconds(s['wall_s'])} in all"
    ))
    if s["files_changed"]:
        out.append(Text("changed: " + ", ".join(s["files_changed"])))
    if s.get("checkpoint"):
        where = s["checkpoint"].get("ref", s["checkpoint"].get("folder"))
        out.append(Text(f"undo: kog agent undo {s['repo']}   (checkpoint {where})", style="dim"))
    if s.get("log"):
        out.append(Text(f"log: {s['log']}   (kog agent replay {s['log']})", style="dim"))
    if s["diff"]:
        out.append(Syntax(s["diff"], "diff", theme="ansi_dark", background_color="default"))
    return out


class Display:
    """Nothing while running; the summary at the end (--quiet)."""

    def __init__(self, console: Console | None = None):
        self.console = console or output_console()

    def status(self, line: str) -> None:
        pass

    def show(self, record: dict) -> None:
        if record.get("type") == "end":
            self.console.print(Group(*summary(record["summary"])))

    def close(self) -> None:
        pass


class LiveDisplay(Display):
    """Every record as it happens, under a status line with the step, action and live tok/s."""

    def __init__(self, console: Console | None = None):
        super().__init__(console)
        self._live = Live(Text(""), console=self.console, transient=True, refresh_per_second=10)
        self._live.start()
        self._drawn = 0.0

    def status(self, line: str) -> None:
        now = time.perf_counter()
        if now - self._drawn >= STATUS_EVERY_S:
            self._drawn = now
            self._live.update(Text(line, style="bold"))

    def show(self, record: dict) -> None:
        self._live.update(Text(""), refresh=True)  # the status line is stale once its record is out
        self.console.print(Group(*render(record)))

    def close(self) -> None:
        self._live.stop()


class JsonDisplay(Display):
    """The summary as one JSON object on stdout, nothing else (--json)."""

    def show(self, record: dict) -> None:
        if record.get("type") == "end":
            print(json.dumps(record["summary"]), flush=True)


def replay(records: list[dict], console: Console, full: bool = False) -> None:
    for number, record in enumerate(records, 1):
        try:
            shown = render(record, full)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise KogError(f"record {number} ({record.get('type')}) lacks fields kog agent writes; was the log edited?") from None
        console.print(Group(*shown))
    if records[-1].get("type") != "end":
        console.print(Text("── the log ends before the run's summary: the run was stopped (killed), or is still going",
                           style="bold yellow"))
