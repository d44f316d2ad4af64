"""Oracle tests of the eltwise ops (src/ops/infer_eltwise.c,
src/backends/cpu/k_eltwise*.c) against torch.

References are computed in f32 from the same (already rounded) inputs and
rounded once to the result dtype, which is what hubrt promises."""
import pytest
import torch
import torch.nn.functional as F

from hubrt import ops
from hubrt._lib import HubrtError, lib
from oracle import TORCH_DTYPE, assert_close, hr_noncontig, to_torch
from oracle import to_hr as _to_hr

FLOATS = ["f32", "bf16", "f16"]
INTS = ["i64", "i32", "u8"]

# (shape a, shape b): equal odd sizes, broadcasting both ways, 0-dim scalars.
BINARY_SHAPES = [((), ()), ((1,), (1,)), ((3,), (3,)), ((17,), (17,)), ((4097,), (4097,)),
                 ((2, 3, 17), (17,)), ((17,), (2, 3, 17)), ((3, 1, 5), (1, 4, 5)),
                 ((), (3, 17)), ((3, 17), ())]
UNARY_SHAPES = [(), (1,), (3,), (17,), (4097,), (5, 17)]


def to_hr(t):
    """oracle.to_hr, keeping 0-dim tensors 0-dim (hubrt.from_numpy turns
    them into shape [1] through np.ascontiguousarray)."""
    x = _to_hr(t)
    return x if t.dim() else x.view(())


def scalar(value, dtype):
    return to_hr(torch.tensor(value, dtype=TORCH_DTYPE[dtype]))


def rand(shape, dtype, lo=-3.0, hi=3.0, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    t = torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
    if dtype in INTS or dtype in ("i8", "i16"):
        t = t.round()
    return t.to(TORCH_DTYPE[dtype])


def hr_strided(t):
    """A hubrt view of t whose last dim has stride 2 (0-dim stays as is)."""
    if t.dim() == 0:
        return to_hr(t)
    big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    big[..., ::2] = t
    return to_hr(big).slice(-1, 0, None, 2)


def hr_out_view(shape, dtype):
    """A non-contiguous destination of `shape` (a transposed view, or a
    stride-2 slice for 1-D), and the buffer behind it, zero-filled."""
    if len(shape) >= 2:
        base = ops.fill(list(shape[::-1]), 0.0, dtype=dtype)
        return base.permute(*reversed(range(len(shape)))), base
    if len(shape) == 1:
        base = ops.fill([2 * shape[0]], 0.0, dtype=dtype)
        return base.slice(0, 0, None, 2), base
    base = ops.fill([], 0.0, dtype=dtype)
    return base, base


@pytest.fixture(params=["best", "scalar"])
def isa(request):
    """Runs a test with the best SIMD paths and again with HUBRT_CPU_ISA=scalar."""
    before = lib.hr_cpu_isa_get()
    if request.param == "scalar":
        assert lib.hr_cpu_isa_set(0) == 0
    yield request.param
    assert lib.hr_cpu_isa_set(before) == 0


# ---- binary -------------------------------------------------------------

def gelu_tanh_mul(a, b):
    return F.gelu(a, approximate="tanh") * b


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "silu_mul": lambda a, b: F.silu(a) * b, "gelu_mul": lambda a, b: F.gelu(a) * b,
}


def binary_inputs(name, sa, sb, dtype):
    a, b = rand(sa, dtype, seed=1), rand(sb, dtype, seed=2)
    if name == "pow":
        a = a.abs() + 0.5
    if name == "div":
        b = torch.where(b.abs() < 0.25, torch.ones_like(b), b)
    return a, b


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("sa,sb", BINARY_SHAPES)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_float(name, sa, sb, dtype, isa):
    a, b = binary_inputs(name, sa, sb, dtype)
    got = ops.call(name, to_hr(a), to_hr(b))
    want = BINARY[name](a.float(), b.float()).to(TORCH_DTYPE[dtype])
    assert got.dtype == dtype
    assert_close(got, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_gelu_mul_tanh(dtype):
    a, b = binary_inputs("gelu_mul", (3, 17), (17,), dtype)
    got = ops.gelu_mul(to_hr(a), to_hr(b), approximate="tanh")
    assert_close(got, gelu_tanh_mul(a.float(), b.float()).to(TORCH_DTYPE[dtype]))


@pytest.mark.parametrize("dtype", INTS + ["i8", "i16"])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "maximum", "minimum"])
def test_binary_int(name, dtype):
    for sa, sb in [((17,), (17,)), ((3, 1, 5), (1, 4, 5)), ((4097,), ())]:
        a, b = rand(sa, dtype, -50, 50, seed=3), rand(sb, dtype, -50, 50, seed=4)
        if dtype == "u8":
            a, b = rand(sa, dtype, 0, 255, seed=3), rand(sb, dtype, 0, 255, seed=4)
        got = ops.call(name, to_hr(a), to_hr(b))
        assert got.dtype == dtype
        assert_close(got, BINARY[name](a, b))  # torch wraps around like hubrt


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["add", "mul", "maximum", "silu_mul", "pow"])
def test_binary_noncontig(name, dtype, isa):
    a, b = binary_inputs(name, (5, 17), (5, 17), dtype)
    want = BINARY[name](a.float(), b.float()).to(TORCH_DTYPE[dtype])
    assert_close(ops.call(name, hr_noncontig(to_hr(a)), hr_strided(b)), want)
    out, base = hr_out_view((5, 17), dtype)
    assert not out.is_contiguous()
    res = ops.call(name, to_hr(a), hr_noncontig(to_hr(b)), out=out)
    assert res is out
    assert_close(out, want)
    assert_close(base, want.t())


def test_binary_strided_out_1d():
    a, b = rand((33,), "bf16"), rand((33,), "bf16", seed=5)
    out, base = hr_out_view((33,), "bf16")
    ops.call("sub", hr_strided(a), to_hr(b), out=out)
    want = torch.zeros(66, dtype=torch.bfloat16)
    want[::2] = (a.float() - b.float()).bfloat16()
    assert_close(base, want)  # the odd elements stay untouched


def test_scalar_operand_takes_other_dtype():
    x = rand((4, 17), "bf16")
    got = ops.mul(to_hr(x), scalar(2.5, "f32"))
    assert got.dtype == "bf16"
    assert_close(got, (x.float() * 2.5).bfloat16())
    got = ops.add(scalar(3, "i64"), to_hr(x))
    assert_close(got, (x.float() + 3).bfloat16())


def test_nan_propagation():
    a = torch.tensor([float("nan"), 1.0, -2.0, float("nan"), 0.5])
    b = torch.tensor([1.0, float("nan"), -3.0, float("nan"), 0.25])
    for name, f in [("maximum", torch.maximum), ("minimum", torch.minimum)]:
        big_a, big_b = a.repeat(5), b.repeat(5)  # vector body and scalar tail
        assert_close(ops.call(name, to_hr(big_a), to_hr(big_b)), f(big_a, big_b))
    x = torch.tensor([float("nan"), -1.0, 2.0] * 6)
    assert_close(ops.relu(to_hr(x)), torch.relu(x))
    assert_close(ops.clamp(to_hr(x), -0.5, 0.5), torch.clamp(x, -0.5, 0.5))


# ---- unary ----------------------------------------------------------------

UNARY = {
    "neg": (torch.neg, (-3, 3)), "exp": (torch.exp, (-8, 8)), "log": (torch.log, (0.01, 10)),
    "sqrt": (torch.sqrt, (0, 10)), "rsqrt": (torch.rsqrt, (0.01, 10)), "abs": (torch.abs, (-3, 3)),
    "relu": (torch.relu, (-3, 3)), "sigmoid": (torch.sigmoid, (-20, 20)), "tanh": (torch.tanh, (-5, 5)),
    "silu": (F.silu, (-20, 20)), "gelu": (F.gelu, (-6, 6)),
}


def unary_call(name, x, out=None):
    if name == "gelu_tanh":
        return ops.call("gelu", x, approximate=1, out=out)
    if name == "clamp":
        return ops.call("clamp", x, min=-1.0, max=0.5, has_min=True, has_max=True, out=out)
    if name == "scale":
        return ops.call("scale", x, mul=0.75, add=-0.5, out=out)
    return ops.call(name, x, out=out)


def unary_ref(name, x):
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "clamp":
        return torch.clamp(x, -1.0, 0.5)
    if name == "scale":
        return x * 0.75 - 0.5
    return UNARY[name][0](x)


UNARY_NAMES = list(UNARY) + ["gelu_tanh", "clamp", "scale"]


def unary_input(name, shape, dtype):
    lo, hi = UNARY.get(name, (None, (-3, 3)))[1]
    return rand(shape, dtype, lo, hi)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", UNARY_SHAPES)
@pytest.mark.parametrize("name", UNARY_NAMES)
def test_unary_float(name, shape, dtype, isa):
    x = unary_input(name, shape, dtype)
    got = unary_call(name, to_hr(x))
    assert got.dtype == dtype
    assert_close(got, unary_ref(name, x.float()).to(TORCH_DTYPE[dtype]))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", UNARY_NAMES)
def test_unary_noncontig(name, dtype):
    x = unary_input(name, (6, 17), dtype)
    want = unary_ref(name, x.float()).to(TORCH_DTYPE[dtype])
    assert_close(unary_call(name, hr_noncontig(to_hr(x))), want)
    assert_close(unary_call(name, hr_strided(x)), want)
    out, _ = hr_out_view((6, 17), dtype)
    unary_call(name, to_hr(x), out=out)
    assert_close(out, want)


@pytest.mark.parametrize("dtype", ["i64", "i32"])
@pytest.mark.parametrize("name", ["neg", "abs", "relu", "clamp"])
def test_unary_int(name, dtype):
    x = rand((3, 17), dtype, -50, 50)
    got = unary_call(name, hr_noncontig(to_hr(x)))
    want = torch.clamp(x, -1, 0) if name == "clamp" else unary_ref(name, x)
    assert got.dtype == dtype
    assert_close(got, want)


def test_clamp_one_sided():
    x = rand((4, 33), "f32")
    assert_close(ops.clamp(to_hr(x), min=-0.5), torch.clamp(x, min=-0.5))
    assert_close(ops.clamp(to_hr(x), max=0.25), torch.clamp(x, max=0.25))
    xi = rand((33,), "i64", -9, 9)
    assert_close(ops.clamp(to_hr(xi), min=-2), torch.clamp(xi, min=-2))


def test_silu_sigmoid_extremes(isa):
    """The vector exp saturates at both ends like expf."""
    x = torch.tensor([-200.0, -88.0, -87.5, -20.0, -1e-8, 0.0, 1e-8, 20.0, 88.0, 89.0, 200.0] * 3)
    assert_close(ops.silu(to_hr(x)), F.silu(x))
    assert_close(ops.sigmoid(to_hr(x)), torch.sigmoid(x))
    big = torch.linspace(-90, 90, 4097)
    assert_close(ops.sigmoid(to_hr(big)), torch.sigmoid(big), atol=1e-6, rtol=3e-6)


@pytest.mark.parametrize("n", [1, 17, 4097, 24 * 3072])
def test_silu_mul_bf16_avx512_same_bytes_as_avx2(n):
    """The AVX-512 bf16 row (vcvtneps2bf16) stores what the AVX2 code
    stores, subnormal results included (those blocks take the AVX2 code)."""
    before = lib.hr_cpu_isa_get()
    if lib.hr_cpu_isa_set(2) != 0:
        pytest.skip("this CPU has no avx512 path")
    a, b = rand((n,), "bf16", -6, 6, seed=1), rand((n,), "bf16", -6, 6, seed=2)
    special = torch.tensor([-200.0, -88.0, 88.5, 200.0, float("nan"), float("inf"), -float("inf"), 0.0, -0.0,
                            1e-39, -3e-39, 1e-20], dtype=torch.bfloat16)
    a[::7] = special[torch.arange(a[::7].numel()) % len(special)]
    b[::5] = special.flip(0)[torch.arange(b[::5].numel()) % len(special)]
    b[3::11] = 1e-38  # times silu(a) < 1: subnormal products
    if n == 24 * 3072:  # every bf16 value of a, times b
        a[: 1 << 16] = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    try:
        got = to_torch(ops.silu_mul(to_hr(a), to_hr(b)))
        assert lib.hr_cpu_isa_set(1) == 0
        want = to_torch(ops.silu_mul(to_hr(a), to_hr(b)))
    finally:
        assert lib.hr_cpu_isa_set(before) == 0
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert_close(ops.silu_mul(to_hr(a), to_hr(b)), (F.silu(a.float()) * b.float()).to(torch.bfloat16))


# ---- where ------------------------------------------------------------------

@pytest.mark.parametrize("cond_dtype", ["bool", "u8"])
@pytest.mark.parametrize("dtype", FLOATS + ["i64", "bool"])
def test_where(cond_dtype, dtype):
    g = torch.Generator().manual_seed(1)
    cond = torch.rand((3, 1, 17), generator=g) > 0.5
    a, b = rand((1, 4, 17), dtype), rand((17,), dtype, seed=9)
    if dtype == "bool":
        a, b = a != 0, torch.rand(17, generator=g) > 0.5
    hc = to_hr(cond.to(TORCH_DTYPE[cond_dtype]))
    want = torch.where(cond, a, b)
    assert_close(ops.where(hc, to_hr(a), hr_strided(b)), want)
    out, _ = hr_out_view((3, 4, 17), dtype)
    ops.call("where", hc, hr_noncontig(to_hr(a.expand(3, 4, 17).contiguous())), to_hr(b), out=out)
    assert_close(out, want)


def test_where_scalar_branch():
    cond = torch.arange(10) % 3 == 0
    x = rand((10,), "bf16")
    got = ops.where(to_hr(cond), to_hr(x), scalar(-1.5, "f32"))
    assert got.dtype == "bf16"
    assert_close(got, torch.where(cond, x, torch.tensor(-1.5, dtype=torch.bfloat16)))


# ---- copy and cast ------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16", "i64", "bool", "u8"])
def test_copy(dtype):
    x = rand((5, 17), dtype) if dtype != "bool" else rand((5, 17), "f32") > 0
    c = ops.copy(hr_noncontig(to_hr(x)))
    assert c.is_contiguous()
    assert_close(c, x)
    out, _ = hr_out_view((5, 17), dtype)
    ops.copy(to_hr(x), out=out)
    assert_close(out, x)


@pytest.mark.parametrize("shape,perm", [((3, 300, 257), (0, 2, 1)), ((2, 5, 9, 17), (3, 1, 0, 2)),
                                        ((17, 9), (1, 0)), ((4, 1, 33), (2, 1, 0))])
def test_copy_transposes(shape, perm):
    """Tiled transposing copies, both directions (strided source, strided out)."""
    x = rand(shape, "f16")
    want = x.permute(*perm)
    exact = dict(atol=0, rtol=0)
    assert_close(ops.copy(to_hr(x).permute(*perm)), want, **exact)
    out, _ = hr_out_view(tuple(want.shape), "f16")
    ops.copy(to_hr(want.contiguous()), out=out)
    assert_close(out, want, **exact)


def test_copy_into_cache_slice():
    """The KV-cache write: a [b, h, s, d] block into positions 3..5 of a cache."""
    cache = torch.zeros(2, 3, 8, 16, dtype=torch.bfloat16)
    new = rand((2, 3, 2, 16), "bf16")
    hc = to_hr(cache)
    ops.copy(to_hr(new), out=hc.narrow(2, 3, 2))
    cache[:, :, 3:5] = new
    assert_close(hc, cache)


def test_copy_errors():
    with pytest.raises(HubrtError, match="output 0 is"):
        ops.copy(to_hr(rand((3, 4), "f32")), out=ops.fill([4, 3], 0.0))
    with pytest.raises(HubrtError, match="output 0 is"):
        ops.copy(to_hr(rand((3, 4), "f32")), out=ops.fill([3, 4], 0.0, dtype="bf16"))


CAST_DTYPES = ["f32", "bf16", "f16", "f64", "i64", "i32", "i16", "i8", "u8", "bool"]


def cast_source(src, dst):
    lo = 0 if dst in ("u8", "bool") or src == "u8" else -100
    x = rand((5, 17), "f64", lo, 100, seed=11)
    x[0, :4] = torch.tensor([0.0, 0.5, -0.5 if lo else 1.5, 99.75])
    if src == "bool":
        return x > 50
    return x.to(TORCH_DTYPE[src])


@pytest.mark.parametrize("dst", CAST_DTYPES)
@pytest.mark.parametrize("src", CAST_DTYPES)
def test_cast(src, dst):
    x = cast_source(src, dst)
    got = ops.cast(hr_noncontig(to_hr(x)), dst)
    assert got.dtype == dst
    want = x.to(TORCH_DTYPE[dst])
    assert_close(got, want, atol=0, rtol=0)


def test_cast_rounding(isa):
    """Round to nearest even at bf16/f16 ties, f16 subnormals and overflow."""
    one = 1.0
    vals = [one + 2**-8, one + 3 * 2**-8, -(one + 2**-8), 1e-7, 6e-8, 3e-8, 65519.0, 65520.0, 1e5, -1e5,
            float("inf"), float("nan"), 2**-140, 3.0e38, 3.4e38]
    x = torch.tensor(vals * 3, dtype=torch.float32)  # vector body and tail
    nan = x.isnan()

    def same_bits(got, want):  # NaN payloads may differ; NaN-ness may not
        assert torch.equal(to_torch(got).isnan(), nan)
        assert torch.equal(to_torch(got).view(torch.int16)[~nan], want.view(torch.int16)[~nan])

    for dst in ("bf16", "f16"):
        same_bits(ops.cast(to_hr(x), dst), x.to(TORCH_DTYPE[dst]))
    out, base = hr_out_view((len(x),), "f16")
    ops.call("cast", to_hr(x), dtype="f16", out=out)
    same_bits(out, x.half())


# ---- fill and arange -------------------------------------------------------------

@pytest.mark.parametrize("dtype,value", [("f32", -1.5), ("bf16", 0.1), ("f16", 3.25), ("i64", 7),
                                         ("i32", -3), ("u8", 200), ("bool", 1)])
@pytest.mark.parametrize("shape", [(), (1,), (17,), (3, 0, 2), (4, 4097)])
def test_fill(shape, dtype, value):
    got = ops.fill(shape, value, dtype=dtype)
    assert_close(got, torch.full(shape, value, dtype=TORCH_DTYPE[dtype]), atol=0, rtol=0)


def test_fill_into_view():
    out, base = hr_out_view((3, 5), "f32")
    ops.call("fill", shape=[3, 5], dtype="f32", value=2.0, out=out)
    assert_close(base, torch.full((5, 3), 2.0))


@pytest.mark.parametrize("args,dtype", [((0, 10, 1), "i64"), ((0, 10, 3), "i64"), ((10, 0, -3), "i32"),
                                        ((0.5, 2.0, 0.25), "f32"), ((0, 1, 0.1), "f32"),
                                        ((-2, 2, 0.3), "bf16"), ((0, 4097, 1), "f16"),
                                        ((0, 4097, 1), "f32"), ((3, 3, 1), "i64"), ((1, 0, -1), "f64")])
def test_arange(args, dtype):
    got = ops.arange(*args, dtype=dtype)
    want = torch.arange(*args, dtype=TORCH_DTYPE[dtype])
    assert_close(got, want, atol=0, rtol=0)


def test_arange_errors():
    with pytest.raises(HubrtError, match="step must be nonzero"):
        ops.arange(0, 10, 0)
    with pytest.raises(HubrtError, match="wrong sign"):
        ops.arange(0, 10, -1)
    with pytest.raises(HubrtError, match="finite"):
        ops.arange(0, float("inf"), 1)


# ---- errors ------------------------------------------------------------------------

def test_errors():
    a, b = to_hr(rand((2, 3), "f32")), to_hr(rand((4,), "f32"))
    with pytest.raises(HubrtError, match=r"op 'add'.*\[2, 3\] and \[4\] do not broadcast") as e:
        ops.add(a, b)
    assert e.value.status == "shape error"
    with pytest.raises(HubrtError, match=r"op 'mul'.*different dtypes f32 and bf16"):
        ops.mul(a, to_hr(rand((2, 3), "bf16")))
    ia = to_hr(rand((3,), "i64"))
    with pytest.raises(HubrtError, match=r"op 'div'.*i64; div needs f32, bf16 or f16"):
        ops.div(ia, ia)
    with pytest.raises(HubrtError, match=r"op 'exp'.*input 0 is i64"):
        ops.exp(ia)
    with pytest.raises(HubrtError, match=r"op 'add'.*bool"):
        ops.add(to_hr(torch.ones(3, dtype=torch.bool)), to_hr(torch.ones(3, dtype=torch.bool)))
    with pytest.raises(HubrtError, match=r"op 'where'.*cond\) must be bool or u8, got f32"):
        ops.where(a, a, a)
    with pytest.raises(HubrtError, match=r"op 'where'.*do not broadcast"):
        ops.where(to_hr(torch.ones(5, dtype=torch.bool)), a, a)
    with pytest.raises(HubrtError, match=r"op 'gelu'.*approximate must be"):
        ops.call("gelu", a, approximate=5)
    with pytest.raises(HubrtError, match=r"op 'sub': output 0 is \[3, 2\] f32 but the result is \[2, 3\]"):
        ops.call("sub", a, a, out=ops.fill([3, 2], 0.0))


def test_large_parallel():
    """Big enough for the thread pool to split rows and columns."""
    x = rand((3, 70001), "bf16")
    y = rand((70001,), "bf16", seed=3)
    assert_close(ops.silu_mul(to_hr(x), to_hr(y)), (F.silu(x.float()) * y.float()).bfloat16())
    z = rand((200000,), "f32")
    assert_close(ops.exp(to_hr(z)), torch.exp(z))
    assert_close(ops.cast(to_hr(z), "f16"), z.half(), atol=0, rtol=0)
