"""MPI worker for test_mpi_collectives.py; run as `mpiexec -n N python THIS MODE ...`.

Modes:
  collectives      every collective over COMM_WORLD (any N)
  mesh2x2          N=4: axis communicators of a 2x2 (dp, tp) mesh, plus COMM_WORLD
  program BUNDLE   load BUNDLE with tessera_runtime, run it, compare with numpy
  shm              every collective through shared memory (shm_comm), transfers,
                   MPI fallbacks, and waits that sleep (any N)

Every rank computes the expected results itself with numpy (it can regenerate
any rank's contribution from its seed). Prints `PASS rank=R NAME` per check and
`DONE rank=R checks=K` at the end (each record ends with ';'); any failure aborts the whole MPI job so the
other ranks do not hang in a collective.
"""

import hashlib
import sys
import time
import traceback

import ml_dtypes
import numpy as np
from mpi4py import MPI


def _abort(exc_type, exc, tb):
    traceback.print_exception(exc_type, exc, tb)
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


sys.excepthook = _abort

import tessera_runtime as rt                                      # noqa: E402
from tessera_runtime.comm import CommError, SelfCommunicator      # noqa: E402
from tessera_runtime.mesh import MeshInfo                         # noqa: E402
from tessera_runtime.axis_comms import make_axis_communicators  # noqa: E402
from tessera_runtime.mpi_comm import MPICommunicator  # noqa: E402
from tessera_runtime.shared_memory import shared_mapping                        # noqa: E402
from tessera_runtime import shm_comm                                            # noqa: E402

WORLD = MPI.COMM_WORLD
ME = WORLD.Get_rank()
_passed = 0

UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def passed(name: str) -> None:
    global _passed
    _passed += 1
    # ';' ends a record: mpiexec may interleave the ranks' output mid-line
    print(f"PASS rank={ME} {name};", flush=True)


def data(seed: int, world_rank: int, shape, kind: str = "normal", dtype=np.float32):
    """The contribution of `world_rank` to check `seed` (any rank can rebuild it)."""
    rng = np.random.default_rng([seed, world_rank])
    if kind == "prod":      # near 1 so products neither overflow nor vanish
        return (0.75 + 0.5 * rng.random(shape)).astype(dtype)
    x = rng.standard_normal(shape)
    if kind == "wide":      # magnitudes over 8 decades: sums depend on the order
        x *= 10.0 ** rng.uniform(-4, 4, shape)
    if np.dtype(dtype).kind == "i":
        x = np.round(x * 100)
    return x.astype(dtype)


def fixed_tree(blocks, ufunc):
    """Expected deterministic reduction, written independently of the runtime:
    combine b[i] with b[i + stride] for stride 1, 2, 4, ... -> ((b0 b1)(b2 b3))."""
    b = [x.copy() for x in blocks]
    stride = 1
    while stride < len(b):
        for i in range(0, len(b), 2 * stride):
            if i + stride < len(b):
                b[i] = ufunc(b[i], b[i + stride])
        stride *= 2
    return b[0]


def same_on_all_ranks(comm, arr) -> bool:
    digest = np.frombuffer(hashlib.sha256(np.ascontiguousarray(arr).tobytes()).digest(), np.uint8)
    everyone = np.empty((comm.size, digest.size), np.uint8)
    comm.comm.Allgather(digest, everyone)
    return bool((everyone == digest).all())


def check_collectives(comm, group, tag: str) -> None:
    """All collectives of `comm`, whose members are world ranks `group` in order."""
    n = comm.size
    assert n == len(group) and comm.rank == group.index(ME), (tag, comm.rank, group)
    seed = [0]

    def contributions(shape, kind="normal", dtype=np.float32):
        seed[0] += 1
        return data(seed[0], ME, shape, kind, dtype), [data(seed[0], g, shape, kind, dtype)
                                                        for g in group]

    # all_reduce: every reduction, a few dtypes, and in place
    for red in ("sum", "max", "min", "prod"):
        for dtype in (np.float32, np.float64, np.int32):
            src, all_src = contributions((5, 7), "prod" if red == "prod" else "normal", dtype)
            dst = np.empty_like(src)
            comm.all_reduce(src, dst, red).wait()
            expect = UFUNCS[red].reduce(np.stack(all_src), axis=0)
            np.testing.assert_allclose(dst, expect, rtol=1e-5, atol=1e-5)
            passed(f"{tag}:all_reduce {red} {np.dtype(dtype).name}")
    src, all_src = contributions((3, 4))
    buf = src.copy()
    comm.all_reduce(buf, buf, "sum").wait()
    np.testing.assert_allclose(buf, np.sum(all_src, axis=0), rtol=1e-5, atol=1e-5)
    passed(f"{tag}:all_reduce in place")

    # all_gather along every dim of a 3-D buffer (dim 0 needs no packing)
    for dim in (0, 1, 2):
        src, all_src = contributions((2, 3, 4))
        shape = list(src.shape)
        shape[dim] *= n
        dst = np.empty(shape, np.float32)
        comm.all_gather(src, dst, dim).wait()
        np.testing.assert_array_equal(dst, np.concatenate(all_src, axis=dim))
        passed(f"{tag}:all_gather dim={dim}")

    # all_to_all: block j along split_dim goes to rank j, received blocks are
    # concatenated along concat_dim (a split moving from one dimension to another)
    for split_dim, concat_dim in ((0, 1), (1, 0), (2, 0)):
        src, all_src = contributions((4 * n, 2 * n, 2 * n))
        shape = list(src.shape)
        shape[split_dim] //= n
        shape[concat_dim] *= n
        dst = np.empty(shape, np.float32)
        comm.all_to_all(src, dst, split_dim, concat_dim).wait()
        expect = np.concatenate([np.split(a, n, axis=split_dim)[comm.rank] for a in all_src],
                                axis=concat_dim)
        np.testing.assert_array_equal(dst, expect)
        passed(f"{tag}:all_to_all {split_dim}->{concat_dim}")
    # contiguous blocks (an MoE layer's): received straight into dst
    src, all_src = contributions((n, 3, 4))
    dst = np.empty((1, 3 * n, 4), np.float32)
    comm.all_to_all(src, dst, 0, 1).wait()
    np.testing.assert_array_equal(dst[0], np.concatenate([a[comm.rank] for a in all_src]))
    passed(f"{tag}:all_to_all contiguous blocks")

    # ragged all_to_all (counts): only the first send[j] rows of block j move,
    # both ways an MoE layer exchanges (dispatch 0->1, its backward 1->0);
    # the rest of dst is left as it was
    def sent(g, j):                    # rows world rank g sends to member j
        return (3 * g + 5 * j + seed[0]) % 6
    for split_dim, concat_dim in ((0, 1), (1, 0)):
        src, all_src = contributions((n, 5, 3) if split_dim == 0 else (1, 5 * n, 3))
        blocks = [a.reshape(n, 5, 3) for a in all_src]          # [member][its block j]
        dst = np.full((1, 5 * n, 3) if split_dim == 0 else (n, 5, 3), np.nan, np.float32)
        send = np.array([sent(ME, j) for j in range(n)], np.int32)
        recv = np.array([sent(g, comm.rank) for g in group], np.int32)
        comm.all_to_all(src, dst, split_dim, concat_dim, counts=(send, recv)).wait()
        got = dst.reshape(n, 5, 3)
        for i in range(n):
            np.testing.assert_array_equal(got[i, :recv[i]], blocks[i][comm.rank, :recv[i]])
            assert np.isnan(got[i, recv[i]:]).all(), (tag, i, recv)
        passed(f"{tag}:ragged all_to_all {split_dim}->{concat_dim}")
    try:
        comm.all_to_all(src, dst, split_dim, concat_dim,
                        counts=(send + 6, recv)).wait()
    except CommError as err:
        assert "must be within the 5 rows of a block" in str(err), err
        passed(f"{tag}:ragged all_to_all counts past a block refused")

    # broadcast from every root, and point-to-point ring shifts both ways
    for root in range(n):
        src, all_src = contributions((3, 5))
        dst = np.empty_like(src)
        comm.broadcast(src, dst, root).wait()
        np.testing.assert_array_equal(dst, all_src[root])
    passed(f"{tag}:broadcast every root")
    for offset in (1, -1):
        src, all_src = contributions((4, 2))
        dst = np.empty_like(src)
        comm.shift(src, dst, offset).wait()
        np.testing.assert_array_equal(dst, all_src[(comm.rank - offset) % n])
        passed(f"{tag}:shift {offset:+d}")

    # reduce_scatter along dims 0 and 1
    for red in ("sum", "max"):
        for dim in (0, 1):
            src, all_src = contributions((8, 12))
            shape = list(src.shape)
            shape[dim] //= n
            dst = np.empty(shape, np.float32)
            comm.reduce_scatter(src, dst, dim, red).wait()
            full = UFUNCS[red].reduce(np.stack(all_src), axis=0)
            np.testing.assert_allclose(dst, np.split(full, n, axis=dim)[comm.rank],
                                       rtol=1e-5, atol=1e-5)
            passed(f"{tag}:reduce_scatter {red} dim={dim}")

    # deterministic: the fixed tree over rank order, bit for bit, on every
    # rank and on every repetition
    for red in ("sum", "prod", "max"):
        src, all_src = contributions((64, 33), "prod" if red == "prod" else "wide")
        expect = fixed_tree(all_src, UFUNCS[red])
        results = []
        for _ in range(3):
            dst = np.empty_like(src)
            comm.all_reduce(src, dst, red, deterministic=True).wait()
            results.append(dst)
        for r in results:
            assert np.array_equal(r.view(np.uint32), expect.view(np.uint32)), f"{tag} {red}"
        assert same_on_all_ranks(comm, results[0])
        passed(f"{tag}:deterministic all_reduce {red} bitwise identical")
    for dim in (0, 1):
        src, all_src = contributions((8, 12), "wide")
        shape = list(src.shape)
        shape[dim] //= n
        dst = np.empty(shape, np.float32)
        comm.reduce_scatter(src, dst, dim, "sum", deterministic=True).wait()
        expect = np.split(fixed_tree(all_src, np.add), n, axis=dim)[comm.rank]
        assert np.array_equal(dst.view(np.uint32), expect.view(np.uint32))
        passed(f"{tag}:deterministic reduce_scatter dim={dim} bitwise")
    buf, all_src = contributions((16, 9), "wide")
    comm.all_reduce(buf, buf, "sum", deterministic=True).wait()
    assert np.array_equal(buf.view(np.uint32), fixed_tree(all_src, np.add).view(np.uint32))
    assert same_on_all_ranks(comm, buf)
    passed(f"{tag}:deterministic all_reduce in place")

    # bf16 (ml_dtypes; MPI moves the bits): reductions in float32 rounded
    # once, the deterministic tree rounding per step like any bf16 add, and
    # data movement bit for bit
    bf16 = ml_dtypes.bfloat16
    for red in ("sum", "max"):
        src, all_src = contributions((6, 10), "normal", bf16)
        dst = np.empty_like(src)
        comm.all_reduce(src, dst, red).wait()
        wide = UFUNCS[red].reduce(np.stack(all_src).astype(np.float64), axis=0)
        # one rounding to bf16 (MPI may add the float32 copies in any order)
        np.testing.assert_allclose(dst.astype(np.float64), wide, rtol=2.0 ** -8, atol=1e-6)
        src, all_src = contributions((6, 10), "wide", bf16)
        dst = np.empty_like(src)
        comm.all_reduce(src, dst, red, deterministic=True).wait()
        assert np.array_equal(dst.view(np.uint16),
                              fixed_tree(all_src, UFUNCS[red]).view(np.uint16)), red
        assert same_on_all_ranks(comm, dst)
        passed(f"{tag}:all_reduce {red} bfloat16")
    src, all_src = contributions((4, 6 * n), "normal", bf16)
    dst = np.empty((4, 6), bf16)
    comm.reduce_scatter(src, dst, 1, "sum").wait()
    full = np.sum(np.stack(all_src).astype(np.float64), axis=0)
    np.testing.assert_allclose(dst.astype(np.float64), np.split(full, n, axis=1)[comm.rank],
                               rtol=2.0 ** -8, atol=1e-6)
    src, all_src = contributions((4, 6 * n), "wide", bf16)
    comm.reduce_scatter(src, dst, 1, "sum", deterministic=True).wait()
    assert np.array_equal(dst.view(np.uint16), np.split(fixed_tree(all_src, np.add), n,
                                                        axis=1)[comm.rank].view(np.uint16))
    passed(f"{tag}:reduce_scatter sum bfloat16")
    src, all_src = contributions((3, 2 * n), "normal", bf16)
    gathered, moved = np.empty((3, 2 * n * n), bf16), np.empty((3 * n, 2), bf16)
    comm.all_gather(src, gathered, 1).wait()
    comm.all_to_all(src, moved, 1, 0).wait()
    assert np.array_equal(gathered.view(np.uint16), np.concatenate(all_src, 1).view(np.uint16))
    assert np.array_equal(moved.view(np.uint16), np.concatenate(
        [np.split(a, n, 1)[comm.rank] for a in all_src], 0).view(np.uint16))
    shifted, broadcast = np.empty_like(src), np.empty_like(src)
    comm.shift(src, shifted, 1).wait()
    comm.broadcast(src, broadcast, 0).wait()
    assert np.array_equal(shifted.view(np.uint16), all_src[(comm.rank - 1) % n].view(np.uint16))
    assert np.array_equal(broadcast.view(np.uint16), all_src[0].view(np.uint16))
    passed(f"{tag}:all_gather, all_to_all, shift, broadcast bfloat16")

    # several collectives in flight at once, completed in reverse order
    a, all_a = contributions((6, 4))
    b, all_b = contributions((2, 5))
    c, all_c = contributions((4, 8))
    ra, rb, rc = np.empty_like(a), np.empty((2, 5 * n), np.float32), np.empty((4, 8 // n), np.float32)
    works = [comm.all_reduce(a, ra, "sum"), comm.all_gather(b, rb, 1),
             comm.reduce_scatter(c, rc, 1, "sum", deterministic=True)]
    for w in reversed(works):
        w.wait()
    works[0].wait()   # waiting twice is a no-op
    np.testing.assert_allclose(ra, np.sum(all_a, axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rb, np.concatenate(all_b, axis=1))
    np.testing.assert_array_equal(rc, np.split(fixed_tree(all_c, np.add), n, axis=1)[comm.rank])
    passed(f"{tag}:overlapping collectives")


def mode_collectives() -> None:
    check_collectives(MPICommunicator(WORLD), list(range(WORLD.size)), "world")


def mode_mesh2x2() -> None:
    assert WORLD.size == 4
    # permuted devices: rank 1 sits at (1, 0), rank 2 at (0, 1)
    mesh = MeshInfo(["dp", "tp", "pp"], shape=[2, 2, 1], devices=[0, 2, 1, 3])
    comms = make_axis_communicators(mesh)
    assert isinstance(comms["pp"], SelfCommunicator)
    expected_groups = {"dp": {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]},
                       "tp": {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}}
    for axis in ("dp", "tp"):
        group = mesh.axis_group(axis, ME)
        assert group == expected_groups[axis][ME], (axis, group)
        check_collectives(comms[axis], group, axis)

    # collectives on both axes in flight at the same time
    x = data(99, ME, (4, 4))
    sdp, stp = np.empty_like(x), np.empty_like(x)
    w1 = comms["dp"].all_reduce(x, sdp, "sum")
    w2 = comms["tp"].all_reduce(x, stp, "sum", deterministic=True)
    w2.wait()
    w1.wait()
    for out, axis in ((sdp, "dp"), (stp, "tp")):
        np.testing.assert_allclose(out, sum(data(99, g, (4, 4)) for g in mesh.axis_group(axis, ME)),
                                   rtol=1e-5, atol=1e-5)
    passed("mesh:both axes in flight")

    # Every program loaded makes its communicators again: on one machine the
    # same members get the same shared-memory group, mapped once.
    groups = len(shm_comm._PROCESS.groups)
    again = make_axis_communicators(mesh)
    for axis in ("dp", "tp"):
        assert isinstance(comms[axis], shm_comm.SharedMemoryCommunicator), type(comms[axis])
        assert again[axis] is comms[axis], axis
    assert len(shm_comm._PROCESS.groups) == groups
    check_collectives(again["tp"], mesh.axis_group("tp", ME), "tp again")
    passed("mesh:communicators made again reuse the shared-memory groups")
    mode_collectives()   # size 4: a two-level tree


def mode_program(path: str) -> None:
    prog = rt.load_bundle(path)
    assert prog.rank == ME
    assert prog.rank_coords == prog.mesh.coords(ME)
    rng = np.random.default_rng(1234)               # same global inputs everywhere
    x = rng.standard_normal(prog.inputs[0].global_shape).astype(np.float32)
    w = rng.standard_normal(prog.inputs[1].global_shape).astype(np.float32)
    xw = x.astype(np.float64) @ w.astype(np.float64)
    expect_global = {"tp_mlp": {"y": np.maximum(xw, 0), "z": xw, "g": xw},
                     "dp_tp_mlp": {"y": xw, "full": xw}}[prog.entry]
    for rep in range(2):                            # fresh buffers each run
        outs = prog.run(prog.shard_inputs([x, w]))
        for spec, out in zip(prog.outputs, outs):
            assert out.shape == spec.local_shape and out.dtype == spec.dtype
            want = expect_global[spec.name][prog.mesh.local_slices(
                spec.global_shape, spec.sharding.dims, ME)]
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
            if not any(spec.sharding.dims):         # replicated: same bits everywhere
                assert same_on_all_ranks(MPICommunicator(WORLD), out), spec.name
            passed(f"program {prog.entry}:{spec.name} run={rep}")


def mode_shm() -> None:
    n, me = WORLD.size, ME
    shm = shm_comm.SharedMemoryCommunicator.create(WORLD, n)
    assert isinstance(shm, shm_comm.SharedMemoryCommunicator), "no shared-memory communicator"
    check_collectives(shm, list(range(n)), "shm")
    # A tiny slot: the small messages go through shared memory, the rest
    # through MPI, interleaved on one group.
    small = shm_comm.SharedMemoryCommunicator(
        WORLD, shared_mapping(WORLD, 1 << 20, "tessera-test-"), 256, 0.0)
    check_collectives(small, list(range(n)), "shm+mpi")

    # Broadcasts and neighbour transfers larger than a slot go through it in
    # pieces (more than the group's slot sets, more than a channel's slots).
    root = n - 1
    big = data(150, root, (3000,))
    seen = np.empty_like(big)
    before = small._issued.get("group", 0)
    small.broadcast(big if me == root else seen, seen, root).wait()
    assert np.array_equal(seen, big)
    assert small._issued["group"] - before == -(-big.nbytes // 256) > shm_comm.PHASES
    if n > 1:
        right, left = (me + 1) % n, (me - 1) % n
        long_in = np.empty((50, 25), np.float32)
        works = [small.send(data(160, me, (50, 25)), right), small.recv(long_in, left)]
        for w in works[::-1]:
            w.wait()
        assert np.array_equal(long_in, data(160, left, (50, 25)))
        assert small._issued[("to", right)] == -(-long_in.nbytes // 256) > shm_comm.CHANNEL_SLOTS
    passed("shm:broadcasts and transfers larger than a slot go in pieces")

    # More collectives in flight than the group has slot sets.
    xs = [data(200 + k, me, (3, 5)) for k in range(3 * shm_comm.PHASES)]
    outs = [np.empty_like(x) for x in xs]
    works = [shm.all_reduce(x, o, deterministic=True) for x, o in zip(xs, outs)]
    for w in reversed(works):
        w.wait()
    for k, o in enumerate(outs):
        assert np.array_equal(o, fixed_tree([data(200 + k, g, (3, 5)) for g in range(n)], np.add))
    passed("shm:more collectives in flight than slot sets")

    right, left = (me + 1) % n, (me - 1) % n
    if n > 1:
        # More sends than a channel holds, before the receiver starts any.
        count = 3 * shm_comm.CHANNEL_SLOTS
        sends = [shm.send(data(300 + k, me, (64,)), right) for k in range(count)]
        got = [np.empty(64, np.float32) for _ in range(count)]
        recvs = [shm.recv(g, left) for g in got]
        for w in sends + recvs[::-1]:
            w.wait()
        for k, g in enumerate(got):
            assert np.array_equal(g, data(300 + k, left, (64,))), k
        passed("shm:sends past the channel's slots")

        # A receiver that waits in a collective before its receives still
        # frees the sender's slots (the sender waits for its sends first).
        count = 2 * shm_comm.CHANNEL_SLOTS
        got = [np.empty(64, np.float32) for _ in range(count)]
        if me % 2 == 0 and right != 0:
            for w in [shm.send(data(400 + k, me, (64,)), right) for k in range(count)]:
                w.wait()
        recvs = ([shm.recv(g, left) for g in got] if me % 2 == 1 else [])
        x = data(500, me, (4,))
        total = np.empty_like(x)
        shm.all_reduce(x, total).wait()
        for w in recvs:
            w.wait()
        for k, g in enumerate(got if recvs else []):
            assert np.array_equal(g, data(400 + k, left, (64,))), k
        passed("shm:a receiver in a collective lets its sender go on")

    if n > 2:
        # Ranks that are not neighbours exchange through MPI.
        far = (me + 2) % n
        if far != (me - 2) % n or me < far:
            out = np.empty(8, np.float32)
            ws = [shm.send(data(600, me, (8,)), far), shm.recv(out, (me - 2) % n)]
        else:
            out = np.empty(8, np.float32)
            ws = [shm.recv(out, (me - 2) % n), shm.send(data(600, me, (8,)), far)]
        for w in ws:
            w.wait()
        assert np.array_equal(out, data(600, (me - 2) % n, (8,)))
        passed("shm:transfers between ranks that are not neighbours")

    # A rank waiting for a late peer sleeps: it uses almost no CPU.
    WORLD.Barrier()
    x, out = data(700, me, (16,)), np.empty(16, np.float32)
    if me == 0:
        time.sleep(0.6)
    cpu = time.process_time()
    shm.all_reduce(x, out).wait()
    cpu = time.process_time() - cpu
    if me != 0:
        assert cpu < 0.2, f"rank {me} used {cpu:.3f} s of CPU waiting 0.6 s for rank 0"
    passed("shm:a waiting rank sleeps")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "collectives":
        mode_collectives()
    elif mode == "mesh2x2":
        mode_mesh2x2()
    elif mode == "shm":
        mode_shm()
    elif mode == "program":
        mode_program(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"DONE rank={ME} checks={_passed};", flush=True)
