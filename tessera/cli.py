"""The `tessera` command.

    tessera launch -n 2 examples/tp_mlp.py        run a script on 2 ranks (wraps mpiexec)
    tessera launch -n 4 --elastic 2:4 train.py    same, restarted on the ranks left when one
                                                  dies (the script uses dist.elastic)
    tessera launch -n 4 --profile prof train.py   same, and print every rank's compute /
                                                  communication balance; prof/trace.json
                                                  is one Perfetto timeline of all ranks
    tessera trace -n 2 -o ir examples/tp_mlp.py   same, and write every compiled
                                                  function's IR at every level to ir/
    tessera trace --memory examples/train_gpt.py  same, and print each function's
                                                  memory plan (peak bytes per rank)
    tessera --env                                 every environment variable Tessera
                                                  reads: its value now and what it does
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tessera_runtime import env as tessera_env
from tessera_runtime import flight, rank_wrapper
from tessera_runtime.rank_wrapper import say as _say

from . import elastic
from .errors import TesseraError
from .machine import thread_limits

DUMP_ENV = "TESSERA_DUMP_IR"     # (read by tessera.compiler through tessera_runtime.env)
MEMORY_ENV = "TESSERA_MEMORY_REPORT"
FLIGHT_ENV = rank_wrapper.FLIGHT_ENV


def find_mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise SystemExit("tessera: mpiexec not found; install it with `pip install mpich`")
    return found


def _launch(n: int, script: str, args: list[str], env: dict | None = None,
            timeout: float | None = None, watch=None, profile: str | None = None) -> int:
    """Runs `script` as `n` ranks. Each rank runs under `tessera _rank`, which
    reports how it ended: a rank that raises aborts the job (and says so); one
    that exits non-zero or is killed is named, and mpiexec then stops the
    others. With `timeout`, a job still running after that many seconds is
    stopped with exit status 124. SIGTERM, SIGINT or SIGHUP to the launcher
    stops the job and returns 128 + the signal's number (see _StopSignals).
    `watch`, if given, is called about twice a second while the job runs."""
    if not Path(script).exists():
        print(f"tessera: no such script: {script}", file=sys.stderr)
        return 2
    if n < 1:
        print("tessera: -n must be at least 1", file=sys.stderr)
        return 2
    # The profile folder reaches the script through its rank's wrapper (in
    # the script's environment only: the wrapper must not profile itself).
    wrapper = ["-m", rank_wrapper.__name__] + (["--profile", str(Path(profile).resolve())]
                                               if profile else [])
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, *wrapper, script, *args]
    env = {**(env or {})}
    with _STOP_SIGNALS:
        if _STOP_SIGNALS.received is not None:      # `launch --elastic`, between two runs
            return 128 + _STOP_SIGNALS.received
        flight_dir = env.get(FLIGHT_ENV) or tessera_env.get(FLIGHT_ENV)
        own_flight_dir = not flight_dir
        if own_flight_dir:
            flight_dir = env[FLIGHT_ENV] = tempfile.mkdtemp(prefix="tessera-flight-")
        _FailedRanks.clear(Path(flight_dir))       # an earlier job's, in the user's folder
        # PYTHONHASHSEED: every rank hashes a str alike, so per-rank code such
        # as the training guide's `hash(param_name) % size` agrees across ranks.
        proc = subprocess.Popen(cmd, env={**thread_limits(n), "PYTHONHASHSEED": "0",
                                          **os.environ, **env},
                                start_new_session=True)
        try:
            return _supervise(proc, n, timeout, _HangWatch(Path(flight_dir), n), watch)
        finally:
            if own_flight_dir:
                shutil.rmtree(flight_dir, ignore_errors=True)


def _supervise(proc: subprocess.Popen, n: int, timeout: float | None, hang: "_HangWatch",
               watch) -> int:
    """Waits for the job, in slices of at most half a second so that a stop
    signal, the --timeout, a hang, a failed rank or `watch` is seen in time."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    hung = False
    failed = _FailedRanks(hang.directory)
    while True:
        try:
            code = proc.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            code = None
        if _STOP_SIGNALS.received is not None:
            # Even when the job has just ended (a scheduler may signal every
            # process of the job, mpiexec too): the launcher was told to stop.
            return _stop_for_signal(proc, n, _STOP_SIGNALS.received)
        if code is not None:
            return (code or 1) if hung else code
        if time.monotonic() >= deadline:
            if hung:
                _stop(proc)
                return 1
            print(f"tessera: the job ran longer than --timeout {timeout:g} s; stopping all "
                  f"{n} ranks", file=sys.stderr)
            _say(_stop(proc))
            return 124
        if hung:
            continue
        if failed.overdue():
            # mpiexec stops every rank once one exits non-zero; hydra
            # sometimes does not (a rank blocked in a collective with the
            # failed one can outlive it), so the launcher stops the rest.
            _say(f"mpiexec left the job running {STOP_GRACE_S:g} s after {failed.which()} "
                 "failed; stopping it")
            _say(_stop(proc))
            return failed.code()
        if hang():
            # The ranks that timed out now fail with CollectiveTimeout and
            # end the job; whatever is left after 5 s is stopped.
            hung, deadline = True, time.monotonic() + 5
        elif watch is not None:
            watch()


#: What a scheduler (`timeout`, Slurm, Kubernetes), a closed terminal or
#: Ctrl-C sends to stop the launcher.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How long the job has after SIGTERM before what is left of it gets SIGKILL.
STOP_GRACE_S = 5.0


class _StopSignals:
    """While held, a STOP_SIGNALS signal to the launcher is recorded instead
    of ending it. mpiexec runs in a session of its own (and hydra puts its
    proxy and every rank in further ones), so a launcher that died of the
    signal would leave the whole job running, orphaned; instead `_supervise`
    sees the signal within half a second, stops the job and the launcher
    exits 128 + the signal's number, as a shell reports a process the signal
    killed. Re-entrant: `launch --elastic` holds it over all its runs, so
    that a signal between two runs ends the loop too. The first signal is
    the one reported; later ones (a second Ctrl-C) change nothing, as the
    stop is under way and ends in SIGKILL after STOP_GRACE_S anyway."""

    def __init__(self):
        self.received: int | None = None
        self._depth = 0
        self._previous: dict = {}

    def _record(self, signum, _frame) -> None:
        if self.received is None:
            self.received = signum

    def __enter__(self) -> "_StopSignals":
        # Python lets only the main thread set handlers; a launch from
        # another thread keeps the default behaviour.
        if self._depth == 0 and threading.current_thread() is threading.main_thread():
            self.received = None
            # A signal the launcher was started ignoring stays ignored: SIGHUP
            # under nohup, SIGINT in a script's background job.
            self._previous = {sig: signal.signal(sig, self._record) for sig in STOP_SIGNALS
                              if signal.getsignal(sig) is not signal.SIG_IGN}
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous = {}


_STOP_SIGNALS = _StopSignals()


def _stop_for_signal(proc: subprocess.Popen, n: int, signum: int) -> int:
    """The launcher got `signum`: stops the job, says what it stopped and
    returns the launcher's exit status, 128 + signum."""
    name = signal.Signals(signum).name
    if proc.poll() is not None:
        _say(f"{name}: the job had already ended (mpiexec exit status {proc.returncode})")
    else:
        _say(f"{name}: stopping the job (mpiexec pid {proc.pid}, {n} rank{'s' if n != 1 else ''})")
        _say(_stop(proc))
    return 128 + signum


class _HangWatch:
    """Turns a collective timeout on any rank into one diagnosis: asks every
    rank for its flight recorder (flight.REQUEST_FILE), merges the records and prints
    which ranks wait in which collective and which never started it."""

    def __init__(self, directory: Path, n: int):
        self.directory, self.n = directory, n

    def __call__(self) -> bool:
        dumps = flight.read_dumps(self.directory)
        if not any(d["reason"].startswith("timeout") for d in dumps.values()):
            return False
        (self.directory / flight.REQUEST_FILE).touch()
        deadline = time.monotonic() + 3.0
        while len(dumps) < self.n and time.monotonic() < deadline:
            time.sleep(0.05)
            dumps = flight.read_dumps(self.directory)
        (self.directory / "collected").touch()
        seconds = next(d["timeout"] for d in dumps.values() if d["reason"].startswith("timeout"))
        _say(f"a collective did not complete (no progress in {seconds:g} s, "
             "TESSERA_COLLECTIVE_TIMEOUT); the ranks' flight recorders say:")
        for line in flight.diagnose(dumps, self.n):
            _say(line)
        return True


class _FailedRanks:
    """The ranks whose wrapper (`tessera_runtime.rank_wrapper`) reported a
    failure in the flight folder (`rank-R.failed`, holding its exit status)."""

    def __init__(self, directory: Path):
        self.directory, self.first_seen = directory, None

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob(f"rank-*{rank_wrapper.FAILED_SUFFIX}"))

    @classmethod
    def clear(cls, directory: Path) -> None:
        for path in cls(directory)._files():
            path.unlink(missing_ok=True)

    def overdue(self) -> bool:
        """Whether a rank failed at least STOP_GRACE_S ago."""
        if self.first_seen is None:
            if self._files():
                self.first_seen = time.monotonic()
            return False
        return time.monotonic() - self.first_seen >= STOP_GRACE_S

    def which(self) -> str:
        return ", ".join(p.stem.replace("-", " ") for p in self._files())

    def code(self) -> int:
        try:
            return int(self._files()[0].read_text()) or 1
        except (IndexError, OSError, ValueError):
            return 1


def _elastic_range(text: str) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--elastic {text!r}: expected MIN:MAX, e.g. 2:4") \
            from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"--elastic {text!r}: need 1 <= MIN <= MAX")
    return low, high


class _ElasticJob:
    """`tessera launch --elastic MIN:MAX`: runs the job, and when it fails or
    stops to resize, starts it again on the largest size the script accepts
    (`dist.elastic(world_sizes=...)`) that the ranks left allow. Ranks left:
    without `--slots-file`, the ranks of the last run less those that died
    (killed by a signal the launcher did not send, or gone without a word);
    with it, the number the file holds now (a cluster agent rewrites it as
    nodes leave and join). A rank that exited with an error keeps its slot."""

    def __init__(self, n: int, low: int, high: int, max_restarts: int, slots_file: str | None,
                 timeout: float | None):
        self.size, self.low, self.high = n, low, high
        self.max_restarts, self.slots_file, self.timeout = max_restarts, slots_file, timeout
        self.control = Path(tempfile.mkdtemp(prefix="tessera-elastic-"))

    def _job(self) -> dict | None:
        return elastic.read_json(self.control / elastic.JOB_FILE)

    def _slots(self) -> int | None:
        if self.slots_file is None:
            return None
        try:
            return int(Path(self.slots_file).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None                   # unreadable now: keep the size there is

    def _best(self, capacity: int, job: dict) -> int | None:
        fits = [n for n in job["world_sizes"] if self.low <= n <= min(self.high, capacity)]
        return max(fits) if fits else None

    def _watch(self) -> None:
        """While the job runs: ask it to grow at its next safe point when the
        slots file allows a larger size it accepts (`rejoin=True`)."""
        job, request = self._job(), self.control / elastic.REQUEST_FILE
        slots = self._slots()
        if job is None or not job.get("rejoin") or slots is None or request.exists():
            return
        best = self._best(slots, job)
        if best is not None and best > self.size:
            elastic.write_json(request, {"size": best})

    def _lost(self) -> tuple[int, str]:
        """How many ranks of the last run died (their slots are gone), and why."""
        folder = self.control / rank_wrapper.RANKS_DIR
        reports = [r for r in map(elastic.read_json, sorted(folder.glob("*.json"))) if r]
        died = [r for r in reports if r.get("signal") and not r.get("stopped")]
        if not reports:                   # a rank vanished with its wrapper (its node is gone)
            return 1, "a rank vanished"
        why = "; ".join(f"rank {r['rank']} was killed by {r['signal']}" if r.get("signal") else
                        f"rank {r['rank']} exited with status {r['code']}" for r in reports)
        return len(died), why

    def run(self, script: str, args: list[str]) -> int:
        try:
            with _STOP_SIGNALS:
                return self._runs(script, args)
        finally:
            shutil.rmtree(self.control, ignore_errors=True)

    def _runs(self, script: str, args: list[str]) -> int:
        """The runs of the job, until one ends it; returns its exit status."""
        failures = restarts = 0
        while True:
            shutil.rmtree(self.control / rank_wrapper.RANKS_DIR, ignore_errors=True)
            (self.control / rank_wrapper.RANKS_DIR).mkdir()
            for name in (elastic.REQUEST_FILE, elastic.RESIZED_FILE):
                (self.control / name).unlink(missing_ok=True)
            code = _launch(self.size, script, args, timeout=self.timeout,
                           watch=self._watch, env={
                               rank_wrapper.CONTROL_ENV: str(self.control),
                               "TESSERA_ELASTIC_RESTART": str(restarts),
                               "TESSERA_ELASTIC_MAX": str(self.high)})
            if _STOP_SIGNALS.received is not None:     # the launcher was told to stop
                return 128 + _STOP_SIGNALS.received
            resized = elastic.read_json(self.control / elastic.RESIZED_FILE)
            # 2: a usage error (no such script, bad arguments): another run
            # fails the same way. 124: --timeout.
            if code == 0 and resized is None or code in (2, 124):
                return code
            job = self._job()
            if job is None:
                _say("the script never entered dist.elastic, so it cannot resume: "
                     "not restarting")
                return code
            lost, why = (0, "ranks came back") if resized else self._lost()
            if not resized:
                if failures >= self.max_restarts:
                    _say(f"the job failed again after {failures} restart"
                         f"{'s' if failures != 1 else ''} (--max-restarts "
                         f"{self.max_restarts}): giving up")
                    return code
                failures += 1
            slots = self._slots()
            capacity = slots if slots is not None else self.size - lost
            new = self._best(capacity, job)
            if new is None:
                _say(f"{capacity} rank{'s' if capacity != 1 else ''} left, and the script "
                     f"accepts none of {job['world_sizes']} within --elastic "
                     f"{self.low}:{self.high}: giving up")
                return code or 1
            restarts += 1
            found = elastic.saved_step(job["directory"])
            where = f"resuming at step {found[1]}" if found else "starting from step 0"
            _say(f"restart {restarts}: {self.size} -> {new} ranks, {where} ({why})")
            self.size = new


def _stop(proc: subprocess.Popen) -> str:
    """Stops mpiexec and every process of its job; returns what it took, for
    the launcher to print. SIGTERM goes to mpiexec's process group, which
    holds mpiexec alone: hydra puts its proxy and each rank's wrapper in a
    session of their own. mpiexec passes the signal on (its proxy ends every
    rank's process group, the rank's wrapper and the script), so the job
    ends in order. Whatever of it still runs after STOP_GRACE_S (mpiexec
    stuck, or gone and leaving ranks behind) is killed with SIGKILL, each
    process's whole group. The job's processes are found below mpiexec in
    /proc, again at every poll, so that one seen before its parent died is
    not lost."""
    if proc.poll() is not None:
        # Reaped: its pid may be another process's now. Its ranks, if any
        # outlived it, are no longer below it to be found.
        return f"stopped: mpiexec had already ended (exit status {proc.returncode})"
    started = time.monotonic()
    job = _descendants(proc.pid)                # pid -> process group, mpiexec included
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    while True:
        if proc.poll() is None:
            job.update(_descendants(proc.pid))
        running = [pid for pid in job if pid != proc.pid and _running(pid)]
        if proc.returncode is None:
            running.insert(0, proc.pid)
        if not running:
            return (f"stopped: mpiexec and every rank ended {time.monotonic() - started:.1f} s "
                    f"after SIGTERM ({len(job)} processes)")
        if time.monotonic() - started >= STOP_GRACE_S:
            break
        time.sleep(0.05)
    for pid in running:
        try:
            os.killpg(job[pid], signal.SIGKILL)     # a rank wrapper's group holds its script
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    return (f"stopped: {len(running)} of the job's {len(job)} processes still ran "
            f"{STOP_GRACE_S:g} s after SIGTERM (pids {', '.join(map(str, running))}); "
            "killed them with SIGKILL")


def _proc_stat(pid) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of `pid` from /proc (Linux), or
    None where it has no entry (gone, or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may itself hold spaces and ')'.
    state, parent, group = text.rsplit(")", 1)[1].split()[:3]
    return state, int(parent), int(group)


def _descendants(root: int) -> dict[int, int]:
    """`root` and every process below it: pid -> its process group (only
    `root` where there is no /proc)."""
    children: dict[int, list[int]] = {}
    groups = {root: root}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            stat = _proc_stat(entry.name)
            if stat is not None:
                children.setdefault(stat[1], []).append(int(entry.name))
                groups[int(entry.name)] = stat[2]
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        found[pid] = groups.get(pid, pid)
        todo += children.get(pid, [])
    return found


def _running(pid: int) -> bool:
    """Whether process `pid` is alive; a zombie (ended, not yet reaped by its
    parent, or by init where the parent ended first) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _proc_stat(pid)
    if stat is None:                # gone since, or no /proc to ask: kill's answer stands
        return not os.path.isdir("/proc")
    return stat[0] not in "ZX"


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
                                        "TESSERA_COMM_TRACE=1 logs every collective; a collective "
                                        "stuck for TESSERA_COLLECTIVE_TIMEOUT seconds (default "
                                        "600) stops the job and names the ranks it waits for; "
                                        "TESSERA_DETERMINISTIC=1 fixes every reduction order. "
                                        "SIGTERM, SIGINT or SIGHUP to the launcher (timeout, "
                                        "Slurm, Kubernetes, Ctrl-C) stops every rank, with "
                                        "SIGKILL after 5 s, and exits 128 + the signal's "
                                        "number; --elastic does not restart then.")
    launch.add_argument("-n", "--nprocs", type=int, default=None,
                        help="number of ranks (default 1; with --elastic, MAX)")
    launch.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop every rank and exit 124 if the job runs longer")
    launch.add_argument("--elastic", type=_elastic_range, default=None, metavar="MIN:MAX",
                        help="restart the job when a rank dies, on the ranks left (at least MIN, "
                             "at most MAX; the largest size the script's dist.elastic accepts), "
                             "resuming from its latest checkpoint; grow back when --slots-file "
                             "allows. Each resize is printed: `[tessera] restart 1: 4 -> 2 "
                             "ranks, resuming at step 120`")
    launch.add_argument("--max-restarts", type=int, default=3, metavar="N",
                        help="with --elastic: give up after N restarts caused by failures "
                             "(default 3; resizes to grow do not count)")
    launch.add_argument("--slots-file", default=None, metavar="FILE",
                        help="with --elastic: a file holding how many ranks may run now, read "
                             "at each restart and twice a second while the job runs (a cluster "
                             "agent rewrites it as nodes leave and come back)")
    launch.add_argument("--profile", default=None, metavar="DIR",
                        help="profile the whole run as dist.profile() does: rank 0 prints each "
                             "rank's compute / communication / waiting / idle balance at exit "
                             "and writes DIR/trace.json (one Perfetto timeline for all ranks; "
                             "open it in ui.perfetto.dev), DIR/summary.txt and DIR/timeline.png "
                             "(a picture of the trace, where matplotlib is installed)")
    launch.add_argument("--ranks-per-node", type=int, default=None, metavar="N",
                        help="the ranks run N to a node (consecutive ranks; sets "
                             "TESSERA_RANKS_PER_NODE): all-reduces over a mesh axis that spans "
                             "nodes compile to a reduce-scatter inside each node, an all-reduce "
                             "across nodes and an all-gather inside each node")
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

    calibrate = sub.add_parser(
        "calibrate", help="measure this host for the cost model (trace.cost())",
        description="Run the cost model's microbenchmarks for N ranks on this host (kernels, "
                    "BLAS, copies and the executor in one process on the threads a rank of an "
                    "N-rank job gets; collectives over the world and over pairs in a job of N "
                    "ranks), print the machine description and cache it, so that "
                    "`trace.cost(\"cpu\")` predicts steps of N ranks on this host. Takes "
                    "about a minute.")
    calibrate.add_argument("-n", "--nprocs", type=int, default=1, help="ranks (default 1)")
    calibrate.add_argument("--force", action="store_true",
                           help="measure again even if a calibration is cached")

    simulate = sub.add_parser(
        "simulate", help="predict a script's training step on a mesh of any size, here",
        description="Run SCRIPT in this one process standing for every rank of MESH: each "
                    "axis is passed to it as `--AXIS SIZE` (examples/train_gpt.py's flags), "
                    "parameters are placeholders that take no memory, and each compiled "
                    "function it calls is compiled once for the whole mesh (no kernels) and "
                    "priced per rank by the cost model instead of run. The second call of a "
                    "function ends the script: what it called until then is one step. Prints "
                    "each function's predicted time on the slowest rank (compute, exposed and "
                    "hidden communication, runtime, a pipeline's bubble) and the planned peak "
                    "memory per rank.",
        epilog="example: tessera simulate --mesh dp=8,tp=8,pp=16 --machine h100-node "
               "examples/train_gpt.py -- --width 4096 --depth 32")
    simulate.add_argument("--mesh", required=True, metavar="AXIS=SIZE,...",
                          help="the mesh, outermost axis first, e.g. dp=8,tp=8,pp=16")
    simulate.add_argument("--machine", default="h100-node",
                          help="h100-node or h200-node (8 GPUs a node, datasheet rates), or cpu "
                               "(this host as measured by `tessera calibrate`, with as many "
                               "ranks as the mesh); default h100-node")
    simulate.add_argument("--trace", default=None, metavar="FILE",
                          help="write the predicted timeline of --trace-ranks as one Perfetto "
                               "trace (open it in ui.perfetto.dev), and a picture of it beside "
                               "(FILE with .png, where matplotlib is installed)")
    simulate.add_argument("--trace-ranks", default=None, metavar="R,R,...",
                          help="ranks in --trace (default: the first, the slowest and the last)")
    simulate.add_argument("script")
    simulate.add_argument("args", nargs=argparse.REMAINDER,
                          help="arguments for the script (after --)")

    autotune = sub.add_parser(
        "autotune", help="list or forget the compile options autotuning chose",
        description="Functions compiled with ts.jit(..., autotune=True) (or run with "
                    "TESSERA_AUTOTUNE=1) measure candidate compile options on their first call "
                    "of a signature (kernel tile sizes, gradient bucket size; GEMM "
                    "configurations on the GPU) and store the fastest per architecture, "
                    "shapes, dtypes and compiler version in the cache directory "
                    "(TESSERA_CACHE_DIR); later runs use it without searching.")
    what = autotune.add_mutually_exclusive_group(required=True)
    what.add_argument("--show", action="store_true",
                      help="list every stored choice: function, architecture, arguments, the "
                           "options chosen and their time against the defaults'")
    what.add_argument("--clear", action="store_true", help="forget every stored choice")

    if argv is None:
        argv = sys.argv[1:]
    opts = parser.parse_args(argv)
    if opts.env:
        from tessera_runtime import env
        print(env.table())
        return 0
    if opts.command == "launch":
        if opts.ranks_per_node is not None:
            if opts.ranks_per_node < 1:
                parser.error("--ranks-per-node must be at least 1")
            os.environ["TESSERA_RANKS_PER_NODE"] = str(opts.ranks_per_node)
        if opts.elastic is None:
            if opts.slots_file:
                parser.error("--slots-file needs --elastic MIN:MAX")
            return _launch(opts.nprocs or 1, opts.script, opts.args, timeout=opts.timeout,
                           profile=opts.profile)
        if opts.profile:
            parser.error("--profile with --elastic: profile one size at a time, without --elastic")
        low, high = opts.elastic
        n = opts.nprocs or high
        if not low <= n <= high:
            parser.error(f"-n {n} is outside --elastic {low}:{high}")
        return _ElasticJob(n, low, high, opts.max_restarts, opts.slots_file,
                           opts.timeout).run(opts.script, opts.args)
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
    if opts.command == "simulate":
        return _simulate(parser, opts)
    if opts.command == "autotune":
        from . import autotune as tuning
        if opts.clear:
            print(f"forgot {tuning.clear()} autotuned choice(s) ({tuning.cache_file()})")
        else:
            print(tuning.show())
        return 0
    if opts.command == "calibrate":
        import json
        from .machine import cache_path, calibrate as measure, machine
        if opts.nprocs < 1:
            parser.error("-n must be at least 1")
        cached = cache_path(opts.nprocs).exists() and not opts.force
        described = machine("cpu", opts.nprocs) if cached else measure(opts.nprocs)
        print(json.dumps(described.to_json(), indent=1))
        print(("cached" if cached else "written") + f": {cache_path(opts.nprocs)}",
              file=sys.stderr)
        return 0
    parser.print_help()
    return 2


def _simulate(parser, opts) -> int:
    import json
    import runpy
    from . import simulation
    from .machine import machine as describe
    try:
        mesh = simulation.parse_mesh(opts.mesh)
    except ValueError as err:
        parser.error(str(err))
    if not Path(opts.script).exists():
        parser.error(f"no such script: {opts.script}")
    size = math.prod(mesh.values())
    try:
        described = describe(opts.machine, ranks=size)
    except ValueError as err:
        parser.error(str(err))
    target = "cpu" if opts.machine == "cpu" else "gpu"
    sim = simulation.Simulation(mesh, described, target)
    args = opts.args[1:] if opts.args[:1] == ["--"] else list(opts.args)
    args += [x for axis, n in mesh.items() for x in (f"--{axis}", str(n))]
    print(f"[tessera simulate] running {opts.script} {' '.join(args)} as {size} ranks",
          file=sys.stderr, flush=True)
    argv, sys.argv = sys.argv, [opts.script] + args
    simulation.start(sim)
    started = time.perf_counter()
    try:
        runpy.run_path(opts.script, run_name="__main__")
    except simulation.SimulationDone:
        pass
    except TesseraError as err:         # the user's program, as written, cannot compile
        print(f"[tessera simulate] {opts.script}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except SystemExit as done:
        if done.code not in (None, 0):
            print(f"[tessera simulate] {opts.script} exited with {done.code} before a step",
                  file=sys.stderr)
            return 1
    finally:
        simulation.stop()
        sys.argv = argv
    print(sim.table())
    print(f"[tessera simulate] simulated in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    if opts.trace and sim.records:
        if opts.trace_ranks:
            ranks = sorted({int(r) for r in opts.trace_ranks.split(",")})
            bad = [r for r in ranks if not 0 <= r < size]
            if bad:
                parser.error(f"--trace-ranks {bad} are not ranks of the {size}-rank mesh")
        else:
            ranks = sorted({0, sim.slowest(), size - 1})
        trace = sim.perfetto(ranks)
        Path(opts.trace).write_text(json.dumps(trace))
        written = [opts.trace]
        try:
            from .profiling import timeline_png
            written.append(str(timeline_png(trace, Path(opts.trace).with_suffix(".png"))))
        except ImportError:
            pass                                # matplotlib is optional
        print(f"[tessera simulate] predicted timeline of ranks {ranks} written to "
              f"{' and '.join(written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
