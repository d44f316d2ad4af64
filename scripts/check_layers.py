#!/usr/bin/env python3
"""Checks that every layer of src/ depends only on the layers below it, as
src/layers.txt orders them: by the headers each file includes (the public
headers include/hubrt/*.h count as the layer that implements them), and,
given a build, by the symbols each object file leaves undefined (nm) that
another layer's object defines. Prints one line per violation; exit 1 on any.

    scripts/check_layers.py [--src DIR] [--objects DIR]
"""
import argparse
import os
import re
import subprocess
import sys

# Public headers: the layer whose code they declare.
PUBLIC = {
    "hubrt.h": "tools", "hubrt/base.h": "core", "hubrt/tensor.h": "core", "hubrt/runtime.h": "core",
    "hubrt/op_list.h": "core", "hubrt/ops.h": "core", "hubrt/graph.h": "graph", "hubrt/io.h": "io", "hubrt/hub.h": "io",
    "hubrt/tokenizer.h": "tokenizer", "hubrt/chat.h": "tokenizer", "hubrt/model.h": "models", "hubrt/image_models.h": "models",
    "hubrt/diffusion.h": "pipelines", "hubrt/dist.h": "dist",
    # the ABI kernel libraries compile against: declarations only, no code
    "hubrt/kernel_abi.h": "core", "hubrt/kernels.h": "kernels",
}


def read_layers(path):
    """{unit: line number} from layers.txt; tools above every line."""
    rank = {}
    lines = [l.split("#")[0].split() for l in open(path)]
    for i, units in enumerate(u for u in lines if u):
        for u in units:
            rank[u] = i
    rank["tools"] = max(rank.values()) + 1
    return rank


def unit_of(rel, rank):
    """The unit of a path relative to src/ (or a header name as included):
    the longest layers.txt entry it lies under, or None."""
    parts = rel.split("/")
    for n in range(len(parts), 0, -1):
        u = "/".join(parts[:n])
        if u in rank:
            return u
    return None


def allowed(frm, to, rank):
    return frm == to or rank[to] < rank[frm]


def include_violations(src, rank):
    out = []
    for dp, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith((".c", ".h")):
                continue
            path = os.path.join(dp, f)
            rel = os.path.relpath(path, src)
            frm = unit_of(rel, rank)
            if frm is None:
                out.append(f"{rel}: its folder is not in layers.txt")
                continue
            for no, line in enumerate(open(path, errors="replace"), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                to = PUBLIC.get(inc) or unit_of(inc, rank)
                if to is None:
                    if "/" in inc:
                        out.append(f"{rel}:{no}: includes \"{inc}\", which no layer holds")
                    continue
                if not allowed(frm, to, rank):
                    out.append(f"{rel}:{no}: {frm} includes \"{inc}\" of {to}, "
                               f"{'a sibling' if rank[to] == rank[frm] else 'a higher layer'}")
    return out


def object_symbols(objects, src):
    """{object rel path (as its source, relative to src/): (defined, undefined)}
    for the objects whose sources still exist (a stale object is skipped)."""
    table = {}
    for dp, _, files in os.walk(objects):
        for f in files:
            if not f.endswith(".o"):
                continue
            path = os.path.join(dp, f)
            rel = os.path.relpath(path, objects)[:-2]  # x.c.o -> x.c
            if src is not None and not os.path.exists(os.path.join(src, rel)):
                continue
            nm = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
            defined, undefined = set(), set()
            for line in nm.splitlines():
                p = line.split()
                if len(p) == 2 and p[0] == "U":
                    undefined.add(p[1])
                elif len(p) == 3 and p[1] in "TDBRVWGS":
                    defined.add(p[2])
            table[rel] = (defined, undefined)
    return table


def symbol_violations(objects, src, rank):
    table = object_symbols(objects, src)
    where = {}
    for rel, (defined, _) in table.items():
        for s in defined:
            where[s] = rel
    out = []
    for rel, (_, undefined) in sorted(table.items()):
        frm = unit_of(rel, rank)
        for s in sorted(undefined):
            if s not in where or frm is None:
                continue
            to = unit_of(where[s], rank)
            if to is not None and not allowed(frm, to, rank):
                out.append(f"{rel}: {frm} calls {s}, defined in {where[s]} of {to}")
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.path.join(root, "src"))
    ap.add_argument("--layers", default=None, help="default: SRC/layers.txt")
    ap.add_argument("--objects", help="the object files of src/ (build/CMakeFiles/hubrt_obj.dir/src)")
    a = ap.parse_args()
    rank = read_layers(a.layers or os.path.join(a.src, "layers.txt"))
    bad = include_violations(a.src, rank)
    if a.objects:
        bad += symbol_violations(a.objects, a.src, rank)
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
