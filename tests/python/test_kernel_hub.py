"""The kernel hub: the grouped experts kernel that `make` builds as a
package (build/kernels/hubrt/experts-grouped), laid out in a Hugging Face
cache made here (models--org--name, refs/v1, snapshots/<sha>/build/...),
found offline, checked and loaded. Its library imports nothing from libhubrt
(nm -D); its output equals the built-in kernel's bit for bit (ops, every
ISA, f32/bf16/f16, both roundings; a Qwen3-MoE's logits, eager and
compiled). Refused, each with a clear error and nothing loaded: a wrong
digest, a wrong ABI version (in metadata.json and in the library's struct),
no variant for this machine (each rejected variant with its reason), an
untrusted publisher, a truncated library, a lock-file mismatch, a library
without the symbol. The CLI's list, verify and lock."""
import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import hubrt
from cpu_isa import isa  # noqa: F401 (fixture)
from gemma3_util import random_ids, redraw
from hubrt_cli_util import CLI
from oracle import TORCH_DTYPE, to_hr

LIB_DIR = Path(os.environ.get("HUBRT_LIBRARY", Path(__file__).resolve().parents[2] / "build" / "x")).parent
PKG = LIB_DIR / "kernels" / "hubrt" / "experts-grouped"
VARIANT = f"hubrt1-cpu-{platform.machine()}-linux"
REPO = "hubrt/experts-grouped"


@pytest.fixture(scope="module", autouse=True)
def offline():
    if not (PKG / "build" / VARIANT / "metadata.json").exists():
        pytest.skip(f"{PKG} not built")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.delenv("HUBRT_KERNELS_LOCK", raising=False)
    yield
    mp.undo()


def cache_with(root, repo=REPO, branch="v1", src=PKG, commit=None):
    """`src`'s build/ as a snapshot of `repo` in the cache at root, named by
    `branch`; returns the snapshot's variant folder."""
    commit = commit or hashlib.sha1(f"{repo}@{branch}".encode()).hexdigest()
    rd = Path(root) / f"models--{repo.replace('/', '--')}"
    snap = rd / "snapshots" / commit
    shutil.copytree(src / "build", snap / "build", dirs_exist_ok=True)
    (rd / "refs").mkdir(parents=True, exist_ok=True)
    (rd / "refs" / branch).write_text(commit)
    return snap / "build" / VARIANT


def rewrite_metadata(vdir, **changes):
    meta = json.loads((vdir / "metadata.json").read_text())
    meta.update(changes)
    for name in list(meta["files"]):
        if (vdir / name).exists() and "files" not in changes:
            meta["files"][name]["sha256"] = hashlib.sha256((vdir / name).read_bytes()).hexdigest()
    (vdir / "metadata.json").write_text(json.dumps(meta))


def refused(match, *args, **kw):
    before = hubrt.kernels_loaded()
    with pytest.raises(hubrt.HubrtError, match=match):
        hubrt.get_kernel(*args, **kw)
    assert hubrt.kernels_loaded() == before


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    cache_with(root)
    return hubrt.get_kernel(REPO, version=1, cache_dir=root)


# ---- the package ------------------------------------------------------------------------------

def test_library_is_self_contained():
    """The library exports the ABI struct alone and imports no hubrt symbol:
    the kernel itself is in it, not a call back into libhubrt."""
    lib = PKG / "build" / VARIANT / "libhubrt_experts.so"
    defined = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    names = [line.split()[-1] for line in defined.stdout.splitlines() if line.split()[1] in "TDBR"]
    assert names == ["hubrt_kernel_abi_v1"], names
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True)
    assert not [s for s in undefined.stdout.split() if s.startswith("hr_")]
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert not [line for line in needed.splitlines() if "(NEEDED)" in line and "libhubrt" in line]
    meta = json.loads((PKG / "build" / VARIANT / "metadata.json").read_text())
    assert meta["files"]["libhubrt_experts.so"]["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert (meta["name"], meta["abi"], meta["backend"]) == ("experts", 1, "cpu")


def test_loads_from_the_cache(kernel, tmp_path):
    assert kernel.repo == REPO and kernel.variant == VARIANT and kernel.name == "experts"
    assert kernel.publisher == "hubrt" and len(kernel.revision) == 40
    assert kernel.impl_id > 0
    again = hubrt.get_kernel(REPO, version=1, cache_dir=Path(kernel.library).parents[5])
    assert again.impl_id == kernel.impl_id


# ---- bits against the built-in kernel ------------------------------------------------------------

def experts_case(t, h, i, e, k, dtype, seed, bias=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    gu = torch.randn(e, 2 * i, h, generator=g) / h ** 0.5
    dn = torch.randn(e, h, i, generator=g) / i ** 0.5
    w, idx = torch.topk(torch.softmax(torch.randn(t, e, generator=g), -1), k)
    b = [torch.randn(e, 2 * i, generator=g), torch.randn(e, h, generator=g)] if bias else [None, None]
    td = TORCH_DTYPE[dtype]
    return [to_hr(x.to(td)), to_hr(w.to(td)), to_hr(idx), to_hr(gu.to(td)), to_hr(dn.to(td))] + \
        [None if v is None else to_hr(v.to(td)) for v in b]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_bits_equal_the_builtin_kernel(kernel, dtype, isa):  # noqa: F811
    for shape, bias, act in [((1, 64, 32, 8, 2), False, "silu"), ((5, 64, 48, 16, 4), True, "gelu_tanh"),
                             ((40, 96, 32, 8, 8), False, "silu")]:
        ins = experts_case(*shape, dtype, seed=sum(shape), bias=bias)
        for per_expert in (False, True):
            want = hubrt.ops.experts(*ins, act=act, per_expert=per_expert)
            got = hubrt.ops.call("experts", *[v for v in ins if v is not None], act=hubrt.ops.EXPERTS_ACTS[act],
                                 per_expert=per_expert, impl=kernel.impl_id)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got.numpy(raw=True), want.numpy(raw=True))


def test_a_model_runs_the_hub_kernel(kernel, tmp_path, monkeypatch):
    """A Qwen3-MoE with the hub kernel as its experts implementation gives
    the grouped implementation's logits and greedy tokens, eager and
    compiled; the kernel also loads by name from from_pretrained."""
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    redraw(Qwen3MoeForCausalLM(cfg).eval(), seed=3).save_pretrained(tmp_path / "moe")
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "plans"))
    ids = random_ids((2, 13), seed=4)
    model = hubrt.AutoModelForCausalLM.from_pretrained(tmp_path / "moe", dtype="float32")
    want = model(ids).logits
    gen = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=[])
    model.set_experts_implementation(kernel)
    assert model.experts_implementation.startswith(REPO + "@")
    np.testing.assert_array_equal(model(ids).logits, want)
    for impl in (None, "static"):
        out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=[], cache_implementation=impl)
        np.testing.assert_array_equal(out, gen)
    monkeypatch.setenv("HF_HUB_CACHE", str(Path(kernel.library).parents[5]))
    by_name = hubrt.AutoModelForCausalLM.from_pretrained(tmp_path / "moe", dtype="float32",
                                                        experts_implementation=REPO + "@v1")
    np.testing.assert_array_equal(by_name(ids).logits, want)


# ---- refusals -------------------------------------------------------------------------------------

def test_wrong_digest(tmp_path):
    vdir = cache_with(tmp_path)
    meta = json.loads((vdir / "metadata.json").read_text())
    meta["files"]["libhubrt_experts.so"]["sha256"] = "0" * 64
    (vdir / "metadata.json").write_text(json.dumps(meta))
    refused(r"digest mismatch: .*libhubrt_experts.so has sha256 [0-9a-f]{64}, metadata.json says 0{64}", REPO,
            version=1, cache_dir=tmp_path)


def test_wrong_abi_in_metadata(tmp_path):
    vdir = cache_with(tmp_path)
    rewrite_metadata(vdir, abi=2)
    refused(r"ABI mismatch: .*metadata.json says ABI 2; this hubrt loads ABI 1", REPO, version=1, cache_dir=tmp_path)


def build_library(tmp_path, source, name="libk.so"):
    src = tmp_path / "k.c"
    src.write_text(source)
    out = tmp_path / name
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


def swap_library(vdir, lib):
    shutil.copy(lib, vdir / "libhubrt_experts.so")
    rewrite_metadata(vdir)


def test_wrong_abi_in_the_library(tmp_path):
    lib = build_library(tmp_path, """
        #include <stdint.h>
        typedef struct { uint32_t v, size; const char *name; int (*f)(const void *); } abi;
        static int f(const void *a) { (void)a; return 0; }
        const abi hubrt_kernel_abi_v1 = {99, sizeof(abi), "experts", f};
    """)
    vdir = cache_with(tmp_path / "hub")
    swap_library(vdir, lib)
    refused(r"ABI mismatch: .* exports ABI 99 .*this hubrt loads ABI 1", REPO, version=1, cache_dir=tmp_path / "hub")


def test_missing_symbol(tmp_path):
    lib = build_library(tmp_path, "int some_other_kernel(void) { return 0; }\n")
    vdir = cache_with(tmp_path / "hub")
    swap_library(vdir, lib)
    refused(r"has no symbol 'hubrt_kernel_abi_v1'", REPO, version=1, cache_dir=tmp_path / "hub")


def test_truncated_library(tmp_path):
    vdir = cache_with(tmp_path)
    lib = vdir / "libhubrt_experts.so"
    data = lib.read_bytes()
    lib.unlink()  # the cache copy only; the package stays whole
    lib.write_bytes(data[:len(data) // 3])
    rewrite_metadata(vdir)
    refused(r"libhubrt_experts.so does not load: ", REPO, version=1, cache_dir=tmp_path)


def test_no_variant_for_this_machine(tmp_path):
    vdir = cache_with(tmp_path)
    build = vdir.parent
    os.rename(vdir, build / "hubrt1-cpu-aarch64-linux")
    for other in ("torch28-cxx11-cu128-x86_64-linux", f"hubrt2-cpu-{platform.machine()}-linux", "hubrt1-pjrt"):
        (build / other).mkdir()
    refused(r"no variant for this machine \(" + VARIANT + r"\)", REPO, version=1, cache_dir=tmp_path)
    with pytest.raises(hubrt.HubrtError) as e:
        hubrt.get_kernel(REPO, version=1, cache_dir=tmp_path)
    msg = str(e.value)
    assert f"hubrt1-cpu-aarch64-linux: built for aarch64-linux; this machine takes {platform.machine()}-linux" in msg
    assert "torch28-cxx11-cu128-x86_64-linux: not a hubrt variant" in msg
    assert "ABI hubrt2; this hubrt loads hubrt1" in msg
    assert "hubrt1-pjrt: StableHLO for PJRT devices" in msg


def test_untrusted_publisher(tmp_path, monkeypatch):
    cache_with(tmp_path, repo="someone/experts")
    trusted = tmp_path / "trusted.txt"
    monkeypatch.setenv("HUBRT_KERNELS_TRUSTED", str(trusted))
    refused(r"untrusted publisher 'someone'", "someone/experts", version=1, cache_dir=tmp_path)
    k = hubrt.get_kernel("someone/experts", version=1, cache_dir=tmp_path, trust_remote_code=True)
    assert k.publisher == "someone"
    trusted.write_text("# kernels we read\nsomeone\n")
    assert hubrt.verify_kernel("someone/experts", version=1, cache_dir=tmp_path).publisher == "someone"


def test_lock_file_pins_revision_and_digests(tmp_path):
    cache_with(tmp_path, branch="v1")
    lock = tmp_path / "hubrt-kernels.lock"
    hubrt.lock_kernel(REPO, lock, version=1, cache_dir=tmp_path)
    entry = json.loads(lock.read_text())["kernels"][REPO]
    assert entry["variant"] == VARIANT and len(entry["revision"]) == 40
    assert hubrt.verify_kernel(REPO, version=1, cache_dir=tmp_path, lock=lock).revision == entry["revision"]
    # v2: the same files at another commit
    cache_with(tmp_path, branch="v2")
    refused(r"lock mismatch: .*pins revision " + entry["revision"], REPO, version=2, cache_dir=tmp_path, lock=lock)
    # a pinned digest that differs
    doc = json.loads(lock.read_text())
    doc["kernels"][REPO]["files"]["libhubrt_experts.so"] = "1" * 64
    lock.write_text(json.dumps(doc))
    refused(r"lock mismatch: .*pins libhubrt_experts.so at sha256 1{64}", REPO, version=1, cache_dir=tmp_path,
            lock=lock)
    lock.write_text(json.dumps({"kernels": {}}))
    refused(r"lock mismatch: .* does not pin it", REPO, version=1, cache_dir=tmp_path, lock=lock)


def test_not_in_the_cache(tmp_path):
    refused(r"hubrt/experts-grouped", REPO, version=3, cache_dir=tmp_path)
    refused(r"neither a folder path \(/\.\.\., \./\.\.\.\) nor a Hub repository id", "not a repo", cache_dir=tmp_path)


def test_a_folder_named_like_a_repo_is_not_trusted(tmp_path, monkeypatch):
    """./someone/experts in the working directory is not taken for the
    repository someone/experts (which would skip the publisher check); a
    folder is one only when named as a path."""
    cache_with(tmp_path / "hub", repo="someone/experts")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(PKG, tmp_path / "someone" / "experts")
    monkeypatch.setenv("HUBRT_KERNELS_TRUSTED", str(tmp_path / "none.txt"))
    refused(r"untrusted publisher 'someone'", "someone/experts", version=1, cache_dir=tmp_path / "hub")
    assert hubrt.verify_kernel("./someone/experts").publisher == "local"


def test_hostile_variant_names_are_reported_safely(tmp_path):
    """Folder names from the repository are untrusted: digits past any
    buffer, another ABI, odd suffixes, each reported with a reason."""
    vdir = cache_with(tmp_path)
    build = vdir.parent
    os.rename(vdir, build / "hubrt1-cpu-riscv64-linux")
    for name in ("hubrt" + "0" * 200 + "1-cpu-x", "hubrt99999999999-cpu-x86_64-linux", "hubrt1", "hubrt1-gpu-x",
                 "hubrtx-cpu"):
        (build / name).mkdir()
    with pytest.raises(hubrt.HubrtError) as e:
        hubrt.get_kernel(REPO, version=1, cache_dir=tmp_path)
    msg = str(e.value)
    assert "hubrt1-gpu-x: not for the cpu device" in msg and "hubrtx-cpu: not a hubrt variant" in msg
    assert "built for riscv64-linux" in msg


def test_a_library_needing_other_libraries_is_refused(tmp_path):
    """Before the loader runs anything of it: a library that needs a library
    other than libc/libm (here libz), or carries a search path, is refused."""
    lib = tmp_path / "libk.so"
    src = tmp_path / "k.c"
    src.write_text("""
        #include <stdint.h>
        typedef struct { uint32_t v, size; const char *name; int (*f)(const void *); } abi;
        static int f(const void *a) { (void)a; return 0; }
        const abi hubrt_kernel_abi_v1 = {1, sizeof(abi), "experts", f};
    """)
    for extra, why in ((["-Wl,--no-as-needed", "-lz"], "needs a library other than libc and libm"),
                       (["-Wl,-rpath,/tmp"], "names a library search path")):
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src), *extra], check=True)
        vdir = cache_with(tmp_path / f"hub-{len(extra)}-{why[:5]}")
        swap_library(vdir, lib)
        refused(why, REPO, version=1, cache_dir=vdir.parents[4])


# ---- the CLI -------------------------------------------------------------------------------------

def test_cli_list_verify_lock(tmp_path):
    cache_with(tmp_path, branch="v1")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def cli(*args):
        return subprocess.run([CLI, "kernels", *map(str, args)], capture_output=True, text=True, env=env, timeout=60)

    r = cli("list", "--cache-dir", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(REPO + "\t") and VARIANT in r.stdout
    r = cli("verify", REPO, "--version", 1, "--cache-dir", tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"variant   {VARIANT}" in r.stdout and "publisher hubrt" in r.stdout
    r = cli("lock", REPO, "--version", 1, "--cache-dir", tmp_path, "-o", tmp_path / "k.lock")
    assert r.returncode == 0, r.stderr
    assert REPO in json.loads((tmp_path / "k.lock").read_text())["kernels"]
    r = cli("verify", "someone/else", "--version", 1, "--cache-dir", tmp_path)
    assert r.returncode == 2 and "someone/else" in r.stderr
    r = cli("frobnicate")
    assert r.returncode == 2 and "usage: hubrt kernels" in r.stderr
