"""Path confinement, the test-file rule, atomic writes and what the agent may list."""

from __future__ import annotations

import os
import stat

import pytest
from agent_fixtures.repos import git, make_repo, snapshot

from agent.actions import Action
from agent.checkpoint import Checkpoint
from agent.errors import ToolError
from agent import tools as tools_module
from agent.tools import Tools
from agent.workspace import Workspace
from engine.errors import KogError


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path, "py_mean")


def workspace(root, **kw) -> Workspace:
    return Workspace(root, Checkpoint(root, "t"), **kw)


@pytest.mark.parametrize("path, fragment", [
    ("/etc/passwd", "absolute paths are not allowed"),
    ("~/x", "absolute paths are not allowed"),
    ("../outside.txt", "'..' is not allowed"),
    ("tests/../../outside.txt", "'..' is not allowed"),
    (".git/config", ".git and .kog are off limits"),
    ("sub/.git/HEAD", ".git and .kog are off limits"),
    (".kog/checkpoints/x.json", ".git and .kog are off limits"),
    ("", "empty path"),
    ("stats\0.py", "cannot hold a NUL"),
])
def test_paths_outside_the_repository_are_refused(repo, path, fragment):
    ws = workspace(repo)
    with pytest.raises(ToolError, match=fragment):
        ws.read_text(path)
    with pytest.raises(ToolError, match=fragment):
        ws.write_text(path, "x")


def test_symlinks_that_leave_the_repository_are_refused(repo, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("keep out\n")
    (repo / "link.txt").symlink_to(secret)
    (repo / "linkdir").symlink_to(tmp_path)
    (repo / "inside.py").symlink_to("stats.py")
    before = snapshot(tmp_path)
    ws = workspace(repo)
    for path in ("link.txt", "linkdir/secret.txt", "linkdir/new.py"):
        with pytest.raises(ToolError, match="outside the repository"):
            ws.read_text(path)
        with pytest.raises(ToolError, match="outside the repository"):
            ws.write_text(path, "pwned\n")
    assert ws.read_text("inside.py") == (repo / "stats.py").read_text()  # a link within is fine
    assert snapshot(tmp_path) == before


def test_writing_into_git_through_a_symlink_is_refused(repo):
    (repo / "hooks").symlink_to(".git/hooks")
    with pytest.raises(ToolError, match="off limits"):
        workspace(repo).write_text("hooks/pre-commit", "#!/bin/sh\n")
    assert not (repo / ".git/hooks/pre-commit").exists()


def test_test_files_and_test_configuration_need_permission(repo):
    ws = workspace(repo, protected=["Makefile"])
    for path in ("tests/test_stats.py", "pytest.ini", "conftest.py", "Makefile", "lib/foo_test.py", "web/a.spec.ts",
                 "pyproject.toml", "setup.cfg", "tests.py"):  # (the middle two can hold a --deselect)
        assert ws.is_test_file(path), path
        with pytest.raises(ToolError, match="--allow-test-edits"):
            ws.write_text(path, "")
    assert not ws.is_test_file("stats.py") and not ws.is_test_file("src/testing_utils.py")
    allowed = workspace(repo, allow_test_edits=True)
    allowed.write_text("tests/test_stats.py", "def test_x():\n    pass\n")
    assert (repo / "tests/test_stats.py").read_text() == "def test_x():\n    pass\n"


def test_a_nested_repository_is_off_limits(repo):
    nested = repo / "vendor" / "lib"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")  # as a submodule or a cloned dependency: the checkpoint would not restore it
    (nested / "util.py").write_text("x = 1\n")
    ws = workspace(repo)
    for path in ("vendor/lib/util.py", "vendor/lib/new.py"):
        with pytest.raises(ToolError, match="inside the nested git repository vendor/lib"):
            ws.write_text(path, "x = 2\n")
    assert (nested / "util.py").read_text() == "x = 1\n"
    ws.write_text("vendor/own.py", "y = 1\n")  # beside it is the repository's own


def test_writes_are_atomic_and_keep_the_mode(repo):
    script = repo / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o750)
    git(repo, "add", "run.sh")
    ws = workspace(repo)
    ws.write_text("run.sh", "echo new\n")
    ws.write_text("pkg/deep/new.py", "x = 1\n")
    assert script.read_text() == "echo new\n" and stat.S_IMODE(script.stat().st_mode) == 0o750
    assert (repo / "pkg/deep/new.py").read_text() == "x = 1\n"
    assert not [p for p in repo.rglob("*") if "kog-tmp" in p.name]  # no temp files left behind
    assert ws.written == {"run.sh", "pkg/deep/new.py"}


def test_a_failed_write_leaves_the_old_file(repo, monkeypatch):
    original = (repo / "stats.py").read_bytes()
    ws = workspace(repo)
    ws.checkpoint.take()

    def broken(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(KogError, match="No space left"):  # no edit can succeed: it ends the run
        ws.write_text("stats.py", "x" * 10_000)
    assert (repo / "stats.py").read_bytes() == original
    assert sorted(p.name for p in repo.iterdir()) == sorted([".git", ".gitignore", ".kog", "pytest.ini", "stats.py", "tests"])


def test_files_respect_gitignore_with_and_without_git(tmp_path):
    for use_git in (True, False):
        root = make_repo(tmp_path / str(use_git), "py_mean", use_git=use_git)
        (root / "__pycache__").mkdir()
        (root / "__pycache__/stats.cpython-311.pyc").write_bytes(b"\0")
        (root / "notes.txt").write_text("untracked but not ignored\n")
        files = workspace(root).files()
        assert files == [".gitignore", "notes.txt", "pytest.ini", "stats.py", "tests/test_stats.py"], use_git


def test_ignored_files_cannot_be_written_in_a_git_repository(repo):
    (repo / "__pycache__").mkdir()
    with pytest.raises(ToolError, match="ignored by git"):
        workspace(repo).write_text("__pycache__/x.py", "x = 1\n")
    assert not (repo / "__pycache__/x.py").exists()


def test_binary_and_non_utf8_files_are_not_read_as_text(repo):
    (repo / "blob.bin").write_bytes(b"\x00\x01\x02")
    (repo / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    ws = workspace(repo)
    with pytest.raises(ToolError, match="binary"):
        ws.read_text("blob.bin")
    with pytest.raises(ToolError, match="not UTF-8"):
        ws.read_text("latin.txt")
    with pytest.raises(ToolError, match="no such file"):
        ws.read_text("missing.py")


def test_a_file_system_refusal_goes_back_to_the_model(repo):
    """A name the file system refuses is the model's mistake: an error it reads, not a crash of the run."""
    tools = Tools(workspace(repo), lambda text: len(text.split()), 1000)
    before = snapshot(repo)
    for action in (Action("create_file", path="stats.py/helper.py", body="x = 1\n"),  # a file where a folder must be
                   Action("create_file", path="a" * 300 + ".py", body="x = 1\n"),  # a name too long
                   Action("read_file", path="b" * 300 + ".py")):
        result = tools.run(action)
        assert not result.ok and result.text.startswith("error: ") and action.path in result.text
    assert snapshot(repo) == before


def test_a_search_that_backtracks_without_end_is_stopped(repo, monkeypatch):
    """The model's regex meets the repository's lines under a time limit: one that backtracks without end is an
    error the model reads, not a run that hangs (Python's own `re` would match it for ever, deaf to Ctrl+C)."""
    monkeypatch.setattr(tools_module, "SEARCH_TIME_S", 0.5)
    (repo / "rows.txt").write_text("x" * 64 + "\n")
    tools = Tools(workspace(repo), lambda text: len(text.split()), 1000)
    stuck = tools.run(Action("search", arg="(x|xx)+y"))
    assert not stuck.ok and "took over" in stuck.text and "(x|xx)+y" in stuck.text
    found = tools.run(Action("search", arg="x{64}"))
    assert found.ok and found.text.startswith("rows.txt:1: "), found.text


def test_a_search_reads_braces_as_python_does(repo):
    """Braces that open no count are literal, as in Python's `re` (the `regex` package alone would read the
    f-string placeholder {e} as fuzzy matching and match far more)."""
    (repo / "fmt.py").write_text('print(f"error: {e}")\nprint("error: unknown")\nx = "ab"\n')
    tools = Tools(workspace(repo), lambda text: len(text.split()), 1000)
    found = tools.run(Action("search", arg="error: {e}"))
    assert found.ok and found.text.splitlines() == ['fmt.py:1: print(f"error: {e}")'], found.text
    assert tools.run(Action("search", arg="a{1}b{1,}")).text.startswith("fmt.py:3: ")


def test_a_search_past_its_time_stops_however_fast_each_line(repo, monkeypatch):
    monkeypatch.setattr(tools_module, "SEARCH_TIME_S", 0.0)
    tools = Tools(workspace(repo), lambda text: len(text.split()), 1000)
    result = tools.run(Action("search", arg="def"))
    assert not result.ok and "took over 0 s" in result.text


def test_listing_the_root_by_name_lists_every_file(repo):
    tools = Tools(workspace(repo), lambda text: len(text.split()), 1000)
    every = tools.run(Action("list_files")).text
    for folder in (".", "./"):
        assert tools.run(Action("list_files", arg=folder)).text == every
    assert tools.run(Action("list_files", arg="tests")).text == "tests/test_stats.py"


def test_a_whole_file_rewrite_keeps_the_line_endings_and_byte_order_mark(repo):
    (repo / "crlf.py").write_bytes(b"a = 1\r\nb = 2\r\n")
    (repo / "bom.py").write_bytes(b"\xef\xbb\xbfx = 1\n")
    tools = Tools(workspace(repo), lambda text: len(text.split()), 1000)
    assert tools.run(Action("edit", path="crlf.py", body="a = 1\nb = 3\n")).ok
    assert tools.run(Action("edit", path="bom.py", body="x = 2\n")).ok
    assert (repo / "crlf.py").read_bytes() == b"a = 1\r\nb = 3\r\n"
    assert (repo / "bom.py").read_bytes() == b"\xef\xbb\xbfx = 2\n"
    assert not tools.run(Action("edit", path="crlf.py", body="a = 1\nb = 3\n")).ok  # (the same again changes nothing)
    assert tools.run(Action("edit", path="crlf.py", body="a = 1\r\nb = 4\r\n")).ok  # a body in CRLF already
    assert (repo / "crlf.py").read_bytes() == b"a = 1\r\nb = 4\r\n"


def test_line_numbers_count_newlines_only(repo):
    """As a traceback numbers them: a form feed (a page break in C and Python sources) does not start a line."""
    (repo / "pages.py").write_text("a = 1\n\f\ndef f():\n    raise ValueError\n")
    tools = Tools(workspace(repo), lambda text: len(text.split()), 1000)
    assert tools.run(Action("read_file", path="pages.py", arg="4-4")).text == "pages.py (lines 4-4 of 4):\n    raise ValueError\n"
    assert tools.run(Action("search", arg="raise ValueError$")).text == "pages.py:4: raise ValueError"
    missed = tools.run(Action("edit", path="pages.py", blocks=(("    raise KeyError\n", "    pass\n"),)))
    assert "closest lines (4-4)" in missed.text
