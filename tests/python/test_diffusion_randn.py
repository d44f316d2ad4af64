"""Seeded noise: hubrt's torch.randn stream equals torch's CPU randn bit for
bit (sizes that are and are not multiples of 16, a full SD3 latent, seeds
past 32 bits), and so equals the latents diffusers' randn_tensor draws with
a seeded CPU generator; fewer than 16 values are refused."""
import numpy as np
import pytest
import torch

import hubrt
from hubrt.diffusion import torch_randn


@pytest.mark.parametrize("seed,shape", [(0, (16,)), (42, (1024,)), (7, (40,)), (123, (17,)), (2**40 + 5, (3, 17)),
                                        (2**63 + 11, (5, 31)), (1234, (1, 16, 128, 128)), (99, (2, 16, 96, 80))])
def test_randn_equals_torch_bit_for_bit(seed, shape):
    want = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).numpy()
    got = torch_randn(shape, seed)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("seed,shape", [(0, (16,)), (5, (40,)), (123, (1, 16, 64, 64)), (2**40 + 3, (2, 16, 33, 17))])
def test_randn_16_bit_streams_equal_torch(dtype, seed, shape):
    want = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=getattr(torch, dtype)).float()
    got = torch_randn(shape, seed, dtype)
    assert np.array_equal(got.view(np.uint32), want.numpy().view(np.uint32))


def test_randn_equals_diffusers_latents():
    randn_tensor = pytest.importorskip("diffusers.utils.torch_utils").randn_tensor
    shape = (1, 16, 32, 48)
    want = randn_tensor(shape, generator=torch.Generator("cpu").manual_seed(31337), dtype=torch.float32).numpy()
    assert np.array_equal(torch_randn(shape, 31337).view(np.uint32), want.view(np.uint32))


def test_randn_refuses_fewer_than_16_values():
    with pytest.raises(hubrt.HubrtError, match="15 values"):
        torch_randn((15,), 0)
