"""Fresh copies of the fixture repositories, and exact pictures of a tree for comparisons."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

HERE = Path(__file__).parent
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(root: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, check=False, text=True, env=os.environ | GIT_ENV)
    assert result.returncode == 0, result.stderr
    return result.stdout


def make_repo(tmp_path: Path, name: str, use_git: bool = True) -> Path:
    """The fixture `name` copied to tmp_path/name, as a git repository with one commit."""
    root = tmp_path / name
    shutil.copytree(HERE / name, root, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    if use_git:
        git(root, "init", "-q", "-b", "main")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "buggy")
    return root


def ignore(root: Path, *patterns: str) -> None:
    """Add `patterns` to the repository's .gitignore."""
    with open(root / ".gitignore", "a") as f:
        f.write("".join(f"{p}\n" for p in patterns))


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file outside .git and .kog: (mode, bytes), a symlink as (0, its target), a pipe or socket as (mode, b"")."""
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".git", ".kog")]
        for name in names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = (0, os.readlink(path).encode())
            else:
                mode = path.stat().st_mode
                found[rel] = (mode & 0o7777, path.read_bytes() if stat.S_ISREG(mode) else b"")
    return found
