"""`hubrt quantize` against llama.cpp's own tools on a bench-sized model:

    python bench/bench_gguf_write.py --hubrt build/hubrt --model fixtures/llama-3.2-1b-shaped
                                     [--type q4_k] [--positions 512] [--work DIR] [--out FILE]

1. hubrt writes MODEL as a GGUF of --type (time, peak RSS);
2. llama.cpp's converter writes MODEL as BF16 and llama_model_quantize (the
   installed llama-cpp-python's, in a child process) turns that into the same
   type with --pure (every matrix alike, as hubrt's files are);
3. the two files, tensor by tensor: identical bytes or the fraction of
   blocks that differ;
4. llama.cpp loads hubrt's file and evaluates --positions tokens of text;
   hubrt evaluates the same ids on the same file: top-1 agreement of the
   logits, and the largest logit difference over the logit range.

The checkpoint's weights are random, so the agreement measures the two
engines' arithmetic on the same blocks, not a model's quality."""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "python"))
FTYPE = {"q4_k": "LLAMA_FTYPE_MOSTLY_Q4_K_S", "q5_k": "LLAMA_FTYPE_MOSTLY_Q5_K_S", "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
         "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def llama_quantize(src, out, qtype):
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, FTYPE[qtype])
    p.pure = True
    p.nthread = os.cpu_count() or 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(p))
    if rc:
        raise SystemExit(f"llama_model_quantize returned {rc}")


def compare_files(a, b):
    import gguf
    ta = {t.name: t for t in gguf.GGUFReader(str(a)).tensors}
    tb = {t.name: t for t in gguf.GGUFReader(str(b)).tensors}
    rows = []
    for name in sorted(set(ta) | set(tb)):
        if name not in ta or name not in tb:
            rows.append((name, "only in " + ("hubrt's" if name in ta else "llama.cpp's"), None))
            continue
        x, y = ta[name], tb[name]
        if x.tensor_type != y.tensor_type:
            rows.append((name, f"types {x.tensor_type.name} / {y.tensor_type.name}", None))
            continue
        bx, by = np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8)
        _, block_bytes = gguf.GGML_QUANT_SIZES[x.tensor_type]
        nb = bx.size // block_bytes
        diff = (bx.reshape(nb, -1) != by.reshape(nb, -1)).any(axis=1).mean() if bx.size == by.size else 1.0
        rows.append((name, x.tensor_type.name, float(diff)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hubrt", default=str(ROOT / "build" / "hubrt"))
    ap.add_argument("--model", default=str(ROOT / "fixtures" / "llama-3.2-1b-shaped"))
    ap.add_argument("--type", default="q4_k", choices=sorted(FTYPE))
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--work", default=str(ROOT / "bench" / "results" / "run.tmp" / "gguf-write"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gguf-write.md"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, qt = Path(args.model), args.type
    mine, bf16, theirs = work / f"hubrt.{qt}.gguf", work / "llama.bf16.gguf", work / f"llama.{qt}.gguf"

    t = time.time()
    p = subprocess.run([args.hubrt, "quantize", model, mine, "--type", qt], capture_output=True, text=True, check=True)
    hubrt_s = time.time() - t
    rss = p.stderr.strip().split("peak RSS ")[-1]
    from llama_cpp_convert import convert
    t = time.time()
    convert(model, bf16, "bf16")
    conv_s = time.time() - t
    t = time.time()
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
                    f"import bench_gguf_write as b; b.llama_quantize({str(bf16)!r}, {str(theirs)!r}, {qt!r})"],
                   check=True, capture_output=True)
    quant_s = time.time() - t
    rows = compare_files(mine, theirs)
    same = sum(1 for r in rows if r[2] == 0.0)

    import hubrt
    import llama_cpp
    from tok_corpus import CORPUS
    tok = hubrt.AutoTokenizer.from_pretrained(model)
    ids = []
    for text in CORPUS * 8:
        ids += tok.encode(text, add_special_tokens=False)
    ids = ids[:args.positions]
    llm = llama_cpp.Llama(str(mine), n_ctx=len(ids) + 8, n_batch=len(ids), logits_all=True, n_threads=2,
                          verbose=False)
    llm.eval(ids)
    theirs_logits = np.array(llm.scores[:len(ids)], np.float32)
    ours = np.asarray(hubrt.AutoModelForCausalLM.from_pretrained(mine, dtype="float32")(np.array([ids])).logits[0])
    agree = float((ours.argmax(-1) == theirs_logits.argmax(-1)).mean())
    rel = float(np.abs(ours - theirs_logits).max() / (theirs_logits.max() - theirs_logits.min()))

    res = dict(model=str(model), type=qt, hubrt_quantize_s=hubrt_s, hubrt_peak_rss=rss, converter_bf16_s=conv_s,
               llama_quantize_s=quant_s, tensors=len(rows), identical=same,
               differing=[r for r in rows if r[2] != 0.0], positions=len(ids), top1_agreement=agree,
               max_logit_diff_over_range=rel, file_mb=mine.stat().st_size / 1e6)
    print(json.dumps(res))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    Path(args.out).write_text(
        f"# hubrt quantize against llama.cpp ({model.name}, {qt})\n\nCPU: {cpu}, {os.cpu_count()} threads. "
        f"Command: `python bench/bench_gguf_write.py --model {args.model} --type {qt}`.\n\n"
        f"| step | time | note |\n|---|---|---|\n"
        f"| hubrt quantize (safetensors -> {qt} GGUF) | {hubrt_s:.1f} s | peak RSS {rss}, file {res['file_mb']:.0f} MB |\n"
        f"| llama.cpp: converter to BF16 + llama_model_quantize --pure | {conv_s:.1f} s + {quant_s:.1f} s | |\n\n"
        f"Tensors with identical bytes: **{same} of {len(rows)}**"
        + ("" if same == len(rows) else f"; differing: {res['differing']}") + ".\n\n"
        f"llama.cpp on hubrt's file against hubrt on the same file, {len(ids)} positions of the test corpus: "
        f"top-1 agreement **{agree:.2%}**, largest logit difference {rel:.2e} of the logit range.\n")
    for f in (bf16, theirs, mine):
        f.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
