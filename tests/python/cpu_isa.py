"""The `isa` fixture: runs a test under each CPU kernel ISA the machine has
(hr_cpu_isa_set), restoring the previous one afterwards."""
import ctypes

import pytest

from hubrt._lib import lib

ISA = {"scalar": 0, "avx2": 1, "avx512": 2}
lib.hr_cpu_isa_get.restype = ctypes.c_int
lib.hr_cpu_isa_set.argtypes = [ctypes.c_int]


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def isa(request):
    """Runs the test under one kernel ISA (skipped where the CPU lacks it)."""
    before = lib.hr_cpu_isa_get()
    if lib.hr_cpu_isa_set(ISA[request.param]) != 0:
        pytest.skip(f"this CPU has no {request.param} path")
    yield request.param
    lib.hr_cpu_isa_set(before)
