"""HUBRT_MAX_MEMORY: hubrt's own allocation ceiling, which counts its
anonymous maps and device buffers (that malloc limits do not see) and
checks loader tables before they are allocated."""

import pytest

from hubrt_cli_util import ROOT, make_tiny_fixtures, run_with_peak, with_env


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    make_tiny_fixtures()


MODEL = str(ROOT / "fixtures" / "tiny-qwen3-tok")
RUN = ["run", MODEL, "-p", "The quick brown fox", "-n", "4", "--greedy"]


def test_ceiling_refuses_naming_what_asked():
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": "1M"}, lambda: run_with_peak(RUN))
    assert rc != 0
    assert "tokenizer.json" in err and "HUBRT_MAX_MEMORY (1048576 bytes" in err, err


def test_ceiling_counts_weights_and_buffers():
    """tiny-llama's weights (0.5 MB of f32) are copied into whole 2 MiB
    pages: 1 MiB refuses that copy; at 2 MiB the copy fits and the KV cache
    buffer after it does not (counted while the copy is live)."""
    bench = ["bench", str(ROOT / "fixtures" / "tiny-llama"), "--prompt-len", "8", "--gen", "4"]
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": "1M"}, lambda: run_with_peak(bench))
    assert rc != 0 and "weights: anonymous copy: 2097152 bytes would pass HUBRT_MAX_MEMORY" in err, err
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": "2M"}, lambda: run_with_peak(bench))
    assert rc != 0 and "KV cache" in err and "cpu: a buffer" in err and "2097152 in use" in err, err


@pytest.mark.parametrize("limit", ["160M", str(160 << 20)])
def test_generous_ceiling_changes_nothing(limit):
    """Qwen3's real tokenizer file is checked at ten times its 11 MB."""
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": limit}, lambda: run_with_peak(RUN))
    rc0, out0, _, _ = run_with_peak(RUN)
    assert rc == 0 and rc0 == 0, err
    assert out == out0


def test_bad_value_is_named_and_ignored():
    rc, out, err, _ = with_env({"HUBRT_MAX_MEMORY": "lots"}, lambda: run_with_peak(RUN))
    assert rc == 0, err
    assert "HUBRT_MAX_MEMORY='lots' is not a size" in err
