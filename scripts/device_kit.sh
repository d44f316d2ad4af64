#!/usr/bin/env bash
# `make devkit`: packs into .devkit/ (git-ignored) what bench/device_check.sh
# needs on a lent device machine, whose image has a compiler, Python, torch
# and transformers but none of hubrt's C dependencies and no network:
#   bin/    the CLI, libhubrt.so, the kernel benchmarks and the C tests,
#           built here (x86-64-v3 baseline, AVX-512 and AMX chosen at run
#           time; glibc symbols up to 2.34), debug info stripped
#   lib/    the shared libraries they load beyond glibc (cJSON, PCRE2,
#           utf8proc, cmocka), copied from this machine's packages
#   shared/ the qwen3 tokenizer the bench checkpoint carries, and the limit
#           probes' sources (bench/limits.py builds them there)
# Then, in one device call: command "bash bench/device_check.sh", carry
# [".devkit"] (docs/benchmarks.md, "On a lent device machine").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${HUBRT_BUILD:-build}
SHARED=${HUBRT_SHARED_DIR:-../shared}
KIT=.devkit

for f in "$BUILD/hubrt" "$BUILD/libhubrt.so" "$BUILD/bench_gemm" "$BUILD/test_amx_kernel"; do
  [[ -f $f ]] || { echo "device_kit: $f is missing: run make build first" >&2; exit 1; }
done
for d in "$SHARED/data/tokenizers/qwen3" "$SHARED/tools/limits"; do
  [[ -d $d ]] || { echo "device_kit: $d is missing (set HUBRT_SHARED_DIR)" >&2; exit 1; }
done

rm -rf "$KIT.tmp"
mkdir -p "$KIT.tmp/bin" "$KIT.tmp/lib" "$KIT.tmp/shared/data/tokenizers" "$KIT.tmp/shared/tools"
cp "$BUILD/hubrt" "$BUILD/libhubrt.so" "$BUILD"/bench_* "$BUILD"/test_* "$KIT.tmp/bin/"
strip --strip-debug "$KIT.tmp"/bin/*

# Every library the binaries load that is not part of glibc itself (which
# the device's newer glibc provides).
ldd "$KIT.tmp"/bin/* 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$KIT.tmp/lib/"; done

cp -r "$SHARED/data/tokenizers/qwen3" "$KIT.tmp/shared/data/tokenizers/"
cp -r "$SHARED/tools/limits" "$KIT.tmp/shared/tools/"

# the commit the binaries were built from, for the bench's record there
# (the device's copy of the tree may carry no .git)
echo "$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- src include tools bench 2>/dev/null || echo -dirty)" \
  > "$KIT.tmp/commit"
rm -rf "$KIT"
mv "$KIT.tmp" "$KIT"
echo "device_kit: $(du -sh "$KIT" | cut -f1) in $KIT ($(ls "$KIT/lib" | tr '\n' ' '))"
