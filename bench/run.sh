#!/usr/bin/env bash
# `make bench`: hubrt beside transformers (eager and torch.compile) and
# llama.cpp on the same bf16 checkpoints, 2 threads, with the machine's
# limits measured in the same run. Writes bench/results/latest.{json,md,png}.
# Method and budget: docs/benchmarks.md.
#
# Knobs (environment): PY (the Python with torch and transformers, default
# .venv/bin/python), HUBRT_BUILD (build folder with the hubrt CLI and
# libhubrt.so, default build), BENCH_MODELS (default: the three dense shapes and the two MoE ones), BENCH_ENGINES (default: all),
# BENCH_CASE_SPEC (name:batch:prompt:gen list), BENCH_RUN_TIMEOUT (seconds per engine
# process, default 420), BENCH_BUDGET (seconds for all model cases, default
# 6300: later runs are recorded as skipped), BENCH_THREADS (default 2),
# BENCH_RESULTS (output folder, default bench/results), BENCH_SKIP_INSTALL=1
# (use the packages already in .venv), BENCH_REPEATS (rounds of each case,
# default 3) and BENCH_REPEAT_ENGINES (the engines run in every round, default
# hubrt, hubrt-compiled and llama.cpp: the close ones; the others run once).
# BENCH_BASELINE_BUILD (a build folder of another commit, e.g. the one
# before a change: scripts/baseline_build.sh makes it) adds the engines
# hubrt-base and hubrt-compiled-base, run in the same rounds as the others,
# so that a change is measured against its base in one run.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
BUILD=${HUBRT_BUILD:-build}
HUBRT=$ROOT/$BUILD/hubrt
THREADS=${BENCH_THREADS:-2}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-420}
BUDGET=${BENCH_BUDGET:-6300}
# the MoE shapes (bench/make_moe_checkpoint.py): Qwen3-30B-A3B's layers cut to 12, and Gemma 4
# 26B-A4B's cut to 8, whose rows come last, once the first one's files are gone
MOE_MODEL=qwen3-30b-a3b-12l-shaped
G4_MODEL=gemma4-26b-a4b-8l-shaped
MODELS=${BENCH_MODELS:-"qwen3-0.6b-shaped llama-3.2-1b-shaped smollm2-135m-shaped $MOE_MODEL $G4_MODEL"}
FIRST_MODELS=$(tr ' ' '\n' <<< "$MODELS" | grep -vx "$G4_MODEL" | tr '\n' ' ')
ENGINES=${BENCH_ENGINES:-"hubrt hubrt-compiled hubrt-xla_cpu transformers-eager transformers-compile llama.cpp"}
RESULTS=${BENCH_RESULTS:-$ROOT/bench/results}
REPEATS=${BENCH_REPEATS:-3}
REPEAT_ENGINES=${BENCH_REPEAT_ENGINES:-"hubrt hubrt-compiled llama.cpp"}
BASE_BUILD=${BENCH_BASELINE_BUILD:-}
if [[ -n $BASE_BUILD ]]; then
  [[ $BASE_BUILD = /* ]] || BASE_BUILD=$ROOT/$BASE_BUILD
  [[ " $ENGINES " == *" hubrt-base "* ]] || ENGINES="$ENGINES hubrt-base hubrt-compiled-base"
  [[ -n ${BENCH_REPEAT_ENGINES:-} ]] || REPEAT_ENGINES="$REPEAT_ENGINES hubrt-base hubrt-compiled-base"
fi
WORK=$RESULTS/run.tmp
FIX=$ROOT/fixtures
START=$(date +%s)
log() { echo "[bench] $*" >&2; }

# The same thread count for every engine and every library under it.
export OMP_NUM_THREADS=$THREADS HUBRT_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS \
       OPENBLAS_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=false

# name:batch:prompt_len:gen. b1 gives prefill 512 and decode 128 at batch 1;
# b16/b64 give decode throughput (short prompts keep their prefill cheap).
CASE_SPEC=${BENCH_CASE_SPEC:-"b1:1:512:128 b16:16:16:32 b64:64:16:32"}
declare -A CASE_ARGS=()
for spec in $CASE_SPEC; do
  IFS=: read -r name b p g <<< "$spec"
  CASE_ARGS[$name]="--prompt-len $p --gen $g --batch $b"
done

rm -rf "$WORK" && mkdir -p "$WORK"

# --- peers and tools (a no-op once installed; the llama.cpp build is cached as a wheel by pip)
if [[ -z ${BENCH_SKIP_INSTALL:-} ]]; then
  log "installing bench requirements (first time: llama.cpp builds from source, ~30 min on 2 cores)"
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$PY" -m pip install -q --disable-pip-version-check -r bench/requirements-bench.txt \
  > "$WORK/pip.log" 2>&1 || log "pip install failed (see $WORK/pip.log); the engines it lacks are recorded as errors"
fi

# --- checkpoints: random-weight bf16 checkpoints in the Hub layout, and their BF16 GGUFs
# shellcheck disable=SC2086
[[ -n ${FIRST_MODELS// /} ]] && { "$PY" scripts/make_fixtures.py bench --only $FIRST_MODELS > "$WORK/fixtures.log" 2>&1 \
  || log "make_fixtures failed (see $WORK/fixtures.log)"; }
# a MoE shape (~15 GB) is written layer by layer, never whole in memory, and deleted after its rows
make_moe() {  # model shape
  [[ -d $FIX/$1 ]] && return
  log "writing $1 (bench/make_moe_checkpoint.py --shape $2, ~15 GB)"
  "$PY" bench/make_moe_checkpoint.py "$FIX/$1" --shape "$2" > "$WORK/moe-fixture-$1.log" 2>&1 \
    || log "make_moe_checkpoint failed (see $WORK/moe-fixture-$1.log)"
}
[[ " $MODELS " == *" $MOE_MODEL "* ]] && make_moe "$MOE_MODEL" qwen3-30b-a3b-12l
to_gguf() {  # models
  [[ " $ENGINES " == *" llama.cpp "* ]] || return
  for m in "$@"; do
    gguf=$FIX/$m.bf16.gguf
    if [[ ! -f $gguf || $FIX/$m/model.safetensors -nt $gguf || $FIX/$m/config.json -nt $gguf ]]; then
      log "converting $m to $gguf with llama.cpp's convert_hf_to_gguf.py"
      "$PY" bench/bench_llamacpp.py convert "$FIX/$m" "$gguf" > "$WORK/convert-$m.log" 2>&1 \
        || log "GGUF conversion of $m failed (see $WORK/convert-$m.log)"
    fi
  done
}
# shellcheck disable=SC2086
to_gguf $FIRST_MODELS

# --- machine description, versions and cases for the report
"$PY" - "$WORK/meta.json" "$THREADS" "$MODELS" "$CASE_SPEC" <<'PYEOF'
import json, os, platform, re, subprocess, sys
from datetime import datetime, timezone
out, threads, models = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
cases = {n: dict(batch=int(b), prompt_len=int(p), gen=int(g))
         for n, b, p, g in (s.split(":") for s in sys.argv[4].split())}
cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read())
mem = int(re.search(r"MemTotal:\s*(\d+)", open("/proc/meminfo").read()).group(1)) / 2**20
def ver(mod):
    try:
        return __import__(mod).__version__
    except Exception as e:
        return f"unavailable ({type(e).__name__})"
try:
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    git = ""
git = git or os.environ.get("HUBRT_GIT_REV", "")  # a copy of the tree without .git (bench/device_check.sh)
json.dump({"date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"cpu": cpu.group(1).strip() if cpu else platform.processor(), "cores": os.cpu_count(),
                       "mem_gb": round(mem, 1), "kernel": platform.release(),
                       "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
           "threads": threads, "dtype": "bf16", "cases": cases, "models": models,
           "versions": {"hubrt_git": git, "torch": ver("torch"), "transformers": ver("transformers"),
                        "llama_cpp_python": ver("llama_cpp"), "python": platform.python_version()}},
          open(out, "w"))
PYEOF

# --- limits, measured now on this machine
measure_limits() {  # $1: start or end
  log "measuring limits (read bandwidth, bf16 peak), at the $1"
  "$PY" bench/limits.py > "$WORK/limits-$1.json" 2> "$WORK/limits-$1.err" || log "limits.py failed (see $WORK/limits-$1.err)"
}
measure_limits start
# the read-bandwidth probe again, run right before and after each case (bench/report.py --probe)
PROBE=$("$PY" bench/limits.py --build-readbw "$WORK" 2> "$WORK/probe.err") || { PROBE=; log "no bandwidth probe beside the cases (see $WORK/probe.err)"; }

# --- tokenizers
log "tokenizer throughput"
HUBRT_LIBRARY=$ROOT/$BUILD/libhubrt.so timeout "$RUN_TIMEOUT" "$PY" bench/bench_tokenizer.py \
  > "$WORK/tokenizer.out" 2> "$WORK/tokenizer.err" || log "bench_tokenizer.py failed (see $WORK/tokenizer.err)"
tail -n 1 "$WORK/tokenizer.out" > "$WORK/tokenizer.json"

# --- model cases: one process per engine, model and case
hubrt_has() { grep -q -- "$1" <<< "$("$HUBRT" bench 2>&1)"; }  # the usage text lists the options
engine_cmd() {  # engine model-dir case-args -> the command line, or nothing when the engine cannot run
  local e=$1 d=$2; shift 2
  case $e in
    hubrt) echo "$HUBRT bench $d $* --dtype bf16" ;;
    hubrt-compiled) hubrt_has "--compile" && echo "$HUBRT bench $d $* --dtype bf16 --compile" ;;
    hubrt-xla_cpu) echo "$HUBRT bench $d $* --dtype bf16 --device xla_cpu --compile" ;;
    hubrt-base) [[ -x $BASE_BUILD/hubrt ]] && echo "$BASE_BUILD/hubrt bench $d $* --dtype bf16" ;;
    hubrt-compiled-base) [[ -x $BASE_BUILD/hubrt ]] && echo "$BASE_BUILD/hubrt bench $d $* --dtype bf16 --compile" ;;
    transformers-eager) echo "$PY bench/bench_transformers.py $d $* --mode eager --threads $THREADS" ;;
    transformers-compile) echo "$PY bench/bench_transformers.py $d $* --mode compile --threads $THREADS" ;;
    llama.cpp) echo "$PY bench/bench_llamacpp.py run $FIX/$(basename "$d").bf16.gguf $* --threads $THREADS" ;;
  esac
}
record_skip() {  # engine model case why
  printf '{"engine":"%s","model":"%s","case":"%s","error":"%s"}\n' "$1" "$2" "$3" "$4" > "$WORK/case-$2.$3.$1.json"
}
# b1 of every model first, then the batch cases: if the budget runs out, the headline cases are in.
run_cases() {  # models
  for spec in $CASE_SPEC; do
    c=${spec%%:*}
    # limits again between the headline cases and the batch cases (the report keeps the highest)
    [[ $spec != "${CASE_SPEC%% *}" && ! -f $WORK/limits-middle.json ]] && measure_limits middle
    for m in $1; do
     for rep in $(seq 1 "$REPEATS"); do
      # rounds after the first: only the engines close enough for the spread to matter; a run that
      # cannot happen was recorded in the first round
      out=$WORK/case-$m.$c
      (( rep > 1 )) && out=$out.r$rep
      for e in $ENGINES; do
        if (( rep > 1 )) && { [[ " $REPEAT_ENGINES " != *" $e "* ]] || (( $(date +%s) - START > BUDGET )) ||
                              [[ ! -f $WORK/case-$m.$c.$e.json ]] || grep -q '"error": ' "$WORK/case-$m.$c.$e.json"; }; then
          continue
        fi
        # xla_cpu compiles one StableHLO module per shape (the warm-up's two, then prefill 512 and decode:
        # ~11 s each on 2 quiet cores, b1 150 s in all; 370 s at load 6): only the headline case of the first model fits
        if [[ $e == hubrt-xla_cpu && ( $c != b1 || $m != ${MODELS%% *} ) ]]; then continue; fi
        if (( $(date +%s) - START > BUDGET )); then
          record_skip "$e" "$m" "$c" "skipped: the run's time budget (BENCH_BUDGET=${BUDGET} s) was spent"
          continue
        fi
        if [[ $e == llama.cpp && ! -f $FIX/$m.bf16.gguf ]]; then
          why=$(grep -h "Error: " "$WORK/convert-$m.log" 2>/dev/null | grep -v CalledProcessError | tail -n 1 | tr -d '"\\' | cut -c1-200)
          record_skip "$e" "$m" "$c" "no GGUF: llama.cpp's converter failed (${why:-see convert-$m.log})"
          continue
        fi
        cmd=$(engine_cmd "$e" "$FIX/$m" ${CASE_ARGS[$c]})
        if [[ -z $cmd ]]; then
          if [[ $e == *-base ]]; then
            record_skip "$e" "$m" "$c" "not available: no hubrt in BENCH_BASELINE_BUILD (${BASE_BUILD:-unset})"
          else
            record_skip "$e" "$m" "$c" "not available: $BUILD/hubrt bench has no --compile option yet"
          fi
          continue
        fi
        probe=()
        [[ -n $PROBE ]] && probe=(--probe "$PROBE" --probe-threads "$THREADS")
        # shellcheck disable=SC2086
        "$PY" bench/report.py case --engine "$e" --model "$m" --case "$c" --timeout "$RUN_TIMEOUT" \
          "${probe[@]}" --out "$out.$e.json" -- $cmd
      done
     done
    done
  done
}
run_cases "$FIRST_MODELS"

# --- serving: hubrt serve and llama-cpp-python's server, 1 and 8 streaming clients (the smallest shape)
if [[ " $MODELS " == *" smollm2-135m-shaped "* ]] && (( $(date +%s) - START <= BUDGET )); then
  log "serving throughput (bench/bench_serve.py)"
  timeout "$RUN_TIMEOUT" "$PY" bench/bench_serve.py --hubrt "$HUBRT" --model "$FIX/smollm2-135m-shaped" \
    --gguf "$FIX/smollm2-135m-shaped.bf16.gguf" --clients 8 --threads "$THREADS" --logs "$WORK" \
    > "$WORK/serve.out" 2> "$WORK/serve.err" || log "bench_serve.py failed (see $WORK/serve.err)"
  tail -n 1 "$WORK/serve.out" > "$WORK/serve.json"
fi

# --- quantized GGUF files (the demo's Q4_1 and llama.cpp's Q8_0, Q4_0, Q4_K_M of it), hubrt against llama.cpp
if [[ " $ENGINES " == *" llama.cpp "* ]] && (( $(date +%s) - START <= BUDGET )); then
  log "quantized GGUF files (bench/bench_quantized.py)"
  timeout $((RUN_TIMEOUT * 8)) "$PY" bench/bench_quantized.py --hubrt "$HUBRT" --threads "$THREADS" \
    --work "$WORK/quantized" --out "$RESULTS/quantized.md" > "$WORK/quantized.out" 2> "$WORK/quantized.err" \
    || log "bench_quantized.py failed (see $WORK/quantized.err)"
fi

# --- hubrt quantize against llama.cpp's converter + llama_model_quantize on the Llama-3.2-1B shape
if [[ " $ENGINES " == *" llama.cpp "* ]] && [[ -f $FIX/llama-3.2-1b-shaped/model.safetensors ]] && \
   (( $(date +%s) - START <= BUDGET )); then
  log "hubrt quantize against llama.cpp (bench/bench_gguf_write.py)"
  HUBRT_LIBRARY=$ROOT/$BUILD/libhubrt.so timeout $((RUN_TIMEOUT * 4)) "$PY" bench/bench_gguf_write.py --hubrt "$HUBRT" \
    --model "$FIX/llama-3.2-1b-shaped" --work "$WORK/gguf-write" --out "$RESULTS/gguf-write.md" \
    > "$WORK/gguf-write.out" 2> "$WORK/gguf-write.err" || log "bench_gguf_write.py failed (see $WORK/gguf-write.err)"
fi

# --- the Hub's FP8 checkpoints: hubrt keeping FP8 blocks, hubrt bf16 and transformers on the same weights
if [[ " $ENGINES " == *" transformers-eager "* ]] && (( $(date +%s) - START <= BUDGET )); then
  log "FP8 checkpoint (bench/bench_fp8.py)"
  timeout $((RUN_TIMEOUT * 6)) "$PY" bench/bench_fp8.py --hubrt "$HUBRT" --threads "$THREADS" \
    --work "$WORK/fp8" --out "$RESULTS/fp8.md" > "$WORK/fp8.out" 2> "$WORK/fp8.err" \
    || log "bench_fp8.py failed (see $WORK/fp8.err)"
  rm -rf "$WORK/fp8"
fi

# --- images: an SD3-medium-shaped transformer and SD3's VAE (random bf16, made and deleted here), hubrt and diffusers
if [[ " $ENGINES " == *" hubrt "* ]] && (( $(date +%s) - START <= BUDGET )); then
  log "SD3-shaped transformer and VAE (bench/bench_sd3.py)"
  HUBRT_LIBRARY=$ROOT/$BUILD/libhubrt.so timeout $((RUN_TIMEOUT * 6)) "$PY" bench/bench_sd3.py --threads "$THREADS" \
    --out "$RESULTS" > "$WORK/sd3.out" 2> "$WORK/sd3.err" || log "bench_sd3.py failed (see $WORK/sd3.err)"
fi

# --- tensor parallelism: tp=2 x 1 thread against tp=1 x 2 threads on the Llama-3.2-1B shape
if [[ " $ENGINES " == *" hubrt "* ]] && [[ -f $FIX/llama-3.2-1b-shaped/model.safetensors ]] && \
   (( $(date +%s) - START <= BUDGET )); then
  log "tensor parallelism (bench/bench_tp.py)"
  timeout $((RUN_TIMEOUT * 4)) "$PY" bench/bench_tp.py --hubrt "$HUBRT" --model "$FIX/llama-3.2-1b-shaped" \
    --work "$WORK" --out "$RESULTS/tp.md" > "$WORK/tp.out" 2> "$WORK/tp.err" || log "bench_tp.py failed (see $WORK/tp.err)"
fi

# --- the experts op alone at the MoE shape's layer, against a plain read of the same weights
if [[ " $MODELS " == *" $MOE_MODEL "* ]] && (( $(date +%s) - START <= BUDGET )) && [[ -x $ROOT/$BUILD/bench_moe ]]; then
  log "the experts op alone (bench_moe)"
  timeout "$RUN_TIMEOUT" "$ROOT/$BUILD/bench_moe" --samples 5 --threads "$THREADS" > "$WORK/moe-layer.out" \
    2> "$WORK/moe-layer.err" || log "bench_moe failed (see $WORK/moe-layer.err)"
fi

# --- Gemma 4's MoE shape last: the first MoE shape's files go first (its shape kept for the report), so
# the disk holds one such model at a time
if [[ " $MODELS " == *" $G4_MODEL "* ]] && (( $(date +%s) - START <= BUDGET )); then
  if [[ -d $FIX/$MOE_MODEL ]]; then
    "$PY" bench/report.py shape "$FIX/$MOE_MODEL" > "$WORK/shape-$MOE_MODEL.json"
    [[ -z ${BENCH_KEEP_MOE:-} ]] && rm -rf "$FIX/$MOE_MODEL" "$FIX/$MOE_MODEL.bf16.gguf"
  fi
  make_moe "$G4_MODEL" gemma4-26b-a4b-8l
  to_gguf "$G4_MODEL"
  run_cases "$G4_MODEL"
fi

# Again at the end: other load on a shared machine only lowers a measured limit, so
# the report takes the highest of the probes (the fractions of the limit are not flattered).
measure_limits end

"$PY" - "$WORK/meta.json" "$START" <<'PYEOF'
import json, sys, time
meta = json.load(open(sys.argv[1]))
meta["elapsed_s"] = round(time.time() - int(sys.argv[2]))
json.dump(meta, open(sys.argv[1], "w"))
PYEOF
"$PY" bench/report.py merge "$WORK" --results "$RESULTS"
# the MoE checkpoint and its GGUF go once the report has read its shape (BENCH_KEEP_MOE=1 keeps them): the disk holds one such model at a time
if [[ -z ${BENCH_KEEP_MOE:-} ]]; then
  rm -rf "$FIX/$MOE_MODEL" "$FIX/$MOE_MODEL.bf16.gguf" "$FIX/$G4_MODEL" "$FIX/$G4_MODEL.bf16.gguf"
fi
cat "$RESULTS/latest.md"
