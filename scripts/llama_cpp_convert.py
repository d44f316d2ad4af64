"""llama.cpp's own converter (convert_hf_to_gguf.py and its gguf-py), taken
from the sdist of a llama-cpp-python release, run on an HF checkpoint folder.

    python scripts/llama_cpp_convert.py HF_DIR OUT.gguf [--outtype bf16|f32|f16|q8_0] [--version V]

The version defaults to the installed llama-cpp-python's (so that the bench's
converter and engine come from one llama.cpp commit), else to PINNED, the
bench's pin (bench/requirements-bench.txt). The sdist is fetched once with
pip into --cache (nothing is built: the converter is Python). The output is
written beside OUT and renamed over it, so a failed conversion never leaves a
file that looks converted."""
import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINNED = "0.3.36"
CACHE = ROOT / "fixtures" / ".llama-cpp-src"


def default_version():
    try:
        import llama_cpp
        return llama_cpp.__version__
    except ImportError:
        return PINNED


def converter_dir(version=None, cache=CACHE):
    """The llama.cpp folder of that sdist, fetched and unpacked if needed."""
    version = version or default_version()
    src = Path(cache) / f"llama_cpp_python-{version}"
    conv = src / "vendor" / "llama.cpp"
    if not (conv / "convert_hf_to_gguf.py").exists():
        Path(cache).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                            "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", tmp],
                           check=True)
            tars = list(Path(tmp).glob("*.tar.gz"))
            with tarfile.open(tars[0]) as tf:
                tf.extractall(cache, filter="data")
    return conv


def convert(hf_dir, out, outtype="bf16", version=None, cache=CACHE):
    conv = converter_dir(version, cache)
    hf_dir, out = Path(hf_dir).resolve(), Path(out).resolve()  # the converter runs from its own folder
    tmp_out = Path(str(out) + ".tmp")
    subprocess.run([sys.executable, str(conv / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", outtype,
                    "--outfile", str(tmp_out)], check=True, cwd=conv)
    os.replace(tmp_out, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", default="bf16")
    ap.add_argument("--version", default=None)
    ap.add_argument("--cache", default=str(CACHE))
    args = ap.parse_args()
    convert(args.hf_dir, args.out, args.outtype, args.version, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
