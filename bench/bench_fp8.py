"""The Hub's FP8 checkpoints: hubrt keeping the FP8 blocks, hubrt on the
bf16 checkpoint of the same (dequantized) weights, and transformers on the
FP8 checkpoint itself (which, without a GPU, it dequantizes to bf16 at
load), with the read bandwidth measured in the same run.

    python bench/bench_fp8.py --hubrt build/hubrt [--rounds 2] [--threads 2]
                              [--work DIR] [--out bench/results/fp8.md]

The checkpoint is Qwen3-0.6B-shaped (28 layers, hidden 1024, tied bf16
embedding of 151,936 rows) with random weights, its projections quantized
to float8_e4m3fn per 128 x 128 block (quant_method "fp8", weight_scale_inv,
as the Hub's Qwen3 FP8 releases), written tensor by tensor. Cases as in
`make bench`: b1 (prompt 512, 128 new tokens) and b16 (prompt 16, 32 new
tokens), bf16 activations; each engine one process per case, alternated in
each of --rounds rounds; each figure's best round. Decode b1 is held
against the bytes a decoded token reads (each weight as the engine holds
it, the tied head reading the whole embedding, the bf16 KV cache at the
mean decode position) over the 2-thread read bandwidth (bench/limits.py,
before and after; the higher). Prints the markdown table and writes it to
--out."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench_quantized import last_json, read_bandwidth  # noqa: E402  (bench/ is the script's folder)

ROOT = Path(__file__).resolve().parents[1]
CASES = {"b1": (1, 512, 128), "b16": (16, 16, 32)}
SHAPE = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
             rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
             eos_token_id=151645)


def make(work):
    """(fp8 folder, bf16 folder, bytes a decode token reads from each's weights)."""
    import torch
    from safetensors.torch import save_file
    fp8, dense = work / "qwen3-0.6b-fp8", work / "qwen3-0.6b-fp8-dequantized-bf16"
    done = work / "made.json"
    if done.exists():
        return fp8, dense, json.loads(done.read_text())
    for d in (fp8, dense):
        d.mkdir(parents=True, exist_ok=True)
    cfg = dict(SHAPE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", dtype="bfloat16")
    (dense / "config.json").write_text(json.dumps(cfg, indent=1))
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (fp8 / "config.json").write_text(json.dumps(dict(cfg, quantization_config=qc), indent=1))
    g = torch.Generator().manual_seed(0)
    h, inter, kv = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["num_key_value_heads"] * SHAPE["head_dim"]
    q = SHAPE["num_attention_heads"] * SHAPE["head_dim"]
    shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
              "self_attn.o_proj": (h, q), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
              "mlp.down_proj": (h, inter)}
    emb = (torch.randn(SHAPE["vocab_size"], h, generator=g) * 0.02).to(torch.bfloat16)
    common = {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    read = {"fp8": emb.numel() * 2, "bf16": emb.numel() * 2}
    for il in range(SHAPE["num_hidden_layers"]):
        a, b = {}, {}
        for name in ("input_layernorm", "post_attention_layernorm"):
            a[f"model.layers.{il}.{name}.weight"] = torch.ones(h, dtype=torch.bfloat16)
        for name in ("self_attn.q_norm", "self_attn.k_norm"):
            a[f"model.layers.{il}.{name}.weight"] = torch.ones(SHAPE["head_dim"], dtype=torch.bfloat16)
        b.update(a)
        for name, (r, c) in shapes.items():
            w = torch.randn(r, c, generator=g) / c ** 0.5
            blk = w.reshape(r // 128, 128, c // 128, 128)
            s = blk.abs().amax(dim=(1, 3)) / 448
            codes = (blk / s[:, None, :, None]).to(torch.float8_e4m3fn)
            key = f"model.layers.{il}.{name}.weight"
            a[key], a[key + "_scale_inv"] = codes.reshape(r, c), s.float()
            b[key] = (codes.float() * s[:, None, :, None]).reshape(r, c).to(torch.bfloat16)
            read["fp8"] += r * c // 32 * 36  # hubrt's blocks: an f32 scale per 32 codes
            read["bf16"] += r * c * 2
        save_file(a, fp8 / f"layer{il:02d}.safetensors", metadata={"format": "pt"})
        save_file(b, dense / f"layer{il:02d}.safetensors", metadata={"format": "pt"})
    for d in (fp8, dense):
        save_file(common, d / "common.safetensors", metadata={"format": "pt"})
        from safetensors import safe_open
        wm = {}
        for f in sorted(d.glob("*.safetensors")):
            with safe_open(f, "pt") as s:
                wm.update({k: f.name for k in s.keys()})
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    done.write_text(json.dumps(read))
    return fp8, dense, read


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hubrt", default=str(ROOT / "build" / "hubrt"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=str(ROOT / "fixtures" / "bench-fp8"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fp8.md"))
    a = ap.parse_args()
    fp8, dense, read = make(Path(a.work))
    kv_pos = 512 + 64
    kv = SHAPE["num_hidden_layers"] * 2 * SHAPE["num_key_value_heads"] * SHAPE["head_dim"] * kv_pos * 2
    engines = {"hubrt fp8": (fp8, "fp8"), "hubrt bf16": (dense, "bf16"), "transformers": (fp8, "bf16")}
    bw_start, cpu = read_bandwidth()
    seen = {}
    for rnd in range(a.rounds):
        order = list(engines) if rnd % 2 == 0 else list(engines)[::-1]
        for case, (b, p, g) in CASES.items():
            args = ["--prompt-len", str(p), "--gen", str(g), "--batch", str(b)]
            for eng in order:
                path = engines[eng][0]
                cmd = ([a.hubrt, "bench", str(path), *args] if eng.startswith("hubrt") else
                       [sys.executable, str(ROOT / "bench" / "bench_transformers.py"), str(path), "--mode", "eager",
                        *args, "--threads", str(a.threads)])
                res = last_json(cmd, timeout=3600)
                seen.setdefault((eng, case), []).append(res)
                print(f"[fp8] round {rnd + 1} {case} {eng}: prefill {res['prefill_tok_s']:.0f} decode "
                      f"{res['decode_tok_s']:.1f}", file=sys.stderr)
    bw_end, _ = read_bandwidth()
    best = {k: {f: max(r.get(f, 0) for r in rs) for f in ("prefill_tok_s", "decode_tok_s", "peak_rss_mb")}
            for k, rs in seen.items()}
    bw = max(x for x in (bw_start, bw_end) if x) if (bw_start or bw_end) else None
    lines = [f"Qwen3-0.6B-shaped FP8 checkpoint (128 x 128 blocks, random weights), bf16 activations ({cpu}, "
             f"{a.threads} threads, best of {a.rounds} alternated rounds; tok/s). Read bandwidth (2 threads) "
             f"{bw_start} / {bw_end} GB/s before / after.", "",
             "| engine | weights held | MB read per decoded token | prefill 512 | decode b1 | b1 % of bound "
             "| decode b16 | peak RSS MB (b1) |", "|---|---|---|---|---|---|---|---|"]
    for eng, (_, held) in engines.items():
        nbytes = read[held] + kv
        bound = bw * 1e9 / nbytes if bw else None
        b1, b16 = best[(eng, "b1")], best[(eng, "b16")]
        pct = f"{100 * b1['decode_tok_s'] / bound:.0f}%" if bound else "-"
        lines.append(f"| {eng} | {held} | {nbytes / 1e6:.0f} | {b1['prefill_tok_s']:.0f} | {b1['decode_tok_s']:.1f} "
                     f"| {pct} | {b16['decode_tok_s']:.1f} | {b1['peak_rss_mb']:.0f} |")
    h, t, d = best[("hubrt fp8", "b1")], best[("transformers", "b1")], best[("hubrt bf16", "b1")]
    lines += ["", f"hubrt fp8 / transformers: prefill {h['prefill_tok_s'] / t['prefill_tok_s']:.2f}x, decode b1 "
              f"{h['decode_tok_s'] / t['decode_tok_s']:.2f}x, decode b16 "
              f"{best[('hubrt fp8', 'b16')]['decode_tok_s'] / best[('transformers', 'b16')]['decode_tok_s']:.2f}x; "
              f"hubrt fp8 / hubrt bf16: decode b1 {h['decode_tok_s'] / d['decode_tok_s']:.2f}x, prefill "
              f"{h['prefill_tok_s'] / d['prefill_tok_s']:.2f}x."]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
