"""The clipboard's fallback: the code block on screen, ready to select with the mouse."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, TextArea

from tui.screens.dialog import Dialog
from tui.widgets.conversation import printable


class CodeView(Dialog[None]):
    DEFAULT_CSS = """
    CodeView TextArea { height: auto; max-height: 30; }
    """

    def __init__(self, code: str, why: str):
        super().__init__()
        self.code = code
        self.why = why

    def compose(self) -> ComposeResult:
        with Vertical(classes="box"):
            yield Label(self.why, classes="title", markup=False)
            yield TextArea(printable(self.code), read_only=True, show_line_numbers=True)
            yield Label("Select with the mouse or Shift+arrows; Ctrl+C copies the selection    Esc: close",
                        classes="hint")
