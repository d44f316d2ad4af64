"""hubrt ops from Python: one generic entry over the C op catalog, and
torch-named wrappers. Attributes are set by name through the catalog's
field table (hr_op_attr_fields), so no C struct is mirrored here."""
import builtins
import ctypes
import struct

from ._lib import check, fn
from .tensor import Tensor, DTYPES, dtype_name, device_handle

_P = ctypes.c_void_p


class _AttrField(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int), ("offset", ctypes.c_size_t)]


_find = fn("hr_op_find", [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)])
_nout = fn("hr_op_num_outputs", [ctypes.c_int])
_nout_for = fn("hr_op_outputs_for", [ctypes.c_int, _P])
_asize = fn("hr_op_attrs_size", [ctypes.c_int], ctypes.c_size_t)
_afields = fn("hr_op_attr_fields", [ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
              ctypes.POINTER(_AttrField))
_run_on = fn("hr_op_run_on", [_P, ctypes.c_int, _P, ctypes.POINTER(_P), ctypes.c_int,
                              ctypes.POINTER(_P), ctypes.c_int])

_ATTR_I64, _ATTR_F64, _ATTR_BOOL, _ATTR_INTS = 0, 1, 2, 3
_cache = {}


def _op_info(name):
    info = _cache.get(name)
    if info is None:
        op = ctypes.c_int()
        check(_find(name.encode(), ctypes.byref(op)))
        n = ctypes.c_int()
        p = _afields(op.value, ctypes.byref(n))
        fields = {p[i].name.decode(): (p[i].type, p[i].offset) for i in range(n.value)}
        info = (op.value, _nout(op.value), _asize(op.value), fields)
        _cache[name] = info
    return info


def _pack_attrs(name, size, fields, attrs):
    unknown = set(attrs) - set(fields)
    if unknown:
        raise TypeError(f"op '{name}' has no attribute(s) {sorted(unknown)}; it has {sorted(fields)}")
    if not size:
        return None, None
    buf = ctypes.create_string_buffer(size)
    for key, value in attrs.items():
        kind, off = fields[key]
        if key == "dtype":
            value = DTYPES.index(dtype_name(value))
        if kind == _ATTR_I64:
            struct.pack_into("<q", buf, off, int(value))
        elif kind == _ATTR_F64:
            struct.pack_into("<d", buf, off, float(value))
        elif kind == _ATTR_BOOL:
            struct.pack_into("<?", buf, off, bool(value))
        elif kind == _ATTR_INTS:
            vals = [int(v) for v in value]
            struct.pack_into("<q", buf, off, len(vals))
            for i, v in enumerate(vals):
                struct.pack_into("<q", buf, off + 8 + 8 * i, v)
    return buf, ctypes.cast(buf, _P)


def call(name, *inputs, out=None, device="cpu", **attrs):
    """Runs op `name` on the inputs (None inputs are dropped from the end).
    `out` may give destination tensors. Returns a Tensor or a tuple."""
    op, n_out, size, fields = _op_info(name)
    ins = list(inputs)
    while ins and ins[-1] is None:
        ins.pop()
    if any(t is None for t in ins):
        raise TypeError(f"op '{name}': only trailing inputs may be None")
    keep, ptr = _pack_attrs(name, size, fields, attrs)
    n_out = _nout_for(op, ptr)  # ops whose attrs set their output count (linear_group)
    if n_out < 0:  # attrs the op refuses: its inference names the attribute
        n_out = len(out) if isinstance(out, (tuple, list)) else 1
    in_arr = (_P * builtins.max(len(ins), 1))(*[t.handle.value for t in ins])
    outs = out if isinstance(out, (tuple, list)) else ([out] if out is not None else [None] * n_out)
    out_arr = (_P * n_out)(*[o.handle.value if o is not None else None for o in outs])
    dev = device_handle(device) if not ins else None
    check(_run_on(dev, op, ptr, in_arr, len(ins), out_arr, n_out))
    del keep
    res = tuple(o if o is not None else Tensor(out_arr[i]) for i, o in enumerate(outs))
    return res[0] if n_out == 1 else res


def _binary(name):
    def f(a, b):
        return call(name, a, b)
    f.__name__ = name
    return f


def _unary(name):
    def f(x):
        return call(name, x)
    f.__name__ = name
    return f


add, sub, mul, div, pow, maximum, minimum, silu_mul, matmul = map(
    _binary, ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "silu_mul", "matmul"])
neg, exp, log, sqrt, rsqrt, abs, relu, sigmoid, tanh, silu = map(
    _unary, ["neg", "exp", "log", "sqrt", "rsqrt", "abs", "relu", "sigmoid", "tanh", "silu"])


LINEAR_EPILOGUES = {"store": 0, "silu_mul": 1, "gelu_tanh_mul": 2, "residual": 3}


def linear_group(x, weights, biases=None, epilogue="store", residual=None, out=None):
    """The linears x @ w.T (+ b) of `weights` in one op, then the epilogue:
    "store" returns one tensor per weight; "silu_mul" / "gelu_tanh_mul"
    act(first) * second; "residual" first + residual."""
    ins = [x, *weights, *(biases or [])] + ([residual] if residual is not None else [])
    return call("linear_group", *ins, out=out, n=len(weights), epilogue=LINEAR_EPILOGUES[epilogue],
                bias=bool(biases))


EXPERTS_ACTS = {"silu": 0, "gelu_tanh": 1, "gpt_oss": 2}


def experts(x, weights, indices, gate_up, down, gate_up_bias=None, down_bias=None, act="silu",
            per_expert=False, limit=0.0, alpha=0.0, batch_invariant=False, out=None):
    """A mixture-of-experts layer's experts given the router's choice:
    row t's sum over its slots j of weights[t, j] * down_e(act(gate) * up),
    e = indices[t, j], gate_up [E, 2I, H] (gate rows, then up), down
    [E, H, I]. per_expert follows transformers' eager loop's rounding."""
    if (gate_up_bias is None) != (down_bias is None):
        raise ValueError("experts: give both biases or neither")
    ins = [x, weights, indices, gate_up, down] + ([gate_up_bias, down_bias] if gate_up_bias is not None else [])
    return call("experts", *ins, out=out, act=EXPERTS_ACTS[act], per_expert=per_expert, limit=limit, alpha=alpha,
                batch_invariant=batch_invariant)


def gelu(x, approximate="none"):
    return call("gelu", x, approximate=1 if approximate == "tanh" else 0)


def gelu_mul(x, y, approximate="none"):
    return call("gelu_mul", x, y, approximate=1 if approximate == "tanh" else 0)


def clamp(x, min=None, max=None):
    return call("clamp", x, min=min or 0.0, max=max or 0.0, has_min=min is not None,
                has_max=max is not None)


def scale(x, mul=1.0, add=0.0):
    return call("scale", x, mul=mul, add=add)


def where(cond, a, b):
    return call("where", cond, a, b)


def sum(x, dim, keepdim=False):
    return call("sum", x, dim=dim, keepdim=keepdim)


def mean(x, dim, keepdim=False):
    return call("mean", x, dim=dim, keepdim=keepdim)


def max(x, dim, keepdim=False):
    return call("max", x, dim=dim, keepdim=keepdim)


def min(x, dim, keepdim=False):
    return call("min", x, dim=dim, keepdim=keepdim)


def argmax(x, dim, keepdim=False):
    return call("argmax", x, dim=dim, keepdim=keepdim)


def softmax(x, dim=-1):
    return call("softmax", x, dim=dim)


def log_softmax(x, dim=-1):
    return call("log_softmax", x, dim=dim)


def cumsum(x, dim):
    return call("cumsum", x, dim=dim)


def topk(x, k, dim=-1, largest=True, sorted=True):
    return call("topk", x, k=k, dim=dim, largest=largest, sorted=sorted)


def linear(x, weight, bias=None):
    return call("linear", x, weight, bias)


def rms_norm(x, weight=None, eps=1e-6, weight_offset=0.0):
    return call("rms_norm", x, weight, eps=eps, weight_offset=weight_offset)


def add_rms_norm(x, residual, weight=None, eps=1e-6, weight_offset=0.0, out=None):
    """(rms_norm(x + residual) * weight, x + residual) in one pass; `out`
    may give the two destinations, e.g. (h, residual) to update in place."""
    return call("add_rms_norm", x, residual, weight, out=out, eps=eps, weight_offset=weight_offset)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    return call("layer_norm", x, weight, bias, eps=eps)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d on NCHW tensors (zero padding)."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    return call("conv2d", x, weight, bias, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dilation_h=dh,
                dilation_w=dw, groups=groups)


def group_norm(x, groups, weight=None, bias=None, eps=1e-5):
    return call("group_norm", x, weight, bias, groups=groups, eps=eps)


def upsample_nearest(x, scale=2):
    """F.interpolate(x, scale_factor=scale, mode="nearest") for an integer scale."""
    return call("upsample_nearest", x, scale=scale)


def rope_cos_sin(positions, inv_freq, attention_scaling=1.0, dtype="f32"):
    return call("rope_cos_sin", positions, inv_freq, attention_scaling=attention_scaling, dtype=dtype)


def rope(x, cos, sin):
    return call("rope", x, cos, sin)


def sdpa(q, k, v, mask=None, scale=0.0, is_causal=False, window=0, softcap=0.0, exact=False, exact_from=0,
         sinks=None):
    """sinks [hq]: each head's sink logit (gpt-oss), a key that holds no value."""
    ins = [q, k, v] + ([mask] if mask is not None else []) + ([sinks] if sinks is not None else [])
    return call("sdpa", *ins, scale=scale or 0.0, is_causal=is_causal, window=window, softcap=softcap, exact=exact,
                exact_from=exact_from, sinks=sinks is not None)


def embedding(weight, ids, first=None):
    """weight's rows looked up by ids; with `first`, weight holds the rows
    [first, first + len) of a vocab-split table and other ids give zeros."""
    if first is None:
        return call("embedding", weight, ids)
    return call("embedding", weight, ids, first=first, sharded=True)


def index_select(x, dim, index):
    return call("index_select", x, index, dim=dim)


def gather(x, dim, index):
    return call("gather", x, index, dim=dim)


def index_copy_(dst, dim, index, src):
    return call("index_copy", dst, index, src, out=dst, dim=dim)


def cat(xs, dim=0):
    return call("cat", *xs, dim=dim)


def copy(x, out=None):
    return call("copy", x, out=out)


def contiguous(x):
    return x if x.is_contiguous() else call("copy", x)


def cast(x, dtype):
    return call("cast", x, dtype=dtype)


# ---- collectives over the process group (hubrt.distributed) ----

def all_reduce(x, bias=None, dtype=None):
    """The sum of x over the ranks (in f32, rank order), plus bias, in dtype
    (default x's): the same on every rank."""
    return call("all_reduce", x, bias, dtype=dtype or x.dtype)


def all_gather(x, dim, total):
    """Every rank's x joined along dim in rank order; rank r gives part r of
    the even split of `total`."""
    return call("all_gather", x, dim=dim, total=total)


def broadcast(x, root=0):
    """Rank root's x on every rank."""
    return call("broadcast", x, root=root)


def fill(shape, value, dtype="f32", device="cpu"):
    return call("fill", shape=list(shape), dtype=dtype, value=value, device=device)


def arange(start, end=None, step=1, dtype="i64", device="cpu"):
    if end is None:
        start, end = 0, start
    return call("arange", start=start, end=end, step=step, dtype=dtype, device=device)
