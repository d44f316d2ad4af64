"""hubrt serve against transformers and against itself: greedy answers
equal transformers' generate on the same prompt (the chat template applied
as apply_chat_template applies it), streams equal whole answers, requests
that share the batch get the answers they get alone, a chat's next turn
prefills only its new tokens, and bad requests, a full queue, a client
that leaves and SIGTERM are each handled without losing the server or a
stream's end."""
import functools
import http.client
import json
import shutil
import socket
import threading
from pathlib import Path

import openai
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM as HFModel
from transformers import AutoTokenizer

from hubrt_cli_util import make_tiny_fixtures
from serve_util import Server, run_parallel, sse_events, stream_text, wait_until


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    make_tiny_fixtures()


ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "fixtures" / "tiny-qwen3-tok"
GEMMA = ROOT / "fixtures" / "tiny-gemma3-tok"  # sliding window 8: rings smaller than a row


@functools.lru_cache(maxsize=None)
def hf(model):
    return AutoTokenizer.from_pretrained(model), HFModel.from_pretrained(model, dtype=torch.float32).eval()


def hf_greedy(model, ids, n):
    tok, m = hf(model)
    with torch.no_grad():
        out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def hf_prompt(model, text):
    return hf(model)[0](text)["input_ids"]


def hf_chat_prompt(model, messages):
    tok = hf(model)[0]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def qwen():
    with Server(QWEN, "--slots", 4, "--ctx", 256) as s:
        yield s


PROMPTS = ["Hello there", "The capital of France is", "1 2 3 4 5", "Once upon a time, in a land far",
           "def fib(n):", "Les chats sont", "{\"a\": [1, 2", "zzz"]


def test_health_models_and_page(qwen):
    assert requests.get(qwen.url + "/health").json() == {"status": "ok"}
    models = requests.get(qwen.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == str(QWEN)
    page = requests.get(qwen.url + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "/v1/chat/completions" in page.text


@pytest.mark.parametrize("prompt", PROMPTS[:4])
def test_completion_matches_transformers(qwen, prompt):
    r = qwen.post("/v1/completions", {"model": str(QWEN), "prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    j = r.json()
    ids = hf_prompt(QWEN, prompt)
    assert j["object"] == "text_completion"
    assert j["choices"][0]["text"] == hf_greedy(QWEN, ids, 12)
    assert j["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 12, "total_tokens": len(ids) + 12}
    assert j["choices"][0]["finish_reason"] == "length"


def test_chat_matches_transformers_and_streams_equal(qwen):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    body = {"messages": messages, "max_tokens": 10, "temperature": 0}
    whole = qwen.post("/v1/chat/completions", body).json()
    ids = hf_chat_prompt(QWEN, messages)
    want = hf_greedy(QWEN, ids, 10)
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": want}
    assert whole["usage"]["prompt_tokens"] == len(ids)
    r = qwen.post("/v1/chat/completions", dict(body, stream=True, stream_options={"include_usage": True}),
                  stream=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(ev["object"] == "chat.completion.chunk" and ev["id"] == events[0]["id"] for ev in events[:-1])
    assert events[-2]["usage"] == whole["usage"] and events[-2]["choices"] == []
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert stream_text(events, chat=True) == (want, "length")


def test_openai_client(qwen):
    client = openai.OpenAI(base_url=qwen.url + "/v1", api_key="none")
    assert [m.id for m in client.models.list()] == [str(QWEN)]
    messages = [{"role": "user", "content": "Hi"}]
    want = hf_greedy(QWEN, hf_chat_prompt(QWEN, messages), 8)
    c = client.chat.completions.create(model=str(QWEN), messages=messages, max_tokens=8, temperature=0)
    assert c.choices[0].message.content == want
    pieces = [ch.choices[0].delta.content or "" for ch in
              client.chat.completions.create(model=str(QWEN), messages=messages, max_tokens=8, temperature=0,
                                             stream=True) if ch.choices]
    assert "".join(pieces) == want
    t = client.completions.create(model=str(QWEN), prompt="Hello there", max_tokens=6, temperature=0)
    assert t.choices[0].text == hf_greedy(QWEN, hf_prompt(QWEN, "Hello there"), 6)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other/model", messages=messages, max_tokens=2)


def hf_logprobs(model, ids, n, k):
    """Greedy steps' log-softmax from transformers' logits: per step (token, logprob, top k)."""
    tok, m = hf(model)
    with torch.no_grad():
        out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, output_logits=True, return_dict_in_generate=True)
    steps = []
    for i, logits in enumerate(out.logits):
        lp = torch.log_softmax(logits[0].double(), -1)
        chosen = int(out.sequences[0, len(ids) + i])
        top = torch.topk(lp, k)
        steps.append((tok.decode([chosen]), float(lp[chosen]),
                      [(tok.decode([int(j)]), float(v)) for v, j in zip(top.values, top.indices)]))
    return steps


def test_logprobs_match_transformers(qwen):
    messages = [{"role": "user", "content": "Count with me."}]
    want = hf_logprobs(QWEN, hf_chat_prompt(QWEN, messages), 6, 5)
    j = qwen.post("/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0,
                                           "logprobs": True, "top_logprobs": 5}).json()
    content = j["choices"][0]["logprobs"]["content"]
    assert len(content) == 6
    for got, (token, lp, top) in zip(content, want):
        assert got["token"] == token and abs(got["logprob"] - lp) <= 1e-4
        assert bytes(got["bytes"]) == token.encode()
        assert [t["token"] for t in got["top_logprobs"]] == [t for t, _ in top]
        assert all(abs(t["logprob"] - v) <= 1e-4 for t, (_, v) in zip(got["top_logprobs"], top))
    # the completions API's form, streamed: one entry per token, offsets into the text
    ids = hf_prompt(QWEN, PROMPTS[2])
    want = hf_logprobs(QWEN, ids, 5, 3)
    r = qwen.post("/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 5, "temperature": 0, "logprobs": 3,
                                      "stream": True}, stream=True)
    entries = [ev["choices"][0]["logprobs"] for ev in sse_events(r)[:-1] if ev["choices"][0]["logprobs"]]
    tokens = [t for e in entries for t in e["tokens"]]
    assert tokens == [t for t, _, _ in want]
    lps = [x for e in entries for x in e["token_logprobs"]]
    assert all(abs(a - b) <= 1e-4 for a, (_, b, _) in zip(lps, want))
    offsets = [x for e in entries for x in e["text_offset"]]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    tops = [x for e in entries for x in e["top_logprobs"]]
    assert [sorted(t) for t in tops] == [sorted(dict(top)) for _, _, top in want]


def test_stop_strings_end_the_text(qwen):
    full = qwen.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0}).json()
    text = full["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), text
    cut = qwen.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0,
                                        "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == text[:text.index(stop)]
    r = qwen.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0, "stop": stop,
                                      "stream": True}, stream=True)
    assert stream_text(sse_events(r), chat=False) == (cut["text"], "stop")


def test_streams_cut_only_whole_characters_and_the_earliest_stop_wins(qwen):
    """Text held back for a stop string goes out in whole UTF-8 characters (each event is its own JSON
    string); of several stop strings, the one that begins first ends the text."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}
    whole = qwen.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    assert any(ord(ch) > 127 for ch in whole), whole  # this model answers with multibyte characters here
    for n in range(2, 8):  # stop strings of n bytes hold n - 1 back: cuts at every offset into a character
        r = qwen.post("/v1/chat/completions", dict(body, stop=["z" * n], stream=True), stream=True)
        events = sse_events(r)  # json.loads of each event: raises on a split character
        assert stream_text(events, chat=True)[0] == whole, n
        assert not any("\ufffd" in (ev["choices"][0]["delta"].get("content") or "")
                       for ev in events[:-1] if ev["choices"])
    text = qwen.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0}).json()
    text = text["choices"][0]["text"]
    late, early = text[-4:], text[1:4]
    assert text.index(early) < text.index(late)
    cut = qwen.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0,
                                        "stop": [late, early]}).json()["choices"][0]
    assert cut["text"] == text[:text.index(early)] and cut["finish_reason"] == "stop"


def test_unseeded_samples_differ_and_seeded_ones_repeat(qwen):
    body = {"prompt": PROMPTS[3], "max_tokens": 24, "temperature": 1.0}
    # four draws: this tiny model's likeliest continuation is likely enough that two draws have met
    # (once in a CI run of 2026-12-07); four all equal, without the sampler repeating, is far less so
    texts = [qwen.post("/v1/completions", body).json()["choices"][0]["text"] for _ in range(4)]
    assert len(set(texts)) > 1, texts
    seeded = [qwen.post("/v1/completions", dict(body, seed=7)).json()["choices"][0]["text"] for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_sixteen_concurrent_streams_get_their_own_answers(qwen):
    """Sampled answers (each request its own seed) alone, then all 16 at once on 4 rows: the same text."""
    bodies = [{"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 6 + (i * 5) % 17, "temperature": 0.9,
               "top_p": 0.95, "seed": 1000 + i, "stream": True} for i in range(16)]
    alone = [stream_text(sse_events(qwen.post("/v1/completions", b, stream=True)), chat=False) for b in bodies]
    before = qwen.metrics()
    got = [None] * 16

    def client(i):
        events = sse_events(qwen.post("/v1/completions", bodies[i], stream=True))
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"]
        got[i] = stream_text(events, chat=False)

    assert not run_parallel(client, 16)
    assert got == alone
    after = qwen.metrics()
    steps = after["hubrt_decode_steps_total"] - before["hubrt_decode_steps_total"]
    rows = after["hubrt_decode_rows_total"] - before["hubrt_decode_rows_total"]
    assert rows / steps > 2, (rows, steps)  # the requests shared decode steps


def test_next_turn_prefills_only_new_tokens(qwen):
    turn1 = [{"role": "user", "content": "Tell me about the sea."}]
    a1 = qwen.post("/v1/chat/completions", {"messages": turn1, "max_tokens": 8, "temperature": 0}).json()
    turn2 = turn1 + [a1["choices"][0]["message"], {"role": "user", "content": "And rivers?"}]
    before = qwen.metrics()
    a2 = qwen.post("/v1/chat/completions", {"messages": turn2, "max_tokens": 8, "temperature": 0}).json()
    after = qwen.metrics()
    prompt = a2["usage"]["prompt_tokens"]
    reused = after["hubrt_prefix_reused_tokens_total"] - before["hubrt_prefix_reused_tokens_total"]
    prefilled = after["hubrt_prefill_tokens_total"] - before["hubrt_prefill_tokens_total"]
    assert prefilled + reused == prompt
    ids1 = hf_chat_prompt(QWEN, turn1)
    assert reused >= len(ids1) - 1, (reused, len(ids1))  # the first turn's prompt came from its kept row
    assert prefilled < prompt
    assert a2["choices"][0]["message"]["content"] == hf_greedy(QWEN, hf_chat_prompt(QWEN, turn2), 8)


def test_bad_requests_get_4xx_and_the_server_goes_on(qwen):
    def raw(method, path, body, headers=None):
        host, port = qwen.url[len("http://"):].split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    cases = [
        ("POST", "/v1/completions", b'{"prompt": "hi", ', 400, "not valid JSON"),
        ("POST", "/v1/completions", b'[1, 2]', 400, "JSON object"),
        ("POST", "/v1/completions", b'{"prompt": 5}', 400, "'prompt'"),
        ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": -3}', 400, "'max_tokens'"),
        ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": "ten"}', 400, "'max_tokens'"),
        ("POST", "/v1/completions", b'{"prompt": "hi", "temperature": 9}', 400, "'temperature'"),
        ("POST", "/v1/completions", b'{"prompt": "hi", "n": 3}', 400, "'n'"),
        ("POST", "/v1/completions", b'{"prompt": "hi", "stop": ["a","b","c","d","e"]}', 400, "'stop'"),
        ("POST", "/v1/completions", b'{"prompt": [1, 99999999]}', 400, "vocabulary"),
        ("POST", "/v1/completions", b'{"prompt": "hi", "model": "nope"}', 404, "nope"),
        ("POST", "/v1/chat/completions", b'{"messages": []}', 400, "'messages'"),
        ("POST", "/v1/chat/completions", b'{"messages": [{"content": "x"}]}', 400, "'messages[0]'"),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}',
         400, "'top_logprobs'"),
        ("POST", "/v1/chat/completions",
         b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}', 400,
         "'top_logprobs'"),
        ("POST", "/v1/completions", b'{"prompt": "x", "logprobs": 6}', 400, "'logprobs'"),
        ("POST", "/v1/completions", b'{"prompt": "' + b"word " * 400 + b'"}', 400, "tokens"),
        ("POST", "/v1/completions", b'{"prompt": "' + b"x" * (5 << 20) + b'"}', 413, "limit"),
        ("GET", "/v1/completions", None, 405, "POST"),
        ("GET", "/nowhere", None, 404, "/nowhere"),
    ]
    for method, path, body, status, needle in cases:
        got, data = raw(method, path, body)
        assert got == status, (path, body[:80] if body else None, got, data)
        err = json.loads(data)["error"]
        assert needle in err["message"], (needle, err)
    ok = qwen.post("/v1/completions", {"prompt": "Hello there", "max_tokens": 3, "temperature": 0})
    assert ok.status_code == 200


def test_client_that_leaves_is_cancelled(qwen):
    host, port = qwen.url[len("http://"):].split(":")
    before = qwen.metrics()["hubrt_generated_tokens_total"]
    s = socket.create_connection((host, int(port)))
    body = json.dumps({"prompt": "Once", "max_tokens": 240, "temperature": 0, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:  # the headers may come alone
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    s.close()
    assert wait_until(lambda: qwen.metrics()["hubrt_requests_running"] == 0)
    assert qwen.metrics()["hubrt_generated_tokens_total"] - before < 240


def need_xla(extra):
    if "xla_cpu" in extra:
        import hubrt
        import numpy as np
        try:
            hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
        except hubrt.HubrtError as e:
            pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")


# the xla_cpu runs compile a module per op and shape: 45-110 s each under ASan, so that pass leaves them out
SLOW = pytest.mark.slow


@pytest.mark.parametrize("extra", [(), ("--compile",), pytest.param(("--device", "xla_cpu"), marks=SLOW),
                                   pytest.param(("--device", "xla_cpu", "--compile"), marks=SLOW)],
                         ids=["eager", "compiled", "xla_cpu", "xla_cpu-compiled"])
def test_cache_shifts_and_sliding_window_rows(extra, tmp_path, monkeypatch):
    """Gemma 3 (window 8) in rows of 40 cells: the write index reaches the end and the cells shift,
    and every answer still equals transformers' (with rings smaller than a row, nothing is reused);
    eager and compiled, on cpu and xla_cpu."""
    need_xla(extra)
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "plans"))
    prompts = ["Hello there, how", "The capital of France is", "1 2 3 4 5 6 7", "Once upon a time"]
    with Server(GEMMA, "--slots", 3, "--ctx", 40, *extra) as s:
        got = [None] * 8

        def client(i):
            r = s.post("/v1/completions", {"prompt": prompts[i % 4], "max_tokens": 10 + i, "temperature": 0})
            got[i] = r.json()["choices"][0]["text"]

        assert not run_parallel(client, 8)
        m = s.metrics()
    assert m["hubrt_cache_shifts_total"] > 0
    assert m["hubrt_prefix_reused_tokens_total"] == 0
    for i in range(8):
        assert got[i] == hf_greedy(GEMMA, hf_prompt(GEMMA, prompts[i % 4]), 10 + i), i


def test_full_queue_gets_503():
    with Server(QWEN, "--slots", 1, "--queue", 1, "--ctx", 256) as s:
        codes = []

        def client(i):
            codes.append(s.post("/v1/completions", {"prompt": "Once", "max_tokens": 200, "temperature": 0})
                         .status_code)

        assert not run_parallel(client, 6)
        assert 503 in codes and 200 in codes, codes
        assert s.metrics()["hubrt_requests_rejected_total"] == codes.count(503)


def test_sigterm_ends_every_stream():
    s = Server(QWEN, "--slots", 2, "--ctx", 256, "--grace", 0.2)
    results, started = [None] * 3, threading.Barrier(4)

    def client(i):
        r = s.post("/v1/completions", {"prompt": PROMPTS[i], "max_tokens": 250, "temperature": 0,
                                       "stream": True}, stream=True)
        started.wait()
        results[i] = sse_events(r)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait()
    assert s.stop() == 0
    for t in threads:
        t.join(60)
    for events in results:
        assert events and events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] in ("abort", "length", "stop")
    assert any(ev[-2]["choices"][0]["finish_reason"] == "abort" for ev in results)
    assert "shutting down" in "".join(s.err_lines)


SCRIPT = ('<think>Let me check the weather.</think>\n\n<tool_call>{"name":"get_weather","arguments":{"days":3}}'
          '</tool_call>')


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """A Qwen3 whose layers add nothing, so each token alone picks the next: it answers SCRIPT (tokens
    all distinct) to any prompt ending in the template's "assistant\\n", then <|im_end|>."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    tok = hf(QWEN)[0]
    chain = [tok("\n")["input_ids"][-1]] + tok(SCRIPT, add_special_tokens=False)["input_ids"]
    chain.append(tok.convert_tokens_to_ids("<|im_end|>"))
    assert len(set(chain)) == len(chain)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
                      eos_token_id=[151645, 151643], pad_token_id=151643, max_position_embeddings=256)
    torch.manual_seed(0)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        m.model.embed_tokens.weight.normal_(0, 0.02)
        m.lm_head.weight.zero_()
        for i, t in enumerate(chain):
            m.model.embed_tokens.weight[t] = 0
            m.model.embed_tokens.weight[t, i] = 1.0
            if i + 1 < len(chain):
                m.lm_head.weight[chain[i + 1], i] = 10.0
    out = tmp_path_factory.mktemp("scripted")
    m.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN / f, out / f)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    return out


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast.",
                                           "parameters": {"type": "object",
                                                          "properties": {"days": {"type": "integer"}}}}}]


def test_reasoning_and_tool_calls_are_parsed(scripted):
    messages = [{"role": "user", "content": "Weather for the next 3 days?"}]
    ids = hf_chat_prompt(scripted, messages)
    tok = hf(scripted)[0]
    raw = tok.decode(hf(scripted)[1].generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)[0, len(ids):],
                     skip_special_tokens=True)
    assert raw == SCRIPT  # transformers runs the script too
    with Server(scripted, "--slots", 2) as s:
        whole = s.post("/v1/chat/completions", {"messages": messages, "tools": TOOLS, "temperature": 0}).json()
        choice = whole["choices"][0]
        msg = choice["message"]
        assert choice["finish_reason"] == "tool_calls"
        assert msg["reasoning_content"] == "Let me check the weather."
        assert msg["content"] is None
        assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in
                msg["tool_calls"]] == [("function", "get_weather", {"days": 3})]
        # without tools the same output is reasoning and content
        plain = s.post("/v1/chat/completions", {"messages": messages, "temperature": 0}).json()["choices"][0]
        assert plain["message"]["content"] == SCRIPT.split("</think>\n\n")[1]
        assert plain["finish_reason"] == "stop" and "tool_calls" not in plain["message"]
        # streamed: reasoning deltas, then one tool call delta, then the finish
        events = sse_events(s.post("/v1/chat/completions", {"messages": messages, "tools": TOOLS, "temperature": 0,
                                                            "stream": True}, stream=True))
        deltas = [ev["choices"][0]["delta"] for ev in events[:-1] if ev["choices"]]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Let me check the weather."
        assert len([d for d in deltas if d.get("reasoning_content")]) > 1  # it streamed
        calls = [c for d in deltas for c in d.get("tool_calls") or []]
        assert [(c["index"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
            [(0, "get_weather", '{"days":3}')]
        assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
        # the openai client reads them
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
        c = client.chat.completions.create(model=str(scripted), messages=messages, tools=TOOLS, temperature=0)
        assert c.choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.parametrize("model,dtype,ctx", [(QWEN, "float32", 256), (QWEN, "bfloat16", 256), (GEMMA, "float32", 64)],
                         ids=["qwen3-f32", "qwen3-bf16", "gemma3-ring-shifts"])
def test_deterministic_logits_equal_running_alone(model, dtype, ctx):
    """--deterministic: each request's log-probabilities (its logits, through an f32 log-softmax) bitwise
    equal whether it runs alone or joins a batch of others at other times, in another row. The prompts
    are long enough that a row's keys span the blocked kernel's 64-key blocks at other offsets: without
    the flag, 1 to 5 of these 93 f32 log-probabilities differed in their last bits in runs on the EPYC
    (how many depends on when each request joins), for both models."""
    prompts = [" ".join(f"word{i * 7 + j}" for j in range(20 + 9 * i)) for i in range(4)]
    if model == GEMMA:  # its tokenizer cuts each word in three: shorter prompts for rows of 64
        prompts = [p[:40] for p in prompts]
    bodies = [{"prompt": prompts[i % 4], "max_tokens": 8 + 3 * i, "temperature": 0, "logprobs": 5}
              for i in range(6)]

    def logprobs(s, body):
        lp = s.post("/v1/completions", body).json()["choices"][0]["logprobs"]
        return lp["token_logprobs"], lp["top_logprobs"]

    with Server(model, "--slots", 3, "--ctx", ctx, "--dtype", dtype, "--deterministic") as s:
        alone = [logprobs(s, b) for b in bodies]
        before = s.metrics()
        together = [None] * 6

        def client(i):  # one prefill per step: each joins the batch a step after the one before, in another row
            together[i] = logprobs(s, bodies[i])

        assert not run_parallel(client, 6)
        m = s.metrics()
        assert together == alone
        rows = m["hubrt_decode_rows_total"] - before["hubrt_decode_rows_total"]
        assert rows > 1.5 * (m["hubrt_decode_steps_total"] - before["hubrt_decode_steps_total"])  # shared steps
        if ctx == 64:
            assert m["hubrt_cache_shifts_total"] > 0
