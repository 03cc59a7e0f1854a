"""Rank <-> mesh coordinate mapping and axis groups (pure Python, no MPI)."""

import pytest

from tessera_runtime.mesh import MeshError, MeshInfo


def test_1d_mesh():
    m = MeshInfo(["tp"], shape=[4], devices=[0, 1, 2, 3])
    assert m.num_devices == 4 and m.axis_size("tp") == 4
    assert [m.coords(r) for r in range(4)] == [(0,), (1,), (2,), (3,)]
    assert m.axis_group("tp", 2) == [0, 1, 2, 3]
    assert m.axis_groups("tp") == [[0, 1, 2, 3]]
    assert m.axis_color("tp", 3) == 0


def test_1d_mesh_permuted_devices():
    # world rank r sits at position devices.index(r)
    m = MeshInfo(["tp"], shape=[3], devices=[2, 0, 1])
    assert m.coords(2) == (0,) and m.coords(0) == (1,) and m.coords(1) == (2,)
    assert m.axis_group("tp", 0) == [2, 0, 1]   # ordered by coordinate
    assert m.rank_at((0,)) == 2


def test_2d_mesh_nested_devices():
    m = MeshInfo(["dp", "tp"], devices=[[0, 1], [2, 3]])
    assert m.shape == (2, 2) and m.devices == (0, 1, 2, 3)
    assert [m.coords(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # tp groups share the dp coordinate (rows), dp groups share tp (columns)
    assert m.axis_groups("tp") == [[0, 1], [2, 3]]
    assert m.axis_groups("dp") == [[0, 2], [1, 3]]
    assert m.axis_group("tp", 3) == [2, 3]
    assert m.axis_group("dp", 1) == [1, 3]
    assert [m.axis_color("tp", r) for r in range(4)] == [0, 0, 1, 1]
    assert [m.axis_color("dp", r) for r in range(4)] == [0, 1, 0, 1]
    for r in range(4):
        assert m.rank_at(m.coords(r)) == r


def test_2d_mesh_flat_devices_row_major():
    m = MeshInfo(["dp", "tp"], shape=[2, 3], devices=[5, 4, 3, 2, 1, 0])
    assert m.coords(5) == (0, 0) and m.coords(3) == (0, 2) and m.coords(0) == (1, 2)
    assert m.axis_group("tp", 1) == [2, 1, 0]
    assert m.axis_group("dp", 4) == [4, 1]
    assert m.axis_groups("dp") == [[5, 2], [4, 1], [3, 0]]
    assert m == MeshInfo(["dp", "tp"], devices=[[5, 4, 3], [2, 1, 0]])


def test_single_device_mesh():
    m = MeshInfo.single()
    assert m.num_devices == 1 and m.coords(0) == () and m.axes == ()
    assert MeshInfo(["tp"], shape=[1], devices=[0]).axis_groups("tp") == [[0]]


def test_local_slices():
    m = MeshInfo(["dp", "tp"], devices=[[0, 1], [2, 3]])
    assert m.local_shape((8, 6), [["dp"], ["tp"]]) == (4, 3)
    assert m.local_slices((8, 6), [["dp"], ["tp"]], 2) == (slice(4, 8), slice(0, 3))
    # one dim over two axes, outermost first: block = dp * 2 + tp
    assert m.local_slices((8, 6), [["dp", "tp"], []], 1) == (slice(2, 4), slice(0, 6))
    assert m.local_slices((8, 6), [["tp", "dp"], []], 1) == (slice(4, 6), slice(0, 6))


@pytest.mark.parametrize("kwargs, match", [
    (dict(axes=["a", "b"], shape=[2], devices=[0, 1]), "2 axes"),
    (dict(axes=["a"], shape=[3], devices=[0, 1]), "needs 3 devices"),
    (dict(axes=["a"], shape=[2], devices=[0, 0]), "duplicate devices"),
    (dict(axes=["a", "a"], shape=[1, 1], devices=[0]), "duplicate axis"),
    (dict(axes=["a", "b"], shape=[2, 2], devices=[[0, 1, 2], [3]]), "not rectangular"),
    (dict(axes=["a", "b"], shape=[1, 4], devices=[[0, 1], [2, 3]]), "nested devices have shape"),
])
def test_bad_meshes(kwargs, match):
    with pytest.raises(MeshError, match=match):
        MeshInfo(**kwargs)


def test_unknown_rank_and_axis():
    m = MeshInfo(["tp"], shape=[2], devices=[0, 1])
    with pytest.raises(MeshError, match="world rank 7 is not in mesh"):
        m.coords(7)
    with pytest.raises(MeshError, match="axis 'dp' is not in mesh"):
        m.axis_size("dp")


def test_sub_axes_split_an_axis_into_major_and_minor_parts():
    """Sub-axes (Shardy's "axis:(pre)size"): dp of size 8 on a dp x tp mesh
    as 4 nodes of 2 dp ranks ("dp:(4)2", the minor part) and the 4 nodes
    ("dp:(1)4", the major part); groups ordered by their coordinate."""
    m = MeshInfo(["dp", "tp"], shape=[8, 2])
    assert m.axis_size("dp:(4)2") == 2 and m.axis_size("dp:(1)4") == 4
    # rank 6 = (dp 3, tp 0): its node holds dp 2 and 3, its node peers are dp 1, 3, 5, 7
    assert m.axis_group("dp:(4)2", 6) == [4, 6]
    assert m.axis_group("dp:(1)4", 6) == [2, 6, 10, 14]
    assert m.axis_group("dp:(2)2", 6) == [2, 6]          # a middle part: dp // 2 % 2
    # colors: one communicator per group, every rank in exactly one
    for axis in ("dp:(4)2", "dp:(1)4"):
        groups = m.axis_groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(16))
        assert all(m.axis_group(axis, r) == groups[m.axis_color(axis, r)] for r in range(16))
    assert m.has_axis("dp:(1)8") and not m.has_axis("dp:(3)2") and not m.has_axis("pp:(1)2")
    with pytest.raises(MeshError, match=r"pre-size 3 x size 2 does not divide axis 'dp' of size 8"):
        m.axis_size("dp:(3)2")
    with pytest.raises(MeshError, match="axis 'pp:\\(1\\)2' is not in mesh"):
        m.axis_group("pp:(1)2", 0)
