"""A yes/no question."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label

from tui.screens.dialog import Dialog


class Confirm(Dialog[bool]):
    BINDINGS = [Binding("y,enter", "answer(True)", "Yes"), Binding("n", "answer(False)", "No")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="box"):
            yield Label(self.question, classes="title", markup=False)
            yield Label("y / Enter: yes    n / Esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def action_close(self) -> None:
        self.dismiss(False)
