"""What every kog command shares: one line and a non-zero exit for the user's mistakes.

An engine `KogError` becomes `error: ...` on stderr with exit status 1 (running out of memory
too), an interrupt exit status 130, so users never see a traceback for a problem they caused.
"""

from __future__ import annotations

import functools

import typer
from rich.console import Console

from engine.errors import KogError

err = Console(stderr=True, highlight=False)


def user_errors(command):
    """One line and a non-zero exit for the user's mistakes; never a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KogError as e:
            err.print(f"[red]error:[/red] {e}", markup=True, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except MemoryError:  # a model too large for this machine's memory (or its limit)
            err.print("[red]error:[/red] out of memory: this model does not fit here; try a smaller one", markup=True)
            raise typer.Exit(1) from None

    return wrapper
