#!/usr/bin/env bash
# The AMX check, for a lent device machine's host CPU (hubrt's own machines
# have had no AMX): one call that measures what issue 5's prefill target
# needs and checks the tile kernels on real tiles. Prepared here with
# `make devkit`; run there as
#     bash bench/device_check.sh        (carry: .devkit)
# On a CPU without usable AMX tiles it prints the machine and stops within
# seconds (DEVICE_CHECK_FORCE=1 runs the rest anyway, to try the script on
# any machine). Steps, each bounded by a timeout so the whole stays under
# ~8 minutes on 16 cores:
#   1. the machine: CPU, flags, what hubrt detects, torch/transformers versions;
#   2. the C tests (each kernel path the CPU has, AMX tiles included);
#   3. the linear oracle tests against torch and transformers with amx;
#   4. bench_gemm's Qwen3 shapes at 512 rows and bench_gemv's at one row,
#      2 threads, amx then avx512;
#   5. bench/run.sh on the Qwen3-0.6B shape (hubrt eager and compiled,
#      transformers eager; prefill 512 + decode 128 at batch 1, batch 64),
#      limits re-measured in the run (AMX peak, read bandwidth), and
#      prefill and decode again under amx and avx512, alternated.
# Output: device_check.log, latest.json and latest.md (the bench table with
# fractions of the AMX peak) and logs.tar.gz (every log) under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KIT=$ROOT/.devkit
OUT=${OUT:-$ROOT/bench/results/device.tmp}
PY=${PY:-python3}
THREADS=2
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

[[ -x $KIT/bin/hubrt ]] || { echo "device_check: no $KIT/bin/hubrt: run make devkit here and carry .devkit"; exit 1; }
export LD_LIBRARY_PATH=$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export HUBRT_SHARED_DIR=$KIT/shared HUBRT_SOURCE_DIR=$ROOT
export HUBRT_AMX_EMULATE=0 # real tiles or nothing: never the emulator here
export PYTHONUNBUFFERED=1
export HUBRT_GIT_REV=$(cat "$KIT/commit" 2>/dev/null) # bench/run.sh records it

step "machine"
echo "kit built from $HUBRT_GIT_REV"
grep -m1 'model name' /proc/cpuinfo
echo "cpus: $(nproc), kernel $(uname -r), $(gcc --version 2>/dev/null | head -n 1 || echo 'no gcc (limits.py builds its probes with it)')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(amx|avx512_bf16|avx512f$)' | tr '\n' ' ')"
"$KIT/bin/hubrt" info --json | "$PY" -c 'import json, sys; print("hubrt:", json.load(sys.stdin)["cpu"])'
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
isa=$("$KIT/bin/hubrt" info --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["cpu"]["isa"])')
if [[ $isa != amx && -z ${DEVICE_CHECK_FORCE:-} ]]; then
  echo "hubrt's kernel ISA here is $isa, not amx (no AMX tiles, or the kernel refused their state):"
  echo "nothing to measure. Give the machine back."
  exit 0
fi

step "C tests (every kernel path this CPU has)"
LOGS=/tmp/device_check_logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
ls "$KIT"/bin/test_* | grep -v -E 'test_(tokenizer|pjrt)$' |
  xargs -P 8 -I{} sh -c 'n=$(basename {}); if timeout 300 {} > "$0/ctest-$n.log" 2>&1; then echo "pass $n";
                           else echo "FAIL $n (rc $?): $(grep -m3 -E "FAIL|ERROR|Error" "$0/ctest-$n.log" | tr "\n" " ")"; fi' "$LOGS"

step "linear oracle tests with amx (torch, transformers)"
HUBRT_LIBRARY=$KIT/bin/libhubrt.so PYTHONPATH=$ROOT/python timeout 300 "$PY" -m pytest -q -p no:cacheprovider \
  tests/python/test_linear_pack.py tests/python/test_ops_linalg.py -k amx 2>&1 | tail -n 15

step "bench_gemm: Qwen3 shapes, 512 rows, $THREADS threads, packed weights"
for i in amx avx512; do
  echo "-- HUBRT_CPU_ISA=$i"
  HUBRT_CPU_ISA=$i timeout 120 "$KIT/bin/bench_gemm" --model qwen3 --rows 512 --threads "$THREADS" --pack
done

# Packed weights go to the panel route at every row count, and under amx
# its tiles take one-row decode too: whether they stream the weights as
# fast as the AVX-512 tile has not been measured anywhere.
step "bench_gemv: Qwen3 shapes, 1 row, $THREADS threads, packed weights, huge pages"
for i in amx avx512; do
  echo "-- HUBRT_CPU_ISA=$i"
  HUBRT_CPU_ISA=$i timeout 60 "$KIT/bin/bench_gemv" --model qwen3 --rows 1 --threads "$THREADS" --pack --huge
done

step "bench/run.sh: Qwen3-0.6B shape, $THREADS threads"
RES=/tmp/device_bench
PY=$PY HUBRT_BUILD=.devkit/bin BENCH_SKIP_INSTALL=1 BENCH_MODELS=qwen3-0.6b-shaped BENCH_REPEATS=1 \
  BENCH_ENGINES="hubrt hubrt-compiled transformers-eager" BENCH_CASE_SPEC="b1:1:512:128 b64:64:16:32" \
  BENCH_RESULTS=$RES BENCH_THREADS=$THREADS timeout 420 bash bench/run.sh
cp "$RES"/latest.json "$RES"/latest.md "$OUT/" 2>/dev/null

step "prefill 512 and decode 64 under each ISA, $THREADS threads (last line of hubrt bench)"
for i in amx avx512 amx avx512; do
  echo "-- HUBRT_CPU_ISA=$i"
  HUBRT_CPU_ISA=$i HUBRT_NUM_THREADS=$THREADS timeout 120 "$KIT/bin/hubrt" bench fixtures/qwen3-0.6b-shaped \
    --prompt-len 512 --gen 64 --dtype bf16 2>/dev/null | tail -n 1
done

tar czf "$OUT/logs.tar.gz" -C "$RES" run.tmp -C "$LOGS" . 2>/dev/null
step "done"
