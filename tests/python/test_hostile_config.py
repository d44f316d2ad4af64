"""config.json files written to be hostile: sizes that would make the
loader allocate gigabytes, and sizes that disagree with the checkpoint.
`hubrt run` must refuse each with exit 2 and a message naming the config
field (and the tensor where the checkpoint disagrees), without allocating
by the claimed number (peak RSS bounded)."""
import json
import shutil
from pathlib import Path

import pytest

from hubrt_cli_util import make_tiny_fixtures, run_with_peak


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    make_tiny_fixtures()


ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
MODEL = "tiny-qwen3-tok"  # its tokenizer is a real one (Qwen3's): the RSS floor is about 100 MB

CASES = [
    # (field, value, words the message must hold)
    ("num_hidden_layers", 1073741824, ["num_hidden_layers", "1073741824"]),
    ("num_hidden_layers", 3000, ["num_hidden_layers is 3000", "holds 2 layers", "model.layers.2."]),
    ("num_hidden_layers", -1, ["num_hidden_layers"]),
    ("intermediate_size", -5, ["intermediate_size"]),
    ("intermediate_size", 100000, ["intermediate_size (100000)", "model.layers.0.mlp.gate_proj.weight"]),
    ("intermediate_size", 2 ** 40, ["intermediate_size"]),
    ("hidden_size", 2 ** 30, ["hidden_size (1073741824)", "model.embed_tokens.weight"]),
    ("vocab_size", 2 ** 30, ["vocab_size (1073741824)", "model.embed_tokens.weight"]),
    ("num_attention_heads", 60000, ["num_attention_heads", "q_proj.weight"]),
    ("num_key_value_heads", 3, ["num_key_value_heads"]),
    ("head_dim", 1 << 20, ["head_dim"]),
    ("head_dim", 48, ["head_dim", "q_proj.weight"]),
    ("max_position_embeddings", -7, ["max_position_embeddings"]),
    ("rope_theta", "fast", ["rope_theta"]),
    ("architectures", ["GPTNeoXForCausalLM"], ["GPTNeoXForCausalLM", "not supported"]),
]


@pytest.mark.parametrize("field,value,words", CASES, ids=[f"{c[0]}={c[1]}" for c in CASES])
def test_config_refused_naming_the_field(tmp_path, field, value, words):
    d = tmp_path / "m"
    shutil.copytree(FIX / MODEL, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg[field] = value
    (d / "config.json").write_text(json.dumps(cfg))
    rc, out, err, peak = run_with_peak(["run", str(d), "-p", "hi", "-n", "2"])
    assert rc == 2, (rc, err)
    for w in words:
        assert w in err, err
    assert str(d) in err, err  # the folder is named too
    assert peak < 300 * 1024, f"peak RSS {peak} kB"


def test_untouched_fixture_runs(tmp_path):
    rc, out, err, _ = run_with_peak(["run", str(FIX / MODEL), "-p", "hi", "-n", "2", "--greedy"])
    assert rc == 0, err
