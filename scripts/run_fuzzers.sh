#!/usr/bin/env bash
# Runs every libFuzzer target on a copy of its seed corpus, with its
# dictionary, under memory and time limits: each target sets hubrt's own
# allocation ceiling (fuzz/fuzz_limits.h: 256 MiB, aborting, anonymous maps
# counted); libFuzzer adds -malloc_limit_mb (one malloc), -rss_limit_mb
# (the process: ASan and the corpus take ~500 MB of it) and -timeout (one
# input). A target stops after SECONDS or RUNS executions, whichever first.
#   scripts/run_fuzzers.sh BUILD SECONDS [RUNS]
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-30}
runs=${3:--1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shopt -s nullglob
targets=("$build"/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz targets built in $build" >&2
  exit 1
fi
for bin in "${targets[@]}"; do
  name=$(basename "$bin")
  mkdir -p "$work/$name"
  for seeds in "fuzz/corpus/$name" "fuzz/corpus/${name#fuzz_}"; do
    [ -d "$seeds" ] && cp -r "$seeds"/. "$work/$name"/
  done
  # the chat templates' seeds are the real templates in ../shared (not copied into this repository)
  if [ "$name" = fuzz_chat_template ] && [ -d ../shared/data/chat_templates ]; then
    cp ../shared/data/chat_templates/*.jinja "$work/$name"/
  fi
  dict=()
  [ -f "fuzz/dict/$name.dict" ] && dict=(-dict="fuzz/dict/$name.dict")
  if [ "$runs" = -1 ]; then echo "fuzzing $name for ${seconds}s"; else echo "fuzzing $name for ${seconds}s or $runs runs"; fi
  "$bin" -max_total_time="$seconds" -runs="$runs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=512 -print_final_stats=1 "${dict[@]}" "$work/$name" 2>"$work/$name.log" ||
    { tail -50 "$work/$name.log"; exit 1; }
  grep -E "stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|cov: " "$work/$name.log" | tail -4 || true
done
