"""Which command runs a repository's tests, running it, and reading its verdict.

The exit status decides green or red. Pass/fail counts are read from the output when the
runner prints a summary we know (pytest, unittest, node --test, jest, cargo) and are only
shown to people; a runner we cannot read still works, just without counts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from agent import process
from agent.workspace import SKIP_DIRS
from engine.errors import KogError


@dataclass(frozen=True)
class TestCommand:
    __test__ = False  # a pytest hint: not a test class, despite the name

    command: str
    source: str  # why this command: shown to the user
    config_files: tuple[str, ...] = ()  # the files that define it; as protected as test files


@dataclass
class TestRun:
    __test__ = False

    command: str
    exit_code: int
    output: str
    duration_s: float
    timed_out: bool
    passed: int | None = None
    failed: int | None = None

    @property
    def green(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def could_not_start(self) -> bool:
        """The shell's codes for a program it could not find (127) or run (126), also as a runner passes them on
        (npm, for a script's missing tool)."""
        return self.exit_code in (126, 127) and not self.timed_out

    def headline(self) -> str:
        if self.timed_out:
            return f"timed out after {self.duration_s:.0f} s (killed)"
        counts = ", ".join(f"{n} {word}" for n, word in ((self.failed, "failed"), (self.passed, "passed")) if n)
        verdict = "pass" if self.green else f"fail (exit {self.exit_code})"
        return f"{verdict}: {counts}" if counts else verdict

    def as_dict(self) -> dict:
        return asdict(self) | {"green": self.green, "headline": self.headline()}


# --- finding the command ---------------------------------------------------------------------

def detect(root: Path, override: str | None = None) -> TestCommand:
    if override is not None:
        if not override.strip():
            raise KogError("--test-cmd is empty")
        return TestCommand(override, "--test-cmd")
    for finder in (_node, _cargo, _go, _python, _make):
        found = finder(root)
        if found is not None:
            return found
    raise KogError(
        f"cannot tell how to run the tests in {root} (looked for pytest, unittest, package.json, "
        "go.mod, Cargo.toml, a Makefile test target); pass --test-cmd"
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _node(root: Path) -> TestCommand | None:
    try:
        script = json.loads(_read(root / "package.json") or "{}").get("scripts", {}).get("test", "")
    except (json.JSONDecodeError, AttributeError):
        return None
    # npm init's default script ("no test specified") always fails; a script that is not a string, npm refuses
    if not isinstance(script, str) or not script or "no test specified" in script:
        return None
    return TestCommand("npm test --silent", "the test script in package.json", ("package.json",))


def _cargo(root: Path) -> TestCommand | None:
    return TestCommand("cargo test", "Cargo.toml") if (root / "Cargo.toml").is_file() else None


def _go(root: Path) -> TestCommand | None:
    return TestCommand("go test ./...", "go.mod") if (root / "go.mod").is_file() else None


def _make(root: Path) -> TestCommand | None:
    for name in ("GNUmakefile", "makefile", "Makefile"):
        # a rule with `test` among its targets ("check test: all"), not a variable ("test := x")
        if re.search(r"^(?:[^\s:=#]+[ \t]+)*test(?:[ \t]+[^\s:=#]+)*[ \t]*::?(?![:=])", _read(root / name), re.MULTILINE):
            return TestCommand("make test", f"the test target in {name}", (name,))
    return None


PYTEST_CONFIG = {"pytest.ini": "", "pyproject.toml": "[tool.pytest", "setup.cfg": "[tool:pytest]", "tox.ini": "[pytest]"}


def python_executable(root: Path) -> str:
    """The repository's own virtualenv if it has one, else the Python kog runs in."""
    for venv in (".venv", "venv"):
        candidate = root / venv / "bin" / "python"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return sys.executable


def _python(root: Path) -> TestCommand | None:
    python = shlex.quote(python_executable(root))
    pytest = f"{python} -m pytest -q -p no:cacheprovider"  # no .pytest_cache left in the user's tree
    configs = tuple(name for name, marker in PYTEST_CONFIG.items() if (root / name).is_file() and marker in _read(root / name))
    if configs or (root / "conftest.py").is_file():
        return TestCommand(pytest, "pytest configuration", configs)
    tests = _python_test_files(root)
    if not tests:
        return None
    texts = [_read(root / t) for t in tests]
    if any(re.search(r"^\s*(import|from) pytest\b", t, re.MULTILINE) for t in texts):
        return TestCommand(pytest, "test files that import pytest")
    if not all("unittest" in t for t in texts):
        return TestCommand(pytest, "test files")
    # unittest discovers only importable folders: a tests/ without __init__.py needs -s.
    folders = {Path(t).parts[0] for t in tests if len(Path(t).parts) > 1}
    if any(len(Path(t).parts) == 1 for t in tests) or not folders or any((root / f / "__init__.py").is_file() for f in folders):
        return TestCommand(f"{python} -m unittest", "unittest test files")
    return TestCommand(f"{python} -m unittest discover -s {shlex.quote(min(folders))}", "unittest test files")


def _python_test_files(root: Path) -> list[str]:
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        found += [
            Path(folder, n).relative_to(root).as_posix()
            for n in sorted(names) if re.fullmatch(r"test_.*\.py|.*_test\.py", n)
        ]
    return found


# --- running it ------------------------------------------------------------------------------

def run_tests(
    command: TestCommand, root: Path, timeout_s: float, progress: Callable[[float, str], None] | None = None
) -> TestRun:
    done = process.run(command.command, root, timeout_s, progress)
    passed, failed = counts(done.output)
    return TestRun(done.command, done.exit_code, done.output, done.duration_s, done.timed_out, passed, failed)


def counts(output: str) -> tuple[int | None, int | None]:
    """(passed, failed) from a runner's summary; errors count as failures; None when unknown."""
    lines = output.splitlines()
    for line in reversed(lines):  # pytest: "1 failed, 2 passed, 1 error in 0.12s"
        if re.match(r"^[=\s]*\d+ \w+(, \d+ \w+)* in [\d.]+s", line):
            found = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", line)}
            return found.get("passed", 0), found.get("failed", 0) + found.get("error", 0) + found.get("errors", 0)
    ran = re.search(r"^Ran (\d+) tests? in", output, re.MULTILINE)  # unittest
    if ran:
        verdict = re.search(r"^FAILED \(([^)]*)\)", output, re.MULTILINE)
        # "(failures=2, skipped=1, expected failures=1, unexpected successes=1)": the names have spaces
        found = {k: int(v) for k, v in re.findall(r"(\w[\w ]*)=(\d+)", verdict.group(1))} if verdict else {}
        failed = found.get("failures", 0) + found.get("errors", 0) + found.get("unexpected successes", 0)
        return int(ran.group(1)) - failed - found.get("skipped", 0) - found.get("expected failures", 0), failed
    node = dict(re.findall(r"^\W*(?:ℹ\s*)?(pass|fail) (\d+)\s*$", output, re.MULTILINE))  # node --test: tap, spec
    if "pass" in node and "fail" in node:
        return int(node["pass"]), int(node["fail"])
    jest = re.search(r"^Tests:\s+(.*)$", output, re.MULTILINE)
    if jest:
        found = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", jest.group(1))}
        return found.get("passed", 0), found.get("failed", 0)
    cargo = re.findall(r"^test result: \w+\. (\d+) passed; (\d+) failed", output, re.MULTILINE)
    if cargo:
        return sum(int(p) for p, _ in cargo), sum(int(f) for _, f in cargo)
    return None, None
