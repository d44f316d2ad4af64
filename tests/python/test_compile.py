"""The compiled forward (issue 6): token-identical greedy generation to
eager and to transformers in float32, bf16 logits within the model
tolerances, the expected number of compiles (one per prefill bucket plus
the decode step), zero compiles on a second identical run, plans found on
disk by a new process, and the CLI's --compile/--stats. The CPU passes:
fused plans generate what unfused ones do, and attention over a static
cache skips the key blocks its mask hides without changing the result."""
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM as HFModel

import hubrt
from cpu_isa import isa  # noqa: F401 (fixture)
from hubrt._lib import lib
from oracle import TORCH_DTYPE, assert_close, hr_noncontig, to_hr

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
CLI = os.environ.get("HUBRT_CLI", str(Path(os.environ.get("HUBRT_LIBRARY", ROOT / "build" / "x")).parent / "hubrt"))


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures(tmp_path_factory):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny"], check=True,
                   capture_output=True)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "cache"))
    hubrt.reset_compile_stats()


def buckets(n, chunk=512):
    """Power-of-two prefill chunks, as hr_generate takes them with compile."""
    out = []
    while n:
        p = 1 << (min(n, chunk).bit_length() - 1)
        out.append(p)
        n -= p
    return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-qwen2", "tiny-llama-gqa7", "tiny-mistral-window"])
def test_static_cache_generation_matches_eager_and_transformers(name):
    ids = np.random.default_rng(3).integers(3, 500, (1, 37))
    m = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32")
    eager = m.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=[])
    static = m.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=[], cache_implementation="static")
    np.testing.assert_array_equal(static, eager)
    hf = HFModel.from_pretrained(FIX / name, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    want = hf.generate(torch.tensor(ids), max_new_tokens=64, do_sample=False).numpy()
    np.testing.assert_array_equal(static, want)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-mistral-window"])
def test_batch_with_left_padding_matches_eager(name):
    ids = np.random.default_rng(5).integers(3, 500, (4, 12))
    mask = np.ones_like(ids)
    for row, npad in enumerate([0, 3, 5, 11]):
        ids[row, :npad] = 0
        mask[row, :npad] = 0
    m = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32")
    eager = m.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=[])
    static = m.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=[],
                        cache_implementation="static")
    np.testing.assert_array_equal(static, eager)


def test_bf16_compiled_agrees_with_eager():
    ids = np.random.default_rng(7).integers(3, 500, (2, 40))
    m = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-qwen3-bf16-trained", dtype="bfloat16")
    eager = m.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=[])
    static = m.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=[], cache_implementation="static")
    assert (static == eager).mean() >= 0.99


def test_compiles_once_per_bucket_and_replays():
    """A 256-token static-cache generation compiles one plan per prefill
    bucket and one decode step, and nothing on a second identical run."""
    prompt = 45  # buckets 32, 8, 4, 1: the 1-token bucket is the decode step's shape
    ids = np.random.default_rng(11).integers(3, 500, (1, prompt))
    m = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama", dtype="float32")
    first = m.generate(ids, max_new_tokens=256, do_sample=False, eos_token_id=[], cache_implementation="static")
    st = hubrt.compile_stats()
    expected = len(set(buckets(prompt)) | {1})
    assert st["compiles"] == expected, st
    assert st["requests"] == len(buckets(prompt)) + 255
    again = m.generate(ids, max_new_tokens=256, do_sample=False, eos_token_id=[], cache_implementation="static")
    np.testing.assert_array_equal(first, again)
    st2 = hubrt.compile_stats()
    assert st2["compiles"] == expected, "the second identical run compiled again"
    assert st2["hits"] == st["hits"] + len(buckets(prompt)) + 255


def run_cli(*args, env=None):
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=600)


def test_new_process_finds_plans_on_disk(tmp_path):
    env = dict(os.environ, HUBRT_CACHE_DIR=str(tmp_path / "disk"))
    args = ["bench", str(FIX / "tiny-qwen3"), "--prompt-len", "24", "--gen", "16", "--compile"]
    first = run_cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    a = json.loads(first.stdout.strip().splitlines()[-1])
    assert a["compile"] is True and a["compiles"] > 0 and a["disk_hits"] == 0
    second = run_cli(*args, env=env)
    assert second.returncode == 0, second.stderr
    b = json.loads(second.stdout.strip().splitlines()[-1])
    assert b["compiles"] == 0 and b["disk_hits"] == a["compiles"], (a, b)
    # the warm-up ran the measured shapes: the timed run replays plans in memory
    assert a["timed_misses"] == 0 and b["timed_misses"] == 0, (a, b)


def test_disk_key_build_id_is_the_linkers():
    """Plans on disk are keyed by the library's GNU build ID (a development
    build keeps its version string); it must be the one readelf reads."""
    fn_ = lib.hr_build_id
    fn_.restype = ctypes.c_char_p
    out = subprocess.run(["readelf", "-n", lib._name], capture_output=True, text=True, check=True).stdout
    want = [line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID:" in line]
    assert len(want) == 1 and len(want[0]) == 40, out
    assert fn_().decode() == want[0]


def test_cli_run_compile_stats_and_same_text(tmp_path):
    env = dict(os.environ, HUBRT_CACHE_DIR=str(tmp_path / "disk"))
    base = ["run", str(FIX / "tiny-qwen3-tok"), "-p", "The quick brown fox", "-n", "24", "--greedy"]
    eager = run_cli(*base, env=env)
    compiled = run_cli(*base, "--compile", "--stats", env=env)
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr
    assert compiled.stdout == eager.stdout
    assert "compile cache:" in compiled.stderr and "compiled" in compiled.stderr


def test_corrupt_disk_entries_are_rebuilt(tmp_path):
    env = dict(os.environ, HUBRT_CACHE_DIR=str(tmp_path / "disk"))
    args = ["bench", str(FIX / "tiny-llama"), "--prompt-len", "8", "--gen", "4", "--compile"]
    assert run_cli(*args, env=env).returncode == 0
    for path in (tmp_path / "disk").glob("*.hrplan"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    again = run_cli(*args, env=env)
    assert again.returncode == 0, again.stderr
    res = json.loads(again.stdout.strip().splitlines()[-1])
    assert res["compiles"] > 0 and res["disk_hits"] == 0
    assert "checksum mismatch" in again.stderr


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.mark.parametrize("count_at", [16, "tensors"])
def test_hostile_disk_entry_counts_are_bounded_by_its_bytes(tmp_path, count_at):
    """An entry with a valid header and checksum whose counts claim 2^24
    values (or 2^26 tensors) in a few bytes: rejected before any table is
    allocated by the claim, and rebuilt."""
    env = dict(os.environ, HUBRT_CACHE_DIR=str(tmp_path / "disk"))
    args = ["bench", str(FIX / "tiny-llama"), "--prompt-len", "8", "--gen", "4", "--compile"]
    assert run_cli(*args, env=env).returncode == 0
    for path in (tmp_path / "disk").glob("*.hrplan"):
        data = path.read_bytes()
        head, payload = bytearray(data[:40]), data[40:]
        if count_at == 16:  # n_in, n_out kept; the value count
            payload = payload[:16] + ((1 << 24) - 1).to_bytes(8, "little") + bytes(64)
        else:  # no values, then the tensor count
            payload = payload[:16] + bytes(8) + ((1 << 26) - 1).to_bytes(8, "little") + bytes(64)
        head[24:32] = len(payload).to_bytes(8, "little")
        head[32:40] = fnv1a(payload).to_bytes(8, "little")
        path.write_bytes(bytes(head) + payload)
    again = run_cli(*args, env=env)
    assert again.returncode == 0, again.stderr
    res = json.loads(again.stdout.strip().splitlines()[-1])
    assert res["compiles"] > 0 and res["disk_hits"] == 0
    assert ("header counts" if count_at == 16 else "malformed tensor count") in again.stderr, again.stderr


def test_static_cache_argument_is_checked():
    m = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama", dtype="float32")
    with pytest.raises(ValueError, match="cache_implementation"):
        m.generate(np.array([[5, 6]]), max_new_tokens=2, cache_implementation="offloaded")


@pytest.mark.parametrize("name,batch", [("tiny-llama-bias", 1), ("tiny-qwen3", 3), ("tiny-llama-gqa7", 4)])
def test_fused_plans_generate_what_unfused_plans_do(name, batch, monkeypatch, isa):
    """By default decode rows fuse (q/k/v and gate/up in one pass, silu_mul
    and, in plans, the residual add in the epilogue), eager and compiled;
    with HUBRT_FUSE=0 every op runs on its own. Decode batches up to 4 rows
    fuse; float32 greedy tokens agree across all four."""
    ids = np.random.default_rng(13).integers(3, 500, (batch, 21))
    args = dict(max_new_tokens=40, do_sample=False, eos_token_id=[])
    monkeypatch.delenv("HUBRT_FUSE", raising=False)
    fused = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32")
    got = fused.generate(ids, cache_implementation="static", **args)
    got_eager = fused.generate(ids, **args)
    monkeypatch.setenv("HUBRT_FUSE", "0")
    plain = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32")
    want = plain.generate(ids, cache_implementation="static", **args)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_eager, want)
    np.testing.assert_array_equal(got, plain.generate(ids, **args))


def test_fused_bf16_plans_agree_with_eager(monkeypatch):
    """bf16 rows (up to 4) fuse too; greedy tokens as the existing bf16
    check asks of compiled plans."""
    monkeypatch.delenv("HUBRT_FUSE", raising=False)
    ids = np.random.default_rng(7).integers(3, 500, (2, 40))
    m = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-qwen3-bf16-trained", dtype="bfloat16")
    eager = m.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=[])
    static = m.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=[], cache_implementation="static")
    assert (static == eager).mean() >= 0.99


def masked_reference(q, k, v, keep):
    """torch's sdpa with a boolean mask; rows the mask hides entirely are
    zeros in hubrt (NaN in torch)."""
    rep = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1), attn_mask=keep)
    return out.nan_to_num(0.0)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("s,hq,hkv", [(1, 4, 2), (5, 4, 4), (1, 7, 1), (5, 6, 2)])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_skips_masked_key_blocks(dtype, s, hq, hkv, kind, isa):
    """A static cache of 300 slots (five 64-key blocks) with each row
    seeing a prefix of a different length, one row seeing nothing and one
    row seeing only a window in the middle: blocks no row of a query block
    sees are skipped, the output is torch's. Up to 8 (query, head) rows
    per kv head take the direct decode path (in two key splits where a
    thread has at most one kv head, as 2 and 1 on two threads), more the
    blocked one."""
    t, d, b = 300, 64, 3
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(*sh, generator=g).to(TORCH_DTYPE[dtype])
               for sh in ((b, hq, s, d), (b, hkv, t, d), (b, hkv, t, d)))
    keep = torch.zeros(b, 1, s, t, dtype=torch.bool)
    for i in range(s):
        keep[0, 0, i, : 40 + i] = True  # a filled cache prefix, causal inside it
        keep[2, 0, i, 130 + i: 200] = True  # only the middle blocks
    # batch 1 sees nothing at all
    want = masked_reference(q, k, v, keep)
    if kind == "bool":
        mask = to_hr(keep)
    else:
        mask = to_hr(torch.zeros(keep.shape).masked_fill(~keep, float("-inf")).to(TORCH_DTYPE[dtype]))
    got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), mask)
    assert torch.all(want[1] == 0)
    assert_close(got, want)


# ---- compiled Python functions: a ctypes hr_jit over hubrt.ops -------------------

_JIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)


class _JitOptions(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("fn", _JIT_FN), ("ctx", ctypes.c_void_p), ("resolve", ctypes.c_void_p),
                ("resolve_ctx", ctypes.c_void_p), ("fingerprint", ctypes.c_uint64), ("fold_constants", ctypes.c_bool)]


class Jit:
    """hr_jit over a Python function of hubrt Tensors returning a tuple."""

    def __init__(self, fn, n_out):
        self.n_out = n_out

        def trampoline(ctx, ins, n_in, outs, n_out):
            args = []
            for i in range(n_in):
                h = ctypes.c_void_p()
                if lib.hr_tensor_alias(ctypes.c_void_p(ins[i]), ctypes.byref(h)):
                    return 1
                args.append(hubrt.Tensor(h))
            for i, r in enumerate(fn(*args)):
                outs[i] = r.handle.value
                r._h = ctypes.c_void_p()  # the jit owns it now
            return 0

        self._cb = _JIT_FN(trampoline)
        self._opts = _JitOptions(name=b"py_chain", fn=self._cb)
        self._h = ctypes.c_void_p()
        assert lib.hr_jit_create(ctypes.byref(self._opts), ctypes.byref(self._h)) == 0

    def __call__(self, *inputs):
        ins = (ctypes.c_void_p * len(inputs))(*[t.handle.value for t in inputs])
        outs = (ctypes.c_void_p * self.n_out)()
        assert lib.hr_jit_call(self._h, ins, len(inputs), outs, self.n_out) == 0, lib.hr_last_error()
        return [hubrt.Tensor(ctypes.c_void_p(outs[i])) for i in range(self.n_out)]

    def __del__(self):
        lib.hr_jit_free(self._h)


lib.hr_jit_free.argtypes = [ctypes.c_void_p]
lib.hr_tensor_alias.argtypes = [ctypes.c_void_p, ctypes.c_void_p]


def chain_hr(x, row, col, reread):
    """Six elementwise ops and a cast; with reread the second intermediate
    is also returned, through a neg after the chain."""
    ops = hubrt.ops
    a = ops.call("mul", x, row)
    b = ops.call("sub", col, a)
    c = ops.scale(b, 0.75, 0.5)
    d = ops.call("maximum", c, x)
    e = ops.clamp(d, -0.3, 0.9)
    f = ops.call("mul", e, e)
    g = ops.cast(f, "f32" if x.dtype != "f32" else "bf16")
    return (g, ops.call("neg", b)) if reread else (g,)


def chain_torch(x, row, col):
    b = col - x * row
    e = torch.clamp(torch.maximum(b * 0.75 + 0.5, x), -0.3, 0.9)
    return (e * e).to(torch.float32 if x.dtype != torch.float32 else torch.bfloat16)


def replayed(fn, reread, ins):
    """The second call of a Jit over fn: the first returns its capture's
    eager outputs, the second replays the plan."""
    jit = Jit(lambda *a: fn(*a, reread), 1 + reread)
    jit(*ins)
    return jit(*ins)


def chains_built(capfd):
    """Chain nodes of the plans built since the last call (the CPU plan
    passes' debug log: "cpu plan: L linear groups, C chains, ...")."""
    err = capfd.readouterr().err
    return [int(line.split(", ")[1].split(" chains")[0]) for line in err.splitlines() if "] cpu plan:" in line]


def chain_hr_transcendental(x, row, col, reread):
    """Seven elementwise ops with a transcendental in each but the sub:
    sigmoid, silu_mul by a row, sub from a column, exp, log, tanh-gelu,
    gelu_mul by x; with reread the second intermediate is also returned."""
    ops = hubrt.ops
    a = ops.call("sigmoid", x)
    b = ops.call("silu_mul", a, row)
    c = ops.call("sub", col, b)
    d = ops.call("exp", c)
    e = ops.call("log", d)
    f = ops.gelu(e, "tanh")
    g = ops.gelu_mul(f, x)
    return (g, ops.call("neg", b)) if reread else (g,)


def chain_torch_transcendental(x, row, col):
    F = torch.nn.functional
    b = F.silu(torch.sigmoid(x)) * row
    e = torch.log(torch.exp(col - b))
    return F.gelu(F.gelu(e, approximate="tanh")) * x


CHAINS = {"exact": (chain_hr, chain_torch), "transcendental": (chain_hr_transcendental, chain_torch_transcendental)}


@pytest.mark.parametrize("kind", ["exact", "transcendental"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("rows,h", [(1, 17), (3, 4097), (17, 33), (1, 100003)])
@pytest.mark.parametrize("contig", [True, False])
def test_eltwise_chain_fusion_matches_unfused_and_torch(kind, dtype, rows, h, contig, isa, capfd, monkeypatch):
    """A chain's replay gives the unfused plan's and eager's bytes. Each
    element of a fused exp/silu/gelu goes through the vector code or the
    scalar tail as in the unfused kernel's calls (the row of 100003, on
    three threads, is split between them at odd columns)."""
    fn, reference = CHAINS[kind]
    monkeypatch.setenv("HUBRT_CACHE", "0")
    g = torch.Generator().manual_seed(rows * h)
    x = torch.randn(rows, h, generator=g).to(TORCH_DTYPE[dtype])
    row = (torch.rand(h, generator=g) + 0.5).to(TORCH_DTYPE[dtype])
    col = torch.randn(rows, 1, generator=g).to(TORCH_DTYPE[dtype])
    hx = to_hr(x) if contig else hr_noncontig(to_hr(x))
    ins = (hx, to_hr(row), to_hr(col))
    level, threads = lib.hr_log_get_level(), lib.hr_num_threads()
    lib.hr_log_set_level(0)
    lib.hr_set_num_threads(3)
    try:
        capfd.readouterr()
        fused = [replayed(fn, reread, ins) for reread in (False, True)]
        assert chains_built(capfd) == [1, 2]  # the re-read intermediate splits the chain
        monkeypatch.setenv("HUBRT_FUSE_CHAINS", "0")
        plain = [replayed(fn, reread, ins) for reread in (False, True)]
        assert chains_built(capfd) == [0, 0]
        eager = [fn(*ins, reread) for reread in (False, True)]
    finally:
        lib.hr_log_set_level(level)
        lib.hr_set_num_threads(threads)
    for f, p, e in zip(fused, plain, eager):
        for a, b, c in zip(f, p, e):
            assert a.numpy(raw=True).tobytes() == b.numpy(raw=True).tobytes() == c.numpy(raw=True).tobytes()
    assert_close(fused[0][0], reference(x, row, col), dtype=dtype)  # exact: bf16/f16 until the cast


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_replays_reuse_freed_outputs_and_leave_held_ones_alone(dtype):
    """A replay writes into the previous replay's outputs only once the
    caller has let go of them: a held output (or a view of one) keeps its
    values through later replays, whether its buffer is its own mapping
    (4 MiB and more) or the heap."""
    jit = Jit(lambda x: (hubrt.ops.scale(x, 2.0, 0.5), hubrt.ops.cast(x, "f32")), 2)
    rng = np.random.default_rng(0)
    xs = [torch.from_numpy(rng.standard_normal((1024, 1024), dtype=np.float32)).to(TORCH_DTYPE[dtype])
          for _ in range(3)]
    hx = [to_hr(x) for x in xs]

    def want(x):
        return (x.float() * 2.0 + 0.5).to(x.dtype), x.float()

    jit(hx[0])  # the capture
    held, held_f32 = jit(hx[1])
    held_rows = held.narrow(0, 3, 2)
    del held
    for k in range(4):
        got = jit(hx[k % 3])
        for g, w in zip(got, want(xs[k % 3])):
            assert_close(g, w)
        del got
    w_scaled, w_f32 = want(xs[1])
    assert_close(held_rows, w_scaled[3:5])
    assert_close(held_f32, w_f32)
