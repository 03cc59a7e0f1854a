"""The GPU schedule's attributes (TTile.td, "The GPU schedule"): what the
passes tessera-gpu-software-pipeline, tessera-gpu-place and tessera-gpu-alloc-shared
decide and the CUDA printer reads, as Python values.

    ttile.place     where each result lives (PlaceAttr, or an array: one per result)
    ttile.region    the pointwise region (one per-thread loop) of a pointwise op
    ttile.domain    on a region's first op: the shape its loop runs over
    ttile.spill     the fragments the op reads go to shared memory first
    ttile.release   tiles die before the op: a block barrier before their bytes are reused
    ttile.smem      byte offset of each result's shared tile (-1: none)
    ttile.pipeline  a loop's schedule on tensor cores (PipelineAttr)
    ttile.ring      byte offset of a pipelined loop's ring of slots
    ttile.barriers  byte offsets of its mbarrier arrays (full, then empty)
    ttile.shared_in the branches (mma_sync, wgmma) that copy an invariant A operand
                    of a register loop to shared memory
    ttile.fallback  why a loop or dot is not on tensor cores
    ttile.smem_bytes  dynamic shared memory of a kernel's block
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_mlir import ir
from tessera_mlir.dialects import ttile

from .ops import TILE_ELEMENTWISE
from .support import i64  # noqa: F401  (re-exported: the passes write gs.i64)

PLACE, REGION, SPILL, RELEASE = "ttile.place", "ttile.region", "ttile.spill", "ttile.release"
DOMAIN = "ttile.domain"
SMEM, PIPELINE, RING, BARRIERS = "ttile.smem", "ttile.pipeline", "ttile.ring", "ttile.barriers"
SHARED_IN, FALLBACK, SMEM_BYTES = "ttile.shared_in", "ttile.fallback", "ttile.smem_bytes"
#: Every schedule attribute (the passes set them; replanning removes them first).
ATTRIBUTES = (PLACE, REGION, DOMAIN, SPILL, RELEASE, SMEM, PIPELINE, RING, BARRIERS, SHARED_IN,
              FALLBACK, SMEM_BYTES)

#: Ops a pointwise region groups (one per-thread loop over their iteration
#: shape, values in registers).
POINTWISE = set(TILE_ELEMENTWISE) | {"ttile.fill", "ttile.iota", "ttile.broadcast",
                                     "ttile.load", "ttile.store", "ttile.dropout_factor"}
#: sm_90 allows up to 227 KB of shared memory per block (opt-in above 48 KB).
MAX_SHARED_BYTES = 227 * 1024
#: Shared-memory allocations are 16-byte aligned (cp.async's 16-byte copies).
ALIGN = 16


def aligned(nbytes: int, align: int = ALIGN) -> int:
    return -(-nbytes // align) * align


@dataclass(frozen=True)
class Pipeline:
    """A loop's schedule on tensor cores (#ttile.pipeline)."""
    kind: str                   # gemm | registers
    mma: str                    # mma_sync | wgmma
    copies: str                 # cp_async | tma
    stages: int
    lag: int = 0
    producer: bool = False
    pingpong: bool = False
    issue_ahead: bool = False

    @property
    def wgmma(self) -> bool:
        return self.mma == "wgmma"

    @property
    def tma(self) -> bool:
        return self.copies == "tma"

    def attr(self) -> ir.Attribute:
        return ttile.PipelineAttr.get(self.kind, self.mma, self.copies, self.stages, self.lag,
                                      self.producer, self.pingpong, self.issue_ahead)


def _defining(value: ir.Value) -> tuple[ir.Operation | None, int]:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None, -1
    return owner.operation, ir.OpResult(value).result_number


def _per_result(op: ir.Operation, name: str) -> list | None:
    if name not in op.attributes:
        return None
    a = op.attributes[name]
    if isinstance(a, ir.ArrayAttr):
        return list(a)
    if isinstance(a, ir.DenseI64ArrayAttr):
        return list(a)
    return [a]


def place(value: ir.Value) -> str | None:
    """Where `value` (an op's result) lives, or None (a block argument, or
    an op the passes did not place)."""
    op, i = _defining(value)
    places = _per_result(op, PLACE) if op is not None else None
    return ttile.PlaceAttr(places[i]).value if places else None


def set_places(op: ir.Operation, places: list[str]) -> None:
    attrs = [ttile.PlaceAttr.get(p) for p in places]
    op.attributes[PLACE] = attrs[0] if len(attrs) == 1 else ir.ArrayAttr.get(attrs)


def smem(value: ir.Value) -> int | None:
    """The byte offset of `value`'s shared tile, or None."""
    op, i = _defining(value)
    offsets = _per_result(op, SMEM) if op is not None else None
    if not offsets:
        return None
    offset = offsets[i] if isinstance(offsets[i], int) else ir.IntegerAttr(offsets[i]).value
    return None if offset < 0 else offset


def set_smem(value: ir.Value, offset: int) -> None:
    op, i = _defining(value)
    if len(op.results) == 1:
        op.attributes[SMEM] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), offset)
        return
    offsets = [o if isinstance(o, int) else ir.IntegerAttr(o).value
               for o in (_per_result(op, SMEM) or [])] or [-1] * len(op.results)
    offsets[i] = offset
    op.attributes[SMEM] = ir.DenseI64ArrayAttr.get(offsets)


def region(op: ir.Operation) -> int | None:
    return ir.IntegerAttr(op.attributes[REGION]).value if REGION in op.attributes else None


def flag(op: ir.Operation, name: str) -> bool:
    return name in op.attributes


def pipeline(loop: ir.Operation) -> Pipeline | None:
    if PIPELINE not in loop.attributes:
        return None
    p = ttile.PipelineAttr(loop.attributes[PIPELINE])
    return Pipeline(p.kind, p.mma, p.copies, p.stages, p.lag, p.producer, p.pingpong,
                    p.issue_ahead)


def integer(op: ir.Operation, name: str) -> int | None:
    return ir.IntegerAttr(op.attributes[name]).value if name in op.attributes else None


def barriers(loop: ir.Operation) -> list[int]:
    return list(ir.DenseI64ArrayAttr(loop.attributes[BARRIERS])) if BARRIERS in loop.attributes \
        else []


def shared_in(value: ir.Value) -> set[str]:
    """The branches (mma_sync, wgmma) that copy register-loop A operand
    `value` to shared memory."""
    op, _ = _defining(value)
    if op is None or SHARED_IN not in op.attributes:
        return set()
    return {ttile.MmaAttr(a).value for a in ir.ArrayAttr(op.attributes[SHARED_IN])}


def fallback(op: ir.Operation) -> str | None:
    return ir.StringAttr(op.attributes[FALLBACK]).value if FALLBACK in op.attributes else None


def planned(kernel: ir.Operation) -> bool:
    """Whether the passes have scheduled `kernel` for the GPU."""
    return SMEM_BYTES in kernel.attributes


def clear(kernel: ir.Operation) -> None:
    """Removes every schedule attribute from `kernel` and the ops in it."""
    def walk(op):
        for name in ATTRIBUTES:
            if name in op.attributes:
                del op.attributes[name]
        for r in op.regions:
            for b in r.blocks:
                for inner in b.operations:
                    walk(inner.operation)
    walk(kernel)


# -- facts the passes and the printer share --------------------------------------

#: Tensor-core operand types (m16n8k16 and wgmma), by element type name.
MMA_TYPES = {"bf16": "bf16", "f16": "f16"}


class ScheduleError(ValueError):
    """Tile IR that no GPU schedule can run (a user-facing error at `location`)."""

    def __init__(self, message: str, location: ir.Location | None = None):
        super().__init__(message)
        self.location = location


def tile_bytes(shape, element: str) -> int:
    """Bytes of a shared-memory tile: elements compute in float (bf16, f16
    and narrow integers too: 4 bytes), double or int64 (8) or bool (1)."""
    size = 1 if element == "i1" else (8 if element in ("f64", "i64") else 4)
    n = 1
    for d in shape:
        n *= d
    return n * size


@dataclass(frozen=True)
class GemmLoop:
    """An scf.for `acc = dot(load A, load B, acc)` starting from a fill: its
    tiles, warps and the ops the printer emits from."""
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    elt: str
    wgmma: bool              # the dot asks for wgmma
    tma: bool                # both loads ask for TMA
    iv: ir.Value
    load_a: ir.Operation
    load_b: ir.Operation
    dot: ir.Operation
    init: ir.Operation       # the accumulator's ttile.fill
    result: ir.Value
    bounds: list

    def ring(self, stages: int, wgmma: bool) -> tuple[int, int]:
        """(bytes, alignment) of its ring of `stages` A and B slots: mma.sync
        rows padded by 16 bytes (conflict-free ldmatrix); wgmma's 128-byte
        swizzled in 1024-byte atoms, which must start 1024-aligned (one
        region holds either branch's ring)."""
        mma_ring = stages * (self.bm * (self.bk + 8) + self.bk * (self.bn + 8)) * 2
        if not wgmma:
            return mma_ring, ALIGN
        return max(mma_ring, stages * (self.bm * self.bk + self.bk * self.bn) * 2), 1024


def match_gemm_loop(loop: ir.Operation) -> tuple[GemmLoop | None, str | None]:
    """(the loop's GemmLoop, None) when it is a GEMM main loop tensor cores
    can run, else (None, why not). Raises ScheduleError for loads asking for
    TMA, or a dot asking for wgmma, in ways no schedule honours."""
    from .analysis import multiple_of
    from .types import tile_of
    block = loop.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    iv, carried = block.arguments[0], list(block.arguments)[1:]
    if len(carried) != 1 or len(body) != 4:
        return None, "the loop is not acc = dot(load, load, acc)"
    loads, dot, yield_ = body[:2], body[2], body[3]
    if dot.name != "ttile.dot" or any(l.name != "ttile.load" for l in loads) \
            or yield_.operands[0] != dot.results[0] or dot.operands[2] != carried[0]:
        return None, "the loop is not acc = dot(load, load, acc)"
    if "warps" not in dot.attributes:
        return None, "the dot has no 'warps'"
    by_result = {l.results[0]: l for l in loads}
    if dot.operands[0] not in by_result or dot.operands[1] not in by_result:
        return None, "the dot's operands are not the loop's loads"
    load_a, load_b = by_result[dot.operands[0]], by_result[dot.operands[1]]
    wgmma = "wgmma" in dot.attributes
    tma = ["tma" in l.attributes for l in (load_a, load_b)]
    if any(tma) and not (all(tma) and wgmma):
        raise ScheduleError("ttile.load {tma} needs both operands of a wgmma dot loaded with tma",
                            dot.location)
    (bm, bk), elt = tile_of(dot.operands[0].type)
    (_, bn), _ = tile_of(dot.operands[1].type)
    _, acc_elt = tile_of(dot.results[0].type)
    wm, wn = list(ir.DenseI64ArrayAttr(dot.attributes["warps"]))
    if elt not in MMA_TYPES or acc_elt != "f32":
        return None, f"{elt} operands with an {acc_elt} accumulator (tensor cores: bf16/f16 into f32)"
    if (bm // wm) % 16 or (bn // wn) % 16 or bk % 16:
        return None, f"warp tile {bm // wm}x{bn // wn} or K step {bk} is not a multiple of 16"
    if wgmma and (bn % 64 or bk % 64):
        raise ScheduleError(f"'wgmma' on a GEMM main loop needs whole 128-byte swizzle atoms in "
                            f"its shared-memory tiles: N and K multiples of 64, not N = {bn}, "
                            f"K = {bk}", dot.location)
    init = loop.operands[3]
    init_op = init.owner
    if isinstance(init_op, ir.Block) or init_op.operation.name != "ttile.fill" or \
            len(list(init.uses)) != 1:
        return None, "the accumulator does not start from a ttile.fill"
    for load in (load_a, load_b):
        buf = list(load.operands)[0]
        shape = list(ir.MemRefType(buf.type).shape)
        offsets = list(load.operands)[1:]
        if shape[-1] % 8 or not multiple_of(offsets[-1], 8):
            return None, "a loaded tile is not 16-byte aligned (cp.async needs it)"
    return GemmLoop(bm, bn, bk, wm, wn, elt, wgmma, all(tma), iv, load_a, load_b, dot,
                    init_op.operation, loop.results[0], list(loop.operands)[:3]), None


def mbarrier_bytes(stages: int) -> int:
    """Bytes of one mbarrier per ring slot (8-byte aligned)."""
    return 8 * stages


def register_ring(loads: list[ir.Operation], shared_a: list[ir.Value], bm: int, stages: int,
                  wgmma: bool) -> tuple[list[tuple[int | None, int]], int]:
    """A register loop's ring in one branch: [(row pitch or None, elements
    per slot)] per staged load, and the bytes of the ring plus the copies of
    its shared A operands. mma.sync rows are padded by 16 bytes so
    ldmatrix's eight row addresses hit distinct banks; wgmma's are 128-byte
    swizzled (pitch None), in 1024-byte atoms."""
    from .types import tile_of
    layout, nbytes = [], 0
    for load in loads:
        rows, cols = tile_of(load.results[0].type)[0]
        ld = None if wgmma else cols + 8
        layout.append((ld, rows * (ld or cols)))
        nbytes += stages * layout[-1][1] * 2
    for a in shared_a:
        nbytes += bm * (tile_of(a.type)[0][1] + (0 if wgmma else 8)) * 2
    return layout, nbytes


def within(at: ir.Operation, loop: ir.Operation) -> bool:
    """Whether operation `at` is `loop` or nested in it."""
    while at is not None:
        if at == loop:
            return True
        at = at.parent.operation if at.parent is not None else None
    return False


def defined_inside(v: ir.Value, loop: ir.Operation) -> bool:
    owner = v.owner
    return within(owner.owner if isinstance(owner, ir.Block) else owner.operation, loop)


def loop_reads(loop: ir.Operation) -> list[ir.Value]:
    """Every value an scf.for reads: its initial values and its body's operands."""
    body = [o.operation for o in loop.regions[0].blocks[0].operations]
    return list(loop.operands)[3:] + [v for o in body for v in o.operands]


def register_loop_parts(loop: ir.Operation):
    """(staged loads in body order, the dots' loop-invariant A operands in
    order of first use) of a loop with its tiles in registers."""
    from .types import is_tile
    body = [o.operation for o in loop.regions[0].blocks[0].operations]
    loads = [o for o in body if o.name == "ttile.load" and place(o.results[0]) == "staged"]
    invariant = []
    for o in body:
        if o.name == "ttile.dot":
            a = o.operands[0]
            if is_tile(a.type) and not defined_inside(a, loop) and a not in invariant:
                invariant.append(a)
    return loads, invariant
