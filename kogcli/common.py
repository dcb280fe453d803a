"""What every kog command shares: one line and a non-zero exit for the user's mistakes.

An engine `KogError` becomes `error: ...` on stderr with exit status 1 (running out of memory
too), an interrupt exit status 130, so users never see a traceback for a problem they caused.
"""

from __future__ import annotations

import functools
import os

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from engine.errors import KogError

# markup off: errors and progress lines carry user text (paths, model names) that may hold brackets
err = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)  # a line stays one line in logs


def notice(text: str | None) -> None:
    """A warning the command goes on after (nothing when `text` is None): one line, never wrapped."""
    if text:
        err.print(text, style="yellow")


def print_error(message: str) -> None:
    """The one `error:` line a failed command ends with."""
    err.print(Text.assemble(("error:", "red"), f" {message}"))


def user_errors(command):
    """One line and a non-zero exit for the user's mistakes; never a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KogError as e:
            print_error(str(e))
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except MemoryError:  # a model too large for this machine's memory (or its limit)
            print_error("out of memory: this model does not fit here; try a smaller one")
            raise typer.Exit(1) from None

    return wrapper


def print_table(title: str, columns: list[str], rows: list[dict[str, str]], right: set[str] = frozenset()) -> None:
    """One row an item where the terminal is wide enough, else one block an item: a value is never
    cut (a name is what the user types next, a number what they came for). Text is not markup.
    Into a pipe (no terminal, no COLUMNS) always one row an item, so that `grep` sees whole rows."""
    console = Console(markup=False)
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", no_wrap=True)
    for cells in rows:
        table.add_row(*(cells.get(column, "") for column in columns))
    width = console.measure(table, options=console.options.update(max_width=1 << 16)).maximum
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = max(console.width, width)
    if width <= console.width:
        console.print(table)
        return
    console.print(title)
    for cells in rows:
        block = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
        block.add_column(style="bold", no_wrap=True)
        block.add_column(overflow="fold")  # a value longer than the line goes on the next, never cut
        for column in columns:
            if cells.get(column):
                block.add_row(column, cells[column])
        console.print(block, "")
