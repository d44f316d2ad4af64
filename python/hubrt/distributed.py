"""Tensor parallelism, as transformers spells it:

    from hubrt import AutoModelForCausalLM, DistributedConfig
    model = AutoModelForCausalLM.from_pretrained(
        path, distributed_config=DistributedConfig(tp_size=2))   # tp_plan="auto"

run as one process per rank under `hubrt launch -n 2 -- python script.py`
or `mpirun -n 2 python script.py`. Every rank runs the same script; the
model's outputs (logits, generated ids) are the same on every rank.

A rank that raises ends every rank (MPI_Abort, with the rank and the
exception), so no rank waits for one that is gone; a normal exit leaves
the group (MPI_Finalize)."""
import ctypes
import json
import sys
from dataclasses import dataclass

from ._lib import check, fn, lib

_init = fn("hr_dist_init", [])
lib.hr_dist_available.restype = ctypes.c_bool
lib.hr_dist_rank.restype = ctypes.c_int
lib.hr_dist_size.restype = ctypes.c_int
lib.hr_dist_abort.argtypes = [ctypes.c_int, ctypes.c_char_p]
lib.hr_dist_abort.restype = None
_barrier = fn("hr_dist_barrier", [])


@dataclass
class DistributedConfig:
    """tp_size ranks split each layer (transformers' DistributedConfig);
    tp_plan "auto" is the architecture's base_model_tp_plan, or a dict of
    module pattern -> style laid over it, such as
    {"layers.*.self_attn.q_proj": "replicated", ...} to replicate the
    attention when tp_size does not fit the kv heads.
    enable_expert_parallel (transformers' name) or ep_size splits a
    mixture-of-experts model's experts over the same group (ep_size alone,
    with tp_size 1, splits the experts and replicates the rest)."""
    tp_size: int = 1
    tp_plan: object = "auto"
    ep_size: int = 1
    enable_expert_parallel: bool = False

    def experts_split(self):
        if self.enable_expert_parallel and self.ep_size in (1, self.tp_size):
            return self.tp_size
        return self.ep_size

    def plan_json(self):
        if self.tp_plan in (None, "auto"):
            return None
        if not isinstance(self.tp_plan, dict):
            raise TypeError(f"tp_plan must be 'auto' or a dict, not {type(self.tp_plan).__name__}")
        return json.dumps(self.tp_plan)


def available():
    """Whether this libhubrt was built with MPI."""
    return bool(lib.hr_dist_available())


_hooked = False


def init():
    """Joins the group mpirun started (a group of one otherwise); from then
    on an uncaught exception in this rank ends every rank."""
    global _hooked
    check(_init())
    if not _hooked and size() > 1:
        previous = sys.excepthook

        def abort_all(kind, value, tb):
            previous(kind, value, tb)
            sys.stderr.flush()
            lib.hr_dist_abort(1, f"{kind.__name__}: {value}".encode(errors="replace")[:900])

        sys.excepthook = abort_all
        _hooked = True


def rank():
    return int(lib.hr_dist_rank())


def size():
    return int(lib.hr_dist_size())


def barrier():
    check(_barrier())


_broadcast = fn("hr_dist_broadcast", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])


def broadcast_bytes(data, root=0):
    """Rank root's bytes on every rank (the others pass a buffer of the same
    length, whose contents are replaced)."""
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    check(_broadcast(ctypes.cast(buf, ctypes.c_void_p), len(data), root))
    return buf.raw


def shared_seed():
    """A random seed, the same on every rank (rank 0's): split models must
    sample alike, or their ranks would feed each other different tokens."""
    import os
    return int.from_bytes(broadcast_bytes(os.urandom(8)), "little")
