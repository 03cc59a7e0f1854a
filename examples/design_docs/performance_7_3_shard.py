"""Performance guide 7.3 (explicit sharding), as written on 4 ranks (2 tp x
2 dp; the guide's mesh is the 4 x 4 of 7.2): a bf16 1024 x 1024 weight split
by rows over tp and by columns over dp. Each rank holds only its 512 x 512
block (0.5 MiB), made where it lives.

    tessera launch -n 4 examples/design_docs/performance_7_3_shard.py
"""
from tessera import dist

mesh = dist.Mesh(axes=["tp", "dp"], devices=range(4))
W = dist.tensor(shape=(1024, 1024),
                layout=dist.ShardSpec(partition=("row", "col"),
                                      mesh_axes=("tp", "dp")),
                mesh=mesh, dtype="bf16")

assert W.local().shape == (512, 512) and W.nbytes == 512 * 512 * 2
whole = W.numpy()                     # gathered here only to check it
r = mesh.rank
coords = mesh.coords
assert (W.local() == whole[512 * coords["tp"]:512 * (coords["tp"] + 1),
                           512 * coords["dp"]:512 * (coords["dp"] + 1)]).all()
assert 0.9 < float(whole.astype("float32").std()) < 1.1
dist.inspect(W)
if r == 0:
    print("OK performance_7_3_shard")
