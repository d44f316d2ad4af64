"""The server's output parser (src/serve/output_parse.c) through the C API:
reasoning, content and tool calls out of the formats the Hub's chat
templates teach (think tags, Hermes <tool_call>, DeepSeek's tool markers,
Llama 3.1 JSON, gpt-oss harmony), the same however the text is cut into
feeds; and the style each real template in ../shared selects. The
expected parts are written from each format's documentation: OpenAI's
message fields that vLLM's parsers give for the same text."""
import ctypes
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT.parent / "shared" / "data" / "chat_templates"
LIB = ctypes.CDLL(os.environ.get("HUBRT_LIBRARY", str(ROOT / "build" / "libhubrt.so")))

NONE, HERMES, DEEPSEEK, LLAMA3 = range(4)


class Style(ctypes.Structure):
    _fields_ = [("think", ctypes.c_bool), ("think_open", ctypes.c_bool), ("harmony", ctypes.c_bool),
                ("tools", ctypes.c_int), ("keep_special", ctypes.c_bool)]


class Call(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("arguments", ctypes.c_char_p)]


class Delta(ctypes.Structure):
    _fields_ = [("reasoning", ctypes.c_void_p), ("content", ctypes.c_void_p), ("reasoning_len", ctypes.c_size_t),
                ("content_len", ctypes.c_size_t), ("calls", ctypes.POINTER(Call)), ("n_calls", ctypes.c_int)]


LIB.hr_output_style_detect.restype = Style
LIB.hr_output_style_detect.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_bool]
LIB.hr_output_parser_new.argtypes = [ctypes.POINTER(Style), ctypes.POINTER(ctypes.c_void_p)]
LIB.hr_output_parser_feed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_bool,
                                      ctypes.POINTER(Delta)]
LIB.hr_output_parser_free.argtypes = [ctypes.c_void_p]
LIB.hr_output_delta_clear.argtypes = [ctypes.POINTER(Delta)]


def parse(style, pieces):
    """(reasoning, content, calls) of the text fed as `pieces` (bytes each)."""
    p = ctypes.c_void_p()
    assert LIB.hr_output_parser_new(ctypes.byref(style), ctypes.byref(p)) == 0
    reasoning, content, calls = b"", b"", []
    for i, piece in enumerate(pieces + [b""]):
        d = Delta()
        assert LIB.hr_output_parser_feed(p, piece, len(piece), i == len(pieces), ctypes.byref(d)) == 0
        if d.reasoning:
            reasoning += ctypes.string_at(d.reasoning, d.reasoning_len)
        if d.content:
            content += ctypes.string_at(d.content, d.content_len)
        calls += [(d.calls[k].name.decode(), json.loads(d.calls[k].arguments)) for k in range(d.n_calls)]
        LIB.hr_output_delta_clear(ctypes.byref(d))
    LIB.hr_output_parser_free(p)
    return reasoning.decode(), content.decode(), calls


def splits(text):
    """The text whole, byte by byte, and in pieces of 2, 3 and 5 bytes."""
    b = text.encode()
    yield [b]
    for k in (1, 2, 3, 5):
        yield [b[i:i + k] for i in range(0, len(b), k)]


DS_CALLS = "<｜tool▁calls▁begin｜>"
DS_CALL, DS_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
WEATHER = ("get_weather", {"city": "Paris", "unit": "c"})

CASES = [
    ("qwen3 thinking", Style(think=True),
     "<think>\nThe user wants a city.\n</think>\n\nParis is nice.",
     ("\nThe user wants a city.\n", "Paris is nice.", [])),
    ("thinking off", Style(think=True), "<think>\n\n</think>\n\nHello <b>there</b>.",
     ("\n\n", "Hello <b>there</b>.", [])),
    ("whitespace before <think>", Style(think=True), " \n<think>x</think>\n\ny", ("x", "y", [])),
    ("no think tags", Style(think=True), "Just an answer with </thin and <think> inside.",
     ("", "Just an answer with </thin and <think> inside.", [])),
    ("r1 opened in the prompt", Style(think=True, think_open=True), "Hmm, 2+2.\n</think>\n\n4",
     ("Hmm, 2+2.\n", "4", [])),
    ("r1 never closed", Style(think=True, think_open=True), "still thinking", ("still thinking", "", [])),
    ("hermes call", Style(think=True, tools=HERMES),
     "<think>\nNeed weather.\n</think>\n\nLet me check.\n<tool_call>\n"
     '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>',
     ("\nNeed weather.\n", "Let me check.\n", [WEATHER])),
    ("hermes two calls", Style(tools=HERMES),
     '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": '
     '{"x": [1, 2]}}\n</tool_call>',
     ("", "", [("a", {}), ("b", {"x": [1, 2]})])),
    ("hermes not json", Style(tools=HERMES), "<tool_call>\nnot json\n</tool_call>",
     ("", "<tool_call>\nnot json\n</tool_call>", [])),
    ("hermes unterminated", Style(tools=HERMES), 'Sure <tool_call>{"name": "a"',
     ("", 'Sure <tool_call>{"name": "a"', [])),
    ("deepseek r1 call", Style(think=True, think_open=True, tools=DEEPSEEK),
     f"Weather needed.</think>{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n"
     f'{{"city": "Paris", "unit": "c"}}\n```{DS_END}{DS_CALLS_END}',
     ("Weather needed.", "", [WEATHER])),
    ("deepseek v3.1 calls", Style(tools=DEEPSEEK),
     f'Checking.{DS_CALLS}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris", "unit": "c"}}{DS_END}'
     f'{DS_CALL}now{DS_SEP}{{}}{DS_END}{DS_CALLS_END}',
     ("", "Checking.", [WEATHER, ("now", {})])),
    ("llama 3.1 json", Style(tools=LLAMA3),
     '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', ("", "", [WEATHER])),
    ("llama 3.1 python tag", Style(tools=LLAMA3),
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', ("", "", [WEATHER])),
    ("llama 3.1 plain answer", Style(tools=LLAMA3), "The weather is {unknown}.",
     ("", "The weather is {unknown}.", [])),
    ("llama 3.1 json that is no call", Style(tools=LLAMA3), '{"answer": 4}', ("", '{"answer": 4}', [])),
    ("harmony answer", Style(harmony=True),
     "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>",
     ("User greets.", "Hi!", [])),
    ("harmony call", Style(harmony=True),
     "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris","unit":"c"}<|call|>',
     ("Need weather.", "", [WEATHER])),
    ("harmony recipient first", Style(harmony=True),
     '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", '
     '"unit": "c"}<|call|>', ("", "", [WEATHER])),
    ("harmony cut short", Style(harmony=True), "<|channel|>final<|message|>Partial answ",
     ("", "Partial answ", [])),
    ("plain", Style(), "Unicode é and 日本 and <think> stay.", ("", "Unicode é and 日本 and <think> stay.", [])),
]


@pytest.mark.parametrize("name,style,text,want", CASES, ids=[c[0] for c in CASES])
def test_parts(name, style, text, want):
    for pieces in splits(text):
        assert parse(style, pieces) == want, (name, [len(p) for p in pieces][:3])


def detect(template, prompt="", tools=False):
    s = LIB.hr_output_style_detect((TEMPLATES / template).read_bytes(), prompt.encode(), len(prompt.encode()),
                                   tools)
    return (s.think, s.think_open, s.harmony, s.tools, s.keep_special)


def test_styles_of_the_real_templates():
    assert detect("qwen3.jinja", "<|im_start|>assistant\n", tools=True) == (True, False, False, HERMES, False)
    assert detect("qwen3.jinja", "<|im_start|>assistant\n") == (True, False, False, NONE, False)
    assert detect("qwen2_5.jinja", tools=True) == (False, False, False, HERMES, False)
    assert detect("hermes3_tool_use.jinja", tools=True)[3] == HERMES
    r1 = detect("deepseek_r1_distill_qwen.jinja", "<｜Assistant｜><think>\n", tools=True)
    assert r1 == (True, True, False, DEEPSEEK, True)
    assert detect("deepseek_v3_1.jinja", "<｜Assistant｜></think>", tools=True) == (True, False, False, DEEPSEEK,
                                                                                  True)
    assert detect("llama3_1.jinja", tools=True) == (False, False, False, LLAMA3, False)
    assert detect("llama3_1.jinja") == (False, False, False, NONE, False)
    assert detect("gpt_oss.jinja", "<|start|>assistant")[2:] == (True, NONE, True)
    assert detect("gemma3.jinja", tools=True) == (False, False, False, NONE, False)
