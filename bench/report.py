"""Benchmark bookkeeping for bench/run.sh.

    python bench/report.py case --engine E --model M --case C --timeout S --out F -- CMD ...
        runs one engine process for one case, with a time limit, and writes one
        JSON piece (its last stdout line, or the error / timeout in its place)
    python bench/report.py merge WORKDIR [--results bench/results]
        merges WORKDIR's pieces into latest.json, latest.md and latest.png

Every figure is given as a ratio to the best peer (transformers eager,
transformers + torch.compile, llama.cpp) and as a fraction of the bound that
the limits measured in the same run (bench/limits.py) put on that case:
    decode: each step reads every weight the step uses (the embedding table
      only as the lm_head) and the KV cache so far, and does 2 FLOP per
      weight per row plus 4*heads*head_dim FLOP per attended position per
      layer; a step takes at least max(bytes / read bandwidth, FLOPs / bf16
      peak), summed over the gen-1 timed steps;
    prefill: weights read once, and the FLOPs of every prompt token (lm_head
      once per prompt, causal attention counted as the lower triangle only).
The binding limit is whichever of the two terms is larger."""
import argparse
import json
import os
import re
import signal
import statistics
import struct
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from limits import read_gbs  # bench/limits.py, beside this file (a script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("transformers-eager", "transformers-compile", "llama.cpp")
# hubrt-base and hubrt-compiled-base: another build of hubrt (bench/run.sh's
# BENCH_BASELINE_BUILD, the commit before a change) run in the same rounds
ENGINES = ("hubrt", "hubrt-compiled", "hubrt-base", "hubrt-compiled-base", "hubrt-xla_cpu") + PEERS
METRICS = (("prefill", "b1", "prefill_tok_s", "prefill 512"),
           ("decode_b1", "b1", "decode_tok_s", "decode b1"),
           ("decode_b16", "b16", "decode_tok_s", "decode b16"),
           ("decode_b64", "b64", "decode_tok_s", "decode b64"))
BF16_BYTES = 2
COLORS = ("#1f4e9c", "#4f8fe0", "#7f7f7f", "#bfbfbf", "#9cc3f0", "#d62728", "#ff9896", "#2ca02c")  # hubrt blues,
# its baseline greys, peers warm/green


# ---------------------------------------------------------------- one case

def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def probe_gbs(exe, threads):
    """The read bandwidth now (bench/limits.py's probe), or None if it failed."""
    try:
        return read_gbs(exe, threads)
    except (OSError, subprocess.CalledProcessError, AttributeError):
        return None


def run_case(a, cmd):
    piece = {"engine": a.engine, "model": a.model, "case": a.case, "cmd": " ".join(cmd),
             "loadavg_before": loadavg()}
    if a.probe:
        # The bandwidth right before and after the run: on this VM it moves between two modes (about 35 and
        # 60 GB/s) for minutes at a time, so a bandwidth-bound case is held against the reads beside it.
        piece["read_gbs_before"] = probe_gbs(a.probe, a.probe_threads)
    t0 = time.perf_counter()
    try:
        # own process group: a timeout also ends the engine's helpers (inductor compile workers)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = p.communicate(timeout=a.timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            rc = None
    except OSError as e:
        out, err, rc = "", str(e), 127
    piece["wall_s"] = round(time.perf_counter() - t0, 2)
    piece["loadavg_after"] = loadavg()
    if a.probe:
        piece["read_gbs_after"] = probe_gbs(a.probe, a.probe_threads)
    data = last_json(out) if rc is not None else None
    if data:
        piece.update({k: v for k, v in data.items() if k not in piece or k == "engine"})
        piece["engine"] = a.engine
    if "compile_ms" in piece and piece.get("compile_s") is None:
        piece["compile_s"] = round(piece["compile_ms"] / 1000, 3)  # hubrt --compile reports ms
    if rc is None:
        piece["error"] = f"timeout (>{a.timeout:.0f} s)"
    elif rc != 0 and "error" not in piece:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [f"exit status {rc}"]
        piece["error"] = tail[0].strip()[:300]
    piece["stderr_tail"] = err[-2000:]
    Path(a.out).write_text(json.dumps(piece) + "\n")
    status = piece.get("error") or "ok"
    print(f"[bench] {a.model} {a.case} {a.engine}: {status} ({piece['wall_s']} s)", file=sys.stderr)


# ---------------------------------------------------------------- bounds

def model_shape(model_dir):
    """Parameter counts from config.json and the safetensors headers."""
    cfg = json.loads((model_dir / "config.json").read_text())
    tensors = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        tensors.update({k: v for k, v in hdr.items() if k != "__metadata__"})
    numel = {k: _prod(v["shape"]) for k, v in tensors.items()}
    experts = sum(n for k, n in numel.items() if ".experts." in k)  # Qwen3-MoE's mlp.experts, Gemma 4's experts
    embed = sum(n for k, n in numel.items() if "embed_tokens" in k)
    head = sum(n for k, n in numel.items() if k.startswith("lm_head")) or embed  # tied: the table is the head
    body = sum(n for k, n in numel.items() if "embed_tokens" not in k and not k.startswith("lm_head")) - experts
    n_layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    kv_heads = cfg.get("num_key_value_heads", heads)
    # Gemma 4's full layers: their own head_dim and (with attention_k_eq_v) kv heads
    full = [t == "full_attention" for t in cfg.get("layer_types") or []] if "global_head_dim" in cfg else []
    g_dim = cfg.get("global_head_dim", head_dim)
    g_kv = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None
    kv_elems = sum(2 * ((g_kv or kv_heads) * g_dim if f else kv_heads * head_dim) for f in full) \
        if full else n_layers * 2 * kv_heads * head_dim
    q_dims = sum(g_dim if f else head_dim for f in full) if full else n_layers * head_dim
    return {"params": sum(numel.values()), "checkpoint_bytes": sum(numel.values()) * BF16_BYTES,
            "body_params": body, "head_params": head, "layers": n_layers, "heads": heads,
            "kv_heads": kv_heads, "head_dim": head_dim, "q_dims": q_dims,
            "kv_bytes_per_token": kv_elems * BF16_BYTES,
            # a mixture of experts: the experts' parameters (all layers), their count and top-k
            "expert_params": experts, "experts": cfg.get("num_experts") or cfg.get("num_local_experts") or 0,
            "experts_per_tok": cfg.get("num_experts_per_tok") or cfg.get("top_k_experts") or 0}


def _touched(shape, tokens):
    """The experts' parameters a step of `tokens` rows reads, and those each row
    multiplies: each row's top-k drawn uniformly (the random router spreads
    tokens nearly so; bench_moe's rows count the experts each call touches),
    so the expected distinct experts per layer are E (1 - (1 - k/E)^tokens)."""
    e, k = shape.get("experts") or 0, shape.get("experts_per_tok") or 0
    if not e or not shape.get("expert_params"):
        return 0.0, 0.0
    per_expert = shape["expert_params"] / e
    return per_expert * e * (1 - (1 - k / e) ** tokens), per_expert * k


def _prod(xs):
    r = 1
    for x in xs:
        r *= x
    return r


def bound(shape, kind, batch, plen, gen, bw_gbs, peak_gflops):
    """Best tok/s the limits allow for a case, and which limit binds."""
    # FLOP per attended position (q_dims: the layers' head dims summed)
    attn = 4 * shape["heads"] * shape.get("q_dims", shape["layers"] * shape["head_dim"])
    weights = (shape["body_params"] + shape["head_params"]) * BF16_BYTES
    bw, peak = bw_gbs * 1e9, peak_gflops * 1e9
    if kind == "prefill":
        read, per_row = _touched(shape, batch * plen)
        flops = batch * (2 * (shape["body_params"] + per_row) * plen + 2 * shape["head_params"] +
                         attn * plen * (plen + 1) / 2)
        t_mem, t_cmp = (weights + read * BF16_BYTES) / bw, flops / peak
        toks = batch * plen
    else:
        t_mem = t_cmp = 0.0
        read, per_row = _touched(shape, batch)
        for i in range(gen - 1):
            ctx = plen + 1 + i + 1  # positions attended by the token at position plen+1+i
            t_mem += (weights + read * BF16_BYTES + batch * ctx * shape["kv_bytes_per_token"]) / bw
            t_cmp += batch * (2 * (shape["body_params"] + per_row + shape["head_params"]) + attn * ctx) / peak
        toks = batch * (gen - 1)
    # a step cannot beat either limit; steps are summed, so this is the larger total
    t = max(t_mem, t_cmp)
    return {"tok_s": round(toks / t, 2), "binds": "bandwidth" if t_mem >= t_cmp else "bf16 compute",
            "mem_s": round(t_mem, 4), "compute_s": round(t_cmp, 4)}


def _moe_layer(work):
    """bench_moe's rows (the experts op alone at Qwen3-30B-A3B's layer), parsed."""
    rows = []
    p = work / "moe-layer.out"
    for line in (p.read_text().splitlines() if p.exists() else []):
        m = re.search(r"rows=\s*(\d+).*?([\d.]+) ms/layer \(med\s*([\d.]+)\).*?touched\s*([\d.]+) MB\s+([\d.]+) GB/s "
                      r"\(med\s*([\d.]+)\) \| read best\s*([\d.]+) med\s*([\d.]+) GB/s \|\s*(\d+)%", line)
        if m:
            keys = ("rows", "ms", "ms_med", "touched_mb", "gbs", "gbs_med", "read_gbs", "read_med", "pct")
            rows.append({k: float(v) for k, v in zip(keys, m.groups())})
    return rows


def moe_layer_lines(rows):
    """The MoE layer alone: where a MoE model's decode time goes."""
    if not rows:
        return []
    lines = ["### The experts op alone (Qwen3-30B-A3B's layer: 128 experts, top-8, hidden 2048, "
             "moe_intermediate 768, bf16; bench/bench_moe)", "",
             "| rows | ms per layer (best · median) | experts' bytes touched | GB/s | read GB/s beside | "
             "% of the read bound |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {int(r['rows'])} | {r['ms']:.2f} · {r['ms_med']:.2f} | {r['touched_mb']:.0f} MB | "
                     f"{r['gbs']:.1f} | {r['read_gbs']:.1f} | {int(r['pct'])}% |")
    return lines + ["", "The bound: the bytes of the experts the call's rows touch (uniform random routing, "
                        "the distinct experts counted) over a plain read of the same weights by the same threads, "
                        "alternated with the op; the rows of 512 are prefill, compute-bound.", ""]


# ---------------------------------------------------------------- merge

def serve_lines(sv, err):
    """The serving table: one client and N concurrent clients streaming from each server."""
    if not sv:
        return [f"Serving: not run or failed this run: {(err or 'no result').replace('|', '/')}", ""]
    lines = [f"**Serving** ({sv['model']}, bf16, {sv['threads']} threads; greedy streamed completions of "
             f"{sv['gen']} tokens; bench/bench_serve.py)", "",
             f"| server | 1 client tok/s | {sv['clients']} clients tok/s | × of 1 client | "
             f"time to first token, {sv['clients']} clients |", "|---|---|---|---|---|"]
    for name, label in (("hubrt", "hubrt serve (continuous batching)"),
                        ("hubrt-deterministic", "hubrt serve --deterministic (batch-invariant)"),
                        ("llama.cpp", "llama-cpp-python server (one request at a time)")):
        x = sv.get(name) or {}
        if "error" in x or not x:
            lines.append(f"| {label} | {x.get('error', 'not run')} | | | |")
        else:
            lines.append(f"| {label} | {x['single']['tok_s']} | {x['concurrent']['tok_s']} | {x['ratio']} | "
                         f"{x['concurrent']['ttft_s_mean']} s |")
    return lines + [""]


def merge(a):
    work, res_dir = Path(a.workdir), Path(a.results)
    pieces = collapse([json.loads(p.read_text()) for p in sorted(work.glob("case-*.json"))])
    limits = best_limits([_read_json(f) for f in sorted(work.glob("limits-*.json"))])
    meta = _read_json(work / "meta.json") or {}
    tok = _read_json(work / "tokenizer.json")
    serve = _read_json(work / "serve.json")
    bw = (limits.get("read_gbs") or {}).get("2")
    peak = (limits.get("bf16_peak_gflops") or {}).get("2")
    models = {}
    for name in meta.get("models", sorted({p["model"] for p in pieces})):
        d = ROOT / "fixtures" / name
        kept = _read_json(work / f"shape-{name}.json")  # a MoE shape deleted before the next one was written
        if not kept and not (d / "config.json").exists():
            continue
        shape = kept or model_shape(d)
        bounds = {}
        if bw and peak:
            for key, case, field, _ in METRICS:
                c = meta["cases"].get(case)
                if c is None:
                    continue
                kind = "prefill" if field == "prefill_tok_s" else "decode"
                bounds[key] = bound(shape, kind, c["batch"], c["prompt_len"], c["gen"], bw, peak)
        b1 = meta.get("cases", {}).get("b1")
        # what generation must hold: the weights and the b1 case's KV cache (the memory target's base)
        need = shape["checkpoint_bytes"] + (b1["prompt_len"] + b1["gen"]) * shape["kv_bytes_per_token"] if b1 else None
        models[name] = {"shape": shape, "bounds": bounds, "b1_weights_kv_mb": round(need / 2**20, 1) if need else None}
    table = {}
    for p in pieces:
        for key, case, field, _ in METRICS:
            if p["case"] != case:
                continue
            cell = {"value": p.get(field), "error": p.get("error")}
            if key == "prefill" and p["engine"] == "transformers-compile":
                cell["note"] = "eager prefill"
            table.setdefault(p["model"], {}).setdefault(p["engine"], {})[key] = cell
        if p["case"] == "b1":
            row = table.setdefault(p["model"], {}).setdefault(p["engine"], {})
            row["load_s"], row["peak_rss_mb"], row["compile_s"] = p.get("load_s"), p.get("peak_rss_mb"), p.get("compile_s")
            row["loadavg"] = (p.get("loadavg_before") or [None])[0]
            row["plans"] = {k: p[k] for k in ("compiles", "cache_hits", "disk_hits") if k in p}
    runs_of = {(p["model"], p["engine"], p["case"]): beside_runs(p) for p in pieces}
    for model, rows in table.items():
        for key, case, *_ in METRICS:
            peer_vals = [rows[e][key]["value"] for e in PEERS if e in rows and key in rows[e]
                         and rows[e][key]["value"] and not rows[e][key]["error"]]
            best = max(peer_vals) if peer_vals else None
            b = models.get(model, {}).get("bounds", {}).get(key)
            for e, row in rows.items():
                cell = row.get(key)
                if not cell or cell["value"] is None or cell["error"]:
                    continue
                cell["x_best_peer"] = round(cell["value"] / best, 3) if best else None
                cell["of_limit"] = round(cell["value"] / b["tok_s"], 4) if b else None
                if key.startswith("decode") and peak and model in models and case in meta.get("cases", {}):
                    cell["beside"] = of_limit_beside(models[model]["shape"], meta["cases"][case],
                                                     runs_of.get((model, e, case), []), peak)
    out = {"date_utc": meta.get("date_utc") or datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": meta.get("machine", {}), "settings": {k: meta.get(k) for k in ("threads", "dtype", "cases")},
           "versions": meta.get("versions", {}), "limits": limits, "models": models, "table": table,
           "tokenizer": tok, "tokenizer_error": None if tok else _last_line(work / "tokenizer.err"),
           "serve": serve, "serve_error": None if serve else _last_line(work / "serve.err"),
           "moe_layer": _moe_layer(work), "runs": [{k: v for k, v in p.items() if k != "stderr_tail"} for p in pieces],
           "elapsed_s": meta.get("elapsed_s"), "followups": meta.get("followups")}
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "latest.json").write_text(json.dumps(out, indent=1) + "\n")
    (res_dir / "latest.md").write_text(markdown(out))
    try:
        chart(out, res_dir / "latest.png")
    except Exception as e:  # matplotlib missing: the table still stands
        print(f"[bench] no chart: {e}", file=sys.stderr)
    print(f"[bench] wrote {res_dir}/latest.json, latest.md, latest.png", file=sys.stderr)


def collapse(pieces):
    """One piece per (model, case, engine). An engine run several times
    (bench/run.sh's BENCH_REPEATS, each round interleaved with the other
    engines' runs, so that a phase of the machine's memory bandwidth, which
    is bimodal on this VM, falls on all of them) gives the median of each
    tok/s figure over its successful runs, and the largest peak RSS; every
    run's figures stay in the piece as "repeats"."""
    groups = {}
    for p in pieces:
        groups.setdefault((p["model"], p["case"], p["engine"]), []).append(p)
    out = []
    for runs in groups.values():
        ok = [p for p in runs if not p.get("error")]
        if len(runs) == 1 or not ok:
            out.append(runs[0])
            continue
        merged = dict(ok[0], repeats={"runs": len(runs), "ok": len(ok)})
        for field in ("prefill_tok_s", "decode_tok_s"):
            vals = [p[field] for p in ok if p.get(field) is not None]
            if vals:
                merged[field] = round(statistics.median(vals), 2)
                merged["repeats"][field] = vals
        rss = [p["peak_rss_mb"] for p in ok if p.get("peak_rss_mb") is not None]
        if rss:
            merged["peak_rss_mb"] = max(rss)
        merged["beside"] = [b for p in ok for b in beside_runs(p)]
        out.append(merged)
    return out


def beside_runs(p):
    """A run's decode tok/s with the bandwidth probes read right before and after it ([] without them)."""
    if "beside" in p:
        return p["beside"]
    vals = (p.get("decode_tok_s"), p.get("read_gbs_before"), p.get("read_gbs_after"))
    return [list(vals)] if all(v is not None for v in vals) else []


# Probes beside a run that differ by more than this part of their mean: the bandwidth changed mode during it.
MODE_CHANGE = 0.2


def mode_changed(before, after):
    return abs(before - after) > MODE_CHANGE * (before + after) / 2


def of_limit_beside(shape, c, runs, peak):
    """A decode figure (case c) as a fraction of the bound the probes beside each run put on it: the median over
    the runs of tok/s / bound(mean of the run's two probes), leaving out runs during which the bandwidth
    changed mode (their probes' mean is no measure of what the run met) unless every run did. Also the
    probes, and how many runs were left out."""
    if not runs:
        return None
    steady = [r for r in runs if not mode_changed(r[1], r[2])] or runs
    fracs = [tok / bound(shape, "decode", c["batch"], c["prompt_len"], c["gen"], (b + a) / 2, peak)["tok_s"]
             for tok, b, a in steady]
    return {"of_limit": round(statistics.median(fracs), 4), "read_gbs": [[b, a] for _, b, a in runs],
            "left_out": len(runs) - len(steady)}


def best_limits(runs):
    """Each limit over the runs (start, middle and end of the benchmark). Read bandwidth: the median, since
    load from other processes lowers a probe and a probe on this VM has also read far high (53.8 GB/s on 2
    threads beside 33.0 and 34.2 in the same run), so the middle of three discards one outlier either way.
    Compute peak: the highest, since an FMA loop cannot run faster than the core does, only slower while
    another process holds it (the 2-thread probe read 136, 164 and 141 GFLOP/s in one run while 1 thread
    read 90-94); the median would put the compute-bound cases against a peak the machine beat."""
    runs = [r for r in runs if r]
    if not runs:
        return {}
    out = dict(runs[0], runs=runs)
    for key, pick in (("read_gbs", statistics.median), ("bf16_peak_gflops", max)):
        vals = {}
        for r in runs:
            for t, v in (r.get(key) or {}).items():
                if v is not None:
                    vals.setdefault(t, []).append(v)
        out[key] = {t: round(pick(v), 2) for t, v in vals.items()}
    return out


def _last_line(p):
    try:
        lines = [ln.strip() for ln in Path(p).read_text().splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1][:300] if lines else None


def _read_json(p):
    try:
        return json.loads(Path(p).read_text())
    except (OSError, ValueError):
        return None


def _fmt(v, digits=1):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def _frac(cell):
    """The fraction of the bound a cell shows: beside its own runs' probes where it has them."""
    return (cell.get("beside") or {}).get("of_limit", cell.get("of_limit"))


def _cell(cell, notes):
    if not cell:
        return "not run"
    if cell.get("error"):
        if cell["error"] not in notes:
            notes.append(cell["error"])
        return f"✗ [{notes.index(cell['error']) + 1}]"
    s = _fmt(cell["value"])
    extra = []
    if cell.get("x_best_peer") is not None:
        extra.append(f"{cell['x_best_peer']:.2f}×")
    f = _frac(cell)
    if f is not None:
        # above 100%: the limit was measured low (load from other work during its probe)
        extra.append(f"{100 * f:.0f}%" + ("§" if cell.get("beside") else "") + ("‡" if f > 1 else ""))
    if cell.get("note"):
        extra.append(cell["note"])
    return f"{s} ({' · '.join(extra)})" if extra else s


def _label(lab, cases):
    """"prefill 512" names the b1 case's prompt length, whatever the run used."""
    if lab.startswith("prefill") and "b1" in cases:
        return f"prefill {cases['b1']['prompt_len']}"
    return lab


def _repeats_line(r):
    """Which engines ran more than once, and how many times."""
    counts = {}
    for p in r.get("runs", []):
        n = (p.get("repeats") or {}).get("runs")
        if n:
            counts.setdefault(p["engine"], set()).add(n)
    if not counts:
        return ""
    engines = [e for e in ENGINES if e in counts]
    n = max(max(v) for v in counts.values())
    return (f" {', '.join(engines)}: the median of {n} runs per case, each round interleaved with the other "
            "engines' (every run's figures: latest.json, runs[].repeats).")


def markdown(r):
    m, lim = r["machine"], r["limits"]
    bw, peak = lim.get("read_gbs", {}), lim.get("bf16_peak_gflops", {})
    lines = [f"### Benchmark ({r['date_utc'][:10]}, {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
             f"{r['settings'].get('threads')} threads, bf16)", "",
             f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('mem_gb', '?')} GB RAM, "
             f"kernel {m.get('kernel', '?')}; run {r['date_utc']}, {_fmt(r.get('elapsed_s'), 0)} s; "
             f"load average at start {m.get('loadavg_start', '?')} (shared machine: absolute figures drift, "
             "ratios measured in the same run hold better)." +
             (f" Merged with follow-up runs: {r['followups']}." if r.get("followups") else ""),
             f"Limits measured in this run: read bandwidth {bw.get('1', '?')} GB/s (1 thread), "
             f"{bw.get('2', '?')} GB/s (2 threads); bf16 peak ({lim.get('bf16_unit', '?')}) "
             f"{_fmt(peak.get('1'), 0)} GFLOP/s (1), {_fmt(peak.get('2'), 0)} GFLOP/s (2) "
             "(of the measurements at the start, middle and end of the run: the median bandwidth, the "
             "highest peak).", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items()) + ".", "",
             "Cells: tokens/s (× the best peer · % of the bound the measured limits put on that case). "
             "Peers: transformers eager, transformers static cache + torch.compile, llama.cpp (BF16 GGUF). "
             "✗ [n]: the run failed, note n says why. Machine load: the 1-minute load average when the b1 run "
             "started (other work on the 2 cores; above ~0.5 the figures of that row are lowered by it)." +
             _repeats_line(r), ""]
    notes = []
    cases = r["settings"].get("cases") or {}
    order = [m for m in r["models"] if m in r["table"]] + [m for m in r["table"] if m not in r["models"]]
    for model in order:
        rows = r["table"][model]
        bounds = r["models"].get(model, {}).get("bounds", {})
        shape = r["models"].get(model, {}).get("shape", {})
        lines.append(f"**{model}** ({shape.get('params', 0) / 1e6:.0f}M parameters, "
                     f"{shape.get('checkpoint_bytes', 0) / 1e9:.2f} GB bf16)")
        lines.append("")
        need = r["models"].get(model, {}).get("b1_weights_kv_mb")
        hdr = ["engine"] + [_label(lab, cases) for *_, lab in METRICS] + [
            "compile s", "load s", "peak RSS MB" + (f" (× {need:,.0f} MB weights+KV)" if need else ""),
            "machine load"]
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))
        for e in ENGINES:
            if e not in rows:
                continue
            row = rows[e]
            cells = [e] + [_cell(row.get(k), notes) for k, *_ in METRICS]
            rss = row.get("peak_rss_mb")
            rss_s = _fmt(rss, 0) + (f" ({rss / need:.2f}×)" if rss and need else "")
            plans = row.get("plans") or {}
            comp = _fmt(row.get("compile_s"), 2) + (
                f" ({plans['compiles']} compiled, {plans.get('cache_hits', 0)} cache hits)" if "compiles" in plans else "")
            cells += [comp, _fmt(row.get("load_s"), 2), rss_s, _fmt(row.get("loadavg"), 1)]
            lines.append("| " + " | ".join(cells) + " |")
        if bounds:
            cells = ["*bound*"] + [f"{_fmt(bounds[k]['tok_s'])} ({bounds[k]['binds']})" if k in bounds else "-"
                                   for k, *_ in METRICS] + ["", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for key, case, *_ in METRICS:
            if not key.startswith("decode"):
                continue
            beside = [(e, rows[e][key]["beside"]) for e in ENGINES
                      if e in rows and (rows[e].get(key) or {}).get("beside")]
            if beside:
                lines.append(f"Bandwidth beside the {case} runs (GB/s, before-after): " + "; ".join(
                    f"{e} " + ", ".join(f"{b:.1f}-{a:.1f}" + ("~" if mode_changed(b, a) else "")
                                        for b, a in x["read_gbs"]) for e, x in beside) + ".")
                lines.append("")
    if cases:
        lines.append("Cases: " + "; ".join(
            f"{k}: batch {c['batch']}, prompt {c['prompt_len']}, {c['gen']} new tokens" for k, c in cases.items())
            + ". Prefill is from the b1 run; decode tok/s counts the tokens after the first.")
        lines.append("")
    tok = r.get("tokenizer")
    if tok and tok.get("models"):
        lines += [f"**Tokenizers** (single thread, {tok.get('doc_mb')} MB document; tokenizers "
                  f"{tok.get('tokenizers_version')})", "",
                  "| tokenizer | load s hubrt | load s tokenizers | encode doc MB/s hubrt | tokenizers | × | "
                  "encode lines MB/s hubrt | tokenizers | × | ids equal |", "|" + "---|" * 10]
        for name, t in tok["models"].items():
            ld, doc, ln = t["load_s"], t["encode_doc_mb_s"], t["encode_lines_mb_s"]
            lines.append(f"| {name} | {ld['hubrt']:.3f} | {ld['tokenizers']:.3f} | {doc['hubrt']:.2f} | "
                         f"{doc['tokenizers']:.2f} | {doc['hubrt'] / doc['tokenizers']:.2f} | {ln['hubrt']:.2f} | "
                         f"{ln['tokenizers']:.2f} | {ln['hubrt'] / ln['tokenizers']:.2f} | {t['ids_equal']} |")
        lines.append("")
    else:
        why = (r.get("tokenizer_error") or "no result").replace("|", "/")
        lines += [f"Tokenizers: the tokenizer benchmark failed this run: {why}", ""]
    lines += serve_lines(r.get("serve"), r.get("serve_error"))
    lines += moe_layer_lines(r.get("moe_layer"))
    cells = [c for rows in r["table"].values() for row in rows.values() for c in row.values() if isinstance(c, dict)]
    if any(c.get("beside") for c in cells):
        lines += ["§ A decode case is held against the read bandwidth probed right before and right after each of "
                  "its runs (the median over the runs of tok/s ÷ the bound at the mean of the run's two probes), "
                  "since this VM's bandwidth moves between two modes for minutes at a time; the *bound* row uses "
                  "the run's median probe. The probes beside each engine's runs are under \"Bandwidth beside the "
                  "... runs\"; ~ marks a run whose two probes differed by more than "
                  f"{100 * MODE_CHANGE:.0f}% (the mode changed during it), left out of the median unless every run "
                  "of the engine was.", ""]
    if any((_frac(c) or 0) > 1 for c in cells):
        lines += ["‡ Above 100% of the bound: the memory delivered more during that case than the median limit "
                  "probe measured (other work lowered the probes, or this VM's bandwidth was in its faster mode "
                  "then); the bound is then too low, not the engine faster than the hardware.", ""]
    if notes:
        lines.append("Notes:")
        lines.append("")
        for i, n in enumerate(notes, 1):
            lines.append(f"{i}. {n.replace('|', '/')}")
        lines.append("")
    return "\n".join(lines)


def chart(r, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = [m for m in r["models"] if m in r["table"]]
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(7 * max(1, len(models)), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = r["table"][model]
        engines = [e for e in ENGINES if e in rows
                   and any(_frac(rows[e].get(k) or {}) is not None for k, *_ in METRICS)]
        width = 0.8 / max(1, len(engines))
        for j, e in enumerate(engines):
            xs, ys, labels = [], [], []
            for i, (k, *_rest) in enumerate(METRICS):
                cell = rows[e].get(k) or {}
                if _frac(cell) is not None:
                    xs.append(i + (j - (len(engines) - 1) / 2) * width)
                    ys.append(100 * _frac(cell))
                    labels.append(_fmt(cell["value"]))
            bars = ax.bar(xs, ys, width, label=e, color=COLORS[ENGINES.index(e)])
            for b, lab in zip(bars, labels):
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), lab, ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(METRICS)), [_label(lab, r["settings"].get("cases") or {}) for *_, lab in METRICS])
        ax.set_ylabel("% of the bound from measured limits")
        ax.set_title(f"{model} (tok/s on bars)")
        ax.legend(fontsize=7)
    fig.suptitle(f"hubrt vs peers, {r['settings'].get('threads')} threads, bf16, {r['date_utc'][:10]}, "
                 f"{r['machine'].get('cpu', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case")
    for f in ("engine", "model", "case", "out"):
        c.add_argument(f"--{f}", required=True)
    c.add_argument("--timeout", type=float, default=600)
    c.add_argument("--probe", help="read-bandwidth probe to run before and after the case")
    c.add_argument("--probe-threads", type=int, default=2)
    c.add_argument("command", nargs=argparse.REMAINDER)
    m = sub.add_parser("merge")
    m.add_argument("workdir")
    m.add_argument("--results", default=str(ROOT / "bench" / "results"))
    s = sub.add_parser("shape", help="a checkpoint's shape as merge reads it, as JSON (kept before a MoE "
                                     "checkpoint is deleted)")
    s.add_argument("model_dir", type=Path)
    a = ap.parse_args()
    if a.cmd == "case":
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        run_case(a, cmd)
    elif a.cmd == "shape":
        print(json.dumps(model_shape(a.model_dir)))
    else:
        merge(a)


if __name__ == "__main__":
    main()
