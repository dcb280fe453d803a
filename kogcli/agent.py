"""`kog agent`: fix a repository's failing tests, undo what a run did, replay a run's log."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from engine.backends import DEFAULT_DRAFTS
from kogcli.common import err, notice, user_errors

# Exit status of `kog agent fix` when the run ended with the tests still failing.
NOT_FIXED = 3


def register(app: typer.Typer) -> None:
    agent_app = typer.Typer(help="A coding agent that edits a repository until its tests pass.", no_args_is_help=True)
    agent_app.command("fix")(user_errors(fix_command))
    agent_app.command("undo")(user_errors(undo_command))
    agent_app.command("replay")(user_errors(replay_command))
    app.add_typer(agent_app, name="agent")


def fix_command(
    path: Path = typer.Argument(..., metavar="PATH", help="The repository whose tests fail."),
    test_cmd: Optional[str] = typer.Option(None, "--test-cmd", help="The command that runs the tests (default: detected)."),
    max_steps: int = typer.Option(20, "--max-steps", help="Ask the model at most this many times."),
    max_tokens: int = typer.Option(20_000, "--max-tokens", help="Generate at most this many tokens over the whole run."),
    step_tokens: int = typer.Option(1024, "--step-tokens", help="The longest one answer may be, in tokens."),
    timeout: float = typer.Option(1800.0, "--timeout", help="Stop after this many seconds, tests included."),
    test_timeout: float = typer.Option(300.0, "--test-timeout", help="Kill one test run (or shell command) after this many seconds."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local: a model name, hf:ORG/REPO or path (default: the registry's default). With --endpoint: the served model's name."),
    device: str = typer.Option("auto", "--device", "-d", help="auto, cpu or cuda (local model)."),
    context: Optional[int] = typer.Option(None, "--context", help="Context size in tokens (local default: the model's; endpoint default: 8192)."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="An OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1, instead of the local engine."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="KOG_API_KEY", show_envvar=True, help="Bearer token for --endpoint."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (local model)."),
    drafts: Optional[int] = typer.Option(None, "--drafts", metavar="N", help=f"Check up to N - 1 draft tokens copied from the context in each decode pass: greedy decoding on the CUDA backend; the tokens do not change, and text that repeats its context (code edits, tests) comes faster. 1 = off. Default: {DEFAULT_DRAFTS} on CUDA with greedy decoding, else 1."),
    allow_shell: bool = typer.Option(False, "--allow-shell", help="Let the model run shell commands (@run_command). `kog agent undo` then also restores small git-ignored files (.env: up to 1 MiB each, 64 MiB in all, outside dependency and build folders); not larger ones, nor anything outside the repository."),
    allow_test_edits: bool = typer.Option(False, "--allow-test-edits", help="Let the model change test files and test configuration."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Work on a scratch copy; show the diff, write nothing."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Show only the summary."),
    as_json: bool = typer.Option(False, "--json", help="Print only the summary, as one JSON object."),
    log: Optional[Path] = typer.Option(None, "--log", help="Append the trajectory here (default: .kog/runs/ in the repository)."),
):
    """Run the tests of PATH and edit it until they pass or a budget ends; exit 0 when fixed, 3 when not."""
    from agent.display import Display, JsonDisplay, LiveDisplay
    from agent.loop import Options, fix
    from engine.backends import check_drafts, resolve_device, resolve_drafts
    from engine.errors import KogError
    from engine.sampling import SamplingParams

    for name, value in (("--max-steps", max_steps), ("--max-tokens", max_tokens), ("--step-tokens", step_tokens),
                        ("--timeout", timeout), ("--test-timeout", test_timeout)):
        if not (math.isfinite(value) and value > 0):
            raise KogError(f"{name} must be a finite number > 0, got {value}")
    sampling = SamplingParams(temperature=temperature, seed=seed)  # (checks an endpoint's temperature too)
    if endpoint:
        if drafts not in (None, 1):
            raise KogError("--drafts is for the local engine, not --endpoint")
        drafts = 1
    else:
        device = resolve_device(device)  # (the client opens the engine on it, as kog generate does)
        drafts = resolve_drafts(drafts, device, sampling)
        check_drafts(drafts, device)
    if quiet and as_json:
        raise KogError("--quiet and --json exclude each other")
    if not path.is_dir():
        raise KogError(f"{path} is not a directory")
    options = Options(
        test_cmd=test_cmd, max_steps=max_steps, max_tokens=max_tokens, step_tokens=step_tokens, timeout_s=timeout,
        test_timeout_s=test_timeout, allow_shell=allow_shell, allow_test_edits=allow_test_edits,
    )
    client = _client(endpoint, api_key, model, device, context, temperature, seed, drafts)
    display = JsonDisplay() if as_json else Display() if quiet else LiveDisplay()
    try:
        summary = fix(path, client, options, display, log, dry_run)
    finally:
        display.close()
        client.close()
    if summary["stop_reason"] == "interrupted":
        raise typer.Exit(130)
    if not summary["fixed"]:
        raise typer.Exit(NOT_FIXED)


def _client(endpoint, api_key, model, device, context, temperature, seed, drafts):
    from engine.sampling import SamplingParams

    if endpoint:
        from agent.client_openai import OpenAIClient

        return OpenAIClient(endpoint, api_key, model, context or 8192, temperature)
    from agent.client_local import LocalClient
    from engine.api import context_cap_note, drafts_note

    client = LocalClient.open(model, device, context, SamplingParams(temperature=temperature, seed=seed), drafts)
    notice(context_cap_note(client.name, context, client.context_size))
    notice(drafts_note(client.name, drafts, client.session.backend.pass_positions))
    return client


def undo_command(
    path: Path = typer.Argument(..., metavar="PATH", help="The repository a kog agent run changed."),
    force: bool = typer.Option(False, "--force", help="Undo even where files changed after the run ended (copies of them are kept under .kog/checkpoints/)."),
):
    """Put PATH back exactly as it was before the latest kog agent run not yet undone."""
    from agent.checkpoint import undo

    err.print(undo(path, force=force))


def replay_command(
    file: Path = typer.Argument(..., metavar="FILE", help="A trajectory log (.kog/runs/*.jsonl or --log)."),
    full: bool = typer.Option(False, "--full", help="Also show every model output, tool result and test output."),
):
    """Re-render a kog agent run from its log."""
    from agent.display import output_console, replay
    from agent.trajectory import read

    replay(read(file), output_console(), full)
