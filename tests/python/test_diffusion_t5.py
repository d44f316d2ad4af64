"""T5EncoderModel against transformers: tiny random encoders (T5 v1.1's
gated-gelu and v1.0's relu), saved with save_pretrained, every parameter
of rank <= 1 perturbed; last_hidden_state within 1e-4 in f32 over
sequences long enough to use every relative-position bucket (256, as SD3
pads T5 prompts to); float16 with the overflow clamp; errors."""
import pytest
import torch
from transformers import T5Config, T5EncoderModel

import hubrt
from diffusion_util import perturb, rel_err
from oracle import to_hr, to_torch


def make_t5(path, ff="gated-gelu", seed=0, scale=1.0):
    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=120, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4,
                   relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj=ff,
                   is_encoder_decoder=False, use_cache=False)
    model = T5EncoderModel(cfg).eval()
    perturb(model, seed)
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("ff", ["gated-gelu", "relu"])
@pytest.mark.parametrize("length", [7, 256])
def test_t5_encoder_matches_transformers(tmp_path, ff, length):
    ref = make_t5(tmp_path / "t5", ff)
    ids = torch.randint(0, 120, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).last_hidden_state
    got = hubrt.T5EncoderModel.from_pretrained(tmp_path / "t5", dtype="float32")(to_hr(ids))
    assert rel_err(got, want) <= 1e-4


def test_t5_float16_with_overflow_clamp(tmp_path):
    ref = make_t5(tmp_path / "t5", scale=10.0)  # large weights: sublayer outputs overflow float16
    ref = ref.half()
    ref.save_pretrained(tmp_path / "t5h")
    ids = torch.randint(0, 120, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    want = out.last_hidden_state.float()
    # the clamp ran: a block's output holds 65504 - 1000 (64512 in float16) where it overflowed
    assert max(h.float().abs().max().item() for h in out.hidden_states) == 64512
    got = hubrt.T5EncoderModel.from_pretrained(tmp_path / "t5h", dtype="float16")(to_hr(ids))
    assert got.dtype == "f16"
    assert torch.isfinite(want).all()
    # both compute in float16 with f32 reductions (measured 1.1e-3)
    assert rel_err(got, want) <= 5e-3


def test_t5_errors_name_the_problem(tmp_path):
    make_t5(tmp_path / "t5", ff="gated-silu")
    with pytest.raises(hubrt.HubrtError, match="feed_forward_proj 'gated-silu'"):
        hubrt.T5EncoderModel.from_pretrained(tmp_path / "t5")
    make_t5(tmp_path / "ok")
    with pytest.raises(hubrt.HubrtError, match=r"input_ids \[3\] i64 must be integer \[b, l\]"):
        hubrt.T5EncoderModel.from_pretrained(tmp_path / "ok")(to_hr(torch.zeros(3, dtype=torch.int64)))


def test_xla_cpu_equals_cpu(tmp_path):
    import numpy as np
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    make_t5(tmp_path / "t5")
    ids = torch.randint(0, 120, (2, 40), generator=torch.Generator().manual_seed(1))
    cpu = hubrt.T5EncoderModel.from_pretrained(tmp_path / "t5")(to_hr(ids))
    xla = hubrt.T5EncoderModel.from_pretrained(tmp_path / "t5", device="xla_cpu")(to_hr(ids).to("xla_cpu"))
    assert xla.device == "xla_cpu:0"
    assert rel_err(xla.to("cpu"), to_torch(cpu)) <= 1e-5
