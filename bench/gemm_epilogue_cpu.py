"""Does a GEMM epilogue pay on this CPU? The elementwise work after a GEMM
(bias + GELU, residual + layernorm) run as Tessera runs it, a second team
launch over the GEMM's output, against the same kernel fused into the GEMM:
each team member runs it on its block of rows right after its sgemm wrote
them (still in cache), and on sub-blocks of 256 or 128 rows (one sgemm and
one epilogue call each, so that the epilogue reads what is in L2).

    .venv/bin/python bench/gemm_epilogue_cpu.py [--calls 15] [--steps 40]

Every variant calls the same code: numpy's OpenBLAS sgemm one-threaded from
each member of the kernel library's OpenMP team (as `tessera_gemm_f32`
does) and the epilogue kernel Tessera generated for `ts.jit` of the
epilogue alone (its `__slice` over the programs covering those rows). The
shapes are the example GPT's at width 512 (32 x 64 tokens) and width 128
(32 x 16 tokens). Prints per shape the median ms of each variant and the
fused / separate ratio, and whether the fused output has the same bits.

Then the whole training step of the example GPT (width 128 depth 2, 32 x
16 tokens; width 512 depth 4, 32 x 64 tokens), compiled twice in one
process, with and without tessera-fuse-gemm-epilogues (the pass that fuses
GEMMs and their kernels this way), called alternately: the median step of
each and the median of the per-pair ratios (`bench/pass_ab_cpu.py`; the
VM's drift between processes is larger than the effect).
Results go to bench/results/gemm_epilogue_cpu-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import numpy as np  # noqa: E402

import pass_ab_cpu  # noqa: E402  (bench/pass_ab_cpu.py)
from cpu_ranks import commit_and_date, write_results  # noqa: E402

#: A team member's share of a GEMM by rows, each block (or sub-block of
#: `sub` rows) one sgemm call followed by the epilogue on its programs.
FUSED_SOURCE = r"""
#include <cstdint>
#include <omp.h>
typedef void (*sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float*,
                         int64_t, const float*, int64_t, float, float*, int64_t);
typedef int (*threads_fn)(int);
typedef void (*slice_fn)(void**, int64_t, int64_t);
extern "C" void gemm_then_epilogue(void* sgemm_, void* set_threads_, int64_t M, int64_t N,
                                   int64_t K, const float* a, const float* b, float* c,
                                   int64_t pieces, int threads, int64_t sub, void* slice_,
                                   void** args, int64_t rows_per_program) {
  sgemm_fn sgemm = (sgemm_fn)sgemm_;
  slice_fn epilogue = (slice_fn)slice_;
  const int saved = ((threads_fn)set_threads_)(1);
  const int64_t piece = ((M + pieces - 1) / pieces + 15) / 16 * 16;
  const int64_t count = (M + piece - 1) / piece;
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    for (int64_t p = count * t / n; p < count * (t + 1) / n; ++p) {
      const int64_t lo = p * piece, hi = lo + piece < M ? lo + piece : M;
      const int64_t step = sub ? sub : hi - lo;
      for (int64_t s = lo; s < hi; s += step) {
        const int64_t rows = s + step < hi ? step : hi - s;
        sgemm(101, 111, 111, rows, N, K, 1.0f, a + s * K, K, b, N, 0.0f, c + s * N, N);
        epilogue(args, s / rows_per_program, (s + rows) / rows_per_program);
      }
    }
  }
  ((threads_fn)set_threads_)(saved);
}
"""

EPILOGUES = {
    # name: (function of the GEMM's output y and the other operands, their shapes)
    "bias + GELU": (lambda y, b: _bias_gelu(y, b), lambda m, n: [(n,)]),
    "residual + layernorm": (lambda y, x, w, b: _residual_norm(y, x, w, b),
                             lambda m, n: [(m, n), (n,), (n,)]),
}
#: (M, N, K, epilogue): the example GPT's GEMMs followed by elementwise work
SHAPES = [(2048, 2048, 512, "bias + GELU"), (2048, 512, 512, "residual + layernorm"),
          (2048, 512, 2048, "residual + layernorm"), (512, 512, 128, "bias + GELU"),
          (512, 128, 512, "residual + layernorm")]


def _bias_gelu(y, b):
    from tessera import op
    h = y + b
    return h, op.gelu(h)


def _residual_norm(y, x, w, b):
    from tessera import op
    h = x + y
    return h, op.layernorm(h, w, b)


def epilogue_kernel(name: str, m: int, n: int):
    """(library path, kernel, its operands' (value, shape, dtype), how many
    of them (the last) it writes, rows per program) of the kernel `ts.jit` generates for epilogue `name` at [m, n],
    its first argument being the GEMM's output."""
    import tessera as ts
    fn, shapes = EPILOGUES[name]
    compiled = ts.jit(fn)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((m, n), dtype=np.float32)] + \
        [rng.standard_normal(s, dtype=np.float32) for s in shapes(m, n)]
    compiled(*args)
    bundle = Path(compiled._bundles[compiled._last_key])
    program = json.loads((bundle / "program.json").read_text())
    meta = {s["value"]: (s["local_shape"], s["dtype"]) for s in program["inputs"]}
    y = program["inputs"][0]["value"]
    launch = None
    for ins in program["instructions"]:
        if ins["op"] == "alloc":
            meta[ins["result"]] = (ins["shape"], ins["dtype"])
        elif ins["op"] == "launch" and "library" not in ins and y in ins["args"]:
            launch = ins
    text = (bundle / "ir" / "tile.mlir").read_text()
    head = next(line for line in text.splitlines() if f"ttile.kernel @{launch['kernel']}(" in line)
    grid = int(head.split("grid = array<i64: ")[1].split(">")[0])
    tile = [int(t) for t in head.split("ttile.tile_sizes = array<i64: ")[1].split(">")[0].split(",")]
    if tile[-1] != n or grid * tile[0] != m:
        raise SystemExit(f"{name}: kernel {launch['kernel']} tiles {tile} over grid {grid}, "
                         f"not whole rows of [{m}, {n}]")
    operands = [(v, *meta[v]) for v in launch["args"]]
    return (bundle / "kernels" / "libkernels.so", launch["kernel"], operands,
            launch.get("outs", len(operands)), tile[0])


def build_fused(folder: Path) -> ctypes.CDLL:
    src = folder / "fused.cpp"
    src.write_text(FUSED_SOURCE)
    lib = folder / "fused.so"
    subprocess.run(["g++", "-O2", "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(lib)],
                   check=True)
    fused = ctypes.CDLL(str(lib))
    fused.gemm_then_epilogue.restype = None
    fused.gemm_then_epilogue.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + \
        [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int, ctypes.c_int64] + \
        [ctypes.c_void_p] * 2 + [ctypes.c_int64]
    return fused


def measure(shape, fused_lib, calls: int) -> dict:
    from tessera_runtime.engines.cpu import (CPUEngine, address, default_threads,
                                             gemm_block_limit, gemm_pieces, team_sgemm)
    m, n, k, name = shape
    library, kernel, operands, outs, rows_per_program = epilogue_kernel(name, m, n)
    engine = CPUEngine()
    engine.load_kernels(library)
    threads = default_threads()
    pieces = gemm_pieces(m, n, k, gemm_block_limit())
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    buffers = [rng.standard_normal(s, dtype=np.float32) if i else np.empty((m, n), np.float32)
               for i, (_, s, _) in enumerate(operands)]
    c = buffers[0]                        # the GEMM's output: the epilogue's first argument
    ptrs = [address(x) for x in buffers]
    nbytes = sum(x.nbytes for x in buffers)
    gemm = engine._gemm_by_address("matmul", {}, [((m, k), "float32"), ((k, n), "float32"),
                                                  ((m, n), "float32")])
    epilogue = engine.prepare_launch(kernel, len(ptrs), nbytes=nbytes)
    sgemm, set_threads = team_sgemm()
    slice_fn = ctypes.cast(getattr(engine._lib, kernel + "__slice"), ctypes.c_void_p).value
    args = (ctypes.c_void_p * len(ptrs))(*ptrs)

    def separate():
        gemm([address(a), address(b), address(c)])
        epilogue(ptrs)

    def fused(sub):
        return lambda: fused_lib.gemm_then_epilogue(
            sgemm, set_threads, m, n, k, address(a), address(b), address(c), pieces, threads,
            sub, slice_fn, args, rows_per_program)

    variants = {"separate": separate, "fused per block": fused(0)}
    for sub in (256, 128):
        if sub % rows_per_program == 0 and sub < m // pieces:
            variants[f"fused per {sub} rows"] = fused(sub)
    # The same bits: fused per block calls sgemm on the same rows.
    separate()
    want = [x.copy() for x in buffers[-outs:]]
    variants["fused per block"]()
    same_bits = all(np.array_equal(w, x) for w, x in zip(want, buffers[-outs:]))
    times = {v: [] for v in variants}
    for _ in range(calls):                        # alternating: the VM's drift hits all
        for v, run in variants.items():
            t0 = time.perf_counter()
            run()
            times[v].append(time.perf_counter() - t0)
    ms = {v: 1e3 * statistics.median(t) for v, t in times.items()}
    return {"m": m, "n": n, "k": k, "epilogue": name, "kernel": kernel, "pieces": pieces,
            "threads": threads, "ms": ms, "same_bits": same_bits,
            "best_fused_over_separate": min(t for v, t in ms.items() if v != "separate")
            / ms["separate"]}


PASS = "tessera-fuse-gemm-epilogues"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=15, help="timed calls of each variant")
    ap.add_argument("--steps", type=int, default=40,
                    help="step pairs at w512 (10x as many at w128); 0: no step comparison")
    args = ap.parse_args(argv)
    from tessera_runtime.engines.cpu import team_sgemm
    if team_sgemm() is None:
        print("numpy's BLAS has no cblas_sgemm64_ / openblas_set_num_threads_local: "
              "nothing to compare", file=sys.stderr)
        return 1
    header = ["| M x N x K | epilogue | separate (ms) | fused per block | per 256 rows | "
              "per 128 rows | best fused / separate | same bits |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    print("\n".join(header), flush=True)
    rows, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        fused_lib = build_fused(Path(tmp))
        for shape in SHAPES:
            r = measure(shape, fused_lib, args.calls)
            cell = lambda v: f"{r['ms'][v]:.2f}" if v in r["ms"] else "-"  # noqa: E731
            line = (f"| {r['m']} x {r['n']} x {r['k']} | {r['epilogue']} | "
                    f"{cell('separate')} | {cell('fused per block')} | "
                    f"{cell('fused per 256 rows')} | {cell('fused per 128 rows')} | "
                    f"{r['best_fused_over_separate']:.3f} | {'yes' if r['same_bits'] else 'NO'} |")
            print(line, flush=True)
            rows.append(r)
            lines.append(line)
    steps, step_lines = [], []
    if args.steps:
        print()
        step_lines, steps = pass_ab_cpu.table(PASS, args.steps)
    commit, today = commit_and_date()
    text = (f"# GEMM epilogue on the CPU, {today}, commit {commit}\n\n"
            f"Command: `.venv/bin/python bench/gemm_epilogue_cpu.py --calls {args.calls} "
            f"--steps {args.steps}`. Median ms of {args.calls} alternating calls; "
            f"{rows[0]['threads']} threads, the GEMM cut into the engine's pieces by rows.\n\n"
            + "\n".join(header + lines)
            + ("\n\nThe example GPT's training step with and without "
               f"{PASS}, one process, alternating calls (bench/pass_ab_cpu.py):\n\n"
               + "\n".join(pass_ab_cpu.HEADER + step_lines) if steps else ""))
    write_results("gemm_epilogue_cpu", commit, today, text, {"rows": rows, "steps": steps})
    print("written: bench/results/gemm_epilogue_cpu-<date>.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
