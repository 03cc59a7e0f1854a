"""`tessera simulate`: a training script's step on a mesh of any size,
predicted on this machine without running it.

    tessera simulate --mesh dp=8,tp=8,pp=16 --machine h100-node \\
        examples/train_gpt.py -- --width 4096 --depth 32

runs the script in this one process with each axis of `--mesh` passed to it
as `--<axis> <size>` (examples/train_gpt.py's flags). While it runs:

- parameters and optimizer state cost no memory: `ts.nn.init_transformer`
  and the optimizers' `init` make placeholders (`placeholder`: a read-only
  zero-stride array of the right shape and dtype), and `dist.Mesh` lets
  this process stand for every rank (`require_rank` passes);
- a compiled function, when called, is traced once and lowered to Tile IR
  for the whole mesh (one SPMD program: one compilation, not one per
  rank; no kernel is compiled), its memory planned and each rank's call
  priced by the cost model (`tessera_compiler.cost.estimate`: one
  prediction per distinct role, e.g. a pipeline stage); it returns
  placeholders of its results' shapes, so the script goes on;
- the second call of a function already simulated ends the script: the
  functions called until then are one training step.

The report gives, per function and for the step (their sum), the
predicted time of the slowest rank and its parts (compute, exposed and
hidden communication, waiting for other stages, runtime), a pipeline's bubble (the schedule's
idle share at the actions' costs; the step itself comes from simulating
the stage ranks' programs together, their waits for each other included),
and the planned peak memory per rank;
`--trace FILE` writes the predicted timeline of a few ranks as one
Perfetto trace. Hierarchical collectives apply as the machine's nodes
say (`ranks_per_node` of the machine description, unless given).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from tessera_compiler.cost import Machine, estimate

from . import _context, _dtensor
from ._pytree import unflatten
from .dtypes import bf16
from .profiling import perfetto_trace

__all__ = ["Simulation", "SimulationDone", "active", "placeholder", "parse_mesh"]


#: how the report names a communication kind
COMM_NAMES = {"shift": "ring shift (ring attention)"}


class SimulationDone(BaseException):
    """The script called a simulated function again: one step has been seen.
    (A BaseException, so that a script's `except Exception` lets it through.)"""


def placeholder(shape, dtype=np.float32) -> np.ndarray:
    """An array of `shape` and `dtype` that takes no memory (zero strides,
    read-only): what a simulated tensor's value is."""
    return np.broadcast_to(np.zeros((), dtype), tuple(int(d) for d in shape))


def parse_mesh(text: str) -> dict[str, int]:
    """`"dp=8,tp=8,pp=16"` -> {"dp": 8, "tp": 8, "pp": 16} (ValueError naming
    the bad part)."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.strip().partition("=")
        if not name or not size.isdigit() or int(size) < 1 or name in out:
            raise ValueError(f"--mesh {text!r}: {part.strip()!r} is not AXIS=SIZE (a new axis "
                             f"name and a positive size), e.g. dp=8,tp=8,pp=16")
        out[name] = int(size)
    return out


@dataclass
class Record:
    """One simulated function."""
    name: str
    cost: object                  # tessera_compiler.cost.Cost
    memory: object                # tessera_compiler.memory.MemoryPlan
    compile_s: float
    #: a pipeline's Report (bubble, grid), else None
    pipeline: object = None
    roles: int = 1

    def busy_s(self, rank: int) -> float:
        """The rank's predicted call less its waits for peers (a pipeline's
        bubble: the cost model simulates the stage ranks together)."""
        return self.step_s(rank) - self.cost.ranks[rank].parts["waiting"]

    def step_s(self, rank: int) -> float:
        return self.cost.ranks[rank].step_s


@dataclass
class Simulation:
    mesh: dict
    machine: Machine
    target: str = "cpu"
    records: list = field(default_factory=list)
    called: set = field(default_factory=set)

    @property
    def size(self) -> int:
        return math.prod(self.mesh.values())

    # -- the compiled-function hook ------------------------------------------
    def call(self, compiled, args, kwargs):
        """What `compiled(*args, **kwargs)` does while simulating."""
        from tessera_compiler.bundle import program_json
        if id(compiled) in self.called:
            raise SimulationDone(compiled.fn.__name__)
        self.called.add(id(compiled))
        started = time.perf_counter()
        prepared, traced = compiled._prepare_and_trace(args, kwargs)
        leaves, mesh = prepared.leaves, prepared.mesh
        options = compiled._target()
        if compiled.target is None:
            options = options.with_(target=self.target)
        if not options.ranks_per_node and mesh.size > self.machine.ranks_per_node:
            options = options.with_(ranks_per_node=self.machine.ranks_per_node)
        levels = compiled._lower(traced.module, options, plan_only=True)
        program = program_json(levels.module)
        cost = estimate(levels.module, self.machine)
        report = compiled.report_of(program["pipeline"]) \
            if program.get("pipeline") and hasattr(compiled, "report_of") else None
        self.records.append(Record(compiled.fn.__name__, cost, compiled._entry_plan(levels),
                                   time.perf_counter() - started, report, cost.roles))
        as_numpy = compiled.numpy_results and not any(isinstance(l, _dtensor.DTensor) for l in leaves)
        results = []
        for spec in program["outputs"]:
            value = placeholder(spec["global_shape"], _dtype(spec["dtype"]))
            sharding = spec.get("sharding", {"dims": [[]] * len(value.shape), "partial": []})
            layout = _dtensor.ShardSpec.from_dims(sharding["dims"], sharding["partial"])
            results.append(value if as_numpy else _dtensor.DTensor(
                None, value.shape, value.dtype, layout, mesh,
                name=f"{compiled.fn.__name__}.{spec['name']}", global_value=value))
        return unflatten(traced.structure, results)

    # -- the report -------------------------------------------------------------
    def step(self, rank: int) -> float:
        return sum(r.step_s(rank) for r in self.records)

    def slowest(self) -> int:
        return max(range(self.size), key=self.step)

    def table(self) -> str:
        ms = 1e3
        mesh = " x ".join(f"{a}={n}" for a, n in self.mesh.items())
        lines = [f"[tessera simulate] {mesh} ({self.size} ranks) on {self.machine.name} "
                 f"({self.machine.source})"]
        if not self.records:
            return lines[0] + "\n  the script called no compiled function"
        slow = self.slowest()
        lines.append(f"{'function':<20} {'compile s':>9} {'roles':>5} {'step ms':>10} "
                     f"{'compute':>9} {'comm exp':>9} {'comm hid':>9} {'waiting':>9} "
                     f"{'runtime':>9} {'bubble':>7} {'peak GiB':>9}   (slowest rank {slow})")
        for r in self.records:
            p = r.cost.ranks[slow]
            bubble = f"{r.pipeline.bubble:7.1%}" if r.pipeline is not None else f"{'-':>7}"
            lines.append(f"{r.name:<20} {r.compile_s:9.1f} {r.roles:5d} {r.step_s(slow) * ms:10.2f} "
                         f"{p.parts['compute'] * ms:9.2f} {p.parts['comm_exposed'] * ms:9.2f} "
                         f"{p.parts['comm_hidden'] * ms:9.2f} {p.parts['waiting'] * ms:9.2f} "
                         f"{(p.parts['runtime'] + p.parts['call']) * ms:9.2f} {bubble} "
                         f"{r.memory.ranks[slow].peak / 2**30:9.2f}")
        exposed = sum(r.cost.ranks[slow].parts["comm_exposed"] for r in self.records)
        idle = sum(r.step_s(slow) - r.busy_s(slow) for r in self.records)
        peak = max(range(self.size), key=lambda k: max(r.memory.ranks[k].peak
                                                       for r in self.records))
        peak_bytes = max(r.memory.ranks[peak].peak for r in self.records)
        by_kind: dict = {}
        for r in self.records:
            for kind, (shown, hid) in r.cost.ranks[slow].comm_by_kind.items():
                total = by_kind.setdefault(COMM_NAMES.get(kind, kind), [0.0, 0.0])
                total[0] += shown
                total[1] += hid
        if by_kind:
            lines.append("communication, exposed / hidden ms: " + ", ".join(
                f"{kind} {shown * ms:.2f} / {hid * ms:.2f}"
                for kind, (shown, hid) in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))))
        lines.append(f"step: {self.step(slow) * ms:.2f} ms predicted on rank {slow} (the "
                     f"slowest; fastest {min(map(self.step, range(self.size))) * ms:.2f} ms), "
                     f"of it {exposed * ms:.2f} ms exposed communication and {idle * ms:.2f} ms "
                     f"waiting for other stages (the pipeline's bubble); peak memory {peak_bytes / 2**30:.2f} GiB (rank {peak})")
        return "\n".join(lines)

    def perfetto(self, ranks) -> dict:
        """The predicted timeline of `ranks`: each function's call after the
        previous one's, a thread per stream (dist.profile's trace format)."""
        records = []
        for rank in ranks:
            slices, offset = [], 0.0
            for r in self.records:
                for stream, what, cat, t0, t1, args in r.cost.ranks[rank].slices:
                    name = f"{r.name}: {what}" if cat == "run" else what
                    slices.append((stream, name, cat, offset + t0, offset + t1, args))
                offset += r.step_s(rank)    # (a pipeline's waits are "wait" slices in it)
            records.append({"rank": rank, "t_start": 0.0, "t_stop": offset, "slices": slices})
        trace = perfetto_trace(records, [0.0] * (max(ranks) + 1))
        trace["otherData"]["producer"] = "tessera simulate (predicted, not measured)"
        return trace


def _dtype(name: str):
    return bf16 if name == "bfloat16" else np.dtype(name)


def active() -> Simulation | None:
    """The simulation this process runs under (`tessera simulate`), if any."""
    return _context.simulation()


def start(sim: Simulation) -> None:
    _context.set_simulation(sim)


def stop() -> None:
    _context.set_simulation(None)
