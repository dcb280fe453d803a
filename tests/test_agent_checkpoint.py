"""Checkpoints and `undo`: the tree comes back byte for byte, the user's git state untouched."""

from __future__ import annotations

import os

import pytest
from agent_fixtures.repos import git, ignore, make_repo, snapshot

from agent.checkpoint import Checkpoint, undo
from engine.errors import KogError


def mess_up(root):
    """What a run (with --allow-shell, even) might do to a tree."""
    (root / "stats.py").write_text("broken = True\n")
    (root / "tests/test_stats.py").unlink()
    (root / "pkg/deep").mkdir(parents=True)
    (root / "pkg/deep/new.py").write_text("x = 1\n")
    (root / "pytest.ini").chmod(0o755)
    (root / "data.bin").write_bytes(os.urandom(64) + b"\0")
    (root / "link").unlink()
    (root / "link").write_text("no longer a link\n")


def prepare(root):
    (root / "link").symlink_to("stats.py")
    (root / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (root / ".gitattributes").write_text("* text=auto\n")  # git would normalise crlf.txt on add
    (root / "data.bin").write_bytes(b"\0\1\2")


def test_git_checkpoint_restores_exactly_and_leaves_git_state_alone(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    prepare(root)
    (root / "untracked.txt").write_text("not added yet\n")
    (root / "stats.py").write_text((root / "stats.py").read_text() + "# staged\n")
    git(root, "add", "stats.py")
    (root / "stats.py").write_text((root / "stats.py").read_text() + "# and unstaged\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__/cache.pyc").write_bytes(b"ignored")
    before = snapshot(root)
    index, head, status = git(root, "diff", "--cached"), git(root, "rev-parse", "HEAD"), git(root, "status", "--porcelain")

    checkpoint = Checkpoint(root, "run1")
    record = checkpoint.take()
    assert record["kind"] == "git" and record["ref"] == "refs/heads/kog/run1"
    assert "kog/run1" in git(root, "branch", "--list", "kog/*")
    mess_up(root)
    assert "+broken = True" in checkpoint.diff() and "+x = 1" in checkpoint.diff()

    message = undo(root)
    assert "before run run1" in message
    assert snapshot(root) == before
    assert not (root / "pkg").exists()  # folders the run made are gone too
    assert git(root, "diff", "--cached") == index and git(root, "rev-parse", "HEAD") == head
    assert git(root, "status", "--porcelain") == status and git(root, "stash", "list") == ""


def test_copy_checkpoint_outside_git_restores_exactly(tmp_path):
    root = make_repo(tmp_path, "py_mean", use_git=False)
    prepare(root)
    (root / "tests/test_stats.py").chmod(0o600)
    before = snapshot(root)
    checkpoint = Checkpoint(root, "run1")
    assert checkpoint.take()["kind"] == "copy"
    assert (root / ".kog/checkpoints/run1/stats.py").exists()
    mess_up(root)
    undo(root)
    assert snapshot(root) == before


def test_a_copy_checkpoint_skips_named_pipes_and_sockets(tmp_path):
    import socket

    root = make_repo(tmp_path, "py_mean", use_git=False)
    prepare(root)
    os.mkfifo(root / "pipe")  # reading it would wait for a writer forever
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(root / "sock"))
        before = snapshot(root)
        Checkpoint(root, "run1").take()
        mess_up(root)
        undo(root)
        assert snapshot(root) == before


def test_undo_removes_files_hidden_by_an_edited_gitignore(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    Checkpoint(root, "run1").take()
    (root / "new.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("__pycache__/\nnew.py\n")  # the run hides what it added
    (root / "stats.py").unlink()
    (root / "stats.py").mkdir()  # and puts a folder where a file was
    (root / "stats.py/inner.py").write_text("y = 2\n")
    assert "restored 2 file(s), removed 1 added file(s)" in undo(root)
    assert snapshot(root) == before


def test_undo_does_not_write_through_a_folder_turned_symlink(tmp_path):
    root = make_repo(tmp_path, "py_mean", use_git=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    before = snapshot(root)
    Checkpoint(root, "run1").take()
    os.rename(root / "tests", tmp_path / "moved")
    (root / "tests").symlink_to(outside)
    undo(root)
    assert snapshot(root) == before
    assert list(outside.iterdir()) == []


def test_undo_walks_back_one_run_at_a_time(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    first = snapshot(root)
    Checkpoint(root, "run1").take()
    (root / "stats.py").write_text("second = 2\n")
    second = snapshot(root)
    Checkpoint(root, "run2").take()
    (root / "stats.py").write_text("third = 3\n")
    assert "run2" in undo(root) and snapshot(root) == second
    assert "run1" in undo(root) and snapshot(root) == first
    with pytest.raises(KogError, match="nothing to undo"):
        undo(root)


def test_nothing_to_undo(tmp_path):
    with pytest.raises(KogError, match="nothing to undo"):
        undo(tmp_path)
    with pytest.raises(KogError, match="not a directory"):
        undo(tmp_path / "missing")


def test_the_diff_shows_changes_additions_and_deletions(tmp_path):
    root = make_repo(tmp_path, "py_slug")
    checkpoint = Checkpoint(root, "r")
    assert checkpoint.diff() == ""
    checkpoint.take()
    (root / "slug.py").write_text((root / "slug.py").read_text().replace('"_".join', '"-".join'))
    (root / "new.py").write_text("n = 1")
    (root / ".gitignore").unlink()
    diff = checkpoint.diff()
    assert '-    return "_".join(words)\n+    return "-".join(words)\n' in diff
    assert "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+n = 1\n\\ No newline at end of file\n" in diff
    assert "--- a/.gitignore\n+++ /dev/null\n" in diff


def test_the_diff_splits_lines_at_newlines_only(tmp_path):
    """A form feed (a page break in C and Python sources) is not a line end: not a missing newline either."""
    root = make_repo(tmp_path, "py_slug")
    (root / "slug.py").write_text("a = 1\n\f\nb = 2\n")
    git(root, "commit", "-qam", "pages")
    checkpoint = Checkpoint(root, "r")
    checkpoint.take()
    (root / "slug.py").write_text("a = 1\n\f\nb = 3\n")
    assert checkpoint.diff().endswith("@@ -1,3 +1,3 @@\n a = 1\n \f\n-b = 2\n+b = 3\n")


def test_odd_names_and_a_users_kog_branch_do_not_stop_the_checkpoint(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    git(root, "branch", "kog")  # refs/heads/kog/<run> could not exist beside it
    (root / '"q".txt').write_text("a name git reads as C-quoted on --stdin-paths\n")
    before = snapshot(root)
    checkpoint = Checkpoint(root, "t1")
    assert checkpoint.take()["ref"] == "refs/heads/kog-checkpoints/t1"
    (root / '"q".txt').write_text("changed\n")
    (root / "stats.py").unlink()
    undo(root)
    assert snapshot(root) == before


@pytest.mark.parametrize("text", ["{}", "[]", '{"kind": "git", "files": 3}'])
def test_a_damaged_record_is_one_line(tmp_path, text):
    root = make_repo(tmp_path, "py_mean")
    Checkpoint(root, "t1").take()
    (root / ".kog/checkpoints/t1.json").write_text(text)
    with pytest.raises(KogError, match="is damaged"):
        undo(root)


def test_a_copy_checkpoint_missing_a_saved_file_changes_nothing(tmp_path):
    root = make_repo(tmp_path, "py_mean", use_git=False)
    Checkpoint(root, "t1").take()
    (root / "stats.py").write_text("changed\n")
    (root / "pytest.ini").write_text("changed\n")
    (root / ".kog/checkpoints/t1/stats.py").unlink()
    before = snapshot(root)
    with pytest.raises(KogError, match="saved copy is incomplete.*nothing was changed"):
        undo(root)
    assert snapshot(root) == before


def test_runs_started_in_the_same_second_are_undone_newest_first(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    original = snapshot(root)
    Checkpoint(root, "20261204-120000-9000").take()  # the older run, whose id sorts later (its process id)
    (root / "stats.py").write_text("first run\n")
    after_first = snapshot(root)
    Checkpoint(root, "20261204-120000-0001").take()
    (root / "stats.py").write_text("second run\n")
    undo(root)
    assert snapshot(root) == after_first
    undo(root)
    assert snapshot(root) == original


def test_a_shell_enabled_runs_checkpoint_keeps_small_ignored_files(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    ignore(root, ".env", "cache/", "node_modules/")
    (root / ".env").write_text("TOKEN=secret\n")
    (root / ".env").chmod(0o600)
    (root / "cache").mkdir()
    (root / "cache/state.json").write_text('{"a": 1}\n')
    (root / "node_modules").mkdir()
    (root / "node_modules/dep.js").write_text("module.exports = 1\n")
    (root / "big.log").write_bytes(b"x" * ((1 << 20) + 1))
    ignore(root, "big.log")
    checkpoint = Checkpoint(root, "t1", keep_ignored=True)
    record = checkpoint.take()
    assert sorted(record["ignored"]) == [".env", "cache/state.json"]  # not dependencies, not large files
    assert ".env" not in git(root, "ls-tree", "-r", "--name-only", record["ref"])  # never in git, where a push takes it
    assert (root / record["ignored_folder"] / ".env").stat().st_mode & 0o777 == 0o600  # and as private as the file
    before = snapshot(root)
    (root / ".env").unlink()  # what a shell command might do
    (root / "cache/state.json").write_text("{}\n")
    (root / "cache/new.json").write_text("{}\n")
    (root / "stats.py").write_text("changed\n")
    diff = checkpoint.diff()
    assert "stats.py" in diff and ".env" not in diff and "cache/" not in diff  # the run's diff: its edits, not caches
    undo(root)
    assert snapshot(root) == before | {"cache/new.json": snapshot(root)["cache/new.json"]}  # added ignored files stay


def test_without_shell_commands_ignored_files_are_not_saved(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    ignore(root, ".env")
    (root / ".env").write_text("TOKEN=secret\n")
    assert ".env" not in Checkpoint(root, "t1").take()["files"]


def test_the_shallowest_ignored_files_are_kept_first_and_unreadable_ones_skipped(tmp_path, monkeypatch):
    import agent.checkpoint as checkpoint_module

    root = make_repo(tmp_path, "py_mean")
    ignore(root, ".env", "local/", "secret.key")
    (root / "local/deep/er").mkdir(parents=True)
    for i in range(5):
        (root / f"local/deep/er/f{i}.txt").write_text("x\n")
    (root / ".env").write_text("TOKEN=secret\n")
    (root / "secret.key").write_text("not ours to read\n")
    monkeypatch.setitem(checkpoint_module.IGNORED_LIMITS, "files", 3)
    real_read = checkpoint_module._read

    def unreadable(path):
        if path.name == "secret.key":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(checkpoint_module, "_read", unreadable)
    saved = Checkpoint(root, "t1", keep_ignored=True).take()["ignored"]
    assert ".env" in saved and "secret.key" not in saved and len(saved) == 2  # the cap takes the shallowest first


def test_a_damaged_newest_record_stops_undo(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    Checkpoint(root, "t1").take()
    (root / "stats.py").write_text("first run\n")
    Checkpoint(root, "t2").take()
    (root / "stats.py").write_text("second run\n")
    (root / ".kog/checkpoints/t2.json").write_text("{")
    before = snapshot(root)
    with pytest.raises(KogError, match="t2.json is damaged"):
        undo(root)
    assert snapshot(root) == before


def test_undo_refuses_to_overwrite_what_changed_after_the_run_and_keeps_what_it_replaces(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    checkpoint = Checkpoint(root, "run1")
    checkpoint.take()
    (root / "stats.py").write_text("the run's edit\n")
    checkpoint.seal()
    (root / "stats.py").write_text("the run's edit\nand the user's, after it\n")
    (root / "tests/test_stats.py").write_text("edited by the user after the run\n")  # a file the run left alone
    (root / "after.txt").write_text("new work\n")
    (root / "pkg/.ruff_cache").mkdir(parents=True)
    (root / "pkg/.ruff_cache/m").write_bytes(b"regenerated")  # a tool's cache, not ignored here: it does not count
    later = snapshot(root)
    with pytest.raises(KogError, match=r"3 file\(s\) changed since run run1 ended \(after.txt, stats.py, tests/test_stats.py\)"):
        undo(root)
    assert snapshot(root) == later and "kog/run1" in git(root, "branch", "--list", "kog/*")

    assert "what it replaced is in .kog/checkpoints/run1.undone/" in undo(root, force=True)
    assert snapshot(root) == before
    kept = root / ".kog/checkpoints/run1.undone"
    assert (kept / "stats.py").read_text() == "the run's edit\nand the user's, after it\n"
    assert (kept / "tests/test_stats.py").read_text() == "edited by the user after the run\n"
    assert (kept / "after.txt").read_text() == "new work\n"
    assert git(root, "branch", "--list", "kog/*") == ""  # the checkpoint's branch goes with the undo


def test_undo_of_a_sealed_run_with_nothing_changed_since_needs_no_force(tmp_path):
    root = make_repo(tmp_path, "py_mean", use_git=False)
    before = snapshot(root)
    checkpoint = Checkpoint(root, "run1")
    checkpoint.take()
    (root / "stats.py").write_text("the run's edit\n")
    (root / "new.py").write_text("added by the run\n")
    checkpoint.seal()
    assert "restored 1 file(s), removed 1 added file(s)" in undo(root)
    assert snapshot(root) == before
    assert (root / ".kog/checkpoints/run1.undone/new.py").read_text() == "added by the run\n"


def sealed_run(root, edit):
    """A checkpoint, the run's `edit`, and the seal a run's end writes."""
    checkpoint = Checkpoint(root, "run1")
    checkpoint.take()
    edit(root)
    checkpoint.seal()


@pytest.mark.parametrize("use_git", [True, False])
def test_undo_of_a_run_that_added_a_relative_link(tmp_path, use_git):
    root = make_repo(tmp_path, "py_mean", use_git=use_git)
    before = snapshot(root)
    sealed_run(root, lambda r: (r / "alias.py").symlink_to("tests/test_stats.py"))  # dangling from the kept copy
    assert "removed 1 added file(s)" in undo(root)
    assert snapshot(root) == before and os.readlink(root / ".kog/checkpoints/run1.undone/alias.py") == "tests/test_stats.py"


def test_what_the_user_put_in_a_files_place_after_the_run_is_kept_whole(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    sealed_run(root, lambda r: (r / "stats.py").write_text("the run's edit\n"))
    (root / "stats.py").unlink()
    (root / "stats.py").mkdir()  # a folder, with a link and a read-only file
    (root / "stats.py/a.txt").write_text("the user's\n")
    (root / "stats.py/a.txt").chmod(0o444)
    (root / "stats.py/link").symlink_to("a.txt")
    with pytest.raises(KogError, match=r"changed since run run1 ended \(stats.py"):
        undo(root)
    undo(root, force=True)
    assert snapshot(root) == before
    kept = root / ".kog/checkpoints/run1.undone/stats.py"
    assert (kept / "a.txt").read_text() == "the user's\n" and os.readlink(kept / "link") == "a.txt"


@pytest.mark.parametrize("absolute", [True, False])
def test_undo_never_writes_through_a_folder_the_user_turned_into_a_link(tmp_path, absolute):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    sealed_run(root, lambda r: (r / "tests/test_stats.py").write_text("the run's edit\n"))
    elsewhere = tmp_path / "elsewhere"
    os.rename(root / "tests", elsewhere)
    (elsewhere / "test_stats.py").write_text("the user's, outside\n")
    (root / "tests").symlink_to(elsewhere if absolute else "../elsewhere")
    with pytest.raises(KogError, match=r"\(tests\)"):
        undo(root)
    undo(root, force=True)
    assert snapshot(root) == before and (elsewhere / "test_stats.py").read_text() == "the user's, outside\n"
    assert (root / ".kog/checkpoints/run1.undone/tests").is_symlink()


def test_a_later_edit_under_a_tracked_build_folder_stops_undo(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    (root / "build").mkdir()
    (root / "build/release.sh").write_text("echo v1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "build script")
    sealed_run(root, lambda r: (r / "stats.py").write_text("the run's edit\n"))
    (root / "build/release.sh").write_text("echo v2\n")  # a folder name tools use, but the project's own file
    with pytest.raises(KogError, match=r"\(build/release.sh\)"):
        undo(root)


def test_a_file_standing_where_a_folder_goes_back_stops_undo_and_is_kept(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    ignore(root, "out")
    (root / "out").mkdir()
    (root / "out/keep.cfg").write_text("tracked on purpose\n")
    git(root, "add", "-f", "out/keep.cfg")
    git(root, "commit", "-qm", "config")
    before = snapshot(root)
    sealed_run(root, lambda r: ((r / "out/keep.cfg").unlink(), (r / "out").rmdir()))
    (root / "out").write_text("the user's file, made after the run\n")
    with pytest.raises(KogError, match=r"\(out\)"):
        undo(root)
    undo(root, force=True)
    assert snapshot(root) == before
    assert (root / ".kog/checkpoints/run1.undone/out").read_text() == "the user's file, made after the run\n"


@pytest.mark.parametrize("use_git", [True, False])
def test_undo_of_a_run_that_made_a_folder_a_link_to_a_folder_inside(tmp_path, use_git):
    root = make_repo(tmp_path, "py_mean", use_git=use_git)
    before = snapshot(root)
    sealed_run(root, lambda r: (os.rename(r / "tests", r / "moved"), (r / "tests").symlink_to("moved")))
    undo(root)  # tests/test_stats.py, read through the link, looked unchanged: it was not put back
    assert snapshot(root) == before


@pytest.mark.parametrize("use_git", [True, False])
def test_undo_keeps_and_makes_again_the_empty_folders_there_before_the_run(tmp_path, use_git):
    root = make_repo(tmp_path, "py_mean", use_git=use_git)
    (root / "out").mkdir()
    (root / "spare/deep").mkdir(parents=True)
    before = snapshot(root)
    sealed_run(root, lambda r: ((r / "out/result.txt").write_text("the run's\n"), (r / "spare/deep").rmdir()))
    undo(root)  # out/ once went with the file the run added in it, and spare/deep stayed gone
    assert (root / "out").is_dir() and (root / "spare/deep").is_dir() and snapshot(root) == before
