"""`kog agent` as users run it: a real subprocess, real exit codes, a real HTTP endpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from agent_fixtures.repos import git, make_repo, snapshot
from agent_fixtures.scripted_server import ScriptedServer

KOG = [sys.executable, "-m", "kogcli"]
# The fixture repositories need no pytest plugins; not loading this venv's saves ~1 s a test run.
FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
FIX_MEAN = ("The mean divides by one too few.\n@edit stats.py\n<<<<<<< SEARCH\n    return total(values) / (len(values) - 1)\n"
            "=======\n    return total(values) / len(values)\n>>>>>>> REPLACE\n")


def kog(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "KOG_API_KEY"} | FAST | (env or {})
    return subprocess.run([*KOG, *args], capture_output=True, check=False, text=True, timeout=timeout, env=environment)


def assert_one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_fix_through_an_endpoint_then_replay_then_undo(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    with ScriptedServer(["@read_file stats.py 9-11\n", FIX_MEAN], api_key="k3y") as server:
        result = kog("agent", "fix", str(root), "--endpoint", server.url, "--json", env={"KOG_API_KEY": "k3y"})
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["fixed"] and summary["steps"] == 2 and summary["model"] == "served-model"
    assert "+    return total(values) / len(values)" in summary["diff"]
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer k3y"

    log = summary["log"]
    assert log.startswith(str(root / ".kog/runs/"))
    shown = kog("agent", "replay", log)
    assert shown.returncode == 0, shown.stderr
    assert "step 1" in shown.stdout and "step 2" in shown.stdout and "fixed: the tests pass" in shown.stdout
    assert "The mean divides by one too few." not in shown.stdout
    assert f"log: {log}   (kog agent replay {log})" in shown.stdout.splitlines()  # into a pipe a line stays whole
    assert "The mean divides by one too few." in kog("agent", "replay", log, "--full").stdout
    cut = tmp_path / "cut.jsonl"  # a run that stopped while writing its last record
    text = Path(log).read_text()
    cut.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 40])
    shown = kog("agent", "replay", str(cut))
    assert shown.returncode == 0 and "step 2" in shown.stdout, shown.stderr
    assert "the log ends before the run's summary" in shown.stdout and "ends before" not in kog("agent", "replay", log).stdout

    (root / "notes.txt").write_text("the user's own work, after the run\n")
    after_the_run = snapshot(root)
    assert_one_line_error(kog("agent", "undo", str(root)), "1 file(s) changed since run")
    assert snapshot(root) == after_the_run  # refused: nothing touched
    undone = kog("agent", "undo", str(root), "--force")
    assert undone.returncode == 0 and "restored 1 file(s), removed 1 added file(s)" in undone.stderr
    assert snapshot(root) == before
    kept = root / ".kog/checkpoints" / f"{summary['checkpoint']['id']}.undone"
    assert (kept / "notes.txt").read_text() == "the user's own work, after the run\n"
    assert "return total(values) / len(values)" in (kept / "stats.py").read_text()  # the run's fix, kept too
    assert_one_line_error(kog("agent", "undo", str(root)), "nothing to undo")


def test_an_unfixed_run_exits_3_with_the_summary(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    with ScriptedServer(["@read_file stats.py\n"]) as server:
        result = kog("agent", "fix", str(root), "--endpoint", server.url, "--max-steps", "1", "--quiet",
                     env={"COLUMNS": "200"})
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "── not fixed (stopped: max steps)"  # the summary's lines each on their own
    assert lines[1].startswith("tests: before fail") and lines[2].startswith("1 step ·")


def test_dry_run_from_the_command_line_writes_nothing(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    with ScriptedServer([FIX_MEAN]) as server:
        result = kog("agent", "fix", str(root), "--endpoint", server.url, "--dry-run", "--json")
    summary = json.loads(result.stdout)
    assert result.returncode == 0 and summary["dry_run"] and "+    return total(values) / len(values)" in summary["diff"]
    assert snapshot(root) == before and not (root / ".kog").exists()


def test_dry_run_in_a_git_worktree_leaves_the_repository_alone(tmp_path):
    main = make_repo(tmp_path, "py_mean")
    tree = tmp_path / "tree"
    git(main, "worktree", "add", "-q", str(tree))
    refs, before = git(main, "for-each-ref"), snapshot(tree)
    with ScriptedServer([FIX_MEAN]) as server:
        result = kog("agent", "fix", str(tree), "--endpoint", server.url, "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    assert "+    return total(values) / len(values)" in json.loads(result.stdout)["diff"]
    assert git(main, "for-each-ref") == refs and snapshot(tree) == before


@pytest.mark.parametrize("args, fragment", [
    (["agent", "fix", "{tmp}/missing"], "is not a directory"),
    (["agent", "fix", "{tmp}", "--max-steps", "0"], "--max-steps must be a finite number > 0"),
    (["agent", "fix", "{tmp}", "--test-timeout", "nan"], "--test-timeout must be a finite number > 0"),
    (["agent", "fix", "{tmp}", "--temperature", "nan", "--endpoint", "http://127.0.0.1:{port}/v1"],
     "temperature must be a finite number"),
    (["agent", "fix", "{tmp}", "--endpoint", "http://[::1"], "is not a valid URL"),
    (["agent", "fix", "{tmp}", "--quiet", "--json"], "exclude each other"),
    (["agent", "fix", "{tmp}", "--drafts", "9"], "--drafts must be 1 (off) to 8"),
    (["agent", "fix", "{tmp}", "--drafts", "2", "--endpoint", "http://127.0.0.1:{port}/v1"], "for the local engine"),
    (["agent", "fix", "{tmp}", "--drafts", "5", "--device", "cpu"], "--drafts needs the CUDA backend"),
    (["agent", "fix", "{tmp}", "--device", "tpu"], "unknown device 'tpu'"),
    (["agent", "fix", "{tmp}", "--endpoint", "localhost:1"], "must be an http"),
    (["agent", "fix", "{tmp}", "--endpoint", "http://127.0.0.1:{port}/v1"], "cannot reach"),
    (["agent", "undo", "{tmp}"], "nothing to undo"),
    (["agent", "replay", "{tmp}/missing.jsonl"], "no such log"),
    (["agent", "replay", "{tmp}/notes.txt"], "is not a JSON line"),
    (["agent", "replay", "{tmp}/edited.jsonl"], "lacks fields kog agent writes"),
])
def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path, args, fragment):
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "edited.jsonl").write_text('{"type": "step", "step": 1}\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    assert_one_line_error(kog(*[a.format(tmp=tmp_path, port=port) for a in args]), fragment)


def test_a_repository_without_a_test_command(tmp_path):
    (tmp_path / "README").write_text("nothing to test\n")
    with ScriptedServer([]) as server:
        result = kog("agent", "fix", str(tmp_path), "--endpoint", server.url)
    assert_one_line_error(result, "pass --test-cmd")
    assert not (tmp_path / ".kog").exists()


def test_a_test_command_that_cannot_start_ends_before_any_step(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    with ScriptedServer([FIX_MEAN]) as server:
        result = kog("agent", "fix", str(root), "--endpoint", server.url, "--test-cmd", "no-such-test-runner-xyz")
    assert_one_line_error(result, "the test command cannot run (")
    assert "no-such-test-runner-xyz" in result.stderr and "not found" in result.stderr
    assert [r["path"] for r in server.requests] == ["/v1/models"] and snapshot(root) == before  # no step asked


@pytest.mark.slow
def test_smoke_run_of_the_default_model(tmp_path, default_gguf):
    """The real model on CPU with a tiny budget: the loop runs, keeps to the budget, and the
    repository ends fixed or exactly restorable. A 135M model rarely fixes anything; the point
    is the plumbing from Session to summary."""
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    result = kog("agent", "fix", str(root), "--device", "cpu", "--context", "768", "--max-steps", "2",
                 "--max-tokens", "12", "--step-tokens", "6", "--timeout", "240", "--json", timeout=300)
    assert result.returncode in (0, 3), result.stderr
    summary = json.loads(result.stdout)
    assert summary["model"] == "smollm2-135m-instruct"
    assert 1 <= summary["steps"] <= 2 and 1 <= summary["generated_tokens"] <= 12
    assert summary["tests_before"]["failed"] == 2
    records = [json.loads(line) for line in Path(summary["log"]).read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    assert all(r["max_tokens"] <= 6 and r["generation"]["generated_tokens"] <= 6 for r in steps)
    if len(steps) == 2:  # the second step re-sends the conversation: the engine's cache covers it
        assert steps[1]["generation"]["reused_tokens"] > 0
    if summary["fixed"]:
        assert summary["tests_after"]["green"]
    if summary["checkpoint"]:  # something was written: undo brings back every byte
        assert kog("agent", "undo", str(root)).returncode == 0
    assert snapshot(root) == before
