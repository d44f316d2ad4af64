"""One rank of a tensor-parallel test run (test_tp.py starts it under
`hubrt launch -n N`): loads the model split over the group, writes the
prompt's logits and a greedy generation (rank 0), and each rank's peak
RSS; or plays a fault in rank 1.

    tp_worker.py MODEL OUT.npz --tp N [--ep N] [--plan JSON] [--compile] [--new K]
                 [--dtype D] [--fault raise|hang|kill|exit|exit0]
                 [--as-budget-mb MB]

--as-budget-mb caps the rank's address space (RLIMIT_AS, what `prlimit
--as` and `ulimit -v` set) at what it holds once it joined the group plus
MB: a load that needs more fails with the library's message, exit 3."""
import argparse
import json
import os
import resource
import signal
import sys
import time

import numpy as np

import hubrt

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("out")
p.add_argument("--tp", type=int, default=1)
p.add_argument("--ep", type=int, default=1)
p.add_argument("--plan")
p.add_argument("--compile", action="store_true")
p.add_argument("--new", type=int, default=64)
p.add_argument("--dtype", default="float32")
p.add_argument("--fault")
p.add_argument("--as-budget-mb", type=float)
a = p.parse_args()

plan = json.loads(a.plan) if a.plan else "auto"
dc = hubrt.DistributedConfig(tp_size=a.tp, tp_plan=plan, ep_size=a.ep) if a.tp > 1 or a.ep > 1 else None
if a.as_budget_mb:
    if dc:
        hubrt.distributed.init()  # MPI's own mappings are not the model's
    vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) * 1024
    cap = vm + int(a.as_budget_mb * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
try:
    model = hubrt.AutoModelForCausalLM.from_pretrained(a.model, dtype=a.dtype, distributed_config=dc)
except hubrt.HubrtError as e:
    print(f"load failed: {e}", file=sys.stderr)
    sys.exit(3)
rank = hubrt.distributed.rank()
if a.fault and rank == 1:
    if a.fault == "raise":
        raise RuntimeError("rank 1 fails on purpose")
    if a.fault == "hang":
        time.sleep(3600)  # never reaches the first collective
    if a.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if a.fault == "exit":
        os._exit(5)
    if a.fault == "exit0":
        sys.exit(0)  # a clean exit, before the others are done
vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
ids = np.random.default_rng(7).integers(3, vocab, (2, 9))
logits = model(ids).logits
kw = dict(cache_implementation="static") if a.compile else {}
gen = model.generate(ids, max_new_tokens=a.new, do_sample=False, eos_token_id=[], **kw)
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
with open(f"{a.out}.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "peak_rss_mb": peak_mb, "netns": os.readlink("/proc/self/ns/net")}, f)
if rank == 0:
    np.savez(a.out, logits=np.asarray(logits, dtype=np.float32), ids=np.asarray(gen), prompt=ids)
