"""The scrolling conversation: replies rendered as Markdown (the user's messages as typed), the reply in flight streamed.

Messages are Rich Markdown in plain Static widgets (code blocks syntax-highlighted): one widget
per message keeps layout cheap however long the chat grows. A streaming reply is split into
the top-level blocks that further text can no longer change, each rendered once into its own
widget, and the last block, which is redrawn as it grows; so a refresh costs the size of one
block, not of the whole reply. When the reply ends it is rendered once more, whole.

The view is anchored to its bottom while the user leaves it there; scrolling up releases the
anchor (Textual's own behaviour), so new text never pulls the user away from what they read.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from rich.markdown import Markdown
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Static

ROLE_TITLES = {"user": "you", "assistant": "kog"}
CODE_THEME = "monokai"

# The block grammar Rich's Markdown uses, so the streamed blocks split where Rich's would.
_BLOCKS = MarkdownIt("commonmark").enable("strikethrough").enable("table")


# Control characters a terminal would act on, not show: ESC starts sequences that retitle the window
# or wipe the screen, SO swaps the character set. Shown as their Unicode pictures instead.
_CONTROLS = {c: 0x2400 + c for c in range(0x20) if chr(c) not in "\t\n\r"} | {0x7F: 0x2421}
_CONTROLS |= {c: 0xFFFD for c in range(0x80, 0xA0)}  # C1 controls (0x9B is a CSI of its own)


def printable(text: str) -> str:
    """`text` safe to put on the screen as it is (tabs and line breaks kept)."""
    return text.translate(_CONTROLS)


def title(role: str, note: str = "") -> str:
    """A message's heading: who speaks, and why a reply ended early ("stopped") where it did."""
    name = ROLE_TITLES.get(role, role)
    return f"{name} · {note}" if note else name


def markdown(text: str) -> Markdown:
    return Markdown(printable(text), code_theme=CODE_THEME)


def settled_length(text: str) -> int:
    """The length of the prefix of `text` made of whole top-level Markdown blocks that no
    continuation of `text` can change: everything before its last block."""
    starts = [t.map[0] for t in _BLOCKS.parse(text) if t.level == 0 and t.nesting >= 0 and t.map]
    if len(starts) < 2:
        return 0
    lines = text.splitlines(keepends=True)
    return sum(len(line) for line in lines[: starts[-1]])


class MessageView(Vertical):
    DEFAULT_CSS = """
    MessageView { height: auto; margin: 0 0 1 0; }
    MessageView > Label { color: $text-muted; text-style: bold; }
    MessageView.-user > Label { color: $accent; }
    MessageView > Static { padding: 0 1; }
    """

    def __init__(self, role: str, text: str = "", note: str = ""):
        super().__init__(classes=f"-{role}")
        self.role = role
        self.text = text
        self.note = note  # why a reply ended early ("stopped"), beside its title

    def compose(self) -> ComposeResult:
        yield Label(title(self.role, self.note))
        if self.role == "user":  # as typed: pasted code keeps its lines and indentation, <tags> stay
            yield Static(printable(self.text), markup=False)
        else:
            yield Static(markdown(self.text), classes="tail")


class ReplyView(MessageView):
    """An assistant message that grows while the reply streams."""

    def __init__(self):
        super().__init__("assistant")
        self._settled = 0  # characters of text already rendered into their own blocks
        self.finished = False

    async def show(self, text: str) -> None:
        """Show `text`, the reply so far (the text shown before is a prefix of it)."""
        if self.finished:
            return
        self.text = text
        tail = self.query_one(".tail", Static)
        cut = self._settled + settled_length(text[self._settled :])
        if cut > self._settled:
            chunk, self._settled = text[self._settled : cut], cut
            await self.mount(Static(markdown(chunk), classes="settled"), before=tail)
            if self.finished:  # finish() ran meanwhile and has drawn the whole reply
                return
        tail.update(markdown(text[cut:]))

    async def finish(self, text: str, note: str = "") -> None:
        """Render the whole reply once more from its final text, so no streamed tail is lost."""
        self.finished, self.text = True, text
        await self.query(".settled").remove()
        self._settled = 0
        self.query_one(".tail", Static).update(markdown(text))
        if note:
            self.query_one(Label).update(title(self.role, note))


class ErrorLine(Static):
    DEFAULT_CSS = """
    ErrorLine { color: $error; margin: 0 0 1 0; }
    """

    def __init__(self, text: str):
        super().__init__(f"error: {printable(text)}", markup=False)
        self.message = text


class NoticeView(Static):
    DEFAULT_CSS = """
    NoticeView { color: $text-muted; margin: 0 0 1 0; padding: 0 1; }
    """

    def __init__(self, text: str):
        super().__init__(markdown(text))
        self.text = text


class ConversationView(VerticalScroll):
    DEFAULT_CSS = """
    ConversationView { height: 1fr; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.anchor()

    async def add_message(self, role: str, text: str, note: str = "") -> MessageView:
        view = MessageView(role, text, note)
        await self.mount(view)
        return view

    async def start_reply(self) -> ReplyView:
        view = ReplyView()
        await self.mount(view)
        return view

    async def add_error(self, text: str) -> ErrorLine:
        line = ErrorLine(text)
        await self.mount(line)
        return line

    async def add_notice(self, markdown_text: str) -> NoticeView:
        notice = NoticeView(markdown_text)
        await self.mount(notice)
        return notice

    async def clear(self) -> None:
        await self.remove_children()
        self.anchor()
