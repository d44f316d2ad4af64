"""ggml's own base library (libggml-base: its reference quantizers and its
GGUF reader), built from the llama.cpp sources in the pinned
llama-cpp-python sdist (scripts/llama_cpp_convert.py fetches it), for the
tests that hold hubrt's quantizer and GGUF writer against llama.cpp's code.

    python scripts/ggml_ref.py        # prints the library's path

Only the ggml-base target is built (no CPU backend, no llama library):
about 15 s on 2 cores, once per sdist version (cached beside the sdist).
The build is compiled for the baseline x86-64 ISA, as ggml-base always
is, so its float arithmetic has no FMA contraction, like hubrt's."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_cpp_convert import CACHE, PINNED, converter_dir  # noqa: E402


def library(version=PINNED, cache=CACHE):
    src = converter_dir(version, cache)
    out = Path(cache) / f"ggml-base-{version}"
    lib = out / "libggml-base.so"
    if lib.exists():
        return lib
    with tempfile.TemporaryDirectory() as build:
        cfg = ["cmake", "-S", str(src), "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
               "-DGGML_CPU=OFF", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_CURL=OFF"]
        subprocess.run(cfg, check=True, capture_output=True)
        subprocess.run(["cmake", "--build", build, "--target", "ggml-base", "-j", str(os.cpu_count() or 2)],
                       check=True, capture_output=True)
        built = sorted(Path(build).rglob("libggml-base.so*"), key=lambda p: len(p.name))[-1]
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f"libggml-base.so.tmp{os.getpid()}"
        shutil.copy2(built.resolve(), tmp)
        os.replace(tmp, lib)
    return lib


if __name__ == "__main__":
    print(library())
