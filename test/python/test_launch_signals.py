"""A stopped launcher stops its job: SIGTERM (`timeout`, Slurm, Kubernetes),
SIGINT (Ctrl-C) or SIGHUP (a closed terminal) to `tessera launch` ends mpiexec
and every rank within seconds, says what it stopped, and the launcher exits
128 + the signal's number; `--elastic` does not restart, and leaves only
whole checkpoints. The launcher runs in the background, as schedulers run it."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tessera import checkpoint, elastic

REPO = Path(__file__).resolve().parents[2]

#: Each rank writes OUT/started.<rank>: the pids of every process of the job
#: it runs in: itself, its wrapper (`tessera_runtime.rank_wrapper`), hydra's proxy,
#: mpiexec.
STARTED = """
def started(out):
    import os
    from pathlib import Path
    def parent(pid):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    wrapper = os.getppid()
    proxy = parent(wrapper)
    rank = os.environ["PMI_RANK"]
    Path(out, f"starting.{rank}").write_text(f"{os.getpid()} {wrapper} {proxy} {parent(proxy)}")
    os.replace(Path(out, f"starting.{rank}"), Path(out, f"started.{rank}"))
"""

SPINNER = STARTED + """
import sys
started(sys.argv[1])
while True:
    pass
"""

#: An elastic job that saves a checkpoint at every step, as fast as it can,
#: so that the stop finds a save under way; it says it started once its
#: first checkpoint is committed.
ELASTIC_SAVER = STARTED + """
import sys
from pathlib import Path
import numpy as np
from tessera import checkpoint, dist

out = Path(sys.argv[1])
with dist.elastic(directory=out / "ckpt", keep=2, world_sizes=(1, 2)) as job:
    job.resume()
    step = 0
    while True:
        step += 1
        job.safe_point(step, tensors={"x": np.full(1 << 16, step, np.float32)})
        if step == 1:
            checkpoint.latest(out / "ckpt")       # waits for the save to commit
            started(out)
"""

RANKS = 2


def _launch_in_background(tmp_path: Path, source: str, *options) -> subprocess.Popen:
    """`tessera launch -n RANKS OPTIONS job.py TMP_PATH`, its output in
    TMP_PATH/launcher.log: a file, not a pipe, which ranks that outlive the
    launcher (the bug this tests) would hold open."""
    script = tmp_path / "job.py"
    script.write_text(source)

    # A session of its own, as under `timeout` or a batch system; a signal
    # the test's shell may ignore (SIGINT in a background job) reaches the
    # launcher as it would in a terminal.
    def default_signals():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    with open(tmp_path / "launcher.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "tessera", "launch", "-n", str(RANKS),
                                 *options, str(script), str(tmp_path)],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=default_signals)


def _wait_for_ranks(launcher: subprocess.Popen, out: Path) -> list[int]:
    """The pids of every process of the job (mpiexec first), once all ranks
    have started."""
    deadline = time.monotonic() + 120
    files = []
    while len(files) < RANKS:
        if launcher.poll() is not None:
            pytest.fail("the job ended before every rank started:\n"
                        + (out / "launcher.log").read_text())
        assert time.monotonic() < deadline, "the ranks did not start within 120 s"
        time.sleep(0.05)
        files = sorted(out.glob("started.*"))
    pids = [[int(pid) for pid in f.read_text().split()] for f in files]
    mpiexec = {p[-1] for p in pids}
    assert len(mpiexec) == 1, pids
    return [*mpiexec, *{pid for p in pids for pid in p[:-1]}]


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:          # a zombie (ended, its parent not yet told) is not running
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _still_running(pids, within: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _stop_and_check(launcher: subprocess.Popen, out: Path, job: list[int],
                    sig: signal.Signals) -> str:
    """Sends `sig` to the launcher; asserts it exits 128 + sig within 15 s,
    naming what it stopped, and that no process of the job is left. Returns
    what it printed."""
    launcher.send_signal(sig)
    try:
        launcher.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launcher still ran 15 s after {sig.name}:\n"
                    + (out / "launcher.log").read_text())
    stderr = (out / "launcher.log").read_text()
    assert launcher.returncode == 128 + sig, stderr
    said = re.search(rf"\[tessera\] {sig.name}: stopping the job \(mpiexec pid (\d+), "
                     rf"{RANKS} ranks\)\n\[tessera\] stopped: mpiexec and every rank ended "
                     r"[0-9.]+ s after SIGTERM", stderr)
    assert said and int(said[1]) == job[0], (job, stderr)
    left = _still_running(job)
    assert not left, f"still running after the launcher exited: {left}\n{stderr}"
    return stderr


@pytest.fixture
def job_pids():
    """The pids the test saw; any still running at the end is killed, so a
    failing test leaves no spinning rank behind."""
    pids = []
    yield pids
    for pid in _still_running(pids, within=0):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(autouse=True)
def _needs_mpiexec():
    if not (Path(sys.executable).parent / "mpiexec").exists() and not shutil.which("mpiexec"):
        pytest.skip("mpiexec not found (pip install mpich)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_signal_to_launcher_stops_every_rank(tmp_path, sig, job_pids):
    launcher = _launch_in_background(tmp_path, SPINNER)
    try:
        job_pids += _wait_for_ranks(launcher, tmp_path)
        _stop_and_check(launcher, tmp_path, job_pids, sig)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_elastic_launcher_stopped_does_not_restart_and_saves_nothing_partial(tmp_path,
                                                                            job_pids):
    launcher = _launch_in_background(tmp_path, ELASTIC_SAVER, "--elastic", f"1:{RANKS}")
    try:
        job_pids += _wait_for_ranks(launcher, tmp_path)
        stderr = _stop_and_check(launcher, tmp_path, job_pids, signal.SIGTERM)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert "restart" not in stderr, stderr
    # The stop came while saves ran back to back: the newest committed
    # checkpoint is whole, and the one an elastic restart resumes from.
    ckpt = tmp_path / "ckpt"
    tag, step = elastic.saved_step(ckpt)
    saved = checkpoint.load("latest", directory=ckpt)
    assert saved.tag == tag == f"step_{step}"
    np.testing.assert_array_equal(saved.tensors["x"], np.full(1 << 16, step, np.float32))


def test_a_job_mpiexec_leaves_running_after_a_rank_failed_is_stopped(tmp_path, monkeypatch,
                                                                     capsys):
    """A rank's wrapper that fails reports it in the flight folder; should
    mpiexec leave the other ranks running (hydra usually stops them, but not
    always), the launcher stops the job itself STOP_GRACE_S later and exits
    with the failed rank's status. (A `sleep` stands for the job.)"""
    from tessera import cli
    from tessera_runtime import rank_wrapper

    monkeypatch.setattr(cli, "STOP_GRACE_S", 0.3)
    rank_wrapper.failed_file(tmp_path, 3).write_text("stale, from an earlier job")
    cli._FailedRanks.clear(tmp_path)
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # Rank 1's wrapper, its script exiting with status 7.
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit(7)\n")
    wrapper = subprocess.run([sys.executable, "-m", "tessera_runtime.rank_wrapper", str(script)],
                             env={**os.environ, "PMI_RANK": "1", "PMI_SIZE": "2",
                                  rank_wrapper.FLIGHT_ENV: str(tmp_path)},
                             capture_output=True, text=True, timeout=60)
    assert wrapper.returncode == 7 and "rank 1 exited with status 7" in wrapper.stderr
    assert rank_wrapper.failed_file(tmp_path, 1).read_text() == "7"
    start = time.monotonic()
    code = cli._supervise(job, 2, None, cli._HangWatch(tmp_path, 2), None)
    assert code == 7 and job.poll() is not None and time.monotonic() - start < 5
    assert "left the job running 0.3 s after rank 1 failed" in capsys.readouterr().err
