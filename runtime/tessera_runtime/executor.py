"""Interpreter for program.json `instructions` (a serialized Schedule IR).

The program is straight-line code, so it is verified once, symbolically, when
the executor is built: every value is defined before use and not used after
`free`, shapes/dtypes of collectives agree with the mesh, a collective's `dst`
is not read (by a launch, another collective or `return`) and its buffers are
not freed before its `collective_wait`, and every started collective is
waited before `return`. A bad program therefore fails at load time on every
rank alike, instead of half-way through a run with collectives in flight
(which would hang the other ranks).

A pipeline's program holds every stage's actions: an instruction with `on`
= (axis, rank) runs only on the rank with that coordinate along the axis,
so each rank verifies and runs its own subsequence (`send` / `recv` pair
them up; the compiler's tessera-verify-schedule proved they match and
cannot deadlock). A broadcast's `src` exists on its root only.

Value checks (library routines in `library.CHECKS`: `ts.nn.cross_entropy`'s
targets) write no buffer: each returns a flag, which the run keeps and reads
once the step has run, after the engine synchronized (`Engine.read_flags`,
one small copy on a GPU), raising the first failed check's error. So a check
never synchronizes a device mid-step, and a failing step still completes
its collectives on every rank.

The executor only uses the `Engine` and `Communicator` interfaces and the
`.shape` / `.dtype` of buffers, so other engines plug in unchanged.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from . import profiler
from .bundle import Instr, ProgramSpec
from .engines.library import CHECKS, failed_check


#: the largest buffer the straight-line run keeps in its arena
#: (_arena_layout). A buffer's allocation costs microseconds of Python,
#: which only small buffers' kernels notice; and the arena's
#: bytes are held between runs, beside the results a run allocates, where
#: freed buffers could have held them: the threshold bounds that cost to the
#: small buffers' peak.
ARENA_MAX_BUFFER_BYTES = 256 << 10


class ScheduleError(ValueError):
    """The schedule program is inconsistent (found before anything runs)."""


class InputError(ValueError):
    """`Program.run` was called with the wrong number/shape/dtype of inputs."""


class Absent:
    """An input this rank does not hold, of `shape` and `dtype` (a pipeline
    stage's parameter on another stage's rank): the program runs when its
    instructions on this rank never read it (the other stages'), and any
    read of its value is an error saying where the value is (`where`)."""

    __slots__ = ("shape", "dtype", "where")

    def __init__(self, shape, dtype, where: str):
        self.shape, self.dtype, self.where = tuple(shape), np.dtype(dtype), where

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return 0

    def __array__(self, dtype=None, copy=None):
        raise InputError(f"this rank does not hold this value: {self.where}")

    def __repr__(self) -> str:
        return f"Absent({list(self.shape)}, {self.dtype.name}: {self.where})"


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _fmt(shape, dtype) -> str:
    return f"{list(shape)} {np.dtype(dtype).name}"


def _roles(ins: Instr) -> dict:
    """The buffers an in-flight transfer reads (`src`) and writes (`dst`)."""
    if ins.op == "send":
        return {"src": ins["buffer"]}
    if ins.op == "recv":
        return {"dst": ins["buffer"]}
    return {"src": ins["src"], "dst": ins["dst"]}


def _contiguous_block(full: tuple, part: tuple, offsets) -> int | None:
    """Where the box `part` at `offsets` of a C-contiguous array of shape
    `full` starts (in elements), if the box is one contiguous block of it;
    else None."""
    cut = next((d for d in range(len(full)) if part[d] != full[d]), len(full))
    if any(part[d] != 1 for d in range(cut)) or \
            any(offsets[d] != 0 for d in range(cut + 1, len(full))) or \
            any(part[d] != full[d] for d in range(cut + 1, len(full))):
        return None
    start, stride = 0, 1
    for d in range(len(full) - 1, -1, -1):
        start += offsets[d] * stride
        stride *= full[d]
    return start


def _profile_key(ins) -> str:
    """What the profiler calls a launch: its kernel, `library:<routine>`, or
    `library:matmul+<kernel>` for a GEMM running a kernel as its epilogue."""
    if "library" not in ins.fields:
        return ins["kernel"]
    epilogue = ins["attrs"].get("epilogue")
    return f"library:{ins['library']}" + (f"+{epilogue}" if epilogue else "")


def _lifetimes(plan):
    """The plan's instructions as (op, a, b, released): `released` is the
    buffer whose memory a free (or forget) gives back, None while views of
    it are alive (a view keeps the buffer it views alive) or for any other
    instruction."""
    root: dict = {}          # view -> the buffer owning its memory
    holders: dict = {}       # buffer with views -> how many refer to it
    for op, a, b, _ in plan:
        released = None
        if op == "view":
            owner = root[b[0]] = root.get(a, a)
            holders[owner] = holders.get(owner, 1) + 1
        elif op in ("free", "forget"):
            owner = root.pop(a, a)
            count = holders.pop(owner, 1) - 1
            if count:
                holders[owner] = count
            else:
                released = owner
        yield op, a, b, released


class ScheduleExecutor:
    #: the last run's bytes: {"peak_bytes", "end_bytes"} (inputs and every
    #: allocation the schedule makes; what the compiler's memory plan
    #: predicts) and "borrowed_bytes" (the inputs read in place from the
    #: caller's arrays: part of the peak, not allocated by the run) and
    #: "arena_bytes" (the part of the peak held in the straight-line run's
    #: arena, allocated once and kept between runs; 0 for the loop)
    memory: dict | None = None
    #: unprofiled CPU runs use the generated straight-line function
    #: (_straight_line); False: always the interpreting loop (tests compare them)
    straight_line = True

    def __init__(self, program: ProgramSpec, engine, communicators: dict):
        self.program = program
        self.engine = engine
        self.comms = communicators
        self._source = str(program.path)
        for i, axis in enumerate(program.mesh.axes):
            comm = communicators.get(axis)
            if comm is None:
                raise ScheduleError(f"no communicator for mesh axis '{axis}'")
            if comm.size != program.mesh.shape[i]:
                raise ScheduleError(f"communicator for axis '{axis}' has size {comm.size}, "
                                    f"mesh says {program.mesh.shape[i]}")
        # References to collectives abandoned by a failed run: MPI may still
        # be writing into their buffers, so they must stay alive.
        self._abandoned: list = []
        #: the straight-line run's arenas not in use (_new_arena): one per
        #: run in progress (a second thread's run gets a second arena)
        self._arenas: list = []
        #: this rank's instructions (a pipeline's other stages run elsewhere)
        self.instructions = [ins for ins in program.instructions
                             if "on" not in ins.fields or self._runs_here(ins["on"])]
        #: the outputs this rank returns, and (position, spec) of those another
        #: rank holds (a pipeline's results="stage"), returned as `Absent`
        here = [spec.on is None or self._runs_here(spec.on) for spec in program.outputs]
        self._outputs = [spec for spec, h in zip(program.outputs, here) if h]
        self._elsewhere = [(i, spec) for i, (spec, h) in enumerate(zip(program.outputs, here))
                           if not h]
        if self._elsewhere:         # (the return instruction without their values)
            self.instructions = [
                Instr(index=ins.index, op=ins.op, fields={**ins.fields, "values": [
                    v for v, h in zip(ins["values"], here) if h]})
                if ins.op == "return" and len(ins["values"]) == len(here) else ins
                for ins in self.instructions]
        self._verify()

    def _runs_here(self, on) -> bool:
        axis, rank = on
        comm = self.comms.get(axis)
        if comm is None:
            raise ScheduleError(f"{self._source}: an instruction runs on rank {rank} of axis "
                                f"'{axis}', which the mesh does not have")
        return comm.rank == rank

    def _reads_src(self, ins: Instr) -> bool:
        """Whether this rank reads a collective's `src` (a broadcast's only on its root)."""
        return ins["collective"] != "broadcast" or self.comms[ins["axis"]].rank == ins["root"]

    # ------------------------------------------------------------------
    # Static verification
    # ------------------------------------------------------------------
    def _err(self, ins: Instr | None, msg: str) -> ScheduleError:
        where = ins.where() if ins is not None else "program"
        return ScheduleError(f"{self._source}: {where}: {msg}")

    def _verify(self) -> None:
        p = self.program
        kind: dict[str, str] = {}           # value -> "buffer" | "event" | "token"
        meta: dict[str, tuple] = {}         # buffer -> (shape, dtype)
        freed: dict[str, int] = {}          # buffer -> index of its free
        pending: dict[str, Instr] = {}      # token -> collective_start
        waited: dict[str, set] = {}         # token -> streams that waited for it
        streams = set(p.streams)

        def define(name, k, ins):
            if name in kind:
                raise self._err(ins, f"'{name}' is defined twice")
            kind[name] = k

        def use(name, k, ins, role):
            if name not in kind:
                raise self._err(ins, f"{role} '{name}' is not defined")
            if kind[name] != k:
                raise self._err(ins, f"{role} '{name}' is {_a(kind[name])}, expected {_a(k)}")
            if name in freed:
                raise self._err(ins, f"{role} '{name}' is used after its free at "
                                     f"instructions[{freed[name]}]")

        def in_flight(name, roles):
            for tok, start in pending.items():
                for role in roles:
                    if _roles(start).get(role) == name:
                        return tok, role
            return None

        def not_in_flight(name, ins, what, roles=("dst",)):
            hit = in_flight(name, roles)
            if hit:
                raise self._err(ins, f"{what} '{name}', the {hit[1]} of collective "
                                     f"'{hit[0]}', before its collective_wait")

        for spec in p.inputs:
            define(spec.value, "buffer", None)
            meta[spec.value] = (spec.local_shape, spec.dtype)

        returned = False
        for ins in self.instructions:
            if returned:
                raise self._err(ins, "instruction after return")
            if "stream" in ins.fields and ins["stream"] not in streams:
                raise self._err(ins, f"unknown stream '{ins['stream']}' "
                                     f"(program streams: {p.streams})")
            op = ins.op
            if op == "alloc":
                define(ins["result"], "buffer", ins)
                meta[ins["result"]] = (ins["shape"], ins["dtype"])
            elif op == "free":
                use(ins["buffer"], "buffer", ins, "buffer")
                not_in_flight(ins["buffer"], ins, "frees", ("src", "dst"))
                freed[ins["buffer"]] = ins.index
            elif op == "launch":
                if "library" in ins.fields and not self.engine.has_library(ins["library"]):
                    raise self._err(ins, f"library routine '{ins['library']}' is not provided "
                                         f"by the {self.engine.name} engine")
                kernel = ins["attrs"].get("epilogue") if "library" in ins.fields \
                    else ins["kernel"]
                if kernel is not None and not self.engine.has_kernel(kernel):
                    raise self._err(ins, f"kernel '{kernel}' not found in kernel "
                                         f"library {self.engine.kernel_library}")
                for a in ins["args"]:
                    use(a, "buffer", ins, "arg")
                    not_in_flight(a, ins, "reads")
            elif op == "event_record":
                define(ins["result"], "event", ins)
            elif op == "event_wait":
                use(ins["event"], "event", ins, "event")
            elif op == "collective_start":
                reads = self._reads_src(ins)
                if reads:
                    use(ins["src"], "buffer", ins, "src")
                    not_in_flight(ins["src"], ins, "reads")
                use(ins["dst"], "buffer", ins, "dst")
                not_in_flight(ins["dst"], ins, "writes", ("src", "dst"))
                self._check_collective_shapes(ins, meta[ins["src"] if reads else ins["dst"]],
                                              meta[ins["dst"]])
                n = self.program.mesh.axis_size(ins["axis"])
                for c in ins.get("counts", ()):
                    use(c, "buffer", ins, "counts")
                    not_in_flight(c, ins, "reads")
                    if tuple(meta[c][0]) != (n,) or np.dtype(meta[c][1]) != np.int32:
                        raise self._err(ins, f"all_to_all counts '{c}' must be [{n}] int32, "
                                             f"got {_fmt(*meta[c])}")
                define(ins["result"], "token", ins)
                pending[ins["result"]] = ins
            elif op in ("send", "recv"):
                use(ins["buffer"], "buffer", ins, "buffer")
                if op == "send":
                    not_in_flight(ins["buffer"], ins, "sends")
                else:
                    not_in_flight(ins["buffer"], ins, "receives into", ("src", "dst"))
                if ins["axis"] not in self.comms:
                    raise self._err(ins, f"axis '{ins['axis']}' is not a mesh axis")
                define(ins["result"], "token", ins)
                pending[ins["result"]] = ins
            elif op == "collective_wait":
                # Each stream that reads the result waits once; the first wait
                # completes the collective.
                tok = ins["token"]
                use(tok, "token", ins, "token")
                waiters = waited.setdefault(tok, set())
                if ins["stream"] in waiters:
                    raise self._err(ins, f"token '{tok}' was already waited on stream "
                                         f"'{ins['stream']}'")
                waiters.add(ins["stream"])
                pending.pop(tok, None)
            elif op == "return":
                self._check_return(ins, use, not_in_flight, meta)
                if pending:
                    raise self._err(ins, "return with collectives never waited: " +
                                    ", ".join(f"'{t}' (started at {s.where()})"
                                              for t, s in pending.items()))
                returned = True
        if not returned:
            raise self._err(None, "no 'return' instruction")
        self._meta = meta                   # buffer -> (shape, dtype)

    def _check_collective_shapes(self, ins: Instr, src, dst) -> None:
        (sshape, sdt), (dshape, ddt) = src, dst
        if sdt != ddt:
            raise self._err(ins, f"src dtype {sdt.name} != dst dtype {ddt.name}")
        kind, axis, dim = ins["collective"], ins["axis"], ins["dim"]
        if not self.program.mesh.has_axis(axis):
            raise self._err(ins, f"axis '{axis}' is not a mesh axis "
                                 f"{list(self.program.mesh.axes)} nor a sub-axis of one")
        if axis not in self.comms:
            raise self._err(ins, f"no communicator for sub-axis '{axis}' (pass one per entry of "
                                 f"the program's sub_axes with communicators=)")
        n = self.program.mesh.axis_size(axis)
        if kind not in ("all_reduce", "broadcast", "shift") and not 0 <= dim < len(sshape):
            raise self._err(ins, f"dim {dim} is out of range for rank-{len(sshape)} "
                                 f"src '{ins['src']}'")
        if kind in ("all_reduce", "broadcast", "shift"):
            expect = sshape
        elif kind == "all_to_all":
            concat = ins["concat_dim"]
            if sshape[dim] % n or not 0 <= concat < len(sshape) or concat == dim:
                raise self._err(ins, f"all_to_all: src '{ins['src']}' {list(sshape)} cannot be "
                                     f"split along dim {dim} over {n} ranks and concatenated "
                                     f"along dim {concat}")
            expect = list(sshape)
            expect[dim] //= n
            expect[concat] *= n
            expect = tuple(expect)
        elif kind == "all_gather":
            expect = sshape[:dim] + (sshape[dim] * n,) + sshape[dim + 1:]
        else:  # reduce_scatter
            if sshape[dim] % n:
                raise self._err(ins, f"reduce_scatter: src '{ins['src']}' dim {dim} "
                                     f"(size {sshape[dim]}) is not divisible by the "
                                     f"{n} ranks of axis '{axis}'")
            expect = sshape[:dim] + (sshape[dim] // n,) + sshape[dim + 1:]
        if dshape != expect:
            raise self._err(ins, f"{kind} over axis '{axis}' (size {n}, dim {dim}): "
                                 f"src '{ins['src']}' is {list(sshape)} so dst "
                                 f"'{ins['dst']}' must be {list(expect)}, got {list(dshape)}")

    def _check_return(self, ins: Instr, use, not_in_flight, meta) -> None:
        values, outputs = ins["values"], self._outputs
        if len(values) != len(outputs):
            raise self._err(ins, f"returns {len(values)} values but the program "
                                 f"declares {len(outputs)} outputs")
        for v, spec in zip(values, outputs):
            use(v, "buffer", ins, "returned value")
            not_in_flight(v, ins, "returns")
            if v != spec.value:
                raise self._err(ins, f"returns '{v}' where output '{spec.name}' "
                                     f"declares value '{spec.value}'")
            shape, dtype = meta[v]
            if (shape, dtype) != (spec.local_shape, spec.dtype):
                raise self._err(ins, f"output '{spec.name}' ('{v}') is {_fmt(shape, dtype)}, "
                                     f"declared {_fmt(spec.local_shape, spec.dtype)}")

    # ------------------------------------------------------------------
    # Execution
    # ------------------------------------------------------------------
    def check_inputs(self, local_inputs) -> None:
        specs = self.program.inputs
        if len(local_inputs) != len(specs):
            raise InputError(f"expected {len(specs)} inputs "
                             f"({', '.join(s.name for s in specs)}), got {len(local_inputs)}")
        for spec, arr in zip(specs, local_inputs):
            if not (hasattr(arr, "shape") and hasattr(arr, "dtype")):
                raise InputError(f"input '{spec.name}': expected an array of "
                                 f"{_fmt(spec.local_shape, spec.dtype)}, got {type(arr).__name__}")
            if tuple(arr.shape) != spec.local_shape:
                raise InputError(f"input '{spec.name}': expected local shape "
                                 f"{list(spec.local_shape)}, got {list(arr.shape)}")
            if np.dtype(arr.dtype) != spec.dtype and not self.engine.is_buffer(arr, spec.dtype):
                raise InputError(f"input '{spec.name}': expected dtype {spec.dtype.name}, "
                                 f"got {np.dtype(arr.dtype).name}")

    def _input_use(self) -> tuple[set, set]:
        """The inputs this rank's instructions use, and those they may write
        (a launch's outs, every argument of a launch that does not say; a
        collective's dst; a recv's buffer), a write to a reshape's view
        counting for the buffer it views. Computed once."""
        if getattr(self, "_inputs_used", None) is None:
            inputs = {spec.value for spec in self.program.inputs}
            root: dict = {}
            used, written, returned = set(), set(), set()
            for ins in self.instructions:
                f = ins.fields
                if ins.op == "launch":
                    args = f["args"]
                    used.update(args)
                    if ins.get("library") in ("reshape", "slice"):
                        # (A slice may become a view: its result counts as
                        # its input's memory; it writes no input either way.)
                        root[args[1]] = root.get(args[0], args[0])
                        continue
                    outs = f.get("outs", len(args))
                    written.update(root.get(a, a) for a in args[len(args) - outs:])
                elif ins.op == "collective_start":
                    used.update((f["src"], f["dst"], *f.get("counts", ())))
                    written.add(root.get(f["dst"], f["dst"]))
                elif ins.op in ("send", "recv"):
                    used.add(f["buffer"])
                    if ins.op == "recv":
                        written.add(root.get(f["buffer"], f["buffer"]))
                elif ins.op == "return":
                    used.update(f["values"])
                    returned.update((v, root.get(v, v)) for v in f["values"])
            self._inputs_used = (used & inputs, written & inputs)
            #: reshape / slice result -> the buffer whose memory it may view
            self._view_roots = root
            #: returned value -> the input it is (or views)
            self._returned_inputs = {v: r for v, r in returned if r in inputs}
        return self._inputs_used

    def _plan(self) -> list:
        """The instructions with launches resolved once into engine callables
        (a training step runs hundreds of launches; per-call lookups add up),
        (`_bind`)."""
        if getattr(self, "_prepared", None) is None:
            plan, symmetric = [], set()
            # Buffers are written once (by their producer), so a reshape can
            # be a view of its input instead of a copy, its buffer never
            # allocated; so can a slice that is one contiguous block of its
            # input (a microbatch's rows, a packed bucket's pieces) on an
            # engine launching by address (the CPU: no alignment to keep).
            views = {ins["args"][1]: None for ins in self.instructions
                     if ins.op == "launch" and ins.get("library") == "reshape"}
            if self.engine.by_address:
                views.update(self._slice_views())
            shapes: dict = {}
            for ins in self.instructions:
                if ins.op == "alloc" and ins["result"] in views:
                    shapes[ins["result"]] = tuple(ins["shape"])
                elif ins.op == "launch" and ins.get("library") in ("reshape", "slice") and \
                        ins["args"][-1] in views:
                    src, dst = ins["args"]
                    plan.append(("view", src, (dst, shapes[dst], views[dst]), ins))
                elif ins.op == "launch" and ins.get("library") in CHECKS:
                    plan.append(("check", None, tuple(ins["args"]), ins))
                    ins.fields.setdefault("profile_key", _profile_key(ins))
                elif ins.op == "launch":
                    plan.append(("call", None, tuple(ins["args"]), ins))
                    ins.fields.setdefault("profile_key", _profile_key(ins))
                elif ins.op == "alloc" and ins.get("symmetric"):
                    # Allocated (collectively) on the first run and kept: the
                    # engine hands back the same buffer for this instruction.
                    symmetric.add(ins["result"])
                    plan.append(("symmetric", ins["result"],
                                 (tuple(ins["shape"]), ins["dtype"], ins.index), ins))
                elif ins.op == "alloc":
                    plan.append(("alloc", ins["result"], (tuple(ins["shape"]), ins["dtype"]), ins))
                elif ins.op == "free" and ins["buffer"] in symmetric:
                    plan.append(("forget", ins["buffer"], None, ins))
                elif ins.op == "free":
                    plan.append(("free", ins["buffer"], None, ins))
                else:
                    plan.append((ins.op, None, None, ins))
            self._memory_plan = self._account(plan)
            self._prepared = self._bind(plan)
        return self._prepared

    def _slice_views(self) -> dict:
        """{slice result: (first element, its byte offset)} for the slices
        that are one contiguous block of a buffer (every dimension before the
        first cut one taken at extent 1, every one after it whole), except
        of a symmetric buffer (remote puts rewrite it every run) or of an
        input the program writes in place (a donated one)."""
        shape = {spec.value: (tuple(spec.local_shape), spec.dtype.itemsize)
                 for spec in self.program.inputs}
        symmetric = set(self._input_use()[1])       # (rewritten, as far as views go)
        root = self._view_roots
        out = {}
        for ins in self.instructions:
            if ins.op == "alloc":
                shape[ins["result"]] = (tuple(ins["shape"]), np.dtype(ins["dtype"]).itemsize)
                if ins.get("symmetric"):
                    symmetric.add(ins["result"])
            elif ins.op == "launch" and ins.get("library") in ("reshape", "slice"):
                src, dst = ins["args"]
                if ins["library"] == "reshape" or root[dst] in symmetric:
                    continue
                (full, itemsize), (part, _) = shape[src], shape[dst]
                start = _contiguous_block(full, part, ins["attrs"]["offsets"])
                if start is not None:
                    out[dst] = (start, start * itemsize)
        return out

    def _account(self, plan) -> dict:
        """The bytes this rank holds over a run (the same on every run): the
        inputs, each allocation until its free; a view keeps its input's
        allocation alive. What the compiler's memory plan predicts."""
        size = {spec.value: math.prod(spec.local_shape) * spec.dtype.itemsize
                for spec in self.program.inputs}
        live = peak = sum(size.values())
        for op, a, b, released in _lifetimes(plan):
            if op in ("alloc", "symmetric"):
                size[a] = math.prod(b[0]) * np.dtype(b[1]).itemsize
                live += size[a]
                peak = max(peak, live)
            elif released is not None:
                live -= size.pop(released)
        return {"peak_bytes": peak, "end_bytes": live}

    def _bind(self, plan) -> list:
        """Resolves each launch into an engine callable. An engine that
        launches by address (`Engine.by_address`) gets each buffer's address,
        taken once when the buffer is made, instead of the buffer: the CPU
        engine's launch is then one ctypes call (taking an address costs
        Python time, and a training step passes ~1,800 buffers to kernels)."""
        eng, meta = self.engine, self._meta
        bound = []
        for op, a, b, ins in plan:
            if op == "check":           # (a callable returning the check's flag)
                attrs, stream = self._with_block(ins["attrs"]), eng.stream(ins["stream"])
                direct = eng.prepare_library_by_address(
                    ins["library"], attrs, [meta[v] for v in b], stream) if eng.by_address else None
                if direct is not None:
                    a, op = direct, "check_at"          # (takes addresses)
                else:
                    a = eng.prepare_library(ins["library"], attrs, stream)
            elif op == "call":
                stream = eng.stream(ins["stream"])
                nbytes = sum(math.prod(meta[v][0]) * np.dtype(meta[v][1]).itemsize for v in b)
                direct = None
                if "library" in ins.fields:
                    attrs = self._with_block(ins["attrs"])
                    if eng.by_address:
                        direct = eng.prepare_library_by_address(ins["library"], attrs,
                                                                [meta[v] for v in b], stream)
                    if direct is not None:
                        a, op = direct, "launch"
                    else:
                        a = eng.prepare_library(ins["library"], attrs, stream, nbytes=nbytes)
                elif eng.by_address:
                    a = eng.prepare_launch(ins["kernel"], len(b), stream, nbytes=nbytes)
                    op = "launch"
                else:
                    a = eng.prepare_launch(ins["kernel"], len(b), stream)
            bound.append((op, a, b, ins))
        return bound

    def _with_block(self, attrs: dict) -> dict:
        """Library attributes naming mesh axes (`axis`, `row_axes`) get this
        rank's `block` = (index, count) over them: its coordinate along the
        axes, row-major, from the communicators' ranks; `dim_axes` (the
        axes splitting each dimension, comma-separated) get one per
        dimension, `blocks`."""
        if "dim_axes" in attrs:
            return {**attrs, "blocks": [self._block(a.split(",") if a else [])
                                        for a in attrs["dim_axes"]]}
        axes = [attrs["axis"]] if "axis" in attrs else attrs.get("row_axes")
        if not axes:
            return attrs
        return {**attrs, "block": self._block(axes)}

    def _block(self, axes: list) -> tuple:
        index, count = 0, 1
        for axis in axes:
            comm = self.comms[axis]
            index, count = index * comm.size + comm.rank, count * comm.size
        return index, count

    def run(self, local_inputs, device_outputs: bool = False, donate: bool = False) -> list:
        self.check_inputs(local_inputs)
        eng = self.engine
        rec = profiler.active()
        t_in = time.perf_counter() if rec is not None else 0.0
        values, taken, borrowed = {}, set(), set()
        used, written = self._input_use()
        for spec, arr in zip(self.program.inputs, local_inputs):
            if spec.value not in used:          # another pipeline stage's parameter
                continue
            if isinstance(arr, Absent):
                raise InputError(f"input '{spec.name}' is read on this rank, which does not "
                                 f"hold it: {arr.where}")
            # A donated buffer is used as it is, once: an array passed as two
            # inputs is copied the second time (the program may write either).
            # One the program only reads is borrowed (no copy) when it already
            # is the engine's buffer.
            if donate and id(arr) not in taken and eng.is_buffer(arr, spec.dtype):
                values[spec.value] = arr
                taken.add(id(arr))
            elif spec.value not in written and eng.is_buffer(arr, spec.dtype):
                values[spec.value] = arr
                borrowed.add(spec.value)
            else:
                values[spec.value] = eng.from_host(arr)
        with eng.run_scope():
            return self._execute(values, borrowed, device_outputs, rec, t_in)

    def _execute(self, values: dict, borrowed: set, device_outputs: bool, rec, t_in: float):
        """Runs this rank's instructions on the inputs in `values`."""
        eng = self.engine
        pending: dict = {}
        checks: list = []               # (flag, instruction) of the value checks that made one
        timing = _RunTiming(eng, self.program.entry, t_in, values.values()) \
            if rec is not None else None
        plan = self._plan()
        # Buffer -> its address, for engines launching by address (taken
        # once per buffer; a view has its buffer's).
        at = {v: eng.address(b) for v, b in values.items()} if eng.by_address else None
        if timing is None and eng.by_address and self.straight_line:
            run, ret = self._straight_line()
            try:
                arena = self._arenas.pop()      # (atomic: another thread may run too)
            except IndexError:
                arena = self._new_arena()
            try:
                values.update(run(values, at, pending, *arena, checks))
            finally:
                if pending:         # MPI may still write into the arena
                    self._abandoned.extend(pending.values())
                    self._abandoned.append(arena)
                else:
                    self._arenas.append(arena)
            return self._finish(ret, values, borrowed, device_outputs, None, None,
                                self._layout[2], checks)
        try:
            for op, a, b, ins in plan:
                if op == "launch":
                    if timing is None:
                        a([at[v] for v in b])
                    else:
                        stream = eng.stream(ins["stream"])
                        t0 = eng.timestamp(stream)
                        a([at[v] for v in b])
                        timing.launch(ins, t0, eng.timestamp(stream))
                elif op == "alloc":
                    values[a] = buffer = eng.alloc(*b)
                    if at is not None:
                        at[a] = eng.address(buffer)
                elif op == "free":
                    eng.free(values.pop(a))
                elif op == "call":
                    if timing is None:
                        a([values[v] for v in b])
                    else:
                        stream = eng.stream(ins["stream"])
                        t0 = eng.timestamp(stream)
                        a([values[v] for v in b])
                        timing.launch(ins, t0, eng.timestamp(stream))
                elif op == "check" or op == "check_at":
                    args = [values[v] for v in b] if op == "check" else [at[v] for v in b]
                    if timing is None:
                        flag = a(args)
                    else:
                        stream = eng.stream(ins["stream"])
                        t0 = eng.timestamp(stream)
                        flag = a(args)
                        timing.launch(ins, t0, eng.timestamp(stream))
                    if flag is not None:
                        checks.append((flag, ins))
                elif op == "view":
                    if b[2] is None:
                        values[b[0]] = eng.reshape_view(values[a], b[1])
                        if at is not None:
                            at[b[0]] = at[a]
                    else:
                        values[b[0]] = eng.flat_view(values[a], b[2][0], b[1])
                        at[b[0]] = at[a] + b[2][1]
                elif op == "symmetric":
                    values[a] = eng.alloc_symmetric(*b)
                    if at is not None:
                        at[a] = eng.address(values[a])
                elif op == "forget":
                    values.pop(a)
                elif op == "event_record":
                    values[ins["result"]] = eng.record_event(eng.stream(ins["stream"]))
                elif op == "event_wait":
                    eng.wait_event(values[ins["event"]], eng.stream(ins["stream"]))
                elif op == "collective_start" or op == "send" or op == "recv":
                    if timing is not None:
                        stream = eng.stream(ins["stream"])
                        t0, h0 = eng.timestamp(stream), time.perf_counter()
                    work = self._start_collective(ins, values) if op == "collective_start" \
                        else self._move(ins, values[ins["buffer"]])
                    pending[ins["result"]] = work
                    if timing is not None:
                        timing.start(ins, work, t0, time.perf_counter() - h0)
                elif op == "collective_wait":
                    work = pending.pop(ins["token"], None)
                    if work is not None:        # later waits (other streams): done
                        if timing is None:
                            work.wait()
                        else:
                            t0 = time.perf_counter()
                            work.wait()
                            timing.wait(ins, work, t0, time.perf_counter())
                elif op == "return":
                    # Verified statically; re-checked because returning with
                    # a collective in flight would hand out garbage.
                    if pending:
                        raise ScheduleError(f"collectives still in flight at return: {list(pending)}")
                    return self._finish(ins, values, borrowed, device_outputs, timing, rec,
                                        checks=checks)
        finally:
            if pending:
                self._abandoned.extend(pending.values())
        raise ScheduleError(f"{self._source}: no 'return' instruction")

    def _finish(self, ins, values: dict, borrowed: set, device_outputs: bool, timing, rec,
                arena_bytes: int = 0, checks=()):
        """The run's results, once its `return` instruction `ins` is reached;
        the error of the first value check (in program order) that failed
        instead, if one did (`checks`: the flags the run's checks made)."""
        if ins is None:
            raise ScheduleError(f"{self._source}: no 'return' instruction")
        eng = self.engine
        eng.synchronize()
        self.memory = dict(self._memory_plan, borrowed_bytes=sum(
            int(values[v].nbytes) for v in borrowed if v in values), arena_bytes=arena_bytes)
        if checks:
            for (_, check), (row, value) in zip(checks, eng.read_flags([f for f, _ in checks])):
                if row >= 0:
                    raise failed_check(check["attrs"], row, value, check.get("loc"))
        t_out = time.perf_counter()
        outputs = [values[v] if device_outputs else eng.to_host(values[v], spec.dtype)
                   for v, spec in zip(ins["values"], self._outputs)]
        # A result that is a borrowed input (or its view) is the caller's
        # array: hand out a copy, as when it was copied in.
        outputs = [eng.from_host(o) if self._returned_inputs.get(v) in borrowed
                   else o for v, o in zip(ins["values"], outputs)]
        if timing is not None:
            timing.finish(rec, t_out, outputs)
        for i, spec in self._elsewhere:
            axis, rank = spec.on
            outputs.insert(i, Absent(spec.local_shape, spec.dtype,
                                     f"result '{spec.name}' is held by the rank at {axis} = "
                                     f"{rank} only"))
        return outputs

    def _straight_line(self):
        """The plan as one generated Python function, for unprofiled runs on
        an engine launching by address (the CPU): every buffer and its
        address a local variable, every instruction one line, instead of the
        interpreting loop's dispatch and dictionaries (the loop's cost per
        instruction was most of the runtime share of a CPU step). Returns (fn, the return instruction): `fn(values, at,
        pending, B, A, checks)` takes the inputs (and their addresses) by value name
        and an arena's buffers and addresses (`_new_arena`),
        leaves started collectives' works in `pending` until their wait,
        appends each value check's flag (and instruction) to `checks`, and
        returns {returned value: buffer}. Built once per program; it runs
        the loop's operations, except that the buffers of `_arena_layout`
        are not allocated, viewed and freed but taken from the arena, and
        a synchronous engine's events are left out."""
        if getattr(self, "_fast_run", None) is not None:
            return self._fast_run
        eng = self.engine
        slots, views, _ = self._layout = self._arena_layout()
        in_arena = {**slots, **views}
        names: dict = {}
        const: dict = {"alloc": eng.alloc, "address": eng.address,
                       "reshape_view": eng.reshape_view, "flat_view": eng.flat_view,
                       "alloc_symmetric": eng.alloc_symmetric, "free": eng.free,
                       "record_event": eng.record_event, "wait_event": eng.wait_event,
                       "ScheduleError": ScheduleError}

        def var(value: str) -> str:
            if value not in names:
                names[value] = f"v{len(names)}"
            return names[value]

        def k(obj) -> str:
            key = f"k{len(const)}"
            const[key] = obj
            return key

        inputs = {spec.value for spec in self.program.inputs}
        lines, loaded = [], set()
        defined = set(inputs)           # values with a buffer (or event) at this point
        ret = None

        def use(value: str) -> str:
            """The local of `value`, loading an input (and its address) on first use."""
            name = var(value)
            if value in inputs and value not in loaded:
                loaded.add(value)
                lines.insert(0, f"    {name} = values.get({value!r}); "
                                f"a{name} = at.get({value!r})")
            return name
        for op, a, b, ins in self._plan():
            if (op == "alloc" and a in in_arena) or (op == "view" and b[0] in in_arena):
                defined.add(a if op == "alloc" else b[0])
                continue
            if op == "free" and a in in_arena:
                continue
            if op == "launch":
                lines.append(f"    {k(a)}(({''.join(f'a{use(v)}, ' for v in b)}))")
            elif op == "call":
                lines.append(f"    {k(a)}([{', '.join(use(v) for v in b)}])")
            elif op == "check":
                lines.append(f"    f = {k(a)}([{', '.join(use(v) for v in b)}])\n"
                             f"    if f is not None: checks.append((f, {k(ins)}))")
            elif op == "check_at":
                lines.append(f"    f = {k(a)}(({''.join(f'a{use(v)}, ' for v in b)}))\n"
                             f"    if f is not None: checks.append((f, {k(ins)}))")
            elif op == "alloc":
                n = var(a)
                defined.add(a)
                lines.append(f"    {n} = alloc({k(b[0])}, {k(b[1])}); a{n} = address({n})")
            elif op == "symmetric":
                n = var(a)
                defined.add(a)
                lines.append(f"    {n} = alloc_symmetric({k(b[0])}, {k(b[1])}, {b[2]}); "
                             f"a{n} = address({n})")
            elif op == "free":
                n = use(a)
                lines.append(f"    free({n}); {n} = None")
            elif op == "forget":
                n = use(a)
                lines.append(f"    {n} = None")
            elif op == "view":
                src, (dst, shape, flat) = use(a), b
                n = var(dst)
                defined.add(dst)
                if flat is None:
                    lines.append(f"    {n} = reshape_view({src}, {k(shape)}); a{n} = a{src}")
                else:
                    lines.append(f"    {n} = flat_view({src}, {flat[0]}, {k(shape)}); "
                                 f"a{n} = a{src} + {flat[1]}")
            elif op in ("event_record", "event_wait") and eng.synchronous:
                continue                # every launch has finished when it returns
            elif op == "event_record":
                defined.add(ins["result"])
                lines.append(f"    {var(ins['result'])} = record_event("
                             f"{k(eng.stream(ins['stream']))})")
            elif op == "event_wait":
                lines.append(f"    wait_event({use(ins['event'])}, {k(eng.stream(ins['stream']))})")
            elif op == "collective_start":
                # (a broadcast's src exists on its root only)
                reads = [v for v in (ins["dst"], ins["src"], *ins.get("counts", ()))
                         if v in defined]
                args = ", ".join(f"{v!r}: {use(v)}" for v in dict.fromkeys(reads))
                start = functools.partial(self._start_collective, ins)
                lines.append(f"    pending[{ins['result']!r}] = {k(start)}({{{args}}})")
            elif op in ("send", "recv"):
                move = functools.partial(self._move, ins)
                lines.append(f"    pending[{ins['result']!r}] = {k(move)}({use(ins['buffer'])})")
            elif op == "collective_wait":
                # (later waits of a token, on other streams: already done)
                lines.append(f"    w = pending.pop({ins['token']!r}, None)\n"
                             f"    if w is not None: w.wait()")
            elif op == "return":
                lines.append("    if pending: raise ScheduleError("
                             "f'collectives still in flight at return: {list(pending)}')")
                lines.append("    return {" + ", ".join(f"{v!r}: {use(v)}"
                                                      for v in ins["values"]) + "}")
                ret = ins
                break
            else:
                raise ScheduleError(f"{self._source}: instruction {op!r} has no straight-line "
                                    "form")
        else:
            lines.append("    return {}")
        self._arena_order = order = list(in_arena)
        if order:
            lines.insert(0, f"    ({''.join(f'{var(v)}, ' for v in order)}) = B\n"
                            f"    ({''.join(f'a{var(v)}, ' for v in order)}) = A")
        source = "def run(values, at, pending, B, A, checks):\n" + "\n".join(lines) + "\n"
        namespace = dict(const)
        exec(compile(source, f"<{self._source}: straight-line run>", "exec"), namespace)
        self._fast_run = (namespace["run"], ret)
        return self._fast_run

    def _arena_layout(self) -> tuple:
        """Where the straight-line run keeps its buffers: (slots, views,
        bytes). Every allocation of at most ARENA_MAX_BUFFER_BYTES but a
        returned value's (or that of the buffer a returned value may view)
        gets a fixed byte offset in one arena, where allocations whose
        lifetimes do not overlap share memory (first fit, 64-byte aligned;
        lifetimes as `_account` counts them). slots = {buffer: (offset,
        bytes, shape, dtype)}; views = {view of an arena buffer: (what it
        views, shape, flat)}, in plan order. Why: a CPU training step
        allocates ~400 buffers and takes their addresses in Python (~15% of
        a w128 dp x tp rank's step); an arena's are made once."""
        plan = self._plan()
        self._input_use()                   # (its _view_roots)
        returned = next(ins["values"] for op, _, _, ins in plan if op == "return")
        kept_out = set(returned) | {self._view_roots.get(v, v) for v in returned}
        slots, views = {}, {}
        holes: list = []            # [offset, bytes] free inside the arena, by offset
        end = 0

        def take(n: int) -> int:
            nonlocal end
            for hole in holes:
                if hole[1] >= n:
                    hole[0], hole[1] = hole[0] + n, hole[1] - n
                    if not hole[1]:
                        holes.remove(hole)
                    return hole[0] - n
            off = holes.pop()[0] if holes and sum(holes[-1]) == end else end
            end = off + n
            return off

        def give(off: int, n: int) -> None:
            holes.append([off, n])
            holes.sort()
            merged: list = []
            for hole in holes:
                if merged and sum(merged[-1]) == hole[0]:
                    merged[-1][1] += hole[1]
                else:
                    merged.append(hole)
            holes[:] = merged

        def padded(nbytes: int) -> int:
            return max(64, -(-nbytes // 64) * 64)
        for op, a, b, released in _lifetimes(plan):
            if op == "alloc" and a not in kept_out:
                nbytes = math.prod(b[0]) * np.dtype(b[1]).itemsize
                if nbytes <= ARENA_MAX_BUFFER_BYTES:
                    slots[a] = (take(padded(nbytes)), nbytes, b[0], b[1])
            elif op == "view" and (a in slots or a in views):
                views[b[0]] = (a, b[1], b[2])
            elif released in slots:
                give(slots[released][0], padded(slots[released][1]))
        return slots, views, end

    def _new_arena(self) -> tuple:
        """(buffers, addresses) of a fresh arena for the straight-line run:
        one allocation holding every buffer of `_arena_layout`, in
        `_arena_order`."""
        eng = self.engine
        slots, views, nbytes = self._layout
        arena = eng.alloc((nbytes + 64,), np.uint8)
        start = eng.address(arena)
        shift = -start % 64
        base = start + shift
        buf, at = {}, {}
        for v, (off, n, shape, dtype) in slots.items():
            buf[v] = eng.carve(arena, shift + off, n, shape, dtype)
            at[v] = base + off
        for v, (src, shape, flat) in views.items():
            if flat is None:
                buf[v], at[v] = eng.reshape_view(buf[src], shape), at[src]
            else:
                buf[v], at[v] = eng.flat_view(buf[src], flat[0], shape), at[src] + flat[1]
        return tuple(buf[v] for v in self._arena_order), tuple(at[v] for v in self._arena_order)

    def _move(self, ins: Instr, buffer):
        """Starts a send or recv of `buffer` (a work to wait on)."""
        comm = self.comms[ins["axis"]]
        move = comm.send if ins.op == "send" else comm.recv
        return move(buffer, ins["peer"], stream=self.engine.stream(ins["stream"]),
                    source=ins.get("loc"))

    def _start_collective(self, ins: Instr, values: dict):
        comm = self.comms[ins["axis"]]
        dst = values[ins["dst"]]
        src = values[ins["src"]] if self._reads_src(ins) else dst
        where = {"stream": self.engine.stream(ins["stream"]), "source": ins.get("loc")}
        kind = ins["collective"]
        if kind == "all_reduce":
            return comm.all_reduce(src, dst, ins["reduction"], ins["deterministic"], **where)
        if kind == "all_gather":
            return comm.all_gather(src, dst, ins["dim"], **where)
        if kind == "all_to_all":
            counts = ins.get("counts")
            return comm.all_to_all(src, dst, ins["dim"], ins["concat_dim"],
                                   counts=counts and tuple(values[c] for c in counts), **where)
        if kind == "broadcast":
            return comm.broadcast(src, dst, ins["root"], **where)
        if kind == "shift":
            return comm.shift(src, dst, ins["offset"], **where)
        return comm.reduce_scatter(src, dst, ins["dim"], ins["reduction"],
                                   ins["deterministic"], **where)


class _RunTiming:
    """One profiled run's timestamps, turned into the recorder's slices once
    the run has synchronized (a GPU engine's stamps are events until then)."""

    def __init__(self, engine, entry: str, t_in: float, inputs):
        self.engine, self.entry = engine, entry
        engine.begin_timestamps()
        # The inputs' copy onto the device (the run's first part; done once
        # begin_timestamps has synchronized).
        self.t_in, self.in_bytes = t_in, sum(int(v.nbytes) for v in inputs)
        self.t_run = time.perf_counter()
        self.launches: list = []        # (ins, stamp before, stamp after)
        self.started: dict = {}         # token -> (ins, work, stamp at start, host s starting)
        self.done: list = []            # started + (wait ins, host wait start, host wait end)

    def launch(self, ins: Instr, t0, t1) -> None:
        self.launches.append((ins, t0, t1))

    def start(self, ins: Instr, work, t0, host_seconds: float) -> None:
        self.started[ins["result"]] = (ins, work, t0, host_seconds)

    def wait(self, ins: Instr, work, t0: float, t1: float) -> None:
        self.done.append(self.started.pop(ins["token"]) + (ins, t0, t1))

    def finish(self, rec: profiler.Recorder, t_out: float, outputs) -> None:
        """The run's slices; `t_out`: when copying `outputs` to the host began."""
        # Every collective and transfer (MPI, and NCCL, whose wait blocks the
        # host too) completes in its wait: it spans its start stamp to the
        # wait's end on the host clock.
        stamps = iter(self.engine.resolve_timestamps(
            [t for _, t0, t1 in self.launches for t in (t0, t1)] + [d[2] for d in self.done]))
        for ins, _, _ in self.launches:
            name = ins.get("library") or ins["kernel"]
            rec.add(ins["stream"], name, "compute", next(stamps), next(stamps),
                    {"op": name, "key": ins["profile_key"], "source": ins.get("loc"),
                     "schedule_op": f"tsched.launch @{ins['kernel']}, instructions[{ins.index}]"})
        for ins, work, _, host_seconds, wait_ins, w0, w1 in self.done:
            t0 = next(stamps)
            entry = getattr(work, "entry", None)
            p2p = ins.op in ("send", "recv")
            kind = ins.op if p2p else ins["collective"]
            args = {"op": kind, "axis": ins["axis"], "source": ins.get("loc"),
                    "schedule_op": f"tsched.{ins.op}, instructions[{ins.index}]",
                    "start_seconds": host_seconds, "wait_seconds": w1 - w0}
            if entry is not None:
                args.update(bytes=entry.nbytes, seq=entry.seq)
            if p2p:
                args["peer"] = ins["peer"]
            rec.add(ins["stream"], f"{kind} {ins['axis']}", "p2p" if p2p else "comm", t0,
                    max(w1, t0), args)
            rec.add(wait_ins["stream"], f"wait {kind} {ins['axis']}", "wait", w0, w1,
                    {"op": kind, "axis": ins["axis"], "source": ins.get("loc"),
                     "schedule_op": f"tsched.collective_wait, instructions[{wait_ins.index}]"})
        t_end = time.perf_counter()
        # Host copies: arguments onto the device, results back (on a CPU
        # engine only the Python that hands them over).
        rec.add("host", "inputs to the device", "copy", self.t_in, self.t_run,
                {"bytes": self.in_bytes})
        rec.add("host", "outputs to the host", "copy", t_out, t_end,
                {"bytes": sum(int(o.nbytes) for o in outputs)})
        rec.add("host", self.entry, "run", self.t_in, t_end,
                {"schedule_op": f"func.func @{self.entry}"})
