"""Oracle tests of the index ops (src/ops/infer_index.c,
src/backends/cpu/k_index.c) against torch. These ops move elements
without arithmetic, so results must match exactly."""
import pytest
import torch
import torch.nn.functional as F

from hubrt import ops
from hubrt._lib import HubrtError
from oracle import TORCH_DTYPE, assert_close, hr_noncontig
from oracle import to_hr as _to_hr

DTYPES = ["f32", "bf16", "f16", "i64", "u8"]


def to_hr(t):
    """oracle.to_hr keeping 0-dim tensors 0-dim."""
    x = _to_hr(t)
    return x if t.dim() else x.view(())


def rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 50).to(TORCH_DTYPE[dtype])


def randint(hi, shape, dtype="i64", seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, hi, shape, generator=g).to(TORCH_DTYPE[dtype])


def exact(got, want):
    assert_close(got, want, atol=0, rtol=0)


def out_view(shape, dtype):
    """A zeroed, non-contiguous (dims reversed) destination of `shape`."""
    base = ops.fill(list(shape[::-1]), 0, dtype=dtype)
    return base.permute(*reversed(range(len(shape))))


# ---- embedding ---------------------------------------------------------------

@pytest.mark.parametrize("id_dtype", ["i64", "i32"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ids_shape", [(), (1,), (17,), (2, 3)])
def test_embedding(ids_shape, dtype, id_dtype):
    w = rand((11, 17), dtype)
    ids = randint(11, ids_shape, id_dtype)
    exact(ops.embedding(to_hr(w), to_hr(ids)), F.embedding(ids.long(), w))


def test_embedding_noncontig_and_large():
    w = rand((4097, 33), "bf16")
    ids = randint(4097, (5, 40))
    want = F.embedding(ids, w)
    exact(ops.embedding(hr_noncontig(to_hr(w)), hr_noncontig(to_hr(ids))), want)
    out = out_view((5, 40, 33), "bf16")
    ops.call("embedding", to_hr(w), to_hr(ids), out=out)
    exact(out, want)


def test_embedding_errors():
    w = to_hr(rand((10, 4), "f32"))
    with pytest.raises(HubrtError, match=r"op 'embedding'.*id 10 at position 2 is out of range .*10 rows"):
        ops.embedding(w, to_hr(torch.tensor([1, 2, 10, 3])))
    with pytest.raises(HubrtError, match=r"id -1 at position 0"):
        ops.embedding(w, to_hr(torch.tensor([[-1]], dtype=torch.int32)))
    with pytest.raises(HubrtError, match=r"ids must be i64 or i32, got f32"):
        ops.embedding(w, w)
    with pytest.raises(HubrtError, match=r"weight must be 2-D"):
        ops.embedding(to_hr(rand((10,), "f32")), to_hr(torch.tensor([1])))


# ---- index_select ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("n_idx", [0, 1, 3, 17])
def test_index_select(n_idx, dim, dtype):
    x = rand((5, 6, 7), dtype)
    idx = randint(x.shape[dim], (n_idx,), seed=n_idx)
    want = torch.index_select(x, dim, idx)
    exact(ops.index_select(hr_noncontig(to_hr(x)), dim, to_hr(idx.int())), want)
    if n_idx:
        out = out_view(tuple(want.shape), dtype)
        ops.call("index_select", to_hr(x), to_hr(idx), dim=dim, out=out)
        exact(out, want)


def test_index_select_large_slices():
    x = rand((3, 4097, 17), "f32")
    idx = torch.tensor([2, 0, 2])
    exact(ops.index_select(to_hr(x), 0, to_hr(idx)), torch.index_select(x, 0, idx))
    idx0 = torch.tensor(1)
    exact(ops.index_select(to_hr(x), 0, to_hr(idx0)), torch.index_select(x, 0, idx0))


def test_index_select_errors():
    x = to_hr(rand((4, 5), "f32"))
    with pytest.raises(HubrtError, match=r"op 'index_select'.*index 5 at position 1 is out of range for dim 1"):
        ops.index_select(x, 1, to_hr(torch.tensor([0, 5])))
    with pytest.raises(HubrtError, match=r"index must be 0-D or 1-D"):
        ops.index_select(x, 0, to_hr(torch.zeros(2, 2, dtype=torch.int64)))
    with pytest.raises(HubrtError, match=r"dim 2 out of range"):
        ops.index_select(x, 2, to_hr(torch.tensor([0])))


# ---- gather ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("index_shape", [(4, 5, 6), (2, 3, 9), (1, 1, 1)])
def test_gather(index_shape, dim, dtype):
    x = rand((4, 5, 6), dtype)
    shape = list(index_shape)
    shape = [min(s, x.shape[d]) if d != dim % 3 else s for d, s in enumerate(shape)]
    idx = randint(x.shape[dim], tuple(shape), seed=sum(shape))
    want = torch.gather(x, dim, idx)
    exact(ops.gather(hr_noncontig(to_hr(x)), dim, hr_noncontig(to_hr(idx.int()))), want)
    out = out_view(tuple(want.shape), dtype)
    ops.call("gather", to_hr(x), to_hr(idx), dim=dim, out=out)
    exact(out, want)


def test_gather_1d_large_and_0d():
    x = rand((4097,), "bf16")
    idx = randint(4097, (5000,))
    exact(ops.gather(to_hr(x), 0, to_hr(idx)), torch.gather(x, 0, idx))
    s, i = torch.tensor(3.5), torch.tensor(0)
    exact(ops.gather(to_hr(s), 0, to_hr(i)), torch.gather(s, 0, i))


def test_gather_errors():
    x = to_hr(rand((3, 4), "f32"))
    with pytest.raises(HubrtError, match=r"op 'gather'.*index 4 at position 5 is out of range for dim 1"):
        ops.gather(x, 1, to_hr(torch.tensor([[0, 1, 2], [3, 0, 4]])))
    with pytest.raises(HubrtError, match=r"must have the rank of input \[3, 4\]"):
        ops.gather(x, 1, to_hr(torch.tensor([0])))
    with pytest.raises(HubrtError, match=r"index \[4, 1\] is larger than input \[3, 4\] at dim 0"):
        ops.gather(x, 1, to_hr(torch.zeros(4, 1, dtype=torch.int64)))


# ---- index_copy --------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 2, -1])
def test_index_copy_inplace(dim, dtype):
    dst = rand((4, 3, 9), dtype)
    n = 2
    idx = torch.tensor([dst.shape[dim] - 1, 1])
    shape = list(dst.shape)
    shape[dim] = n
    src = rand(tuple(shape), dtype, seed=5)
    hd = to_hr(dst)
    ops.index_copy_(hd, dim, to_hr(idx), hr_noncontig(to_hr(src)))
    exact(hd, dst.index_copy(dim, idx, src))


def test_index_copy_kv_cache():
    """Decode-step write into a [b, h, max_len, d] cache held as a strided view."""
    cache = torch.zeros(2, 4, 16, 8, dtype=torch.bfloat16)
    step = rand((2, 4, 1, 8), "bf16")
    pos = torch.tensor([5])
    hc = to_hr(cache)
    view = hc.narrow(1, 1, 2)  # a non-contiguous destination
    ops.index_copy_(view, 2, to_hr(pos), to_hr(step[:, 1:3].contiguous()))
    cache[:, 1:3].index_copy_(2, pos, step[:, 1:3])
    exact(hc, cache)


@pytest.mark.parametrize("index", ["arange", "gaps", "int32", "duplicates", "decreasing"])
@pytest.mark.parametrize("source", ["contiguous", "transposed", "strided_rows"])
def test_index_copy_prefill_into_cache(index, source):
    """A compiled prefill's write of s new keys into their slots of a
    [b, h, cap, d] cache: increasing indices copy whole runs in parallel;
    duplicates (last wins) and decreasing ones go slice by slice, as does a
    source whose rows are not contiguous."""
    b, h, cap, s, d = 2, 3, 700, 37, 64
    cache = rand((b, h, cap, d), "bf16")
    idx = {"arange": torch.arange(5, 5 + s), "gaps": torch.arange(s) * 17 + 3, "int32": torch.arange(s).int() + 600,
           "duplicates": torch.arange(s) % 20 + 7, "decreasing": torch.arange(s).flip(0) * 3}[index]
    if source == "transposed":  # [b, s, h, d] as [b, h, s, d], as the values come out of v_proj
        src = rand((b, s, h, d), "bf16", seed=4).transpose(1, 2)
        hsrc = to_hr(src.transpose(1, 2).contiguous()).transpose(1, 2)
    elif source == "strided_rows":  # every other feature
        src = rand((b, h, s, 2 * d), "bf16", seed=4)[..., ::2]
        hsrc = to_hr(rand((b, h, s, 2 * d), "bf16", seed=4)).slice(3, 0, 2 * d, 2)
    else:
        src = rand((b, h, s, d), "bf16", seed=4)
        hsrc = to_hr(src)
    hc = to_hr(cache)
    ops.index_copy_(hc, 2, to_hr(idx), hsrc)
    want = cache.clone()
    for i, j in enumerate(idx.tolist()):  # sequential: the last duplicate wins
        want[:, :, j] = src[:, :, i]
    exact(hc, want)


def test_index_copy_out_of_place():
    dst, src = rand((5, 4), "f32"), rand((2, 4), "f32", seed=3)
    idx = torch.tensor([4, 0])
    hd = to_hr(dst)
    out = out_view((5, 4), "f32")
    ops.call("index_copy", hd, to_hr(idx), to_hr(src), dim=0, out=out)
    exact(out, dst.index_copy(0, idx, src))
    exact(hd, dst)  # dst untouched


def test_index_copy_errors():
    dst = to_hr(rand((5, 4), "f32"))
    with pytest.raises(HubrtError, match=r"op 'index_copy'.*index 7 at position 0 is out of range for dim 0"):
        ops.index_copy_(dst, 0, to_hr(torch.tensor([7])), to_hr(rand((1, 4), "f32")))
    with pytest.raises(HubrtError, match=r"src \[2, 3\] must match dst \[5, 4\] except at dim 0"):
        ops.index_copy_(dst, 0, to_hr(torch.tensor([0, 1])), to_hr(rand((2, 3), "f32")))
    with pytest.raises(HubrtError, match=r"src is bf16 but dst is f32"):
        ops.index_copy_(dst, 0, to_hr(torch.tensor([0])), to_hr(rand((1, 4), "bf16")))


# ---- cat ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + ["bool"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim, dtype):
    shapes = [(3, 4, 5), (3, 4, 5), (3, 4, 5)]
    xs = []
    for k, s in enumerate(shapes):
        s = list(s)
        s[dim] = [1, 0, 3][k]
        xs.append(rand(tuple(s), dtype, seed=k) if dtype != "bool" else rand(tuple(s), "f32", seed=k) > 0)
    want = torch.cat(xs, dim)
    hx = [to_hr(xs[0]), to_hr(xs[1]), hr_noncontig(to_hr(xs[2]))]
    exact(ops.cat(hx, dim), want)
    out = out_view(tuple(want.shape), dtype)
    ops.call("cat", *hx, dim=dim, out=out)
    exact(out, want)


def test_cat_many_and_large():
    xs = [rand((2, k + 1), "f16", seed=k) for k in range(16)]
    exact(ops.cat([to_hr(x) for x in xs], 1), torch.cat(xs, 1))
    big = [rand((4097, 17), "f32", seed=k) for k in range(2)]
    exact(ops.cat([to_hr(x) for x in big], 0), torch.cat(big, 0))


def test_cat_errors():
    a = to_hr(rand((2, 3), "f32"))
    with pytest.raises(HubrtError, match=r"op 'cat'.*input 1 \[2, 4\] does not match input 0 \[2, 3\] outside dim 0"):
        ops.cat([a, to_hr(rand((2, 4), "f32"))], 0)
    with pytest.raises(HubrtError, match=r"input 1 is bf16 but input 0 is f32"):
        ops.cat([a, to_hr(rand((2, 3), "bf16"))], 0)
    with pytest.raises(HubrtError, match=r"0-dim"):
        ops.cat([to_hr(torch.tensor(1.0))], 0)
    with pytest.raises(HubrtError, match=r"takes 1..16 inputs, got 17"):
        ops.cat([a] * 17, 0)
