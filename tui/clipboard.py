"""The last code block of a reply, and the system clipboard where one can be found."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from markdown_it import MarkdownIt


def last_code_block(markdown: str) -> str | None:
    fences = [t.content for t in MarkdownIt("commonmark").parse(markdown) if t.type in ("fence", "code_block")]
    return fences[-1] if fences else None


def _tools() -> list[list[str]]:
    """Clipboard commands worth trying here, most specific first."""
    tools = []
    if sys.platform == "darwin":
        tools.append(["pbcopy"])
    if os.environ.get("WAYLAND_DISPLAY"):
        tools.append(["wl-copy"])
    if os.environ.get("DISPLAY"):
        tools += [["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"]]
    tools.append(["clip.exe"])  # WSL
    return [t for t in tools if shutil.which(t[0])]


def copy(text: str) -> str | None:
    """Put `text` on the system clipboard; return the tool that did, or None when none could."""
    for tool in _tools():
        try:
            # xclip stays behind to serve the selection: give it no pipes to hold open
            subprocess.run(tool, input=text, text=True, check=True, timeout=5,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        return tool[0]
    return None
