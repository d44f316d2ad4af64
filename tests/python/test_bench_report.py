"""bench/report.py's merging of repeated runs: an engine run in several
interleaved rounds gives the median of each tok/s figure over the runs
that succeeded, the largest peak RSS, and keeps every run's figures; a
bandwidth-bound b1 run is held against the probes read beside it."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from report import collapse, markdown, of_limit_beside  # noqa: E402


def piece(engine, decode, prefill=None, rss=100.0, error=None, case="b1", probes=None):
    p = {"engine": engine, "model": "m", "case": case, "decode_tok_s": decode, "prefill_tok_s": prefill,
         "peak_rss_mb": rss}
    if probes:
        p["read_gbs_before"], p["read_gbs_after"] = probes
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


def test_repeats_keep_each_runs_probes():
    runs = [piece("hubrt", 27.0, probes=(35.0, 36.0)), piece("hubrt", None, error="boom", probes=(60.0, 61.0)),
            piece("hubrt", 44.0, probes=(60.0, 62.0)), piece("llama.cpp", 20.0, probes=(35.5, 35.0)),
            piece("hubrt", 300.0, case="b64")]
    out = {(p["engine"], p["case"]): p for p in collapse(runs)}
    assert out["hubrt", "b1"]["beside"] == [[27.0, 35.0, 36.0], [44.0, 60.0, 62.0]]  # the failed run left out
    assert "beside" not in out["llama.cpp", "b1"]  # a single run keeps its own two probes
    assert (out["llama.cpp", "b1"]["read_gbs_before"], out["llama.cpp", "b1"]["read_gbs_after"]) == (35.5, 35.0)


def test_fraction_beside_each_run():
    """With compute out of the way the bound is bandwidth / bytes per token: each run's fraction is its
    tok/s over the bound at the mean of its own probes, so a run in the fast mode is not held against
    the slow mode's bandwidth; the median is over the runs."""
    shape = {"layers": 2, "heads": 2, "head_dim": 4, "body_params": 500_000_000, "head_params": 100_000_000,
             "kv_bytes_per_token": 64}
    case = {"batch": 1, "prompt_len": 4, "gen": 8}
    bytes_per_tok = 1.2e9  # (body + head) bf16; the KV cache adds < 1e-6 of it
    runs = [[27.0, 35.0, 36.0], [44.0, 60.0, 62.0], [30.0, 35.0, 36.0]]
    frac = lambda tok, bw: tok / (bw * 1e9 / bytes_per_tok)  # noqa: E731
    got = of_limit_beside(shape, case, runs, peak=1e12)
    want = sorted(frac(tok, bw) for tok, bw in ((27, 35.5), (44, 61), (30, 35.5)))[1]
    assert abs(got["of_limit"] - want) < 1e-3 and got["left_out"] == 0
    assert got["read_gbs"] == [[35.0, 36.0], [60.0, 62.0], [35.0, 36.0]]
    # a run whose probes straddle a mode change is left out, unless every run is such a run
    got = of_limit_beside(shape, case, [[30.0, 35.0, 60.0], [44.0, 60.0, 62.0]], peak=1e12)
    assert abs(got["of_limit"] - frac(44, 61)) < 1e-3 and got["left_out"] == 1
    got = of_limit_beside(shape, case, [[30.0, 35.0, 60.0]], peak=1e12)
    assert abs(got["of_limit"] - frac(30, 47.5)) < 1e-3 and got["left_out"] == 0
    assert of_limit_beside(shape, case, [], peak=1e12) is None


def test_table_shows_the_fraction_beside_the_runs():
    beside = {"of_limit": 0.9, "read_gbs": [[60.0, 62.0], [35.0, 58.0]], "left_out": 1}
    r = {"date_utc": "2026-12-05T00:00:00", "machine": {}, "limits": {}, "versions": {},
         "settings": {"threads": 2, "cases": {}}, "tokenizer": None,
         "models": {"m": {"shape": {"params": 6e8, "checkpoint_bytes": 1.2e9}, "bounds": {}}},
         "table": {"m": {"hubrt": {"decode_b1": {"value": 44.0, "error": None, "of_limit": 1.3, "beside": beside},
                                   "decode_b64": {"value": 300.0, "error": None, "of_limit": 0.85}}}}}
    md = markdown(r)
    assert "44.0 (90%§)" in md and "300 (85%)" in md and "‡" not in md  # 130% of the median probe: not shown
    assert "hubrt 60.0-62.0, 35.0-58.0~" in md


def test_moe_bound_counts_the_experts_touched():
    """A MoE model's decode bound reads the dense weights and the experts a
    step's rows touch (expected distinct under uniform routing), not every
    expert: batch 1 reads k experts per layer, batch 64 nearly all."""
    from report import bound
    dense = dict(body_params=1_000_000, head_params=100_000, layers=2, heads=4, head_dim=64,
                 kv_bytes_per_token=0, expert_params=128 * 10_000_000, experts=128, experts_per_tok=8)
    b1 = bound(dense, "decode", 1, 1, 2, bw_gbs=1.0, peak_gflops=1e9)
    read_b1 = (1_100_000 + 8 * 10_000_000) * 2  # dense + 8 experts, bf16
    assert abs(b1["mem_s"] - read_b1 / 1e9) <= 1e-4  # the report rounds seconds to 4 places
    b64 = bound(dense, "decode", 64, 1, 2, bw_gbs=1.0, peak_gflops=1e9)
    distinct = 128 * (1 - (1 - 8 / 128) ** 64)
    assert abs(b64["mem_s"] - (1_100_000 + distinct * 10_000_000) * 2 / 1e9) <= 1e-4
    assert 120 < distinct < 128


def test_moe_layer_rows_are_read_and_shown(tmp_path):
    from report import _moe_layer, moe_layer_lines
    (tmp_path / "moe-layer.out").write_text(
        "bench_moe: 2 layers of 1.21 GB cycled, avx512\n"
        "experts rows=   1 H=2048 I=768 E=128 k=8 thr=2     1.64 ms/layer (med    1.68)  touched    75.5 MB   46.0 "
        "GB/s (med  45.0) | read best  53.0 med  51.7 GB/s |  87% of the bound\n")
    rows = _moe_layer(tmp_path)
    assert rows == [{"rows": 1.0, "ms": 1.64, "ms_med": 1.68, "touched_mb": 75.5, "gbs": 46.0, "gbs_med": 45.0,
                     "read_gbs": 53.0, "read_med": 51.7, "pct": 87.0}]
    assert "| 1 | 1.64 · 1.68 | 76 MB | 46.0 | 53.0 | 87% |" in moe_layer_lines(rows)


def test_gemma4_shape_counts_its_experts_and_each_kinds_cache(tmp_path):
    """Gemma 4's experts (experts.gate_up_proj / down_proj, top_k_experts)
    are the touched part of the bound, and the KV bytes per token add each
    layer's own geometry: full layers with global_head_dim and, with
    attention_k_eq_v, num_global_key_value_heads."""
    import json

    import torch
    from safetensors.torch import save_file
    from report import model_shape
    cfg = {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "global_head_dim": 32, "num_global_key_value_heads": 1, "attention_k_eq_v": True, "hidden_size": 64,
           "layer_types": ["sliding_attention", "sliding_attention", "full_attention"], "num_experts": 8,
           "top_k_experts": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({"model.embed_tokens.weight": torch.zeros(10, 64), "model.layers.0.experts.gate_up_proj":
               torch.zeros(8, 6, 64), "model.layers.0.experts.down_proj": torch.zeros(8, 64, 3),
               "model.layers.0.mlp.gate_proj.weight": torch.zeros(5, 64)}, tmp_path / "model.safetensors")
    shape = model_shape(tmp_path)
    assert shape["expert_params"] == 8 * 6 * 64 + 8 * 64 * 3 and shape["experts_per_tok"] == 2
    assert shape["body_params"] == 5 * 64 and shape["head_params"] == 10 * 64
    assert shape["kv_bytes_per_token"] == 2 * (2 * 2 * 16 + 1 * 32) * 2
    assert shape["q_dims"] == 16 + 16 + 32


def test_batch_cases_are_held_against_their_own_probes():
    """b16 and b64 runs carry probes too: each decode cell's fraction is
    against the probes beside its own runs, listed per case."""
    beside = {"of_limit": 0.81, "read_gbs": [[33.0, 34.0]], "left_out": 0}
    r = {"date_utc": "2026-12-07T00:00:00", "machine": {}, "limits": {}, "versions": {},
         "settings": {"threads": 2, "cases": {}}, "tokenizer": None,
         "models": {"m": {"shape": {"params": 6e8, "checkpoint_bytes": 1.2e9}, "bounds": {}}},
         "table": {"m": {"hubrt": {"decode_b16": {"value": 50.0, "error": None, "of_limit": 0.6, "beside": beside}}}}}
    md = markdown(r)
    assert "50.0 (81%§)" in md and "Bandwidth beside the b16 runs (GB/s, before-after): hubrt 33.0-34.0." in md
