"""bench/report.py's merging of repeated runs: an engine run in several
interleaved rounds gives the median of each tok/s figure over the runs
that succeeded, the largest peak RSS, and keeps every run's figures."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from report import collapse  # noqa: E402


def piece(engine, decode, prefill=None, rss=100.0, error=None, case="b1"):
    p = {"engine": engine, "model": "m", "case": case, "decode_tok_s": decode, "prefill_tok_s": prefill,
         "peak_rss_mb": rss}
    if error:
        p["error"] = error
    return p


def test_repeats_give_medians_and_keep_every_run():
    runs = [piece("hubrt", 24.5, 430.0, 1200), piece("hubrt", 35.8, 420.0, 1210), piece("hubrt", 24.8, 440.0, 1205),
            piece("llama.cpp", 22.0), piece("llama.cpp", None, error="timeout (>420 s)"), piece("llama.cpp", 18.0),
            piece("transformers-eager", 7.1), piece("hubrt", 300.0, case="b64")]
    out = {(p["engine"], p["case"]): p for p in collapse(runs)}
    assert len(out) == 4
    h = out["hubrt", "b1"]
    assert (h["decode_tok_s"], h["prefill_tok_s"], h["peak_rss_mb"]) == (24.8, 430.0, 1210)
    assert h["repeats"] == {"runs": 3, "ok": 3, "decode_tok_s": [24.5, 35.8, 24.8],
                            "prefill_tok_s": [430.0, 420.0, 440.0]}
    lc = out["llama.cpp", "b1"]  # the failed round is left out of the median, and counted
    assert lc["decode_tok_s"] == 20.0 and "error" not in lc and lc["repeats"]["ok"] == 2
    assert "repeats" not in out["transformers-eager", "b1"] and out["hubrt", "b64"]["decode_tok_s"] == 300.0


def test_all_rounds_failed_keeps_the_error():
    out = collapse([piece("llama.cpp", None, error="boom"), piece("llama.cpp", None, error="boom")])
    assert len(out) == 1 and out[0]["error"] == "boom"
