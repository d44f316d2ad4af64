"""A large random-weight MoE checkpoint for the bench, written layer by layer:
one safetensors shard per layer, drawn in bf16 and never held whole, so a
15 GB model is made with about one layer (1.2-1.6 GB) in memory. Shapes:
Qwen3-30B-A3B's layer (each expert's gate/up/down as transformers 5 saves
them) and Gemma 4 26B-A4B's (experts fused, [E, 2I, H] and [E, H, I], as
the Hub's files hold them).

    python bench/make_moe_checkpoint.py OUT_DIR [--shape qwen3-30b-a3b-12l|gemma4-26b-a4b-8l] [--layers N]

Weights are N(0, 1/fan_in) (norms 1 + N(0, 0.2)), so activations stay in
range and the router spreads tokens over the experts. The tokenizer is the
real one from ../shared/data/tokenizers/ (qwen3; gemma3 for Gemma 4, the
same 262k vocabulary). The folder is written beside OUT_DIR and renamed
when complete."""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    # Qwen3-30B-A3B's layer (the bench shape), cut to 12 of its 48 layers: ~15 GB in bf16
    "qwen3-30b-a3b-12l": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                              num_hidden_layers=12, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                              num_experts=128, num_experts_per_tok=8, vocab_size=151936, norm_topk_prob=True,
                              decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
                              rms_norm_eps=1e-6, tie_word_embeddings=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                              bos_token_id=151643, eos_token_id=151645),
    # Gemma 4 26B-A4B's text layers (the shape: hidden 2816, 128 experts, top-8, moe_intermediate
    # 704, dense intermediate 2112; heads as google/gemma-4-26B-A4B's config), cut to 8 of its 30
    # layers (5 sliding, 1 full, ...; the last full): ~14.5 GB in bf16. The vocabulary is the Gemma 3
    # tokenizer's 262,145 ids (Gemma 4's has 262,144): llama.cpp's loader wants the table to cover them
    "gemma4-26b-a4b-8l": dict(hidden_size=2816, intermediate_size=2112, moe_intermediate_size=704,
                              num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                              global_head_dim=512, num_global_key_value_heads=2, attention_k_eq_v=True,
                              num_experts=128, top_k_experts=8, enable_moe_block=True, vocab_size=262145,
                              sliding_window=1024, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
                              num_kv_shared_layers=0, max_position_embeddings=262144, rms_norm_eps=1e-6,
                              tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                              layer_types=["sliding_attention"] * 5 + ["full_attention", "sliding_attention",
                                                                       "full_attention"],
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                               "full_attention": {"rope_type": "proportional",
                                                                  "partial_rotary_factor": 0.25,
                                                                  "rope_theta": 1000000.0}},
                              bos_token_id=2, eos_token_id=1, pad_token_id=0),
}


def draw(g, *shape, norm=False):
    if norm:
        return (1.0 + 0.2 * torch.randn(*shape, generator=g)).to(torch.bfloat16)
    return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16)


def layer_tensors(g, cfg, il):
    h, i, e = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    p = f"model.layers.{il}."
    t = {p + "input_layernorm.weight": draw(g, h, norm=True), p + "post_attention_layernorm.weight": draw(g, h, norm=True),
         p + "self_attn.q_proj.weight": draw(g, hq * d, h), p + "self_attn.k_proj.weight": draw(g, hkv * d, h),
         p + "self_attn.v_proj.weight": draw(g, hkv * d, h), p + "self_attn.o_proj.weight": draw(g, h, hq * d),
         p + "self_attn.q_norm.weight": draw(g, d, norm=True), p + "self_attn.k_norm.weight": draw(g, d, norm=True),
         p + "mlp.gate.weight": draw(g, e, h)}
    for x in range(e):
        q = f"{p}mlp.experts.{x}."
        t[q + "gate_proj.weight"] = draw(g, i, h)
        t[q + "up_proj.weight"] = draw(g, i, h)
        t[q + "down_proj.weight"] = draw(g, h, i)
    return t


def gemma4_layer_tensors(g, cfg, il):
    h, i, e, inter = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"], cfg["intermediate_size"]
    hq = cfg["num_attention_heads"]
    full = cfg["layer_types"][il] == "full_attention"
    d = cfg["global_head_dim"] if full else cfg["head_dim"]
    hkv = cfg["num_global_key_value_heads"] if full else cfg["num_key_value_heads"]
    p = f"model.layers.{il}."
    t = {p + "self_attn.q_proj.weight": draw(g, hq * d, h), p + "self_attn.k_proj.weight": draw(g, hkv * d, h),
         p + "self_attn.o_proj.weight": draw(g, h, hq * d), p + "self_attn.q_norm.weight": draw(g, d, norm=True),
         p + "self_attn.k_norm.weight": draw(g, d, norm=True), p + "mlp.gate_proj.weight": draw(g, inter, h),
         p + "mlp.up_proj.weight": draw(g, inter, h), p + "mlp.down_proj.weight": draw(g, h, inter),
         p + "router.proj.weight": draw(g, e, h), p + "router.scale": draw(g, h, norm=True),
         p + "router.per_expert_scale": draw(g, e, norm=True), p + "layer_scalar": draw(g, 1, norm=True),
         p + "experts.gate_up_proj": draw(g, e, 2 * i, h), p + "experts.down_proj": draw(g, e, h, i)}
    if not (full and cfg["attention_k_eq_v"]):
        t[p + "self_attn.v_proj.weight"] = draw(g, hkv * d, h)
    for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
              "post_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
              "post_feedforward_layernorm_2"):
        t[p + n + ".weight"] = draw(g, h, norm=True)
    return t


GEMMA4 = dict(layers=gemma4_layer_tensors, arch="Gemma4ForCausalLM", model_type="gemma4_text", tokenizer="gemma3",
              extra={"attention_bias": False, "dtype": "bfloat16"})
QWEN3 = dict(layers=layer_tensors, arch="Qwen3MoeForCausalLM", model_type="qwen3_moe", tokenizer="qwen3",
             extra={"hidden_act": "silu", "attention_bias": False, "dtype": "bfloat16", "use_sliding_window": False})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b-12l")
    ap.add_argument("--layers", type=int, help="override the layer count")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    cfg = dict(SHAPES[args.shape])
    kind = GEMMA4 if args.shape.startswith("gemma4") else QWEN3
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
        if "layer_types" in cfg:  # Gemma 4's 5:1 pattern, the last layer full
            cfg["layer_types"] = ["sliding_attention" if (j + 1) % 6 and j + 1 < args.layers else "full_attention"
                                  for j in range(args.layers)]
    n = cfg["num_hidden_layers"]
    tmp = args.out.parent / f".{args.out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    g = torch.Generator().manual_seed(args.seed)
    shards, weight_map, total = n + 1, {}, 0
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        if k < n:
            t = kind["layers"](g, cfg, k)
        else:
            v, h = cfg["vocab_size"], cfg["hidden_size"]
            t = {"model.embed_tokens.weight": torch.randn(v, h, generator=g).to(torch.bfloat16),
                 "model.norm.weight": draw(g, h, norm=True)}
            if not cfg["tie_word_embeddings"]:
                t["lm_head.weight"] = draw(g, v, h)
        save_file(t, tmp / name, metadata={"format": "pt"})
        for key, val in t.items():
            weight_map[key] = name
            total += val.numel() * 2
        del t
        print(f"make_moe_checkpoint: {name}", file=sys.stderr)
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config = {"architectures": [kind["arch"]], "model_type": kind["model_type"], **kind["extra"], **cfg}
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT.parent / "shared" / "data" / "tokenizers" / kind["tokenizer"] / f, tmp / f)
    shutil.rmtree(args.out, ignore_errors=True)
    os.rename(tmp, args.out)
    print(f"make_moe_checkpoint: {args.out}: {n} layers, {total / 1e9:.1f} GB", file=sys.stderr)


if __name__ == "__main__":
    main()
