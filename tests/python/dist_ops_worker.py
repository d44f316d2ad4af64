"""One rank of test_dist_ops.py (under `hubrt launch -n 3`): the collective
ops on rank-dependent inputs, against torch computed from every rank's
inputs (each rank can make them all). Any mismatch raises, which ends every
rank with a non-zero exit; rank 0 writes OUT when all passed."""
import sys

import numpy as np
import torch

import hubrt
from hubrt import ops

hubrt.distributed.init()
rank, size = hubrt.distributed.rank(), hubrt.distributed.size()


def part(r):
    return np.random.default_rng(r).standard_normal((4, 5)).astype(np.float32)


def same(got, want):
    np.testing.assert_array_equal(got.numpy(), want.float().numpy())


bias = np.random.default_rng(99).standard_normal(5).astype(np.float32)
parts = [torch.from_numpy(part(r)) for r in range(size)]

# all_reduce in f32: the parts summed in rank order, then the bias, bit for bit
want = parts[0].clone()
for p in parts[1:]:
    want += p
same(ops.all_reduce(hubrt.from_numpy(part(rank)), hubrt.from_numpy(bias)), want + torch.from_numpy(bias))

# bf16 parts: summed in f32, rounded once
xb = ops.cast(hubrt.from_numpy(part(rank)), "bf16")
want = parts[0].bfloat16().float()
for p in parts[1:]:
    want += p.bfloat16().float()
same(ops.all_reduce(xb), want.bfloat16())

# all_gather of uneven parts of 11 along dim 1, in rank order
full = torch.from_numpy(np.random.default_rng(5).standard_normal((2, 11, 3)).astype(np.float32))
first, last = 11 * rank // size, 11 * (rank + 1) // size
mine = hubrt.from_numpy(np.ascontiguousarray(full[:, first:last].numpy()))
same(ops.all_gather(mine, dim=1, total=11), full)

# broadcast from rank 1
same(ops.broadcast(hubrt.from_numpy(part(rank)), root=1), parts[1])

# a vocab-split embedding: each rank's rows, zeros elsewhere, summed = the whole lookup
table = torch.from_numpy(np.random.default_rng(7).standard_normal((10, 6)).astype(np.float32))
ids = torch.tensor([[0, 9, 4, 3, 3, 7]])
lo, hi = 10 * rank // size, 10 * (rank + 1) // size
rows = ops.embedding(hubrt.from_numpy(np.ascontiguousarray(table[lo:hi].numpy())), hubrt.from_numpy(ids.numpy()),
                     first=lo)
same(ops.all_reduce(rows), torch.nn.functional.embedding(ids, table))

# a root outside the group is refused on every rank alike
try:
    ops.broadcast(hubrt.from_numpy(part(rank)), root=size)
    raise AssertionError("broadcast from a root outside the group ran")
except hubrt.HubrtError as e:
    assert f"root {size} is not a rank of the group of {size}" in str(e), str(e)

if rank == 0:
    open(sys.argv[1], "w").write("ok")
