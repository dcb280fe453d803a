"""The `kog` command as users run it: a real subprocess, real exit codes, real output."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

KOG = [sys.executable, "-m", "kogcli"]
# pip with no index to reach: a download fails at once
OFFLINE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "",
           "PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}


def kog(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*KOG, *args], capture_output=True, text=True, timeout=timeout, env=(os.environ | (env or {})))


def assert_one_line_error(result: subprocess.CompletedProcess, fragment: str, chatter_before: bool = False) -> None:
    """Exit status 1 and one `error:` line; `chatter_before` admits progress lines pip printed first."""
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert chatter_before or len(lines) == 1, result.stderr
    assert lines[-1].startswith("error:") and fragment in lines[-1], lines[-1]
    assert sum(line.startswith("error:") for line in lines) == 1
    assert "Traceback" not in result.stderr


def test_version():
    result = kog("--version")
    assert result.returncode == 0 and result.stdout.startswith("kog ")


@pytest.mark.parametrize("command", ["models", "pull", "generate"])
def test_every_command_has_help(command):
    result = kog(command, "--help")
    assert result.returncode == 0 and "Usage" in result.stdout


@pytest.mark.parametrize("args, fragment", [
    (("generate",), "Missing argument 'PROMPT'. (see 'kog generate --help')"),
    (("generate", "--max-tokens", "many", "hi"), "Invalid value for '--max-tokens'"),
    (("generate", "--no-such-option", "hi"), "No such option: --no-such-option"),
    (("no-such-command",), "No such command 'no-such-command'. (see 'kog --help')"),
    (("agent", "fix"), "Missing argument 'PATH'. (see 'kog agent fix --help')"),
])
def test_a_command_line_that_does_not_parse_is_one_error_line(args, fragment):
    result = kog(*args)
    assert result.returncode == 2, result.stderr  # a usage error's status, as before
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert fragment in result.stderr


def test_kog_alone_prints_the_help():
    result = kog()
    assert result.returncode == 2 and "Usage" in result.stdout and "generate" in result.stdout
    assert "error" not in result.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("models",), ("--version",)])
def test_output_on_a_full_disk_is_one_error_line(args):
    with open("/dev/full", "w") as full:
        result = subprocess.run([*KOG, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert_one_line_error(result, "cannot write the output: No space left on device")


def test_models_marks_the_default(default_gguf):
    result = kog("models", env={"COLUMNS": "200"})
    assert result.returncode == 0
    line = next(li for li in result.stdout.splitlines() if "smollm2-135m-instruct" in li)
    assert "(default)" in line and "yes" in line
    assert "qwen3-1.7b" in result.stdout


def test_models_into_a_pipe_is_one_row_a_model():
    from engine.registry import Registry

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    result = subprocess.run([*KOG, "models"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    for spec in Registry().all():  # `kog models | grep NAME` shows the whole row
        row = next(line for line in result.stdout.splitlines() if f" {spec.name} " in line)
        assert spec.arch in row and spec.license in row and str(spec.context) in row


def test_models_shows_every_name_whole_in_a_narrow_terminal():
    from engine.registry import Registry

    result = kog("models", env={"COLUMNS": "80"})
    assert result.returncode == 0
    assert max(map(len, result.stdout.splitlines())) <= 80
    for spec in Registry().all():
        for value in (spec.name, str(spec.context), spec.license, spec.arch):
            assert value in result.stdout


def test_brackets_in_a_path_are_text_not_markup(tmp_path):
    missing = tmp_path / "models" / "[/tmp]" / "[bold]m.gguf"
    result = kog("generate", "hi", "--model", str(missing))
    assert_one_line_error(result, str(missing))


def test_generate_streams_text_then_stats_as_json(default_gguf):
    result = kog("generate", "Name a primary color.", "--device", "cpu", "--max-tokens", "12", "--json")
    assert result.returncode == 0, result.stderr
    *text, stats_line = result.stdout.strip().splitlines()
    stats = json.loads(stats_line)
    assert "".join(text).strip()
    assert 1 <= stats["generated_tokens"] <= 12
    assert stats["decode_tok_s"] > 0 and stats["prompt_tokens"] > 0 and stats["model"] == "smollm2-135m-instruct"


def test_generate_raw_prints_a_stats_line(default_gguf):
    result = kog("generate", "def add(a, b):", "--raw", "--device", "cpu", "--max-tokens", "8", "--seed", "3", "--temperature", "0.7",
                 env={"COLUMNS": "40"})
    assert result.returncode == 0, result.stderr
    assert "tok/s" in result.stderr and "TTFT" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one line whatever the width: logs and grep see it whole


@pytest.mark.parametrize("args, fragment", [
    (["--context", "3"], "context must be at least 16"),
    (["--device", "bogus"], "unknown device 'bogus'"),
    (["--temperature", "nan"], "temperature must be a finite number"),
])
def test_chat_refuses_bad_options_before_the_screen(tmp_path, args, fragment):
    assert_one_line_error(kog("chat", *args, env={"KOG_HOME": str(tmp_path)}), fragment)


def test_interrupted_generation_prints_its_stats_and_exits_130(default_gguf):
    proc = subprocess.Popen([*KOG, "generate", "Tell me a long story.", "--device", "cpu", "--max-tokens", "4000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.read(1)  # the reply has started
        proc.send_signal(signal.SIGINT)
        out, errors = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, errors
    assert "stop: cancelled" in " ".join(errors.split()) and "Traceback" not in errors


# A Ctrl+C that lands while kog's modules load, made certain: the import of kogcli.main raises it.
_INTERRUPTED_IMPORT = """
import builtins, sys
real_import = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "kogcli.main":
        raise KeyboardInterrupt
    return real_import(name, *args, **kwargs)
builtins.__import__ = interrupted
from kogcli import entry_point
entry_point()
"""


def test_a_ctrl_c_while_loading_exits_130_without_a_traceback():
    result = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 130 and result.stderr.strip() == "interrupted", result.stderr


def test_unknown_model_suggests_close_names():
    assert_one_line_error(kog("generate", "hi", "--model", "smollm2-135m-instruc"), "did you mean smollm2-135m-instruct")


def test_cuda_without_a_gpu(default_gguf):
    pytest.importorskip("engine.backends")
    from engine.backends import cuda_available

    if cuda_available():
        pytest.skip("this machine has a GPU")
    assert_one_line_error(kog("generate", "hi", "--device", "cuda"), "needs an NVIDIA GPU")


def test_prompt_longer_than_the_context(default_gguf):
    assert_one_line_error(kog("generate", "word " * 200, "--device", "cpu", "--context", "64"), "context holds 64")


def test_context_above_the_models_maximum_is_capped_with_a_notice(default_gguf):
    result = kog("generate", "hi", "--device", "cpu", "--context", "100000", "--max-tokens", "2")
    assert result.returncode == 0, result.stderr
    assert "holds at most 8,192 tokens of context: using 8,192, not 100,000" in result.stderr


def test_bad_sampling_parameter():
    assert_one_line_error(kog("generate", "hi", "--top-p", "0"), "top-p must be in (0, 1]")


@pytest.mark.parametrize("args, fragment", [
    (["--max-tokens", "-5"], "--max-tokens must be >= 1"),
    (["--device", "bogus"], "unknown device 'bogus'"),
    (["--temperature", "nan"], "temperature must be a finite number"),
    (["--temperature", "inf"], "temperature must be a finite number"),
    (["--repetition-penalty", "nan"], "repetition penalty must be a finite number"),
    (["--raw", "--system", "Be brief."], "--system needs the chat template"),
    (["--context", "3"], "context must be at least 16"),
    (["--drafts", "0"], "--drafts must be 1 (off) to 8"),
    (["--drafts", "3", "--device", "cpu"], "--drafts needs the CUDA backend"),
])
def test_bad_options_are_refused_before_any_download(tmp_path, args, fragment):
    assert_one_line_error(kog("generate", "hi", *args, env=OFFLINE | {"KOG_HOME": str(tmp_path)}), fragment)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("prompt, stdin", [("", None), (" \n\t", None), ("-", "  \n")])
def test_an_empty_prompt_is_refused_before_any_download(tmp_path, prompt, stdin):
    result = subprocess.run([*KOG, "generate", prompt], input=stdin or "", capture_output=True, text=True, timeout=120,
                            env=os.environ | OFFLINE | {"KOG_HOME": str(tmp_path)})
    assert_one_line_error(result, "empty prompt")


@pytest.mark.parametrize("args, stdin, fragment", [
    (["-"], b"\xff\xfe not text\n", "standard input is not UTF-8 text"),
    (["-"], None, "no standard input to read the prompt from"),  # stdin closed
    ([b"\xff".decode("utf-8", "surrogateescape")], b"", "the prompt is not UTF-8 text"),
])
def test_a_prompt_that_is_not_text_is_refused_before_any_download(tmp_path, args, stdin, fragment):
    closed = ["sh", "-c", 'exec "$@" <&-', "sh"] if stdin is None else []
    result = subprocess.run([*closed, *KOG, "generate", *args], input=stdin, capture_output=True, timeout=120,
                            env=os.environ | OFFLINE | {"KOG_HOME": str(tmp_path)})
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    assert_one_line_error(result, fragment)


def test_generate_reads_the_prompt_from_standard_input_after_a_dash(default_gguf):
    piped = subprocess.run([*KOG, "generate", "-", "--raw", "--device", "cpu", "--max-tokens", "6"],
                           input="The capital of France is", capture_output=True, text=True, timeout=300)
    given = kog("generate", "The capital of France is", "--raw", "--device", "cpu", "--max-tokens", "6")
    assert piped.returncode == 0 and given.returncode == 0, piped.stderr + given.stderr
    assert piped.stdout == given.stdout
    prompt_tokens = [re.search(r"\((\d+) prompt", " ".join(r.stderr.split())).group(1) for r in (piped, given)]
    assert prompt_tokens[0] == prompt_tokens[1]


def test_corrupt_local_model(tmp_path):
    (tmp_path / "config.json").write_text("{broken")
    assert_one_line_error(kog("generate", "hi", "--model", str(tmp_path)), "corrupt model config")


def test_pull_offline(tmp_path):
    result = kog("pull", "smollm2-135m-instruct", env=OFFLINE | {"KOG_HOME": str(tmp_path)})
    assert_one_line_error(result, "offline", chatter_before=True)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_a_kog_home_that_is_a_file(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    for args in (["pull", "smollm2-135m-instruct"], ["generate", "hi", "--device", "cpu"]):
        assert_one_line_error(kog(*args, env=OFFLINE | {"KOG_HOME": str(home)}), "cannot create the folder")


def test_chat_without_a_terminal_is_one_error_not_a_hang(tmp_path):
    result = kog("chat", env={"KOG_HOME": str(tmp_path)}, timeout=60)  # stdin and stdout are pipes here
    assert_one_line_error(result, "kog chat needs a terminal")


def test_a_closed_standard_output_is_one_error(tmp_path):
    result = subprocess.run([*KOG, "generate", "hi", "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, timeout=60, env=os.environ | {"KOG_HOME": str(tmp_path)},
                            preexec_fn=lambda: os.close(1))  # started as `kog generate hi >&-`
    assert_one_line_error(result, "standard output is closed")


def test_resuming_from_a_damaged_history_says_where_it_went(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "chats.db").write_bytes(os.urandom(4096))
    result = kog("chat", "--resume", env={"KOG_HOME": str(tmp_path)})
    assert_one_line_error(result, "there is no saved chat to resume")
    assert "chats.db.corrupt-" in " ".join(result.stderr.split())
