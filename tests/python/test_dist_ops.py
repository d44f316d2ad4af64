"""The collective ops (all_reduce, all_gather, broadcast) and the sharded
embedding lookup: over 3 ranks (oversubscribed on this machine's cores)
against torch computed from every rank's inputs (dist_ops_worker.py), and
in a process that joined no group (a group of one)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hubrt
from hubrt import ops
from test_tp import CLI

WORKER = Path(__file__).with_name("dist_ops_worker.py")


@pytest.mark.skipif(not hubrt.distributed.available(), reason="libhubrt built without MPI")
def test_collectives_over_three_ranks_match_torch(tmp_path):
    out = tmp_path / "ok"
    p = subprocess.run([str(CLI), "launch", "-n", "3", "--", sys.executable, str(WORKER), str(out)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HUBRT_DIST_TIMEOUT": "30"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert out.read_text() == "ok"


def test_a_group_of_one():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.float32([1, 2, 3, 4])
    np.testing.assert_array_equal(ops.all_reduce(hubrt.from_numpy(x), hubrt.from_numpy(b)).numpy(), x + b)
    np.testing.assert_array_equal(ops.all_reduce(hubrt.from_numpy(x), dtype="bf16").numpy(),
                                  torch.from_numpy(x).bfloat16().float().numpy())
    np.testing.assert_array_equal(ops.all_gather(hubrt.from_numpy(x), dim=0, total=3).numpy(), x)
    np.testing.assert_array_equal(ops.broadcast(hubrt.from_numpy(x)).numpy(), x)
    with pytest.raises(hubrt.HubrtError, match="root 1 is not a rank of the group of 1"):
        ops.broadcast(hubrt.from_numpy(x), root=1)
    with pytest.raises(hubrt.HubrtError, match="rank 0 of 1 holds 3 along dim 0, but its part of 5 is 5"):
        ops.all_gather(hubrt.from_numpy(x), dim=0, total=5)
    with pytest.raises(hubrt.HubrtError, match="total 2 is less than this rank's part 3"):
        ops.all_gather(hubrt.from_numpy(x), dim=0, total=2)
    with pytest.raises(hubrt.HubrtError, match=r"all_reduce.: shapes \[3, 4\] and \[3\] do not broadcast"):
        ops.all_reduce(hubrt.from_numpy(x), hubrt.from_numpy(np.zeros(3, np.float32)))
    ids = hubrt.from_numpy(np.array([0, 5, 6, 9]))
    rows = ops.embedding(hubrt.from_numpy(x), ids, first=5).numpy()
    np.testing.assert_array_equal(rows, np.stack([np.zeros(4), x[0], x[1], np.zeros(4)]).astype(np.float32))
    with pytest.raises(hubrt.HubrtError, match="id 5 at position 1 is out of range for weight with 3 rows"):
        ops.embedding(hubrt.from_numpy(x), ids)


def test_a_group_of_one_on_xla_cpu():
    """On a PJRT device in a process of no group, each collective is a
    module of one replica (the same results as on the CPU)."""
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.float32([1, 2, 3, 4])
    xd, bd = hubrt.from_numpy(x).to("xla_cpu"), hubrt.from_numpy(b).to("xla_cpu")
    np.testing.assert_array_equal(ops.all_reduce(xd, bd).numpy(), x + b)
    np.testing.assert_array_equal(ops.all_gather(xd, dim=1, total=4).numpy(), x)
    np.testing.assert_array_equal(ops.broadcast(xd).numpy(), x)


def test_dist_builds_without_mpi(tmp_path):
    """src/dist/dist.c as a build without MPI compiles it (-DHUBRT_MPI=OFF,
    or no MPI found): a group of one that names what is missing, with no
    MPI symbol left to link."""
    root = Path(__file__).resolve().parents[2]
    obj, exe = tmp_path / "dist.o", tmp_path / "probe"
    subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", "-c", "-I", root / "include", "-I",
                    root / "src", root / "src" / "dist" / "dist.c", "-o", obj], check=True)
    undefined = subprocess.run(["nm", "-u", obj], capture_output=True, text=True, check=True).stdout
    assert "MPI_" not in undefined
    # linked alone against stand-ins for the two core and ops calls it makes
    probe = tmp_path / "probe.c"
    probe.write_text(r'''
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "hubrt/dist.h"
static char msg[1024];
hr_status hr_error(hr_status s, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt); vsnprintf(msg, sizeof msg, fmt, ap); va_end(ap); return s;
}
int main(void) {
    if (hr_dist_available() || hr_dist_size() != 1 || hr_dist_rank() != 0) return 1;
    if (hr_dist_init() != HR_ERR_UNSUPPORTED) return 2;
    puts(msg);
    return hr_dist_barrier() == HR_OK ? 0 : 3;
}
''')
    subprocess.run(["cc", "-std=c11", "-I", root / "include", "-I", root / "src", probe, obj, "-o", exe], check=True)
    p = subprocess.run([exe], capture_output=True, text=True)
    assert p.returncode == 0
    assert "built without MPI" in p.stdout and "libopenmpi-dev" in p.stdout
