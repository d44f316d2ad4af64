"""PJRT backend from the outside: a missing plugin, HUBRT_DUMP_DIR and
HUBRT_LAUNCH_BLOCKING, the CPU fallback warning, `hubrt info` and the
per-chip environment `hubrt launch` gives each child. Each case runs in a
fresh process because plugins, warnings and settings are per process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hubrt
from hubrt._lib import HubrtError

LIB = os.environ.get("HUBRT_LIBRARY", "")
CLI = os.path.join(os.path.dirname(LIB), "hubrt") if LIB else ""


def plugin_available():
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
        return True, ""
    except HubrtError as e:
        return False, str(e)


def need_plugin():
    ok, why = plugin_available()
    if not ok:
        pytest.skip(f"xla_cpu PJRT plugin unavailable (pip install xla-cpu-pjrt): {why}")


def need_cli():
    if not CLI or not os.path.exists(CLI):
        pytest.skip(f"the hubrt command is not built next to HUBRT_LIBRARY ({CLI or 'unset'})")


def run_python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)


def test_missing_plugin_lists_paths_searched():
    need_cli()
    env = dict(os.environ, HUBRT_PJRT_PLUGIN="/nonexistent/dir/xla_cpu_pjrt.so")
    r = subprocess.run([CLI, "info"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.strip().startswith("xla_cpu:")]
    assert line and "unavailable" in line[0], r.stdout
    assert "paths searched" in r.stdout and "/nonexistent/dir/xla_cpu_pjrt.so" in r.stdout
    r = run_python("import hubrt, numpy as np\n"
                   "try:\n    hubrt.from_numpy(np.zeros(2, np.float32)).to('xla_cpu')\n"
                   "except hubrt._lib.HubrtError as e:\n    print('ERR', e)\n",
                   HUBRT_PJRT_PLUGIN="/nonexistent/dir/xla_cpu_pjrt.so")
    assert r.returncode == 0, r.stderr
    assert "ERR" in r.stdout and "xla_cpu" in r.stdout


def test_info_lists_pjrt_devices_with_api_version():
    need_plugin()
    need_cli()
    r = subprocess.run([CLI, "info", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    xla = [p for p in info["pjrt"] if p["backend"] == "xla_cpu"][0]
    assert xla["available"] and xla["platform"] == "cpu" and xla["devices"] >= 1
    major, minor = map(int, xla["api_version"].split("."))
    assert major == 0 and minor >= 1
    tpu = [p for p in info["pjrt"] if p["backend"] == "tpu"][0]
    assert tpu["available"] or "paths searched" in tpu["error"]


def test_dump_dir_and_launch_blocking(tmp_path):
    need_plugin()
    code = ("import hubrt, numpy as np\n"
            "x = hubrt.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3)).to('xla_cpu')\n"
            "y = hubrt.ops.add(x, x); y = hubrt.ops.add(x, x)\n"
            "print(y.numpy().ravel().tolist())\n")
    r = run_python(code, HUBRT_DUMP_DIR=str(tmp_path), HUBRT_LAUNCH_BLOCKING="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == str([0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
    dumps = sorted(p.name for p in tmp_path.iterdir())
    adds = [d for d in dumps if d.startswith("add-")]
    assert len(adds) == 1, dumps  # the second add hit the cache: no second dump
    text = (tmp_path / adds[0]).read_text()
    assert "stablehlo.add" in text and "func.func public @main" in text


def test_unlowerable_op_falls_back_with_one_warning():
    need_plugin()
    # An integer clamp bound beyond int64 has no device lowering.
    code = ("import hubrt, numpy as np\n"
            "x = hubrt.from_numpy(np.array([-5, 0, 7], dtype=np.int64)).to('xla_cpu')\n"
            "for _ in range(2):\n"
            "    y = hubrt.ops.clamp(x, min=-1e19, max=3)\n"
            "print(y.device, y.numpy().tolist())\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "xla_cpu:0 [-5, 0, 3]"
    warnings = [l for l in r.stderr.splitlines() if "not supported on device 'xla_cpu'" in l]
    assert len(warnings) == 1 and "'clamp'" in warnings[0], r.stderr


def test_launch_gives_each_child_its_chip(tmp_path):
    need_cli()
    dump = ("import json, os; keys = ('TPU_VISIBLE_CHIPS', 'TPU_PROCESS_BOUNDS', 'TPU_CHIPS_PER_PROCESS_BOUNDS', "
            "'TPU_PROCESS_ADDRESSES', 'TPU_PROCESS_PORT', 'CLOUD_TPU_TASK_ID'); "
            f"json.dump({{k: os.environ.get(k) for k in keys}}, open(os.path.join({str(tmp_path)!r}, "
            "os.environ['CLOUD_TPU_TASK_ID'] + '.json'), 'w'))")
    r = subprocess.run([CLI, "launch", "--nproc", "4", "--port", "9100", "--", sys.executable, "-c", dump],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    addresses = "localhost:9100,localhost:9101,localhost:9102,localhost:9103"
    for rank in range(4):
        env = json.loads((tmp_path / f"{rank}.json").read_text())
        assert env == {"TPU_VISIBLE_CHIPS": str(rank), "TPU_PROCESS_BOUNDS": "2,2,1",
                       "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_ADDRESSES": addresses,
                       "TPU_PROCESS_PORT": str(9100 + rank), "CLOUD_TPU_TASK_ID": str(rank)}


def test_launch_errors():
    need_cli()
    r = subprocess.run([CLI, "launch", "--nproc", "2", "--", "sh", "-c", 'exit $((3 * CLOUD_TPU_TASK_ID))'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "process 1 exited with status 3" in r.stderr
    r = subprocess.run([CLI, "launch", "--nproc", "3", "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "X*Y*Z = 3" in r.stderr
    r = subprocess.run([CLI, "launch", "--nproc", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no command" in r.stderr
    r = subprocess.run([CLI, "launch", "--nproc", "1", "--", "/nonexistent/cmd"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 127 and "cannot run '/nonexistent/cmd'" in r.stderr


STATS_CODE = """
import ctypes, hubrt, numpy as np
from hubrt._lib import fn
class Stats(ctypes.Structure):
    _fields_ = [("requests", ctypes.c_int64), ("hits", ctypes.c_int64), ("misses", ctypes.c_int64),
                ("compile_seconds", ctypes.c_double), ("disk_hits", ctypes.c_int64),
                ("graph_misses", ctypes.c_int64), ("graph_runs", ctypes.c_int64), ("in_place", ctypes.c_int64)]
x = hubrt.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4)).to("xla_cpu")
y = hubrt.ops.softmax(hubrt.ops.mul(x, x.transpose(0, 1).transpose(0, 1)), dim=-1)
s = Stats()
assert fn("hr_pjrt_cache_stats_get", [ctypes.c_char_p, ctypes.POINTER(Stats)])(b"xla_cpu", ctypes.byref(s)) == 0
print(s.misses, s.disk_hits, np.round(y.numpy()[2], 5).tolist())
"""


def test_disk_cache_across_processes(tmp_path):
    need_plugin()
    env = {"HUBRT_CACHE_DIR": str(tmp_path)}
    first = run_python(STATS_CODE, **env)
    assert first.returncode == 0, first.stderr
    misses, disk_hits, row = first.stdout.split(" ", 2)
    assert int(misses) >= 2 and int(disk_hits) == 0
    entries = sorted((tmp_path / "pjrt").iterdir())
    assert len(entries) == int(misses)
    second = run_python(STATS_CODE, **env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"{misses} {misses} {row}"  # every module loaded, none compiled
    # A damaged entry is ignored with a warning and rebuilt, never trusted.
    data = bytearray(entries[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    entries[0].write_bytes(bytes(data))
    third = run_python(STATS_CODE, **env)
    assert third.returncode == 0, third.stderr
    assert third.stdout == f"{misses} {int(misses) - 1} {row}"
    assert "PJRT disk cache: ignoring" in third.stderr
    fourth = run_python(STATS_CODE, **env)  # the rebuilt entry loads again
    assert fourth.returncode == 0 and "ignoring" not in fourth.stderr
    assert fourth.stdout == f"{misses} {misses} {row}"
    off = run_python(STATS_CODE, HUBRT_CACHE="0", HUBRT_CACHE_DIR=str(tmp_path / "off"))
    assert off.returncode == 0 and not (tmp_path / "off").exists()


def test_bf16_writes_move_bits(tmp_path):
    """A bf16 KV-cache write lowers to a scatter and a dynamic_update_slice
    on the bits (i16): XLA's CPU compiler widens bf16 data movement to f32,
    which for a write into one layer's slice widened the whole flat cache
    and narrowed it back. A transposed output with a size-1 dim
    (attention's [b, h, s, d] stored as [b, s, h, d]) is one transpose and
    dynamic_update_slice, not a per-element scatter."""
    need_plugin()
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r})\n"
            "import torch, hubrt\n"
            "from oracle import to_hr, to_torch\n"
            "dev = lambda t: to_hr(t).to('xla_cpu')\n"
            "g = torch.Generator().manual_seed(0)\n"
            "cache = torch.zeros(2, 1, 3, 8, 4, dtype=torch.bfloat16)  # [layer, b, kv head, slot, d]\n"
            "c = dev(cache)\n"
            "step = torch.randn(1, 3, 1, 4, generator=g).to(torch.bfloat16)\n"
            "hubrt.ops.index_copy_(c.select(0, 1), 2, dev(torch.tensor([5])), dev(step))\n"
            "cache[1].index_copy_(2, torch.tensor([5]), step)\n"
            "assert torch.equal(to_torch(c.to('cpu')), cache)\n"
            "x = torch.randn(1, 3, 4, 2, generator=g).to(torch.bfloat16)  # [b, h, s, d]\n"
            "out = dev(torch.zeros(1, 4, 3, 2, dtype=torch.bfloat16))  # [b, s, h, d]\n"
            "hubrt.ops.call('add', dev(x), dev(x), out=out.transpose(1, 2))\n"
            "assert torch.equal(to_torch(out.to('cpu')), (x + x).transpose(1, 2))\n"
            "print('ok')\n")
    r = run_python(code, HUBRT_DUMP_DIR=str(tmp_path), HUBRT_CACHE="0")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    texts = {p.name: p.read_text() for p in tmp_path.iterdir()}
    moves = [line for t in texts.values() for line in t.splitlines()
             if "dynamic_update_slice" in line or "scatter_dimension_numbers" in line]
    assert any("scatter_dimension_numbers" in line for line in moves), sorted(texts)
    for line in moves:
        assert "xi16>" in line and "bf16>" not in line, line
    adds = [t for n, t in texts.items() if n.startswith("add-")]
    assert len(adds) == 1 and "stablehlo.scatter" not in adds[0], sorted(texts)
