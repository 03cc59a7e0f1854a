"""Tutorial 4.1 (a 2-D mesh from a nested device list), as written,
inspected from one process.

    python examples/design_docs/tutorial_4_1_mesh.py
"""
import tessera as ts
from tessera import dist

# Create a 2D mesh: tensor-parallel × data-parallel
mesh = dist.Mesh(axes=["tp", "dp"], devices=[[0,1,2,3],[4,5,6,7]])

assert mesh.shape == {"tp": 2, "dp": 4} and ts.dist.Mesh is dist.Mesh
print(mesh.topology)
print("OK tutorial_4_1_mesh")
