"""Tensors through the Python front end: numpy round trips, views, errors."""
import numpy as np
import pytest
import torch

import hubrt
from oracle import to_hr, to_torch


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int64, np.int32,
                                   np.int16, np.int8, np.uint8, np.bool_])
def test_numpy_round_trip(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 5, 7)) * 50).astype(dtype)
    t = hubrt.from_numpy(a)
    assert t.shape == (3, 5, 7)
    assert t.strides == (35, 7, 1)
    np.testing.assert_array_equal(t.numpy(), a)


def test_bf16_rounding_matches_torch():
    rng = np.random.default_rng(1)
    a = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 1e3,
                        np.array([1.00390625, 1.01171875, np.inf, -np.inf, 3e38, 1e-40],
                                 dtype=np.float32)])
    t = hubrt.from_numpy(a, dtype="bfloat16")
    ref = torch.from_numpy(a).bfloat16()
    assert torch.equal(to_torch(t), ref)
    assert torch.equal(to_torch(to_hr(ref)), ref)


def test_views_share_data_and_match_torch():
    a = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    t = to_hr(a)
    cases = [
        (lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2)),
        (lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1)),
        (lambda x: x.slice(2, 1, None, 2), lambda x: x[:, :, 1::2]),
        (lambda x: x.narrow(1, 1, 2), lambda x: x.narrow(1, 1, 2)),
        (lambda x: x.select(0, -1), lambda x: x[-1]),
        (lambda x: x.view(6, 4), lambda x: x.view(6, 4)),
        (lambda x: x.unsqueeze(1).expand(2, 5, 3, 4), lambda x: x.unsqueeze(1).expand(2, 5, 3, 4)),
        (lambda x: x.view(-1, 2, 2).select(2, 1), lambda x: x.view(-1, 2, 2)[:, :, 1]),
    ]
    for hv, tv in cases:
        v, ref = hv(t), tv(a)
        assert v.shape == tuple(ref.shape)
        assert v.strides == ref.stride()


def test_view_errors_name_the_problem():
    t = hubrt.from_numpy(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(hubrt.HubrtError, match="without a copy"):
        t.transpose(0, 2).view(24)
    with pytest.raises(hubrt.HubrtError, match="invalid for a tensor of shape"):
        t.view(5, 5)
    with pytest.raises(hubrt.HubrtError, match="dim 3 out of range"):
        t.narrow(3, 0, 1)
    with pytest.raises(hubrt.HubrtError, match="cannot expand"):
        t.expand(2, 5, 4)


def test_device_strings():
    t = hubrt.from_numpy(np.ones(3, np.float32), device="cpu:0")
    assert t.device == "cpu:0"
    with pytest.raises(hubrt.HubrtError, match="unknown device 'warp:3'"):
        hubrt.from_numpy(np.ones(3, np.float32), device="warp:3")
    with pytest.raises(hubrt.HubrtError, match="does not exist"):
        hubrt.from_numpy(np.ones(3, np.float32), device="cpu:7")


def test_op_catalog_attrs_by_name():
    t = hubrt.from_numpy(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="no attribute"):
        hubrt.ops.call("softmax", t, axis=0)
    with pytest.raises(hubrt.HubrtError, match="unknown op 'conv9d'"):
        hubrt.ops.call("conv9d", t)


def test_zero_dim_round_trip():
    for dtype in (None, "bf16", "i64"):
        t = hubrt.from_numpy(np.array(2.5 if dtype != "i64" else 7), dtype=dtype)
        assert t.shape == ()
        assert t.numpy().shape == ()
