"""The layering of src/ (src/layers.txt): the sources and the built objects
pass scripts/check_layers.py, and the check fails on an upward include, a
sibling include and an upward call, each made here on purpose."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check_layers.py"
OBJECTS = ROOT / "build" / "CMakeFiles" / "hubrt_obj.dir" / "src"


def run_check(*args):
    r = subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True)
    return r.returncode, r.stdout


def test_sources_and_objects_respect_the_layers():
    if not OBJECTS.is_dir():
        pytest.skip("no build/ objects (run make first)")
    rc, out = run_check("--objects", str(OBJECTS))
    assert rc == 0, out


@pytest.fixture
def src_copy(tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(ROOT / "src", dst)
    return dst


def test_upward_include_fails(src_copy):
    tensor = src_copy / "core" / "tensor.c"
    tensor.write_text(tensor.read_text() + '\n#include "graph/plan.h"\n')
    rc, out = run_check("--src", str(src_copy))
    assert rc == 1
    assert 'core/tensor.c' in out and '"graph/plan.h" of graph, a higher layer' in out


def test_sibling_include_fails(src_copy):
    cpu = src_copy / "backends" / "cpu" / "cpu_device.c"
    cpu.write_text('#include "backends/pjrt/pjrt.h"\n' + cpu.read_text())
    rc, out = run_check("--src", str(src_copy))
    assert rc == 1 and "a sibling" in out and "backends/cpu/cpu_device.c:1" in out


def test_upward_call_fails(tmp_path):
    """A core object calling a graph function, with no include at all: nm
    catches what the include check cannot see."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "src"
    for rel, code in {"core/low.c": "int hr_plan_build_x(void);\nint low(void) { return hr_plan_build_x(); }\n",
                      "graph/high.c": "int hr_plan_build_x(void) { return 1; }\n"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(code)
        obj = tmp_path / "obj" / (rel + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([cc, "-c", str(src / rel), "-o", str(obj)], check=True)
    shutil.copy(ROOT / "src" / "layers.txt", src / "layers.txt")
    rc, out = run_check("--src", str(src), "--objects", str(tmp_path / "obj"))
    assert rc == 1
    assert "core/low.c: core calls hr_plan_build_x, defined in graph/high.c of graph" in out


def test_a_folder_outside_the_layers_fails(src_copy):
    (src_copy / "widgets").mkdir()
    (src_copy / "widgets" / "w.c").write_text("int w;\n")
    rc, out = run_check("--src", str(src_copy))
    assert rc == 1 and "widgets/w.c: its folder is not in layers.txt" in out
