"""hubrt text-to-image: the PNG it writes from a tiny random SD3 folder equals
diffusers' PIL image (8-bit pixels within 1), with T5 and with --no-t5;
bad folders, configs and sizes exit 2 with a message naming the problem,
and leave no output file."""
import json
import shutil
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image

from hubrt_cli_util import CLI
from test_diffusion_sd3_text import make_text_pipeline

ARGS = ["--steps", "2", "--guidance", "5", "--size", "24x16", "--seed", "11", "--max-sequence-length", "20"]


def run(*args):
    return subprocess.run([CLI, "text-to-image", *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("t2i") / "pipe"
    return path, make_text_pipeline(path)


@pytest.mark.parametrize("no_t5", [False, True])
def test_png_equals_diffusers(folder, tmp_path, no_t5):
    path, ref = folder
    out = tmp_path / "cat.png"
    p = run(path, "-p", "a photo of a cat", "--negative-prompt", "blurry", *ARGS, *(["--no-t5"] if no_t5 else []),
            "-o", out)
    assert p.returncode == 0, p.stderr
    assert f"wrote {out} (24x16, 2 steps" in p.stderr
    saved = ref.text_encoder_3
    if no_t5:
        ref.text_encoder_3 = None
    try:
        with torch.no_grad():
            want = ref("a photo of a cat", negative_prompt="blurry", num_inference_steps=2, guidance_scale=5.0,
                       height=16, width=24, max_sequence_length=20,
                       generator=torch.Generator("cpu").manual_seed(11)).images[0]
    finally:
        ref.text_encoder_3 = saved
    got = Image.open(out)
    assert got.size == want.size == (24, 16) and got.mode == "RGB"
    assert np.abs(np.asarray(got, np.int16) - np.asarray(want, np.int16)).max() <= 1


def test_bad_input_exits_2_naming_it(folder, tmp_path):
    path, _ = folder
    out = tmp_path / "x.png"
    p = run(path, "-p", "a cat", "--size", "18x16", "-o", out)
    assert p.returncode == 2 and "size 18x16 must be positive multiples of 4" in p.stderr
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    shutil.rmtree(broken / "transformer")
    p = run(broken, "-p", "a cat", "-o", out)
    assert p.returncode == 2 and "transformer/config.json: missing" in p.stderr
    shutil.copytree(path / "transformer", broken / "transformer")
    cfg = json.loads((broken / "vae" / "config.json").read_text())
    (broken / "vae" / "config.json").write_text(json.dumps(dict(cfg, up_block_types=["UpBlock2D", "UpDecoderBlock2D"])))
    p = run(broken, "-p", "a cat", "-o", out)
    assert p.returncode == 2 and "up_block_types[0] 'UpBlock2D'" in p.stderr
    p = run(path, "-o", out)
    assert p.returncode == 2 and "-p PROMPT" in p.stderr
    p = run(path, "-p", "a cat", "--size", "big", "-o", out)
    assert p.returncode == 2 and "--size expects WxH" in p.stderr
    assert not out.exists() and not list(tmp_path.glob("x.png.tmp*"))
