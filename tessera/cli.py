"""The `tessera` command.

    tessera launch -n 2 examples/tp_mlp.py        run a script on 2 ranks (wraps mpiexec)
    tessera trace -n 2 -o ir examples/tp_mlp.py   same, and write every compiled
                                                  function's IR at every level to ir/
    tessera trace --memory examples/train_gpt.py  same, and print each function's
                                                  memory plan (peak bytes per rank)
    tessera --env                                 every environment variable Tessera
                                                  reads: its value now and what it does
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

DUMP_ENV = "TESSERA_DUMP_IR"     # (read by tessera.compiler through tessera_runtime.env)
MEMORY_ENV = "TESSERA_MEMORY_REPORT"


def find_mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise SystemExit("tessera: mpiexec not found; install it with `pip install mpich`")
    return found


def _launch(n: int, script: str, args: list[str], env: dict | None = None,
            timeout: float | None = None) -> int:
    """Runs `script` as `n` ranks. Each rank runs under `tessera _rank`, which
    reports how it ended: a rank that raises aborts the job (and says so); one
    that exits non-zero or is killed is named, and mpiexec then stops the
    others. With `timeout`, a job still running after that many seconds is
    stopped with exit status 124."""
    if not Path(script).exists():
        print(f"tessera: no such script: {script}", file=sys.stderr)
        return 2
    if n < 1:
        print("tessera: -n must be at least 1", file=sys.stderr)
        return 2
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, "-m", "tessera", "_rank", script, *args]
    # PYTHONHASHSEED: every rank hashes a str alike, so per-rank code such
    # as the training guide's `hash(param_name) % size` agrees across ranks.
    proc = subprocess.Popen(cmd, env={**thread_limits(n), "PYTHONHASHSEED": "0", **os.environ,
                                      **(env or {})},
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"tessera: the job ran longer than --timeout {timeout:g} s; stopping all "
              f"{n} ranks", file=sys.stderr)
        _stop(proc)
        return 124
    except KeyboardInterrupt:
        _stop(proc)
        return 130


def thread_limits(ranks: int) -> dict:
    """BLAS/OpenMP threads per rank so that the ranks of one node share its
    cores instead of each starting one thread per core (what torchrun does
    too). Measured: the example GPT on 4 ranks of a 2-core machine ran 0.9 s a
    step with OpenBLAS' default threads, 0.06 s with these. A variable the
    user set wins."""
    per_rank = str(max(1, (os.cpu_count() or 1) // ranks))
    return {"OMP_NUM_THREADS": per_rank, "OPENBLAS_NUM_THREADS": per_rank,
            "MKL_NUM_THREADS": per_rank}


def _stop(proc: subprocess.Popen) -> None:
    """Stops mpiexec and every rank (they share its process group)."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def _rank(script: str, args: list[str]) -> int:
    """One rank: runs the script in a child process and reports a failure
    with the rank's number. The child dies with this process (PDEATHSIG), so
    when mpiexec stops a job no rank is left behind waiting in a collective."""
    import tessera_runtime
    rank = tessera_runtime.world()[0]

    def die_with_parent():
        try:
            import ctypes
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass

    child = subprocess.Popen([sys.executable, script, *args], close_fds=False,
                             preexec_fn=die_with_parent)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    if code == 0:
        return 0
    if code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
        code = 128 - code
    else:
        how = f"exited with status {code}"
    sys.stderr.write(f"[tessera] rank {rank} {how}: stopping the job\n")
    sys.stderr.flush()
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera",
        description="Tessera: a Python-first, MLIR-based compiler for distributed deep learning.",
        epilog="Compiler tools: tessera-opt (run passes on IR), tessera-translate "
               "(Tile IR to C++/CUDA). See README.md.")
    parser.add_argument("--env", action="store_true",
                        help="list every environment variable Tessera reads, its value now "
                             "and what it does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    launch = sub.add_parser("launch", help="run a script as N ranks (one per mesh device)",
                            description="Run SCRIPT as N processes under mpiexec; rank r is "
                                        "mesh device r. Exits with the job's exit status. If a "
                                        "rank raises, exits non-zero or is killed, every rank "
                                        "is stopped and the failing rank is named. "
                                        "TESSERA_COMM_TRACE=1 logs every collective; "
                                        "TESSERA_DETERMINISTIC=1 fixes every reduction order.")
    launch.add_argument("-n", "--nprocs", type=int, default=1, help="number of ranks (default 1)")
    launch.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop every rank and exit 124 if the job runs longer")
    launch.add_argument("script")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    trace = sub.add_parser("trace", help="run a script and write the IR of every compiled "
                                         "function at every level",
                           description="Run SCRIPT like `launch`; rank 0 writes graph, "
                                       "partitioned, schedule and tile IR and the generated "
                                       "C++/CUDA of each function it compiles to OUT/<function>/.")
    trace.add_argument("-n", "--nprocs", type=int, default=1, help="number of ranks (default 1)")
    trace.add_argument("-o", "--out", default="tessera-ir", help="output folder (default tessera-ir)")
    trace.add_argument("--memory", action="store_true",
                       help="also print each compiled function's memory plan: every rank's "
                            "planned peak bytes and, at the peak, what holds it (parameters, "
                            "gradients, optimizer state, activations, communication) with the "
                            "largest tensors and their Python lines")
    trace.add_argument("script")
    trace.add_argument("args", nargs=argparse.REMAINDER)

    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_rank"]:                  # internal: one rank of `launch`
        return _rank(argv[1], argv[2:])
    opts = parser.parse_args(argv)
    if opts.env:
        from tessera_runtime import env
        print(env.table())
        return 0
    if opts.command == "launch":
        return _launch(opts.nprocs, opts.script, opts.args, timeout=opts.timeout)
    if opts.command == "trace":
        out = Path(opts.out).resolve()
        extra = {DUMP_ENV: str(out)}
        if opts.memory:
            extra[MEMORY_ENV] = "1"
        code = _launch(opts.nprocs, opts.script, opts.args, extra)
        if out.exists():
            for path in sorted(out.rglob("*")):
                if path.is_file():
                    print(path)
        return code
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
