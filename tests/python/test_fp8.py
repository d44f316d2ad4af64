"""The Hub's FP8 checkpoints, against transformers (torch 2.13 CPU) and
compressed-tensors 0.20.1: tiny random Llama and Qwen2 (with biases)
checkpoints whose projections are quantized here to float8_e4m3fn with
torch, stored as quant_method "fp8" (weight_scale_inv per 128 x 128 block,
or per tensor with weight_block_size null, static activation_scale) and as
"compressed-tensors" float-quantized (weight_scale per tensor, channel,
block, or group of 32). The references are the weights transformers
dequantizes them into (on a machine without a GPU it dequantizes FP8, and
compressed-tensors decompresses with run_compressed=False):
  - hubrt's dequantization (dequantize=True) gives the same weights bit
    for bit: the same logits as the dense checkpoint of transformers'
    weights;
  - weights kept in FP8 blocks (the default on the CPU) give logits within
    1e-5 of the range of transformers' on its dequantized weights (f32
    sums in another order), greedy generations token-identical, under
    every kernel ISA;
  - the FP8 linear itself against float64 numpy, for tails of rows, 1 to
    40 x rows, bias and bf16 activations;
  - Qwen3-MoE's per-expert FP8 weights, the xla_cpu device (dequantized at
    load) and two tensor-parallel ranks;
  - bad checkpoints refused naming the tensor or field.
Every parameter of rank <= 1 is perturbed (redraw)."""
import json
import subprocess

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import hubrt
from cpu_isa import isa  # noqa: F401
from gemma3_util import random_ids, redraw, rel_err
from moe_util import copy_with

TOL = 1e-5
BASE = dict(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
            bos_token_id=2, eos_token_id=1, pad_token_id=0)
ARCHS = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
CT_GROUP = {"targets": ["Linear"], "format": "float-quantized",
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                  "dynamic": True}}
# name: (format, weight block (rows, cols; 0 = the whole dim), quantization_config)
FORMATS = {
    "fp8-block": ("fp8", (128, 128), {"quant_method": "fp8", "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128]}),
    "fp8-tensor-static": ("fp8", (0, 0), {"quant_method": "fp8", "activation_scheme": "static",
                                          "weight_block_size": None}),
    "ct-channel": ("ct", (1, 0), {"strategy": "channel"}),
    "ct-tensor": ("ct", (0, 0), {"strategy": "tensor"}),
    "ct-block": ("ct", (128, 128), {"strategy": "block", "block_structure": [128, 128]}),
    "ct-group": ("ct", (1, 32), {"strategy": "group", "group_size": 32}),
}


def ct_config(weights):
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {**CT_GROUP, "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                                                  "dynamic": False, **weights}}}}


def quantize(w, block):
    """float8_e4m3fn codes of w [R, C] and their scales [ceil(R / b0),
    ceil(C / b1)]: each block's absolute max maps to 448 (a last partial
    block padded with zeros, as DeepSeek's quantizer pads)."""
    rows, cols = w.shape
    b0, b1 = block[0] or rows, block[1] or cols
    sr, sc = -(-rows // b0), -(-cols // b1)
    padded = torch.zeros(sr * b0, sc * b1)
    padded[:rows, :cols] = w.float()
    blk = padded.reshape(sr, b0, sc, b1)
    s = blk.abs().amax(dim=(1, 3)) / 448
    codes = (blk / s[:, None, :, None]).to(torch.float8_e4m3fn).reshape(sr * b0, sc * b1)
    return codes[:rows, :cols].contiguous(), s.float()


def fp8_tensors(fmt, block, static):
    def edit(t):
        for key in [k for k in t if t[k].ndim == 2 and k.endswith("proj.weight")]:
            t[key], s = quantize(t[key], block)
            stem = key[:-len("weight")]
            if fmt == "fp8":
                t[stem + "weight_scale_inv"] = s if block[0] else s.reshape(())
                if static:
                    t[stem + "activation_scale"] = torch.tensor(0.05)
            else:
                t[stem + "weight_scale"] = s.reshape(1) if not block[0] else s
    return edit


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    made = {}

    def get(arch, name=None):
        key = (arch, name)
        if key in made:
            return made[key]
        if name is None:
            torch.manual_seed(0)
            cls = ARCHS[arch]
            model_cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
            model = redraw(model_cls(cls(**BASE)).eval(), seed=3 if arch == "llama" else 4)
            model.save_pretrained(root / arch)
            made[key] = root / arch
            return made[key]
        fmt, block, cfg = FORMATS[name]
        qc = cfg if fmt == "fp8" else ct_config(cfg)
        made[key] = copy_with(get(arch), root / f"{arch}-{name}", config={"quantization_config": qc},
                              tensors=fp8_tensors(fmt, block, "static" in name))
        return made[key]

    return get


def dequantized(path):
    """transformers' dequantized weights of FP8 checkpoint `path`, as a dense
    checkpoint beside it."""
    fmt = json.loads((path / "config.json").read_text())["quantization_config"]["quant_method"]
    kw = {}
    if fmt == "compressed-tensors":
        kw["quantization_config"] = transformers.CompressedTensorsConfig(run_compressed=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert all(v.dtype == torch.float32 for v in sd.values())
    dense = path.parent / (path.name + "-dense")
    if not dense.exists():
        def replace(t):  # transformers' in-memory names (a MoE's experts stacked)
            t.clear()
            t.update({k: v.contiguous() for k, v in sd.items()})
        copy_with(path, dense, tensors=replace)
        cfg = json.loads((dense / "config.json").read_text())
        cfg.pop("quantization_config")
        (dense / "config.json").write_text(json.dumps(cfg))
    return dense


def hf(path):
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None
    return m


def hf_logits(path, ids):
    with torch.no_grad():
        return hf(path)(torch.tensor(ids)).logits.numpy()


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_dequantized_weights_are_transformers_bit_for_bit(ckpts, arch, name):
    q = ckpts(arch, name)
    dense = dequantized(q)
    ids = random_ids((2, 9), seed=1)
    got = hubrt.AutoModelForCausalLM.from_pretrained(q, dequantize=True)
    assert got.weight_types == ["f32"]
    np.testing.assert_array_equal(got(ids).logits, hubrt.AutoModelForCausalLM.from_pretrained(dense)(ids).logits)


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_kept_fp8_logits_match_transformers(ckpts, arch, name):
    q = ckpts(arch, name)
    ids = random_ids((2, 21), seed=2)
    m = hubrt.AutoModelForCausalLM.from_pretrained(q)
    assert m.weight_types == ["f32", "fp8"]
    assert rel_err(m(ids).logits, hf_logits(dequantized(q), ids)) <= TOL


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_generation_matches_transformers(ckpts, arch, isa):  # noqa: F811
    q = ckpts(arch, "fp8-block")
    ids = random_ids((2, 7), seed=3)
    want = hf(dequantized(q)).generate(torch.tensor(ids), max_new_tokens=24, do_sample=False).numpy()
    got = hubrt.AutoModelForCausalLM.from_pretrained(q).generate(ids, max_new_tokens=24, do_sample=False)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_logits_under_every_isa(ckpts, isa):  # noqa: F811
    q = ckpts("qwen2", "ct-group")
    ids = random_ids((1, 13), seed=4)
    assert rel_err(hubrt.AutoModelForCausalLM.from_pretrained(q)(ids).logits, hf_logits(dequantized(q), ids)) <= TOL


def test_bf16_model_keeps_fp8(ckpts):
    """A bf16 run keeps the FP8 blocks (activations bf16 in, f32 inside the
    linear): as close to the f32 reference as transformers in bf16 is."""
    q = ckpts("llama", "fp8-block")
    dense = dequantized(q)
    ids = random_ids((1, 17), seed=5)
    want = hf_logits(dense, ids)
    m = hubrt.AutoModelForCausalLM.from_pretrained(q, dtype="bfloat16")
    assert m.weight_types == ["bf16", "fp8"]
    with torch.no_grad():
        torch_bf16 = transformers.AutoModelForCausalLM.from_pretrained(dense, dtype=torch.bfloat16)(
            torch.tensor(ids)).logits.float().numpy()
    assert rel_err(m(ids).logits, want) <= 2 * max(rel_err(torch_bf16, want), 1e-3)


def fp8_blocks(codes, scales):
    """hubrt's FP8 blocks of codes [n, k] (uint8) with one scale per 32."""
    n, k = codes.shape
    raw = np.empty((n, k // 32, 36), np.uint8)
    raw[:, :, :4] = scales.astype(np.float32).reshape(n, k // 32, 1).view(np.uint8)
    raw[:, :, 4:] = codes.reshape(n, k // 32, 32)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 40])
def test_linear_against_float64(m, isa):  # noqa: F811
    rng = np.random.default_rng(m)
    n, k = 37, 96  # a partial tile of rows, and of 4 x 4 dot products
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    scales = rng.uniform(0.001, 2.0, (n, k // 32)).astype(np.float32)
    values = torch.from_numpy(codes).view(torch.float8_e4m3fn).double().numpy()
    w = values * np.repeat(scales, 32, axis=1).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    t = hubrt.from_blocks(fp8_blocks(codes, scales), "fp8", [n, k])
    got = hubrt.ops.linear(hubrt.from_numpy(x), t, hubrt.from_numpy(bias)).numpy()
    want = x.astype(np.float64) @ w.T + bias
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    got16 = hubrt.ops.linear(hubrt.from_numpy(x, "bf16"), t).numpy()
    x16 = hubrt.from_numpy(x, "bf16").numpy().astype(np.float64)
    assert np.abs(got16 - x16 @ w.T).max() <= 1e-2 * np.abs(want).max()


def edit(path, tmp_path, config=None, tensors=None):
    def apply(t):
        tensors(t)
    return copy_with(path, tmp_path / "bad", config=config, tensors=apply if tensors else None)


L0 = "model.layers.0.self_attn.q_proj."


@pytest.mark.parametrize("change,message", [
    (dict(tensors=lambda t: t.pop(L0 + "weight_scale_inv")),
     r"FP8 weight 'model.layers.0.self_attn.q_proj.weight' has no scale tensor "
     r"'model.layers.0.self_attn.q_proj.weight_scale_inv'"),
    (dict(tensors=lambda t: t.__setitem__(L0 + "weight_scale_inv", torch.ones(2, 1))),
     r"FP8 scale tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv' is \[2, 1\] f32, expected f32, bf16 or "
     r"f16 \[2, 2\]: blocks of 128 x 128 of the 256 x 256 weight"),
    (dict(tensors=lambda t: t.__setitem__(L0 + "weight_scale_inv", -torch.ones(2, 2))),
     r"FP8 scale tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv' holds -1 at element 0"),
    (dict(tensors=lambda t: t.__setitem__(L0 + "weight", torch.full((256, 256), float("nan")).to(
        torch.float8_e4m3fn))), r"FP8 weight 'model.layers.0.self_attn.q_proj.weight' holds a NaN code"),
    (dict(config={"quantization_config": {"quant_method": "bitsandbytes"}}),
     r"quant_method 'bitsandbytes' is not supported"),
    (dict(config={"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}),
     r"FP8 weight 'model.layers.0.self_attn.q_proj.weight' has no input_scale"),
    (dict(config={"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}),
     r"quantization_config.weight_block_size must be a list of two positive integers"),
    (dict(config={"quantization_config": {"quant_method": "fp8", "scale_fmt": "ue8m0"}}),
     r"scale_fmt other than \"float\""),
    (dict(config={"quantization_config": {"quant_method": "mxfp4"}}),
     r"quant_method 'mxfp4' is read for gpt-oss's experts only"),
    (dict(config={"quantization_config": None}),
     r"tensor 'model.layers.0.self_attn.q_proj.weight' is f8_e4m3, not a floating dtype \(FP8 weights need an fp8 "
     r"or compressed-tensors quantization_config\)"),
])
def test_bad_fp8_checkpoint_named(ckpts, tmp_path, change, message):
    bad = edit(ckpts("llama", "fp8-block"), tmp_path, **change)
    with pytest.raises(hubrt.HubrtError, match=message):
        hubrt.AutoModelForCausalLM.from_pretrained(bad)


@pytest.mark.parametrize("qc,message", [
    ({"format": "pack-quantized"}, r"compressed-tensors format 'pack-quantized' is not supported"),
    ({"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, r"quantization_config.kv_cache_scheme is not supported"),
    ({"config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}},
     r"compressed-tensors weights other than symmetric 8-bit float"),
    ({"config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                              "output_activations": {"num_bits": 8, "type": "float"}}}},
     r"output_activations are not supported"),
])
def test_bad_compressed_tensors_config_named(ckpts, tmp_path, qc, message):
    src = ckpts("llama", "ct-channel")
    cfg = json.loads((src / "config.json").read_text())["quantization_config"]
    bad = edit(src, tmp_path, config={"quantization_config": {**cfg, **qc}})
    with pytest.raises(hubrt.HubrtError, match=message):
        hubrt.AutoModelForCausalLM.from_pretrained(bad)


def test_cli_runs_fp8_and_refuses_with_exit_2(ckpts, tmp_path):
    from hubrt_cli_util import CLI
    ok = subprocess.run([CLI, "bench", str(ckpts("llama", "ct-channel"))], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0 and json.loads(ok.stdout.splitlines()[-1])["weights"] == "f32,fp8"
    bad = edit(ckpts("llama", "ct-channel"), tmp_path, tensors=lambda t: t.__setitem__(
        L0 + "weight_scale", torch.ones(3, 1)))
    r = subprocess.run([CLI, "bench", str(bad)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "FP8 scale tensor 'model.layers.0.self_attn.q_proj.weight_scale' is [3, 1] f32" in r.stderr


def test_safetensors_reads_f8_e4m3_codes(ckpts):
    """hubrt.load_safetensors reads an F8_E4M3 tensor's codes as values (no
    scale), as safetensors' torch loader gives them."""
    q = ckpts("llama", "fp8-block")
    want = load_file(q / "model.safetensors")[L0 + "weight"].float().numpy()
    got = hubrt.load_safetensors(q / "model.safetensors")[L0 + "weight"].numpy()
    np.testing.assert_array_equal(got, want)


def test_qwen3_moe_fp8_experts(tmp_path):
    """A Qwen3-MoE FP8 checkpoint (as the Hub's Qwen3-30B-A3B-FP8: every
    projection, each expert's too, in 128 x 128 blocks; the router bf16):
    attention kept in FP8 blocks, the experts dequantized at load into the
    stacked experts op's weights; dequantized, the same logits as the dense
    checkpoint of transformers' weights bit for bit."""
    cfg = transformers.Qwen3MoeConfig(vocab_size=300, hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                                      tie_word_embeddings=False, max_position_embeddings=128, bos_token_id=2,
                                      eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    redraw(transformers.Qwen3MoeForCausalLM(cfg).eval(), seed=6).save_pretrained(tmp_path / "base")
    q = copy_with(tmp_path / "base", tmp_path / "fp8", config={"quantization_config": FORMATS["fp8-block"][2]},
                  tensors=fp8_tensors("fp8", (128, 128), False))
    assert any(".experts.3.down_proj.weight_scale_inv" in k for k in load_file(q / "model.safetensors"))
    dense = dequantized(q)
    ids = random_ids((2, 11), seed=7)
    m = hubrt.AutoModelForCausalLM.from_pretrained(q)
    assert m.weight_types == ["f32", "fp8"]
    assert rel_err(m(ids).logits, hf_logits(dense, ids)) <= TOL
    np.testing.assert_array_equal(hubrt.AutoModelForCausalLM.from_pretrained(q, dequantize=True)(ids).logits,
                                  hubrt.AutoModelForCausalLM.from_pretrained(dense)(ids).logits)


def test_xla_cpu_runs_fp8_dequantized(ckpts):
    """On the xla_cpu PJRT device the FP8 weights are dequantized at load:
    the same weights as hubrt's dequantized CPU run, logits within TOL of
    it and of transformers."""
    from gemma3_util import need_xla
    need_xla()
    q = ckpts("qwen2", "fp8-block")
    ids = random_ids((2, 13), seed=8)
    got = hubrt.AutoModelForCausalLM.from_pretrained(q, device_map="xla_cpu")
    assert got.weight_types == ["f32"]
    logits = got(ids).logits
    assert rel_err(logits, hubrt.AutoModelForCausalLM.from_pretrained(q, dequantize=True)(ids).logits) <= TOL
    assert rel_err(logits, hf_logits(dequantized(q), ids)) <= TOL


@pytest.mark.parametrize("name", ["fp8-block", "ct-group"])
def test_tp2_fp8_matches_one_process(ckpts, name, tmp_path):
    """Two tensor-parallel ranks (hubrt launch -n 2) each read their rows or
    columns of the FP8 codes, with each element's scale by its place in the
    whole weight, into FP8 blocks: logits within 1e-5 of one process,
    greedy generations identical."""
    from test_tp import check
    check(ckpts("qwen2", name), 2, tmp_path)
