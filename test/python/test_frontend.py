"""The Python API in one process: meshes, ShardSpecs, DTensors, tracing, errors."""

import numpy as np
import pytest

import tessera as ts
from tessera import _primitives, dist, op
from tessera.errors import LaunchError, ShapeError, ShardingError


def test_mesh_topology_and_shapes():
    assert dist.Mesh(axes=["tp"], devices=range(2)).topology == "tp mesh, 2"
    square = dist.Mesh(axes=["tp", "dp"], devices=range(16))
    assert square.topology == "tp × dp mesh, 4 × 4"
    assert square.size == 16 and square.device_ids == list(range(16))
    nested = dist.Mesh(axes=["tp", "dp"], devices=[[0, 1, 2, 3], [4, 5, 6, 7]])
    assert nested.shape == {"tp": 2, "dp": 4}
    assert dist.Mesh(axes=["tp", "dp"], devices=[[0, 1], [2, 3]]).shape == {"tp": 2, "dp": 2}
    assert dist.Mesh(axes=["dp", "tp", "pp"], devices=range(48)).shape == {"dp": 4, "tp": 4, "pp": 3}


def test_mesh_rejects_bad_shapes():
    with pytest.raises(ValueError, match="needs 6 devices"):
        dist.Mesh(axes=["a", "b"], devices=range(4), shape=(2, 3))


def test_shardspec_maps_row_and_col_to_dimensions():
    mesh = dist.Mesh(axes=["tp", "dp"], devices=[[0, 1], [2, 3]])
    spec = dist.ShardSpec(partition=("row", "col"), mesh_axes=("tp", "dp"))
    assert spec.dims_for(2, mesh) == [("tp",), ("dp",)]
    assert spec.dims_for(3, mesh) == [(), ("tp",), ("dp",)]
    assert dist.ShardSpec().dims_for(2, mesh) == [(), ()]


@pytest.mark.parametrize("spec, message", [
    (dist.ShardSpec(partition=("col",), mesh_axes=("xx",)), "mesh axis 'xx' is not in the tp mesh"),
    (dist.ShardSpec(partition=("row", "col"), mesh_axes=("tp", "tp")), "mesh axis 'tp' is used twice"),
    (dist.ShardSpec(partition=("diag",), mesh_axes=("tp",)), "partition entry 'diag'"),
    (dist.ShardSpec(partition=(5,), mesh_axes=("tp",)), "names dimension 5, but the tensor has rank 2"),
])
def test_shardspec_errors_name_the_tensor(spec, message):
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    with pytest.raises(ShardingError, match=message) as err:
        W = dist.from_numpy(np.zeros((4, 4), np.float32), layout=spec, mesh=mesh)  # noqa: F841
    assert str(err.value).startswith("W:")


def test_row_of_a_vector_is_an_error_not_its_only_dimension():
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    with pytest.raises(ShardingError, match=r"^b: partition entry 'row' names the second-to-last "
                                            r"dimension, but the tensor has rank 1"):
        b = dist.from_numpy(np.zeros(4, np.float32), layout=dist.ShardSpec(("row",), ("tp",)),  # noqa: F841
                            mesh=mesh)
    spec = dist.ShardSpec(("col",), ("tp",))          # a vector's one dimension
    assert spec.dims_for(1, mesh) == [("tp",)]


def test_indivisible_dimension_names_tensor_dimension_axis_and_line():
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    with pytest.raises(ShardingError) as err:
        W1 = dist.from_numpy(np.zeros((16, 15), np.float32),  # noqa: F841
                             layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
    text = str(err.value)
    assert "W1: dimension 1 (size 15) is not divisible by mesh axis 'tp' (size 2)" in text
    assert "test_frontend.py:" in text


def test_dist_tensor_zeros_and_seeded_random():
    mesh = dist.Mesh(axes=["tp"], devices=range(1))
    z = dist.tensor((4, 6), layout=dist.ShardSpec(), mesh=mesh, dtype="f32", init="zeros")
    assert z.shape == (4, 6) and z.dtype == np.float32 and not z.numpy().any()
    a = dist.tensor((4, 6), mesh=mesh, init="random", seed=3)
    b = dist.tensor((4, 6), mesh=mesh, init="random", seed=3)
    c = dist.tensor((4, 6), mesh=mesh, init="random", seed=4)
    assert np.array_equal(a.numpy(), b.numpy()) and not np.array_equal(a.numpy(), c.numpy())
    assert a.numpy().std() > 0.5


def _mlp(x, w1, w2):
    return op.matmul(op.relu(op.matmul(x, w1)), w2)


def _tp_inputs(mesh, rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 16)).astype(np.float32)
    return (dist.from_numpy(x, mesh=mesh),
            dist.from_numpy(w1, dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh),
            dist.from_numpy(w2, dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh))


def test_graph_trace_returns_every_level_without_running():
    mesh = dist.Mesh(axes=["tp"], devices=range(2))      # 2 devices, 1 process: trace only
    trace = ts.graph.trace(_mlp, *_tp_inputs(mesh, np.random.default_rng()), mesh=mesh)
    assert "tgraph.matmul" in trace.graph and "tensor<16x32xf32>" in trace.graph
    assert trace.partitioned.count("tgraph.all_reduce") == 1
    assert "tensor<16x16xf32>" in trace.partitioned            # local shard of w1
    assert "tsched.collective_start <all_reduce>" in trace.schedule
    # CPU target: matmuls call BLAS, relu is a generated Tile IR kernel.
    assert 'tsched.library = "matmul"' in trace.tile
    assert "ttile.kernel @_mlp_relu_1" in trace.tile
    assert 'extern "C" void _mlp_relu_1' in trace.cpp
    assert trace.cuda == ""                                    # CPU target: no CUDA
    gpu = ts.graph.trace(_mlp, *_tp_inputs(mesh, np.random.default_rng()), mesh=mesh, target="gpu")
    assert "ttile.kernel @_mlp_matmul_0_fused2" in gpu.tile    # relu fused into the GEMM epilogue
    assert "__global__" in gpu.cuda and gpu.cpp == ""
    assert "// ===== _mlp: tile =====" in str(trace)


def test_calling_on_a_mesh_larger_than_the_job_explains_how_to_launch():
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    mlp = ts.compile(_mlp, mesh=mesh)
    with pytest.raises(LaunchError, match=r"tessera launch -n 2"):
        mlp(*_tp_inputs(mesh, np.random.default_rng()))


@pytest.mark.parametrize("shape", [(8, 16, 32), (5, 7, 3), (33, 65, 17), (64, 96, 40)])
def test_single_device_compile_matches_numpy(shape):
    """Runs the generated C++ kernels in-process (1-device mesh, no MPI)."""
    m, k, n = shape
    rng = np.random.default_rng()
    mesh = dist.Mesh(axes=["x"], devices=range(1))
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n, k)))
    b = rng.standard_normal((m, k)).astype(np.float32)

    @ts.compile(mesh=mesh)
    def block(x, w1, w2, b):
        return op.add(op.matmul(op.relu(op.matmul(x, w1)), w2), b)

    y = block(x, w1, w2, b).numpy()
    ref = np.maximum(x.astype(np.float64) @ w1, 0) @ w2 + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_numpy_results_are_fresh_and_share_no_memory():
    """A compiled function's numpy results are the run's own arrays (not
    copies), yet never the caller's memory, each other's, or an earlier
    call's: a value returned twice, its reshape, and an argument returned
    as it is all come back as separate arrays."""
    @ts.jit
    def f(x):
        y = op.tanh(x) * 2.0
        return y, y, y.reshape(-1), x

    rng = np.random.default_rng()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    first = f(x)
    second = f(x)
    arrays = [x, *first, *second]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)
    want = np.tanh(x.astype(np.float64)) * 2.0
    for got in (first[0], first[1], first[2].reshape(4, 8), second[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(first[3], x)


def test_disjoint_pieces_of_one_result_buffer_are_returned_uncopied():
    """Results that are disjoint row blocks of one buffer (what a pipeline's
    packed results are) come back as views of it, not copies; the caller's
    argument sliced and returned still comes back as a copy."""
    @ts.jit
    def f(x):
        y = op.tanh(x) * 2.0
        return y[:2], y[2:], x[1:3]

    x = np.random.default_rng().standard_normal((4, 8)).astype(np.float32)
    top, bottom, rows = f(x)
    want = np.tanh(x.astype(np.float64)) * 2.0
    np.testing.assert_allclose(np.concatenate([top, bottom]), want, rtol=1e-5, atol=1e-6)
    assert top.base is not None and top.base is bottom.base
    assert not np.shares_memory(top, bottom)
    np.testing.assert_array_equal(rows, x[1:3])
    assert not np.shares_memory(rows, x)


def test_op_shape_errors_name_op_shapes_and_line():
    mesh = dist.Mesh(axes=["x"], devices=range(1))

    @ts.compile(mesh=mesh)
    def bad(a, b):
        return op.matmul(a, b)

    with pytest.raises(ShapeError) as err:
        bad(np.zeros((4, 5), np.float32), np.zeros((6, 3), np.float32))
    text = str(err.value)
    assert "op.matmul: contraction dimensions differ: lhs [4, 5] has K = 5, rhs [6, 3] has K = 6" in text
    assert "test_frontend.py:" in text


def test_ops_outside_compile_run_eagerly_or_name_the_problem():
    """Outside a compiled function an op on arrays runs as a one-op compiled
    program (cached: the second call compiles nothing); on no tensor at all
    it says it needs one."""
    x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(op.relu(x), np.maximum(x, 0))
    np.testing.assert_allclose(op.matmul(x, x.T), x @ x.T, rtol=1e-5)
    programs = len(_primitives._EAGER["relu", None]._programs)
    op.relu(-x)
    assert len(_primitives._EAGER["relu", None]._programs) == programs
    with pytest.raises(ts.ArgumentError, match=r"op.relu: no operand is a tensor \(x=\[1.0, "
                                               r"2.0\]\).*test_frontend.py:\d+"):
        op.relu([1.0, 2.0])


def test_every_op_is_defined_eager_and_no_module_rewrites_its_globals():
    """Each op and model of `op` is an `@eager` function (its definition
    says so; nothing rewrites a module's globals() afterwards), the models
    too: `op.moe` with no tensor operand names the problem as the ops do."""
    import ast
    from pathlib import Path
    for name in op.__all__:
        fn = getattr(op, name)
        if name in ("kernel", "autodiff"):          # dist.spmd and ts.grad
            continue
        if name == "arange":        # no tensor operand: numpy's arange outside a trace
            assert isinstance(op.arange(3), np.ndarray)
            continue
        # (every wrapper `eager` makes runs its one inner function's code)
        assert fn.__code__ is _primitives.eager(len).__code__, f"op.{name} is not @eager"
    with pytest.raises(ts.ArgumentError, match="op.moe: no operand is a tensor"):
        op.moe("x", experts={})
    for path in Path(ts.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            assert not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
                        and getattr(node.value.func, "id", None) == "globals"), path


def test_save_writes_a_bundle(tmp_path):
    mesh = dist.Mesh(axes=["x"], devices=range(1))
    f = ts.compile(lambda a: op.relu(a), mesh=mesh)     # "<lambda>" must become a valid symbol
    with pytest.raises(RuntimeError, match="has not been called yet"):
        f.save(tmp_path / "f.tsb")
    f(np.ones((4, 4), np.float32))
    saved = f.save(tmp_path / "f.tsb")
    assert sorted(p.name for p in saved.iterdir()) == ["ir", "kernels", "manifest.json", "program.json"]
    assert 'extern "C" void lambda_relu_0' in (saved / "kernels" / "kernels.cpp").read_text()


def test_build_for_ranks_gives_every_ranks_blocks_from_one_process():
    """build_for_ranks() in one process, for a 2 x 2 mesh: the bundle, and
    each rank's blocks of each argument (dp splits rows, tp columns). A
    process holding only its own shard cannot give another rank's."""
    from tessera.errors import ShardingError
    mesh = dist.Mesh(axes=["dp", "tp"], devices=range(4), shape=[2, 2])
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    X = dist.from_numpy(x, dist.ShardSpec(partition=("row", "col"), mesh_axes=("dp", "tp")), mesh)
    B = dist.from_numpy(b, dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh)
    f = ts.compile(lambda x, b: op.relu(x + b), mesh=mesh)
    path, inputs = f.build_for_ranks(X, B)
    assert (path / "manifest.json").is_file()
    for rank, (xr, br) in enumerate(inputs):
        d, t = divmod(rank, 2)
        np.testing.assert_array_equal(xr, x[2 * d:2 * d + 2, 3 * t:3 * t + 3])
        np.testing.assert_array_equal(br, b[3 * t:3 * t + 3])
    own = dist.DTensor(x[:2, :3], x.shape, x.dtype, X.layout, mesh, name="shard")
    with pytest.raises(ShardingError, match="holds a shard, not the global value that rank 1's block"):
        own.block(1)


def test_build_compiles_without_running_for_a_runtime_elsewhere(tmp_path):
    """build() gives the bundle and the local inputs in program order (the
    captured constant last); the runtime alone runs them, and nothing ran
    in the compiler's process."""
    import tessera_runtime
    rng = np.random.default_rng()
    x, w, c = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8, 3), (3,)))
    f = ts.jit(lambda x, w: op.relu(op.matmul(x, w) + c))
    path, inputs = f.build(x, w)
    assert not f._programs
    assert [i.shape for i in inputs] == [(4, 8), (8, 3), (3,)]
    out = tessera_runtime.load_bundle(f.save(tmp_path / "f.tsb")).run(inputs)
    np.testing.assert_allclose(out[0], np.maximum(x.astype(np.float64) @ w + c, 0), rtol=1e-5,
                               atol=1e-5)


def test_a_call_keeps_no_reference_cycle_to_its_arguments_or_results():
    """A step's old parameters must be freed when the caller drops them, not
    at the cyclic GC's next run: recursive closures in pytree flattening did
    hold every argument in a cycle, and a training loop piled up a step's
    state per call (fresh heap to page-fault in every step)."""
    import gc
    import weakref

    @ts.jit
    def step(params, x):
        return {"w": params["w"] - 0.1 * op.matmul(x, params["w"])}, op.sum(x)

    rng = np.random.default_rng()
    params = {"w": rng.standard_normal((4, 4)).astype(np.float32)}
    x = rng.standard_normal((4, 4)).astype(np.float32)
    step(params, x)                                    # compile
    gc.collect()
    gc.disable()
    try:
        old_w = weakref.ref(params["w"])
        new, total = step(params, x)
        new_w, result = weakref.ref(new["w"]), weakref.ref(total)
        del params, new, total
        assert old_w() is None and new_w() is None and result() is None
    finally:
        gc.enable()
