"""What keeps a multi-rank program honest, and the design docs' forms of
making distributed tensors: programs that differ across ranks are caught
before any collective, the rank cannot be read inside a compiled function,
argument mutation is refused, strategies that split nothing are refused,
tensors are made (or sent) block by block, a function takes the mesh of the
DTensors it captures, and Python numbers can be data. Fresh seeds each run."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import dist, op
from tessera._rank_agreement import describe_mismatch, program_ops
from tessera.dist import counter_normal

WORKERS = Path(__file__).resolve().parent / "workers"


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**31)


def test_two_ranks_catch_differing_programs_and_move_only_blocks(run_mpi, tmp_path):
    seed = _seed()
    proc = run_mpi(2, WORKERS / "rank_programs_worker.py", seed, tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, seen in enumerate(ranks):
        # The issue's measured case (both ranks returned 18.0): an error on
        # every rank naming both programs' first differing op and its line.
        mixed = seen["mixed_sum"]
        assert mixed.startswith("CompileError: branchy_sum: the ranks traced 2 different "
                                "programs (program 1 on rank 0; program 2 on rank 1)"), mixed
        rank0, rank1 = [l for l in mixed.splitlines() if l.strip().startswith("rank ")]
        assert "tgraph.reduce <sum>" in rank0 and "rank_programs_worker.py:" in rank0
        assert "tgraph.fill 2.0" in rank1 and "bytes" in rank1
        # The training guide's ZeRO branch on the rank: refused while tracing.
        assert seen["zero_branch"].startswith("ShardingError: mesh.rank read at ")
        assert "while compiling zero_style" in seen["zero_branch"]
        assert seen["agreed_sum"] == 36.0
        # deterministic() inside the function marks the program.
        assert seen["det_inside_ir"] is True and seen["det_inside_value"] == 12.0
        # A captured DTensor's mesh (no mesh=): x @ W with W = arange(12).
        W = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(seen["captured_matmul"], np.ones((2, 3)) @ W)
    # Rank 0's array reaches the others block by block, exactly.
    source = np.array(ranks[0]["source"], np.float32)
    for r, seen in enumerate(ranks):
        np.testing.assert_array_equal(seen["scattered"], source[2 * r:2 * r + 2])
        np.testing.assert_array_equal(seen["sent"], source[:, 3 * r:3 * r + 3])
        np.testing.assert_array_equal(seen["broadcast"], source)
        np.testing.assert_array_equal(seen["moved"], source[2 * r:2 * r + 2])
        np.testing.assert_array_equal(seen["replicated"], source)
    # Eager: X @ W with W split by columns is split by columns; all_gather
    # makes it whole on both ranks.
    for seen in ranks:
        assert "layout=[-, tp]" in seen["eager_split"]
        np.testing.assert_allclose(seen["eager_gathered"], seen["eager_reference"], rtol=1e-5,
                                   atol=1e-5)
    # Per-rank arrays combined over dp: sum, concatenation, and each rank's
    # row block of the sum.
    products = [np.array(seen["local_product"]) for seen in ranks]
    for r, seen in enumerate(ranks):
        # (f32 sums of two ranks' values: atol for sums that nearly cancel)
        np.testing.assert_allclose(seen["local_sum"], products[0] + products[1], rtol=1e-6,
                                   atol=1e-6)
        np.testing.assert_array_equal(seen["local_gather"], np.concatenate(products, axis=1))
        np.testing.assert_allclose(seen["local_scatter"], (products[0] + products[1])[r:r + 1],
                                   rtol=1e-6, atol=1e-6)
        assert seen["pending_reduced"] == [[1.5, 1.5], [1.5, 1.5]]
        assert seen["reduced_kept"] is True
        # The default mesh is the one made last (tp), not the one a compiled
        # call ran on; calls that do not pair up are stopped, naming both.
        assert seen["local_default_mesh"].startswith(
            "ShardingError: dist.all_reduce: axis 'dp' is not in the tp mesh, 2 (the mesh "
            "made last, at test/python/workers/rank_programs_worker.py:"), \
            seen["local_default_mesh"]
        shapes = seen["eager_shapes_differ"]
        assert shapes.startswith("CollectiveMismatch: the ranks are at different "
                                 "collectives"), shapes
        assert "rank 0: dist.all_reduce over 'dp' (op='sum') of a float32 array [8] at " \
            in shapes and "rank 1: dist.all_reduce over 'dp' (op='sum') of a float32 array " \
            "[1] at " in shapes
        kinds = seen["eager_kinds_differ"]
        assert "rank 0: dist.all_reduce over 'dp'" in kinds and \
            "rank 1: dist.all_gather over 'dp' (dim=-1)" in kinds, kinds
    for case in ("eager_shapes_differ", "eager_kinds_differ"):
        assert ranks[0][case] == ranks[1][case]
    _check_issue_60(ranks)
    # The local view: per-rank code that differs by rank but pairs its
    # collectives; every collective; gradients; and per-rank code whose
    # collectives do not pair, caught.
    X8 = np.array(ranks[0]["X8"])
    for seen in ranks:
        np.testing.assert_allclose(seen["scaled_sum"], 2 * X8[:2] + 3 * X8[2:], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_array_equal(seen["spmd_coordinate"], [[0] * 3] * 2 + [[1] * 3] * 2)
        np.testing.assert_array_equal(seen["spmd_from_rank1"], X8[2:])
        np.testing.assert_allclose(seen["spmd_summed_block"], 2 * X8, rtol=1e-6)
        np.testing.assert_array_equal(seen["spmd_swapped"],
                                      [np.concatenate([X8[r], X8[2 + r]]) for r in range(2)])
        _check_local_view_gradients(seen, X8)
        mismatch = seen["mismatched"]
        # (found while tracing: the body reads the rank, so every rank's is traced)
        assert mismatch.startswith("CompileError: mismatched: collective #0 over 'dp' differs "
                                   "between ranks: rank "), mismatch
        assert "runs tgraph.all_reduce over 'dp' tensor<2x3xf32> (tgraph.all_reduce at " \
            in mismatch and "runs tgraph.all_gather over 'dp'" in mismatch
        assert "rank_programs_worker.py:" in mismatch and mismatch == ranks[0]["mismatched"]
    _check_point_to_point(ranks)
    # dist.tensor(init="random"): each rank's block of the same global value
    # one process makes for the whole tensor (mesh- and layout-independent).
    one = dist.Mesh(axes=["tp"], devices=range(1))
    whole = dist.tensor((6, 8), mesh=one, dtype="bf16", seed=seed % 1000).numpy()
    for r, seen in enumerate(ranks):
        assert seen["random_local_shape"] == [6, 4]
        np.testing.assert_array_equal(seen["random_block"],
                                      whole[:, 4 * r:4 * r + 4].astype(np.float32))


def _check_issue_60(ranks: list) -> None:
    """Arguments the ranks must pass alike, per-rank batches, traced
    comparisons and axes not in the mesh (the worker's last section)."""
    for seen in ranks:
        mismatch = seen["per_rank_array"]
        assert mismatch.startswith("InputMismatch: summed (called at test/python/workers/"
                                   "rank_programs_worker.py:"), mismatch
        assert "g is a numpy array, so it is a global value that every rank passes alike, " \
            "but it differs: rank 0 holds one value; rank 1 holds another" in mismatch
        assert "dist.from_local(x, axis='dp')" in mismatch and "Nothing ran." in mismatch
        assert seen["agreed_array"] == [3.0, 3.0]      # the global value, reduced already
        assert "<lambda> (called at " in seen["per_rank_dtensor"]
        assert "g is a DTensor replicated over 'dp', so its block must be the same" in \
            seen["per_rank_dtensor"], seen["per_rank_dtensor"]
        assert seen["per_rank_always"].startswith("InputMismatch: summed"), \
            seen["per_rank_always"]
        assert "batch.x is a numpy array" in seen["per_rank_batch"], seen["per_rank_batch"]
        assert seen["from_local_default_mesh"].startswith(
            "ShardingError: dist.from_local: axis 'dp' is not in the default mesh, tp mesh, 2 "
            "(the mesh made last, at "), seen["from_local_default_mesh"]
        assert seen["from_local_shapes_differ"].startswith(
            "ShardingError: dist.from_local(axis='dp'): the ranks' blocks differ in shape"), \
            seen["from_local_shapes_differ"]
        assert "(rank 0: float32 [1, 3]; rank 1: float32 [2, 3])" in \
            seen["from_local_shapes_differ"]
        assert seen["compares"] == [[0.0, 1.0, 0.0], [-1.0, 2.0, 3.0]]
        branch = seen["branch_on_axis_index"]
        assert branch.startswith("TracingError: bool() (an `if`, `while`, `and`, `or`, `not` "
                                 "or assert on it) of a traced tensor ([] bool)"), branch
        assert "ts.mesh.current().coords[axis]" in branch and "rank_programs_worker.py:" in branch
        assert seen["wrong_axis"].startswith("ShardingError: dist.all_reduce: axis 'tpp' is not "
                                             "in the mesh it is compiled for, the dp mesh, 2"), \
            seen["wrong_axis"]
    # Each rank's own batch: the global batch is both, in rank order.
    batches = np.concatenate([np.array(seen["my_batch"], np.float64) for seen in ranks])
    w = np.arange(3, dtype=np.float64).reshape(3, 1)
    for seen in ranks:
        np.testing.assert_allclose(seen["local_batch_loss"], (batches @ w).mean(), rtol=1e-5)
        assert seen["from_local"][0] == [8, 3]
        np.testing.assert_array_equal(np.array(seen["from_local"][1], np.float32),
                                      batches.astype(np.float32))
    X8 = np.array(ranks[0]["X8"], np.float64)
    want = X8[:2] + 10 * X8[2:]                       # rank 1's rows scaled, then summed
    for seen in ranks:
        np.testing.assert_allclose(seen["rank_one_scales"], want, rtol=1e-5, atol=1e-6)


def _check_point_to_point(ranks: list) -> None:
    """Sends and receives in per-rank code (see the worker): values moved
    exactly, recv_from's implied sends, and the programs that would mispair
    or hang stopped with the same error on every rank, naming the ops."""
    R = np.array(ranks[0]["R"], np.float32)
    # ring: rank r holds rows 2r:2r+2 and gets rank r-1's block, doubled, + 1
    np.testing.assert_array_equal(np.array(ranks[0]["ring"], np.float32),
                                  np.concatenate([R[2:], R[:2]]) * np.float32(2) + np.float32(1))
    params = {k: np.array(v, np.float32) for k, v in ranks[0]["params"].items()}
    grads = {k: np.array(v, np.float32) for k, v in ranks[0]["grads"].items()}
    for seen in ranks:
        # each parameter updated by its owner, the same bits on every rank
        for name in params:
            np.testing.assert_array_equal(
                np.array(seen["zero"][name], np.float32),
                params[name] - np.float32(0.5) * grads[name])
        w3 = params["wq"] * np.float32(3)
        np.testing.assert_array_equal(np.array(seen["used_before_known"]["w"], np.float32), w3)
        np.testing.assert_array_equal(np.array(seen["used_before_known"]["twice"], np.float32),
                                      w3 * np.float32(2))
    # Each process traced a plan of its own (rank 0 sending, and rank 1): the
    # ranks' agreement on every rank's sends and recvs stops it.
    differs = ranks[0]["owner_per_process"]
    assert "the ranks traced 2 different programs" in differs, differs
    assert "owner_per_process_local rank 0: send to 1 tensor<3x2xf32> (the send of result " \
        "'w' to rank 1" in differs
    assert "owner_per_process_local rank 0: recv from 1 tensor<3x2xf32> (tgraph.recv at " \
        in differs
    for case in ("never_sent", "both_wait", "wrong_shape", "unknown_name"):
        assert ranks[0][case] == ranks[1][case], case      # the same verdict everywhere
    assert ranks[0]["never_sent"].startswith(
        "CompileError: never_sent: the ranks would wait for each other forever: rank 1 waits "
        "at the end of never_sent for rank 0's send #0 to it (tgraph.recv at ")
    both = ranks[0]["both_wait"]
    assert "rank 0 waits at tgraph.mul at " in both and "rank 1 waits at tgraph.mul" in both
    assert "rank_programs_worker.py:" in both and both.endswith("nothing ran")
    assert "send #0 from rank 0 to rank 1 moves tensor<3x2xf32> (tgraph.send at " in \
        ranks[0]["wrong_shape"]
    assert "expects tensor<2x2xf32> (tgraph.recv at " in ranks[0]["wrong_shape"]
    assert "ts.distributed.recv_from(0, 'weights') on rank 1 at " in ranks[0]["unknown_name"]
    assert "nor returns one under that key (it returns w)" in ranks[0]["unknown_name"]


def test_redistribute_inside_a_compiled_function_pins_the_layout():
    """In the global view `dist.redistribute` is a layout constraint: the
    partitioner moves the value (here columns -> rows over tp: one
    all_to_all) and the result keeps the pinned layout."""
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    x = dist.from_numpy(np.ones((4, 6), np.float32), dist.ShardSpec(("col",), ("tp",)), mesh)
    rows = dist.ShardSpec((0,), ("tp",))
    trace = ts.graph.trace(lambda x: dist.redistribute(x * 2.0, rows), x)
    assert [c.op for c in trace.collectives] == ["all_to_all"]
    assert '-> (tensor<2x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>})' \
        in trace.partitioned


def _check_local_view_gradients(seen: dict, X: np.ndarray) -> None:
    """The worker's sum of four per-rank losses (see local_view_grads) and
    its gradients against central finite differences of the same loss in
    float64 numpy: sum((XW)^2) + 0.5 sum((XW)^2) + 2 sum(X^2) + sum(X^3)
    + 2 sum(W^2)."""
    W = np.array(seen["Wg"])

    def loss(x, w):
        y = x @ w
        return 1.5 * np.sum(y * y) + 2 * np.sum(x * x) + np.sum(x ** 3) + 2 * np.sum(w * w)

    def finite_differences(f, a, h=1e-6):
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            step = np.zeros_like(a)
            step[i] = h
            g[i] = (f(a + step) - f(a - step)) / (2 * h)
        return g
    np.testing.assert_allclose(seen["grad_loss"], loss(X, W), rtol=1e-5)
    np.testing.assert_allclose(seen["grad_x"], finite_differences(lambda x: loss(x, W), X),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(seen["grad_w"], finite_differences(lambda w: loss(X, w), W),
                               rtol=1e-4, atol=1e-4)


def test_a_mismatch_message_names_every_group_and_the_first_differing_op():
    programs = [["a", "b", "c"], ["a", "b", "c"], ["a", "x", "c"], ["a", "b"]]
    digests = [b"1", b"1", b"2", b"3"]
    text = describe_mismatch("step", digests, programs)
    assert "3 different programs (program 1 on ranks 0, 1; program 2 on rank 2; " \
           "program 3 on rank 3)" in text
    assert "op #1 of the program:\n    rank 0: b\n    rank 2: x" in text
    assert "op #2 of the program:\n    rank 0: c\n    rank 3: (program ends)" in text


def test_program_ops_list_each_op_with_its_bytes_and_line():
    def f(x):
        return op.sum(op.exp(x), dim=1)
    _, traced = ts.jit(f)._prepare_and_trace((np.zeros((4, 3), np.float32),), {})
    lines = program_ops(traced.module)
    exp = next(l for l in lines if "tgraph.exp" in l)
    assert "(48 bytes)" in exp and "test_rank_programs.py:" in exp


def test_dist_tensor_random_blocks_are_the_global_value_in_any_layout():
    seed = _seed()
    shape = (12, 10)
    whole = counter_normal(shape, (slice(0, 12), slice(0, 10)), seed, 1.0, np.float64)
    # Any block computed alone is the same numbers as in the whole.
    np.testing.assert_array_equal(
        counter_normal(shape, (slice(3, 7), slice(5, 10)), seed, 1.0, np.float64),
        whole[3:7, 5:10])
    # Chunked generation (rows at a time) gives the same bits.
    np.testing.assert_array_equal(
        counter_normal(shape, (slice(0, 12), slice(0, 10)), seed, 1.0, np.float64,
                       chunk_elements=7), whole)
    # Normal: mean 0, variance 1 over a large sample (5 sigma bounds).
    big = counter_normal((400, 500), (slice(0, 400), slice(0, 500)), seed, 1.0, np.float64)
    n = big.size
    assert abs(big.mean()) < 5 / np.sqrt(n) and abs(big.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(np.corrcoef(big.ravel()[:-1], big.ravel()[1:])[0, 1]) < 5 / np.sqrt(n)
    # Seeds differ; scale scales; dtype names are accepted.
    assert not np.array_equal(
        counter_normal(shape, (slice(0, 12), slice(0, 10)), seed + 1, 1.0, np.float64), whole)
    mesh = dist.Mesh(axes=["tp"], devices=range(1))
    for name, dtype in [("bf16", ts.bf16), ("fp16", np.float16), ("f32", np.float32),
                        (ts.bf16, ts.bf16), (np.float16, np.float16)]:
        t = dist.tensor(shape, mesh=mesh, dtype=name, seed=seed, scale=0.02)
        assert t.dtype == dtype
        np.testing.assert_allclose(t.numpy().astype(np.float64), 0.02 * whole,
                                   rtol=1e-2, atol=1e-4)
    zeros = dist.tensor(shape, mesh=mesh, init="zeros")
    assert zeros.dtype == np.float32 and not zeros.numpy().any()


def test_dist_tensor_builds_only_this_ranks_block():
    """The docs' (10_000_000, 4096) bf16 table on tp=4 costs each rank its
    shard: measured on a smaller one, a (4096, 4096) bf16 table split by rows
    over 4 ranks allocates its 8 MiB block and scratch proportional to the
    chunk it generates at a time, never the 32 MiB global array."""
    mesh = dist.Mesh(axes=["tp"], devices=range(4))
    layout = dist.ShardSpec(partition=("row",), mesh_axes=("tp",))
    shape = (4096, 4096)
    box = mesh.info.local_slices(shape, [("tp",), ()], 2)
    tracemalloc.start()
    block = counter_normal(shape, box, 3, 1.0, ts.bf16, chunk_elements=1 << 16)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert block.nbytes == 8 << 20
    # about 10 float64/uint64 temporaries of 64K elements: 5 MiB
    assert peak < block.nbytes + (6 << 20), f"peak {peak / 2**20:.1f} MiB"
    t = dist.tensor(shape, layout=layout, mesh=mesh, dtype="bf16", seed=3)
    assert t.nbytes == 8 << 20          # what a rank of the job holds


def test_mutating_an_argument_inside_a_compiled_function_is_an_error():
    @ts.jit
    def step(x, state):
        state["loss_scale"] = state["loss_scale"] * 0.5
        return op.sum(x)
    with pytest.raises(ts.CompileError) as err:
        step(np.ones((2, 2), np.float32), {"loss_scale": np.float32(1024.0)})
    text = str(err.value)
    assert "step changes its argument state['loss_scale'] in place" in text
    assert "test_rank_programs.py:" in text and "Return the new value" in text


def test_data_parallel_without_a_batch_argument_is_an_error_naming_the_arguments():
    @ts.jit
    @ts.distribute(strategy="data_parallel")
    def step(params, mbs):
        return op.sum(op.matmul(mbs, params))
    w, x = np.ones((3, 2), np.float32), np.ones((4, 3), np.float32)
    with pytest.raises(ts.ShardingError) as err:
        step(w, x)
    assert "found no batch to split over 'dp'" in str(err.value)
    assert "takes params, mbs" in str(err.value) and 'batch=("mbs",)' in str(err.value)

    @ts.jit
    @ts.distribute(strategy="data_parallel", batch=("mbs",))
    def named(params, mbs):
        return op.sum(op.matmul(mbs, params))
    assert float(named(w, x)) == 24.0
    text = dist.inspect(named)
    assert "mbs" in text and "dim 0 over dp" in text
    assert next(l for l in text.splitlines() if "params" in l).endswith("replicated")


def test_dynamic_arguments_compile_once_for_every_learning_rate():
    @ts.jit(dynamic=("lr",))
    def sgd(w, g, lr):
        return w - lr * g
    rng = np.random.default_rng(_seed())
    w, g = rng.standard_normal((3, 4), np.float32), rng.standard_normal((3, 4), np.float32)
    for lr in (0.1, 0.05, 1e-3, 2):
        # float64 reference; the kernel may fuse the multiply-add (one rounding)
        np.testing.assert_allclose(sgd(w, g, lr), w.astype(np.float64) - lr * g.astype(np.float64),
                                   rtol=1e-6, atol=1e-6)
    assert len(sgd._programs) == 1
    with pytest.raises(TypeError, match="dynamic= names \\['rate'\\]"):
        ts.jit(lambda w, lr: w, dynamic=("rate",))


def test_a_captured_dtensor_on_another_mesh_is_named():
    tp = dist.Mesh(axes=["tp"], devices=range(1))
    W = dist.from_numpy(np.ones((3, 4), np.float32), dist.ShardSpec(("col",), ("tp",)), tp)

    @ts.compile(mesh=dist.Mesh(axes=["dp"], devices=range(1)))
    def f(x):
        return op.matmul(x, W)
    with pytest.raises(ts.ShardingError) as err:
        f(np.ones((2, 3), np.float32))
    assert str(err.value).startswith("W (used at ")
    assert "is a DTensor on the tp mesh, 1, but f is compiled for the dp mesh, 1" in str(err.value)


@pytest.mark.parametrize("show", [False, True])
def test_compile_errors_show_the_ir_only_when_asked(show, monkeypatch):
    """A verifier error (a sharding naming an axis its mesh lacks, set after
    parsing as a buggy pass would) says what and where; the failing
    function's IR only with TESSERA_SHOW_IR=1."""
    from tessera_compiler.ir.context import new_context
    from tessera_compiler.lowering import CompileError, lower
    from tessera_mlir import ir
    if show:
        monkeypatch.setenv("TESSERA_SHOW_IR", "1")
    with new_context():
        module = ir.Module.parse(
            'tgraph.mesh @mesh axes = ["dp"] shape = [1]\n'
            'func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }')
        module.body.operations[1].attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(
            {"tgraph.sharding": ir.Attribute.parse('#tgraph.sharding<@mesh, [["tp"]]>')})])
        with pytest.raises(CompileError) as err:
            lower(module)
    text = str(err.value)
    assert "error: sharding of argument #0 splits dimension 0 over axis 'tp', which mesh " \
           "@mesh does not have" in text
    assert ("sym_name = \"f\"" in text) == show
    assert ("TESSERA_SHOW_IR=1 shows the IR" in text) == (not show)


def test_autocast_and_ts_tensor_work_inside_the_compiled_function():
    """`with ts.autocast(...)` written inside the function (not around the
    call) computes its matmul in bf16, and `ts.tensor` makes the training
    guide's loss-scale cap."""
    rng = np.random.default_rng(_seed())
    a, b = rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 4), np.float32)

    @ts.jit
    def f(a, b, scale):
        with ts.autocast(ts.bf16):
            y = op.matmul(a, b)
        return y, ts.minimum(scale * 2.0, ts.tensor(65536.0))
    y, capped = f(a, b, np.float32(40000.0))
    bf = (a.astype(ts.bf16).astype(np.float64) @ b.astype(ts.bf16).astype(np.float64))
    np.testing.assert_allclose(y.astype(np.float64), bf, rtol=1e-2, atol=1e-2)
    assert not np.allclose(y.astype(np.float64), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert float(capped) == 65536.0 and ts.tensor(1.5).dtype == np.float32


def test_collectives_in_the_global_view_keep_the_global_value():
    """In a global-view function all_reduce and all_gather return the value
    (the partitioner reduces and gathers where needed); reduce_scatter, which
    would change it, says where per-rank code goes."""
    @ts.jit
    def f(x):
        return dist.all_reduce(dist.all_gather(x * 2.0, axis="dp"), axis="dp")
    x = np.random.default_rng(_seed()).standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(f(x), x * 2)

    @ts.jit
    def g(x):
        return dist.reduce_scatter(x, axis="dp")
    with pytest.raises(ts.ShardingError) as err:
        g(np.ones(4, np.float32))
    assert "inside a compiled function: in the global view values are global" in str(err.value)
    assert "test_rank_programs.py:" in str(err.value)


def test_a_per_rank_result_that_differs_across_an_axis_needs_its_out_specs():
    """Without out_specs a result must be the same on every rank: one that
    still depends on a split input (no collective since) is an error saying
    how to lay its blocks out; with out_specs it is the blocks side by side."""
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    x = dist.from_numpy(np.ones((4, 3), np.float32), dist.ShardSpec((0,), ("dp",)), mesh)
    rows = dist.ShardSpec((0,), ("dp",))
    doubled = dist.spmd(lambda b: b * 2.0, mesh=mesh, in_specs=rows)
    with pytest.raises(ts.ShardingError) as err:
        ts.graph.trace(lambda x: doubled(x), x)
    assert "<lambda> result #0 differs across mesh axis 'dp'" in str(err.value)
    assert "dist.ShardSpec((0,), ('dp',))" in str(err.value)
    reduced = dist.spmd(lambda b: dist.all_reduce(op.sum(b * 2.0), axis="dp"), mesh=mesh,
                        in_specs=rows)
    trace = ts.graph.trace(lambda x: reduced(x), x)
    # The argument is already split by rows: the only collective is the
    # body's own all_reduce.
    assert [c.op for c in trace.collectives] == ["all_reduce"]
    laid = dist.spmd(lambda b: b * 2.0, mesh=mesh, in_specs=rows, out_specs=rows)
    assert '#tgraph.sharding<@mesh, [["dp"], []]>' in ts.graph.trace(lambda x: laid(x), x).graph


def test_per_rank_collectives_outside_per_rank_code_say_where_they_belong():
    with pytest.raises(ts.ShardingError, match="is for per-rank code"):
        dist.axis_index("dp")
    with pytest.raises(ts.ShardingError, match="dist.all_to_all .* is for per-rank code"):
        dist.all_to_all(np.ones((2, 2), np.float32), axis="dp", split_dim=0, concat_dim=1)
