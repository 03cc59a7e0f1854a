"""Plumbing shared by the CPU benchmarks that run Tessera on N ranks
(`tessera launch`) and the same work in PyTorch on N ranks (mpiexec + gloo) in
one run: the hidden worker arguments, running one side's ranks and reading
their JSON reports, and the commit/date a results file records."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def add_worker_arguments(ap: argparse.ArgumentParser) -> None:
    """--torch-python (the peer's interpreter) and the hidden worker flags."""
    ap.add_argument("--torch-python", default=None,
                    help="a Python with torch (CPU) to run the PyTorch side; without it "
                         "only Tessera is measured")
    ap.add_argument("--worker", choices=["tessera", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)


def run_worker(args, workers: dict) -> bool:
    """In a worker process (--worker): run `workers[args.worker](config, out)`
    and say so (True); in the driver: False."""
    if not args.worker:
        return False
    workers[args.worker](json.loads(args.config), Path(args.out))
    return True


def run_ranks(script: str, which: str, ranks: int, cfg: dict, out: Path,
              python: str | None = None) -> list[dict] | None:
    """Run `script --worker which` on `ranks` ranks (Tessera: `tessera launch`;
    torch: mpiexec with `python`, one thread per rank, no PYTHONPATH) and
    return each rank's report `out/<which>-rank<r>.json` (None if it failed)."""
    if which == "tessera":
        cmd, env = [sys.executable, "-m", "tessera", "launch", "-n", str(ranks)], None
    else:
        from tessera.cli import find_mpiexec
        cmd = [find_mpiexec(), "-n", str(ranks), python]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    cmd += [script, "--worker", which, "--out", str(out), "--config", json.dumps(cfg)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if proc.returncode:
        print(f"{Path(script).stem}: the {which} run failed (exit {proc.returncode})",
              file=sys.stderr)
        return None
    return [json.loads((out / f"{which}-rank{r}.json").read_text()) for r in range(ranks)]


def commit_and_date() -> tuple[str, str]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    return commit, datetime.date.today().isoformat()
