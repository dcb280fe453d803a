"""`kog bench` on the CPU machine: the report's fields, labels, errors and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.backends import cuda_available
from tests.test_cli import assert_one_line_error, kog

QUICK_FIELDS = {"decode_tok_s", "ttft_s", "prefill_tok_s", "latency_p50_ms", "latency_p99_ms"}


def bench_json(tmp_path, *args) -> dict:
    out = tmp_path / "bench.json"
    result = kog("bench", *args, "--json", str(out), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text()) | {"stdout": result.stdout, "stderr": result.stderr}


@pytest.mark.skipif(cuda_available(), reason="checks the CPU-only path")
def test_quick_on_the_cpu_reports_every_field(tmp_path, default_gguf):
    report = bench_json(tmp_path, "--quick", "--tokens", "16")
    assert "no GPU found" in report["stderr"]
    machine = report["machine"]
    assert machine["device"].startswith("CPU") and machine["driver"] and machine["versions"]["numpy"]
    assert report["bandwidth_gb_s"] > 0
    (run,) = report["runs"]
    assert run["backend"] == "kog-cpu" and run["model"] == "smollm2-135m-instruct"
    assert run["weights"] == "real" and run["synthetic"] is False
    assert len(run["samples"]) == 3 and all(QUICK_FIELDS <= set(s) for s in run["samples"])
    assert all(s["decode_tok_s"] > 0 for s in run["samples"])
    assert run["bytes_per_token"] > 500e6 and run["mbu"] > 0 and len(run["tokens"]) == 16
    for label in ("decode", "TTFT", "bytes per token", "MBU", "50,000 generated tokens take"):
        assert label in report["stdout"]
    assert "synthetic" not in report["stdout"]


def test_synthetic_weights_are_labelled_as_such(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))  # nothing pulled here but the default
    report = bench_json(tmp_path, "--quick", "--model", "smollm2-360m-instruct", "--device", "cpu",
                        "--tokens", "3", "--runs", "1")
    (run,) = report["runs"]
    assert run["synthetic"] is True and run["weights"] == "synthetic weights at the real shapes"
    assert "synthetic weights at the real shapes" in report["stdout"]


def test_full_run_with_the_transformers_peer_and_a_plot(tmp_path, default_gguf):
    plot = tmp_path / "bench.png"
    report = bench_json(tmp_path, "--device", "cpu", "--context", "16", "--tokens", "10", "--runs", "1", "--plot", str(plot))
    backends = [r["backend"] for r in report["runs"]]
    assert backends == ["kog-cpu", "transformers-eager"]
    assert all(r["excluded"] is None for r in report["runs"])  # the correctness gate passed
    assert "vs best peer" in report["stdout"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("columns", [80, 250])
def test_the_table_never_cuts_a_value(columns, monkeypatch, capsys):
    from engine.benchmark import BackendRun, Sample
    from kogcli.bench import _print_table

    def run(backend, rate, excluded=None):
        return BackendRun(backend=backend, model="qwen2.5-coder-1.5b-instruct", synthetic=True, context=4096, generate=8,
                          bytes_per_token=10**9, samples=[Sample(rate, 0.1, 100.0, 1.0, 2.0)], excluded=excluded)

    monkeypatch.setenv("COLUMNS", str(columns))
    _print_table([run("kog-cuda", 1136.0), run("transformers-graph", 240.7),
                  run("transformers-eager", 61.2, "tokens differ from transformers-graph at step 3")], {"device": "NVIDIA H200"}, 4500.0)
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= columns
    for value in ("qwen2.5-coder-1.5b-instruct", "transformers-graph", "1,136.0", "4.72x", "tokens differ from transformers-graph at step 3"):
        assert value in out
    kog_line = next(line for line in out.splitlines() if "kog-cuda" in line)
    assert ("1,136.0" in kog_line) == (columns == 250)  # one row a run only where it fits


def test_plot_has_a_series_per_backend_and_the_limit():
    from engine.benchmark import BackendRun, Sample
    from kogcli.bench import build_figure

    def run(backend, rate):
        return BackendRun(backend=backend, model="m", synthetic=False, context=32, generate=8, bytes_per_token=10**9,
                          samples=[Sample(rate, 0.1, 100.0, 1.0, 2.0)])

    fig = build_figure([run("kog-cuda", 3000.0), run("transformers-graph", 400.0)], bandwidth=4000.0)
    rate_axis, mbu_axis = fig.axes
    labels = [t.get_text() for t in rate_axis.get_legend().get_texts()]
    assert sorted(labels) == ["bandwidth limit", "kog-cuda", "transformers-graph"]
    heights = [bar.get_height() for container in rate_axis.containers for bar in container]
    assert heights == [3000.0, 400.0]
    assert [bar.get_height() for c in mbu_axis.containers for bar in c] == pytest.approx([75.0, 10.0])


def test_gate_lets_a_backend_take_another_token_only_where_the_reference_tied():
    """The numbers are those of `kog bench --context 4096` on Qwen2.5's random weights (session 22):
    bf16 eager tied 108883 and 145716 at step 6, fp32 transformers put 145716 first, as kog did."""
    from engine.benchmark import BackendRun, apply_gate

    def run(backend, tokens, ties=()):
        return BackendRun(backend=backend, model="m", synthetic=True, context=4096, generate=8, bytes_per_token=1,
                          tokens=tokens, ties=[list(t) for t in ties])

    same = [108883] * 6
    eager = run("transformers-eager", same + [108883, 145716], ties=[[108883]] * 6 + [[108883, 145716], [145716]])
    tied = run("kog-cuda", same + [145716, 9662])  # another tied token at step 6, then its own continuation
    untied = run("transformers-graph", [108883, 108883, 104261] + same[:5])  # 104261 was not tied at step 2
    short = run("kog-cpu", same)
    apply_gate([eager, tied, untied, short])
    assert eager.excluded is None and tied.excluded is None
    assert "differ from transformers-eager" in untied.excluded and short.excluded
    # without ties reported (a reference that has no logits on the host) every token must match
    strict = run("kog-cuda", same + [145716, 9662])
    apply_gate([run("transformers-eager", same + [108883, 145716]), strict])
    assert strict.excluded


def test_ties_are_two_steps_of_the_logits_precision():
    import torch

    from engine.benchmark import _ties

    # bf16 near 8: steps of 2^3 * 2^-7 = 0.0625, so two steps below 8.5625 is 8.4375
    logits = torch.tensor([8.5, 8.5625, 8.4375, 8.375, -9.0], dtype=torch.bfloat16)
    assert _ties(logits) == [0, 1, 2]
    # fp32 (the CPU peer): only what rounds to the maximum's own neighbourhood
    assert _ties(torch.tensor([8.5, 8.5 - 1e-3, 8.5], dtype=torch.float32)) == [0, 2]


def test_unknown_model():
    assert_one_line_error(kog("bench", "--quick", "--model", "llama-9b"), "unknown model 'llama-9b'")


@pytest.mark.skipif(cuda_available(), reason="this machine has a GPU")
def test_gpu_requested_without_a_gpu():
    assert_one_line_error(kog("bench", "--quick", "--device", "cuda"), "needs an NVIDIA GPU")


def test_default_model_that_cannot_be_pulled_fails_before_measuring(tmp_path):
    """The default model is pulled on first use: offline, that fails before any model is measured."""
    from tests.test_pull import closed_port

    env = {"KOG_HOME": str(tmp_path / "home"), "PIP_CONFIG_FILE": "/dev/null", "PIP_RETRIES": "1",
           "PIP_INDEX_URL": f"http://127.0.0.1:{closed_port()}/simple"}
    result = kog("bench", "--device", "cpu", "--model", "smollm2-360m-instruct", "--model", "smollm2-135m-instruct",
                 "--tokens", "3", "--runs", "1", env=env)
    assert_one_line_error(result, "cannot reach the package index", chatter_before=True)
    assert "measuring" not in result.stderr


def test_a_report_that_cannot_be_written_fails_before_measuring(tmp_path):
    (tmp_path / "a-file").write_text("")
    # /proc: a folder whose permission bits say writable (to root), yet no file can be made there
    proc = [Path("/proc/kog-bench.json")] if Path("/proc/self").is_dir() else []
    too_long = "n" * 300  # longer than any file system's longest name
    for out in (tmp_path, tmp_path / "a-file" / "bench.json", *proc, tmp_path / f"{too_long}.json",
                tmp_path / "new" / too_long / "bench.json"):
        result = kog("bench", "--quick", "--device", "cpu", "--json", str(out))
        assert_one_line_error(result, f"cannot write {out}")
        assert "measuring" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_report_path_with_a_tilde_is_checked_where_it_will_be_written(tmp_path):
    (tmp_path / "a-file").write_text("")
    for out, home, fragment in (("~no-such-user-kog/bench.json", None, "no home folder found for its ~"),
                                ("~/bench.json", tmp_path / "a-file", "a-file is not a folder")):
        result = kog("bench", "--quick", "--device", "cpu", f"--json={out}", env={"HOME": str(home)} if home else None)
        assert_one_line_error(result, fragment)
        assert "measuring" not in result.stderr


def test_a_context_the_model_cannot_hold_fails_before_measuring():
    # the second model's limit: not after the first model's runs
    result = kog("bench", "--device", "cpu", "--model", "qwen2.5-coder-0.5b-instruct", "--model", "smollm2-135m-instruct",
                 "--context", "8000", "--tokens", "300")
    assert_one_line_error(result, "smollm2-135m-instruct: context 8000 + 300 tokens exceeds its 8192")
    assert "measuring" not in result.stderr


def test_drafts_need_the_cuda_backend_and_a_count_in_range():
    assert_one_line_error(kog("bench", "--quick", "--device", "cpu", "--drafts", "5"), "--drafts needs the CUDA backend")
    assert_one_line_error(kog("bench", "--quick", "--drafts", "9"), "--drafts must be 1 (off) to 8, got 9")


def test_the_drafts_table_sums_the_replies_that_kept_their_tokens(capsys, monkeypatch):
    from engine.benchmark import DraftRun, Sample

    def run(prompt, tokens, passes, plain, drafted, identical=True):
        samples = lambda rates: [Sample(r, 0.01, 1e4, 1.0, 1.0) for r in rates]  # noqa: E731
        return DraftRun(model="smollm2-135m-instruct", prompt=prompt, positions=5, tokens=tokens, passes=passes,
                        identical=identical, plain=samples(plain), drafted=samples(drafted))

    from kogcli.bench import _print_drafts

    monkeypatch.setenv("COLUMNS", "250")
    # rename: 201 tokens, 200 after the first in 50 passes; medians 3,000 and 6,000 tok/s
    _print_drafts([run("rename", 201, 50, [2900, 3000, 3100], [6000, 5000, 7000]),
                   run("write", 101, 100, [3000], [2500]),
                   run("tests", 51, 20, [3000], [9000], identical=False)], 5)
    lines = capsys.readouterr().out.splitlines()
    row = {line.split("│")[2].strip(): line for line in lines if line.count("│") > 8}
    assert "4.00" in row["rename"] and "2.00x" in row["rename"] and "6,000.0" in row["rename"]
    assert "1.00" in row["write"] and "0.83x" in row["write"]
    assert "tokens differ" in row["tests"] and "3.00x" not in row["tests"]
    # all: 300 tokens after the first in 200/3000 + 100/3000 s plain, 200/6000 + 100/2500 s drafted (tests left out)
    assert "302" in row["all"] and "3,000.0" in row["all"] and "4,090.9" in row["all"] and "1.36x" in row["all"]


def test_the_drafts_workload_must_fit_the_model_before_it_is_measured(default_gguf):
    from agent.workloads import PROMPTS
    from engine.api import load
    from engine.benchmark import drafts_context
    from engine.errors import KogError

    model = load(None)
    assert 600 < drafts_context(model, PROMPTS, 256) - 256 < 1024  # the agent's fix, with its system message
    with pytest.raises(KogError, match="the drafts workload's longest prompt .* exceeds its 8192"):
        drafts_context(model, PROMPTS, 8000)
