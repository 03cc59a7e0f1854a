"""`op.matmul(x, w, transport=...)` over a tp mesh, where the matmul meets a
collective the partitioner inserts:

* gather: a sequence-parallel x (rows split) times a column-parallel w. With
  "nvshmem" (or "auto", on the GPU target) the all-gather of x happens
  inside the GEMM kernel, which puts this rank's rows into every peer's
  symmetric buffer and waits per tile for the rows it reads
  (passes/tessera_passes/tile/gathered_gemm.py).
* scatter: x split by columns times a row-parallel w, added to a residual
  split by rows (a sequence-parallel output). With "nvshmem" the
  reduce-scatter of the partial products happens inside the GEMM kernel,
  which pushes each partial tile to the rank owning its rows and sums what
  arrives for its own (passes/tessera_passes/tile/scattered_gemm.py).

Without a GPU the fused kernels run in the CUDA emulator with NVSHMEM
emulated across the ranks of an MPI job (a shared-memory symmetric heap,
atomic signal words): what that proves is the kernels' indexing, the
put/signal/wait protocols and the runtime plumbing (symmetric allocations,
signal reset and barrier per launch), against float64 numpy on fresh random
inputs. It says nothing about NVLink speed or GPU memory ordering."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import dist, op
from tessera.errors import CompileError

WORKERS = Path(__file__).resolve().parent / "workers"
pytest.importorskip("ml_dtypes")


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**31)


def _run(run_mpi, tmp_path, kind, m, k, n, dtype, transport, *extra, ranks=2):
    proc = run_mpi(ranks, WORKERS / "collective_gemm_worker.py", kind, _seed(), m, k, n, dtype,
                   transport, tmp_path, *extra,
                   env={"TESSERA_CUDA_EMULATE": "1", "TESSERA_EMULATOR_WAIT_S": "100"}, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp_path / f"result.rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("dtype, transport, tol", [("bf16", "nvshmem", 2e-2), ("f32", "auto", 1e-5)])
def test_gathered_gemm_runs_on_two_emulated_pes(run_mpi, tmp_path, dtype, transport, tol):
    """bf16 runs the tensor-core loop, f32 the CUDA-core one; "auto" on the
    GPU target picks NVSHMEM for a small operand. One fused launch, two
    symmetric buffers, no collective; both calls give the reference."""
    m, k, n = 128, 64, 64
    for r in _run(run_mpi, tmp_path, "gather", m, k, n, dtype, transport):
        assert r["max_err"] <= tol * r["scale"], r
        assert r["repeat_identical"], r
        assert r["y_shape"] == [m, n] and r["y_local"] == [m, n // 2], r
        assert r["fused_launches"] >= 1 and r["collectives"] == 0, r
        assert r["symmetric_allocs"] == 2, r


@pytest.mark.parametrize("dtype, tol", [("bf16", 3e-2), ("f32", 1e-5)])
def test_epilogue_runs_inside_the_gathered_gemm(run_mpi, tmp_path, dtype, tol):
    """gelu(x @ w) + r with an NVSHMEM gather: the GELU and the residual add
    run on the gathered GEMM's output tile in the same kernel (the only
    kernel of the program), at the tile's rotated rows, and match numpy."""
    m, k, n = 128, 64, 64
    for r in _run(run_mpi, tmp_path, "gather", m, k, n, dtype, "nvshmem", "epilogue"):
        assert r["max_err"] <= tol * r["scale"], r
        assert r["repeat_identical"], r
        assert r["epilogue_in_fused_gemm"] and r["kernels"] == 1, r
        assert r["symmetric_allocs"] == 2 and r["collectives"] == 0, r


def test_nccl_transport_is_a_collective_before_the_gemm(run_mpi, tmp_path):
    """transport="nccl": x is still gathered (not w), by the collective library."""
    m, k, n = 64, 32, 32
    for r in _run(run_mpi, tmp_path, "gather", m, k, n, "f32", "nccl"):
        assert r["max_err"] <= 1e-5 * r["scale"], r
        assert r["y_local"] == [m, n // 2], r
        assert r["fused_launches"] == 0 and r["collectives"] == 1, r


@pytest.mark.parametrize("ranks, dtype, transport, extra, tol", [
    (2, "bf16", "nvshmem", ("epilogue", "largest-tiles"), 2e-2),
    (4, "f32", "auto", (), 1e-5)])
def test_scattered_gemm_runs_on_emulated_pes(run_mpi, tmp_path, ranks, dtype, transport, extra,
                                             tol):
    """r + x @ w (then GELU, with `epilogue`) with the reduce-scatter in the
    GEMM: in bf16 on 2 PEs with 128x256 wgmma tiles (each instance computes
    its peer's tile, then its own), in f32 on 4 PEs ("auto" picks NVSHMEM on
    the GPU target), where each instance loops over 3 peers. One kernel (the
    residual add and GELU run on the summed tile), three symmetric buffers,
    no collective; both calls give the reference, bit for bit the same."""
    m, k, n = (256, 256, 256) if dtype == "bf16" else (128, 64, 32)
    for r in _run(run_mpi, tmp_path, "scatter", m, k, n, dtype, transport, *extra, ranks=ranks):
        assert r["max_err"] <= tol * r["scale"], r
        assert r["repeat_identical"], r
        assert r["y_shape"] == [m, n] and r["y_local"] == [m // ranks, n], r
        assert r["fused_launches"] >= 1 and r["collectives"] == 0, r
        assert r["epilogue_in_fused_gemm"] and r["kernels"] == 1, r
        assert r["symmetric_allocs"] == 3, r


def test_nccl_transport_is_a_reduce_scatter_after_the_gemm(run_mpi, tmp_path):
    """transport="nccl" on a row-parallel matmul: the collective library's
    reduce_scatter, then the residual add."""
    m, k, n = 64, 32, 32
    for r in _run(run_mpi, tmp_path, "scatter", m, k, n, "f32", "nccl"):
        assert r["max_err"] <= 1e-5 * r["scale"], r
        assert r["y_local"] == [m // 2, n], r
        assert r["fused_launches"] == 0 and r["collectives"] == 1, r


def test_moe_exchange_runs_over_nvshmem_on_two_emulated_pes(run_mpi, tmp_path):
    """op.moe over ep=2 on the GPU target (CUDA emulator), forward and
    gradients: with transport "nvshmem" the dispatch and combine (and their
    backward) are exchange kernels that put each piece into the peer's
    symmetric buffer, only the routed rows (each count read in the kernel),
    which the expert GEMMs then read there (no copy out),
    and every value equals the communicator's all-to-all ("nccl") bit for
    bit, unpacked and with pack_dtype "bf16" and "fp8_e4m3" (which round
    what travels: their values differ from the unpacked ones, FP8's by
    more), and with the design docs' multi_qp (4 copies per peer)."""
    out = tmp_path / "moe.json"
    proc = run_mpi(2, WORKERS / "moe_exchange_worker.py", _seed(), out,
                   env={"TESSERA_CUDA_EMULATE": "1", "TESSERA_EMULATOR_WAIT_S": "100"},
                   timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = json.loads(out.read_text())
    for name, r in cases.items():
        bound = 0.1 if "fp8" in name else 2e-2 if "bf16" in name else 1e-5
        assert r["y vs float64"] <= bound, (name, r)
        assert r["same bits as nccl"] and r["repeat identical"], (name, r)
        if "nvshmem" in name:
            # forward dispatch + combine and their backward: 4 or more
            # launches of the exchange kernels; only the tiny count
            # exchanges stay collectives.
            assert r["exchange launches"] >= 4 and r["exchange kernels"] >= 1, (name, r)
            assert r["ragged exchange kernels"] == r["exchange kernels"], (name, r)
            assert r["in-place exchange kernels"] == r["exchange kernels"], (name, r)
            assert r["symmetric allocs"] == 2 * r["exchange launches"], (name, r)
            # multi_qp: 4 copies (instances) per peer, each signalled on its own
            assert r["exchange grids"] == [2 * (4 if "multi_qp" in name else 1)], (name, r)
            nccl = cases[name.replace("nvshmem", "nccl").replace(" multi_qp", "")]
            assert r["all_to_all collectives"] == \
                nccl["all_to_all collectives"] - r["exchange launches"], (name, r, nccl)
        else:
            assert r["exchange launches"] == 0 and r["symmetric allocs"] == 0, (name, r)
    assert cases["nccl"]["grads vs nccl"] == 0.0
    assert 0.0 < cases["nccl bf16"]["grads vs nccl"] <= 2e-2
    assert cases["nccl bf16"]["y vs float64"] < cases["nccl fp8"]["y vs float64"]
    assert cases["nccl fp8"]["grads vs nccl"] <= 0.1


def _moe_on_two_ranks():
    """(an ep=2 mesh, x [16, 8], experts: a router [8, 4], w1 [4, 8, 12], w2
    [4, 12, 8]) on fresh random values, for tracing an MoE layer."""
    mesh = dist.Mesh(axes=["ep"], devices=range(2))
    rng = np.random.default_rng()
    x = rng.standard_normal((16, 8)).astype(np.float32)
    ex = {"router": rng.standard_normal((8, 4)).astype(np.float32),
          "w1": rng.standard_normal((4, 8, 12)).astype(np.float32),
          "w2": rng.standard_normal((4, 12, 8)).astype(np.float32)}
    return mesh, x, ex


def test_moe_nvshmem_on_the_cpu_target_uses_the_communicator():
    """The design docs' MoE call names NVSHMEM; on the CPU target (no NVSHMEM
    kernels) its exchanges are the communicator's all_to_alls, on the GPU
    target exchange kernels (put, signal, wait) with no row all_to_all left
    but the count exchange; what they receive is read where it arrived (no
    get: the result is the symmetric receive buffer)."""
    mesh, x, ex = _moe_on_two_ranks()

    def layer(x, ex):
        return op.moe(x, experts=ex, k=2, transport="nvshmem", mesh=mesh)
    cpu = ts.graph.trace(layer, x, ex, mesh=mesh, target="cpu")
    assert cpu.schedule.count("collective_start <all_to_all>") == 3
    assert "_exchange_" not in cpu.schedule
    gpu = ts.graph.trace(layer, x, ex, mesh=mesh, target="gpu")
    assert gpu.schedule.count("collective_start <all_to_all>") == 1     # the counts
    exchange = next(k for k in gpu.tile.split("ttile.kernel @")[1:] if "ttile.put" in k)
    for step in ("ttile.put", "ttile.quiet", "ttile.signal", "ttile.wait"):
        assert step in exchange, step
    assert "ttile.get" not in exchange
    assert "nvshmemx_putmem_nbi_block" in gpu.cuda
    # The collective report says how each exchange moves and why.
    exchanges = [c for c in gpu.collectives if c.op == "all_to_all" and c.transport]
    assert len(exchanges) == 2 and all(c.transport == "nvshmem: asked for" for c in exchanges)
    assert "[nccl: nvshmem asked for; the CPU target has no NVSHMEM kernels]" in cpu.report()


def test_moe_fp8_packing_moves_bytes_forward_and_bf16_backward():
    """pack_dtype="fp8_e4m3": the dispatch's rows travel as e4m3 (one byte
    each) beside one float32 scale per row; the combine and every backward
    exchange as bf16 (an unscaled gradient would vanish in e4m3), and no
    gradient is sent back for the scales."""
    mesh, x, ex = _moe_on_two_ranks()

    def step(x, ex):
        y = op.moe(x, experts=ex, k=2, transport={"type": "nccl", "pack_dtype": "fp8_e4m3"},
                   mesh=mesh)
        return ts.grad(op.sum(y), [x, ex])
    schedule = ts.graph.trace(step, x, ex, mesh=mesh).schedule
    # (source blocks -> received) types of every all_to_all: a forward one
    # sends [2, 16, .] blocks (16 rows to each rank), a backward one returns them.
    moved = sorted(" -> ".join(re.findall(r"memref<([^>]*)>", line.split(" : ")[-1]))
                   for line in schedule.splitlines() if "collective_start <all_to_all>" in line)
    forward = ["2x16x1xf32 -> 1x32x1xf32", "2x16x8xbf16 -> 1x32x8xbf16",
               "2x16x8xf8E4M3FN -> 1x32x8xf8E4M3FN", "2x2xi32 -> 1x4xi32"]
    backward = ["1x32x8xbf16 -> 2x16x8xbf16"] * 2
    # (Once each: the backward reads the forward's values, it does not
    # recompute its exchanges.)
    assert moved == sorted(forward + backward), moved


def test_moe_auto_transport_says_why_in_the_collective_report():
    """transport="auto" on the GPU target: NVSHMEM exchange kernels while
    their symmetric buffers fit `nvshmem_auto_max_bytes`, the communicator
    past it; the report names the sizes behind each choice."""
    mesh, x, ex = _moe_on_two_ranks()

    def layer(x, ex):
        return op.moe(x, experts=ex, k=2, transport="auto", mesh=mesh)
    fits = ts.graph.trace(layer, x, ex, mesh=mesh, target="gpu")
    # 8 tokens a rank, 2 choices each, 2 blocks of 16 rows of 8 floats received.
    assert "[nvshmem: auto: its symmetric buffers (1,024 B) fit nvshmem-auto-max-bytes " \
        "(268,435,456 B)]" in fits.report()
    assert "_exchange_" in fits.schedule
    small = ts.TargetOptions(target="gpu", nvshmem_auto_max_bytes=512)
    past = ts.graph.trace(layer, x, ex, mesh=mesh, target=small)
    assert "[nccl: auto: its symmetric buffers (1,024 B) exceed nvshmem-auto-max-bytes " \
        "(512 B)]" in past.report()
    assert "_exchange_" not in past.schedule


def _tp_operands():
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    rng = np.random.default_rng()
    x = dist.from_numpy(rng.standard_normal((32, 16)).astype(np.float32),
                        layout=dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh=mesh)
    w = dist.from_numpy(rng.standard_normal((16, 32)).astype(np.float32),
                        layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
    return x, w


def test_nvshmem_on_the_cpu_target_names_the_line():
    x, w = _tp_operands()

    def f(x, w):
        return op.matmul(x, w, transport="nvshmem")
    with pytest.raises(CompileError, match=r"test_nvshmem_transport.py:\d+: error: transport = "
                                           r"nvshmem needs the GPU target"):
        ts.graph.trace(f, x, w, target="cpu")


def test_nvshmem_without_a_collective_to_fuse_names_the_line():
    """x replicated times a column-parallel w needs no collective at all: an
    explicit "nvshmem" there is an error at the user's line, not a no-op
    ("auto" stays quiet)."""
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    rng = np.random.default_rng()
    x = dist.from_numpy(rng.standard_normal((32, 16)).astype(np.float32), mesh=mesh)
    w = dist.from_numpy(rng.standard_normal((16, 32)).astype(np.float32),
                        layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
    with pytest.raises(CompileError, match=r"test_nvshmem_transport.py:\d+: error: transport = "
                                           r"nvshmem: this matmul has no collective to fuse"):
        ts.graph.trace(lambda x, w: op.matmul(x, w, transport="nvshmem"), x, w, target="gpu")
    levels = ts.graph.trace(lambda x, w: op.matmul(x, w, transport="auto"), x, w, target="gpu")
    assert "collective_start" not in levels.schedule


def test_auto_on_the_cpu_target_is_a_collective():
    x, w = _tp_operands()
    levels = ts.graph.trace(lambda x, w: op.matmul(x, w, transport="auto"), x, w, target="cpu")
    assert "collective_start <all_gather>" in levels.schedule
    assert "gather_matmul" not in levels.schedule


def test_unknown_transport_is_rejected_with_the_line():
    x, w = _tp_operands()
    with pytest.raises(ValueError, match=r"transport must be one of \['auto', 'nccl', 'nvshmem'\], "
                                         r"got 'mpi'  \[.*test_nvshmem_transport.py:\d+\]"):
        ts.graph.trace(lambda x, w: op.matmul(x, w, transport="mpi"), x, w, target="cpu")


_PULL = """
ttile.kernel @pull(%src: memref<16x32xf32> {ttile.symmetric}, %dst: memref<8x16xf32>,
                   %twice: memref<8x16xf32>) attributes {grid = array<i64: 2>, block = array<i64: 64>} {
  %pid = ttile.program_id 0
  %me = ttile.my_pe
  %n = ttile.n_pes
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %next = arith.addi %me, %c1 : index
  %peer = arith.remui %next, %n : index
  %row = arith.muli %pid, %c4 : index
  %from = arith.addi %row, %c4 : index
  ttile.get %src[%from, %c8] on %peer to %dst[%row, %c0] {shape = array<i64: 4, 16>} : memref<16x32xf32> -> memref<8x16xf32>
  %t = ttile.load %dst[%row, %c0] : memref<8x16xf32> -> !ttile.tile<4x16xf32>
  %d = ttile.add %t, %t : !ttile.tile<4x16xf32>
  ttile.store %d, %twice[%row, %c0] : !ttile.tile<4x16xf32>, memref<8x16xf32>
  ttile.return
}
"""


def test_get_pulls_a_box_from_the_next_pe():
    """`ttile.get` on the CUDA emulator with two PEs sharing one symmetric
    heap (each kernel run attached as one PE): every block pulls its 4 rows
    of the box [4:12, 8:24] of the next PE's symmetric buffer, then reads
    them back at once (the get completes and synchronizes the block before
    the op after it): both outputs are the peer's data, not its own."""
    from tessera_mlir import ir
    from tessera_compiler.translate import ttile_to_cuda
    from tessera_runtime.engines.cuda_emulator import EmulatedKernels
    with ir.Context():
        source, launches = ttile_to_cuda(ir.Module.parse(_PULL))
    assert "nvshmemx_getmem_nbi_block(" in source
    cfg = launches["pull"]
    heap_bytes, pes = 1 << 16, 2
    heap = np.zeros(heap_bytes * pes, np.uint8)
    rng = np.random.default_rng()
    srcs = [np.ndarray((16, 32), np.float32, buffer=heap, offset=p * heap_bytes) for p in range(pes)]
    for s in srcs:
        s[...] = rng.standard_normal(s.shape)
    kernels = EmulatedKernels(source)
    for me in range(pes):
        kernels.attach_symmetric_heap(heap.ctypes.data, heap_bytes, me, pes)
        dst, twice = np.full((8, 16), np.nan, np.float32), np.zeros((8, 16), np.float32)
        kernels.launch("pull", [srcs[me], dst, twice], cfg["grid"], cfg["block"],
                       cfg["shared_bytes"])
        peer = srcs[(me + 1) % pes][4:12, 8:24]
        np.testing.assert_array_equal(dst, peer)
        np.testing.assert_array_equal(twice, 2 * peer)
