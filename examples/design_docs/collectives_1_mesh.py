"""Collectives guide, section 1 (the mesh), as written: 48 devices over
dp, tp and pp. Inspected from one process (a mesh needs its ranks only to
run on it).

    python examples/design_docs/collectives_1_mesh.py
"""
from tessera import dist
mesh = dist.Mesh(axes=["dp","tp","pp"], devices=range(48))  # 4 dp × 4 tp × 3 pp

assert mesh.shape == {"dp": 4, "tp": 4, "pp": 3}, mesh.shape
print(mesh.topology)
print("OK collectives_1_mesh")
