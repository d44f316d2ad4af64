"""Re-measures the machine's limits in the same run as the benchmarks.

Builds the probes in ../shared/tools/limits ($HUBRT_SHARED_DIR/tools/limits
where set) into a scratch folder and runs:
DRAM read bandwidth (1 GiB, 1 and 2 threads, with huge pages; on CPUs
without AVX-512, bench/probes/readbw_avx2.c, the same method) and the bf16
compute peak: AMX tiles where the CPU has them, AVX512_BF16 (vdpbf16ps)
otherwise, and on CPUs with neither the f32 FMA peak on AVX2
(bench/probes/fma_avx2.c), which is what hubrt's AVX2 kernels compute bf16
in after widening it. Prints one JSON object."""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SHARED = Path(os.environ.get("HUBRT_SHARED_DIR", Path(__file__).resolve().parents[1].parent / "shared"))
SRC = SHARED / "tools" / "limits"
PROBES = Path(__file__).resolve().parent / "probes"


def build(name, extra, out, src=SRC):
    exe = Path(out) / name
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", str(src / f"{name}.c"), "-o", str(exe),
                    *extra], check=True, capture_output=True)
    return exe


def run(exe, threads, args=(), env=None):
    e = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="close", **(env or {}))
    return subprocess.run([str(exe), *args], env=e, check=True, capture_output=True, text=True).stdout


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def build_readbw(out):
    """The read-bandwidth probe for this CPU, built into `out`."""
    if "avx512f" in cpu_flags():
        return build("readbw", [], out)  # the shared probe reads with AVX-512 loads
    return build("readbw_avx2", [], out, PROBES)  # ours, the same method with AVX2 loads


def read_gbs(exe, threads, mib=1024):
    """One probe: the median of its passes over `mib` MiB in huge pages."""
    out = run(exe, threads, [str(mib)], env={"HUGE": "1"})
    return float(re.search(r"median ([0-9.]+)", out).group(1))


def main():
    if sys.argv[1:2] == ["--build-readbw"]:
        # bench/run.sh: the probe bench/report.py runs beside each bandwidth-bound case
        print(build_readbw(sys.argv[2]))
        return
    res = {"cpu": "", "read_gbs": {}, "bf16_peak_gflops": {}, "bf16_unit": ""}
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
        res["cpu"] = m.group(1).strip() if m else ""
    flags = cpu_flags()
    with tempfile.TemporaryDirectory() as tmp:
        rb = build_readbw(tmp)
        for t in (1, 2):
            res["read_gbs"][str(t)] = read_gbs(rb, t)
        if "amx_bf16" in flags:
            exe = build("amx", ["-mamx-tile", "-mamx-bf16"], tmp)
            res["bf16_unit"] = "amx"
        elif "avx512_bf16" in flags:
            exe = build("dpbf16_chains", [], tmp)
            res["bf16_unit"] = "avx512_bf16"
        elif {"avx2", "fma"} <= flags:
            exe = build("fma_avx2", [], tmp, PROBES)
            res["bf16_unit"] = "avx2_fma_f32"
        else:
            exe = None
        if res["bf16_unit"] == "amx":
            for t in (1, 2):
                out = run(exe, t)
                medians = [float(v) for v in re.findall(r"median ([0-9.]+)", out)]
                res["bf16_peak_gflops"][str(t)] = max(medians) * 1000 if medians else None
        elif exe is not None:
            # The vdpbf16ps probe is single-threaded: run one copy per core at once.
            for t in (1, 2):
                procs = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True) for _ in range(t)]
                total = 0.0
                for p in procs:
                    out = p.communicate()[0]
                    found = re.findall(r"x64 flop = ([0-9.]+) GFLOP/s", out) or re.findall(r"median ([0-9.]+) GFLOP/s", out)
                    total += max(float(v) for v in found)
                res["bf16_peak_gflops"][str(t)] = total
    json.dump(res, sys.stdout)
    print()


if __name__ == "__main__":
    main()
