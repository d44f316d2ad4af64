"""Tensor parallelism on one socket: tp=2 with one thread per rank against
tp=1 with two threads, on the Llama-3.2-1B-shaped bf16 checkpoint
(scripts/make_fixtures.py bench), with the read bandwidth measured in the
same run (bench/limits.py).

    python bench/bench_tp.py [--model fixtures/llama-3.2-1b-shaped] [--rounds 2]
                             [--out bench/results/tp.md]

Cases as in `make bench`: b1 (prompt 512, 128 new tokens: prefill and
decode at batch 1) and b16 (prompt 16, 32 new tokens); `hubrt bench`, one
process (or one launch) per case, the two configurations alternated in
each round, the best round kept. Decode b1 is held against its bound: the
bytes a token reads (every rank's share of the weights, the tied head
reading its vocab rows; the KV cache left out) over the 2-thread read
bandwidth probed just before and after that run (the higher): the two
ranks read through the same two cores at once, and this machine's memory
changes speed between runs. The exchanges'
time per decoded token comes from a HUBRT_PROFILE run of b1 (all_reduce
and all_gather, rank 0, waiting for the other rank included). Each rank's
peak RSS is held against what its plan holds: its slices of the
checkpoint's tensors (computed here from the file's header and the
config, not by hubrt) plus its KV cache. Prints the markdown table and
writes it to --out."""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"b1": (1, 512, 128), "b16": (16, 16, 32)}


def bench(hubrt, model, tp, case, env=None):
    b, p, g = CASES[case]
    args = [str(hubrt), "bench", str(model), "--batch", str(b), "--prompt-len", str(p), "--gen", str(g)]
    if tp > 1:
        args = [str(hubrt), "launch", "-n", str(tp), "--threads", "1", "--", *args, "--tp", str(tp)]
    e = dict(os.environ, HUBRT_NUM_THREADS="2", **(env or {}))
    r = subprocess.run(args, capture_output=True, text=True, env=e, timeout=1800)
    if r.returncode:
        sys.exit(f"bench_tp: {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    return sorted(rows, key=lambda j: j.get("rank", 0)), r.stderr


def header(path):
    """{name: (dtype, shape)} of a safetensors file, read from its header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))
    return {k: (v["dtype"], v["shape"]) for k, v in h.items() if k != "__metadata__"}


def plan_bytes(model, tp, rank):
    """The bytes rank `rank` of tp holds under the auto plan: q/k/v rows and
    o_proj columns by heads (kv heads split, or the one a rank's queries
    read), gate/up rows and down_proj columns by intermediate_size,
    embedding and head rows by vocab, the rest whole; bf16 = 2 bytes."""
    cfg = json.load(open(model / "config.json"))
    hq, kv, inter, vocab = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"],
                            cfg["vocab_size"])
    size = {"BF16": 2, "F16": 2, "F32": 4}

    def part(n):
        return n * (rank + 1) // tp - n * rank // tp

    total = 0
    for name, (dt, shape) in header(model / "model.safetensors").items():
        n = 1
        for s in shape:
            n *= s
        if tp > 1:
            if re.search(r"(q_proj|o_proj)\.weight$", name):
                n //= tp
            elif re.search(r"(k_proj|v_proj)\.weight$", name):
                n = n // kv * (kv // tp if kv % tp == 0 else 1)
            elif re.search(r"(gate_proj|up_proj|down_proj)\.weight$", name):
                n = n // inter * part(inter)
            elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                n = n // vocab * part(vocab)
        total += n * size[dt]
    return total


def kv_bytes(model, tp, case):
    cfg = json.load(open(model / "config.json"))
    b, p, g = CASES[case]
    kv = cfg["num_key_value_heads"]
    local = kv // tp if kv % tp == 0 else 1
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * b * local * (p + g) * hd * 2


def collective_ms(stderr):
    """Milliseconds rank 0 spent in all_reduce and all_gather (HUBRT_PROFILE)."""
    block = stderr.split("hubrt profile:")[1] if "hubrt profile:" in stderr else ""
    return sum(float(m.group(1)) for m in re.finditer(r"^all_(?:reduce|gather)\s+\d+\s+([0-9.]+)", block, re.M))


def readbw(probe):
    """GB/s the 2-thread read probe gets now (1 GiB in huge pages)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import limits as lim
    return lim.read_gbs(probe, 2)


def limits():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "limits.py")], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "fixtures" / "llama-3.2-1b-shaped"))
    ap.add_argument("--hubrt", default=str(ROOT / "build" / "hubrt"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tp.md"))
    ap.add_argument("--work", default="/tmp", help="where the bandwidth probe is built")
    a = ap.parse_args()
    model = Path(a.model)
    lim0 = limits()
    probe = subprocess.run([sys.executable, str(ROOT / "bench" / "limits.py"), "--build-readbw", a.work],
                           capture_output=True, text=True, check=True).stdout.strip()
    best, beside = {}, {}
    for _ in range(a.rounds):
        for case in CASES:
            for tp in (1, 2):
                # this machine's memory changes mode between runs: the
                # bandwidth is probed beside each b1 run, for its own bound
                bws = [readbw(probe)] if case == "b1" else []
                rows, _ = bench(a.hubrt, model, tp, case)
                if case == "b1":
                    bws.append(readbw(probe))
                for key in ("prefill_tok_s", "decode_tok_s"):
                    v = rows[0][key]
                    if key == "decode_tok_s" and case == "b1" and v > best.get((tp, case, key), 0):
                        beside[tp] = max(bws)
                    best[(tp, case, key)] = max(best.get((tp, case, key), 0), v)
                best[(tp, case, "rss")] = [r["peak_rss_mb"] for r in rows]
    # the exchanges' share of decode b1, profiled apart
    _, err = bench(a.hubrt, model, 2, "b1", env={"HUBRT_PROFILE": "1"})
    lim1 = limits()
    bw = {t: max(lim0["read_gbs"][t], lim1["read_gbs"][t]) for t in ("1", "2")}
    b, p, g = CASES["b1"]
    # warm-up (4-token prompt, 2 tokens) and timed run both decode: their
    # tokens after the first, each as many exchanges as layers x 2 + 2
    coll = collective_ms(err)
    tokens = (p + g) + (4 + 2)
    lines = [f"CPU: {lim0['cpu']}; read bandwidth {bw['1']:.1f} GB/s (1 thread), {bw['2']:.1f} GB/s (2 threads), "
             f"measured before and after (the higher).", "",
             "| | tp=1, 2 threads | tp=2, 1 thread per rank | tp=2 / tp=1 |", "|---|---|---|---|"]
    for case, key, label in (("b1", "prefill_tok_s", "prefill 512 (tok/s)"), ("b1", "decode_tok_s", "decode b1 (tok/s)"),
                             ("b16", "decode_tok_s", "decode b16 (tok/s)")):
        one, two = best[(1, case, key)], best[(2, case, key)]
        lines.append(f"| {label} | {one:.1f} | {two:.1f} | {two / one:.2f}x |")
    # both configurations read through the same two cores at once: the
    # bytes every rank reads per token over the 2-thread bandwidth probed
    # beside the run kept
    w1, w2 = plan_bytes(model, 1, 0), plan_bytes(model, 2, 0) + plan_bytes(model, 2, 1)
    bound1, bound2 = beside[1] * 1e9 / w1, beside[2] * 1e9 / w2
    lines.append(f"| read bandwidth beside decode b1 (GB/s, 2 threads) | {beside[1]:.1f} | {beside[2]:.1f} | |")
    lines.append(f"| decode b1 bound (tok/s) | {bound1:.1f} | {bound2:.1f} | |")
    lines.append(f"| decode b1, % of bound | {100 * best[(1, 'b1', 'decode_tok_s')] / bound1:.0f}% | "
                 f"{100 * best[(2, 'b1', 'decode_tok_s')] / bound2:.0f}% | |")
    lines += ["", f"Exchanges (all_reduce + all_gather, rank 0, waits included) in a profiled b1 run: {coll:.0f} ms over "
              f"its ~{tokens} forwarded positions' steps; per decoded token about "
              f"{coll / (g + 2):.2f} ms (an upper bound: prefill's exchanges are counted in).", "",
              "| peak RSS (MB) | tp=1 | tp=2 rank 0 | tp=2 rank 1 |", "|---|---|---|---|"]
    for case in CASES:
        r1, r2 = best[(1, case, "rss")], best[(2, case, "rss")]
        lines.append(f"| {case} measured | {r1[0]:.0f} | {r2[0]:.0f} | {r2[1]:.0f} |")
        plan = [(plan_bytes(model, 1, 0) + kv_bytes(model, 1, case)) / 2**20] + \
               [(plan_bytes(model, 2, r) + kv_bytes(model, 2, case)) / 2**20 for r in (0, 1)]
        lines.append(f"| {case} plan's weights + KV | {plan[0]:.0f} | {plan[1]:.0f} | {plan[2]:.0f} |")
        lines.append(f"| {case} measured / plan | {r1[0] / plan[0]:.2f} | {r2[0] / plan[1]:.2f} | "
                     f"{r2[1] / plan[2]:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text("# Tensor parallelism: tp=2 x 1 thread vs tp=1 x 2 threads\n\n"
                           "`python bench/bench_tp.py` on " + model.name + " (bf16).\n\n" + text)


if __name__ == "__main__":
    main()
