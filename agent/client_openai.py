"""Any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, Ollama, hosted APIs), streamed.

POST {endpoint}/chat/completions with `stream: true`; the answer arrives as server-sent
events, one `data: {json}` per chunk, ending with `data: [DONE]`. Servers send about one
token per chunk, so the live token count is the chunk count until the final usage figure
(asked for with `stream_options.include_usage`) replaces it. Token counts for budgeting
are estimated from characters, since the server's tokenizer is not at hand.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx

from agent.client import ReplyStats
from engine.errors import KogError

CHARS_PER_TOKEN = 3.5  # a conservative average for code and English with BPE vocabularies
PER_MESSAGE_TOKENS = 6  # role markers and separators a chat template adds


def _message(detail) -> str:
    """The human part of an OpenAI-style error body, on one line."""
    if isinstance(detail, dict):
        detail = detail.get("error", detail)
    if isinstance(detail, dict):
        detail = detail.get("message", detail)
    return " ".join(str(detail).split())[:300]


def _error_text(response: httpx.Response) -> str:
    try:
        return _message(response.json())
    except ValueError:
        return _message(response.text)


class OpenAIReply:
    def __init__(self, client: OpenAIClient, body: dict, deadline: float | None):
        self._client = client
        self._body = body
        self._deadline = deadline
        self._cancelled = threading.Event()
        self.stats = ReplyStats()

    def cancel(self) -> None:
        self._cancelled.set()

    def _over(self) -> bool:
        return self._cancelled.is_set() or (self._deadline is not None and time.perf_counter() >= self._deadline)

    def __iter__(self) -> Iterator[str]:
        start = time.perf_counter()
        first = last = None
        stats = self.stats
        stats.stop_reason = "cancelled"
        read_s = self._client.read_timeout_s
        if self._deadline is not None:  # a server gone quiet is waited for until the deadline at most
            read_s = max(0.1, min(read_s, self._deadline - start))
        try:
            with self._client.http.stream("POST", self._client.chat_url, json=self._body,
                                          timeout=httpx.Timeout(read_s, connect=min(10.0, read_s))) as response:
                if response.status_code != 200:
                    response.read()
                    raise KogError(f"{self._client.chat_url} answered {response.status_code}: {_error_text(response)}")
                for chunk in _events(response.iter_lines(), self._client.chat_url, self._over):
                    if self._over():
                        return
                    if "error" in chunk:
                        raise KogError(f"{self._client.chat_url} reported an error: {_message(chunk)}")
                    usage = chunk.get("usage") or {}
                    stats.prompt_tokens = usage.get("prompt_tokens", stats.prompt_tokens)
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    stats.reused_tokens = cached or stats.reused_tokens
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content")
                        if choice.get("finish_reason"):
                            stats.stop_reason = "length" if choice["finish_reason"] == "length" else "stop"
                        if text:
                            now = time.perf_counter()
                            first = first or now
                            last = now
                            stats.generated_tokens += 1
                            stats.ttft_s = first - start
                            stats.decode_s = last - first
                            yield text
                    if usage.get("completion_tokens"):
                        stats.generated_tokens = usage["completion_tokens"]
        except httpx.TimeoutException:
            if self._over():  # the deadline came while the server was quiet: a cancelled reply, not a failure
                return
            raise KogError(f"{self._client.chat_url} stopped answering (no data for {self._client.read_timeout_s:.0f} s)") from None
        except httpx.HTTPError as e:
            raise KogError(f"cannot reach {self._client.chat_url}: {' '.join(str(e).split()) or type(e).__name__}") from None
        if stats.stop_reason == "cancelled" and not self._over():
            stats.stop_reason = "stop"  # the stream ended without a finish_reason


def _events(lines: Iterator[str], url: str, stop: Callable[[], bool]) -> Iterator[dict]:
    """The JSON payloads of a server-sent event stream, until [DONE] or until `stop()` (checked at every line:
    a server may send only keep-alive comments for as long as it likes)."""
    data: list[str] = []
    for line in lines:
        if stop():
            return
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line.strip() and data:  # a blank line ends an event
            payload, data = "\n".join(data), []
            if payload == "[DONE]":
                return
            try:
                yield json.loads(payload)
            except json.JSONDecodeError:
                raise KogError(f"{url} sent an event that is not JSON: {payload[:120]!r}") from None
        # anything else is a comment (": ping"), an event name or an id: nothing for us
    # Without [DONE] the answer may be cut anywhere; acting on half an edit is worse than stopping.
    raise KogError(f"the stream from {url} ended before [DONE] (connection lost?)")


class OpenAIClient:
    def __init__(
        self,
        endpoint: str,
        api_key: str | None = None,
        model: str | None = None,
        context_size: int = 8192,
        temperature: float = 0.0,
        read_timeout_s: float = 120.0,
    ):
        base = endpoint.rstrip("/")
        try:
            httpx.URL(base)
        except httpx.InvalidURL as e:
            raise KogError(f"--endpoint {endpoint!r} is not a valid URL: {e}") from None
        if not base.startswith(("http://", "https://")):
            raise KogError(f"--endpoint must be an http:// or https:// URL, got {endpoint!r}")
        base = base.removesuffix("/chat/completions")
        self.chat_url = f"{base}/chat/completions"
        self.models_url = f"{base}/models"
        self.context_size = context_size
        self.temperature = temperature
        self.read_timeout_s = read_timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(read_timeout_s, connect=10.0))
        self.name = model or self._served_model()
        self.device = base

    def _served_model(self) -> str:
        """The endpoint's first model, for servers that host one and users who did not name it."""
        try:
            response = self.http.get(self.models_url)
        except httpx.HTTPError as e:
            raise KogError(f"cannot reach {self.models_url}: {' '.join(str(e).split()) or type(e).__name__}") from None
        if response.status_code != 200:
            raise KogError(f"{self.models_url} answered {response.status_code}: {_error_text(response)}; name the model with --model")
        try:
            return response.json()["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise KogError(f"{self.models_url} lists no model; name one with --model") from None

    def close(self) -> None:
        self.http.close()

    def count_tokens(self, text: str) -> int:
        return int(len(text) / CHARS_PER_TOKEN) + 1

    def prompt_tokens(self, system: str, messages: list[dict]) -> int:
        conversation = [{"content": system}, *messages]
        return sum(self.count_tokens(m["content"]) + PER_MESSAGE_TOKENS for m in conversation)

    def generate(self, system: str, messages: list[dict], max_tokens: int, deadline: float | None = None) -> OpenAIReply:
        body = {
            "model": self.name,
            "messages": [{"role": "system", "content": system}, *messages],
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return OpenAIReply(self, body, deadline)
