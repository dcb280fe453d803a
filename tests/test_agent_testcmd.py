"""Finding the test command, reading runners' verdicts, and killing what hangs."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest
from agent_fixtures.repos import make_repo

from agent import process
from agent.testcmd import TestCommand, counts, detect, run_tests
from agent.tools import interactive
from engine.errors import KogError

PY = shlex.quote(sys.executable)


@pytest.fixture(autouse=True)
def no_pytest_plugins(monkeypatch):
    """The fixture repositories need no pytest plugins; not loading this venv's saves ~1 s a test run."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def test_fixture_repositories_are_detected(tmp_path):
    mean = detect(make_repo(tmp_path, "py_mean"))
    assert mean.command == f"{PY} -m pytest -q -p no:cacheprovider" and mean.config_files == ("pytest.ini",)
    assert detect(make_repo(tmp_path, "py_inventory")).config_files == ("pyproject.toml",)
    assert detect(make_repo(tmp_path, "py_slug")).command == f"{PY} -m unittest"
    assert detect(make_repo(tmp_path, "js_days")) == TestCommand("npm test --silent", "the test script in package.json", ("package.json",))


@pytest.mark.parametrize("files, command", [
    ({"go.mod": "module x\n"}, "go test ./..."),
    ({"Cargo.toml": "[package]\n"}, "cargo test"),
    ({"Makefile": "build:\n\ttrue\ntest: build\n\t./check\n"}, "make test"),
    ({"Makefile": "check test: build\n\t./check\n"}, "make test"),
    ({"Makefile": "test:: build\n\t./check\n"}, "make test"),
    ({"tests/test_a.py": "import unittest\n"}, f"{PY} -m unittest discover -s tests"),
    ({"tests/__init__.py": "", "tests/test_a.py": "import unittest\n"}, f"{PY} -m unittest"),
    ({"test_a.py": "def test_x():\n    pass\n"}, f"{PY} -m pytest -q -p no:cacheprovider"),
    ({"conftest.py": ""}, f"{PY} -m pytest -q -p no:cacheprovider"),
])
def test_detection_by_project_files(tmp_path, files, command):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert detect(tmp_path).command == command


def test_a_repository_venv_runs_its_tests(tmp_path):
    venv_python = tmp_path / ".venv/bin/python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    (tmp_path / "test_a.py").write_text("import pytest\n")
    assert detect(tmp_path).command.startswith(f"{venv_python} -m pytest")


def test_a_make_variable_named_test_is_not_a_test_target(tmp_path):
    (tmp_path / "Makefile").write_text("test := unit\ntest ::= x\nall:\n\techo $(test)\n")
    with pytest.raises(KogError, match="pass --test-cmd"):
        detect(tmp_path)


def test_the_npm_placeholder_and_nothing_at_all_are_not_test_commands(tmp_path):
    (tmp_path / "package.json").write_text(json.dumps({"scripts": {"test": 'echo "Error: no test specified" && exit 1'}}))
    with pytest.raises(KogError, match="pass --test-cmd"):
        detect(tmp_path)
    assert detect(tmp_path, "make check").command == "make check"
    for script in (5, ["pytest"], None):
        (tmp_path / "package.json").write_text(json.dumps({"scripts": {"test": script}}))
        with pytest.raises(KogError, match="pass --test-cmd"):
            detect(tmp_path)
    with pytest.raises(KogError, match="--test-cmd is empty"):
        detect(tmp_path, " ")


@pytest.mark.parametrize("output, expected", [
    ("..F\n1 failed, 2 passed in 0.12s\n", (2, 1)),
    ("==== 1 failed, 3 passed, 2 errors in 1.01s ====", (3, 3)),
    ("E ImportError\n1 error in 0.36s\n", (0, 1)),
    ("Ran 5 tests in 0.002s\n\nFAILED (failures=2, errors=1)\n", (2, 3)),
    ("Ran 4 tests in 0.1s\n\nOK (skipped=1)\n", (4, 0)),
    ("Ran 6 tests in 0.001s\n\nFAILED (failures=2, skipped=1, expected failures=1, unexpected successes=1)\n", (1, 3)),
    ("# tests 2\n# pass 1\n# fail 1\n", (1, 1)),
    ("ℹ tests 3\nℹ pass 3\nℹ fail 0\n", (3, 0)),
    ("Tests:       1 failed, 4 passed, 5 total\n", (4, 1)),
    ("test result: FAILED. 3 passed; 1 failed; 0 ignored\ntest result: ok. 2 passed; 0 failed;\n", (5, 1)),
    ("something else entirely\n", (None, None)),
])
def test_runner_summaries_are_read(output, expected):
    assert counts(output) == expected


def test_fixture_tests_fail_with_counts(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    run = run_tests(detect(root), root, 60)
    assert not run.green and (run.passed, run.failed) == (3, 2)
    assert run.headline() == "fail (exit 1): 2 failed, 3 passed"
    assert not (root / ".pytest_cache").exists() and not list(root.rglob("__pycache__"))


def test_a_hanging_command_and_its_children_are_killed(tmp_path):
    pids = tmp_path / "pids"
    # The child ignores SIGTERM, so only the group SIGKILL ends it.
    command = (f"{PY} -c \"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)\" & "
               f"echo $! > {pids}; echo started; sleep 60")
    seen = []
    start = time.perf_counter()
    done = process.run(command, tmp_path, timeout_s=1.5, progress=lambda elapsed, line: seen.append(line))
    assert done.timed_out and done.exit_code == -1 and "started" in done.output
    assert time.perf_counter() - start < 1.5 + process.KILL_GRACE_S + 2
    assert "started" in seen
    child = int(pids.read_text())
    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously; give the kernel a moment
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(child)


def alive(pid: int) -> bool:
    """Running or stopped; a killed child nobody has reaped yet (a zombie) is not alive."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_hanging_test_run_reports_the_timeout(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_forever():\n    time.sleep(60)\n")
    run = run_tests(detect(tmp_path), tmp_path, 2.0)
    assert run.timed_out and not run.green and run.headline().startswith("timed out after 2 s")


@pytest.mark.parametrize("command, fragment", [
    ("vim stats.py", "interactive"),
    ("python3", "interactive session"),
    ("/usr/bin/less README", "interactive"),
    ("git add -p", "asks questions"),
    ("git rebase -i HEAD~2", "asks questions"),
    ("echo 'unclosed", "cannot parse"),
])
def test_interactive_commands_are_refused(command, fragment):
    assert fragment in interactive(command)


@pytest.mark.parametrize("command", ["python3 -c 'print(1)'", "git status", "git log -p -1", "git grep -e x", "ls -la", "make test"])
def test_ordinary_commands_are_allowed(command):
    assert interactive(command) is None
