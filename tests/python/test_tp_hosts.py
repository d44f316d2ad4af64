"""Tensor parallelism across hosts: two network namespaces joined by a
veth pair stand for two machines (each its own address), Open MPI reaches
the second through a fake ssh (tests/python/netns_rsh, which runs the
remote command inside that namespace) and the ranks talk over TCP alone
(btl tcp,self). tp=2 split over the two "hosts" gives the tokens and
logits of one process. The namespaces are made and removed by the test;
it needs root and iproute2 and is skipped without them."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hubrt
from test_tp import CLI, FIX, TOL, WORKER, reference

RSH = Path(__file__).with_name("netns_rsh")


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def can_make_namespaces():
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    probe = f"hrtprobe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


pytestmark = [pytest.mark.skipif(not hubrt.distributed.available(), reason="libhubrt built without MPI"),
              pytest.mark.skipif(not can_make_namespaces(), reason="needs root and iproute2 network namespaces")]


@pytest.fixture
def two_hosts():
    """Namespaces A (10.77.0.1) and B (10.77.0.2) on one veth pair:
    yields {address: namespace}; both are deleted afterwards."""
    tag = os.getpid() % 100000
    ns = {"10.77.0.1": f"hrtA{tag}", "10.77.0.2": f"hrtB{tag}"}
    veth = (f"hrva{tag}", f"hrvb{tag}")
    made = []
    try:
        for name in ns.values():
            ip("netns", "add", name)
            made.append(name)
        ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for (addr, name), dev in zip(ns.items(), veth):
            ip("link", "set", dev, "netns", name)
            ip("-n", name, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", name, "link", "set", dev, "up")
            ip("-n", name, "link", "set", "lo", "up")
        yield ns
    finally:
        for name in made:  # the veth pair goes with its namespaces
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_tp2_across_two_hosts_matches_one_process(two_hosts, tmp_path):
    a, b = two_hosts
    out = tmp_path / "hosts"
    env = {**os.environ, "HUBRT_DIST_TIMEOUT": "60",
           "HUBRT_TEST_NETNS": " ".join(f"{k}={v}" for k, v in two_hosts.items()),
           "OMPI_MCA_plm_rsh_agent": str(RSH), "OMPI_MCA_btl": "tcp,self",
           "OMPI_MCA_btl_tcp_if_include": "10.77.0.0/24", "OMPI_MCA_oob_tcp_if_include": "10.77.0.0/24"}
    model = FIX / "tiny-llama-bias"
    # mpirun starts in A, the first host; B's rank comes up through netns_rsh
    cmd = ["ip", "netns", "exec", two_hosts[a], str(CLI), "launch", "-n", "2", "--threads", "1",
           "--hosts", f"{a},{b}", "--", sys.executable, str(WORKER), str(model), str(out), "--tp", "2", "--new", "32"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    r = np.load(f"{out}.npz")
    ref_logits, ref_ids = reference(model, r["prompt"], new=32)
    np.testing.assert_array_equal(r["ids"], ref_ids)
    err = np.abs(r["logits"] - ref_logits).max() / (ref_logits.max() - ref_logits.min())
    assert err <= TOL
    # each rank ran in its own "host"'s namespace
    seen = [json.load(open(f"{out}.rank{i}.json"))["netns"] for i in range(2)]
    want = [subprocess.run(["ip", "netns", "exec", two_hosts[h], "readlink", "/proc/self/ns/net"], capture_output=True,
                           text=True, check=True).stdout.strip() for h in (a, b)]
    assert seen == want and seen[0] != seen[1]


def test_namespaces_are_removed(tmp_path):
    # after the test above (module order): nothing of ours is left
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"hrtA{os.getpid() % 100000}" not in left and f"hrtB{os.getpid() % 100000}" not in left
