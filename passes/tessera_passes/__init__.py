"""Tessera's compiler passes, one module per pass, registered lazily by flag.

Each pass is a Python function ``run(op, pass_, options)`` over the MLIR Python
bindings (``tessera_mlir``), where ``op`` is the operation the pass runs on (a
``builtin.module``), ``pass_`` is the ``ExternalPass`` used to signal failure
and ``options`` the ``TargetOptions`` it was given. A pass that rejects its
input emits an error diagnostic at the offending operation's location and
calls ``pass_.signal_pass_failure()``.

Pass modules import only the bottom layer (``tessera_compiler.ir``), the
generated bindings and this package's helpers (``sharding_rules``, ``tile``),
never another pass (``test/test_layers.py`` checks it).

The registry maps a flag (``tessera-partition``) to its module and a one-line
summary; the module is imported only when the pass is used (as in xDSL), so
``tessera-opt --help`` stays fast.
"""

from __future__ import annotations

import importlib
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Callable

from tessera_compiler.ir.options import DEFAULT, TargetOptions
from tessera_runtime import env

#: Set to print the Python traceback of a pass that raised (for developers).
TRACEBACK_ENV = "TESSERA_OPT_TRACEBACK"


@dataclass(frozen=True)
class PassInfo:
    flag: str
    module: str
    summary: str
    #: The TargetOptions fields the pass reads (its options, in tessera-opt
    #: as `flag{field-name=value}`).
    options: tuple[str, ...] = ()

    def load(self) -> Callable:
        """The pass' ``run(op, pass_)`` function."""
        return importlib.import_module(f"{__name__}.{self.module}").run

    @property
    def name(self) -> str:
        """`TesseraPartition` for `tessera-partition` (MLIR's pass-name style)."""
        return "".join(part[:1].upper() + part[1:] for part in re.split(r"[-_]", self.flag) if part)

    def add_to(self, pm, options: TargetOptions = DEFAULT) -> None:
        """Appends this pass, run with `options`, to a PassManager. A Python
        exception escaping the pass (a bug, not a user error) becomes an
        error diagnostic and a pass failure, never a traceback through MLIR."""
        run, flag = self.load(), self.flag

        def guarded(op, pass_):
            try:
                run(op, pass_, options)
            except Exception as err:  # noqa: BLE001 - reported as a diagnostic
                if env.flag(TRACEBACK_ENV):
                    sys.stderr.write(traceback.format_exc())
                op.location.emit_error(f"pass '{flag}' raised {type(err).__name__}: {err}")
                pass_.signal_pass_failure()

        guarded.__name__ = self.name
        pm.add(guarded, name=self.name, argument=flag, description=self.summary)


_PASSES = [
    PassInfo("tessera-autodiff", "autodiff",
             "Replace each tgraph.grad with the backward Graph IR (vector-Jacobian products in reverse order)"),
    PassInfo("tessera-propagate-sharding", "propagate_sharding",
             "Give every tgraph value a sharding, starting from argument and result shardings",
             ("context_parallel", "target")),
    PassInfo("tessera-partition", "partition",
             "SPMD-partition tgraph: per-rank local shapes, and the collectives the shardings imply",
             ("context_parallel", "target")),
    PassInfo("tessera-ring-attention", "ring_attention",
             "Expand each attention marked ring_axes into ring steps: key/value blocks passed around the axis by tgraph.ring_shift, partial results merged by log-sum-exp, the backward's dk/dv travelling with their blocks; causal attention striped over the ranks for balanced work"),
    PassInfo("tessera-bucket-collectives", "bucket_collectives",
             "Fuse all_reduces whose operands all exist before any result is used into one all_reduce of the concatenated values",
             ("bucket_elements",)),
    PassInfo("tessera-hierarchical-collectives", "hierarchical_collectives",
             "Split each all_reduce over an axis whose ranks span nodes into a reduce_scatter inside each node, an all_reduce across nodes and an all_gather inside each node (sub-axes \"dp:(m)L\", \"dp:(1)m\")",
             ("ranks_per_node", "hierarchical_collectives")),
    PassInfo("tessera-pipeline-schedule", "pipeline_schedule",
             "Make a pipelined step every pp rank's program: stage actions (F, B, W per microbatch) placed on ranks and ordered by the schedule (GPipe, 1F1B, interleaved, zero bubble), tgraph.transfer between stages, the epilogue (`then=`) on the ranks holding its operands, the results broadcast from their ranks in buckets (or kept there: `results = \"stage\"`)",
             ("bucket_elements",)),
    PassInfo("tessera-hoist-selects", "hoist_selects",
             "Move each select up to just after the last tileable op making or reading its operands (copying the reshapes, broadcasts and fills making its flag), when it is the last reader of one of them, so that it fuses into that kernel (CPU target)",
             ("target",)),
    PassInfo("tessera-lower-to-schedule", "lower_to_schedule",
             "Lower partitioned tgraph to tsched: buffers, kernel launches on a compute stream, async collectives on a comm stream; matmuls over rows (a 2-D weight) and contract_rows as 2-D GEMMs; NVSHMEM all_gathers fused into their matmul's kernel",
             ("target", "nvshmem_auto_max_bytes")),
    PassInfo("tessera-verify-schedule", "verify_schedule",
             "Run every rank's schedule symbolically: each send pairs with its recv in order, collectives are issued in one order on every rank of their axis, F precedes B precedes W, nothing deadlocks; check each library declaration against its routine's declaration (name, attributes, buffers, result rule)"),
    PassInfo("tessera-lower-to-tile", "lower_to_tile",
             "Lower tsched kernels to ttile kernels: fuse elementwise and row-reduction launches, tile them; flash-attention kernels for attention; NVSHMEM gathered GEMMs; library calls for matmul (CPU) and data movement",
             ("target", "target_blocks", "grouped_tile_order", "gemm_configs", "wgmma", "tma",
              "pingpong", "issue_ahead", "attention_forward_blocks",
              "attention_backward_blocks", "elementwise_tile_elements")),
    PassInfo("tessera-fold-transposes", "fold_transposes",
             "Erase each library transpose of the last two dimensions read only by matmuls on its stream: they read its input through a transpose_lhs / transpose_rhs declaration (BLAS transpose flags, no copy)"),
    PassInfo("tessera-merge-kernels", "merge_kernels",
             "Merge kernels (Tile IR kernels, library declarations) identical but for their names into one, and launch it instead of the others (a pipelined step's microbatches repeat every kernel)"),
    PassInfo("tessera-fold-slices", "fold_slices",
             "Erase a slice of one index of a dimension read only by kernels' strided loads (dims), and a concat of unit pieces written only by kernels' strided stores: the kernels read and write the whole buffer at that index (CPU target)",
             ("target",)),
    PassInfo("tessera-fuse-gemm-epilogues", "fuse_gemm_epilogues",
             "Run the kernel after a CPU matmul (bias + GELU, residual + layernorm) as its epilogue: each team member runs it on the rows its sgemm call just wrote, one launch instead of two (CPU target)",
             ("target",)),
    PassInfo("tessera-cpu-in-place", "cpu_in_place",
             "Decide which tiles of a CPU kernel are blocks of its buffers (ttile.in_place: a load read in place, a tile computed in the block its store writes) and which dots add into their accumulator's array (ttile.accumulate)"),
    PassInfo("tessera-cpu-fuse", "cpu_fuse",
             "Group each run of consecutive elementwise ops, fills, broadcasts and in-place loads over tiles of one size in a CPU kernel into one element loop (ttile.fused)"),
    PassInfo("tessera-gpu-software-pipeline", "gpu_software_pipeline",
             "Schedule each scf.for of a GPU kernel on tensor cores (#ttile.pipeline: GEMM main loop or registers, mma.sync or wgmma, cp.async or TMA ring, stages, lag, producer warpgroup, ping-pong, issuing ahead) and place a register loop's values",
             ("register_budget",)),
    PassInfo("tessera-gpu-place", "gpu_place",
             "Place every other tile value of a GPU kernel: registers in a pointwise region (ttile.region), a tensor-core fragment or shared memory; mark where fragments spill"),
    PassInfo("tessera-gpu-alloc-shared", "gpu_alloc_shared",
             "Give shared tiles, rings and mbarriers of a GPU kernel their byte offsets (ttile.smem, ttile.ring, ttile.barriers), reusing dead tiles' bytes (ttile.release), and the kernel its total (ttile.smem_bytes)"),
]

#: The passes that schedule Tile IR for the GPU, in order (the CUDA printer
#: reads what they decide).
GPU_SCHEDULE = ("tessera-gpu-software-pipeline", "tessera-gpu-place", "tessera-gpu-alloc-shared")
#: The passes that schedule Tile IR for the CPU, in order (the C++ printer
#: reads what they decide).
CPU_SCHEDULE = ("tessera-cpu-in-place", "tessera-cpu-fuse")

PASSES: dict[str, PassInfo] = {p.flag: p for p in _PASSES}


def get(flag: str) -> PassInfo:
    try:
        return PASSES[flag]
    except KeyError:
        known = ", ".join(sorted(PASSES))
        raise KeyError(f"unknown Tessera pass '{flag}' (known: {known})") from None
