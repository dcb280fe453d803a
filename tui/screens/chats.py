"""The saved chats, most recent first; Enter opens one."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from tui.screens.dialog import Dialog
from tui.store import Conversation
from tui.widgets.conversation import printable


def chat_row(chat: Conversation) -> Text:
    row = Text(f"#{chat.id:<5}", style="dim")
    row.append(time.strftime("%Y-%m-%d %H:%M  ", time.localtime(chat.updated)))
    row.append(printable(chat.title) or "(untitled)", style="bold")
    row.append(f"  {chat.message_count} messages · {printable(chat.model)}", style="dim")
    return row


class ChatList(Dialog[int]):
    """Dismisses with the chosen chat's id, or None."""

    def __init__(self, chats: list[Conversation]):
        super().__init__()
        self.chats = chats

    def compose(self) -> ComposeResult:
        with Vertical(classes="box"):
            yield Label("Saved chats", classes="title")
            if self.chats:
                yield OptionList(*[Option(chat_row(c), id=str(c.id)) for c in self.chats])
            else:
                yield Label("No saved chats yet.")
            yield Label("Enter: open    Esc: close", classes="hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id))
