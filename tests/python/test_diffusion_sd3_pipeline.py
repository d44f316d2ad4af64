"""The Stable Diffusion 3 pipeline against diffusers' StableDiffusion3Pipeline:
a tiny random pipeline (SD3.5-style transformer with qk_norm and a dual
attention block, a VAE with an upsampler, the scheduler) saved with
save_pretrained and read by hubrt from the folder. With the same prompt
embeddings and fixed latents, 2 and 4 steps with guidance give images
within 1e-3 in [0, 1]; a seed gives the latents diffusers draws with a
seeded CPU generator; compiled == eager; a dynamic-shift scheduler and no
guidance; folders and calls that are wrong fail naming the problem."""
import copy
import json
import shutil

import numpy as np
import pytest
import torch

import hubrt
from diffusion_util import perturb
from oracle import to_hr

diffusers = pytest.importorskip("diffusers")

JOINT, POOLED, LATENT = 12, 10, 16


def make_pipeline(path, dynamic=False):
    torch.manual_seed(0)
    transformer = perturb(diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=LATENT, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=JOINT, caption_projection_dim=16, pooled_projection_dim=POOLED, out_channels=LATENT,
        pos_embed_max_size=16, qk_norm="rms_norm", dual_attention_layers=(0,)).eval(), 1)
    vae = perturb(diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), layers_per_block=1,
        latent_channels=LATENT, norm_num_groups=8, sample_size=16, scaling_factor=1.5305, shift_factor=0.0609,
        use_quant_conv=False, use_post_quant_conv=False).eval(), 2)
    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=dynamic)
    pipe = diffusers.StableDiffusion3Pipeline(transformer=transformer, scheduler=sched, vae=vae, text_encoder=None,
                                             tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                             text_encoder_3=None, tokenizer_3=None)
    pipe.save_pretrained(path)
    return pipe


def embeds(b=1, seed=3):
    g = torch.Generator().manual_seed(seed)
    return dict(prompt_embeds=torch.randn((b, 7, JOINT), generator=g),
                pooled_prompt_embeds=torch.randn((b, POOLED), generator=g),
                negative_prompt_embeds=torch.randn((b, 7, JOINT), generator=g),
                negative_pooled_prompt_embeds=torch.randn((b, POOLED), generator=g))


def run_both(ref, ours, emb, **kw):
    with torch.no_grad():
        want = ref(**emb, output_type="np", **kw).images
    hr_kw = {k: (to_hr(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    got = ours(**{k: to_hr(v) for k, v in emb.items()}, output_type="np", **hr_kw).images
    return got, want


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    path = tmp_path_factory.mktemp("sd3") / "pipe"
    ref = make_pipeline(path)
    return path, ref


@pytest.mark.parametrize("steps", [2, 4])
def test_pipeline_matches_diffusers_with_fixed_latents(pipelines, steps):
    path, ref = pipelines
    latents = torch.randn((1, LATENT, 8, 12), generator=torch.Generator().manual_seed(5))
    ours = hubrt.StableDiffusion3Pipeline.from_pretrained(path, dtype="float32")
    got, want = run_both(ref, ours, embeds(), num_inference_steps=steps, guidance_scale=4.5, height=16, width=24,
                         latents=latents)
    assert got.shape == want.shape == (1, 16, 24, 3)
    assert np.abs(got - want).max() <= 1e-3
    assert np.abs(np.round(got * 255) - np.round(want * 255)).max() <= 1  # 8-bit pixels within 1


def test_seed_draws_the_latents_diffusers_draws(pipelines):
    path, ref = pipelines
    ours = hubrt.StableDiffusion3Pipeline.from_pretrained(path, dtype="float32")
    got, want = run_both(ref, ours, embeds(b=2), num_inference_steps=2, guidance_scale=3.0,
                         generator=torch.Generator("cpu").manual_seed(1234))
    assert got.shape == (2, 16, 16, 3)  # the default size: sample_size 8 x the vae's 2
    assert np.abs(got - want).max() <= 1e-3
    with torch.no_grad():
        want_lat = ref(**embeds(b=2), num_inference_steps=2, guidance_scale=3.0, output_type="latent",
                       generator=torch.Generator("cpu").manual_seed(1234)).images
    got_lat = ours(**{k: to_hr(v) for k, v in embeds(b=2).items()}, num_inference_steps=2, guidance_scale=3.0,
                   output_type="latent", seed=1234).images
    assert np.abs(got_lat.numpy() - want_lat.numpy()).max() <= 1e-4 * np.abs(want_lat.numpy()).max()


def test_compiled_equals_eager_and_no_guidance(pipelines):
    path, ref = pipelines
    emb = {k: to_hr(v) for k, v in embeds().items() if not k.startswith("negative")}
    eager = hubrt.StableDiffusion3Pipeline.from_pretrained(path, compile=False)
    compiled = hubrt.StableDiffusion3Pipeline.from_pretrained(path, compile=True)
    hubrt.reset_compile_stats()
    a = compiled(**emb, num_inference_steps=3, guidance_scale=1.0, seed=9, output_type="np").images
    assert hubrt.compile_stats()["compiles"] == 1  # one signature, captured once, replayed for the other steps
    b = eager(**emb, num_inference_steps=3, guidance_scale=1.0, seed=9, output_type="np").images
    assert np.array_equal(a, b)
    with torch.no_grad():
        want = ref(**{k: v for k, v in embeds().items() if not k.startswith("negative")}, num_inference_steps=3,
                   guidance_scale=1.0, generator=torch.Generator("cpu").manual_seed(9), output_type="np").images
    assert np.abs(a - want).max() <= 1e-3


def test_dynamic_shift_scheduler(tmp_path):
    ref = make_pipeline(tmp_path / "pipe", dynamic=True)
    ours = hubrt.DiffusionPipeline.from_pretrained(tmp_path / "pipe", dtype="float32")
    latents = torch.randn((1, LATENT, 8, 8), generator=torch.Generator().manual_seed(6))
    got, want = run_both(ref, ours, embeds(), num_inference_steps=3, guidance_scale=2.0, latents=latents)
    assert np.abs(got - want).max() <= 1e-3
    pil = ours(**{k: to_hr(v) for k, v in embeds().items()}, num_inference_steps=1, seed=0).images[0]
    assert pil.size == (16, 16) and pil.mode == "RGB"


def test_bad_folders_and_calls_fail_naming_the_problem(pipelines, tmp_path):
    path, _ = pipelines
    with pytest.raises(hubrt.HubrtError, match="model_index.json: missing"):
        hubrt.StableDiffusion3Pipeline.from_pretrained(tmp_path / "nothing")
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(hubrt.HubrtError, match="vae/config.json: missing"):
        hubrt.StableDiffusion3Pipeline.from_pretrained(broken)
    shutil.copytree(path / "vae", broken / "vae")
    cfg = json.loads((broken / "vae" / "config.json").read_text())
    (broken / "vae" / "config.json").write_text(json.dumps(dict(cfg, up_block_types=["CrossAttnUpBlock2D"] * 2)))
    with pytest.raises(hubrt.HubrtError, match=r"up_block_types\[0\] 'CrossAttnUpBlock2D'"):
        hubrt.StableDiffusion3Pipeline.from_pretrained(broken)
    ours = hubrt.StableDiffusion3Pipeline.from_pretrained(path)
    emb = {k: to_hr(v) for k, v in embeds().items()}
    with pytest.raises(hubrt.HubrtError, match="size 18x16 must be positive multiples of 4"):
        ours(**emb, height=16, width=18, num_inference_steps=1)
    with pytest.raises(hubrt.HubrtError, match="negative_prompt_embeds is required with guidance"):
        ours(prompt_embeds=emb["prompt_embeds"], pooled_prompt_embeds=emb["pooled_prompt_embeds"],
             guidance_scale=5.0, num_inference_steps=1)
    with pytest.raises(hubrt.HubrtError, match=r"latents \[1, 16, 4, 4\] must be \[1, 16, 8, 8\]"):
        ours(**emb, latents=to_hr(torch.zeros(1, 16, 4, 4)), num_inference_steps=1)
    with pytest.raises(hubrt.HubrtError, match="text_encoder/config.json: missing"):
        ours("a photo of a cat", num_inference_steps=1)


def test_bf16_pipeline_draws_torch_bf16_latents(pipelines, tmp_path):
    """A bf16 pipeline's seed gives the bf16 latents diffusers draws (torch's
    bf16 randn stream); after one step both track each other in bf16."""
    path, ref = pipelines
    ref16 = copy.deepcopy(ref).to(torch.bfloat16)
    ours = hubrt.StableDiffusion3Pipeline.from_pretrained(path, dtype="bfloat16")
    emb = {k: v.bfloat16() for k, v in embeds().items()}
    with torch.no_grad():
        want = ref16(**emb, num_inference_steps=1, guidance_scale=2.0, output_type="latent", height=16, width=24,
                     generator=torch.Generator("cpu").manual_seed(77)).images.float()
    got = ours(**{k: to_hr(v) for k, v in emb.items()}, num_inference_steps=1, guidance_scale=2.0,
               output_type="latent", height=16, width=24, seed=77).images
    got = torch.from_numpy(got.numpy())
    # the starting noise is the same bf16 stream; one step in bf16 on each side (measured 6e-3)
    err = ((got - want).abs().max() / want.abs().max()).item()
    print("bf16 latents after one step, relative error", err)
    assert err <= 2e-2


def test_xla_cpu_pipeline_equals_cpu(pipelines):
    path, _ = pipelines
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    emb = {k: to_hr(v) for k, v in embeds().items()}
    kw = dict(num_inference_steps=2, guidance_scale=3.0, seed=3, output_type="np")
    cpu = hubrt.StableDiffusion3Pipeline.from_pretrained(path)(**emb, **kw).images
    xla = hubrt.StableDiffusion3Pipeline.from_pretrained(path, device="xla_cpu")(**emb, **kw).images
    assert np.abs(cpu - xla).max() <= 1e-5
