"""A real OpenAI-compatible HTTP server on 127.0.0.1 that streams canned answers.

A test double of a model server: the agent's HTTP client talks to it over a real socket,
with real server-sent events. Each POST to /v1/chat/completions takes the next answer;
an answer may also be a dict that makes the server misbehave in one way (an error status,
a stream cut short, a payload that is not JSON, a stream that stays quiet, an answer past
max_tokens). It shuts itself down after `lifetime_s`
even if a test forgets to.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHARS_PER_TOKEN = 4


class ScriptedServer:
    def __init__(self, answers: list, model: str = "served-model", api_key: str | None = None, lifetime_s: float = 120.0):
        self.answers = list(answers)
        self.model = model
        self.api_key = api_key
        self.lifetime_s = lifetime_s
        self.requests: list[dict] = []  # {"path", "headers", "body"} per request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedServer:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.timer = threading.Timer(self.lifetime_s, self.httpd.shutdown)
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def _handler(server: ScriptedServer):
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that stops reading cannot hold a thread for long

        def log_message(self, *args) -> None:
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _event(self, payload: str) -> None:
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()

        def do_GET(self) -> None:
            server.requests.append({"path": self.path, "headers": dict(self.headers), "body": None})
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            if self.path != "/v1/chat/completions":
                return self._json(404, {"error": {"message": f"no route {self.path}"}})
            if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                return self._json(401, {"error": {"message": "invalid api key"}})
            if not server.answers:
                return self._json(500, {"error": {"message": "the scripted server has no answers left"}})
            answer = server.answers.pop(0)
            if isinstance(answer, dict) and "status" in answer:
                return self._json(answer["status"], {"error": {"message": answer["message"]}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(b": the scripted server says hello\n\n")  # an SSE comment, to be skipped
            if isinstance(answer, dict) and "raw" in answer:
                return self.wfile.write(answer["raw"].encode())
            if isinstance(answer, dict) and "quiet_s" in answer:  # the stream open, no token: keep-alives or nothing
                end = time.monotonic() + answer["quiet_s"]
                try:
                    while time.monotonic() < end:
                        if answer.get("pings"):
                            self.wfile.write(b": ping\n\n")
                            self.wfile.flush()
                        time.sleep(0.1)
                except OSError:  # the client has gone
                    pass
                return
            text = answer["text"] if isinstance(answer, dict) else answer
            pieces = [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]
            limit = len(pieces) if isinstance(answer, dict) and answer.get("overrun") else body.get("max_tokens") or len(pieces)
            for n, piece in enumerate(pieces[:limit]):
                if isinstance(answer, dict) and n == answer.get("cut_after"):
                    return  # the connection closes mid-stream, with no [DONE]
                chunk = {"object": "chat.completion.chunk", "model": server.model,
                         "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                self._event(json.dumps(chunk))
            finish = "length" if len(pieces) > limit else "stop"
            self._event(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
            usage = {"prompt_tokens": 100, "completion_tokens": min(limit, len(pieces)), "total_tokens": 0}
            self._event(json.dumps({"choices": [], "usage": usage}))
            self._event("[DONE]")

    return Handler
