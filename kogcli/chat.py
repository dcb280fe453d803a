"""`kog chat`: the full-screen chat (tui/), started from the command line."""

from __future__ import annotations

import sys
from contextlib import closing
from typing import Optional

import typer

from engine.backends import DEFAULT_DRAFTS
from kogcli.common import err, user_errors


def register(app: typer.Typer) -> None:
    app.command("chat")(chat_command)


@user_errors
def chat_command(
    chat_id: Optional[int] = typer.Argument(
        None, metavar="ID", help="With --resume: the saved chat to open (default: the latest)."
    ),
    resume: bool = typer.Option(False, "--resume", "-r", help="Reopen a saved chat: the latest, or ID."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m",
        help="Model name, hf:ORG/REPO or path; default: the registry's default (or the resumed chat's).",
    ),
    device: str = typer.Option("auto", "--device", "-d", help="auto, cpu or cuda."),
    system: Optional[str] = typer.Option(None, "--system", help="A system message."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
    seed: int = typer.Option(0, "--seed"),
    context: Optional[int] = typer.Option(None, "--context", help="Context size in tokens (default: the model's)."),
    max_tokens: int = typer.Option(2048, "--max-tokens", "-n", help="The longest reply, in tokens."),
    drafts: Optional[int] = typer.Option(None, "--drafts", metavar="N", help=f"Check up to N - 1 draft tokens copied from the context in each greedy decode pass (CUDA backend); the tokens do not change, and text that repeats its context (code edits, tests) comes faster. 1 = off. Default: {DEFAULT_DRAFTS} on CUDA when the chat starts greedy, else 1."),
):
    """Chat with a model in the terminal; the status bar shows the live decode rate."""
    from engine.api import check_context
    from engine.backends import check_drafts, resolve_device
    from engine.errors import KogError
    from engine.registry import Registry
    from engine.sampling import SamplingParams
    from tui.app import ChatApp, ChatOptions
    from tui.store import ChatStore

    # Mistakes in the command line are reported here, as one line, before the screen takes over.
    if model is not None:
        Registry().resolve(model)
    SamplingParams(temperature=temperature, seed=seed)
    resolved = resolve_device(device)
    if drafts is not None:
        check_drafts(drafts, resolved)
    check_context(context)
    if max_tokens < 1:
        raise KogError(f"--max-tokens must be >= 1, got {max_tokens}")
    if chat_id is not None and not resume:
        raise KogError("a chat ID goes with --resume: kog chat --resume ID")
    with closing(ChatStore()) as store:
        if resume:
            moved_aside = f"; {store.notice}" if store.notice else ""
            try:
                chat = store.get(chat_id) if chat_id is not None else store.latest()
            except KogError as e:
                raise KogError(f"{e}{moved_aside}") from None
            if chat is None:
                raise KogError("there is no saved chat to resume" + moved_aside)
            chat_id = chat.id
        if not (sys.stdin.isatty() and sys.stdout.isatty()):  # (the screen would wait for keys that never come)
            raise KogError("kog chat needs a terminal; for a pipe or a script use kog generate")
        options = ChatOptions(model=model, device=device, context=context, system=system, temperature=temperature,
                              seed=seed, max_tokens=max_tokens, resume=chat_id, drafts=drafts)
        app = ChatApp(options, store)
        app.run()
        app.action_stop()  # a reply still streaming when the app crashed would keep the process alive
        if app.startup_error:
            raise KogError(app.startup_error)
        if store.notice:  # also shown in the app; repeated where it outlives the screen
            err.print(f"note: {store.notice}")
        if app.return_code:  # the app crashed (its traceback is on the screen)
            raise typer.Exit(app.return_code)
