"""Save the repository before the agent's first write; put it back byte for byte on undo.

What a checkpoint covers: in a git repository (at its top level) every file git does not
ignore — tracked or not — saved as a commit on a `kog/<run id>` branch (`kog-checkpoints/<run id>`
where the user has a branch named `kog`), made from a
scratch index so the user's index, HEAD and stash are never touched; blobs are written
without git's filters (eol, clean/smudge), so what comes back is the bytes that were there.
Anywhere else, every file outside `.kog/`, copied under `.kog/checkpoints/<run id>/`.
A record beside it lists each file's mode and blob id; `undo` rewrites the files whose
bytes or mode differ and deletes the files the run added. The agent may not write a file
git ignores, since no checkpoint would hold it. Where shell commands may run (which can touch
any file), a git checkpoint also keeps copies of the small files git ignores (`.env`, local
settings: IGNORED_LIMITS, the shallowest first, outside dependency, build and cache folders)
under `kog/<run id>.ignored/` in the git directory, where neither a push nor the run's own `git clean -x`
reaches them; undo puts back those a run changed or deleted, and leaves the ignored files a run added alone.

At its end a run seals the record with the files as it leaves them. Undo then refuses, unless
forced, to overwrite or delete what changed after that (the user's own later work), and in every
case keeps the files as they were just before the undo under `.kog/checkpoints/<run id>.undone/`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path, PurePosixPath

from agent.edits import lines_of
from agent.errors import ToolError
from agent.workspace import SKIP_DIRS
from engine.files import write_atomic
from engine.errors import KogError

KOG_DIR = ".kog"
# Ignored files a shell-enabled run's checkpoint holds: each at most this many bytes, this many in all
IGNORED_LIMITS = {"file_bytes": 1 << 20, "files": 2000, "total_bytes": 64 << 20}
# Folders of ignored files that tools remake (beside the workspace's dependency and build folders)
CACHE_DIRS = {".mypy_cache", ".pytest_cache", ".ruff_cache", ".cache", ".next", ".nuxt", ".gradle", ".idea", ".vs",
              ".eggs", "htmlcov", ".coverage_html", ".parcel-cache", ".turbo"}
CHECKPOINTS = f"{KOG_DIR}/checkpoints"
LINK = 0o120000
IDENTITY = {"GIT_AUTHOR_NAME": "kog agent", "GIT_AUTHOR_EMAIL": "kog@localhost",
            "GIT_COMMITTER_NAME": "kog agent", "GIT_COMMITTER_EMAIL": "kog@localhost"}


def kog_dir(root: Path) -> Path:
    """`.kog/` in the repository, created with a .gitignore that keeps it out of git's view."""
    folder = root / KOG_DIR
    try:
        folder.mkdir(exist_ok=True)
        ignore = folder / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")
    except OSError as e:
        raise KogError(f"cannot write {folder}: {e.strerror}") from None
    return folder


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid() % 10000:04d}"


# --- the two places a checkpoint can live ----------------------------------------------------

def _git(root: Path, *args: str, stdin: bytes | None = None, env: dict | None = None) -> bytes:
    result = subprocess.run(["git", *args], cwd=root, input=stdin, capture_output=True, check=False, env=os.environ | (env or {}))
    if result.returncode != 0:
        message = " ".join(result.stderr.decode(errors="replace").split()) or f"exit {result.returncode}"
        raise KogError(f"git {args[0]} failed in {root}: {message}")
    return result.stdout


class GitStore:
    kind = "git"

    def __init__(self, root: Path):
        self.root = root
        fmt = subprocess.run(["git", "rev-parse", "--show-object-format"], cwd=root, capture_output=True, check=False, text=True)
        self.algorithm = fmt.stdout.strip() if fmt.returncode == 0 and fmt.stdout.strip() else "sha1"

    def current(self) -> list[str]:
        names = _git(self.root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").decode(errors="surrogateescape")
        return [n for n in dict.fromkeys(names.split("\0")) if n and _is_file_or_link(self.root / n)]

    def ignored(self) -> list[str]:
        """The small files git ignores, outside dependency, build and cache folders, within IGNORED_LIMITS:
        the shallowest and smallest first (a `.env` at the top before anything deep in a tree)."""
        names = _git(self.root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard").decode(errors="surrogateescape")
        candidates = []
        for name in names.split("\0"):
            parts = PurePosixPath(name).parts
            if not name or set(parts) & (SKIP_DIRS | CACHE_DIRS | {KOG_DIR}) or any(p.endswith(".egg-info") for p in parts):
                continue
            try:
                size = (self.root / name).lstat().st_size
            except OSError:
                continue  # gone since the listing
            if size <= IGNORED_LIMITS["file_bytes"]:
                candidates.append((len(parts), size, name))
        kept, total = [], 0
        for _, size, name in sorted(candidates):
            if len(kept) == IGNORED_LIMITS["files"] or total + size > IGNORED_LIMITS["total_bytes"]:
                break
            kept.append(name)
            total += size
        return kept

    def git_path(self, name: str) -> str:
        """`name` in the git directory: relative to the root (or absolute, as a worktree's)."""
        return os.fsdecode(_git(self.root, "rev-parse", "--git-path", name).rstrip(b"\n"))

    def covers(self, path: str) -> bool:
        ignored = subprocess.run(["git", "check-ignore", "-q", "--", path], cwd=self.root, check=False)
        return ignored.returncode != 0

    def save(self, run_id: str, files: dict[str, list]) -> dict:
        regular = [p for p, (mode, _) in files.items() if mode != LINK]
        # One process hashes all regular files; a name with a newline, or one that starts with a double
        # quote (read as a C-quoted name there), cannot go through --stdin-paths.
        plain = [p for p in regular if "\n" not in p and not p.startswith('"')]
        if plain:
            _git(self.root, "hash-object", "-w", "--no-filters", "--stdin-paths", stdin=os.fsencode("\n".join(plain)))
        for p in set(regular) - set(plain):
            _git(self.root, "hash-object", "-w", "--no-filters", "--", p)
        for p, (mode, _) in files.items():
            if mode == LINK:
                _git(self.root, "hash-object", "-w", "--stdin", stdin=os.readlink(self.root / p).encode())
        # (os.fsencode: a name that is not UTF-8, as git listed it, goes back as the same bytes)
        entries = b"".join(os.fsencode(f"{_git_mode(mode)} {digest}\t{p}\0") for p, (mode, digest) in files.items())
        with tempfile.TemporaryDirectory(prefix="kog-index-") as scratch:
            index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
            _git(self.root, "update-index", "-z", "--index-info", stdin=entries, env=index)
            tree = _git(self.root, "write-tree", env=index).decode().strip()
        head = subprocess.run(["git", "rev-parse", "-q", "--verify", "HEAD^{commit}"], cwd=self.root, capture_output=True, check=False, text=True)
        parent = ["-p", head.stdout.strip()] if head.returncode == 0 else []
        message = f"kog checkpoint {run_id}: the working tree before the agent's first edit"
        commit = _git(self.root, "commit-tree", tree, *parent, "-m", message, env=IDENTITY).decode().strip()
        # kog/<run id>, unless the user has a branch named kog (a ref cannot also be a folder of refs)
        users_kog = subprocess.run(["git", "rev-parse", "-q", "--verify", "refs/heads/kog"], cwd=self.root,
                                   capture_output=True, check=False).returncode == 0
        ref = f"refs/heads/{'kog-checkpoints' if users_kog else 'kog'}/{run_id}"
        _git(self.root, "update-ref", ref, commit, "")  # "" as old value: refuse to overwrite an existing branch
        return {"ref": ref, "commit": commit}

    def data(self, record: dict, path: str, digest: str) -> bytes:
        return _git(self.root, "cat-file", "blob", digest)


class CopyStore:
    kind = "copy"

    def __init__(self, root: Path):
        self.root = root
        self.algorithm = "sha1"

    def current(self) -> list[str]:
        found = []
        for folder, dirs, names in os.walk(self.root):
            here = Path(folder)
            dirs[:] = [d for d in dirs if d != ".git" and not (here == self.root and d == KOG_DIR)]
            # a symlink to a folder is listed by os.walk among the folders: it is a file to us; a named pipe or a
            # socket is not (reading one would wait forever or fail)
            found += [(here / n).relative_to(self.root).as_posix() for n in names + [d for d in dirs if (here / d).is_symlink()]
                      if _is_file_or_link(here / n)]
            dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
        return found

    def covers(self, path: str) -> bool:
        return True

    def save(self, run_id: str, files: dict[str, list]) -> dict:
        folder = f"{CHECKPOINTS}/{run_id}"
        for p, (mode, _) in files.items():
            _keep_copy(self.root / p, self.root / folder / p, mode)
        return {"folder": folder}

    def data(self, record: dict, path: str, digest: str) -> bytes:
        copy = self.root / record["folder"] / path
        return os.readlink(copy).encode() if copy.is_symlink() else copy.read_bytes()


def _store(root: Path, kind: str | None = None):
    if kind is None:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, check=False, text=True) if shutil.which("git") else None
        kind = "git" if top is not None and top.returncode == 0 and Path(top.stdout.strip()).resolve() == root else "copy"
    return GitStore(root) if kind == "git" else CopyStore(root)


# --- the state of one file -------------------------------------------------------------------

def _keep_copy(source: Path, copy: Path, mode: int) -> None:
    """A checkpoint's copy of one file (a link as a link), with the file's permission bits (a `.env` stays private)."""
    copy.parent.mkdir(parents=True, exist_ok=True)
    if mode == LINK:
        os.symlink(os.readlink(source), copy)
    else:
        shutil.copyfile(source, copy)
        os.chmod(copy, mode)


def _is_file_or_link(path: Path) -> bool:
    return path.is_symlink() or path.is_file()


def _git_mode(mode: int) -> str:
    return "120000" if mode == LINK else ("100755" if mode & 0o111 else "100644")


def _read(path: Path) -> tuple[int, bytes] | None:
    """(mode, bytes) of a file as the checkpoint sees it: a link is its target; None if absent."""
    if path.parent.resolve() != path.parent:
        return None  # behind a link (a folder the run made a link, even to a folder inside): not the file itself
    try:
        if path.is_symlink():
            return LINK, os.readlink(path).encode()
        return path.stat().st_mode & 0o7777, path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _blob_id(data: bytes, algorithm: str) -> str:
    return hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest()


def _state(path: Path, algorithm: str) -> list | None:
    """[mode, blob id] of a file (a link: of its target), as a record holds it; None if absent."""
    now = _read(path)
    return None if now is None else [now[0], _blob_id(now[1], algorithm)]


def _states(root: Path, paths: list[str], algorithm: str) -> dict[str, list]:
    states = {p: _state(root / p, algorithm) for p in dict.fromkeys(paths)}
    return {p: state for p, state in states.items() if state is not None}


# --- the checkpoint --------------------------------------------------------------------------

class Checkpoint:
    """Taken lazily: `before_write` saves the repository the first time anything is about to change.
    `keep_ignored`: shell commands may run, so small ignored files are saved too (git checkpoints)."""

    def __init__(self, root: Path, run_id: str, keep_ignored: bool = False):
        self.root = Path(root).resolve()
        self.run_id = run_id
        self.store = _store(self.root)
        self.keep_ignored = keep_ignored and self.store.kind == "git"  # (a copy checkpoint holds every file)
        self.record: dict | None = None

    @property
    def kind(self) -> str:
        return self.store.kind

    def before_write(self, path: str) -> None:
        if not self.store.covers(path):
            raise ToolError(f"{path}: ignored by git, so no checkpoint could restore it; edit tracked files only")
        self.take()

    def take(self) -> dict:
        if self.record is None:
            files = _states(self.root, self.store.current(), self.store.algorithm)
            record = {"id": self.run_id, "kind": self.store.kind, "created": time.time(), "undone": False, "files": files,
                      "empty_dirs": _empty_dirs(self.root)}
            record |= self.store.save(self.run_id, files)
            if self.keep_ignored:
                folder = self.store.git_path(f"kog/{self.run_id}.ignored")
                record |= _save_ignored(self.root, folder, self.store.ignored(), self.store.algorithm)
            self._write(record)
        return self.record

    def seal(self) -> None:
        """Record the files as the run leaves them: undo tells the user's later changes from the run's by them."""
        if self.record is not None:
            paths = self.store.current() + list(self.record.get("ignored", {}))
            self._write(self.record | {"after": _states(self.root, paths, self.store.algorithm)})

    def _write(self, record: dict) -> None:
        where = kog_dir(self.root) / "checkpoints" / f"{self.run_id}.json"
        try:
            write_atomic(where, json.dumps(record).encode())
        except OSError as e:  # kog's own failure (a full disk), not the model's: it ends the run
            raise KogError(f"cannot save the checkpoint {where}: {e.strerror or e}") from None
        self.record = record

    def diff(self) -> str:
        """The unified diff from the checkpoint to the files now; empty when nothing was written."""
        if self.record is None:
            return ""
        return _diff(self.root, self.store, self.record)


def _empty_dirs(root: Path) -> list[str]:
    """The folders holding nothing (outside dependency, build and cache folders): no saved file brings them back."""
    found = []
    for folder, dirs, names in os.walk(root):
        if not (dirs or names):
            found.append(Path(folder).relative_to(root).as_posix())
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS | CACHE_DIRS]
    return found


def _save_ignored(root: Path, folder: str, paths: list[str], algorithm: str) -> dict:
    """Copies of the ignored files `paths` in `folder`, and the record's entries for them; a file that
    cannot be read (another user's, gone since) is left out."""
    saved = {}
    for p in paths:
        try:
            now = _read(root / p)
            if now is not None:
                _keep_copy(root / p, root / folder / p, now[0])
                saved[p] = [now[0], _blob_id(now[1], algorithm)]
        except OSError:
            continue
    return {"ignored": saved, "ignored_folder": folder}


def _changes(root: Path, store, record: dict, with_ignored: bool = True) -> list[tuple[str, bytes | None, tuple[int, bytes] | None, int]]:
    """(path, saved bytes or None, (mode, bytes) now or None, saved mode) for each file that differs; the
    saved ignored files too `with_ignored` (undo restores them; the run's diff leaves them out)."""
    saved = record["files"]
    out = []
    for path in sorted(set(saved) | set(store.current())):
        now = _read(root / path)
        if path in saved:
            mode, digest = saved[path]
            if now is not None and now[0] == mode and _blob_id(now[1], store.algorithm) == digest:
                continue
            out.append((path, store.data(record, path, digest), now, mode))
        elif now is not None:
            out.append((path, None, now, 0))
    if with_ignored and record.get("ignored"):
        copies = CopyStore(root)
        for path, (mode, digest) in sorted(record["ignored"].items()):
            now = _read(root / path)
            if now is None or now[0] != mode or _blob_id(now[1], store.algorithm) != digest:
                out.append((path, copies.data({"folder": record["ignored_folder"]}, path, digest), now, mode))
    return out


def _diff(root: Path, store, record: dict) -> str:
    parts = []
    for path, old, now, old_mode in _changes(root, store, record, with_ignored=False):
        path = os.fsencode(path).decode(errors="backslashreplace")  # a name that is not UTF-8: text a log can hold
        new = now[1] if now is not None else None
        if old == new:
            parts.append(f"mode {path}: {oct(old_mode)} -> {oct(now[0])}\n")
            continue
        a, b = (f"a/{path}" if old is not None else "/dev/null"), (f"b/{path}" if new is not None else "/dev/null")
        if b"\0" in (old or b"") + (new or b""):
            parts.append(f"Binary files {a} and {b} differ\n")
            continue
        old_lines = lines_of((old or b"").decode("utf-8", errors="replace"))
        new_lines = lines_of((new or b"").decode("utf-8", errors="replace"))
        for line in difflib.unified_diff(old_lines, new_lines, a, b):
            parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(parts)


# --- undo ------------------------------------------------------------------------------------

def _records(root: Path) -> list[Path]:
    """The checkpoint records, oldest first: by creation time (two runs started in the same second), then name."""
    def created(path: Path) -> float:
        try:
            value = json.loads(path.read_text())["created"]
            if isinstance(value, (int, float)):
                return float(value)
        except (OSError, ValueError, LookupError, TypeError):
            pass
        return float("inf")  # a damaged record sorts last: undo stops at it rather than pass over it
    return sorted((root / CHECKPOINTS).glob("*.json"), key=lambda p: (created(p), p.name))


def undo(root: Path, force: bool = False) -> str:
    """Restore the newest checkpoint not yet undone; return one line saying what changed. Files changed since
    the run ended stop it unless `force`; what it replaces is kept either way."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise KogError(f"{root} is not a directory")
    for path in reversed(_records(root)):
        damaged = KogError(f"{path} is damaged; restore by hand from its kog/ (or kog-checkpoints/) branch or .kog/checkpoints/")
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            raise damaged from None
        if not (isinstance(record, dict) and record.get("kind") in ("git", "copy") and isinstance(record.get("files"), dict)):
            raise damaged
        if not record.get("undone"):
            break
    else:
        raise KogError(f"nothing to undo in {root}: no kog agent run has changed it")
    store = _store(root, record["kind"])
    # Saved files first: a restored .gitignore decides which of the remaining files count as added.
    try:  # (everything read before anything is written)
        changes = _changes(root, store, record)
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise KogError(f"{path} cannot be restored: its saved copy is incomplete ({e}); nothing was changed") from None
    kept = f"{CHECKPOINTS}/{record['id']}.undone"
    replaced = [p for p in dict.fromkeys(_in_the_way(root, c[0]) for c in changes) if p is not None]
    later = _changed_since_the_run(root, store.algorithm, record, replaced)
    if later and not force:
        names = ", ".join(later[:3]) + (f" and {len(later) - 3} more" if len(later) > 3 else "")
        raise KogError(f"{len(later)} file(s) changed since run {record['id']} ended ({names}): undo would overwrite or "
                       f"delete them; commit or move them first, or pass --force (their copies are then kept in {kept}/)")
    try:
        for rel in replaced:
            _keep_before_undo(root, rel, root / kept)
    except OSError as e:
        raise KogError(f"cannot keep a copy of {rel} in {kept}/ ({e.strerror or e}); nothing was restored") from None
    restored = [c for c in changes if c[1] is not None]
    for rel, old, _, mode in restored:
        _restore(root, root / rel, old, mode)
    added = [rel for rel, old, _, _ in _changes(root, store, record) if old is None]
    for rel in added:
        _keep_before_undo(root, rel, root / kept)  # (one a restored .gitignore shows was not kept above)
        (root / rel).unlink()
        _prune((root / rel).parent, root, set(record.get("empty_dirs", ())))
    for rel in record.get("empty_dirs", ()):  # the empty folders the run removed: never made through a link or over a file
        if _in_the_way(root, rel) is None:
            (root / rel).mkdir(parents=True)
    record["undone"] = True
    write_atomic(path, json.dumps(record).encode())
    if record["kind"] == "git":  # its blobs are no longer needed, and a kog/ branch should not linger into a push
        subprocess.run(["git", "update-ref", "-d", record["ref"]], cwd=root, capture_output=True, check=False)
    return (f"restored {len(restored)} file(s), removed {len(added)} added file(s): back to the state before run "
            f"{record['id']}" + (f"; what it replaced is in {kept}/" if (root / kept).exists() else ""))


def _in_the_way(root: Path, rel: str) -> str | None:
    """What undo removes to put `rel` back: a file or link standing where one of its folders goes (`_clear_way`;
    nothing past a link, which lies outside the repository, is touched), else `rel` itself if anything is there."""
    parts = PurePosixPath(rel).parts
    for depth in range(1, len(parts)):
        folder = root.joinpath(*parts[:depth])
        if folder.is_symlink() or folder.is_file():
            return "/".join(parts[:depth])
        if not folder.exists():
            return None
    return rel if os.path.lexists(root / rel) else None


def _changed_since_the_run(root: Path, algorithm: str, record: dict, paths: list[str]) -> list[str]:
    """Of the paths undo would replace, those changed since the run sealed its record (none from a run that ended
    before it could seal, such as a killed one). A tool's cache the checkpoint did not hold does not count."""
    after = record.get("after")
    if not isinstance(after, dict):
        return []
    def a_cache(p: str) -> bool:
        return p not in record["files"] and bool(set(PurePosixPath(p).parts) & (CACHE_DIRS | {"__pycache__"}))
    return [p for p in paths if _state(root / p, algorithm) != after.get(p) and not a_cache(p)]


def _keep_before_undo(root: Path, rel: str, folder: Path) -> None:
    """A copy of what is at `rel` now (a file, a link or a whole folder) under `folder`, before undo replaces it;
    nothing if it is kept already (inside a folder kept whole)."""
    source, copy = root / rel, folder / rel
    if os.path.lexists(copy) or not copy.parent.resolve().is_relative_to(folder.resolve()):
        return  # (the second: a kept link on the way would take the copy outside)
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, copy, symlinks=True)
    elif _is_file_or_link(source):
        _keep_copy(source, copy, LINK if source.is_symlink() else source.lstat().st_mode & 0o7777)


def _restore(root: Path, target: Path, data: bytes, mode: int) -> None:
    _clear_way(target, root)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)  # a folder where a file was: all of it came after the checkpoint
    elif target.is_symlink() or (mode == LINK and target.exists()):
        target.unlink()  # a link is replaced, never written through
    if mode == LINK:
        os.symlink(data.decode(), target)
    else:
        write_atomic(target, data, mode=mode)


def _clear_way(target: Path, root: Path) -> None:
    """Make target's folders real folders inside the repository again.

    A folder that became a symlink (or a file) after the checkpoint is not part of it: writing
    through it could land outside the repository, so it goes.
    """
    folder = root
    for part in target.relative_to(root).parts[:-1]:
        folder = folder / part
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        folder.mkdir(exist_ok=True)


def _prune(folder: Path, root: Path, empty_before: set[str]) -> None:
    """Remove folders the run created and left empty (not those empty before it)."""
    while folder != root and folder.relative_to(root).as_posix() not in empty_before and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
