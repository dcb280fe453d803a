"""Pick a model from models.toml; each row says whether it is installed."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from engine.registry import ModelSpec, Registry, installed
from tui.screens.dialog import Dialog


def size_text(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def model_row(spec: ModelSpec, is_installed: bool, current: bool) -> Text:
    row = Text("● " if current else "  ", style="bold")
    row.append(f"{spec.name:<30}", style="bold" if is_installed else "")
    row.append(f"{_params(spec.params):>6}  {size_text(spec.size):>8}  {spec.arch:<6} ")
    row.append("installed" if is_installed else "download", style="green" if is_installed else "dim")
    if spec.default:
        row.append("  (default)", style="dim")
    return row


class ModelPicker(Dialog[str]):
    """Dismisses with the chosen model's name, or None."""

    def __init__(self, current: str | None):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        specs = Registry().all()
        options = [Option(model_row(s, installed(s), s.name == self.current), id=s.name) for s in specs]
        with Vertical(classes="box"):
            yield Label("Models", classes="title")
            yield OptionList(*options)
            yield Label("Enter: use (a model not installed is downloaded first)    Esc: close", classes="hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
