"""One line under the conversation: the engine's live rates, the context in use, model and device."""

from __future__ import annotations

from dataclasses import dataclass

from textual.widgets import Static


@dataclass(frozen=True)
class StatusInfo:
    state: str  # "loading …", "prefill", "generating", "ready", ...
    model: str = ""
    backend: str = ""
    device: str = ""
    context_tokens: int = 0
    context_size: int = 0
    # the latest reply's counters (None before the first one)
    decode_tok_s: float | None = None
    ttft_s: float | None = None
    prefill_tok_s: float | None = None
    reused_tokens: int | None = None


def _rate(value: float | None) -> str:
    if not value:
        return "–"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _seconds(value: float | None) -> str:
    if not value:
        return "–"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.0f} ms" if value >= 0.01 else f"{value * 1e3:.1f} ms"


def render_status(info: StatusInfo) -> str:
    parts = [info.state, f"decode {_rate(info.decode_tok_s)} tok/s", f"TTFT {_seconds(info.ttft_s)}"]
    reused = f" ({info.reused_tokens:,} reused)" if info.reused_tokens else ""
    parts.append(f"prefill {_rate(info.prefill_tok_s)} tok/s{reused}")
    if info.context_size:
        parts.append(f"ctx {info.context_tokens:,}/{info.context_size:,}")
    if info.model:
        parts.append(info.model)
    if info.backend:
        parts.append(f"{info.backend} · {info.device}")
    return " │ ".join(parts)


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: auto; background: $panel; color: $text-muted; padding: 0 1; }  /* wraps when narrow */
    """

    def __init__(self, **kwargs):
        super().__init__("", markup=False, **kwargs)
        self.info = StatusInfo("starting")

    def show(self, info: StatusInfo) -> None:
        if info != self.info:
            self.info = info
            self.update(render_status(info))

    def on_mount(self) -> None:
        self.update(render_status(self.info))
