"""The `tessera` command.

    tessera launch -n 2 examples/tp_mlp.py        run a script on 2 ranks (wraps mpiexec)
    tessera trace -n 2 -o ir examples/tp_mlp.py   same, and write every compiled
                                                  function's IR at every level to ir/
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path


def find_mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise SystemExit("tessera: mpiexec not found; install it with `pip install mpich`")
    return found


def _launch(n: int, script: str, args: list[str], env: dict | None = None) -> int:
    if not Path(script).exists():
        print(f"tessera: no such script: {script}", file=sys.stderr)
        return 2
    if n < 1:
        print("tessera: -n must be at least 1", file=sys.stderr)
        return 2
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, script, *args]
    try:
        return subprocess.call(cmd, env={**os.environ, **(env or {})})
    except KeyboardInterrupt:
        return 130


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera",
        description="Tessera: a Python-first, MLIR-based compiler for distributed deep learning.",
        epilog="Compiler tools: tessera-opt (run passes on IR), tessera-translate "
               "(Tile IR to C++/CUDA). See README.md.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    launch = sub.add_parser("launch", help="run a script as N ranks (one per mesh device)",
                            description="Run SCRIPT as N processes under mpiexec; rank r is "
                                        "mesh device r. Exits with the job's exit status.")
    launch.add_argument("-n", "--nprocs", type=int, default=1, help="number of ranks (default 1)")
    launch.add_argument("script")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    trace = sub.add_parser("trace", help="run a script and write the IR of every compiled "
                                         "function at every level",
                           description="Run SCRIPT like `launch`; rank 0 writes graph, "
                                       "partitioned, schedule and tile IR and the generated "
                                       "C++/CUDA of each function it compiles to OUT/<function>/.")
    trace.add_argument("-n", "--nprocs", type=int, default=1, help="number of ranks (default 1)")
    trace.add_argument("-o", "--out", default="tessera-ir", help="output folder (default tessera-ir)")
    trace.add_argument("script")
    trace.add_argument("args", nargs=argparse.REMAINDER)

    opts = parser.parse_args(argv)
    if opts.command == "launch":
        return _launch(opts.nprocs, opts.script, opts.args)
    if opts.command == "trace":
        out = Path(opts.out).resolve()
        code = _launch(opts.nprocs, opts.script, opts.args, {"TESSERA_DUMP_IR": str(out)})
        if out.exists():
            for path in sorted(out.rglob("*")):
                if path.is_file():
                    print(path)
        return code
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
