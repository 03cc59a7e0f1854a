"""Performance guide 7.2 (a 2-D mesh over 16 GPUs), as written, inspected
from one process.

    python examples/design_docs/performance_7_2_mesh.py
"""
from tessera import dist

# Create 2D mesh over 16 GPUs (4×4)
mesh = dist.Mesh(axes=["tp", "dp"], devices=range(16))

print(mesh.topology)
# tp × dp mesh, 4 × 4
assert mesh.topology == "tp × dp mesh, 4 × 4"
print("OK performance_7_2_mesh")
