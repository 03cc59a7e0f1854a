"""Plumbing shared by the CPU benchmarks that run Tessera on N ranks
(`tessera launch`) and the same work in PyTorch on N ranks (mpiexec + gloo) in
one run: the hidden worker arguments, running one side's ranks and reading
their JSON reports, the torch ranks' gloo group, and the results files with
the commit, date and machine."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The checkout's packages, put first on the path of the ranks a bench
#: starts: run from a checkout whose .venv holds an older (non-editable)
#: install, `python -m tessera launch` took this checkout's front end but the
#: install's runtime, and failed on anything new between them.
CHECKOUT_PATHS = ("build/dev/python_packages", ".", "passes", "runtime")


def checkout_env(**extra: str) -> dict:
    """This process's environment plus `extra`, with the checkout's
    packages first on PYTHONPATH."""
    path = os.pathsep.join(str(ROOT / p) for p in CHECKOUT_PATHS)
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, **extra, "PYTHONPATH": path + (os.pathsep + old if old else "")}


def add_gpt_arguments(ap: argparse.ArgumentParser, width: int = 128, depth: int = 2,
                      heads: int = 4, batch: int = 32, length: int = 8) -> None:
    """The example GPT's size (examples/train_gpt.py): --width, --depth,
    --heads, --batch (sequences) and --length (digits to reverse)."""
    ap.add_argument("--width", type=int, default=width)
    ap.add_argument("--depth", type=int, default=depth)
    ap.add_argument("--heads", type=int, default=heads)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--length", type=int, default=length)


def add_worker_arguments(ap: argparse.ArgumentParser) -> None:
    """--torch-python (the peer's interpreter) and the hidden worker flags."""
    import importlib.util
    here = sys.executable if importlib.util.find_spec("torch") else None
    ap.add_argument("--torch-python", default=here,
                    help="a Python with torch (CPU) to run the PyTorch side (default: this "
                         "one when it has torch; without one only Tessera is measured)")
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
        cmd, env = [sys.executable, "-m", "tessera", "launch", "-n", str(ranks)], checkout_env()
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


def torch_ranks(port: int):
    """In a torch worker under mpiexec: one torch thread, a gloo process group
    over loopback on `port`; returns (rank, size)."""
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")     # loopback only
    os.environ.setdefault("MASTER_PORT", str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=size)
    return rank, size


def commit_and_date() -> tuple[str, str]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    return commit, datetime.date.today().isoformat()


def new_stem(folder: Path, name: str) -> Path:
    """`folder/name`, or `name-2`, `-3`, ... where a result of that name
    exists (a second run the same day must not overwrite the first)."""
    stem, n = folder / name, 1
    while stem.with_suffix(".json").exists() or stem.with_suffix(".md").exists():
        n += 1
        stem = folder / f"{name}-{n}"
    return stem


def write_results(name: str, commit: str, today: str, text: str, record: dict) -> None:
    """bench/results/<name>-<date>.md (the printed table) and .json (`record`
    with the commit, date, machine and cores); `-2`, `-3`, ... for another
    run the same day."""
    stem = new_stem(ROOT / "bench" / "results", f"{name}-{today}")
    stem.with_suffix(".md").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps(
        {**record, "commit": commit, "date": today, "machine": platform.node(),
         "cores": os.cpu_count()}, indent=1))
