"""AutoencoderKL's decoder against diffusers: tiny random VAEs built with
diffusers' own class and saved with save_pretrained (every parameter of
rank <= 1 perturbed, so norms and biases are seen), decoded by hubrt from
the folder as it is: f32 within 1e-4 of the reference's range, with and
without post_quant_conv and the mid-block attention, sharded weights, the
fp16 variant file, bf16 compute; bad folders fail naming what is wrong."""
import json
import os

import numpy as np
import pytest
import torch

import hubrt
from diffusion_util import perturb, rel_err
from oracle import to_hr, to_torch

diffusers = pytest.importorskip("diffusers")



def make_vae(path, blocks=(32, 64), layers=1, latent=16, groups=8, post_quant=False, mid_attention=True, seed=0,
             **save):
    torch.manual_seed(seed)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * len(blocks),
        up_block_types=("UpDecoderBlock2D",) * len(blocks), block_out_channels=blocks, layers_per_block=layers,
        latent_channels=latent, norm_num_groups=groups, sample_size=32, scaling_factor=1.5305, shift_factor=0.0609,
        use_quant_conv=post_quant, use_post_quant_conv=post_quant, mid_block_add_attention=mid_attention)
    perturb(vae.eval(), seed)
    vae.save_pretrained(path, **save)
    return vae


def latents(shape, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))



@pytest.mark.parametrize("config", [
    dict(),
    dict(blocks=(32, 32, 64), layers=2, post_quant=True),
    dict(blocks=(16, 32), latent=4, groups=4, mid_attention=False),
])
def test_vae_decode_matches_diffusers(tmp_path, config):
    ref = make_vae(tmp_path / "vae", **config)
    z = latents((2, ref.config.latent_channels, 6, 5))
    with torch.no_grad():
        want = ref.decode(z).sample
    vae = hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae", dtype="float32")
    assert vae.vae_scale_factor == 2 ** (len(ref.config.block_out_channels) - 1)
    assert vae.scaling_factor == pytest.approx(1.5305) and vae.shift_factor == pytest.approx(0.0609)
    got = vae.decode(to_hr(z))
    assert rel_err(got, want) <= 1e-4


def test_vae_reads_sharded_weights_and_the_fp16_variant(tmp_path):
    ref = make_vae(tmp_path / "sharded", max_shard_size="100KB")
    assert os.path.exists(tmp_path / "sharded" / "diffusion_pytorch_model.safetensors.index.json")
    z = latents((1, 16, 4, 4))
    with torch.no_grad():
        want = ref.decode(z).sample
    got = hubrt.AutoencoderKL.from_pretrained(tmp_path / "sharded", dtype="float32").decode(to_hr(z))
    assert rel_err(got, want) <= 1e-4
    ref.to(torch.float16).save_pretrained(tmp_path / "sharded", variant="fp16")
    assert os.path.exists(tmp_path / "sharded" / "diffusion_pytorch_model.fp16.safetensors")
    with torch.no_grad():
        want16 = ref.float().decode(z).sample  # the fp16 weights, computed in f32
    vae16 = hubrt.AutoencoderKL.from_pretrained(tmp_path / "sharded", variant="fp16", dtype="float32")
    assert rel_err(vae16.decode(to_hr(z)), want16) <= 1e-4


def test_vae_bf16_compute_tracks_diffusers_bf16(tmp_path):
    ref = make_vae(tmp_path / "vae")
    z = latents((1, 16, 6, 6))
    with torch.no_grad():
        want = ref.decode(z).sample
        want_bf16 = ref.to(torch.bfloat16).decode(z.bfloat16()).sample.float()
    got = hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae", dtype="bfloat16").decode(to_hr(z))
    assert got.dtype == "bf16"
    # both round at every op; hubrt's error against f32 is no worse than diffusers'
    assert rel_err(got, want) <= max(2 * rel_err(to_hr(want_bf16), want), 2e-2)


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_vae_bad_folders_fail_naming_the_problem(tmp_path):
    with pytest.raises(hubrt.HubrtError, match="config.json: missing"):
        hubrt.AutoencoderKL.from_pretrained(tmp_path / "absent")
    make_vae(tmp_path / "vae")
    edit_config(tmp_path / "vae", up_block_types=["UpDecoderBlock2D", "AttnUpDecoderBlock2D"])
    with pytest.raises(hubrt.HubrtError, match=r"up_block_types\[1\] 'AttnUpDecoderBlock2D'"):
        hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae")
    edit_config(tmp_path / "vae", up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[32, 48])
    with pytest.raises(hubrt.HubrtError, match=r"decoder.conv_in.weight' has shape \[64, 16, 3, 3\], the config "
                                              r"implies \[48, 16, 3, 3\]"):
        hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae")
    edit_config(tmp_path / "vae", block_out_channels=[32, 64], _class_name="UNet2DModel")
    with pytest.raises(hubrt.HubrtError, match="_class_name 'UNet2DModel' is not AutoencoderKL"):
        hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae")
    edit_config(tmp_path / "vae", _class_name="AutoencoderKL")
    os.remove(tmp_path / "vae" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(hubrt.HubrtError, match="no weights"):
        hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae")
    make_vae(tmp_path / "vae2")
    vae = hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae2")
    with pytest.raises(hubrt.HubrtError, match=r"latents \[1, 4, 3, 3\] must be \[b, 16, h, w\]"):
        vae.decode(to_hr(latents((1, 4, 3, 3))))
    assert np.isfinite(vae.decode(to_hr(latents((1, 16, 2, 2)))).numpy()).all()


def test_xla_cpu_equals_cpu(tmp_path):
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    make_vae(tmp_path / "vae", blocks=(16, 32), groups=8)
    z = latents((1, 16, 5, 4))
    want = hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae").decode(to_hr(z))
    got = hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae", device="xla_cpu").decode(to_hr(z).to("xla_cpu"))
    assert got.device == "xla_cpu:0"
    assert rel_err(got.to("cpu"), to_torch(want)) <= 1e-5


@pytest.mark.parametrize("config", [dict(), dict(blocks=(32, 32, 64), layers=2, post_quant=True)])
def test_vae_encode_matches_diffusers(tmp_path, config):
    ref = make_vae(tmp_path / "vae", **config)
    f = 2 ** (len(ref.config.block_out_channels) - 1)
    x = torch.rand((2, 3, 6 * f, 4 * f), generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        dist = ref.encode(x).latent_dist
    got = hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae", dtype="float32").encode(to_hr(x)).latent_dist
    assert rel_err(got.mean, dist.mean) <= 1e-4
    assert rel_err(got.logvar, dist.logvar) <= 1e-4


def test_vae_encode_refuses_a_size_off_the_factor(tmp_path):
    make_vae(tmp_path / "vae")
    vae = hubrt.AutoencoderKL.from_pretrained(tmp_path / "vae")
    with pytest.raises(hubrt.HubrtError, match=r"image \[1, 3, 5, 4\] must be \[b, 3, h, w\] with h and w multiples of 2"):
        vae.encode(to_hr(torch.zeros(1, 3, 5, 4)))
