"""Machine descriptions for the cost model (`trace.cost()`, `tessera calibrate`).

`machine("h100-node")` and `machine("h200-node")` are datasheet descriptions
(`tessera_compiler.cost.BUILTIN`). `machine("cpu", ranks=R)` is this machine
running R ranks, measured once by `calibrate` and cached under the cache
directory (`machines/`): the kernel, BLAS, copy and Python rates are those of
one rank alone (one process); then R ranks time all_reduce /
all_gather / reduce_scatter of 1 KiB to 2 MiB over the world and over pairs,
through the communicators the runtime gives a program's axes (alpha and
beta: a least-squares fit of the ring model to those times).

    tessera calibrate -n 4          # measure (about a minute), print, cache
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tessera_runtime
from tessera_runtime import env as tessera_env
from tessera_compiler.cost import BUILTIN, Link, Machine

__all__ = ["machine", "calibrate", "cache_path"]



def host_cpu() -> tuple[str, int]:
    """(the CPU's model name, the cores this process may run on)."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return cpu or platform.processor(), _cores()


#: what a calibration measures and how; a cached one of another method is
#: measured again (2: the rates on a launched rank's threads, not every core's;
#: 3: the links through the runtime's own communicators, shared memory on one host)
METHOD = 3


def _host_key() -> str:
    cpu, cores = host_cpu()
    text = f"{platform.node()}|{cpu}|{cores}|{platform.machine()}|{METHOD}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_path(ranks: int) -> Path:
    """Where the calibration of this host with `ranks` ranks is cached."""
    return tessera_env.cache_root() / "machines" / f"cpu-{ranks}r-{_host_key()}.json"


def machine(name: str = "cpu", ranks: int = 1, progress=None) -> Machine:
    """The description of machine `name`: "cpu" (this host with `ranks`
    ranks; calibrated on first use, about a minute) or a built-in one."""
    if isinstance(name, Machine):
        return name
    if name in BUILTIN:
        return BUILTIN[name]
    if name != "cpu":
        raise ValueError(f"unknown machine {name!r}: 'cpu' or one of {sorted(BUILTIN)}")
    path = cache_path(ranks)
    if path.exists():
        try:
            return Machine.from_json(json.loads(path.read_text()))
        except (TypeError, ValueError, KeyError):
            pass            # written by another version of Tessera: measure again
    if tessera_runtime.world()[1] > 1:
        raise RuntimeError(f"this host has no calibration for {ranks} ranks yet, and a launched "
                           f"job cannot measure one: run `tessera calibrate -n {ranks}` first")
    return calibrate(ranks, progress=progress)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def thread_limits(ranks: int) -> dict:
    """BLAS/OpenMP threads per rank so that the ranks of one node share its
    cores instead of each starting one thread per core (what torchrun does
    too): ranks that each start a thread per core oversubscribe the node
    many times over. A variable the user set wins. TESSERA_NUM_THREADS too (the kernels' team): a launched
    rank works it out from the job's size, a process standing in for one
    rank of an R-rank job (`tessera calibrate -n R`) cannot. The same for
    TESSERA_GEMM_BLOCKS (the GEMMs' cut, and so their bits)."""
    from tessera_runtime.engines.cpu import gemm_block_limit
    per_rank = str(max(1, tessera_env.cores() // ranks))
    return {"OMP_NUM_THREADS": per_rank, "OPENBLAS_NUM_THREADS": per_rank,
            "MKL_NUM_THREADS": per_rank, "TESSERA_NUM_THREADS": per_rank,
            "TESSERA_GEMM_BLOCKS": str(gemm_block_limit(ranks))}


def calibrate(ranks: int = 1, progress=None) -> Machine:
    """Measures this host running `ranks` ranks, caches and returns the
    description: the rates of one rank alone (one process), then, for
    `ranks` > 1, the collectives in a job of `ranks` ranks."""
    say = progress or (lambda msg: print(f"[tessera] {msg}", file=sys.stderr, flush=True))
    path = cache_path(ranks)
    say(f"calibrating the cost model for {ranks} rank(s) on this host (once; cached in {path})")
    with tempfile.TemporaryDirectory(prefix="tessera-calibrate-") as tmp:
        script = Path(tmp) / "calibrate.py"
        script.write_text("import sys\nfrom tessera.calibration import measure\n"
                          "measure(sys.argv[1], sys.argv[2])\n")
        measured = {}
        for what, n in (("rates", 1), ("links", ranks)):
            if what == "links" and ranks == 1:
                measured["links"] = {"alpha_s": 0.0, "beta_s": 0.0}
                continue
            out = Path(tmp) / f"{what}.json"
            cmd = [sys.executable, str(script), what, str(out)] if n == 1 else \
                [sys.executable, "-m", "tessera", "launch", "-n", str(n), str(script), what,
                 str(out)]
            # One rank alone measures with the BLAS threads a rank of an
            # R-rank job gets (`tessera launch` sets them; the user's win).
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**thread_limits(ranks), **os.environ})
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"calibration failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
            measured[what] = json.loads(out.read_text())
    links, rates = measured["links"], measured["rates"]
    link = Link(links["alpha_s"], links["beta_s"])
    description = Machine(
        name=f"cpu ({ranks} rank{'s' if ranks > 1 else ''})", intra=link, inter=link,
        ranks_per_node=ranks, cores_per_node=_cores(), overlap=False, async_launch=False,
        source=f"measured by tessera calibrate on {platform.node()}, {time.strftime('%Y-%m-%d')}",
        **rates)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(description.to_json(), indent=1))
    return description
