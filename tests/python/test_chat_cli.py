"""hubrt chat against transformers: each turn is the model's chat template
rendered over the conversation so far (apply_chat_template with
add_generation_prompt), greedy-generated and decoded without special
tokens, and the answer joins the history; /reset and /system start over."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM as HFModel
from transformers import AutoTokenizer

from hubrt_cli_util import make_tiny_fixtures, run_with_peak


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    make_tiny_fixtures()


ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures" / "tiny-qwen3-tok"
N = 10


def reference(turns, system=None, model=MODEL, **template_kw):
    tok = AutoTokenizer.from_pretrained(model)
    hf = HFModel.from_pretrained(model, dtype=torch.float32).eval()
    start = [{"role": "system", "content": system}] if system else []
    messages, replies = list(start), []
    for t in turns:
        if t == "/reset":
            messages = list(start)
            continue
        if t.startswith("/system "):
            start = [{"role": "system", "content": t[8:]}]
            messages = list(start)
            continue
        messages.append({"role": "user", "content": t})
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kw)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        out = hf.generate(ids, max_new_tokens=N, do_sample=False)
        reply = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply})
    return "".join(r + "\n" for r in replies)


@pytest.mark.parametrize("turns,system,think", [
    (["Hello there", "And then?", "/reset", "What is 2+2?"], None, False),
    (["Bonjour, ça va ?", "/system Answer in French.", "Pourquoi {ceci} ?"], "Be brief.", True),
])
def test_chat_turns_match_transformers(turns, system, think):
    args = ["chat", str(MODEL), "--greedy", "-n", str(N)] + ([] if think else ["--no-think"])
    if system:
        args += ["--system", system]
    rc, out, err, _ = run_with_peak(args, "\n".join(turns) + "\n")
    assert rc == 0, err
    kw = {} if think else {"enable_thinking": False}
    assert out == reference(turns, system=system, **kw)


def test_chat_without_a_template_is_refused(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(MODEL, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not (d / "chat_template.jinja").exists()
    rc, out, err, _ = run_with_peak(["chat", str(d)], "hi\n")
    assert rc == 2 and "has no chat template" in err, err


def test_chat_template_jinja_file_wins(tmp_path):
    """transformers 5 saves the template as chat_template.jinja, which wins over tokenizer_config.json's."""
    d = tmp_path / "m"
    shutil.copytree(MODEL, d)
    (d / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] | upper }}: {{ m['content'] | trim }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>ASSISTANT:{% endif %}")
    want = reference(["Hello there", "Again"], model=d)
    rc, out, err, _ = run_with_peak(["chat", str(d), "--greedy", "-n", str(N)], "Hello there\nAgain\n")
    assert rc == 0, err
    assert out == want
    import hubrt
    tok = hubrt.AutoTokenizer.from_pretrained(d)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                   add_generation_prompt=True) == "<|im_start|>USER: x<|im_end|>\n<|im_start|>ASSISTANT:"
