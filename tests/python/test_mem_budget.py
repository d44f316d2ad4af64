"""HUBRT_MAX_MEMORY: hubrt's own allocation ceiling, which counts its
anonymous maps and device buffers (that malloc limits do not see) and
checks loader tables before they are allocated."""
import os

import pytest

from hubrt_cli_util import ROOT, run_with_peak

MODEL = str(ROOT / "fixtures" / "tiny-qwen3-tok")
RUN = ["run", MODEL, "-p", "The quick brown fox", "-n", "4", "--greedy"]


def with_env(env, fn):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_ceiling_refuses_naming_what_asked():
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": "1M"}, lambda: run_with_peak(RUN))
    assert rc != 0
    assert "HUBRT_MAX_MEMORY (1048576 bytes" in err and "tokenizer: the vocabulary" in err, err


@pytest.mark.parametrize("limit", ["40M", "41943040"])
def test_ceiling_counts_weights_and_buffers(limit):
    """The tokenizer's tables (~5 MB) fit in 6 MB, the weights' anonymous
    copy (19 MB of f32 in 2 MiB pages) does not: the refusal names it. 40 MB
    holds the copy, the KV cache and the activations: the same tokens."""
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": "6M"}, lambda: run_with_peak(RUN))
    assert rc != 0 and "HUBRT_MAX_MEMORY" in err, err
    assert "weights: anonymous copy" in err, err
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": limit}, lambda: run_with_peak(RUN))
    rc0, out0, _, _ = run_with_peak(RUN)
    assert rc == 0 and rc0 == 0, err
    assert out == out0


def test_bad_value_is_named_and_ignored():
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": "lots"}, lambda: run_with_peak(RUN))
    assert rc == 0, err
    assert "HUBRT_MAX_MEMORY='lots' is not a size" in err
