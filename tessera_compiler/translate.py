"""`tessera-translate`: Tile IR to kernel source, like `mlir-translate`.

    tessera-translate --ttile-to-cpp  kernels.mlir -o kernels.cpp
    tessera-translate --ttile-to-cuda kernels.mlir -o kernels.cu
    tessera-translate --ttile-to-cuda --options='wait-watchdog-s=5' kernels.mlir

Input handling (`--split-input-file`, `--verify-diagnostics`, `-o`) is shared
with tessera-opt (tessera_compiler/driver.py).
"""

from __future__ import annotations

import argparse
import sys

from . import driver

TRANSLATIONS = {
    "ttile-to-cpp": "C++ for the CPU engine: one extern \"C\" function per ttile.kernel (grid as loops)",
    "ttile-to-cuda": "CUDA C++ for sm_90a (Hopper): one extern \"C\" __global__ kernel per "
                     "ttile.kernel (pointwise chains in registers, GEMM loops on tensor cores; "
                     "wgmma loops fall back to mma.sync on plain sm_90)",
}


#: The TargetOptions fields the CUDA translation reads.
CUDA_OPTIONS = ("wait_watchdog_s", "register_budget")


def _schedule(module_op, flags, options) -> None:
    import tessera_passes
    from tessera_mlir import passmanager
    pm = passmanager.PassManager("builtin.module", context=module_op.context)
    for flag in flags:
        tessera_passes.get(flag).add_to(pm, options)
    pm.run(module_op)


def schedule_for_gpu(module_op, options) -> None:
    """Runs the GPU scheduling passes (tessera-gpu-software-pipeline, -place,
    -alloc-shared) on `module_op`'s kernels, afresh: the CUDA printer reads
    what they decide. Raises ir.MLIRError with their diagnostics."""
    import tessera_passes
    _schedule(module_op, tessera_passes.GPU_SCHEDULE, options)


def schedule_for_cpu(module_op) -> None:
    """Runs the CPU scheduling passes (tessera-cpu-in-place, -fuse) on
    `module_op`'s kernels, afresh: the C++ printer reads what they decide.
    Raises ir.MLIRError with their diagnostics."""
    import tessera_passes
    from .ir.options import TargetOptions
    _schedule(module_op, tessera_passes.CPU_SCHEDULE, TargetOptions(target="cpu"))


def ttile_to_cpp(module) -> str:
    """C++ for the kernels of Tile IR `module` (an ir.Module or its
    operation), scheduled for the CPU first (see codegen.emit_cpp)."""
    from tessera_mlir import ir
    from .codegen import emit_cpp
    op = module.operation if isinstance(module, ir.Module) else module
    schedule_for_cpu(op)
    return emit_cpp(op)


def ttile_to_cuda(module, options=None) -> tuple[str, dict]:
    """CUDA C++ for the kernels of Tile IR `module` (an ir.Module or its
    operation), scheduled for the GPU first, and each kernel's launch
    configuration (see codegen.emit_cuda_kernels). Raises EmitError, with
    the message and location of the first error diagnostic, where Tile IR
    cannot be scheduled or printed."""
    from tessera_mlir import ir
    from .codegen import emit_cuda_kernels
    from .codegen.tile_emitter import EmitError
    from .ir.options import TargetOptions
    options = options or TargetOptions(target="gpu")
    op = module.operation if isinstance(module, ir.Module) else module
    try:
        schedule_for_gpu(op, options)
    except ir.MLIRError as err:
        first = err.error_diagnostics[0] if err.error_diagnostics else None
        raise EmitError(first.message if first else str(err),
                        first.location if first else None) from None
    return emit_cuda_kernels(op, options)


def _translate(name: str, options):
    def process(module_op, chunk, context, collector):
        from .codegen import emit_cpp, emit_cuda
        from .codegen.tile_emitter import EmitError
        try:
            if name == "ttile-to-cpp":
                schedule_for_cpu(module_op)
                return emit_cpp(module_op)
            schedule_for_gpu(module_op, options)
            return emit_cuda(module_op, options)
        except EmitError as err:
            if err.location is not None:
                err.location.emit_error(str(err))
            else:
                collector.error(str(err))
            return None
    return process


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera-translate",
        description="Translate Tile IR (ttile) to kernel source.",
        epilog="Translations:\n" + "\n".join(f"  --{k:16} {v}" for k, v in TRANSLATIONS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    for name, summary in TRANSLATIONS.items():
        group.add_argument(f"--{name}", dest="translation", action="store_const", const=name,
                           help=summary)
    parser.add_argument("input", nargs="?", default="-", help="input .mlir file ('-': stdin)")
    parser.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    parser.add_argument("--split-input-file", action="store_true",
                        help="translate each '// -----'-separated chunk on its own")
    parser.add_argument("--verify-diagnostics", action="store_true",
                        help="check diagnostics against expected-error comments")
    parser.add_argument("--options", default="", metavar="'NAME=VALUE ...'",
                        help="code generation options for --ttile-to-cuda: "
                             + ", ".join(n.replace("_", "-") for n in CUDA_OPTIONS)
                             + " (see tessera-opt --help)")
    opts = parser.parse_args(argv)
    from .ir.options import TargetOptions
    try:
        given = dict(item.split("=", 1) for item in opts.options.split())
        unknown = [n for n in given if n.replace("-", "_") not in CUDA_OPTIONS]
        if unknown or (given and opts.translation != "ttile-to-cuda"):
            raise ValueError(f"no option '{(unknown or list(given))[0]}' for "
                             f"--{opts.translation}")
        options = TargetOptions(target="gpu").with_text(given)
    except ValueError as err:
        print(f"tessera-translate: error: {err}", file=sys.stderr)
        return 1
    try:
        chunks = driver.read_chunks(opts.input, opts.split_input_file)
    except driver.InputError as err:
        print(f"tessera-translate: {err}", file=sys.stderr)
        return 1
    driver_options = driver.DriverOptions(split_input_file=opts.split_input_file,
                                          verify_diagnostics=opts.verify_diagnostics)
    code, text = driver.process_chunks(chunks, _translate(opts.translation, options),
                                       driver_options, tool="tessera-translate")
    driver.write_output(text, opts.output)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
