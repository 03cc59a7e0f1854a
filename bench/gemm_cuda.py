"""Tessera's generated tensor-core GEMM against cuBLAS (cupy.matmul), bf16 in,
fp32 accumulate, bf16 out, in the same run on the same GPU.

    python bench/gemm_cuda.py                 # 4096^3 and 8192^3
    python bench/gemm_cuda.py --sizes 2048 4096 --iters 50
    python bench/gemm_cuda.py --variants producer thread0   # two ways of feeding wgmma
    python bench/gemm_cuda.py --kit gpu_kit --build-only   # compile here (no GPU)
    PYTHONPATH=runtime python bench/gemm_cuda.py --kit gpu_kit   # run there (no compiler)

Variants of the Hopper kernel (TMA-fed wgmma): `producer` (the default: a
producer warpgroup issues the copies, the two computing warpgroups never
meet a block barrier in the loop), `thread0` (thread 0 issues them
between iterations, after a block barrier) and `row-major` (`producer`
with the output tiles in row-major order instead of groups of tile rows:
what the grouped order saves in L2 misses). Prints TFLOP/s of each and of
cuBLAS and their ratio, checks the result against cuBLAS, and writes
bench/results/gemm_cuda-<date>.{json,md} with the device, driver and commit.
Needs a GPU with cupy; compile the bundle here (nvcc) or there.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from cuda_bench import (add_kit_arguments, bundle_engine, gpu_bundle, results_meta, time_cuda,
                        torch_bf16, write_results)


def gemm(a, b):
    from tessera import op
    return op.matmul(a, b)


VARIANTS = ("producer", "thread0", "row-major")
#: The results table: header -> a row's cell.
COLUMNS = {"n": lambda r: str(r["n"]), "variant": lambda r: r["variant"],
           "Tessera TFLOP/s": lambda r: f"{r['tessera_tflops']:.1f}",
           "cuBLAS TFLOP/s": lambda r: f"{r['cublas_tflops']:.1f}",
           "ratio": lambda r: f"{r['ratio']:.2f}",
           "max rel err": lambda r: f"{r['max_rel_err']:.1e}" + ("" if r["valid"] else " WRONG")}
#: A product further than this from cuBLAS's (relative to its largest
#: element) marks the row wrong: its times do not count.
MAX_REL_ERR = 0.02


def gemm_options(variant: str):
    """The TargetOptions GEMMs are compiled with to be fed and ordered as
    `variant` says, or None where the compiler is not installed (on a GPU
    machine without it the bundles come from the kit)."""
    try:
        import tessera as ts
    except ImportError:
        return None
    default = ts.TargetOptions(target="gpu")
    return default.with_(
        gemm_configs=tuple(replace(c, producer=variant != "thread0") for c in default.gemm_configs),
        grouped_tile_order=variant != "row-major")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                    help="ways of feeding and ordering the wgmma kernel to measure "
                         "(default: all)")
    add_kit_arguments(ap)
    args = ap.parse_args(argv)

    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    bundles = {}
    for variant in args.variants:
        options = gemm_options(variant)
        for n in args.sizes:
            name = f"gemm-{n}" + ("" if variant == "producer" else f"-{variant}")
            bundles[n, variant] = gpu_bundle(args.kit, name, gemm, np.zeros((n, n), bf16),
                                             np.zeros((n, n), bf16), options=options)
    if args.build_only:
        print(f"compiled {', '.join(str(b) for b in bundles.values())}")
        return 0

    import cupy as cp
    rows, meta = [], results_meta(cp, args.kit)
    for n, variant in sorted(bundles, key=lambda key: key[0]):
        rng = np.random.default_rng(0)
        a = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(bf16)
        b = rng.standard_normal((n, n)).astype(bf16)
        engine = bundle_engine(bundles[n, variant])
        kernel = next(iter(engine._launches))
        da, db = engine.from_host(a), engine.from_host(b)
        dc = engine.alloc((n, n), bf16)
        stream = engine.stream("compute")
        run = engine.prepare_launch(kernel, 3, stream)
        t_tessera = time_cuda(lambda: run([da, db, dc]), args.iters, cp, stream)
        # cuBLAS: torch.matmul on bf16 (cuBLAS underneath) where torch is
        # installed; else cupy.matmul in fp16 (cupy has no bf16; same FLOPs
        # and tensor-core rate on Hopper).
        try:
            import torch
            ta, tb = torch_bf16(a), torch_bf16(b)
            peer, t_cublas = "torch.matmul bf16 (cuBLAS)", time_cuda(lambda: torch.matmul(ta, tb),
                                                                  args.iters, cp)
        except ImportError:
            ha, hb = cp.asarray(a.astype(np.float16)), cp.asarray(b.astype(np.float16))
            peer, t_cublas = "cupy.matmul fp16 (cuBLAS)", time_cuda(lambda: cp.matmul(ha, hb),
                                                                 args.iters, cp)
        ha, hb = cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32))
        ours = engine.to_host(dc, bf16).astype(np.float32)
        ref = cp.asnumpy(cp.matmul(ha, hb))
        err = float(np.abs(ours - ref).max() / np.abs(ref).max())
        flops = 2.0 * n ** 3
        rows.append({"n": n, "variant": variant,
                     "tessera_ms": t_tessera * 1e3, "cublas_ms": t_cublas * 1e3,
                     "tessera_tflops": flops / t_tessera / 1e12,
                     "cublas_tflops": flops / t_cublas / 1e12,
                     "ratio": t_cublas / t_tessera, "max_rel_err": err,
                     "valid": err < MAX_REL_ERR, "peer": peer,
                     "config": engine._launches[kernel]})
        print(f"{n}^3 bf16, {variant}: Tessera {rows[-1]['tessera_tflops']:.1f} TFLOP/s, cuBLAS "
              f"{rows[-1]['cublas_tflops']:.1f} TFLOP/s, ratio {rows[-1]['ratio']:.2f} "
              f"(max rel err {err:.1e}"
              + ("" if rows[-1]["valid"] else f": WRONG, over {MAX_REL_ERR}; the times do not count")
              + ")")
        # After every row: a later size that faults or hangs keeps these.
        write_results("gemm_cuda", "Tessera GEMM vs cuBLAS", COLUMNS, rows, meta,
                      ("n", "variant"), args.append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
