"""llama.cpp (through llama-cpp-python, built from source for this CPU), the
GGML peer of `hubrt bench`, on a BF16 GGUF converted from the same HF
checkpoint by llama.cpp's own converter.

    python bench/bench_llamacpp.py convert HF_DIR OUT.gguf
    python bench/bench_llamacpp.py run MODEL.gguf [--prompt-len P] [--gen G] [--batch B] [--threads T]

convert: scripts/llama_cpp_convert.py, which takes convert_hf_to_gguf.py (and
its gguf-py) from the sdist of the installed llama-cpp-python version, so
converter and engine come from one llama.cpp commit; the sdist is fetched
with pip into a cache folder.
run: the same case as `hubrt bench` (B pseudo-random prompts of P ids, greedy,
eos ignored), batched through the low-level API: one sequence per prompt, the
prefill as one llama_decode over all B*P tokens (split at n_batch), then gen-1
steps of B tokens. llama.cpp's defaults are kept otherwise (n_ubatch, f16 KV
cache, flash attention auto). The last stdout line is one JSON object with the
keys of `hubrt bench`."""
import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transformers import prompt_ids  # noqa: E402  (same ids in every engine)


def convert(hf_dir, out, cache_dir):
    sys.path.insert(0, str(ROOT / "scripts"))
    from llama_cpp_convert import convert as run_converter
    run_converter(hf_dir, out, "bf16", cache=cache_dir)


def gguf_types(path):
    """Count of tensors per GGML type in the file: shows the weights are BF16."""
    from gguf import GGUFReader
    counts = {}
    for t in GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


class Engine:
    def __init__(self, ll, path, n_seq, n_ctx_seq, threads):
        self.ll = ll
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = ll.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = ll.llama_context_default_params()
        cp.n_seq_max = n_seq
        # without a unified KV cache each sequence gets n_ctx / n_seq_max cells
        cp.n_ctx = n_seq * ((n_ctx_seq + 255) // 256 * 256)
        cp.n_threads = threads
        cp.n_threads_batch = threads
        self.n_batch = cp.n_batch
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.batch = ll.llama_batch_init(max(self.n_batch, n_seq), 0, 1)

    def decode(self, toks):
        """toks: list of (token, pos, seq, want_logits), at most n_batch of them."""
        b = self.batch
        for i, (tok, pos, seq, lg) in enumerate(toks):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if lg else 0
        b.n_tokens = len(toks)
        rc = self.ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def argmax(self, n_out):
        import numpy as np
        ptr = self.ll.llama_get_logits(self.ctx)
        logits = np.ctypeslib.as_array(ptr, shape=(n_out * self.n_vocab,)).reshape(n_out, self.n_vocab)
        return logits.argmax(-1).tolist()

    def clear(self):
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)

    def generate(self, prompts, gen):
        """Returns (prefill_s, decode_s) for greedy generation of gen tokens per prompt."""
        self.clear()
        plen = len(prompts[0])
        toks = [(tok, p, s, p == plen - 1) for s, pr in enumerate(prompts) for p, tok in enumerate(pr)]
        t0 = time.perf_counter()
        nxt = [0] * len(prompts)
        for i in range(0, len(toks), self.n_batch):
            chunk = toks[i:i + self.n_batch]
            self.decode(chunk)
            # each llama_decode overwrites the logits: read this chunk's last positions now
            seqs = [t[2] for t in chunk if t[3]]
            if seqs:
                for s, tok in zip(seqs, self.argmax(len(seqs))):
                    nxt[s] = tok
        t1 = time.perf_counter()
        for step in range(gen - 1):
            self.decode([(nxt[s], plen + step, s, True) for s in range(len(prompts))])
            nxt = self.argmax(len(prompts))
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    def free(self):
        self.ll.llama_batch_free(self.batch)
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def bench(args):
    res = {"engine": "llama.cpp", "threads": args.threads, "batch": args.batch, "prompt_len": args.prompt_len,
           "gen": args.gen, "dtype": "bf16"}
    try:
        import llama_cpp as ll
        res["llama_cpp_python"] = ll.__version__
        ll.llama_backend_init()
        res["system_info"] = ll.llama_print_system_info().decode().strip()
        res["gguf_types"] = gguf_types(args.model)
        t0 = time.perf_counter()
        eng = Engine(ll, args.model, args.batch, args.prompt_len + args.gen, args.threads)
        res["load_s"] = round(time.perf_counter() - t0, 4)
        vocab = eng.n_vocab
        eng.generate(prompt_ids(1, 4, vocab), 2)  # warm-up like hubrt bench
        pre_s, dec_s = eng.generate(prompt_ids(args.batch, args.prompt_len, vocab), args.gen)
        eng.free()
        res["prefill_s"] = round(pre_s, 4)
        res["decode_s"] = round(dec_s, 4)
        res["prefill_tok_s"] = round(args.batch * args.prompt_len / pre_s, 2)
        res["decode_tok_s"] = round(args.batch * (args.gen - 1) / dec_s, 2) if args.gen > 1 else None
    except Exception as e:
        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    print(json.dumps(res))
    return 0 if "error" not in res else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("hf_dir")
    c.add_argument("out")
    c.add_argument("--cache", default=str(ROOT / "fixtures" / ".llama-cpp-src"))
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("--prompt-len", type=int, default=128)
    r.add_argument("--gen", type=int, default=64)
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = ap.parse_args()
    if args.cmd == "convert":
        convert(args.hf_dir, args.out, args.cache)
        return 0
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
