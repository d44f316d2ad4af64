"""Every ggml block type hubrt reads, dequantized from random blocks (any
bit pattern, finite f16 scales) against the `gguf` package's numpy
dequantizer: a GGUF written with gguf.GGUFWriter, loaded through hubrt's
checkpoint reader under the HF names."""
import numpy as np
import pytest

import hubrt

# type -> byte offsets of the block's f16 scale fields
SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
          "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
          "IQ4_NL": [0], "IQ4_XS": [0], "MXFP4": []}
# type -> byte offsets of an e8m0 exponent byte (kept near 2^0: any byte is
# a scale, but 2^127 times the codes overflows float32)
EXPONENTS = {"MXFP4": [0]}


def random_blocks(qtype, rows, cols, rng):
    import gguf
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    for off in SCALES[qtype.name]:
        scale = rng.uniform(-0.05, 0.05, (rows, cols // block)).astype(np.float16)
        data[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
    for off in EXPONENTS.get(qtype.name, []):
        data[:, :, off] = rng.integers(110, 136, (rows, cols // block))
    return data.reshape(rows, -1)


@pytest.mark.parametrize("name", list(SCALES))
def test_dequantize_matches_gguf(tmp_path, name):
    import gguf
    from gguf.quants import dequantize
    qtype = gguf.GGMLQuantizationType[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    rows, cols = 6, 512
    path = tmp_path / f"{name}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    blocks = {}
    for hf, gg in (("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
                   ("model.layers.1.mlp.up_proj.weight", "blk.1.ffn_up.weight")):
        blocks[hf] = random_blocks(qtype, rows, cols, rng)
        w.add_tensor(gg, blocks[hf], raw_dtype=qtype)  # the byte shape: gguf makes it (rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = hubrt.load_safetensors(path)
    assert sorted(ours) == sorted(blocks)
    for hf, data in blocks.items():
        want = dequantize(data, qtype).astype(np.float32).reshape(rows, cols)
        got = ours[hf].numpy()
        assert got.dtype == np.float32 and got.shape == (rows, cols)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=f"{name} {hf}")
