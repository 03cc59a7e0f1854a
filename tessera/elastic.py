"""Restart-based elastic training (the collectives guide 5.2):

    with dist.elastic(rejoin=True, safe_point="step", directory="ckpt") as job:
        mesh = dist.Mesh(axes=["dp"], shape=(job.world_size,))
        ...                                            # parameters on `mesh`
        saved = job.resume(tensors=params, optimizer=opt_state, extra={"rng": rng})
        params, opt_state, extra = saved               # the latest checkpoint, or these
        for step in range(job.step + 1, steps + 1):
            params, opt_state = train_step(params, opt_state, batch(extra["rng"]))
            job.safe_point(step, tensors=params, optimizer=opt_state, extra=extra)

Tessera resizes a job by restarting it, as torchrun does, and makes the
restart cheap to get right: at every safe point (`every` of them) the state
is saved with `tessera.checkpoint` (async, atomic); when a rank dies,
`tessera launch --elastic MIN:MAX` stops the job and starts it again on the
ranks that remain, and `job.resume` loads the newest committed checkpoint
onto the new mesh (any dp/tp/pp/ep sizes: each tensor in the layout of the
value it is given, MoE experts in blocks over the new `ep` size, so expert e
lives on ep rank e // (E / ep)). When ranks come back (`--slots-file`) and
`rejoin=True`, the launcher asks the job to stop at its next safe point,
which saves synchronously and exits, and restarts it on more ranks.

A safe point is a place every rank reaches with the same state: between
steps ("step"); "pipeline_boundary" names the same place, because a
compiled pipelined step drains its pipeline before it returns. With
deterministic reductions and `ts.optim.accumulate_grad` over a fixed set of
microbatches, a resumed run on another dp size continues with the same bits.

The launcher and the job talk through files in a control folder the
launcher makes (TESSERA_ELASTIC_CONTROL): the job writes `job.json` (the
world sizes the script accepts, its checkpoint folder) and, when it stopped
to resize, `resized.json`; the launcher writes `resize-request.json`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from tessera_runtime import env, world
from tessera_runtime.rank_wrapper import CONTROL_ENV, write_json

from . import checkpoint
from ._checks import is_int
from ._dtensor import DTensor
from ._mpi import bcast_text, world_comm
from ._pytree import flatten
from ._source import user_frame
from .errors import TesseraError

SAFE_POINTS = ("step", "pipeline_boundary")
JOB_FILE, REQUEST_FILE, RESIZED_FILE = "job.json", "resize-request.json", "resized.json"


class ElasticError(TesseraError, RuntimeError):
    """A job that cannot run elastically as asked (names the sizes and the reason)."""


def control_dir() -> Path | None:
    """The launcher's control folder (None outside `tessera launch --elastic`)."""
    value = env.get(CONTROL_ENV)
    return Path(value) if value else None


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def saved_step(directory) -> tuple[str, int] | None:
    """(tag, step) of the newest committed elastic checkpoint in `directory`."""
    tag = checkpoint.latest(directory)
    if tag is None:
        return None
    step = checkpoint.manifest(tag, directory=directory)["leaves"].get("extra", [])
    found = [e["value"] for e in step if e.get("path") == "extra.step"]
    return (tag, int(found[0])) if found else None


class _Resize(SystemExit):
    """Raised by a safe point that stopped the job for a resize: leaves the
    script with status 0 (the launcher restarts it) through every `finally`."""


class Elastic:
    """`dist.elastic(...)`: see the module's documentation.

    rejoin: let the launcher grow the job at a safe point when ranks come back.
    safe_point: "step" or "pipeline_boundary" (the same place for Tessera's
        compiled steps: between them).
    directory: where the checkpoints go (tags `step_<N>`).
    every: save at every N-th safe point (and at the one a resize stops at).
    keep: how many checkpoints to keep.
    world_sizes: the numbers of ranks the script can run on: a collection of
        ints or a function n -> bool (default: any). The launcher restarts on
        the largest of them that the ranks left allow."""

    def __init__(self, rejoin: bool = True, safe_point: str = "step",
                 directory="checkpoints", every: int = 1, keep: int = 2, world_sizes=None):
        if safe_point not in SAFE_POINTS:
            raise ElasticError(f"dist.elastic: safe_point={safe_point!r}; the safe points are "
                               f"{', '.join(map(repr, SAFE_POINTS))}  [{user_frame()}]")
        for name, value in (("every", every), ("keep", keep)):
            if not is_int(value) or value < 1:
                raise ElasticError(f"dist.elastic: {name}={value!r} must be a positive integer  "
                                   f"[{user_frame()}]")
        if world_sizes is not None and not callable(world_sizes) and (
                isinstance(world_sizes, (str, bytes)) or not hasattr(world_sizes, "__iter__")
                or not all(is_int(n) and n >= 1 for n in world_sizes)):
            raise ElasticError(f"dist.elastic: world_sizes={world_sizes!r} must be a collection "
                               f"of numbers of ranks (ints >= 1) or a function n -> bool  "
                               f"[{user_frame()}]")
        self.rejoin = bool(rejoin)
        self.directory, self.every, self.keep = Path(directory), every, keep
        self._accepts = world_sizes if callable(world_sizes) else \
            (lambda n, sizes=frozenset(world_sizes): n in sizes) if world_sizes is not None \
            else (lambda n: True)
        self.restart = env.integer("TESSERA_ELASTIC_RESTART")
        self.rank, self.world_size = world()
        self.step = 0                     # the step the state belongs to (0: fresh)
        self._handle = None
        self._control = control_dir()     # read once: safe points run every step
        self._kill_at = _kill_step(self.rank) if self.restart == 0 else None

    # -- the launcher's side of the job --------------------------------------------

    def allowed_sizes(self, up_to: int) -> list[int]:
        """The world sizes from 1 to `up_to` this script accepts."""
        return [n for n in range(1, up_to + 1) if self._accepts(n)]

    def __enter__(self) -> "Elastic":
        limit = max(self.world_size, env.integer("TESSERA_ELASTIC_MAX"))
        sizes = self.allowed_sizes(limit)
        if self.world_size not in sizes:
            upto = max(limit, 16)
            shown = ", ".join(map(str, self.allowed_sizes(upto))) or "none"
            raise ElasticError(f"dist.elastic: this job runs {self.world_size} rank"
                               f"{'s' if self.world_size > 1 else ''}, which the script does "
                               f"not accept (its world_sizes accepts {shown} of 1-{upto})")
        if self._control is not None and self.rank == 0:
            write_json(self._control / JOB_FILE, {
                "world_sizes": sizes, "rejoin": self.rejoin,
                "directory": str(self.directory.resolve()), "world_size": self.world_size})
        return self

    def __exit__(self, kind, value, tb) -> bool:
        if kind is None and self._handle is not None:
            self._handle.wait()           # the last checkpoint is committed on exit
        return False

    # -- the script's side ---------------------------------------------------------

    def resume(self, tensors=None, optimizer=None, extra=None) -> checkpoint.Checkpoint:
        """The newest committed checkpoint in `directory`, each tensor laid out
        like the value given for it (a DTensor on this run's mesh, or a numpy
        array), and `job.step` set to its step; without one, the given values
        (step 0). Collective."""
        given = {"tensors": tensors, "optimizer": optimizer}
        found = checkpoint.latest(self.directory)
        if found is None:
            self.step = 0
            return checkpoint.Checkpoint(None, tensors, optimizer, extra, {})
        meshes = [x.mesh for tree in given.values() if tree is not None
                  for x in flatten(tree)[0] if isinstance(x, DTensor)]
        saved = checkpoint.load(found, directory=self.directory,
                                mesh=meshes[0] if meshes else None,
                                like={k: v for k, v in given.items() if v is not None})
        if not isinstance(saved.extra, dict) or "step" not in saved.extra:
            raise ElasticError(f"dist.elastic: checkpoint '{found}' in {self.directory} holds "
                               "no extra['step']; it was not saved by a safe point")
        self.step = int(saved.extra["step"])
        if self.rank == 0:
            before = saved.manifest.get("world_size")
            sys.stderr.write(f"[tessera] elastic: resuming at step {self.step} from checkpoint "
                             f"'{found}' (saved by {before} rank{'s' if before != 1 else ''}, "
                             f"now {self.world_size})\n")
        extra = {k: v for k, v in saved.extra.items() if k != "step"}
        return checkpoint.Checkpoint(found, saved.tensors, saved.optimizer, extra,
                                     saved.manifest)

    def _resize_requested(self) -> bool:
        """Whether the launcher asked for a resize: rank 0 looks, every rank
        learns its answer (so they all stop at the same safe point)."""
        if self._control is None or not self.rejoin:
            return False
        wanted = "1" if self.rank == 0 and (self._control / REQUEST_FILE).exists() else ""
        if self.world_size > 1:
            wanted = bcast_text(world_comm(), wanted,
                                what="the resize check of a dist.elastic safe point")
        return wanted == "1"

    def safe_point(self, step: int, tensors=None, optimizer=None, extra=None) -> None:
        """Every rank calls this after step `step` with the state to keep
        (collective). Saves every `every` steps (async); when the launcher
        asked for a resize, saves synchronously and ends the script (status
        0) so that the launcher restarts it on the new number of ranks."""
        if extra is not None and not isinstance(extra, dict):
            raise ElasticError("dist.elastic: safe_point's extra must be a dict (the step is "
                               "added to it as extra['step'])")
        if step == self._kill_at:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        resize = self._resize_requested()
        if step % self.every == 0 or resize:
            self._handle = checkpoint.save(
                f"step_{step}", tensors=tensors, optimizer=optimizer,
                extra={**(extra or {}), "step": step}, directory=self.directory,
                async_io=not resize, keep=self.keep)
        self.step = step
        if resize:
            self._handle.wait()
            if self.rank == 0:
                write_json(self._control / RESIZED_FILE, {"step": step, "tag": f"step_{step}"})
            raise _Resize(0)


def _kill_step(rank: int) -> int | None:
    """TESSERA_ELASTIC_KILL=RANK:STEP: the safe point at which this rank kills
    itself with SIGKILL in the job's first run (to test the restart path)."""
    spec = env.get("TESSERA_ELASTIC_KILL")
    if not spec:
        return None
    try:
        victim, step = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ElasticError(f"TESSERA_ELASTIC_KILL={spec!r} must be RANK:STEP") from None
    return step if victim == rank else None
