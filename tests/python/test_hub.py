"""Models by Hub id, against a Hub on loopback (fake_hub.py): hubrt fills
the Hugging Face cache as huggingface_hub does (the same tree, byte for
byte and link for link, as hf_hub_download makes of the same files from
the same server), runs the model from it, reads it offline without a
request, resumes a dropped transfer, never uses a partial or short file,
and sends the token to the Hub only."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from fake_hub import FakeHub, Repo
from hubrt_cli_util import CLI, ROOT, make_tiny_fixtures, run_with_peak, with_env


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    make_tiny_fixtures()


FIX = ROOT / "fixtures"
MODEL = FIX / "tiny-qwen3-tok"
PROMPT = ["-p", "The quick brown fox", "-n", "8", "--greedy"]
# what transformers' from_pretrained asks for, in order; hubrt asks for the same
WANTED = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "model.safetensors"]


def repo_from(folder, shards=False):
    files = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
    lfs = {"model.safetensors"}
    if shards:
        w = load_file(folder / "model.safetensors")
        names = sorted(w)
        half = len(names) // 2
        parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"hubrt-shards-{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        weight_map = {}
        for fname, keys in parts.items():
            save_file({k: w[k] for k in keys}, tmp / fname, metadata={"format": "pt"})
            files[fname] = (tmp / fname).read_bytes()
            weight_map.update({k: fname for k in keys})
        shutil.rmtree(tmp)
        del files["model.safetensors"]
        files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
        lfs = set(parts)
    return Repo(files, lfs=lfs)


@pytest.fixture
def hub():
    h = FakeHub()
    h.repos["org/tiny"] = repo_from(MODEL)
    yield h
    h.close()


def env_for(hub, cache, **extra):
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "",
           "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"}
    env.update(extra)
    return env


def hubrt(hub, cache, args, **extra):
    return with_env(env_for(hub, cache, **extra), lambda: run_with_peak(args))


def reference_cache(hub, cache, repo_id, files):
    """The cache huggingface_hub makes for `files` (absent ones tried, as transformers tries them)."""
    hh = pytest.importorskip("huggingface_hub")
    from huggingface_hub import errors
    absent = getattr(errors, "RemoteEntryNotFoundError", errors.EntryNotFoundError)

    def fetch():
        for f in files:
            try:  # the endpoint given: huggingface_hub reads HF_ENDPOINT once, at import
                hh.hf_hub_download(repo_id, f, cache_dir=str(cache), endpoint=hub.endpoint)
            except absent:
                pass
    with_env(env_for(hub, cache), fetch)


def tree(root):
    """Every entry under root: kind, and a link's target or a file's sha256."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def local_run():
    rc, out, err, _ = run_with_peak(["run", str(MODEL)] + PROMPT)
    assert rc == 0, err
    return out


def test_cache_tree_equals_huggingface_hubs(hub, tmp_path):
    rc, out, err, _ = hubrt(hub, tmp_path / "ours", ["run", "org/tiny"] + PROMPT)
    assert rc == 0, err
    assert out == local_run()
    reference_cache(hub, tmp_path / "ref", "org/tiny", WANTED)
    ours, ref = tree(tmp_path / "ours"), tree(tmp_path / "ref")
    assert ours == ref
    commit = hub.repos["org/tiny"].commit
    assert (tmp_path / "ours" / "models--org--tiny" / "refs" / "main").read_text() == commit
    assert (tmp_path / "ours" / "models--org--tiny" / ".no_exist" / commit / "special_tokens_map.json").exists()
    assert ours[f"models--org--tiny/snapshots/{commit}/model.safetensors"][1].startswith("../../blobs/")


def test_sharded_repo_tree_equals_huggingface_hubs(hub, tmp_path):
    hub.repos["org/sharded"] = repo_from(FIX / "tiny-llama", shards=True)
    rc, out, err, _ = hubrt(hub, tmp_path / "ours", ["inspect", "org/sharded"])
    assert rc == 0, err
    assert "model.layers.0.self_attn.q_proj.weight" in out
    files = [f for f in WANTED if f != "model.safetensors"] + [
        "model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors"]
    reference_cache(hub, tmp_path / "ref", "org/sharded", files)
    assert tree(tmp_path / "ours") == tree(tmp_path / "ref")


def test_second_run_and_offline_ask_nothing_new(hub, tmp_path):
    cache = tmp_path / "c"
    assert hubrt(hub, cache, ["run", "org/tiny"] + PROMPT)[0] == 0
    n = len(hub.requests())
    rc, out, err, _ = hubrt(hub, cache, ["run", "org/tiny"] + PROMPT)
    assert rc == 0, err
    assert [r[2] for r in hub.requests()[n:]] == ["/org/tiny/resolve/main/config.json"], \
        "a second run asks only which commit main is"
    n = len(hub.requests())
    rc, out2, err, _ = hubrt(hub, cache, ["run", "org/tiny"] + PROMPT, HF_HUB_OFFLINE="1")
    assert rc == 0, err
    assert out2 == out and len(hub.requests()) == n
    commit = hub.repos["org/tiny"].commit
    rc, out3, err, _ = hubrt(hub, cache, ["run", "org/tiny", "--revision", commit] + PROMPT)
    assert rc == 0 and out3 == out and len(hub.requests()) == n, "a pinned commit in the cache needs no request"


def test_offline_without_the_files_says_so(hub, tmp_path):
    rc, out, err, _ = hubrt(hub, tmp_path / "empty", ["run", "org/tiny"] + PROMPT, HF_HUB_OFFLINE="1")
    assert rc == 2 and "not in the cache" in err and "HF_HUB_OFFLINE" in err, err
    assert hub.requests() == []


@pytest.mark.parametrize("fault", ["cut", "cut_and_ignore_range"])
def test_dropped_transfer_is_resumed_to_the_same_bytes(hub, tmp_path, fault):
    hub.cut_first = True
    hub.ignore_range = fault == "cut_and_ignore_range"
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["run", "org/tiny"] + PROMPT)
    assert rc == 0, err
    assert out == local_run()
    cdn = hub.requests("cdn")
    assert len(cdn) == 2 and "range" not in cdn[0][3] and cdn[1][3]["range"].startswith("bytes="), cdn
    blobs = tmp_path / "c" / "models--org--tiny" / "blobs"
    data = (MODEL / "model.safetensors").read_bytes()
    assert (blobs / hashlib.sha256(data).hexdigest()).read_bytes() == data
    assert not list(blobs.glob("*.incomplete"))


def test_short_file_is_never_used(hub, tmp_path):
    data = (MODEL / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    hub.short.add(sha)
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["run", "org/tiny"] + PROMPT)
    assert rc == 2 and "consistency check failed" in err, err
    blobs = tmp_path / "c" / "models--org--tiny" / "blobs"
    assert not (blobs / sha).exists() and not list(blobs.glob("*.incomplete"))
    hub.short.clear()
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["run", "org/tiny"] + PROMPT)
    assert rc == 0 and out == local_run(), err


def test_leftover_partial_download_is_not_used(hub, tmp_path):
    data = (MODEL / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    blobs = tmp_path / "c" / "models--org--tiny" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.0badf00d.incomplete").write_bytes(b"\xff" * 1000)  # a crashed fetch's
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["run", "org/tiny"] + PROMPT)
    assert rc == 0 and out == local_run(), err
    assert (blobs / sha).read_bytes() == data


def test_token_goes_to_the_hub_only(hub, tmp_path):
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["inspect", "org/tiny"], HF_TOKEN="hf_secret",
                            HF_HUB_DISABLE_IMPLICIT_TOKEN="")
    assert rc == 0, err
    assert all(r[3].get("authorization") == "Bearer hf_secret" for r in hub.requests("hub"))
    assert hub.requests("cdn") and all("authorization" not in r[3] for r in hub.requests("cdn"))


def test_unknown_repo_and_revision_are_named(hub, tmp_path):
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["run", "org/nothing"] + PROMPT)
    assert rc == 2 and "org/nothing" in err and "HF_TOKEN" in err, err
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["run", "org/tiny", "--revision", "v9"] + PROMPT)
    assert rc == 2 and "has no revision 'v9'" in err, err


@pytest.mark.parametrize("ref", ["../etc", "org/na..me", "org/-x", "a/b/c"])
def test_odd_names_are_not_repo_ids(hub, tmp_path, ref):
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["inspect", ref])
    assert rc == 2 and hub.requests() == [], err


def test_python_from_pretrained_by_repo_id(hub, tmp_path):
    import numpy as np

    import hubrt as hr
    env = env_for(hub, tmp_path / "c")

    def load():
        model = hr.AutoModelForCausalLM.from_pretrained("org/tiny")
        tok = hr.AutoTokenizer.from_pretrained("org/tiny")
        return model, tok
    model, tok = with_env(env, load)
    ref = hr.AutoModelForCausalLM.from_pretrained(MODEL)
    ids = np.array([tok.encode("The quick brown fox")])
    assert np.array_equal(model(ids).logits, ref(ids).logits)


def test_huggingface_hubs_lock_is_honoured(hub, tmp_path):
    """While another process (here: this one, as huggingface_hub would)
    holds .locks/<repo>/<etag>.lock, hubrt waits for it before fetching."""
    import fcntl
    import subprocess
    import sys
    import time
    data = (MODEL / "model.safetensors").read_bytes()
    lock = tmp_path / "c" / ".locks" / "models--org--tiny" / f"{hashlib.sha256(data).hexdigest()}.lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o664)
    fcntl.flock(fd, fcntl.LOCK_EX)
    env = dict(os.environ, **env_for(hub, tmp_path / "c"))
    p = subprocess.Popen([sys.executable, "-c", "import subprocess,sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)",
                          CLI, "inspect", "org/tiny"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(2)
    still_waiting = p.poll() is None
    fetched_early = bool(hub.requests("cdn"))
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    assert p.wait(timeout=60) == 0, p.stderr.read()
    assert still_waiting and not fetched_early
    assert hub.requests("cdn")


def test_a_tampered_refs_file_is_not_followed(hub, tmp_path):
    cache = tmp_path / "c"
    assert hubrt(hub, cache, ["inspect", "org/tiny"])[0] == 0
    (cache / "models--org--tiny" / "refs" / "main").write_text("../../../../../etc")
    rc, out, err, _ = hubrt(hub, cache, ["inspect", "org/tiny"], HF_HUB_OFFLINE="1")
    assert rc == 2 and "not in the cache" in err, err


def test_a_cdn_that_redirects_again_is_followed(hub, tmp_path):
    hub.cdn_hop = True
    rc, out, err, _ = hubrt(hub, tmp_path / "c", ["run", "org/tiny"] + PROMPT, HF_TOKEN="hf_secret",
                            HF_HUB_DISABLE_IMPLICIT_TOKEN="")
    assert rc == 0 and out == local_run(), err
    paths = [r[2] for r in hub.requests("cdn")]
    assert any(p.startswith("/cdn/") for p in paths) and any(p.startswith("/signed/") for p in paths)
    assert all("authorization" not in r[3] for r in hub.requests("cdn"))
