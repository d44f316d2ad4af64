#!/usr/bin/env bash
# Builds another commit of hubrt (default: the one before HEAD) into a build
# folder beside this one, for `make bench` to run it in the same rounds as
# the working tree's build (BENCH_BASELINE_BUILD; bench/run.sh).
#
#     scripts/baseline_build.sh [REV] [OUT]      (defaults: HEAD~1, build-base)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD~1}
out=${2:-build-base}
src=$(mktemp -d)
trap 'git worktree remove --force "$src" >/dev/null 2>&1 || rm -rf "$src"' EXIT
git worktree add -q --detach "$src" "$rev"
# the PJRT header of this tree's .venv (the worktree has no .venv of its own)
pjrt=$(.venv/bin/python -c "import os, xla_plugins.xla_cpu_pjrt as m; print(os.path.join(m.__path__[0], 'include'))" 2>/dev/null || true)
cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHUBRT_TESTS=OFF ${pjrt:+-DHUBRT_PJRT_INCLUDE_DIR=$pjrt} >/dev/null
cmake --build "$out" -j "$(nproc)"
echo "$out: hubrt at $(git rev-parse --short "$rev")"
