"""SD3Transformer2DModel against diffusers: tiny random MMDiTs built with
diffusers' own class and saved with save_pretrained (every parameter of
rank <= 1 perturbed), run by hubrt from the folder: SD3 (2 and 3 joint
blocks, the last pre-only) and SD3.5 (qk_norm rms_norm, dual attention)
in f32 within 1e-4 of the reference's range, for square and non-square
latents and a batch of timesteps; the compiled forward equals the eager
one; bf16 tracks diffusers' bf16; bad inputs fail naming the problem."""
import numpy as np
import pytest
import torch

import hubrt
from diffusion_util import perturb, rel_err
from oracle import to_hr, to_torch

diffusers = pytest.importorskip("diffusers")



SD3 = dict(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
           joint_attention_dim=12, caption_projection_dim=16, pooled_projection_dim=10, out_channels=4,
           pos_embed_max_size=12)
SD35 = dict(SD3, num_layers=3, qk_norm="rms_norm", dual_attention_layers=(0, 1))


def make(path, config, seed=0):
    torch.manual_seed(seed)
    model = perturb(diffusers.SD3Transformer2DModel(**config).eval(), seed)
    model.save_pretrained(path)
    return model


def inputs(b, c, h, w, l, joint, pooled, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((b, c, h, w), generator=g), torch.randn((b, l, joint), generator=g),
            torch.randn((b, pooled), generator=g), torch.tensor([937.5, 3.25][:b]))



@pytest.mark.parametrize("config", [SD3, SD35], ids=["sd3", "sd3.5"])
@pytest.mark.parametrize("size", [(8, 8), (6, 10)])
def test_transformer_matches_diffusers(tmp_path, config, size):
    ref = make(tmp_path / "transformer", config)
    x, ctx, pooled, t = inputs(2, 4, *size, 5, config["joint_attention_dim"], config["pooled_projection_dim"])
    with torch.no_grad():
        want = ref(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t).sample
    model = hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer", dtype="float32")
    got = model(to_hr(x), to_hr(ctx), to_hr(pooled), t.numpy()).sample
    assert rel_err(got, want) <= 1e-4


def test_compiled_forward_equals_eager(tmp_path):
    make(tmp_path / "transformer", SD35)
    x, ctx, pooled, t = inputs(2, 4, 8, 8, 5, 12, 10)
    eager = hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer")
    compiled = hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer", compile=True)
    want = to_torch(eager(to_hr(x), to_hr(ctx), to_hr(pooled), t.numpy()).sample)
    hubrt.reset_compile_stats()
    for step in range(3):  # captured once, then replayed with new timesteps
        tt = t - 100 * step
        got = compiled(to_hr(x), to_hr(ctx), to_hr(pooled), tt.numpy()).sample
        ref = eager(to_hr(x), to_hr(ctx), to_hr(pooled), tt.numpy()).sample
        assert torch.equal(to_torch(got), to_torch(ref))
    assert hubrt.compile_stats()["compiles"] == 1
    assert torch.equal(to_torch(compiled(to_hr(x), to_hr(ctx), to_hr(pooled), t.numpy()).sample), want)


def test_bf16_tracks_diffusers_bf16(tmp_path):
    ref = make(tmp_path / "transformer", SD3)
    x, ctx, pooled, t = inputs(1, 4, 8, 8, 5, 12, 10)
    with torch.no_grad():
        want = ref(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t[:1]).sample
        want_bf16 = ref.to(torch.bfloat16)(hidden_states=x.bfloat16(), encoder_hidden_states=ctx.bfloat16(),
                                           pooled_projections=pooled.bfloat16(), timestep=t[:1]).sample.float()
    model = hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer", dtype="bfloat16")
    got = model(to_hr(x), to_hr(ctx), to_hr(pooled), t[:1].numpy()).sample
    assert got.dtype == "bf16"
    assert rel_err(got, want) <= max(2 * rel_err(to_hr(want_bf16), want), 2e-2)


def test_bad_inputs_and_configs_fail_naming_the_problem(tmp_path):
    make(tmp_path / "transformer", SD3)
    model = hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer")
    x, ctx, pooled, t = inputs(1, 4, 8, 8, 5, 12, 10)
    with pytest.raises(hubrt.HubrtError, match=r"latents \[1, 4, 7, 8\] must be \[b, 4, h, w\] with h and w "
                                               r"multiples of the patch 2"):
        model(to_hr(x[:, :, :7]), to_hr(ctx), to_hr(pooled), t[:1].numpy())
    with pytest.raises(hubrt.HubrtError, match="at most 12 patches"):
        model(to_hr(torch.zeros(1, 4, 26, 8)), to_hr(ctx), to_hr(pooled), t[:1].numpy())
    with pytest.raises(hubrt.HubrtError, match=r"context \[1, 5, 11\]"):
        model(to_hr(x), to_hr(ctx[..., :11]), to_hr(pooled), t[:1].numpy())
    import json
    cfg_path = tmp_path / "transformer" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, qk_norm="l2")))
    with pytest.raises(hubrt.HubrtError, match="qk_norm 'l2'"):
        hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer")
    cfg_path.write_text(json.dumps(dict(cfg, num_layers=3)))
    # block 1 is no longer the last, so its context norm must be the 6-way one
    with pytest.raises(hubrt.HubrtError, match=r"'transformer_blocks.1.norm1_context.linear.weight' has shape "
                                               r"\[32, 16\], the config implies \[96, 16\]"):
        hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer")
    assert np.isfinite(model(to_hr(x), to_hr(ctx), to_hr(pooled), t[:1].numpy()).sample.numpy()).all()


@pytest.mark.parametrize("compile", [False, True])
def test_xla_cpu_equals_cpu(tmp_path, compile):
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    make(tmp_path / "transformer", SD35)
    x, ctx, pooled, t = inputs(2, 4, 8, 6, 5, 12, 10)
    cpu = hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer")
    xla = hubrt.SD3Transformer2DModel.from_pretrained(tmp_path / "transformer", device="xla_cpu", compile=compile)
    want = cpu(to_hr(x), to_hr(ctx), to_hr(pooled), t.numpy()).sample
    got = xla(to_hr(x).to("xla_cpu"), to_hr(ctx).to("xla_cpu"), to_hr(pooled).to("xla_cpu"), t.numpy()).sample
    assert got.device == "xla_cpu:0"
    assert rel_err(got.to("cpu"), to_torch(want)) <= 1e-5
