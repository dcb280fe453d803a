"""The message box: Enter sends, Shift+Enter or Ctrl+J starts a new line."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    DEFAULT_CSS = """
    PromptInput { height: auto; min-height: 3; max-height: 10; min-width: 12; }
    """

    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, **kwargs):
        placeholder = "Message (Enter sends, Shift+Enter or Ctrl+J: new line, /help: commands)"
        super().__init__(soft_wrap=True, show_line_numbers=False, placeholder=placeholder, **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        # Runs before TextArea's own handler, which would insert a newline for Enter.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
        elif event.key in ("shift+enter", "ctrl+j"):  # most terminals send Shift+Enter as plain Enter
            event.stop()
            event.prevent_default()
            self.insert("\n")
