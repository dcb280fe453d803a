"""Chat template rendering against transformers' apply_chat_template."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from engine import chat_template
from engine.errors import KogError

BOS, EOS = "<s>", "</s>"


def hf_render(template: str, messages, add_generation_prompt=True, tools=None, **variables) -> str:
    """transformers' rendering of `template`, through a throwaway tokenizer that carries it."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.WordLevel({BOS: 0, EOS: 1, "<unk>": 2}, unk_token="<unk>"))
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, chat_template=template
    )
    return hf.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **variables
    )


def render(template: str, messages, add_generation_prompt=True, tools=None, **variables) -> str:
    return chat_template.render(
        template, messages, add_generation_prompt=add_generation_prompt, tools=tools,
        bos_token=BOS, eos_token=EOS, **variables,
    )


CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Block tags on their own lines, to exercise trim_blocks / lstrip_blocks and `-` whitespace control.
HEADERS = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system = "" %}
{%- endif %}
<|start_header_id|>system<|end_header_id|>

{{ system }}
{%- if tools %}

Tools:
    {%- for t in tools %}

{{ t | tojson(indent=4) }}
    {%- endfor %}
{%- endif %}
<|eot_id|>
{% for m in messages %}
    {% if m['role'] not in ['user', 'assistant', 'tool'] %}
        {{ raise_exception('unknown role ' + m['role']) }}
    {% endif %}
<|start_header_id|>{{ m['role'] }}<|end_header_id|>

{% if m.tool_calls is defined %}
{% for call in m.tool_calls %}{{ call.function | tojson }}{% endfor %}
{% else %}
{{ m['content'] | trim }}
{% endif %}
<|eot_id|>
{% endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Loop controls, namespaces, extra variables (enable_thinking), eos_token.
LOOPS = """{%- set ns = namespace(users=0) %}
{%- for m in messages %}
    {%- if m.role == 'system' %}{% continue %}{% endif %}
    {%- if m.role == 'user' %}{% set ns.users = ns.users + 1 %}{% endif %}
    {%- if ns.users > 2 %}{% break %}{% endif %}
[{{ loop.index }}:{{ m.role }}] {{ m.content }}{{ eos_token if m.role == 'assistant' }}
{% endfor %}
{%- if add_generation_prompt %}[assistant]
    {%- if enable_thinking is defined and not enable_thinking %} <think></think>{% endif %}
{%- endif %}"""

# transformers' training-mask marker around the assistant's turns (TRL-style templates)
GENERATION = """{%- for message in messages %}
<|{{ message.role }}|>
{%- if message.role == 'assistant' %}{% generation %}{{ message.content }}<|end|>{% endgeneration %}
{%- else %}{{ message.content }}<|end|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""

MESSAGES = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi"}],
    "multi_turn": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "five"},
    ],
    "unicode": [
        {"role": "user", "content": "Ünïcödé 日本語 😀👨‍👩‍👧 שלום\n\ttabbed\r\n"},
        {"role": "assistant", "content": "«réponse» ✓"},
        {"role": "user", "content": "{\"json\": [1, 2]}"},
    ],
    "tool_call": [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "°C"}}}
            ],
        },
        {"role": "tool", "content": "{\"temp\": 21}"},
    ],
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle — current weather ☀",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"type": "string", "enum": ["°C", "°F"]}, "city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


CASES = [(t, m) for t in ("CHATML", "HEADERS", "LOOPS", "GENERATION") for m in MESSAGES if (t, m) != ("CHATML", "tool_call")]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(("template", "messages"), CASES)
def test_matches_transformers(template, messages, add_generation_prompt):
    source, chat = globals()[template], MESSAGES[messages]
    assert render(source, chat, add_generation_prompt) == hf_render(source, chat, add_generation_prompt)


@pytest.mark.parametrize("messages", ["system", "tool_call"])
def test_tools_match_transformers(messages):
    chat = MESSAGES[messages]
    out = render(HEADERS, chat, tools=TOOLS)
    assert out == hf_render(HEADERS, chat, tools=TOOLS)
    assert "Météo" in out and '"properties": {\n' in out  # non-ASCII kept, indent applied, key order kept
    assert out.index('"unit"') < out.index('"city"')


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_extra_variables(enable_thinking):
    chat = MESSAGES["user"]
    out = render(LOOPS, chat, enable_thinking=enable_thinking)
    assert out == hf_render(LOOPS, chat, enable_thinking=enable_thinking)
    assert ("<think>" in out) != enable_thinking


def test_documents_defined_as_in_transformers():
    template = "{% if documents is not none %}[{{ documents | length }} docs]{% endif %}{{ messages[0].content }}"
    chat = MESSAGES["user"]
    assert render(template, chat) == hf_render(template, chat) == "Hello!"


def test_tojson_options():
    value = {"b": "ü", "a": [1, {"z": None}]}
    out = render("{{ messages | tojson }}|{{ messages | tojson(indent=2) }}|{{ messages | tojson(sort_keys=true) }}", value)
    assert out.split("|") == [
        json.dumps(value, ensure_ascii=False),
        json.dumps(value, ensure_ascii=False, indent=2),
        json.dumps(value, ensure_ascii=False, sort_keys=True),
    ]


def test_strftime_now():
    out = render("{{ strftime_now('%Y') }}", [])
    assert out == datetime.now().strftime("%Y")


def test_compiled_once():
    template = CHATML + "{# cache probe #}"
    render(template, MESSAGES["user"])
    before = chat_template._compile.cache_info().hits
    render(template, MESSAGES["system"])
    assert chat_template._compile.cache_info().hits == before + 1


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for m in messages %}{{ m }}", "chat template syntax error on line 1"),
        ("{{ 'a' }\n{{ b }}", "chat template syntax error"),
        (HEADERS, "chat template error: unknown role narrator"),
        ("{{ messages.append(1) }}", "chat template error"),
        ("{{ nothing.at_all }}", "chat template error: 'nothing' is undefined"),
        ("{{ 1 + 'a' }}", "chat template failed"),
        ("{{ 1 // 0 }}", "chat template failed: integer division or modulo by zero"),
        ("{% for i in range(10**9) %}{% endfor %}", "chat template failed: Range too big"),
    ],
)
def test_errors_are_one_line_kog_errors(template, message):
    with pytest.raises(KogError, match=message) as info:
        render(template, [{"role": "narrator", "content": "x"}])
    assert "\n" not in str(info.value)
