"""Tokenizer throughput: load time and single-thread encode MB/s of each
shared tokenizer, hubrt against the `tokenizers` library in the same run.
Prints one JSON line."""
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "python"))

import tokenizers  # noqa: E402
from hubrt.tokenizer import Tokenizer  # noqa: E402
from tok_corpus import big_document  # noqa: E402

SHARED = Path(os.environ.get("HUBRT_SHARED_DIR", ROOT.parent / "shared"))


def best_of(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times), out


def main():
    doc = big_document(2 << 20, seed=5)
    mb = len(doc.encode()) / 1e6
    lines = doc.split("\n")
    results = {"bench": "tokenizer", "doc_mb": round(mb, 3), "tokenizers_version": tokenizers.__version__, "models": {}}
    for name in ("qwen3", "llama3", "gemma3"):
        path = SHARED / "data" / "tokenizers" / name / "tokenizer.json"
        if not path.exists():
            continue
        hr_load, _, hr = best_of(lambda: Tokenizer.from_file(str(path)), 3)
        ref_load, _, ref = best_of(lambda: tokenizers.Tokenizer.from_file(str(path)), 3)
        # Warm both (caches), then time whole-document and per-line encoding.
        hr.encode(doc, False)
        ref.encode(doc, add_special_tokens=False)
        hr_doc, _, hr_ids = best_of(lambda: hr.encode(doc, False), 3)
        ref_doc, _, ref_enc = best_of(lambda: ref.encode(doc, add_special_tokens=False), 3)
        hr_lines, _, _ = best_of(lambda: [hr.encode(x, False) for x in lines], 3)
        ref_lines, _, _ = best_of(lambda: [ref.encode(x, add_special_tokens=False) for x in lines], 3)
        results["models"][name] = {
            "load_s": {"hubrt": round(hr_load, 4), "tokenizers": round(ref_load, 4)},
            "encode_doc_mb_s": {"hubrt": round(mb / hr_doc, 2), "tokenizers": round(mb / ref_doc, 2)},
            "encode_lines_mb_s": {"hubrt": round(mb / hr_lines, 2), "tokenizers": round(mb / ref_lines, 2)},
            "ids_equal": hr_ids == ref_enc.ids,
            "tokens": len(hr_ids),
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
