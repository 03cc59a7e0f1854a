"""Compilation options: one frozen `TargetOptions` for every knob that
changes the code the compiler makes (target, GPU feature switches, GEMM
configurations, block targets, the mbarrier watchdog, ...).

`lowering.lower` takes one and hands it to every pass and emitter; the
bundle cache is keyed by `TargetOptions.digest()` together with the
compiler's code hash, so a new knob can never reuse a stale bundle. Each
pass declares which fields it reads (`tessera_passes.PassInfo.options`),
and `tessera-opt` accepts them as MLIR pass options with the same names in
kebab case:

    tessera-opt --pass-pipeline='builtin.module(tessera-lower-to-tile{target=gpu wgmma=false})'

Defaults are what the compiler does unless told otherwise; benchmarks and
tests build variants with `dataclasses.replace` (or `TargetOptions.with_`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields

from tessera_runtime.errors import ArgumentError, user_frame, where


class OptionError(ArgumentError):
    """A bad option: `ts.ArgumentError` (a TypeError and a ValueError), its
    message ending in the line that built the options (`ts.TargetOptions(
    target="tpu")` in a script). `reason` is the message without the line,
    which tessera-opt prints for a pass option given as text."""

    def __init__(self, reason: str):
        frame = user_frame()
        super().__init__(reason if frame is None else
                         f"{reason}  [{where(frame.f_code.co_filename, frame.f_lineno)}]")
        self.reason = reason


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) or type(x).__name__.startswith(
        ("int", "uint")) and hasattr(x, "dtype")


@dataclass(frozen=True)
class GemmConfig:
    """A GEMM kernel's tiling: a `bm x bn` output tile per block, K in `bk`
    steps; on tensor cores, `warps` (along M and N) split the tile and
    `stages` shared-memory buffers pipeline the operand loads, `wgmma`
    asks for Hopper's warpgroup MMA (each group of 4 warps owns 64 rows),
    and `tma` for its operands through the tensor memory accelerator
    (where they are kernel arguments; wgmma configurations only), issued
    by an extra `producer` warpgroup (`ttile.kernel {producer_warpgroup}`)
    while the `warps` only compute."""
    bm: int
    bn: int
    bk: int
    warps: tuple[int, int] | None = None     # None: CUDA cores
    stages: int | None = None
    wgmma: bool = False
    tma: bool = True
    producer: bool = True

    #: Threads of a block whose tiles are not split over warps.
    SIMT_THREADS = 128

    def __post_init__(self):
        for name in ("bm", "bn", "bk"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise OptionError(f"GemmConfig: {name}={value!r} must be a tile size (an int >= 1)")
        if self.warps is not None:
            if not isinstance(self.warps, (tuple, list)) or len(self.warps) != 2 or not all(
                    _is_int(w) and w >= 1 for w in self.warps):
                raise OptionError(f"GemmConfig: warps={self.warps!r} must be None (CUDA cores) or "
                                  f"(warps along M, warps along N), two ints >= 1")
            object.__setattr__(self, "warps", tuple(self.warps))
        if self.stages is not None and (not _is_int(self.stages) or self.stages < 1):
            raise OptionError(f"GemmConfig: stages={self.stages!r} must be None or a number of "
                              f"shared-memory buffers (an int >= 1)")
        for name in ("wgmma", "tma", "producer"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"GemmConfig: {name}={getattr(self, name)!r} must be True or "
                                  f"False")

    @property
    def threads(self) -> int:
        return self.warps[0] * self.warps[1] * 32 if self.warps else self.SIMT_THREADS

    def __str__(self) -> str:
        """`128x256x64:w8x1:s4:wgmma` (the `gemm-configs` option's form)."""
        parts = [f"{self.bm}x{self.bn}x{self.bk}"]
        if self.warps:
            parts.append(f"w{self.warps[0]}x{self.warps[1]}")
        if self.stages:
            parts.append(f"s{self.stages}")
        if self.wgmma:
            parts.append("wgmma")
        if not self.tma:
            parts.append("no-tma")
        if not self.producer:
            parts.append("no-producer")
        return ":".join(parts)

    @staticmethod
    def parse(text: str) -> "GemmConfig":
        """The inverse of `str()`: `BMxBNxBK[:wWMxWN][:sSTAGES][:wgmma][:no-tma][:no-producer]`."""
        head, *rest = text.strip().split(":")
        try:
            bm, bn, bk = (int(x) for x in head.split("x"))
            kwargs: dict = {}
            for part in rest:
                if part == "wgmma":
                    kwargs["wgmma"] = True
                elif part == "no-tma":
                    kwargs["tma"] = False
                elif part == "no-producer":
                    kwargs["producer"] = False
                elif part.startswith("w"):
                    wm, wn = (int(x) for x in part[1:].split("x"))
                    kwargs["warps"] = (wm, wn)
                elif part.startswith("s"):
                    kwargs["stages"] = int(part[1:])
                else:
                    raise ValueError(part)
        except ValueError:
            raise ValueError(f"GEMM configuration {text!r} is not "
                             "BMxBNxBK[:wWMxWN][:sSTAGES][:wgmma][:no-tma][:no-producer]") from None
        return GemmConfig(bm, bn, bk, **kwargs)


# wgmma with 2 warpgroups over 128 x 256 tiles and a 4-deep ring of 64-wide
# K steps (192 KB) is the Hopper shape; 128x128x32 on 8 warps with a 3-deep
# ring (57 KB) is the classic mma.sync shape; smaller ones fill the GPU when
# there are few output tiles.
TENSOR_CORE_CONFIGS = (GemmConfig(128, 256, 64, (8, 1), 4, wgmma=True),
                       GemmConfig(128, 128, 64, (8, 1), 4, wgmma=True),
                       GemmConfig(128, 128, 32, (2, 4), 3), GemmConfig(128, 64, 32, (2, 2), 3),
                       GemmConfig(64, 128, 32, (2, 2), 3), GemmConfig(64, 64, 32, (2, 2), 3),
                       GemmConfig(64, 32, 32, (2, 1), 3), GemmConfig(32, 32, 32, (2, 2), 2),
                       GemmConfig(16, 16, 16, (1, 1), 2))

#: Flash-attention block sizes on GPUs: head width -> (BM query rows per
#: instance, BN key rows per loop step), for the forward kernel and for the
#: backward's (`_dq` as they stand; `_dkdv` transposed). The forward carries
#: one accumulator where `_dkdv` carries two, so at D=128 it keeps 64 keys per
#: step (165 registers on sm_90a, 80.5 KB of shared memory: 2 blocks per SM):
#: every step rescales the whole [64, D] accumulator, which 32-key steps
#: would do twice as often for the same scores, and Q K^T is a wgmma of
#: N = 64. `_dkdv` at 64 x 64 would spill (104 bytes on sm_90a).
ATTENTION_FORWARD_BLOCKS = ((64, (64, 64)), (128, (64, 64)), (256, (16, 16)))
ATTENTION_BACKWARD_BLOCKS = ((64, (64, 64)), (128, (64, 32)), (256, (16, 16)))

TARGETS = ("cpu", "gpu")


def _parse_bool(text: str) -> bool:
    if text in ("true", "1", "on"):
        return True
    if text in ("false", "0", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true or false)")


def _parse_target(text: str) -> str:
    if text not in TARGETS:
        raise OptionError(f"unknown target {text!r}; choose one of {', '.join(TARGETS)}")
    return text


CONTEXT_PARALLEL = ("auto", "ring", "ulysses")


def _parse_context_parallel(text: str) -> str:
    if text not in CONTEXT_PARALLEL:
        raise OptionError(f"unknown context_parallel {text!r}; choose one of "
                          f"{', '.join(CONTEXT_PARALLEL)}")
    return text


def _parse_blocks(text: str) -> tuple:
    """`64:64x64,128:64x32` -> ((64, (64, 64)), (128, (64, 32)))."""
    out = []
    for item in text.split(","):
        try:
            width, blocks = item.split(":")
            bm, bn = (int(x) for x in blocks.split("x"))
            out.append((int(width), (bm, bn)))
        except ValueError:
            raise ValueError(f"attention blocks {item!r} are not WIDTH:BMxBN") from None
    return tuple(sorted(out))


def _format_blocks(blocks) -> str:
    return ",".join(f"{w}:{bm}x{bn}" for w, (bm, bn) in blocks)


def _parse_optional_float(text: str) -> float | None:
    return None if text in ("none", "") else float(text)


def _option(default, doc: str, parse, fmt=str):
    """A TargetOptions field: its default, what it does, how tessera-opt
    reads it from text and writes it back."""
    return field(default=default, metadata={"doc": doc, "parse": parse, "format": fmt})


@dataclass(frozen=True)
class TargetOptions:
    """Every knob that changes generated code. Frozen: a compiled program
    and its bundle are a function of the IR and one of these."""
    target: str | None = _option(
        None, "cpu or gpu; unset: the module's `tessera.target` attribute, and where it has "
        "none the pass's own default (lower-to-tile tiles for the GPU, lower-to-schedule "
        "fuses no NVSHMEM collective)", _parse_target)
    target_blocks: int = _option(
        132, "thread blocks a GEMM should fill before smaller tiles win (one per SM "
        "of an H100)", int)
    grouped_tile_order: bool = _option(
        True, "GEMM instances take output tiles in groups of tile rows (L2 reuse) "
        "instead of row-major order", _parse_bool)
    gemm_configs: tuple = _option(
        TENSOR_CORE_CONFIGS, "tensor-core GEMM configurations, preferred first "
        "(BMxBNxBK:wWMxWN:sSTAGES[:wgmma][:no-tma][:no-producer], comma-separated)",
        lambda text: tuple(GemmConfig.parse(t) for t in text.split(",")),
        lambda cfgs: ",".join(map(str, cfgs)))
    wgmma: bool = _option(
        True, "Hopper's warpgroup MMA where tiles allow it (GEMM configurations that "
        "ask for it, attention loops); false: mma.sync everywhere", _parse_bool)
    tma: bool = _option(
        True, "operands through the tensor memory accelerator where wgmma runs "
        "(false: cp.async rings)", _parse_bool)
    pingpong: bool = _option(
        False, "attention forward blocks of two warpgroups take turns at the tensor "
        "cores (FlashAttention-3's ping-pong)", _parse_bool)
    issue_ahead: bool = _option(
        False, "attention's wgmma forward loop issues the next step's scores under this "
        "step's softmax (needs TMA; a third ring stage)", _parse_bool)
    attention_forward_blocks: tuple = _option(
        ATTENTION_FORWARD_BLOCKS, "attention forward blocks by head width "
        "(WIDTH:BMxBN, comma-separated)", _parse_blocks, _format_blocks)
    attention_backward_blocks: tuple = _option(
        ATTENTION_BACKWARD_BLOCKS, "attention backward blocks by head width "
        "(WIDTH:BMxBN, comma-separated)", _parse_blocks, _format_blocks)
    nvshmem_auto_max_bytes: int = _option(
        256 << 20, "transport=auto uses NVSHMEM inside the GEMM when its symmetric "
        "buffers take at most this many bytes", int)
    register_budget: int = _option(
        160, "registers per thread a register loop's carried tiles and invariant A "
        "operands may take before the A operands move to shared memory", int)
    elementwise_tile_elements: int = _option(
        4096, "elements of a fused elementwise kernel's tile (its rows times its columns; "
        "a reduction's chunk too): the work of one instance", int)
    bucket_elements: int = _option(
        1 << 24, "largest fused all-reduce (tessera-bucket-collectives), in elements", int)
    ranks_per_node: int = _option(
        0, "world ranks per node, consecutive (0: one node). `tessera.compile` takes "
        "TESSERA_RANKS_PER_NODE; all-reduces over an axis whose ranks span nodes become "
        "hierarchical (tessera-hierarchical-collectives)", int)
    hierarchical_collectives: bool = _option(
        True, "with ranks-per-node set, all-reduces that span nodes run as a reduce-scatter "
        "inside each node, an all-reduce across nodes and an all-gather inside each node",
        _parse_bool)
    context_parallel: str = _option(
        "auto", "attention over a sequence split (context parallelism): ring (key/value "
        "blocks passed around the axis), ulysses (all-to-all: sequence for heads) or auto "
        "(whichever moves fewer bytes per rank; the ring where no head dimension takes "
        "the split)", _parse_context_parallel)
    wait_watchdog_s: float | None = _option(
        None, "seconds after which a thread waiting on an mbarrier traps (none: no "
        "check); bench/gpu_kit.py builds its checks with 5", _parse_optional_float,
        lambda v: "none" if v is None else repr(v))

    def __post_init__(self):
        if self.target is not None:
            _parse_target(self.target)
        _parse_context_parallel(self.context_parallel)
        for f in fields(self):
            value, kind = getattr(self, f.name), type(f.default)
            if kind is bool and not isinstance(value, bool):
                raise OptionError(f"TargetOptions: {f.name}={value!r} must be True or False")
            if kind is int and not _is_int(value):
                raise OptionError(f"TargetOptions: {f.name}={value!r} must be an int")
        for name in ("elementwise_tile_elements", "bucket_elements"):
            if getattr(self, name) < 1:
                raise OptionError(f"TargetOptions: {name} must be at least 1, got "
                                  f"{getattr(self, name)}")
        if self.ranks_per_node < 0:
            raise OptionError(f"TargetOptions: ranks_per_node must be 0 (one node) or more, got "
                              f"{self.ranks_per_node}")
        if self.wait_watchdog_s is not None and (isinstance(self.wait_watchdog_s, bool) or
                                                 not isinstance(self.wait_watchdog_s, (int, float))):
            raise OptionError(f"TargetOptions: wait_watchdog_s={self.wait_watchdog_s!r} must be "
                              f"a number of seconds or None")
        if isinstance(self.gemm_configs, (str, GemmConfig)) or not all(
                isinstance(c, GemmConfig) for c in self.gemm_configs):
            raise OptionError(f"TargetOptions: gemm_configs={self.gemm_configs!r:.80} must be a "
                              f"tuple of GemmConfigs (GemmConfig.parse reads the text form)")
        object.__setattr__(self, "gemm_configs", tuple(self.gemm_configs))
        for name in ("attention_forward_blocks", "attention_backward_blocks"):
            value = getattr(self, name)
            if isinstance(value, dict):
                value = value.items()
            try:
                blocks = tuple(sorted((int(w), (int(b[0]), int(b[1]))) for w, b in value))
            except (TypeError, ValueError, IndexError):
                raise OptionError(f"TargetOptions: {name}={getattr(self, name)!r:.80} must be "
                                  f"(head width, (BM, BN)) pairs") from None
            object.__setattr__(self, name, blocks)

    # -- identity ----------------------------------------------------------
    def as_json(self) -> dict:
        """Every field as JSON values (GEMM configurations in their text form)."""
        return {f.name: (getattr(self, f.name) if f.name not in FORMATTED
                         else f.metadata["format"](getattr(self, f.name)))
                for f in fields(self)}

    def digest(self) -> str:
        """A hex digest of every field, the same in every process (the bundle
        cache key's part for the options). Computed once: the options are
        frozen, and every call of a compiled function hashes them."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            text = json.dumps(self.as_json(), sort_keys=True)
            cached = hashlib.sha256(text.encode()).hexdigest()[:16]
            object.__setattr__(self, "_digest", cached)
        return cached

    def __hash__(self) -> int:
        # Stable across processes (str hashing is salted per process).
        return int(self.digest(), 16)

    def with_(self, **changes) -> "TargetOptions":
        return dataclasses.replace(self, **changes)

    # -- text (tessera-opt's pass options) -------------------------------------
    @staticmethod
    def option_name(field_name: str) -> str:
        return field_name.replace("_", "-")

    @classmethod
    def field_of(cls, option: str):
        """The dataclass field behind `--pass{option=...}` (kebab case), or None."""
        return OPTION_FIELDS.get(option)

    def with_text(self, values: dict[str, str]) -> "TargetOptions":
        """These options with `{option name: text}` applied (tessera-opt's
        `pass{name=value ...}`); ValueError names a bad one (text has no
        Python line to name)."""
        changes = {}
        for option, text in values.items():
            f = OPTION_FIELDS.get(option)
            if f is None:
                raise ValueError(f"unknown option '{option}'")
            try:
                changes[f.name] = f.metadata["parse"](text)
            except OptionError as err:
                raise ValueError(f"option '{option}': {err.reason}") from None
            except ValueError as err:
                raise ValueError(f"option '{option}': {err}") from None
        try:
            return dataclasses.replace(self, **changes)
        except OptionError as err:
            raise ValueError(err.reason) from None

    def option_text(self, field_name: str) -> str:
        f = next(f for f in fields(self) if f.name == field_name)
        value = getattr(self, field_name)
        if value is None:
            return "unset" if field_name == "target" else "none"
        if isinstance(value, bool):
            return "true" if value else "false"
        return f.metadata["format"](value)

    def resolved_target(self, module_op, default: str = "gpu") -> str:
        """`target`, else the module's `tessera.target` attribute, else
        `default` (tessera-lower-to-tile tiles for the GPU, and
        tessera-lower-to-schedule fuses no NVSHMEM collective, in a module
        that names no target)."""
        if self.target is not None:
            return self.target
        if "tessera.target" in module_op.attributes:
            # (Imported here: `tessera-opt --help` reads the options without MLIR.)
            from tessera_mlir import ir
            return ir.StringAttr(module_op.attributes["tessera.target"]).value
        return default


OPTION_FIELDS = {TargetOptions.option_name(f.name): f for f in fields(TargetOptions)}
FORMATTED = {"gemm_configs", "attention_forward_blocks", "attention_backward_blocks"}
DEFAULT = TargetOptions()
