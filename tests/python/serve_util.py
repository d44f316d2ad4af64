"""A `hubrt serve` process for tests: started on a free loopback port, its
stderr drained in a thread (the port is read from its first line), its
/metrics parsed, stopped with SIGTERM."""
import json
import re
import signal
import subprocess
import threading
import time

import requests

from hubrt_cli_util import CLI


class Server:
    def __init__(self, model, *args, timeout=120, ranks=1):
        """ranks > 1: the model split over that many ranks (hubrt launch -n
        ranks -- hubrt serve ... --tp ranks); rank 0 serves."""
        cmd = [CLI, "serve", str(model), "--port", "0", *map(str, args)]
        if ranks > 1:
            cmd = [CLI, "launch", "-n", str(ranks), "--", *cmd, "--tp", str(ranks)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err_lines = []
        self._ready = threading.Event()
        self.url = None
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(timeout) or not self.url:
            self.proc.kill()
            raise RuntimeError("hubrt serve did not start: " + "".join(self.err_lines))

    def _drain(self):
        for line in self.proc.stderr:
            self.err_lines.append(line)
            m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if m and not self.url:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def post(self, path, body, **kw):
        return requests.post(self.url + path, json=body, timeout=kw.pop("timeout", 120), **kw)

    def metrics(self):
        text = requests.get(self.url + "/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def sse_events(resp):
    """The data payloads of a server-sent event stream, in order ("[DONE]" kept as is)."""
    out = []
    for line in resp.iter_lines(decode_unicode=False):
        if line.startswith(b"data: "):
            data = line[6:].decode("utf-8")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_text(events, chat):
    """The text of a stream's chunks, and its finish reason."""
    text, finish = "", None
    for ev in events:
        if ev == "[DONE]" or not ev["choices"]:
            continue
        c = ev["choices"][0]
        text += (c["delta"].get("content") or "") if chat else c["text"]
        finish = c["finish_reason"] or finish
    return text, finish


def wait_until(fn, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.05)
    return fn()


def run_parallel(fn, n, timeout=300):
    """fn(i) for i in range(n), each on its own thread; the (i, error) pairs of those that raised."""
    errors = []

    def call(i):
        try:
            fn(i)
        except Exception as e:  # noqa: BLE001 - returned with the caller's index
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return errors
