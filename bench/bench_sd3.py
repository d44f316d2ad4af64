"""`make bench` row for images: an SD3-medium-shaped MMDiT (24 blocks, width
1536, random bf16 weights generated here, never committed) and SD3's VAE
shape, hubrt beside diffusers on torch in the same run.

Per size (256x256 and 512x512): seconds per denoising step with guidance
(one transformer call on the [negative, positive] batch of 2, the 333-row
prompt of SD3's CLIP + T5 embeddings), the VAE decode of one image, and each
engine's peak RSS; the transformer's matmul FLOPs per step over the step time
beside the bf16 peak measured in the same run (bench/limits.py). Engines run
in child processes, alternating over --rounds; the median is reported.

    python bench/bench_sd3.py [--threads 2] [--sizes 256,512] [--rounds 2] [--layers 24] [--out DIR]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSFORMER = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
                   num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                   pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192)
VAE = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
           up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512], layers_per_block=2,
           latent_channels=16, norm_num_groups=32, sample_size=1024, scaling_factor=1.5305, shift_factor=0.0609,
           use_quant_conv=False, use_post_quant_conv=False)
CONTEXT = 77 + 256  # SD3's prompt rows: CLIP's 77, then T5's 256


def make_fixture(path, layers):
    import torch
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    torch.manual_seed(0)
    t = SD3Transformer2DModel(**dict(TRANSFORMER, num_layers=layers)).to(torch.bfloat16)
    t.save_pretrained(path / "transformer")
    del t
    AutoencoderKL(**VAE).to(torch.bfloat16).save_pretrained(path / "vae")


def matmul_flops(size, layers, batch=2):
    """The transformer's linear and attention FLOPs for one call."""
    d = TRANSFORMER["num_attention_heads"] * TRANSFORMER["attention_head_dim"]
    n = (size // 8 // TRANSFORMER["patch_size"]) ** 2
    t = n + CONTEXT
    per = 0
    for i in range(layers):
        last = i == layers - 1
        per += 2 * n * d * d * (4 + 8)  # image stream: q k v o, and the 4x MLP
        per += 2 * CONTEXT * d * d * (3 if last else 4 + 8)  # context stream (the last block stops after q k v)
        per += 2 * 2 * t * t * d  # scores and values over the joint sequence
    return batch * per


def inputs(size, np):
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((2, 16, size // 8, size // 8), dtype=np.float32)
    ctx = rng.standard_normal((2, CONTEXT, 4096), dtype=np.float32)
    pooled = rng.standard_normal((2, 2048), dtype=np.float32)
    z = rng.standard_normal((1, 16, size // 8, size // 8), dtype=np.float32)
    return lat, ctx, pooled, z


def child(engine, folder, size, steps):
    """Runs in its own process: load, one warm-up step, `steps` timed steps,
    one VAE decode (after a warm-up decode); prints one JSON line."""
    import numpy as np

    lat, ctx, pooled, z = inputs(size, np)
    t = np.array([500.0, 500.0], np.float32)
    t0 = time.perf_counter()
    if engine == "diffusers":
        import torch
        from diffusers import AutoencoderKL, SD3Transformer2DModel

        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
        model = SD3Transformer2DModel.from_pretrained(folder / "transformer", torch_dtype=torch.bfloat16).eval()
        vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.bfloat16).eval()
        load = time.perf_counter() - t0
        args = dict(hidden_states=torch.from_numpy(lat).bfloat16(), encoder_hidden_states=torch.from_numpy(ctx).bfloat16(),
                    pooled_projections=torch.from_numpy(pooled).bfloat16(), timestep=torch.from_numpy(t))
        zt = torch.from_numpy(z).bfloat16()

        def step():
            with torch.no_grad():
                model(**args).sample.float().sum().item()

        def decode():
            with torch.no_grad():
                vae.decode(zt).sample.float().sum().item()
    else:
        import hubrt

        model = hubrt.SD3Transformer2DModel.from_pretrained(folder / "transformer", dtype="bfloat16", compile=True)
        vae = hubrt.AutoencoderKL.from_pretrained(folder / "vae", dtype="bfloat16")
        load = time.perf_counter() - t0
        hl, hc, hp, hz = (hubrt.from_numpy(a, dtype="bf16") for a in (lat, ctx, pooled, z))

        def step():
            model(hl, hc, hp, t).sample.numpy()

        def decode():
            vae.decode(hz).numpy()
    step()
    times = []
    for _ in range(steps):
        s = time.perf_counter()
        step()
        times.append(time.perf_counter() - s)
    decode()
    s = time.perf_counter()
    decode()
    vae_s = time.perf_counter() - s
    print(json.dumps({"engine": engine, "size": size, "load_s": load, "step_s": statistics.median(times),
                      "vae_s": vae_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def limits(threads):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "limits.py")], capture_output=True, text=True)
    try:
        res = json.loads(out.stdout)
        return res.get("cpu", ""), res.get("bf16_peak_gflops", {}).get(str(threads)), res.get("bf16_unit", "")
    except json.JSONDecodeError:
        return "", None, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=4, metavar=("ENGINE", "DIR", "SIZE", "STEPS"))
    ap.add_argument("--make-fixture", nargs=2, metavar=("DIR", "LAYERS"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--engines", default="hubrt,diffusers")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], Path(a.child[1]), int(a.child[2]), int(a.child[3]))
        return
    if a.make_fixture:
        make_fixture(Path(a.make_fixture[0]), int(a.make_fixture[1]))
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), HUBRT_NUM_THREADS=str(a.threads),
               MKL_NUM_THREADS=str(a.threads), BENCH_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false")
    cpu, peak, unit = limits(a.threads)
    results = []
    with tempfile.TemporaryDirectory(prefix="sd3-bench-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        # in its own process: this one stays small, and a child's peak RSS
        # (which Linux starts from the memory it was forked from) is its own
        subprocess.run([sys.executable, __file__, "--make-fixture", str(folder), str(a.layers)], check=True, env=env)
        print(f"[sd3] fixture ({a.layers} blocks, bf16) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for size in [int(s) for s in a.sizes.split(",")]:
            for r in range(a.rounds):
                for engine in a.engines.split(","):
                    p = subprocess.run([sys.executable, __file__, "--child", engine, str(folder), str(size),
                                        str(a.steps)], capture_output=True, text=True, env=env, timeout=3600)
                    if p.returncode != 0:
                        print(f"[sd3] {engine} {size} failed: {p.stderr[-2000:]}", file=sys.stderr)
                        continue
                    row = json.loads(p.stdout.strip().splitlines()[-1])
                    row["round"] = r
                    results.append(row)
                    print(f"[sd3] {engine} {size}: {row['step_s']:.2f} s/step, vae {row['vae_s']:.2f} s, "
                          f"{row['peak_rss_mb']:.0f} MB", file=sys.stderr)
    report(results, a, cpu, peak, unit)


def report(results, a, cpu, peak, unit):
    lines = [f"# SD3-medium-shaped transformer and SD3 VAE, bf16 ({cpu}, {a.threads} threads)", "",
             f"bf16 peak measured in the same run: {peak and round(peak)} GFLOP/s ({unit}). Step: one transformer "
             f"call on the guidance batch of 2 with {CONTEXT} prompt rows; median of {a.steps} steps after a warm-up, "
             f"then the median over {a.rounds} alternating rounds. Peak RSS: each engine's process (diffusers' "
             "includes torch).", "",
             "| size | engine | s/step | matmul GFLOP/s | of bf16 peak | VAE decode s | load s | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|"]
    summary = {}
    for size in sorted({r["size"] for r in results}):
        flops = matmul_flops(size, a.layers)
        for engine in a.engines.split(","):
            rows = [r for r in results if r["size"] == size and r["engine"] == engine]
            if not rows:
                continue
            step = statistics.median(r["step_s"] for r in rows)
            vae = statistics.median(r["vae_s"] for r in rows)
            gf = flops / step / 1e9
            summary[(size, engine)] = (step, vae)
            frac = f"{100 * gf / peak:.0f}%" if peak else "-"
            lines.append(f"| {size}x{size} | {engine} | {step:.2f} | {gf:.0f} | {frac} | {vae:.2f} | "
                         f"{statistics.median(r['load_s'] for r in rows):.1f} | "
                         f"{max(r['peak_rss_mb'] for r in rows):.0f} |")
    lines.append("")
    for size in sorted({s for s, _ in summary}):
        if (size, "hubrt") in summary and (size, "diffusers") in summary:
            h, d = summary[(size, "hubrt")], summary[(size, "diffusers")]
            lines.append(f"- {size}x{size}: hubrt {d[0] / h[0]:.2f}x diffusers' step speed, VAE decode "
                         f"{d[1] / h[1]:.2f}x.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sd3.md").write_text(text)
    (out / "sd3-runs.json").write_text(json.dumps({"cpu": cpu, "bf16_peak_gflops": peak, "threads": a.threads,
                                                   "layers": a.layers, "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
