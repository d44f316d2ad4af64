"""safetensors through hubrt against the `safetensors` package: files it
writes (torch, numpy, transformers' sharded save_pretrained) load
bit-identically and zero-copy; files hubrt writes load in it (byte-identical
to its own output); malformed files fail with clear messages, from Python
and from `hubrt inspect`."""
import gc
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file, save, save_file

import hubrt
from oracle import TORCH_DTYPE, to_torch

DTYPES = list(TORCH_DTYPE)  # every hubrt dtype


def cli():
    lib = os.environ.get("HUBRT_LIBRARY")
    root = Path(lib).parent if lib else Path(__file__).resolve().parents[2] / "build"
    return str(root / "hubrt")


def bits(t):
    """Raw bytes of a torch tensor, so NaN payloads and bf16 compare exactly."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    td = TORCH_DTYPE[dtype]
    if td == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if td.is_floating_point:
        t = (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(td)
        flat = t.reshape(-1)
        if flat.numel() >= 3:  # specials survive the trip bit for bit
            flat[0], flat[1], flat[2] = float("nan"), float("inf"), -0.0
        return t
    info = torch.iinfo(td)
    return torch.randint(max(info.min, -2**40), min(info.max, 2**40), shape, generator=g, dtype=td)


def reference_tensors():
    out = {}
    for i, dt in enumerate(DTYPES):
        out[f"w.{dt}"] = sample(dt, (3, 17), i)
    out["odd"] = sample("bf16", (1, 4097), 50)
    out["scalar"] = sample("f32", (), 51)
    out["empty"] = sample("f16", (0, 5), 52)
    out["model.layers.0.self_attn.q_proj.weight"] = sample("bf16", (8, 4), 53)
    return out


def assert_loaded_equal(loaded, ref):
    assert list(loaded) == sorted(ref)
    for name, want in ref.items():
        got = torch.from_dlpack(loaded[name])
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(bits(got), bits(want)), name
        assert loaded[name].name == name


def test_torch_file_loads_bit_identically(tmp_path):
    ref = reference_tensors()
    path = tmp_path / "ref.safetensors"
    save_file(ref, str(path), metadata={"format": "pt", "note": "x"})
    loaded = hubrt.load_safetensors(path)
    assert_loaded_equal(loaded, ref)
    assert hubrt.safetensors_metadata(path) == {"format": "pt", "note": "x"}
    # the copy path (numpy) agrees with the zero-copy path
    assert torch.equal(bits(to_torch(loaded["w.bf16"])), bits(ref["w.bf16"]))


def test_numpy_file_loads_bit_identically(tmp_path):
    ref = {f"a.{dt}": sample(dt, (5, 3), i).numpy() for i, dt in enumerate(DTYPES) if dt != "bf16"}
    path = tmp_path / "np.safetensors"
    np_save_file(ref, str(path))
    loaded = hubrt.load_safetensors(path)
    for name, want in ref.items():
        got = loaded[name].numpy()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_tensors_are_zero_copy_views_of_the_file(tmp_path):
    ref = {"a": torch.arange(64, dtype=torch.float32), "b": torch.arange(32, dtype=torch.float32)}
    path = tmp_path / "zc.safetensors"
    save_file(ref, str(path))
    loaded = hubrt.load_safetensors(path)
    raw = path.read_bytes()
    offsets = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    pa = torch.from_dlpack(loaded["a"]).data_ptr()
    pb = torch.from_dlpack(loaded["b"]).data_ptr()
    # both point into one map, as far apart as their offsets in the file
    assert pb - pa == offsets["b"]["data_offsets"][0] - offsets["a"]["data_offsets"][0]
    # writing to a loaded tensor changes the process's copy, never the file
    torch.from_dlpack(loaded["a"])[0] = 99.0
    assert load_file(str(path))["a"][0] == 0.0
    assert hubrt.load_safetensors(path)["a"].numpy()[0] == 0.0


def test_tensors_outlive_the_checkpoint(tmp_path):
    path = tmp_path / "t.safetensors"
    ref = {"w": sample("f32", (7, 9), 3)}
    save_file(ref, str(path))
    t = hubrt.load_safetensors(path)["w"].transpose(0, 1)
    gc.collect()
    assert torch.equal(bits(to_torch(t)), bits(ref["w"].t()))


def test_sharded_save_pretrained(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    ref = {}
    for s in shards:
        ref.update(load_file(str(tmp_path / s)))
    loaded = hubrt.load_safetensors(tmp_path)
    assert_loaded_equal(loaded, ref)
    assert set(loaded) == set(model.state_dict())

    out = subprocess.run([cli(), "inspect", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:len(ref)] == [
        f"{n} BF16 [{', '.join(map(str, ref[n].shape))}]" for n in sorted(ref)]
    total = sum(t.numel() * 2 for t in ref.values())
    assert f"{len(ref)} tensors, {total} bytes" in out.stdout
    assert f"{len(shards)} shards" in out.stdout

    # a shard gone, or a tensor moved out of its shard: named in the error
    (tmp_path / shards[-1]).rename(tmp_path / "gone")
    with pytest.raises(hubrt.HubrtError, match=f"shard '{shards[-1]}'"):
        hubrt.load_safetensors(tmp_path)
    (tmp_path / "gone").rename(tmp_path / shards[-1])
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index["weight_map"][name] = shards[-1]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(hubrt.HubrtError,
                       match=f"tensor '{name}' is missing from its shard '{shards[-1]}'"):
        hubrt.load_safetensors(tmp_path)


def test_our_files_load_in_safetensors(tmp_path):
    ref = reference_tensors()
    ours = {k: hubrt.from_dlpack(v) for k, v in ref.items()}
    # strided hubrt views and plain torch tensors are written in logical order
    ours["view"] = hubrt.from_dlpack(ref["w.f32"]).transpose(0, 1)
    ours["torch"] = ref["w.i64"][:, ::2]
    path = tmp_path / "ours.safetensors"
    hubrt.save_safetensors(ours, path, metadata={"format": "pt", "k": "v\n\u00e9"})
    back = load_file(str(path))
    assert set(back) == set(ours)
    for name, want in ref.items():
        assert torch.equal(bits(back[name]), bits(want)), name
    assert torch.equal(bits(back["view"]), bits(ref["w.f32"].t()))
    assert torch.equal(back["torch"], ref["w.i64"][:, ::2])
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt", "k": "v\n\u00e9"}


def test_our_bytes_match_the_reference_writer(tmp_path):
    ref = reference_tensors()
    ref["esc\"aped\n\u00e9"] = sample("u8", (2,), 9)
    path = tmp_path / "ours.safetensors"
    hubrt.save_safetensors(ref, path, metadata={"format": "pt"})
    assert path.read_bytes() == save(ref, metadata={"format": "pt"})


def test_save_is_atomic(tmp_path):
    path = tmp_path / "a.safetensors"
    hubrt.save_safetensors({"a": torch.ones(3)}, path)
    before = path.read_bytes()
    with pytest.raises(hubrt.HubrtError, match="'__metadata__' cannot name a tensor"):
        hubrt.save_safetensors({"__metadata__": torch.ones(2)}, path)
    with pytest.raises(hubrt.HubrtError, match="cannot create temporary file"):
        hubrt.save_safetensors({"a": torch.ones(3)}, tmp_path / "missing" / "a.safetensors")
    with pytest.raises(TypeError, match="metadata must map str to str"):
        hubrt.save_safetensors({"a": torch.ones(3)}, path, metadata={"n": 1})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors"]


# ---- malformed files ------------------------------------------------------

def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def image(header, data=b"", length=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


MALFORMED = {
    "truncated": (b"\x10\x00\x00", "too short for a safetensors file"),
    "header_length_huge": (image({}, length=2**62), "header length 4611686018427387904 exceeds"),
    "header_not_json": (image(b"{\"a\": nope}"), "header is not valid JSON"),
    "header_not_object": (image(b"[1, 2, 3]"), "does not start with '{'"),
    "overlapping_offsets": (image({"a": entry(), "b": entry(offsets=(4, 12))}, bytes(12)),
                            "tensors 'a' [0, 8] and 'b' [4, 12] overlap"),
    "wrong_dtype_size": (image({"w": entry("BF16", (3,), (0, 8))}, bytes(8)),
                         "tensor 'w': shape [3] of BF16 needs 6 bytes but data_offsets [0, 8] hold 8"),
    "offsets_outside": (image({"w": entry("U8", (64,), (0, 64))}, bytes(16)),
                        "tensor 'w': data_offsets [0, 64] outside the data section of 16 bytes"),
    "unknown_dtype": (image({"w": entry("F8_E5M2", (4,), (0, 4))}, bytes(4)),
                      "tensor 'w': unsupported dtype 'F8_E5M2'"),
    "non_utf8_name": (image(b'{"bad\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
                      'tensor name #0 "bad\\xff" is not valid UTF-8'),
    "negative_shape": (image({"w": entry("U8", (-4,), (0, 4))}, bytes(4)),
                       "tensor 'w': shape[0] must be an integer in 0..2^53"),
    "rank_9": (image({"w": entry("U8", (1,) * 9, (0, 1))}, bytes(1)),
               "tensor 'w': rank 9 exceeds hubrt's maximum 8"),
    "metadata_not_strings": (image({"__metadata__": {"n": 3}}), "value of 'n' must be a string"),
    "missing_offsets": (image({"w": {"dtype": "U8", "shape": [1]}}, bytes(1)),
                        "tensor 'w': missing field 'data_offsets'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_fail_clearly(tmp_path, case):
    raw, want = MALFORMED[case]
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(raw)
    with pytest.raises(hubrt.HubrtError) as err:
        hubrt.load_safetensors(path)
    msg = str(err.value)
    assert want in msg and str(path) in msg, msg
    out = subprocess.run([cli(), "inspect", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert want in out.stderr and out.stdout == ""


def test_empty_index(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    assert hubrt.load_safetensors(tmp_path) == {}
    assert hubrt.safetensors_metadata(tmp_path) == {}


def test_missing_inputs_fail_clearly(tmp_path):
    with pytest.raises(hubrt.HubrtError, match="no model.safetensors or model.safetensors.index.json"):
        hubrt.load_safetensors(tmp_path)
    with pytest.raises(hubrt.HubrtError, match="nothere.safetensors"):
        hubrt.load_safetensors(tmp_path / "nothere.safetensors")
    out = subprocess.run([cli(), "inspect"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage: hubrt inspect PATH" in out.stderr
