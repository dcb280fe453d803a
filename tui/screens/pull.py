"""Download a registry model with a progress bar, inside the app."""

from __future__ import annotations

import threading
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, ProgressBar

from engine.errors import KogError
from engine.pull import fetch
from engine.registry import ModelSpec
from tui.screens.dialog import Dialog
from tui.screens.models import size_text


class PullModel(Dialog[Path | str]):
    """Dismisses with the model's local path once it is installed, or with the error's one line."""

    class Progress(Message):
        def __init__(self, stage: str, done: int, total: int | None):
            super().__init__()
            self.stage, self.done, self.total = stage, done, total

    class Finished(Message):
        def __init__(self, result: Path | str):
            super().__init__()
            self.result = result

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self._stop = threading.Event()

    def compose(self) -> ComposeResult:
        with Vertical(classes="box"):
            yield Label(f"Downloading {self.spec.name} ({size_text(self.spec.size)})", classes="title", markup=False)
            yield Label("starting", id="stage", markup=False)
            yield ProgressBar(total=None, show_eta=False)
            yield Label("The model is verified, then used in this chat.", classes="hint")

    def on_mount(self) -> None:
        self._download()

    @work(thread=True)
    def _download(self) -> None:
        def report(stage: str, done: int, total: int | None) -> None:
            if self._stop.is_set():  # raised inside the download, which cleans up (a hub download keeps its part to resume)
                name = self.spec.name
                raise KogError(f"the download of {name} was stopped; /model {name} or `kog pull {name}` starts it again")
            self.post_message(self.Progress(stage, done, total))

        try:
            result: Path | str = fetch(self.spec, progress=False, on_progress=report)
        except KogError as e:
            result = str(e)
        except Exception as e:  # the app must outlive whatever the download hits
            result = f"downloading {self.spec.name} failed: {type(e).__name__}: {e}"
        self.post_message(self.Finished(result))

    def on_pull_model_progress(self, event: Progress) -> None:
        self.query_one("#stage", Label).update(f"{event.stage} {size_text(event.done)}" if event.done else event.stage)
        self.query_one(ProgressBar).update(total=event.total, progress=event.done)

    def on_pull_model_finished(self, event: Finished) -> None:
        self.dismiss(event.result)

    def action_close(self) -> None:
        """Esc stops the download at its next progress report; the dialog closes once it has."""
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self.query_one("#stage", Label).update("stopping…")
