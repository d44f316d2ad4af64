"""Weight files and model folders written to be hostile: GGUF files that
claim 2^40 tensors, metadata arrays or strings; safetensors headers that
claim a 2^62-byte tensor or dimensions whose product overflows 64 bits;
overlapping tensors; and paths that leave the model folder (through the
index's weight_map or symlinks). Each is refused by the CLI with exit 2, a
message naming the file and the tensor or field, and a small peak RSS; the
reference reader (safetensors) refuses its cases too (gguf's Python
reader is left out: it spins on a 2^40-element array). A Hugging Face
cache snapshot, whose files link into the cache's blobs/, still loads."""
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from hubrt_cli_util import make_tiny_fixtures, run_with_peak, with_env


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    make_tiny_fixtures()


ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
BIG = 1 << 40


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(n_tensors=0, n_kv=0, body=b"", tail=bytes(64)):
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body + tail


def gtensor(name, dims, typ=0, offset=0):
    return gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", typ,
                                                                                                           offset)


GGUF_CASES = {
    "tensor_count_2e40": (gguf(n_tensors=BIG), "1099511627776 tensors"),
    "metadata_count_2e40": (gguf(n_kv=BIG), "1099511627776 metadata keys"),
    "array_2e40_u8": (gguf(n_kv=1, body=gstr("general.x") + struct.pack("<IIQ", 9, 0, BIG)),
                      "key 'general.x': 1099511627776 elements"),
    "array_2e40_strings": (gguf(n_kv=1, body=gstr("general.x") + struct.pack("<IIQ", 9, 8, BIG)),
                           "key 'general.x': 1099511627776 strings"),
    "string_2e40": (gguf(n_kv=1, body=gstr("general.name") + struct.pack("<IQ", 8, BIG) + b"abc"),
                    "general.name (length 1099511627776)"),
    "key_2e40": (gguf(n_kv=1, body=struct.pack("<Q", BIG) + b"abc"), "length 1099511627776"),
    "dims_overflow": (gguf(n_tensors=1, body=gtensor("w", [1 << 20] * 4)), "tensor 'w': dim"),
    "tensor_2e40_elements": (gguf(n_tensors=1, body=gtensor("w", [BIG])), "tensor 'w'"),
    "overlapping": (gguf(n_tensors=2, body=gtensor("a", [8]) + gtensor("b", [8]), tail=bytes(128)),
                    "tensors 'a' and 'b' overlap"),
}


def st_file(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


ST_CASES = {
    "tensor_2e62_bytes": (st_file({"w": {"dtype": "F32", "shape": [1 << 50, 1 << 10], "data_offsets": [0, 16]}},
                                  bytes(16)), "tensor 'w'"),
    "offsets_2e62": (st_file({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 62]}}, bytes(16)),
                     "tensor 'w'"),
    "dims_overflow_u64": (st_file({"w": {"dtype": "F32", "shape": [1 << 32] * 3, "data_offsets": [0, 16]}},
                                  bytes(16)), "more than 2^64 bytes"),
    "overlapping": (st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(16)),
                    "tensors 'a' [0, 8] and 'b' [4, 12] overlap"),
    "header_2e62": (struct.pack("<Q", 1 << 62) + b"{}", "header length 4611686018427387904"),
}


def refused(args, words, peak_mb=64):
    """`hubrt ARGS` exits 2 naming `words`, under `peak_mb` (a `run` loads Qwen3's real tokenizer: ~100 MB)."""
    rc, out, err, peak = run_with_peak(args)
    assert rc == 2, (rc, err)
    for w in words:
        assert w in err, err
    assert peak < peak_mb * 1024, f"peak RSS {peak} kB"


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_hostile_gguf(tmp_path, case):
    data, words = GGUF_CASES[case]
    f = tmp_path / f"{case}.gguf"
    f.write_bytes(data)
    refused(["inspect", str(f)], [str(f), words])


@pytest.mark.parametrize("case", sorted(ST_CASES))
def test_hostile_safetensors(tmp_path, case):
    data, words = ST_CASES[case]
    f = tmp_path / f"{case}.safetensors"
    f.write_bytes(data)
    refused(["inspect", str(f)], [str(f), words])
    st = pytest.importorskip("safetensors")
    with pytest.raises(Exception):
        with st.safe_open(str(f), "np") as h:
            for k in h.keys():
                h.get_tensor(k)


def sharded_model(tmp_path, shard_name):
    """tiny-llama as an index whose weight_map names `shard_name` for every tensor."""
    d = tmp_path / "m"
    d.mkdir()
    for f in ("config.json", "generation_config.json"):
        shutil.copy(FIX / "tiny-llama" / f, d / f)
    names = _tensor_names()
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        n: shard_name for n in names}}))
    return d


def _tensor_names():
    from safetensors import safe_open
    with safe_open(str(FIX / "tiny-llama" / "model.safetensors"), "np") as h:
        return list(h.keys())


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors"])
def test_weight_map_cannot_leave_the_folder(tmp_path, shard):
    shutil.copy(FIX / "tiny-llama" / "model.safetensors", tmp_path / "outside.safetensors")
    d = sharded_model(tmp_path, shard)
    refused(["inspect", str(d)], ["weight_map", shard, "inside the model folder"])


def test_weight_map_symlink_out_is_refused(tmp_path):
    shutil.copy(FIX / "tiny-llama" / "model.safetensors", tmp_path / "outside.safetensors")
    d = sharded_model(tmp_path, "model-00001.safetensors")
    (d / "model-00001.safetensors").symlink_to(tmp_path / "outside.safetensors")
    refused(["inspect", str(d)], ["model-00001.safetensors", "outside the model folder"])


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"])
def test_symlink_out_of_the_folder_is_refused(tmp_path, name):
    src = FIX / "tiny-qwen3-tok"
    d = tmp_path / "m"
    shutil.copytree(src, d)
    outside = tmp_path / ("outside_" + name)
    shutil.move(d / name, outside)
    (d / name).symlink_to(outside)
    refused(["run", str(d), "-p", "hi", "-n", "1"], [name, "outside the model folder"], peak_mb=300)
    # /dev/zero behind a model file's name: refused by the same rule, never read
    (d / name).unlink()
    (d / name).symlink_to("/dev/zero")
    refused(["run", str(d), "-p", "hi", "-n", "1"], [name, "outside the model folder"], peak_mb=300)


def test_links_made_on_purpose_load_when_allowed(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(FIX / "tiny-qwen3-tok", d)
    outside = tmp_path / "shared_tokenizer.json"
    shutil.move(d / "tokenizer.json", outside)
    (d / "tokenizer.json").symlink_to(outside)
    args = ["run", str(d), "-p", "hi", "-n", "2", "--greedy"]
    rc, out, err, _ = with_env({"HUBRT_ALLOW_OUTSIDE_LINKS": "1"}, lambda: run_with_peak(args))
    assert rc == 0, err
    assert out == run_with_peak(["run", str(FIX / "tiny-qwen3-tok"), "-p", "hi", "-n", "2", "--greedy"])[1]


def test_hugging_face_cache_snapshot_loads(tmp_path):
    """A snapshot as huggingface_hub lays it out: every file a relative link into ../../blobs."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap, blobs = repo / "snapshots" / ("a" * 40), repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted((FIX / "tiny-qwen3-tok").iterdir())):
        shutil.copy(f, blobs / f"{i:064x}")
        (snap / f.name).symlink_to(Path("../../blobs") / f"{i:064x}")
    rc, out, err, _ = run_with_peak(["run", str(snap), "-p", "hi", "-n", "2", "--greedy"])
    assert rc == 0, err
    rc2, out2, _, _ = run_with_peak(["run", str(FIX / "tiny-qwen3-tok"), "-p", "hi", "-n", "2", "--greedy"])
    assert out == out2
