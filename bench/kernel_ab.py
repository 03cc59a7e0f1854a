"""Generated CPU kernels of two bundles, side by side: the same kernel of
bundle A (say, built before an emitter change) and bundle B (after), on the
same inputs, alternately, one thread each; prints each kernel's best time in
A and B and their ratio, and checks that B writes the same bits as A.

Why: a whole training step on a shared 2-core machine drifts by 10-20% from
run to run (BLAS threads, the neighbours), more than most kernel changes
gain; one kernel called alone, A and B interleaved, does not.

    .venv/bin/python bench/kernel_ab.py A.tsb B.tsb                 # every kernel both have
    .venv/bin/python bench/kernel_ab.py A.tsb B.tsb NAME [NAME...]  # just these

A bundle is what `ts.jit` writes under TESSERA_CACHE_DIR/bundles (or
`fn.save(path)`). Inputs are random floats (integers and flags zero), shaped
from the `// memref<...>` comment the emitter writes for each argument.
Exits 1 when a kernel's outputs differ between A and B.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import sys
import time
from pathlib import Path

import numpy as np

_DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32,
           "i8": np.int8, "i1": np.bool_, "bf16": np.uint16}


def kernels(bundle: Path) -> tuple[ctypes.CDLL, dict[str, list]]:
    """The bundle's kernel library and, per kernel with a grid, its
    arguments' (shape, dtype) from the emitted source."""
    source = (bundle / "kernels" / "kernels.cpp").read_text()
    found = {}
    for m in re.finditer(r'extern "C" void (\w+)__range\(([^)]*)\) \{\n((?:  \w.*\n)+)', source):
        args = []
        for line in m.group(3).splitlines():
            typed = re.search(r"// memref<([0-9x]*?)x?(f32|f64|i64|i32|i8|i1|bf16)>", line)
            if typed and "static_cast" in line:
                dims = [int(d) for d in typed.group(1).split("x") if d]
                args.append((dims, _DTYPES[typed.group(2)]))
        found[m.group(1)] = args
    return ctypes.CDLL(str(bundle / "kernels" / "libkernels.so")), found


def inputs(args, rng) -> list[np.ndarray]:
    return [np.array(0.5 * rng.standard_normal(shape), dtype) if dtype in (np.float32, np.float64)
            else np.zeros(shape, dtype) for shape, dtype in args]


def best(fn, arrays, calls: int) -> float:
    ptrs = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*ptrs)
    return (time.perf_counter() - t0) / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="bundle A (the baseline)")
    ap.add_argument("b", type=Path, help="bundle B")
    ap.add_argument("names", nargs="*", help="kernels to compare (default: every common one)")
    ap.add_argument("--reps", type=int, default=20, help="alternations of A and B")
    ap.add_argument("--calls", type=int, default=5, help="calls per timing")
    args = ap.parse_args(argv)
    lib_a, sig_a = kernels(args.a)
    lib_b, sig_b = kernels(args.b)
    names = args.names or sorted(set(sig_a) & set(sig_b))
    rng = np.random.default_rng(0)
    status, total_a, total_b = 0, 0.0, 0.0
    print(f"{'kernel':<48} {'A ms':>9} {'B ms':>9} {'B/A':>6}  bits")
    for name in names:
        if sig_a.get(name) != sig_b.get(name):
            print(f"{name:<48} arguments differ between A and B: skipped")
            continue
        start = inputs(sig_a[name], rng)
        runs = {}
        for label, lib in (("a", lib_a), ("b", lib_b)):        # bits: one call on fresh copies
            arrays = [x.copy() for x in start]
            getattr(lib, name)(*[ctypes.c_void_p(x.ctypes.data) for x in arrays])
            runs[label] = arrays
        same = all(np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))
                   for x, y in zip(runs["a"], runs["b"]))
        fa, fb = getattr(lib_a, name), getattr(lib_b, name)
        ta = tb = float("inf")
        for _ in range(args.reps):
            ta = min(ta, best(fa, runs["a"], args.calls))
            tb = min(tb, best(fb, runs["b"], args.calls))
        total_a, total_b = total_a + ta, total_b + tb
        print(f"{name:<48} {1e3 * ta:9.3f} {1e3 * tb:9.3f} {tb / ta:6.2f}  "
              f"{'same' if same else 'DIFFER'}")
        status |= not same
    if total_a:
        print(f"{'all of them, one call each':<48} {1e3 * total_a:9.3f} {1e3 * total_b:9.3f} "
              f"{total_b / total_a:6.2f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
