"""The SD3 pipeline from a text prompt against diffusers: a tiny random
pipeline with every component (CLIP-L with quick_gelu, CLIP-G with gelu
and the "!" pad token, their vocab.json + merges.txt tokenizers, T5 with a
Unigram tokenizer.json), saved with save_pretrained and read by hubrt from
the folder. Prompt, negative prompt and the per-encoder prompts give the
images diffusers gives (within 1e-3 in [0, 1]) with and without T5, with
long prompts truncated as the tokenizers truncate."""
import shutil

import numpy as np
import pytest
import torch
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

import hubrt
from clip_tokenizer_util import make_clip_tokenizer, make_t5_tokenizer
from diffusion_util import perturb

diffusers = pytest.importorskip("diffusers")

JOINT, LATENT = 40, 16


def clip(hidden, proj, act, seed):
    torch.manual_seed(seed)
    cfg = CLIPTextConfig(vocab_size=400, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, projection_dim=proj, hidden_act=act,
                         eos_token_id=1, bos_token_id=0, pad_token_id=1)
    return perturb(CLIPTextModelWithProjection(cfg).eval(), seed)


def make_text_pipeline(path, with_t5=True):
    torch.manual_seed(0)
    transformer = perturb(diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=LATENT, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=JOINT, caption_projection_dim=16, pooled_projection_dim=24, out_channels=LATENT,
        pos_embed_max_size=16).eval(), 1)
    vae = perturb(diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), layers_per_block=1,
        latent_channels=LATENT, norm_num_groups=8, sample_size=16, scaling_factor=1.5305, shift_factor=0.0609,
        use_quant_conv=False, use_post_quant_conv=False).eval(), 2)
    tok_dir = path.parent / "toks"
    tok1 = make_clip_tokenizer(tok_dir / "tokenizer")
    tok2 = make_clip_tokenizer(tok_dir / "tokenizer_2", pad_token="!")
    t5 = tok3 = None
    if with_t5:
        tok3 = make_t5_tokenizer(tok_dir / "tokenizer_3")
        torch.manual_seed(5)
        t5 = perturb(T5EncoderModel(T5Config(vocab_size=150, d_model=JOINT, d_kv=8, d_ff=48, num_layers=2,
                                             num_heads=2, feed_forward_proj="gated-gelu", is_encoder_decoder=False,
                                             use_cache=False)).eval(), 5)
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=clip(16, 12, "quick_gelu", 3), tokenizer=tok1, text_encoder_2=clip(20, 12, "gelu", 4),
        tokenizer_2=tok2, text_encoder_3=t5, tokenizer_3=tok3)
    pipe.save_pretrained(path)
    for name in ("tokenizer", "tokenizer_2"):  # SD3's CLIP tokenizers are vocab.json + merges.txt only
        (path / name / "tokenizer.json").unlink(missing_ok=True)
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(tok_dir / name / f, path / name / f)
    return pipe


@pytest.mark.parametrize("with_t5", [True, False])
def test_text_to_image_matches_diffusers(tmp_path, with_t5):
    ref = make_text_pipeline(tmp_path / "pipe", with_t5)
    ours = hubrt.StableDiffusion3Pipeline.from_pretrained(tmp_path / "pipe", dtype="float32")
    kw = dict(num_inference_steps=2, guidance_scale=5.0, height=16, width=16, output_type="np",
              max_sequence_length=20)
    for prompt, extra in [("A photo of a cat sitting on a red chair!", {}),
                          ("the quick brown fox " * 30, dict(negative_prompt="blurry, low quality")),
                          ("a bowl of fruit", dict(prompt_2="oil painting", prompt_3="highly detailed",
                                                   negative_prompt="ugly"))]:
        with torch.no_grad():
            want = ref(prompt, **extra, generator=torch.Generator("cpu").manual_seed(11), **kw).images
        got = ours(prompt, **extra, seed=11, **kw).images
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-3, prompt


def test_text_needs_the_clip_encoders(tmp_path):
    make_text_pipeline(tmp_path / "pipe", with_t5=False)
    shutil.rmtree(tmp_path / "pipe" / "text_encoder_2")
    ours = hubrt.StableDiffusion3Pipeline.from_pretrained(tmp_path / "pipe")
    with pytest.raises(hubrt.HubrtError, match="text_encoder_2/config.json: missing"):
        ours("a cat", num_inference_steps=1)
