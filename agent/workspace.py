"""The repository as the agent may see and touch it.

Every path the model names comes through `resolve`: relative, no `..`, and — after
symlinks are followed — still inside the repository. Nothing under `.git` or `.kog` (the
harness's own checkpoints and logs), nor in a nested repository (a submodule, which the
checkpoint does not cover), is readable or writable. Writes are atomic (a temp
file in the same folder, then rename) and pass two gates first: test files and test
configuration need `allow_test_edits`, and the checkpoint must have saved the repository.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from agent.errors import ToolError
from engine.errors import KogError
from engine.files import write_atomic

if TYPE_CHECKING:
    from agent.checkpoint import Checkpoint

HIDDEN = (".git", ".kog")  # never shown to, read or written by the model
SKIP_DIRS = {".git", ".kog", "node_modules", "__pycache__", ".venv", "venv", ".tox", "target", "dist", "build"}
TEST_DIRS = {"test", "tests", "__tests__", "spec", "testdata"}
TEST_NAMES = (
    "test_*.py", "*_test.py", "conftest.py", "*_test.go", "*.test.[jt]s", "*.test.[jt]sx", "*.test.mjs",
    "*.spec.[jt]s", "*.spec.[jt]sx", "pytest.ini", "tox.ini", "jest.config.*", "vitest.config.*", ".mocharc*",
    "tests.py", "test.py",  # (unittest finds test*.py)
    "pyproject.toml", "setup.cfg", "noxfile.py",  # where pytest's options (a --deselect) can live
)
MAX_READ_BYTES = 1 << 20


class Workspace:
    def __init__(self, root: Path, checkpoint: Checkpoint, allow_test_edits: bool = False, protected: Iterable[str] = ()):
        self.root = Path(root).resolve()
        self.checkpoint = checkpoint
        self.allow_test_edits = allow_test_edits
        self.protected = set(protected)  # files that define the test command (Makefile, package.json, ...)
        self.written: set[str] = set()  # every path write_text changed, for telling progress from repetition
        self._files: list[str] | None = None

    # --- paths -----------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real location of a repository-relative `path`, or a ToolError saying why not."""
        path = path.strip()
        if not path:
            raise ToolError("empty path")
        if "\0" in path:
            raise ToolError(f"{path!r}: a path cannot hold a NUL character")
        pure = PurePosixPath(path)
        if pure.is_absolute() or path.startswith("~") or "\\" in path:
            raise ToolError(f"{path}: absolute paths are not allowed; use a path relative to the repository root")
        if ".." in pure.parts:
            raise ToolError(f"{path}: '..' is not allowed; paths stay inside the repository")
        real = (self.root / pure).resolve()
        if real != self.root and self.root not in real.parents:
            raise ToolError(f"{path}: resolves outside the repository (through a symlink)")
        inside = real.relative_to(self.root).parts
        if any(part in HIDDEN for part in (*pure.parts, *inside)):
            raise ToolError(f"{path}: .git and .kog are off limits")
        for folder in real.parents if real != self.root else ():
            if folder == self.root:
                break
            if (folder / ".git").exists():  # a submodule or nested repository: the checkpoint cannot restore it
                raise ToolError(f"{path}: inside the nested git repository {self.relative(folder)}, which is off limits")
        return real

    def relative(self, real: Path) -> str:
        return real.relative_to(self.root).as_posix()

    def is_test_file(self, path: str) -> bool:
        pure = PurePosixPath(path)
        if path in self.protected or any(part in TEST_DIRS for part in pure.parts[:-1]):
            return True
        return any(fnmatch.fnmatch(pure.name, pattern) for pattern in TEST_NAMES)

    # --- reading ---------------------------------------------------------------------------

    def read_text(self, path: str) -> str:
        real = self.resolve(path)
        if not real.exists():
            raise ToolError(f"{path}: no such file")
        if not real.is_file():
            raise ToolError(f"{path}: not a file")
        if real.stat().st_size > MAX_READ_BYTES:
            raise ToolError(f"{path}: larger than {MAX_READ_BYTES >> 20} MiB; search it instead")
        data = real.read_bytes()
        if b"\0" in data[:8192]:
            raise ToolError(f"{path}: a binary file")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{path}: not UTF-8 text") from None

    def files(self) -> list[str]:
        """Every file in the repository that .gitignore does not exclude, sorted; cached until a write."""
        if self._files is None:
            listed = _git_listing(self.root) if shutil.which("git") else None
            if listed is None:
                listed = _walk(self.root)
            # (a name that is not UTF-8 is left out: the model could not name it, and its text cannot hold it)
            self._files = sorted(p for p in listed if not set(PurePosixPath(p).parts) & set(HIDDEN) and _utf8(p))
        return self._files

    # --- writing ---------------------------------------------------------------------------

    def write_text(self, path: str, text: str) -> Path:
        real = self.resolve(path)
        rel = self.relative(real)
        if self.is_test_file(rel) and not self.allow_test_edits:
            raise ToolError(f"{rel}: test files and test configuration are read-only (the user did not pass --allow-test-edits); fix the code under test")
        if real.is_dir():
            raise ToolError(f"{rel}: is a directory")
        self.checkpoint.before_write(rel)
        try:
            write_atomic(real, text.encode("utf-8"))
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):  # no edit can succeed: end the run
                raise KogError(f"cannot write {real}: {e.strerror}") from None
            raise  # the path's own problem (a name too long, a file where a folder must be): the model's to fix
        self.written.add(rel)
        self._files = None
        return real

    def before_change(self) -> None:
        """A shell command is about to run and may change any file: save the repository first."""
        self.checkpoint.take()

    def changed(self) -> None:
        """Something outside write_text (a shell command) may have changed the tree."""
        self._files = None


def _git_listing(root: Path) -> list[str] | None:
    """git's own view of the non-ignored files; outside a git repository, through a scratch one."""
    def ls(*git_args: str) -> list[str] | None:
        result = subprocess.run(
            ["git", *git_args, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root, capture_output=True, check=False,
        )
        if result.returncode != 0:
            return None
        names = result.stdout.decode("utf-8", errors="surrogateescape").split("\0")
        return [n for n in names if n and (root / n).is_file()]

    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=root, capture_output=True, check=False)
    if inside.returncode == 0 and inside.stdout.strip() == b"true":
        return ls()
    with tempfile.TemporaryDirectory(prefix="kog-git-") as scratch:
        if subprocess.run(["git", "init", "-q", "--bare", scratch], capture_output=True, check=False).returncode != 0:
            return None
        return ls(f"--git-dir={scratch}", f"--work-tree={root}")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, kept as surrogates (os.fsdecode)
        return False
    return True


def _walk(root: Path) -> list[str]:
    """Without git: every file outside the usual dependency, cache and build folders."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        found += [Path(folder, n).relative_to(root).as_posix() for n in names]
    return found
