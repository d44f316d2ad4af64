"""The hubrt CLI beside the library under test, and a run of it that also
reports its own peak RSS.

The peak comes from wait4's rusage in a small middle process (python -S):
Python's subprocess starts children with vfork, and Linux folds the
hiwater RSS of the memory a child execs from (here the test process's own,
tens of MB) into the child's ru_maxrss; from the middle process that floor
is its own ~10 MB."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = os.environ.get("HUBRT_CLI", str(Path(os.environ.get("HUBRT_LIBRARY", ROOT / "build" / "x")).parent / "hubrt"))

_MIDDLE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def run_with_peak(args, stdin=""):
    """(exit code, stdout, stderr, peak RSS in kB) of `hubrt ARGS` fed `stdin`."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        p = subprocess.run([sys.executable, "-S", "-c", _MIDDLE, rss.name, CLI] + [str(a) for a in args],
                           input=stdin, capture_output=True, text=True, timeout=300)
        peak = int(rss.read() or 0)
    return p.returncode, p.stdout, p.stderr, peak


def with_env(env, fn):
    """fn() with os.environ updated by `env` (the CLI children inherit it), restored after."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_tiny_fixtures():
    """The tiny checkpoints under fixtures/ (made by scripts/make_fixtures.py, kept once made):
    a module whose tests read them calls this first, as a fresh clone has none."""
    import sys
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny"], check=True,
                   capture_output=True)
