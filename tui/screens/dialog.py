"""The frame every modal of the chat shares: a bordered box in the middle, Esc closes it."""

from __future__ import annotations

from typing import TypeVar

from textual.binding import Binding
from textual.screen import ModalScreen

T = TypeVar("T")


class Dialog(ModalScreen[T]):
    DEFAULT_CSS = """
    Dialog { align: center middle; }
    Dialog > .box {
        width: 95%; max-width: 90; min-width: 24; height: auto; max-height: 90%;  /* rich cannot wrap text into 0 columns */
        border: round $accent; background: $surface; padding: 0 1;
    }
    Dialog .title { text-style: bold; margin: 0 0 1 0; width: 100%; }  /* long titles wrap */
    Dialog .hint { color: $text-muted; margin: 1 0 0 0; }
    """
    BINDINGS = [Binding("escape", "close", "Close")]

    def action_close(self) -> None:
        self.dismiss(None)
