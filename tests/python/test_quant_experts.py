"""experts with block-quantized weights kept in their blocks (a GGUF file's
*_exps tensors on the CPU): each expert's matrix goes through the
quantized linear (x quantized to int8 per 32, as llama.cpp's q8 blocks),
which tests/python/test_quant_linear.py holds to the `gguf` package's
dequantizer. Here:
  - the op equals the composition of hubrt.ops.linear on each expert's
    quantized matrix (the same rows, the same kernel), hubrt.ops.silu_mul
    and the routing weights summed in ascending expert order, and stays
    within the int8 activation rounding of the f32 experts op on the
    dequantized weights; under every kernel ISA; q8_0, q4_k and q4_0;
  - a Qwen3-MoE GGUF file written by llama.cpp's converter with --outtype
    q8_0 runs with its experts in q8_0, its logits within the int8
    rounding of the dequantized run's;
  - a hub kernel (which takes float weights) refuses blocks naming them."""
import numpy as np
import pytest
import torch

import hubrt
from cpu_isa import isa  # noqa: F401 (fixture)
from gemma3_util import random_ids, rel_err

H, I, E, T, K = 256, 256, 6, 9, 2  # k-quant rows need 256 columns


def case(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, H)).astype(np.float32)
    gu = (rng.standard_normal((E, 2 * I, H)) / 16).astype(np.float32)
    dn = (rng.standard_normal((E, H, I)) / 16).astype(np.float32)
    probs = torch.softmax(torch.from_numpy(rng.standard_normal((T, E)).astype(np.float32)), -1)
    w, idx = torch.topk(probs, K, -1)
    idx[0] = torch.tensor([E - 1, 0])  # the first token to the last expert first
    return x, (w / w.sum(-1, keepdim=True)).numpy(), idx.numpy().astype(np.int64), gu, dn


def dequantized(t):
    """A block tensor's values as float32, through the embedding kernel (which
    dequantizes a looked-up row)."""
    shape = list(t.shape)
    flat = t.view(-1, shape[-1])
    rows = hubrt.ops.embedding(flat, hubrt.from_numpy(np.arange(flat.shape[0], dtype=np.int64))).numpy()
    return rows.reshape(shape)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k", "q4_0"])
def test_experts_equal_quantized_linears(qtype, isa):  # noqa: F811
    x, w, idx, gu, dn = case(1)
    gq, dq = hubrt.from_numpy(gu).quantize(qtype), hubrt.from_numpy(dn).quantize(qtype)
    assert gq.dtype == qtype
    got = hubrt.ops.experts(hubrt.from_numpy(x), hubrt.from_numpy(w), hubrt.from_numpy(idx), gq, dq).numpy()
    want = np.zeros_like(x)
    outs = {}
    for e in range(E):
        rows = [t for t in range(T) if e in idx[t]]
        if not rows:
            continue
        g = hubrt.ops.linear(hubrt.from_numpy(x[rows]), gq.select(0, e)).numpy()
        # the op's own SiLU (one ulp off would turn an int8 rounding of the activations)
        a = hubrt.ops.silu_mul(hubrt.from_numpy(np.ascontiguousarray(g[:, :I])),
                               hubrt.from_numpy(np.ascontiguousarray(g[:, I:])))
        d = hubrt.ops.linear(a, dq.select(0, e)).numpy()
        for r, t in enumerate(rows):
            outs[(t, e)] = d[r]
    for t in range(T):
        for e in sorted(idx[t]):
            want[t] += w[t][list(idx[t]).index(e)] * outs[(t, e)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # the f32 experts op on the dequantized weights: off by the int8 rounding of x and of the activations
    ref = hubrt.ops.experts(hubrt.from_numpy(x), hubrt.from_numpy(w), hubrt.from_numpy(idx),
                            hubrt.from_numpy(dequantized(gq)), hubrt.from_numpy(dequantized(dq))).numpy()
    assert rel_err(got, ref) <= 2e-2


def test_hub_kernel_refuses_blocks():
    x, w, idx, gu, dn = case(2)
    with pytest.raises(hubrt.HubrtError, match=r"experts'?: input 3 \(gate_up\) is block-quantized \(q8_0\); a hub "
                                               r"kernel takes float weights"):
        hubrt.ops.call("experts", hubrt.from_numpy(x), hubrt.from_numpy(w), hubrt.from_numpy(idx),
                       hubrt.from_numpy(gu).quantize("q8_0"), hubrt.from_numpy(dn).quantize("q8_0"), impl=1)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_gguf_q8_0_experts_kept_in_blocks(tmp_path):
    from transformers import Qwen3MoeConfig

    from moe_util import converted_qwen3_moe
    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=64, intermediate_size=96, moe_intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False,
                         max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645)
    _, gguf = converted_qwen3_moe(tmp_path, cfg, 12, "q8_0")
    import gguf as gguf_py
    types = {t.name: t.tensor_type.name for t in gguf_py.GGUFReader(str(gguf)).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ffn_down_exps.weight"] == "Q8_0"
    ids = random_ids((2, 17), seed=3, vocab=100000)
    kept = hubrt.AutoModelForCausalLM.from_pretrained(gguf, dtype="float32")
    assert "q8_0" in kept.weight_types
    dq = hubrt.AutoModelForCausalLM.from_pretrained(gguf, dtype="float32", dequantize=True)
    assert dq.weight_types == ["f32"]
    a, b = kept(ids).logits, dq(ids).logits
    assert not np.array_equal(a, b)  # the blocks were read, with int8 activations
    assert rel_err(a, b) <= 2e-2
