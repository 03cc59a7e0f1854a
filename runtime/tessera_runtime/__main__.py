"""Run a bundle with the runtime alone (no compiler, no MLIR):

    mpiexec -n 2 python -m tessera_runtime mlp.tsb --inputs x.npy w1.npy w2.npy --out y.npy

Inputs are global arrays in .npy files (loaded without pickle); each rank takes
its own shard. Outputs are written by rank 0 as the global value when the
output is replicated, else each rank writes its shard to OUT with `.rankR`
before the suffix.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from . import load_bundle


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera_runtime",
                                     description="Execute a Tessera bundle on this rank.")
    parser.add_argument("bundle", help="bundle directory written by the compiler")
    parser.add_argument("--inputs", nargs="*", default=[], help="global input arrays (.npy)")
    parser.add_argument("--out", nargs="*", default=[], help="where to write each output (.npy)")
    opts = parser.parse_args(argv)
    program = load_bundle(opts.bundle)
    if len(opts.inputs) != len(program.inputs):
        names = ", ".join(spec.name for spec in program.inputs)
        print(f"{opts.bundle}: expects {len(program.inputs)} inputs ({names}), "
              f"got {len(opts.inputs)}", file=sys.stderr)
        return 2
    arrays = [np.load(path, allow_pickle=False) for path in opts.inputs]
    outputs = program.run(program.shard_inputs(arrays))
    for spec, value, path in zip(program.outputs, outputs, opts.out):
        replicated = not spec.sharding or (not any(spec.sharding.dims) and not spec.sharding.partial)
        if replicated:
            if program.rank == 0:
                np.save(path, value)
        else:
            stem, dot, ext = path.rpartition(".")
            np.save(f"{stem}.rank{program.rank}.{ext}" if dot else f"{path}.rank{program.rank}", value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
