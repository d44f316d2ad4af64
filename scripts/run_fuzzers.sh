#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time on a copy of its seed corpus.
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-30}
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
  echo "fuzzing $name for ${seconds}s"
  "$bin" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "$work/$name" 2>"$work/$name.log" || { tail -50 "$work/$name.log"; exit 1; }
  grep -E "stat::number_of_executed_units" "$work/$name.log" || true
done
