"""Rendering a model's Jinja chat template into the prompt string it was trained on.

Templates come from model files, so they are untrusted code: they run in Jinja's immutable
sandbox. The environment mirrors the one transformers gives templates (the de facto standard
the templates are written against): trim_blocks, lstrip_blocks, loop controls, the
`generation` block, plus the helpers `raise_exception`, `strftime_now` and a `tojson` that keeps non-ASCII text and key order.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import KogError


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own filter sorts keys and HTML-escapes; templates expect plain json.dumps output.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's tokens for training masks;
    for a prompt it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return _ENV.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise KogError(f"chat template syntax error on line {e.lineno}: {_one_line(e.message)}") from None


def render(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **variables,
) -> str:
    """The prompt for `messages`; `variables` reach the template as-is (e.g. enable_thinking)."""
    compiled = _compile(template)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=bos_token,
            eos_token=eos_token,
            # transformers always passes documents (None without RAG), so `documents is not none` is false
            **{"documents": None, **variables},
        )
    except jinja2.TemplateError as e:
        # raise_exception, undefined variables and sandbox violations all land here
        raise KogError(f"chat template error: {_one_line(e.message or type(e).__name__)}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
        # ArithmeticError: a division by zero, or the sandbox's OverflowError for a too-big range
        raise KogError(f"chat template failed: {_one_line(e)}") from None
