"""The agent's loop: run the tests, ask the model, act, test again — until green or out of budget.

    tests = run the tests                                  (green already: nothing to do)
    tell the model: failing output, a repository map, the files the failure names
    each step:
        stop when steps, tokens or time run out, or the conversation cannot fit
        stream the model's answer (live tok/s), cut short at the deadline
        parse its actions; a malformed answer is sent back, N in a row end the run
        the same actions in the same state again and again end the run
        run the actions; a failed edit skips the ones after it
        after any edit (or on request) run the tests: green ends the run
        send back every result and the test output
    summary: tests before/after, steps, tokens, time generating vs testing, tok/s, the diff

Each step is appended to the trajectory log and shown as it happens. Safety lives in the
workspace and the checkpoint, not here: the loop cannot write a file they would refuse.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent import prompts, repomap, testcmd
from agent.actions import Action, FormatError, parse
from agent.budget import head
from agent.checkpoint import Checkpoint, kog_dir, new_run_id
from agent.client import ModelClient, ReplyStats
from agent.display import Display
from agent.errors import ToolError
from agent.history import History
from agent.testcmd import TestRun
from agent.tools import Result, Tools
from agent.trajectory import Trajectory
from agent.workspace import Workspace
from engine.errors import KogError

MIN_ROOM = 256  # tokens the conversation needs at the least, besides the system message and the answer


@dataclass
class Options:
    test_cmd: str | None = None
    max_steps: int = 20
    max_tokens: int = 20_000  # generated, over the whole run
    step_tokens: int = 1024  # the longest one answer may be
    timeout_s: float = 1800.0  # the whole run, tests included
    test_timeout_s: float = 300.0  # one test run (and one shell command)
    max_malformed: int = 3  # malformed answers in a row
    repeat_limit: int = 3  # the same actions this often in the same state
    allow_shell: bool = False
    allow_test_edits: bool = False


class Agent:
    def __init__(self, root: Path, client: ModelClient, options: Options, display: Display,
                 run_id: str | None = None, dry_run_of: Path | None = None):
        self.root = Path(root).resolve()
        self.dry_run_of = dry_run_of  # the repository a dry run works on a scratch copy of
        self.client, self.options, self.display = client, options, display
        self.log: Trajectory | None = None
        self.run_id = run_id or new_run_id()
        self.command = testcmd.detect(self.root, options.test_cmd)
        self.checkpoint = Checkpoint(self.root, self.run_id, keep_ignored=options.allow_shell)
        self.workspace = Workspace(self.root, self.checkpoint, options.allow_test_edits, self.command.config_files)
        self.system = prompts.system(options.allow_shell, options.allow_test_edits)
        self.step_tokens = min(options.step_tokens, client.context_size // 2)
        self.prompt_limit = client.context_size - self.step_tokens
        self.room = self.prompt_limit - client.prompt_tokens(self.system, [])
        if self.room < MIN_ROOM:
            raise KogError(f"a context of {client.context_size} tokens is too small for the agent; give it at least "
                           f"{client.context_size - self.room + MIN_ROOM} (--context)")
        self.output_budget = self.room // 5  # tokens one tool result or test output may take
        self.tools = Tools(self.workspace, client.count_tokens, self.output_budget, options.allow_shell, options.test_timeout_s)
        self.history = History()
        self.steps = self.malformed = self.shell_runs = 0
        self.generated = 0
        self.generation_s = self.decode_s = self.tests_s = 0.0
        self.decoded = 0  # tokens after each answer's first, the ones decode_s covers
        self.seen: dict[str, int] = {}

    # --- the loop ----------------------------------------------------------------------------

    def run(self, log: Trajectory | None = None) -> dict:
        """The whole run; every record also goes to `log`. Returns the summary."""
        self.log = log
        self.started = time.perf_counter()
        self.deadline = self.started + self.options.timeout_s
        self.emit({
            "type": "start", "run": self.run_id, "repo": str(self.dry_run_of or self.root),
            "dry_run": self.dry_run_of is not None, "model": self.client.name,
            "device": getattr(self.client, "device", ""), "context_size": self.client.context_size,
            "test_command": self.command.command, "test_source": self.command.source,
            "checkpoint_kind": self.checkpoint.kind, "options": asdict(self.options), "system": self.system,
            "time": time.time(),
        })
        before = last = error = None
        try:
            before = last = self.test("before")
            self.emit({"type": "tests", "label": "before", "tests": before.as_dict()})
            if before.could_not_start:  # no edit of the repository installs a missing program
                said = before.output.strip().splitlines()[-1:] or [f"exit {before.exit_code}"]
                raise KogError(f"the test command cannot run ({said[0]}); install what it needs or pass --test-cmd")
            if before.green:
                return self.finish("already passing", before, last)
            self.history.add("user", self.task(before), prompts.task_brief(self.command.command))
            stop = None
            while stop is None:
                stop = self.out_of_budget()
                if stop is None:
                    stop, last = self.step(last)
        except KeyboardInterrupt:
            stop = "interrupted"
        except KogError as e:  # the model's server or the disk failed mid-run: the run still ends whole,
            stop, error = "error", e  # so that its edits are listed and undo knows them, then the error is told
        summary = self.finish(stop, before, last)
        if error is not None:
            raise error
        return summary

    def out_of_budget(self) -> str | None:
        if self.steps >= self.options.max_steps:
            return "max steps"
        if self.generated >= self.options.max_tokens:
            return "max tokens"
        if time.perf_counter() >= self.deadline:
            return "timeout"
        return None

    def step(self, tests: TestRun) -> tuple[str | None, TestRun]:
        """One ask-act-test round; returns why to stop (None: go on) and the latest test run."""
        self.steps += 1
        n = self.steps
        def measure(messages: list[dict]) -> int:
            return self.client.prompt_tokens(self.system, messages)

        if not self.history.fit(self.prompt_limit, measure):
            return "context full", tests
        messages = self.history.messages()
        room = self.client.context_size - measure(messages)
        max_tokens = max(1, min(self.step_tokens, self.options.max_tokens - self.generated, room))
        answer, stats, wall_s = self.generate(n, messages, max_tokens)
        record = {"type": "step", "step": n, "input": messages, "max_tokens": max_tokens, "output": answer,
                  "generation": stats.as_dict() | {"wall_s": wall_s}}
        cut = "timeout" if stats.stop_reason == "cancelled" else None
        try:
            actions = parse(answer)
        except FormatError as e:
            self.malformed += 1
            self.history.add("assistant", answer, "[an answer that did not follow the format]")
            self.history.add("user", prompts.malformed(str(e)))
            self.emit(record | {"format_error": str(e)})
            return ("malformed answers" if self.malformed >= self.options.max_malformed else cut), tests
        self.malformed = 0
        record["actions"] = [a.as_dict() for a in actions]
        key = json.dumps([record["actions"], self.state()])
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] >= self.options.repeat_limit:
            self.emit(record | {"repeated": self.seen[key]})
            return "repeating", tests

        entries, run_tests = self.act(n, actions)
        after = self.test(f"step {n}") if run_tests else None
        feedback, brief = prompts.results(entries, after, self.output_budget, self.client.count_tokens)
        self.history.add("assistant", answer, "[answer: " + "; ".join(a.describe() for a in actions) + "]")
        self.history.add("user", feedback, brief)
        self.emit(record | {"results": [{"action": d} | r.as_dict() for d, r in entries],
                            "tests": after.as_dict() if after else None})
        if after is not None and after.green:
            return "fixed", after
        return cut, after or tests

    def act(self, n: int, actions: list[Action]) -> tuple[list[tuple[str, Result]], bool]:
        """Run the actions in order; return each one's result, and whether the tests should run."""
        entries: list[tuple[str, Result]] = []
        changed = wanted_tests = failed_edit = False
        for action in actions:
            described = action.describe()
            if failed_edit:  # later actions may build on the edit that failed
                result = Result(False, *prompts.skipped(described))
            elif action.tool == "run_tests":
                wanted_tests = True
                result = Result(True, "the tests run after this step's other actions", f"{described}: queued")
            else:
                self.display.status(f"step {n} · {described}")
                result = self.tools.run(action, self.deadline - time.perf_counter())
                self.shell_runs += action.tool == "run_command"
                failed_edit = action.writes and not result.ok
            changed |= result.changed
            entries.append((described, result))
        return entries, changed or wanted_tests

    def generate(self, n: int, messages: list[dict], max_tokens: int) -> tuple[str, ReplyStats, float]:
        start = time.perf_counter()
        reply = self.client.generate(self.system, messages, max_tokens, self.deadline)
        pieces, cancelled, cut = [], False, False
        try:
            for piece in reply:
                pieces.append(piece)
                stats = reply.stats
                self.display.status(f"step {n} · generating · {stats.generated_tokens} tok · {stats.decode_tok_s:.1f} tok/s")
                if not (cancelled or cut):
                    if time.perf_counter() >= self.deadline:
                        reply.cancel()  # the stream ends within a token
                        cancelled = True
                    elif stats.generated_tokens >= max_tokens:
                        reply.cancel()  # a server that does not keep to max_tokens itself
                        cut = True
        except KeyboardInterrupt:
            reply.cancel()
            raise
        finally:
            wall = time.perf_counter() - start
            stats = reply.stats
            self.generated += stats.generated_tokens
            self.generation_s += wall
            self.decode_s += stats.decode_s
            self.decoded += max(0, stats.generated_tokens - 1)
        if cancelled:
            stats.stop_reason = "cancelled"
        elif cut:
            stats.stop_reason = "length"
        return "".join(pieces), stats, wall

    def test(self, label: str) -> TestRun:
        timeout = max(1.0, min(self.options.test_timeout_s, self.deadline - time.perf_counter()))
        def progress(elapsed: float, line: str) -> None:
            self.display.status(f"{label} · tests · {elapsed:.1f} s · {line[:60]}")

        self.display.status(f"{label} · tests · {self.command.command}")
        run = testcmd.run_tests(self.command, self.root, timeout, progress)
        self.tests_s += run.duration_s
        return run

    def state(self) -> str:
        """What the repository's files look like now, as far as this run could have changed them."""
        digest = hashlib.sha1(str(self.shell_runs).encode())
        for path in sorted(self.workspace.written):
            real = self.root / path
            digest.update(path.encode() + b"\0" + (real.read_bytes() if real.is_file() else b"<gone>") + b"\0")
        return digest.hexdigest()

    # --- what the model is told first ------------------------------------------------------------

    def task(self, tests: TestRun) -> str:
        share = self.room // 2  # the other half is for the steps that follow
        count = self.client.count_tokens
        failing = repomap.failure_files(tests.output, self.workspace)
        ranked = repomap.rank(self.workspace, failing, tests.output)
        repo_map = repomap.render(ranked, share * 15 // 100, count)
        files, left = [], share * 50 // 100
        # Source files the failure names, then the tests it names, then files it refers to.
        named = [p for p in failing if not self.workspace.is_test_file(p)] + [p for p in failing if self.workspace.is_test_file(p)]
        related = [e.path for e in ranked if e.related and e.path not in failing][:3]
        for path in named + related:
            if left < 64:
                break
            try:
                text = head(self.workspace.read_text(path), left, count)
            except ToolError:
                continue  # binary, too large, or a link out of the repository
            if text:
                files.append((path, text))
                left -= count(text) + 8
        return prompts.task(self.command.command, tests, repo_map, files, share * 35 // 100, count)

    # --- the end -----------------------------------------------------------------------------

    def finish(self, stop: str, before: TestRun | None, last: TestRun | None) -> dict:
        record = self.checkpoint.record
        summary = {
            "run": self.run_id, "repo": str(self.dry_run_of or self.root), "dry_run": self.dry_run_of is not None,
            "model": self.client.name,
            "test_command": self.command.command, "stop_reason": stop,
            "fixed": last is not None and last.green,
            "tests_before": _tests(before), "tests_after": _tests(last),
            "steps": self.steps, "generated_tokens": self.generated,
            "generation_s": round(self.generation_s, 3), "tests_s": round(self.tests_s, 3),
            "wall_s": round(time.perf_counter() - self.started, 3),
            "decode_tok_s": round(self.decoded / self.decode_s, 2) if self.decode_s > 0 else 0.0,
            "tok_s": round(self.generated / self.generation_s, 2) if self.generation_s > 0 else 0.0,
            "files_changed": sorted(self.workspace.written),
            "checkpoint": None if record is None or self.dry_run_of else {k: record[k] for k in ("id", "kind", "ref", "folder") if k in record},
            "log": str(self.log.path) if self.log else None,
            "diff": self.checkpoint.diff(),
        }
        self.emit({"type": "end", "summary": summary})
        self.checkpoint.seal()  # last (after the log's end, were the log in the tree): undo tells the user's later changes by it
        return summary

    def emit(self, record: dict) -> None:
        if self.log is not None:
            self.log.write(record)
        self.display.show(record)


def _tests(run: TestRun | None) -> dict | None:
    if run is None:
        return None
    return {"headline": run.headline(), "green": run.green, "passed": run.passed, "failed": run.failed,
            "exit_code": run.exit_code, "timed_out": run.timed_out}


def fix(root: Path, client: ModelClient, options: Options, display: Display,
        log_path: Path | None = None, dry_run: bool = False) -> dict:
    """Run the agent on `root`; with dry_run, on a scratch copy, leaving `root` untouched."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise KogError(f"{root} is not a directory")
    run_id = new_run_id()
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="kog-dry-run-") as scratch:
            copy = Path(scratch) / root.name
            # not .kog; nor a .git file (a worktree's or submodule's link to a repository elsewhere, which the
            # copy's checkpoint would write into): the copy is then checkpointed by copies
            top = [".kog"] + [".git"] * (root / ".git").is_file()
            shutil.copytree(root, copy, symlinks=True, ignore=lambda folder, names: top if Path(folder) == root else [])
            agent = Agent(copy, client, options, display, run_id, dry_run_of=root)
            log = Trajectory(log_path) if log_path else None
            try:
                return agent.run(log)
            finally:
                if log:
                    log.close()
    agent = Agent(root, client, options, display, run_id)  # bad options fail here, before .kog/ exists
    log = Trajectory(log_path or kog_dir(root) / "runs" / f"{run_id}.jsonl")
    try:
        return agent.run(log)
    finally:
        log.close()
