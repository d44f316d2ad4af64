"""`hubrt bench` beside transformers eager on one checkpoint, in one run:
same prompt ids, thread count, dtype and case. Writes one JSON object
(both results and the hubrt/transformers ratios) to --out and stdout.

    python bench/bench_models.py fixtures/qwen3-0.6b-shaped [--prompt-len 128] [--gen 32]
        [--batch 1] [--threads 2] [--dtype bf16] [--hubrt build/hubrt] [--out FILE]

The full comparison (more engines, machine limits, report) is bench/run.sh
(`make bench`); this is the quick one for the models work."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def last_json(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[-500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--hubrt", type=Path, default=ROOT / "build" / "hubrt")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "models.json")
    args = ap.parse_args()
    t = str(args.threads)
    env = dict(os.environ, HUBRT_NUM_THREADS=t, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t)
    case = ["--prompt-len", str(args.prompt_len), "--gen", str(args.gen), "--batch", str(args.batch)]
    hub = last_json([str(args.hubrt), "bench", str(args.model), *case, "--dtype", args.dtype], env)
    if args.dtype != "bf16":
        hf = {"error": "bench_transformers.py runs the checkpoint's bf16 only"}
    else:
        hf = last_json([sys.executable, str(ROOT / "bench" / "bench_transformers.py"), str(args.model), *case,
                        "--mode", "eager", "--threads", t], env)
    ratio = {k: round(hub[k] / hf[k], 3) for k in ("prefill_tok_s", "decode_tok_s")
             if hub.get(k) and hf.get(k)}
    res = {"model": str(args.model), "threads": args.threads, "dtype": args.dtype, "batch": args.batch,
           "prompt_len": args.prompt_len, "gen": args.gen, "loadavg": os.getloadavg(),
           "hubrt": hub, "transformers_eager": hf, "hubrt_over_transformers": ratio}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
