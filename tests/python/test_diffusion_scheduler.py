"""FlowMatchEulerDiscreteScheduler against diffusers: sigmas and timesteps
of set_timesteps for the static shift (SD3's 3.0), the dynamic shifts
(exponential and linear, mu from the image size as the SD3 pipeline
computes it), shift_terminal, the karras / exponential / beta schedules,
invert_sigmas and caller-given sigmas, over step counts; the Euler step
bit for bit in f32 and with bf16 model outputs; the config read from the
scheduler_config.json diffusers saves."""
import numpy as np
import pytest
import torch

import hubrt
from oracle import to_hr, to_torch

diffusers = pytest.importorskip("diffusers")
from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: E402
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift  # noqa: E402

CONFIGS = [
    dict(),
    dict(shift=3.0),
    dict(shift=3.0, num_train_timesteps=500),
    dict(use_dynamic_shifting=True),
    dict(use_dynamic_shifting=True, time_shift_type="linear"),
    dict(shift=3.0, shift_terminal=0.1),
    dict(use_dynamic_shifting=True, shift_terminal=0.02),
    dict(shift=3.0, use_karras_sigmas=True),
    dict(shift=2.0, use_exponential_sigmas=True),
    dict(shift=3.0, use_beta_sigmas=True),
    dict(shift=1.5, invert_sigmas=True),
]


def schedule(config, steps, mu=None, sigmas=None):
    ref = FlowMatchEulerDiscreteScheduler(**config)
    ref.set_timesteps(None if sigmas is not None else steps, mu=mu, sigmas=sigmas)
    ours = hubrt.FlowMatchEulerDiscreteScheduler(**config)
    ours.set_timesteps(None if sigmas is not None else steps, mu=mu, sigmas=sigmas)
    return ref, ours


def assert_schedule_equal(ref, ours):
    want_s, want_t = ref.sigmas.numpy(), ref.timesteps.numpy()
    assert ours.sigmas.shape == want_s.shape and ours.timesteps.shape == want_t.shape
    # the issue's bound is 1e-7; the arithmetic is diffusers' own, so bit for
    # bit (NaN where diffusers' gives NaN: one step stretched to a terminal)
    np.testing.assert_array_equal(ours.sigmas, want_s)
    np.testing.assert_array_equal(ours.timesteps, want_t)


@pytest.mark.parametrize("steps", [1, 2, 4, 28, 50])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_schedule_matches_diffusers(config, steps):
    mu = None
    if config.get("use_dynamic_shifting"):
        mu = calculate_shift((1024 // 8 // 2) ** 2)  # a 1024x1024 image's patches, as the SD3 pipeline
        ours = hubrt.FlowMatchEulerDiscreteScheduler(**config)
        assert ours.calculate_mu((1024 // 8 // 2) ** 2) == mu
    ref, ours = schedule(config, steps, mu=mu)
    assert_schedule_equal(ref, ours)


@pytest.mark.parametrize("config", [dict(shift=3.0), dict(use_dynamic_shifting=True), dict(shift=3.0, shift_terminal=0.1),
                                    dict(shift=3.0, use_karras_sigmas=True)], ids=str)
def test_caller_sigmas_match_diffusers(config):
    sigmas = list(np.linspace(1.0, 1 / 7, 7))
    ref, ours = schedule(config, None, mu=0.8 if config.get("use_dynamic_shifting") else None, sigmas=sigmas)
    assert_schedule_equal(ref, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_matches_diffusers_bit_for_bit(dtype):
    ref, ours = schedule(dict(shift=3.0), 4)
    g = torch.Generator().manual_seed(0)
    sample = torch.randn((2, 16, 8, 8), generator=g).to(dtype)
    for t in ref.timesteps:
        out = torch.randn((2, 16, 8, 8), generator=g).to(dtype)
        want = ref.step(out, t, sample).prev_sample
        got = ours.step(to_hr(out), float(t), to_hr(sample))
        assert got.dtype == ("f32" if dtype == torch.float32 else "bf16")
        assert torch.equal(to_torch(got), want)
        sample = want


def test_config_from_the_file_diffusers_saves(tmp_path):
    ref = FlowMatchEulerDiscreteScheduler(shift=3.0, shift_terminal=0.05, use_exponential_sigmas=True)
    ref.save_config(tmp_path / "scheduler")
    ours = hubrt.FlowMatchEulerDiscreteScheduler.from_pretrained(tmp_path, subfolder="scheduler")
    ref.set_timesteps(12)
    ours.set_timesteps(12)
    assert_schedule_equal(ref, ours)


def test_bad_scheduler_configs_fail_naming_the_field(tmp_path):
    (tmp_path / "scheduler_config.json").write_text('{"_class_name": "DDIMScheduler"}')
    with pytest.raises(hubrt.HubrtError, match="'DDIMScheduler' is not a scheduler hubrt has"):
        hubrt.FlowMatchEulerDiscreteScheduler.from_pretrained(tmp_path)
    (tmp_path / "scheduler_config.json").write_text('{"use_karras_sigmas": true, "use_beta_sigmas": true}')
    with pytest.raises(hubrt.HubrtError, match="only one of use_karras_sigmas"):
        hubrt.FlowMatchEulerDiscreteScheduler.from_pretrained(tmp_path)
    (tmp_path / "scheduler_config.json").write_text('{"time_shift_type": "cubic"}')
    with pytest.raises(hubrt.HubrtError, match="time_shift_type 'cubic'"):
        hubrt.FlowMatchEulerDiscreteScheduler.from_pretrained(tmp_path)
    s = hubrt.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    with pytest.raises(hubrt.HubrtError, match="needs mu"):
        s.set_timesteps(4)
    with pytest.raises(hubrt.HubrtError, match="0 steps"):
        hubrt.FlowMatchEulerDiscreteScheduler().set_timesteps(0)
