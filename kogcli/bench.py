"""`kog bench`: single-request decode speed beside its peers and the machine's own limit."""

from __future__ import annotations

import errno
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from engine.errors import KogError
from engine.files import write_atomic
from engine.paths import expand_user
from kogcli.common import err, print_table, user_errors

QUICK_CONTEXTS, FULL_CONTEXTS = [32], [32, 1024, 4096]
# the registry's small-to-mid models, benchmarked by a full run on a GPU
GPU_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "llama-3.2-1b-instruct",
              "qwen2.5-coder-1.5b-instruct", "qwen3-1.7b"]
AGENT_TOKENS = 50_000
DRAFTS_TOKENS = 256  # a drafts workload's reply at most


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)


@user_errors
def bench_command(
    quick: bool = typer.Option(False, "--quick", help="One model, 32-token prompt, kog only: under a minute."),
    model: Optional[list[str]] = typer.Option(None, "--model", "-m", help="Model name or path (repeatable)."),
    device: str = typer.Option("auto", "--device", "-d", help="auto, cpu or cuda."),
    context: Optional[list[int]] = typer.Option(None, "--context", help="Tokens of context before decoding (repeatable; default 32, 1024, 4096)."),
    tokens: Optional[int] = typer.Option(None, "--tokens", "-n", help="Tokens generated per run (default 256 on a GPU; 128 on a CPU, 64 with --quick)."),
    runs: Optional[int] = typer.Option(None, "--runs", help="Timed runs per backend, after one warm-up (default 5; 3 with --quick)."),
    peers: bool = typer.Option(True, "--peers/--no-peers", help="Also run transformers (eager; static cache + CUDA graph on a GPU)."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write machine info and every sample as JSON."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of tok/s and MBU per backend and model."),
    drafts: int = typer.Option(1, "--drafts", metavar="N", help="Also decode five replies an agent's model writes (real weights, greedy, --tokens at most) one position a pass and up to N a pass (CUDA: N - 1 draft tokens copied from the context checked in each pass), and compare. 1 = off."),
):
    """Measure single-request decode speed: tok/s, TTFT, latency, MBU against the measured bandwidth."""
    from engine import benchmark, hardware
    from engine.backends import check_drafts, resolve_device

    device = resolve_device(device)
    check_drafts(drafts, device)
    if runs is not None and runs < 1 or tokens is not None and tokens < 2:
        raise KogError("--runs must be >= 1 and --tokens >= 2")
    if plot_file is not None:
        _require_matplotlib()
    for report_file in (json_file, plot_file):  # not after minutes of measuring
        if report_file is not None:
            _check_writable(report_file)
    targets = model or (GPU_MODELS if device == "cuda" and not quick else [None])
    workloads = [
        benchmark.Workload(context=c, generate=tokens or _default_tokens(device, quick), repetitions=runs or (3 if quick else 5))
        for c in (context or (QUICK_CONTEXTS if quick else FULL_CONTEXTS))
    ]
    if any(w.context < 1 for w in workloads):
        raise KogError("--context must be >= 1")
    if quick and len(targets) > 1:
        raise KogError("--quick measures one model; drop --quick to compare several")
    from engine.pull import fetch
    from engine.registry import Registry

    registry = Registry()
    specs = [registry.resolve(target).spec for target in targets]
    for spec in specs:  # fail on a bad name, a context too long, or a default model that cannot be pulled, before minutes of measuring
        if spec is not None:
            _check_fits(spec.name, spec.context, workloads)
            if spec.default:
                fetch(spec)  # pulled on first use (_load): now, not after the other models' runs
    if drafts > 1 and all(map(_synthetic, specs)):
        raise KogError("--drafts decodes real replies, and none of these models is on disk: `kog pull NAME` first")
    info = hardware.describe(device)
    if device == "cpu":
        if _gpu_present():
            err.print("measuring the CPU backend")
        else:
            err.print("no GPU found: measuring the CPU backend", style="yellow")
    err.print(f"measuring the read bandwidth of the {info['device']} ...")
    bandwidth = hardware.read_bandwidth_gb_s(device)
    results, drafted = [], []
    for target in targets:
        loaded, synthetic = _load(target)
        _check_fits(loaded.name, loaded.config.max_context, workloads)
        if drafts > 1 and not synthetic:  # (before this model's runs)
            benchmark.drafts_context(loaded, _drafts_prompts(), tokens or DRAFTS_TOKENS)
        for workload in workloads:
            err.print(f"{loaded.name}: {workload.context}-token context, {workload.generate} tokens x {workload.repetitions} runs ...")
            group = [benchmark.run_kog(loaded, device, workload, synthetic)]
            if peers and not quick and _transformers_present():
                group.append(benchmark.run_transformers(loaded, device, workload, synthetic, graph=False))
                if device == "cuda":
                    group.append(benchmark.run_transformers(loaded, device, workload, synthetic, graph=True))
            benchmark.apply_gate(group)
            results.extend(group)
        if drafts > 1 and synthetic:
            err.print(f"{loaded.name}: random weights, so no drafts workload (its text decides what a draft holds)")
        elif drafts > 1:
            prompts = _drafts_prompts()
            err.print(f"{loaded.name}: {len(prompts)} replies, plain and with up to {drafts} positions a pass ...")
            drafted.extend(benchmark.run_drafts(loaded, prompts, drafts, tokens or DRAFTS_TOKENS, runs or (3 if quick else 5)))
    report = {
        "machine": info | {"python": platform.python_version(), "versions": _versions()},
        "bandwidth_gb_s": bandwidth,
        "runs": [r.as_dict() | {"mbu": r.mbu(bandwidth), "weights": _weights_label(r.synthetic)} for r in results],
    } | ({"drafts": [r.as_dict() for r in drafted]} if drafts > 1 else {})
    if quick:
        _print_quick(results[0], info, bandwidth)
    else:
        _print_table(results, info, bandwidth)
    if drafted:
        _print_drafts(drafted, drafts)
    for path, write in ((json_file, lambda p: write_atomic(p, json.dumps(report, indent=1).encode())),
                        (plot_file, lambda p: _plot(results, bandwidth, p))):
        if path is not None:
            try:
                write(path)
            except OSError as e:  # (e.filename may be write_atomic's temporary file: the user's path is the news)
                raise KogError(f"cannot write {path}: {e.strerror or e}") from None


def _check_fits(name: str, max_context: int, workloads) -> None:
    for workload in workloads:
        if workload.context + workload.generate > max_context:
            raise KogError(f"{name}: context {workload.context} + {workload.generate} tokens exceeds its {max_context}")


def _check_writable(path: Path) -> None:
    """A one-line error now if `path` could not be written (write_atomic makes missing folders)."""
    path = expand_user(path)  # where write_atomic will write (`--json=~/b.json`: the shell leaves that ~ to us)
    try:
        if path.is_dir():
            raise KogError(f"cannot write {path}: it is a folder")
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
    except OSError as e:  # a folder on the way this user may not enter
        raise KogError(f"cannot write {path}: {e.strerror or e}") from None
    if not folder.is_dir():
        raise KogError(f"cannot write {path}: {folder} is not a folder")
    # a name too long for the file system fails only when written: after the measuring
    name_max = os.pathconf(folder, "PC_NAME_MAX")
    if any(len(os.fsencode(name)) > name_max for name in path.relative_to(folder).parts):
        raise KogError(f"cannot write {path}: {os.strerror(errno.ENAMETOOLONG)}")
    try:  # a real file: permission bits do not tell of read-only mounts or /proc (nor root's limits)
        fd, probe = tempfile.mkstemp(prefix=".kog-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise KogError(f"cannot write {path}: {e.strerror or e} in {folder}") from None


def _default_tokens(device: str, quick: bool) -> int:
    if device == "cuda":
        return 256
    return 64 if quick else 128


def _drafts_prompts() -> dict[str, tuple[str | None, str]]:
    from agent.workloads import PROMPTS  # (the agent's modules load only where --drafts asks for them)

    return PROMPTS


def _synthetic(spec) -> bool:
    """Whether `_load` gives random weights: a registry model (spec; None for a path) that is not on disk and not
    the default (pulled)."""
    from engine.registry import installed

    return spec is not None and not installed(spec) and not spec.default


def _load(target: str | None):
    """Real weights when the model is on disk (the default model is pulled), else random
    weights at the registry's shapes."""
    from engine.api import load
    from engine.registry import Registry
    from engine.synthetic import synthetic_model

    spec = Registry().resolve(target).spec
    if not _synthetic(spec):
        return load(target), False
    return synthetic_model(spec.name, spec.model_config(), seed=0), True


def _weights_label(synthetic: bool) -> str:
    return "synthetic weights at the real shapes" if synthetic else "real"


def _gpu_present() -> bool:
    from engine.backends import cuda_available

    return cuda_available()


def _transformers_present() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("kog", "numpy", "cupy-cuda12x", "cupy-cuda13x", "torch", "transformers"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def _print_quick(run, info: dict, bandwidth: float) -> None:
    rate = run.median("decode_tok_s")
    limit = bandwidth * 1e9 / run.bytes_per_token
    minutes = AGENT_TOKENS / rate / 60
    table = Table(show_header=False, title="kog bench --quick")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("model", run.model),
        ("weights", _weights_label(run.synthetic)),
        ("device", f"{info['device']} ({info['driver']})"),
        ("backend", run.backend),
        ("decode", f"{rate:,.1f} tok/s (runs {', '.join(f'{s.decode_tok_s:,.1f}' for s in run.samples)})"),
        ("TTFT", f"{run.median('ttft_s') * 1e3:,.1f} ms for a {run.context}-token prompt"),
        ("prefill", f"{run.median('prefill_tok_s'):,.0f} tok/s"),
        ("per-token latency", f"p50 {run.median('latency_p50_ms'):.2f} ms, p99 {run.median('latency_p99_ms'):.2f} ms"),
        ("bytes per token", f"{run.bytes_per_token / 1e6:,.1f} MB"),
        ("read bandwidth (measured now)", f"{bandwidth:,.1f} GB/s -> limit {limit:,.0f} tok/s"),
        ("MBU", f"{run.mbu(bandwidth):.0%}"),
        ("agent loop", f"{AGENT_TOKENS:,} generated tokens take {minutes:,.1f} min at this rate"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    Console(markup=False).print(table)


TABLE_COLUMNS = ("model", "weights", "context", "backend", "decode tok/s", "spread", "TTFT ms", "prefill tok/s",
                 "p50/p99 ms", "MBU", "vs best peer")
NUMBER_COLUMNS = {"context", "decode tok/s", "spread", "TTFT ms", "prefill tok/s", "p50/p99 ms", "MBU", "vs best peer"}


def _print_table(results, info: dict, bandwidth: float) -> None:
    title = f"kog bench · {info['device']} · read bandwidth {bandwidth:,.1f} GB/s (measured now)"
    columns = TABLE_COLUMNS + (("excluded because",) if any(r.excluded for r in results) else ())
    print_table(title, list(columns), [_table_cells(run, results, bandwidth) for run in results], NUMBER_COLUMNS)
    if any(r.synthetic for r in results):
        Console(markup=False).print("synthetic = random weights at the model's real shapes (the model is not downloaded)")


def _table_cells(run, results, bandwidth: float) -> dict[str, str]:
    cells = {"model": run.model, "weights": "synthetic" if run.synthetic else "real", "context": str(run.context),
             "backend": run.backend}
    if run.excluded:
        return cells | {"decode tok/s": "excluded", "excluded because": run.excluded}
    peers = [r for r in results if r.model == run.model and r.context == run.context and not r.backend.startswith("kog")
             and r.excluded is None]
    best_peer = max((p.median("decode_tok_s") for p in peers), default=None)
    low, high = run.spread("decode_tok_s")
    return cells | {
        "decode tok/s": f"{run.median('decode_tok_s'):,.1f}",
        "spread": f"{low:,.0f}–{high:,.0f}",
        "TTFT ms": f"{run.median('ttft_s') * 1e3:,.1f}",
        "prefill tok/s": f"{run.median('prefill_tok_s'):,.0f}",
        "p50/p99 ms": f"{run.median('latency_p50_ms'):.2f}/{run.median('latency_p99_ms'):.2f}",
        "MBU": f"{run.mbu(bandwidth):.0%}",
        "vs best peer": f"{run.median('decode_tok_s') / best_peer:.2f}x" if best_peer else "-",
    }


def _print_drafts(runs, asked: int) -> None:
    title = (f"kog bench --drafts {asked} · replies decoded one position a pass (plain) and with drafts copied from "
             "the context (real weights, greedy)")
    columns = ["model", "reply", "tokens", "positions", "tokens a pass", "plain tok/s", "drafted tok/s", "speed-up"]
    rows = []
    for model in dict.fromkeys(r.model for r in runs):
        mine = [r for r in runs if r.model == model]
        for r in mine:
            rows.append({"model": model, "reply": r.prompt, "tokens": str(r.tokens), "positions": str(r.positions),
                         "tokens a pass": f"{(r.tokens - 1) / r.passes:.2f}", "plain tok/s": f"{r.rate(False):,.1f}",
                         "drafted tok/s": f"{r.rate(True):,.1f}",
                         # (drafts must not change a reply: one that does is a bug, and its rate means nothing)
                         "speed-up": f"{r.rate(True) / r.rate(False):.2f}x" if r.identical else "tokens differ"})
        same = [r for r in mine if r.identical]
        if same:  # the replies as one text: their tokens over their decode times, each at its median rate
            decoded = sum(r.tokens - 1 for r in same)
            plain_s, drafted_s = (sum((r.tokens - 1) / r.rate(d) for r in same) for d in (False, True))
            rows.append({"model": model, "reply": "all", "tokens": str(sum(r.tokens for r in same)),
                         "plain tok/s": f"{decoded / plain_s:,.1f}", "drafted tok/s": f"{decoded / drafted_s:,.1f}",
                         "speed-up": f"{plain_s / drafted_s:.2f}x"})
    print_table(title, columns, rows, set(columns) - {"model", "reply"})


def _require_matplotlib() -> None:
    try:
        import matplotlib.pyplot  # noqa: F401  (pyplot: a bad MPLBACKEND fails here, not after the measuring)
    except ImportError:
        raise KogError("--plot needs matplotlib: pip install 'kog[bench]'") from None
    except ValueError as e:
        raise KogError(f"--plot cannot start matplotlib: {' '.join(str(e).split())}") from None


def _plot(results, bandwidth: float, path: Path) -> None:
    import io

    import matplotlib.pyplot as plt

    fig = build_figure(results, bandwidth)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    write_atomic(path, buffer.getvalue())


def build_figure(results, bandwidth: float):
    """Two panels: decode tok/s per backend with each model's bandwidth limit dashed, and MBU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = [r for r in results if r.excluded is None]
    groups = sorted({(r.model, r.context) for r in kept}, key=lambda g: (g[0], g[1]))
    backends = sorted({r.backend for r in kept})
    fig, (rate_axis, mbu_axis) = plt.subplots(2, 1, figsize=(max(6, 2 + 1.6 * len(groups)), 8))
    width = 0.8 / len(backends)
    for i, backend in enumerate(backends):
        xs, rates, mbus = [], [], []
        for g, (model, ctx) in enumerate(groups):
            run = next((r for r in kept if (r.model, r.context, r.backend) == (model, ctx, backend)), None)
            if run:
                xs.append(g + i * width)
                rates.append(run.median("decode_tok_s"))
                mbus.append(run.mbu(bandwidth) * 100)
        rate_axis.bar(xs, rates, width, label=backend)
        mbu_axis.bar(xs, mbus, width, label=backend)
    for g, (model, ctx) in enumerate(groups):
        run = next(r for r in kept if (r.model, r.context) == (model, ctx))
        limit = bandwidth * 1e9 / run.bytes_per_token
        rate_axis.hlines(limit, g - width / 2, g + 0.8 - width / 2, colors="black", linestyles="dashed",
                         label="bandwidth limit" if g == 0 else None)
    labels = [f"{m}\n{c} ctx" for m, c in groups]
    for axis, title in ((rate_axis, "decode tok/s"), (mbu_axis, "MBU %")):
        axis.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], labels, fontsize=8)
        axis.set_ylabel(title)
        axis.legend(fontsize=8)
    rate_axis.set_yscale("log")  # a small model's limit is ten times a large one's
    mbu_axis.axhline(100, color="black", linestyle="dashed")
    fig.tight_layout()
    return fig
