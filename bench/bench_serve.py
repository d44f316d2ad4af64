"""Serving throughput: one client, then N concurrent clients, each streaming
completions (greedy, a fixed prompt of about P tokens, G new tokens) from
an OpenAI-compatible server on loopback; aggregate generated tokens per
second of wall time, and the ratio of N clients to one. hubrt serve on the
bf16 checkpoint folder beside llama-cpp-python's server
(python -m llama_cpp.server) on the BF16 GGUF that llama.cpp's converter made
of it, same threads. Prints one JSON line.

    bench_serve.py --hubrt BUILD/hubrt --model DIR [--gguf FILE] [--clients 8] [--threads 2] [--logs DIR]
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import requests

PROMPT = ("The history of the printing press begins in the fifteenth century, when movable type changed how "
          "books were made and how ideas travelled across Europe. In a few words,")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, timeout=300):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if requests.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not start")


def one_stream(url, model, gen, out, i):
    body = {"model": model, "prompt": PROMPT, "max_tokens": gen, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, pieces, usage = None, 0, None
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                pieces += 1
                first = first or time.perf_counter()
    out[i] = {"tokens": (usage or {}).get("completion_tokens", pieces), "ttft_s": (first or t0) - t0,
              "total_s": time.perf_counter() - t0}


def round_of(url, model, n, gen):
    out = [None] * n
    threads = [threading.Thread(target=one_stream, args=(url, model, gen, out, i)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(o["tokens"] for o in out)
    return {"clients": n, "tokens": tokens, "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 1),
            "ttft_s_mean": round(sum(o["ttft_s"] for o in out) / n, 3)}


def measure(cmd, env, url, model, clients, gen, log):
    with open(log, "w") as f:  # a file: a pipe nobody reads fills with llama.cpp's load log and stalls it
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc)
        round_of(url, model, 1, 8)  # warm-up
        single = round_of(url, model, 1, gen)
        many = round_of(url, model, clients, gen)
        return {"single": single, "concurrent": many, "ratio": round(many["tok_s"] / single["tok_s"], 2)}
    except Exception as e:  # noqa: BLE001 - recorded in the report instead of ending the run
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hubrt", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--logs", default=".", help="folder for the servers' logs")
    a = ap.parse_args()
    env = dict(os.environ, HUBRT_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    res = {"model": os.path.basename(a.model.rstrip("/")), "clients": a.clients, "gen": a.gen,
           "threads": a.threads}
    port = free_port()
    res["hubrt"] = measure([a.hubrt, "serve", a.model, "--port", str(port), "--slots", str(a.clients), "--ctx",
                            "512", "--dtype", "bf16", "--model-name", "m"], env, f"http://127.0.0.1:{port}",
                           "m", a.clients, a.gen, os.path.join(a.logs, "serve-hubrt.log"))
    port = free_port()
    res["hubrt-deterministic"] = measure([a.hubrt, "serve", a.model, "--port", str(port), "--slots", str(a.clients),
                                          "--ctx", "512", "--dtype", "bf16", "--model-name", "m", "--deterministic"],
                                         env, f"http://127.0.0.1:{port}", "m", a.clients, a.gen,
                                         os.path.join(a.logs, "serve-hubrt-deterministic.log"))
    if a.gguf and os.path.exists(a.gguf):
        port = free_port()
        res["llama.cpp"] = measure([sys.executable, "-m", "llama_cpp.server", "--model", a.gguf, "--model_alias",
                                    "m", "--host", "127.0.0.1", "--port", str(port), "--interrupt_requests", "False",
                                    "--n_threads", str(a.threads),
                                    "--n_threads_batch", str(a.threads), "--n_ctx", "2048"], env,
                                   f"http://127.0.0.1:{port}", "m", a.clients, a.gen,
                                   os.path.join(a.logs, "serve-llama.cpp.log"))
    else:
        res["llama.cpp"] = {"error": "no GGUF of the model"}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
