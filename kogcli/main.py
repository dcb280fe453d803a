"""`kog`: thin typer commands — parse, call the engine, print.

Commands for the larger front ends live in their own modules and register themselves on
`app` at the bottom of this file.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import Optional

import typer

from engine import __version__
from engine.backends import DEFAULT_DRAFTS
from engine.backends.cuda_fault import end_process_after_fault
from engine.errors import KogError
from kogcli.common import err, notice, print_error, print_table, user_errors

# typer's usage errors derive from click's ClickException, which typer vendors since 0.29 (before, click's own):
# as a base of typer.BadParameter it is the right class with either (the device machines' typer may be older)
USAGE_ERROR = next(base for base in typer.BadParameter.__mro__ if base.__name__ == "ClickException")
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EPIPE, errno.EBADF}  # a write that failed

app = typer.Typer(
    help="Run a local LLM at the decode speed your hardware allows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
def _version(value: bool):
    if value:
        print(f"kog {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
):
    """kog: one request, as fast as the memory allows."""


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _bytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@app.command("models")
@user_errors
def models_command():
    """List the models kog knows: name, size, architecture, whether installed; the default is marked."""
    from engine.registry import Registry, installed

    registry = Registry()
    rows = [
        {"name": f"{spec.name} (default)" if spec.default else spec.name, "params": _count(spec.params),
         "download": _bytes(spec.size), "arch": spec.arch, "context": str(spec.context),
         "installed": "yes" if installed(spec) else "-", "license": spec.license}
        for spec in registry.all()
    ]
    print_table("kog models", ["name", "params", "download", "arch", "context", "installed", "license"], rows,
                {"params", "download", "context"})


@app.command("pull")
@user_errors
def pull_command(target: str = typer.Argument(..., metavar="TARGET", help="A model name from `kog models`, hf:ORG/REPO, or a local path.")):
    """Download a model (resumable, verified) into kog's cache."""
    from engine.pull import pull

    path = pull(target, progress=True)
    print(f"ready: {path}")


@app.command("generate")
@user_errors
def generate_command(
    prompt: str = typer.Argument(..., metavar="PROMPT", help="The prompt (a user message unless --raw); - reads it from standard input."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model name, hf:ORG/REPO or path; default: the registry's default."),
    device: str = typer.Option("auto", "--device", "-d", help="auto, cpu or cuda."),
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", help="Generate at most this many tokens."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off."),
    min_p: float = typer.Option(0.0, "--min-p"),
    repetition_penalty: float = typer.Option(1.0, "--repetition-penalty"),
    seed: int = typer.Option(0, "--seed"),
    system: Optional[str] = typer.Option(None, "--system", help="A system message."),
    raw: bool = typer.Option(False, "--raw", help="Feed the prompt as is, without the chat template."),
    context: Optional[int] = typer.Option(None, "--context", help="Context size in tokens (default: the model's)."),
    as_json: bool = typer.Option(False, "--json", help="After the text, print the stats as JSON instead of a line."),
    drafts: Optional[int] = typer.Option(None, "--drafts", metavar="N", help=f"Check up to N - 1 draft tokens copied from the context in each decode pass: greedy decoding on the CUDA backend without a repetition penalty; the tokens do not change, and text that repeats its context (code edits, tests) comes faster. 1 = off. Default: {DEFAULT_DRAFTS} where the decode checks drafts, else 1."),
):
    """Stream a reply to PROMPT, then one line of stats; exit 130 when interrupted."""
    from engine.api import check_context, context_cap_note, drafts_note, load, open_session
    from engine.backends import check_drafts, resolve_device, resolve_drafts
    from engine.sampling import SamplingParams

    # the command line's own mistakes, before a model is downloaded or loaded
    if prompt == "-":
        if sys.stdin is None:
            raise KogError("no standard input to read the prompt from")
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise KogError("standard input is not UTF-8 text") from None
    elif not prompt.isascii():
        try:  # (an argument's undecodable bytes arrive as surrogates)
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise KogError("the prompt is not UTF-8 text") from None
    if not prompt.strip():
        raise KogError("empty prompt")
    params = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repetition_penalty=repetition_penalty, seed=seed,
    )
    if max_tokens < 1:
        raise KogError(f"--max-tokens must be >= 1, got {max_tokens}")
    if raw and system:
        raise KogError("--system needs the chat template; drop --raw")
    device = resolve_device(device)
    check_context(context)
    drafts = resolve_drafts(drafts, device, params)
    check_drafts(drafts, device)
    loaded = load(model)
    session = open_session(loaded, device=device, context=context, system=system, draft_positions=drafts)
    notice(context_cap_note(loaded.name, context, session.context_size))
    notice(drafts_note(loaded.name, drafts, session.backend.pass_positions))
    if raw:
        ids = loaded.tokenizer.encode(prompt, add_special_tokens=True)
        generation = session.complete(ids, params, max_tokens)
    else:
        generation = session.send(prompt, params, max_tokens)
    try:
        for event in generation:
            sys.stdout.write(event.text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        generation.cancel()
    sys.stdout.write("\n")
    stats = generation.stats
    if as_json:
        print(json.dumps(stats.as_dict() | {"model": loaded.name, "device": session.backend.device_name}))
    else:
        passes = stats.decode_passes  # (the first token comes from the prefill)
        multi = session.backend.pass_positions > 1 and passes  # (passes of several positions ran)
        drafted = f"{(stats.generated_tokens - 1) / passes:.2f} tokens a pass · " if multi else ""
        err.print(
            f"{stats.generated_tokens} tokens · decode {stats.decode_tok_s:.1f} tok/s · "
            f"TTFT {stats.ttft_s * 1e3:.0f} ms · prefill {stats.prefill_tok_s:.0f} tok/s "
            f"({stats.prompt_tokens} prompt, {stats.reused_tokens} reused) · "
            f"p50/p99 {stats.latency_ms(50):.1f}/{stats.latency_ms(99):.1f} ms · {drafted}"
            f"{loaded.name} on {session.backend.device_name} · stop: {stats.stop_reason}",
            style="dim",
        )
    if stats.stop_reason == "cancelled":
        raise typer.Exit(130)


from kogcli import bench  # noqa: E402

bench.register(app)

from kogcli import chat  # noqa: E402
chat.register(app)

from kogcli import agent  # noqa: E402
agent.register(app)


def run() -> None:
    """The `kog` command's commands (the entry point, `entry_point` in kogcli/__init__.py, loads this module and calls it)."""
    if sys.stdout is None:  # started with its output closed (`kog ... >&-`)
        print_error("cannot write the output: standard output is closed")
        sys.exit(1)
    try:
        # not standalone: typer hands back its usage errors (boxed, several lines) and exit codes instead of exiting
        code = app(prog_name="kog", standalone_mode=False)
    except USAGE_ERROR as error:
        code = _usage_failed(error)
    except typer.Abort:  # end of input at a prompt
        print_error("aborted")
        code = 1
    except SystemExit as e:
        end_process_after_fault(e.code if isinstance(e.code, int) else 1)
        raise
    except OSError as e:  # commands turn their own I/O failures into KogErrors: what is left is the output's
        _output_failed(e)
    code = code if isinstance(code, int) and not isinstance(code, bool) else 0  # what typer.Exit said, else 0
    end_process_after_fault(code)
    sys.exit(code)


def _usage_failed(error: Exception) -> int:
    """One `error:` line for a command line typer cannot parse (a missing argument, an unknown option, a value of
    the wrong type), naming where the usage is; returns the exit status, 2 as for any usage error. `kog` alone has
    printed the help already."""
    if type(error).__name__ != "NoArgsIsHelpError":  # the class is not public; typer itself tells it by name
        context = getattr(error, "ctx", None)
        where = f" (see '{context.command_path} --help')" if context is not None else ""
        print_error(" ".join(error.format_message().split()) + where)
    return getattr(error, "exit_code", 2)


def _output_failed(error: OSError) -> None:
    """One line for an OSError that reached the top, then exit 1: a failed write of the output (a full disk, a
    closed terminal) says so; any other names what it is."""
    if error.errno in OUTPUT_ERRNOS and not error.filename:
        # what stdout still holds goes nowhere, so that Python's flush at exit prints no second error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print_error(f"cannot write the output: {error.strerror}")
    else:
        print_error(f"{type(error).__name__}: {error}")
    end_process_after_fault(1)
    sys.exit(1)
