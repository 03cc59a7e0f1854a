"""Tutorial 4.2 (a sharded embedding table), as written except its size:
the tutorial's (10_000_000, 4096) bf16 table is 76 GiB (19 GiB per rank on
tp=4); here (10_000, 4096) on 2 ranks, 39 MiB per rank. Each rank makes only
its block (peak memory grows by less than the 78 MiB table), from a
counter-based generator, so the block is the same numbers a 1-rank table of
the same seed holds there.

    tessera launch -n 2 examples/design_docs/tutorial_4_2_shard.py
"""
import resource

from tessera import dist

mesh = dist.Mesh(axes=["tp"], devices=range(2))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
# Shard a large embedding table across tensor-parallel axis
E = dist.tensor(
    shape=(10_000, 4096),
    layout=dist.ShardSpec(partition=("row",), mesh_axes=("tp",)),
    mesh=mesh,
    dtype="bf16"
)
grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
assert E.local().shape == (5_000, 4096) and E.nbytes == 5_000 * 4096 * 2
assert grown_mib < 78, f"{grown_mib:.0f} MiB: more than the whole table"
start = 5_000 * mesh.rank
assert (E.local()[:4] == dist.counter_normal((10_000, 4096), (slice(start, start + 4),
                                             slice(0, 4096)), 0, 1.0, E.dtype)).all()
if mesh.rank == 0:
    print(f"rank 0 holds {E.nbytes / 2**20:.0f} MiB of the {10_000 * 4096 * 2 / 2**20:.0f} "
          f"MiB table (peak RSS grew {grown_mib:.0f} MiB)")
    print("OK tutorial_4_2_shard")
