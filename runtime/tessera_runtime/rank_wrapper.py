"""One rank of `tessera launch`: mpiexec starts this wrapper once per rank,

    python -m tessera_runtime.rank_wrapper [--profile DIR] SCRIPT [ARGS...]

and it runs SCRIPT in a child process that dies with it (PDEATHSIG: when
mpiexec stops the job, no rank is left waiting in a collective), forwards
SIGTERM and SIGINT to it, and when the child fails says which rank failed
and how, and reports it to the launcher:

- `rank-R.failed` in TESSERA_FLIGHT_DIR, holding the exit status: the
  launcher stops the job itself should mpiexec leave the other ranks
  running (`tessera.cli._FailedRanks`);
- under `launch --elastic`, `ranks/R.json` in TESSERA_ELASTIC_CONTROL: how
  the rank ended, from which the launcher decides on a restart.

It lives in the runtime, not beside the launcher in `tessera.cli`, because
it is a fresh process per rank: importing the runtime takes a tenth of
importing tessera (bench/import_time.py), paid once per rank per launch.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from . import env, world

#: the launcher's flight folder (the ranks' flight recorders write there too)
FLIGHT_ENV = "TESSERA_FLIGHT_DIR"
#: the elastic launcher's control folder
CONTROL_ENV = "TESSERA_ELASTIC_CONTROL"
#: the profile folder the script's ranks write to (`launch --profile`)
PROFILE_ENV = "TESSERA_PROFILE"
#: in the control folder: each failed rank's report, `R.json`
RANKS_DIR = "ranks"
#: in the flight folder: `rank-R.failed`, a failed rank's exit status
FAILED_SUFFIX = ".failed"


def say(text: str) -> None:
    """A launcher message on stderr, as every part of `tessera launch` writes them."""
    sys.stderr.write(f"[tessera] {text}\n")
    sys.stderr.flush()


def write_json(path: Path, value) -> None:
    """`value` as JSON at `path`, all of it or nothing for a reader."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def failed_file(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}{FAILED_SUFFIX}"


def _dying_with_parent():
    """A function for the child, between fork and exec, that has it killed
    when this process dies (PR_SET_PDEATHSIG); libc is loaded here, before
    the fork, as a forked child should import nothing."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    return lambda: libc.prctl(1, signal.SIGKILL)


def run(script: str, args: list[str], profile: str | None = None) -> int:
    """Runs `script` with `args` as this rank; returns the exit status (128 +
    the signal's number for a child a signal killed)."""
    rank = world()[0]
    child = subprocess.Popen([sys.executable, script, *args], close_fds=False,
                             preexec_fn=_dying_with_parent(),
                             env={**os.environ, PROFILE_ENV: profile} if profile else None)
    stopped = []                      # signals the job's stop forwarded to the child

    def forward(sig, _frame):
        stopped.append(sig)
        child.send_signal(sig)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = child.wait()
    if code == 0:
        return 0
    control = env.get(CONTROL_ENV)
    if control:                       # how this rank ended, for `launch --elastic`
        write_json(Path(control) / RANKS_DIR / f"{rank}.json", {
            "rank": rank, "code": code, "stopped": bool(stopped),
            "signal": signal.Signals(-code).name if code < 0 else None})
    if code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
        code = 128 - code
    else:
        how = f"exited with status {code}"
    if not stopped:
        say(f"rank {rank} {how}: stopping the job")
        flight = env.get(FLIGHT_ENV)
        if flight:
            try:
                failed_file(Path(flight), rank).write_text(str(code))
            except OSError:           # the launcher and its folder are gone
                pass
    return code


def main(argv: list[str]) -> int:
    profile = None
    if argv[:1] == ["--profile"]:
        profile, argv = argv[1], argv[2:]
    if not argv:
        sys.stderr.write("usage: python -m tessera_runtime.rank_wrapper [--profile DIR] "
                         "SCRIPT [ARGS...] (started by `tessera launch`)\n")
        return 2
    return run(argv[0], argv[1:], profile)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
