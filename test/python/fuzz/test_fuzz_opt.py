"""Mutated lit inputs through every tessera-opt pass and the compile
pipeline (opt_mutation_worker.py): each ends with exit status 0 or a
diagnostic, never a signal, an `LLVM ERROR`, a Python exception turned into
"pass ... raised", an internal error or a hang. A worker that dies or hangs
is restarted after the mutant that killed it, which is reported."""

import json
import os
import subprocess
import sys
from pathlib import Path

import oracles

HERE = Path(__file__).resolve().parent
MUTANTS = 600
SEED = 20261124


def _worker(first: int, count: int, out: Path, timeout: float):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("TESSERA_OPT_TRACEBACK", None)
    try:
        return subprocess.run([sys.executable, str(HERE / "opt_mutation_worker.py"), str(SEED),
                               str(first), str(count), str(out)], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, None, (e.stdout or b"").decode(), "")


def test_mutated_lit_inputs_end_in_a_result_or_a_diagnostic(tmp_path):
    mutants = oracles.DEVELOPER_EXAMPLES or MUTANTS
    failures, first = [], 0
    while first < mutants:
        proc = _worker(first, mutants - first, tmp_path, timeout=60 + mutants * 0.5)
        done = first - 1
        for line in proc.stdout.splitlines():
            record = json.loads(line)
            if "done" in record:
                done = record["done"]
            else:
                failures.append(record)
        if proc.returncode == 0:
            break
        current = json.loads((tmp_path / "current.json").read_text())
        how = "hung" if proc.returncode is None else f"died with status {proc.returncode}"
        failures.append({**current, "rc": proc.returncode,
                         "stderr": f"tessera-opt {how}: {proc.stderr[-1500:]}"})
        first = done + 2                      # the one after the mutant that killed it
    report = "\n\n".join(
        f"mutant {f['n']} (tessera-opt {' '.join(f['flags'])}; kept as "
        f"{tmp_path / ('mutant_%d.mlir' % f['n'])}):\n{f['stderr']}" for f in failures)
    assert not failures, f"{len(failures)} of {mutants} mutants:\n{report}"
