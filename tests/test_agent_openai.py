"""The OpenAI-compatible client against a real streaming HTTP server on 127.0.0.1."""

from __future__ import annotations

import io
import socket
import time

import pytest
from agent_fixtures.repos import make_repo
from agent_fixtures.scripted_server import ScriptedServer
from rich.console import Console

from agent.client_openai import OpenAIClient
from agent.display import Display
from agent.loop import Options, fix
from engine.errors import KogError

ANSWER = "Looking first.\n@read_file stats.py\n"
FIX_MEAN = ("@edit stats.py\n<<<<<<< SEARCH\n    return total(values) / (len(values) - 1)\n=======\n"
            "    return total(values) / len(values)\n>>>>>>> REPLACE\n")


@pytest.fixture(autouse=True)
def no_pytest_plugins(monkeypatch):
    """The fixture repositories need no pytest plugins; not loading this venv's saves ~1 s a test run."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def collect(reply) -> str:
    return "".join(reply)


def test_streams_an_answer_with_live_stats():
    with ScriptedServer([ANSWER]) as server:
        client = OpenAIClient(server.url)
        assert client.name == "served-model"  # asked /v1/models, since no model was named
        reply = client.generate("the system", [{"role": "user", "content": "fix it"}], max_tokens=100)
        seen = []
        for piece in reply:
            seen.append((piece, reply.stats.generated_tokens))
        client.close()
    assert "".join(p for p, _ in seen) == ANSWER
    assert [n for _, n in seen] == list(range(1, len(seen) + 1))  # the count grows as tokens arrive
    stats = reply.stats
    assert stats.generated_tokens == len(seen) and stats.prompt_tokens == 100 and stats.stop_reason == "stop"
    assert stats.ttft_s > 0 and stats.decode_s > 0 and stats.decode_tok_s > 0
    body = server.requests[-1]["body"]
    assert body["model"] == "served-model" and body["stream"] is True and body["max_tokens"] == 100
    assert body["messages"] == [{"role": "system", "content": "the system"}, {"role": "user", "content": "fix it"}]


def test_max_tokens_cuts_the_answer():
    with ScriptedServer([ANSWER], model="m") as server:
        client = OpenAIClient(server.url + "/chat/completions", model="named")
        reply = client.generate("s", [{"role": "user", "content": "u"}], max_tokens=3)
        assert collect(reply) == ANSWER[:12]
    assert reply.stats.stop_reason == "length" and reply.stats.generated_tokens == 3
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"]  # a named model needs no lookup
    assert server.requests[0]["body"]["model"] == "named"


def test_cancel_ends_the_stream():
    with ScriptedServer(["x" * 400]) as server:
        reply = OpenAIClient(server.url).generate("s", [{"role": "user", "content": "u"}], 1000)
        pieces = []
        for piece in reply:
            pieces.append(piece)
            reply.cancel()
    assert len(pieces) == 1 and reply.stats.stop_reason == "cancelled"


@pytest.mark.parametrize("pings", [False, True])
def test_a_quiet_server_is_waited_for_until_the_deadline_only(pings):
    with ScriptedServer([{"quiet_s": 20, "pings": pings}]) as server:
        start = time.perf_counter()
        reply = OpenAIClient(server.url, model="m").generate("s", [{"role": "user", "content": "u"}], 100, start + 1.0)
        assert collect(reply) == ""
        assert time.perf_counter() - start < 3
    assert reply.stats.stop_reason == "cancelled"  # the loop's "timeout", not an error


def test_the_agent_cuts_an_answer_the_server_runs_past_max_tokens(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    with ScriptedServer([{"text": "blah " * 400, "overrun": True}]) as server:
        client = OpenAIClient(server.url, model="m")
        summary = fix(root, client, Options(max_steps=1, step_tokens=50), Display(Console(file=io.StringIO())))
    assert summary["generated_tokens"] <= 51


def test_the_api_key_is_sent_as_a_bearer_token():
    with ScriptedServer([ANSWER], api_key="sesame") as server:
        with pytest.raises(KogError, match="answered 401: invalid api key"):
            collect(OpenAIClient(server.url, model="m").generate("s", [{"role": "user", "content": "u"}], 10))
        assert collect(OpenAIClient(server.url, api_key="sesame", model="m").generate("s", [{"role": "user", "content": "u"}], 100)) == ANSWER
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer sesame"


@pytest.mark.parametrize("answer, fragment", [
    ({"status": 503, "message": "model is loading"}, "answered 503: model is loading"),
    ({"text": ANSWER, "cut_after": 2}, r"ended before \[DONE\]"),
    ({"raw": "data: {not json\n\n"}, "not JSON"),
    ({"raw": 'data: {"error": {"message": "overloaded"}}\n\n'}, "reported an error: overloaded"),
])
def test_server_failures_become_one_line_errors(answer, fragment):
    with ScriptedServer([answer]) as server, pytest.raises(KogError, match=fragment) as e:
        collect(OpenAIClient(server.url, model="m").generate("s", [{"role": "user", "content": "u"}], 100))
    assert "\n" not in str(e.value)


def test_unreachable_and_malformed_endpoints():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    with pytest.raises(KogError, match="cannot reach"):
        OpenAIClient(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(KogError, match="cannot reach"):
        collect(OpenAIClient(f"http://127.0.0.1:{port}/v1", model="m").generate("s", [{"role": "user", "content": "u"}], 5))
    with pytest.raises(KogError, match="must be an http"):
        OpenAIClient("localhost:8000")


def test_the_agent_fixes_a_repository_through_the_endpoint(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    with ScriptedServer([ANSWER, FIX_MEAN]) as server:
        client = OpenAIClient(server.url)
        summary = fix(root, client, Options(), Display(Console(file=io.StringIO())))
        client.close()
    assert summary["fixed"] and summary["steps"] == 2 and summary["model"] == "served-model"
    assert summary["generated_tokens"] == -(-len(ANSWER) // 4) + -(-len(FIX_MEAN) // 4)
    second = server.requests[-1]["body"]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == ANSWER and "def mean(values):" in second[3]["content"]
