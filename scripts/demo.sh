#!/usr/bin/env bash
# make demo: the main job. Shows the devices, then generates text with a
# model in the Hub layout (see README for which model and why).
set -euo pipefail
cd "$(dirname "$0")/.."
./build/hubrt info
