"""Each generated CPU kernel of a compiled step against this machine's
roofline: the bytes it moves and the FLOPs it computes, at the measured
peak memory bandwidth and GEMM rate, against the time it took in the step.

Used by `bench/train_step_cpu.py` (the table under "kernels against the
roofline"); `measure_peaks()` takes about a second.

  * bytes: its arguments' sizes, a written one twice (each read or written
    once, and a store first reads the cache line it writes: the generated
    kernels use ordinary stores).
  * FLOPs: the Tile IR's elementwise ops + dot-product FLOPs + 15 per exp,
    tanh, ... (`tessera_compiler.cost.kernel_work`; Tessera's exp/tanh are
    polynomials of ~15 operations).
  * roofline time: max(bytes / peak bandwidth, FLOPs / peak FLOP rate);
    the peaks are this machine's best measured: numpy adding two 64 MiB
    arrays on every core (a thread per core; 4 x 64 MiB of traffic counted
    the same way) and numpy's sgemm of 2048^3.
  * share: roofline time / measured time per call. A kernel under 50% gets
    the reason that applies (first match): dot products in generated loops
    (attention), a call too short for its size to matter, a launch under the
    engine's threading threshold (one core of the roofline's several), a
    row reduction, transcendental functions, rows narrower than a vector
    (a one-hot over 12 classes). A kernel none of those explains
    is launched again on its own (`time_alone`: fresh buffers of its
    arguments' shapes, the engine's own launch, best of a few calls): at 50%
    or more alone, its reason is that the step slowed it (this 2-core VM's
    memory bandwidth swings between runs and with the other rank's or
    thread's traffic), with both shares; under 50% alone too, "none found".
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

#: FLOPs counted per transcendental function (exp, tanh, ...) evaluated
TRANSCENDENTAL_FLOPS = 15
#: below this share of the roofline a kernel's row names a reason
GOAL = 0.5
#: a call shorter than this is dominated by its fixed cost (ctypes, loop set-up)
SHORT_CALL_S = 20e-6
#: float32 lanes of an AVX-512 register: tiles with narrower rows vectorize poorly
VECTOR_LANES = 16


def measure_peaks(cores: int) -> dict:
    """{"bandwidth": bytes/s, "flops": FLOP/s}: the best of a few runs of a
    64 MiB copy split over `cores` threads and of a 2048^3 sgemm."""
    x = np.ones(16 << 20, np.float32)
    y, out = np.ones_like(x), np.empty_like(x)
    step = -(-x.size // cores)
    bounds = [(i, min(i + step, x.size)) for i in range(0, x.size, step)]
    pool = ThreadPoolExecutor(max(1, cores - 1))

    def add():
        rest = [pool.submit(np.add, x[a:b], y[a:b], out=out[a:b]) for a, b in bounds[1:]]
        a, b = bounds[0]
        np.add(x[a:b], y[a:b], out=out[a:b])
        for r in rest:
            r.result()
    bandwidth = 4 * x.nbytes / min(_best(add, 5), _best(lambda: np.add(x, y, out=out), 5))
    a = np.ones((2048, 2048), np.float32)
    out = np.empty_like(a)
    flops = 2 * 2048 ** 3 / _best(lambda: np.matmul(a, a, out=out), 3)
    pool.shutdown()
    return {"bandwidth": bandwidth, "flops": flops}


def _best(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kernel_rows(bundle: Path, seconds: dict, calls: dict, peaks: dict,
                threaded_min_bytes: int) -> list[dict]:
    """One row per generated kernel of `bundle` that ran (`seconds` and
    `calls`: per kernel name, over the profiled steps), slowest first."""
    import json
    from tessera_compiler.cost import kernel_work
    from tessera_compiler.ir.context import new_context
    from tessera_mlir import ir
    module = ir.Module.parse((bundle / "ir" / "tile.mlir").read_text(), new_context())
    work = kernel_work(module)
    kernels = [op for op in (o.operation for o in module.body.operations)
               if op.name == "ttile.kernel"]
    reducing = {ir.StringAttr(op.attributes["sym_name"]).value for op in kernels
                if _contains(op, "ttile.reduce")}
    # kernel -> the elements of its tiles' last dimension (its rows' width)
    row_width = {ir.StringAttr(op.attributes["sym_name"]).value:
                 list(ir.DenseI64ArrayAttr(op.attributes["ttile.tile_sizes"]))[-1]
                 for op in kernels if "ttile.tile_sizes" in op.attributes}
    program = json.loads((bundle / "program.json").read_text())
    shapes = {s["value"]: (s["local_shape"], s["dtype"]) for s in program["inputs"]}
    moved: dict = {}
    largest: dict = {}                  # kernel -> its largest argument's elements
    plain: dict = {}                    # kernel -> its arguments' bytes
    operands: dict = {}                 # kernel -> its first launch's (value, shape, dtype)
    for ins in program["instructions"]:
        if ins["op"] == "alloc":
            shapes[ins["result"]] = (ins["shape"], ins["dtype"])
        elif ins["op"] == "launch" and "library" not in ins:
            args = ins["args"]
            written = ins.get("outs", len(args))     # the last `outs` arguments
            moved[ins["kernel"]] = sum(
                (2 if i >= len(args) - written else 1)
                * int(np.prod(shapes[a][0])) * np.dtype(shapes[a][1]).itemsize
                for i, a in enumerate(args))
            largest[ins["kernel"]] = max(int(np.prod(shapes[a][0])) for a in args)
            plain[ins["kernel"]] = sum(int(np.prod(shapes[a][0])) * np.dtype(shapes[a][1]).itemsize
                                       for a in args)      # (the engine's threading test)
            operands.setdefault(ins["kernel"], [(a, *shapes[a]) for a in args])
    rows = []
    for name, total in seconds.items():
        if name not in moved or name not in work:
            continue
        w = work[name]
        per_call = total / max(calls[name], 1)
        nbytes = moved[name]
        elements = max(largest[name], 1)
        flops = w.vector + w.dot + TRANSCENDENTAL_FLOPS * w.transcendental
        memory_s, compute_s = nbytes / peaks["bandwidth"], flops / peaks["flops"]
        share = max(memory_s, compute_s) / per_call
        reason = ""
        if share < GOAL:
            if w.dot:
                reason = (f"dot products in generated loops (attention), "
                          f"{w.dot / per_call / 1e9:.0f} GFLOP/s, not BLAS")
            elif per_call < SHORT_CALL_S:
                reason = f"short: {per_call * 1e6:.0f} us a call, mostly its fixed cost"
            elif plain[name] < threaded_min_bytes:
                reason = (f"one core: {plain[name] / 2**20:.1f} MiB of arguments, under the "
                          f"{threaded_min_bytes >> 20} MiB threading threshold")
            elif name in reducing:
                reason = ("row reduction (a norm, softmax or sum): 8 lanes per row combined "
                          "in a fixed order")
            elif w.transcendental >= 0.1 * elements:
                reason = (f"transcendental: {w.transcendental / elements:.1f} exp/tanh per "
                          "element, each a polynomial and a division")
            elif row_width.get(name, VECTOR_LANES) < VECTOR_LANES:
                reason = (f"narrow rows: {row_width[name]} elements a row, under one "
                          f"{VECTOR_LANES}-lane vector (the loop runs its remainder)")
            else:
                alone = time_alone(bundle / "kernels" / "libkernels.so", name,
                                   operands[name], plain[name])
                share_alone = max(memory_s, compute_s) / alone
                reason = (f"slowed in the step: {share:.0%} there, {share_alone:.0%} of the "
                          f"roofline alone ({1e3 * alone:.3f} ms a call)"
                          if share_alone >= GOAL else f"none found ({share_alone:.0%} alone)")
        rows.append({"kernel": name, "calls": calls[name], "ms_per_call": 1e3 * per_call,
                     "ms": 1e3 * total, "MiB": nbytes / 2**20,
                     "GB_per_s": nbytes / per_call / 1e9, "GFLOP_per_s": flops / per_call / 1e9,
                     "bound": "memory" if memory_s >= compute_s else "compute",
                     "share": share, "reason": reason})
    return sorted(rows, key=lambda r: -r["ms"])


def time_alone(library: Path, kernel: str, operands: list, nbytes: int, calls: int = 7) -> float:
    """Best seconds a call of `kernel` takes launched on its own, as the CPU
    engine launches it in a step (`prepare_launch`: its team, threading
    threshold and thread count), on fresh buffers: `operands` are its first
    launch's (value, shape, dtype), one buffer per value (an in-place kernel
    reads and writes one). Floats are random normals, integers ones (a valid
    index or count anywhere)."""
    from tessera_runtime.engines.cpu import CPUEngine, address
    engine = CPUEngine()
    engine.load_kernels(library)
    rng = np.random.default_rng(0)
    buffers = {}
    for value, shape, dtype in operands:
        if value not in buffers:
            dtype = np.dtype(dtype)
            buffers[value] = (rng.standard_normal(shape).astype(dtype)
                              if dtype.kind == "f" else np.ones(shape, dtype))
    ptrs = [address(buffers[value]) for value, _, _ in operands]
    run = engine.prepare_launch(kernel, len(ptrs), nbytes=nbytes)
    return _best(lambda: run(ptrs), calls)


def _contains(op, name: str) -> bool:
    """Whether `op`'s regions hold an operation called `name`."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if inner.operation.name == name or _contains(inner.operation, name):
                    return True
    return False


def table(rows: list[dict], peaks: dict, top: int = 15) -> str:
    """Markdown: the slowest `top` kernels and a summary of all."""
    total = sum(r["ms"] for r in rows) or 1.0
    met = [r for r in rows if r["share"] >= GOAL]
    unexplained = sum(r["reason"].startswith("none found") for r in rows)
    lines = [f"peaks measured in this run: memory {peaks['bandwidth'] / 1e9:.1f} GB/s, "
             f"sgemm {peaks['flops'] / 1e9:.0f} GFLOP/s; {len(met)} of {len(rows)} kernels "
             f"({sum(r['ms'] for r in met) / total:.0%} of their time) at >= {GOAL:.0%} of "
             "the roofline; " + (f"{unexplained} under it without a reason found"
                                 if unexplained else "every other one has its reason"), "",
             "| kernel | calls | ms / call | MiB | GB/s | GFLOP/s | bound | roofline | "
             "reason (< 50%) |", "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows[:top]:
        lines.append(f"| {r['kernel']} | {r['calls']} | {r['ms_per_call']:.3f} | "
                     f"{r['MiB']:.2f} | {r['GB_per_s']:.1f} | {r['GFLOP_per_s']:.1f} | "
                     f"{r['bound']} | {r['share']:.0%} | {r['reason']} |")
    reasons: dict = {}
    for r in rows[top:]:
        if r["reason"]:
            key = r["reason"].split(":")[0].split(" (")[0]
            reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        lines += ["", f"of the other {len(rows[top:])} kernels, {sum(reasons.values())} under "
                  f"{GOAL:.0%}: " + ", ".join(f"{n} {k}" for k, n in
                                             sorted(reasons.items(), key=lambda kv: -kv[1]))]
    lines += ["", "(over 100%: the kernel's data came from cache, faster than memory)"] \
        if any(r["share"] > 1 for r in rows) else []
    return "\n".join(lines)
