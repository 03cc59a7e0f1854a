"""The frontend's multi-rank guarantees on 2 ranks, one job for all of them
(each case ends on every rank before the next starts, errors included):

- programs that differ across ranks stop with an error on every rank
  naming the ranks and the first differing op, before any collective;
- reading the rank inside a compiled function is a trace-time error;
- `dist.tensor(init="random")` blocks equal the single-process global value;
- `dist.from_numpy(src=0)`, `dist.scatter` and `dist.broadcast` move rank 0's
  array, blocks only; `DTensor.shard/.replicate` reshard it;
- a function takes the mesh of the DTensor it captures;
- `dist.deterministic()` inside a compiled function marks it deterministic;
- eager ops and collectives at top level (the docs' 3.2 and 7.4 snippets),
  on the default mesh, `with mesh:` or `mesh=`, and calls that do not pair up;
- the local view: rank-dependent per-rank code, every per-rank collective,
  gradients through per-rank code (the docs' per-rank snippets run in
  examples/design_docs); sends and receives, recv_from by name, and
  programs whose sends and receives would mispair or hang;
- arguments the ranks must pass alike (arrays, replicated DTensor blocks)
  checked; per-rank batches through `batch_is_local` and `dist.from_local`;
  traced comparisons (`==` on `dist.axis_index`); an axis not in the mesh.

Writes OUT/rank{r}.json with what each case saw.

    mpiexec -n 2 python rank_programs_worker.py SEED OUT
"""

import json
import sys
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import dist, op
from tessera_runtime import world

seed, out = int(sys.argv[1]), Path(sys.argv[2])
rank, size = world()
assert size == 2, "run with mpiexec -n 2"
report: dict = {}
rng = np.random.default_rng(seed)
mesh = dist.Mesh(axes=["dp"], devices=range(2))


def error_of(call) -> str:
    try:
        call()
    except ts.TesseraError as err:
        return f"{type(err).__name__}: {err}"
    return ""


# -- the measured case: a 4 x 3 array of ones split by rows, rank 0
# summing x, rank 1 summing 2x; both returned 18.0 before.
ones = dist.from_numpy(np.ones((4, 3), np.float32), dist.ShardSpec((0,), ("dp",)), mesh)
my_rank = rank        # the Python value a user would close over


@ts.compile(mesh=mesh)
def branchy_sum(x):
    return op.sum(x) if my_rank == 0 else op.sum(x * 2.0)


report["mixed_sum"] = error_of(lambda: branchy_sum(ones))


# -- the training guide's ZeRO step reads the rank inside the function.
@ts.function
@ts.distribute(strategy="data_parallel")
def zero_style(batch):
    if ts.mesh.current().rank == 0:
        return op.sum(batch)
    return op.sum(batch * 2.0)


report["zero_branch"] = error_of(lambda: zero_style(np.ones((4, 3), np.float32)))

# -- the same program on both ranks still runs (the check costs nothing more).
report["agreed_sum"] = float(ts.compile(lambda x: op.sum(x * 3.0), mesh=mesh)(ones).item())

# -- distributed tensors made where they live.
made = dist.tensor((6, 8), layout=dist.ShardSpec(partition=("col",), mesh_axes=("dp",)), mesh=mesh, dtype="bf16", seed=seed % 1000)
report["random_block"] = np.asarray(made.local(), np.float32).tolist()
report["random_local_shape"] = list(made.local().shape)

source = rng.standard_normal((4, 6)).astype(np.float32) if rank == 0 else None
scattered = dist.scatter(source, dist.ShardSpec((0,), ("dp",)), mesh, src=0)
sent = dist.from_numpy(source, dist.ShardSpec(("col",), ("dp",)), mesh, src=0)
everywhere = dist.broadcast(source, mesh=mesh, src=0)
report["scattered"] = scattered.local().tolist()
report["sent"] = sent.local().tolist()
report["broadcast"] = everywhere.local().tolist()
report["source"] = source.tolist() if rank == 0 else None
# Reshards: columns -> rows is one all_to_all; replicate gathers.
report["moved"] = sent.shard(0, "dp").local().tolist()
report["replicated"] = sent.replicate().local().tolist()

# -- a mesh taken from a captured DTensor (no mesh=, no DTensor argument).
W = dist.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4),
                    dist.ShardSpec(("col",), ("dp",)), mesh)


@ts.jit
def uses_captured(x):
    return op.matmul(x, W)


result = uses_captured(np.ones((2, 3), np.float32))
report["captured_matmul"] = np.asarray(result).tolist()

# -- deterministic() written inside the compiled function.


@ts.compile(mesh=mesh)
def det_inside(x):
    with dist.deterministic(reduce_tree="binary"):
        return op.sum(x)


report["det_inside_ir"] = "tgraph.deterministic" in det_inside.lower(ones).graph
report["det_inside_value"] = float(det_inside(ones).item())

# -- eager ops and collectives, as the design docs write them at top level.
# Collectives guide 3.2: a column-split weight, an eager matmul, an all_gather.
tp = dist.Mesh(axes=["tp"], devices=range(2))
X = np.random.default_rng(seed + 99).standard_normal((3, 4)).astype(np.float32)  # same on all
Wt = dist.tensor((4, 8), layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)),
                 mesh=tp, seed=seed % 997)
Y = op.matmul(X, Wt)
report["eager_split"] = repr(Y)
Y = dist.all_gather(Y, axis="tp")
report["eager_gathered"] = np.asarray(Y.local(), np.float64).tolist()
report["eager_reference"] = (X.astype(np.float64) @ Wt.numpy().astype(np.float64)).tolist()
# Performance guide 7.4: per-rank arrays, an eager matmul, an all_reduce over dp.
mine = np.random.default_rng(seed + 1 + rank)
W_local = mine.standard_normal((2, 3)).astype(np.float32)
X_local = mine.standard_normal((3, 2)).astype(np.float32)
Y_local = op.matmul(W_local, X_local)
report["local_product"] = Y_local.tolist()
# `tp` is the mesh made last, so the default mesh: it has no 'dp'.
report["local_default_mesh"] = error_of(lambda: dist.all_reduce(Y_local, axis="dp"))
with mesh:                          # the dp mesh, for the collectives inside
    report["local_sum"] = dist.all_reduce(Y_local, axis="dp").tolist()
    report["local_gather"] = ts.distributed.all_gather(Y_local, axis="dp", dim=1).tolist()
report["local_scatter"] = dist.reduce_scatter(Y_local, axis="dp", dim=0, mesh=mesh).tolist()
# Calls that do not pair up: stopped on every rank before any data moves.
with mesh:
    report["eager_shapes_differ"] = error_of(
        lambda: dist.all_reduce(np.ones(8 if rank == 0 else 1, np.float32), axis="dp"))
    report["eager_kinds_differ"] = error_of(
        lambda: dist.all_reduce(Y_local, axis="dp") if rank == 0 else
        dist.all_gather(Y_local, axis="dp"))
# A pending sum reduced (from_numpy holds 1.5 as a pending sum: rank 0 has
# it, rank 1 zeros, so the sum is 1.5); a reduced value passed through
# (ts.grad's gradients).
pending = dist.from_numpy(np.full((2, 2), 1.5, np.float32), dist.ShardSpec(partial=("dp",)),
                          mesh)
report["pending_reduced"] = dist.all_reduce(pending, axis="dp").local().tolist()
report["reduced_kept"] = dist.allreduce({"g": everywhere}, axis="dp")["g"] is everywhere

# -- the local view: per-rank code with explicit collectives (the tutorial's
# dp_step runs in examples/design_docs). x split by rows over dp.
X8 = np.random.default_rng(seed + 5).standard_normal((4, 3)).astype(np.float32)
x_rows = dist.from_numpy(X8, dist.ShardSpec((0,), ("dp",)), mesh)
report["X8"] = X8.tolist()


# Per-rank programs may differ (here by a factor) as long as their
# collectives pair up; different collectives are an error naming them.
@dist.spmd(mesh=mesh, in_specs=dist.ShardSpec((0,), ("dp",)))
def scaled_sum(x):
    factor = 2.0 if ts.mesh.current().rank == 0 else 3.0
    return dist.all_reduce(x * factor, axis="dp")


report["scaled_sum"] = scaled_sum(x_rows).local().tolist()


@dist.spmd(mesh=mesh, in_specs=dist.ShardSpec((0,), ("dp",)))
def mismatched(x):
    if ts.mesh.current().rank == 0:
        return dist.all_reduce(x, axis="dp")
    return dist.all_gather(x, axis="dp", dim=0)[:2]


report["mismatched"] = error_of(lambda: mismatched(x_rows))

# Every per-rank collective and the rank's coordinate, against numpy.
rows = dist.ShardSpec((0,), ("dp",))


@dist.spmd(mesh=mesh, in_specs=rows, out_specs=(rows, None, rows, rows))
def collectives(x):                         # x: rows 2r, 2r+1 of X8
    coordinate = x * 0.0 + op.cast(dist.axis_index("dp"), ts.f32)
    from_rank1 = dist.broadcast(x, axis="dp", src=1)
    whole = dist.all_gather(x, axis="dp", dim=0)
    summed_block = dist.reduce_scatter(whole, axis="dp", dim=0)
    swapped = dist.all_to_all(x, axis="dp", split_dim=0, concat_dim=1)
    return coordinate, from_rank1, summed_block, swapped


names = ("coordinate", "from_rank1", "summed_block", "swapped")
for name, value in zip(names, collectives(x_rows)):
    report[f"spmd_{name}"] = value.numpy().tolist()

# Gradients through per-rank code: data parallel (w replicated, its
# gradient summed over the ranks), tensor parallel (w split by columns,
# all_gather), and the reduce_scatter and all_to_all rules.
cols = dist.ShardSpec(("col",), ("dp",))


@dist.spmd(mesh=mesh, in_specs=(rows, None))
def dp_loss(x, w):
    y = op.matmul(x, w)
    return dist.all_reduce(op.sum(y * y), axis="dp")


@dist.spmd(mesh=mesh, in_specs=(None, cols))
def tp_loss(x, w):
    z = dist.all_gather(op.matmul(x, w), axis="dp", dim=1)
    return op.sum(z * z * 0.5)


@dist.spmd(mesh=mesh, in_specs=rows)
def scatter_loss(x):
    whole = dist.all_gather(x, axis="dp", dim=0)
    part = dist.reduce_scatter(whole * whole, axis="dp", dim=0)
    return dist.all_reduce(op.sum(part), axis="dp")


@dist.spmd(mesh=mesh, in_specs=rows)
def swap_loss(x):
    s = dist.all_to_all(x, axis="dp", split_dim=0, concat_dim=1)
    return dist.all_reduce(op.sum(s * s * s), axis="dp")


@dist.spmd(mesh=mesh, in_specs=None)
def copies_loss(w):                 # every rank's copy of w counts: 2 sum(w^2)
    return dist.all_reduce(op.sum(w * w), axis="dp")


@ts.jit(mesh=mesh)
def local_view_grads(x, w):
    loss = dp_loss(x, w) + tp_loss(x, w) + scatter_loss(x) + swap_loss(x) + copies_loss(w)
    return loss, ts.grad(loss, [x, w])


Wg = np.random.default_rng(seed + 13).standard_normal((3, 4)).astype(np.float32)
loss, (gx, gw) = local_view_grads(X8, Wg)
report["grad_loss"] = float(loss.numpy())
report["grad_x"] = gx.numpy().tolist()
report["grad_w"] = gw.numpy().tolist()
report["Wg"] = Wg.tolist()


# -- point-to-point in per-rank code: a ring shift of fresh blocks, the
# training guide's ZeRO step (recv_from by name, the owner's send implied),
# a named value used before its type is known, and programs that would
# mispair or hang, caught before anything runs.
R = np.random.default_rng(seed + 21).standard_normal((4, 3)).astype(np.float32)


@dist.spmd(mesh=mesh, in_specs=rows, out_specs=rows)
def ring_shift(x):
    me, n = ts.mesh.current().rank, ts.mesh.current().size
    dist.send(x * 2.0, (me + 1) % n)
    return dist.recv((me - 1) % n, like=x) + 1.0


report["ring"] = ring_shift(dist.from_numpy(R, rows, mesh)).numpy().tolist()
report["R"] = R.tolist()
same = np.random.default_rng(seed + 22)      # the same arrays on both ranks
params = {"wq": same.standard_normal((3, 2)).astype(np.float32),
          "bias": same.standard_normal((4,)).astype(np.float32),
          "wo": same.standard_normal((2, 2)).astype(np.float32)}
grads = {k: same.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}


@dist.spmd(mesh=mesh)
def zero_step(weights, gradients):
    updated = {}
    for name, gradient in gradients.items():
        owner = sum(map(ord, name)) % ts.mesh.current().size
        if ts.mesh.current().rank == owner:
            updated[name] = weights[name] - 0.5 * gradient
        else:
            updated[name] = ts.distributed.recv_from(owner, name)
    return updated


report["zero"] = {k: v.numpy().tolist() for k, v in zero_step(params, grads).items()}
report["params"] = {k: v.tolist() for k, v in params.items()}
report["grads"] = {k: v.tolist() for k, v in grads.items()}


@dist.spmd(mesh=mesh)
def used_before_known(w):
    if ts.mesh.current().rank == 0:
        return {"w": w * 3.0, "twice": dist.recv(1, "twice")}
    return {"w": ts.distributed.recv_from(0, "w"), "twice": dist.recv(0, "w") * 2.0}


report["used_before_known"] = {k: v.numpy().tolist() for k, v in used_before_known(
    params["wq"]).items()}


@dist.spmd(mesh=mesh)
def never_sent(w):
    if ts.mesh.current().rank == 1:
        return dist.recv(0, like=w)
    return w


@dist.spmd(mesh=mesh)
def both_wait(w):
    peer = 1 - ts.mesh.current().rank
    got = dist.recv(peer, like=w)
    dist.send(got * 2.0, peer)
    return op.sum(got)


@dist.spmd(mesh=mesh)
def wrong_shape(w):
    if ts.mesh.current().rank == 0:
        dist.send(w, 1)
        return w
    return dist.recv(0, shape=(2, 2), dtype=np.float32)


@dist.spmd(mesh=mesh)
def unknown_name(w):
    if ts.mesh.current().rank == 0:
        return {"w": w}
    return {"w": ts.distributed.recv_from(0, "weights")}


@dist.spmd(mesh=mesh)
def owner_per_process(w):          # `my_rank` is this process' rank: the plans differ
    if ts.mesh.current().rank == my_rank:
        return {"w": w * 2.0}
    return {"w": ts.distributed.recv_from(my_rank, "w")}


for case in (never_sent, both_wait, wrong_shape, unknown_name, owner_per_process):
    report[case.__name__] = error_of(lambda: case(params["wq"]))

# -- issue 60: traced comparisons, arguments the ranks must agree on, local
# batches, axes that are not in the mesh.


@ts.compile(mesh=mesh)
def summed(g):
    return dist.all_reduce(g, axis="dp")


# The DDP habit: each rank passes its own array to a global-view function.
report["per_rank_array"] = error_of(lambda: summed(np.full(2, rank + 1.0, np.float32)))
report["agreed_array"] = summed(np.full(2, 3.0, np.float32)).numpy().tolist()
# A DTensor replicated over dp whose blocks differ (each rank's own array).
mine_replicated = dist.from_numpy(np.full(2, float(rank), np.float32), dist.ShardSpec(), mesh)
report["per_rank_dtensor"] = error_of(lambda: ts.compile(lambda g: g * 2.0, mesh=mesh)(
    mine_replicated))
# Checked before a signature's first run only, unless TESSERA_CHECK_INPUTS=always.
import os                                                          # noqa: E402
os.environ["TESSERA_CHECK_INPUTS"] = "always"
report["per_rank_always"] = error_of(lambda: summed(np.full(2, rank - 3.0, np.float32)))
del os.environ["TESSERA_CHECK_INPUTS"]


def mean_loss(w, batch):
    return op.mean(op.matmul(batch["x"], w))


data_parallel = ts.distribute(mean_loss, strategy="data_parallel", mesh=mesh)
local_batches = ts.distribute(mean_loss, strategy="data_parallel", mesh=mesh,
                              batch_is_local=True)
w1 = np.arange(3, dtype=np.float32).reshape(3, 1)
my_batch = {"x": np.random.default_rng(seed + 40 + rank).standard_normal((2 + 2, 3))
            .astype(np.float32)}
report["my_batch"] = my_batch["x"].tolist()
report["per_rank_batch"] = error_of(lambda: data_parallel(w1, my_batch))
report["local_batch_loss"] = float(local_batches(w1, my_batch))
report["from_local_default_mesh"] = error_of(lambda: dist.from_local(my_batch["x"], axis="dp"))
rows = dist.from_local(my_batch["x"], axis="dp", mesh=mesh)
report["from_local"] = [list(rows.shape), rows.numpy().tolist()]
report["from_local_shapes_differ"] = error_of(
    lambda: dist.from_local(np.ones((1 + rank, 3), np.float32), axis="dp", mesh=mesh))


# Comparisons are traced, in the global view and in per-rank code.
@ts.compile(mesh=mesh)
def compares(x):
    return ts.where(x == 2.0, 1.0, 0.0), ts.where(0.0 != x, x, -1.0)


cmp_eq, cmp_ne = compares(np.array([0.0, 2.0, 3.0], np.float32))
report["compares"] = [cmp_eq.numpy().tolist(), cmp_ne.numpy().tolist()]


@dist.spmd(mesh=mesh, in_specs=dist.ShardSpec((0,), ("dp",)))
def rank_one_scales(x):
    y = ts.where(dist.axis_index("dp") == 1, x * 10.0, x)
    return dist.all_reduce(y, axis="dp")


report["rank_one_scales"] = rank_one_scales(x_rows).numpy().tolist()


@dist.spmd(mesh=mesh, in_specs=dist.ShardSpec((0,), ("dp",)))
def branches_on_axis_index(x):
    if dist.axis_index("dp") == 0:
        x = dist.all_reduce(x, axis="dp")
    return x


report["branch_on_axis_index"] = error_of(lambda: branches_on_axis_index(x_rows))


@ts.compile(mesh=mesh)
def wrong_axis(x):
    return dist.all_reduce(x, axis="tpp")


report["wrong_axis"] = error_of(lambda: wrong_axis(np.ones(2, np.float32)))

(out / f"rank{rank}.json").write_text(json.dumps(report))
