"""The `isa` fixture: runs a test under each CPU kernel ISA the machine has
(hr_cpu_isa_set), restoring the previous one afterwards. `linear_isa`
adds amx, for the tests of the linear kernels: on the tiles where the CPU
has them, else on the tile emulator (conftest.py sets HUBRT_AMX_EMULATE=1;
it needs AVX-512 BF16); the other ops have no AMX path of their own."""
import ctypes

import pytest

from hubrt._lib import lib

ISA = {"scalar": 0, "avx2": 1, "avx512": 2, "amx": 3}
lib.hr_cpu_isa_get.restype = ctypes.c_int
lib.hr_cpu_isa_set.argtypes = [ctypes.c_int]


def use_isa(name):
    """Sets the kernel ISA for the test (skipped where the CPU lacks it);
    returns the setting to restore."""
    before = lib.hr_cpu_isa_get()
    if lib.hr_cpu_isa_set(ISA[name]) != 0:
        pytest.skip(f"this CPU has no {name} path")
    return before


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def isa(request):
    """Runs the test under one kernel ISA (skipped where the CPU lacks it)."""
    before = use_isa(request.param)
    yield request.param
    lib.hr_cpu_isa_set(before)


@pytest.fixture(params=["amx", "avx512", "avx2", "scalar"])
def linear_isa(request):
    """`isa` with amx too."""
    before = use_isa(request.param)
    yield request.param
    lib.hr_cpu_isa_set(before)
