"""The hubrt CLI beside the library under test, and a run of it that also
reports its own peak RSS (wait4's rusage, which counts that child alone,
where RUSAGE_CHILDREN keeps the largest child so far)."""
import os
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = os.environ.get("HUBRT_CLI", str(Path(os.environ.get("HUBRT_LIBRARY", ROOT / "build" / "x")).parent / "hubrt"))


def run_with_peak(args, stdin=""):
    """(exit code, stdout, stderr, peak RSS in kB) of `hubrt ARGS` fed `stdin`."""
    p = subprocess.Popen([CLI] + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    err = []
    t = threading.Thread(target=lambda: err.append(p.stderr.read()))
    t.start()
    try:
        p.stdin.write(stdin)
        p.stdin.close()
    except BrokenPipeError:
        pass
    out = p.stdout.read()
    t.join()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return p.returncode, out, err[0], usage.ru_maxrss
