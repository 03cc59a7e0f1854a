"""Collectives guide 5.1 (async checkpointing), on 2 ranks: the snippet as
written, with the model and optimizer it leaves out filled in (a 2-layer MLP
whose weights are split over `tp`, `parameters()` returning them; AdamW's
state as `state_dict()`). The save returns after a snapshot; the weights are
changed at once, and the checkpoint, loaded back (onto the same mesh and, in
one process, as numpy), still holds the values at the call. Files go to a
temporary directory the ranks share (the snippet's default is
./checkpoints).

    tessera launch -n 2 examples/design_docs/collectives_5_1_checkpoint.py
"""
import os
import shutil
import tempfile

import numpy as np

import tessera as ts
from tessera import dist

mesh = dist.Mesh(axes=["tp"], devices=range(2))
# One directory for both ranks: rank 0 makes it, the other learns its name.
name = np.frombuffer(tempfile.mkdtemp().encode().ljust(256), np.uint8) if mesh.rank == 0 else None
os.chdir(bytes(dist.broadcast(name, mesh=mesh).numpy()).decode().strip())

rng = np.random.default_rng(3)


class Model:
    def __init__(self):
        w = {"w1": rng.standard_normal((16, 32)).astype(np.float32),
             "w2": rng.standard_normal((32, 16)).astype(np.float32)}
        self.values = {k: v.copy() for k, v in w.items()}
        self.weights = dist.from_tree(w, lambda path, a: dist.ShardSpec(
            (1,) if path == "w1" else (0,), ("tp",)), mesh)

    def parameters(self):
        return self.weights


class Optimizer:
    def __init__(self, params):
        self.state = ts.optim.AdamW(lr=1e-3).init(params)

    def state_dict(self):
        return self.state


model = Model()
optimizer = Optimizer(model.parameters())

from tessera import checkpoint
checkpoint.save(tag="step_100k",
                tensors=model.parameters(),
                optimizer=optimizer.state_dict(),
                atomic=True, async_io=True)

for w in model.parameters().values():        # the next step overwrites the weights
    w.local()[...] = 0.0
restored = checkpoint.load("latest", mesh=mesh)        # waits for the save first
assert restored.tag == "step_100k"
for k, w in restored.tensors.items():
    assert w.layout == model.parameters()[k].layout
    np.testing.assert_array_equal(w.numpy(), model.values[k])
if mesh.rank == 0:          # both ranks have read (numpy() gathers): tidy up
    shutil.rmtree(os.getcwd())
    print("OK collectives_5_1_checkpoint")
