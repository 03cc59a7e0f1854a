"""Context parallelism without running: a Llama training step whose token
ids are split along the sequence over a `cp` axis, compiled in one process
for meshes of 1 and 4 ranks. What the compiler decided is read from its
IR, its collective trace and its memory plan (no C++ build). The numerics
on 2 and 4 ranks are in test_end_to_end.py (attention, gradients) and
test_training.py (the Llama example, 20 steps)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import dist, models, op

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The Llama example's model (width 64, 4 heads, 4 key/value heads,
    sequences of 256), its AdamW and training step, and a batch."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_llama
    finally:
        sys.path.remove(str(EXAMPLES))
    folder = train_llama.new_checkpoint(tmp_path_factory.mktemp("llama") / "init", 64, 2, 4, 4,
                                        256, 0, 0, 2)
    model = models.from_pretrained(folder)
    opt = ts.optim.AdamW(lr=1e-3)
    rng = np.random.default_rng()
    batch = {k: rng.integers(0, 256, (2, 256)).astype(np.int32) for k in ("inputs", "targets")}
    return model, opt, train_llama.make_step(model, opt, 1.0), batch


def _on(mesh, model, opt, batch):
    """The step's arguments on `mesh`: parameters and optimizer state
    replicated, the batch's sequence split over cp."""
    params = dist.from_tree(model.params, model.layout(mesh), mesh)
    state = dist.from_tree(opt.init(model.params), model.layout(mesh), mesh)
    return params, state, dist.from_tree(batch, dist.ShardSpec((1,), ("cp",)), mesh)


def test_a_sequence_split_stays_split_through_a_llama_step(llama):
    """Over cp = 4: no collective gathers the sequence (the embedding, every
    linear layer, RoPE, the loss and their gradients run on the rank's own
    tokens); attention trades the split for heads by all-to-all (forward
    and backward, said per attention), each moving at most one rank's block
    of q; the gradients are summed over cp once, bucketed. Each rank's
    planned activations are about a quarter of one rank's at cp = 1."""
    model, opt, step, batch = llama
    mesh = dist.Mesh(axes=["cp"], shape=(4,))
    args = _on(mesh, model, opt, batch)
    traced = ts.graph.trace(step, *args)
    moved = {c.op for c in traced.collectives} - {"axis_slice"}   # (a local slice: RoPE's table)
    assert moved == {"all_to_all", "all_reduce"}, traced.report()
    q_block = 2 * (256 // 4) * 64 * 4                     # [B, S / cp, H * D] float32
    assert max(c.bytes for c in traced.collectives if c.op == "all_to_all") <= q_block
    reduced = [c for c in traced.collectives if c.op == "all_reduce" and c.bytes > 4]
    params = sum(int(np.prod(p.shape)) for p in model.params.values())
    assert len(reduced) == 1 and reduced[0].bytes >= 4 * params, traced.report()
    assert len(traced.attention) == 4, traced.attention       # 2 layers, forward and backward
    assert all("sequence over 'cp' exchanged for heads (all-to-all, Ulysses)" in a
               for a in traced.attention), traced.attention
    one = step.memory_report(*_on(dist.Mesh(axes=["cp"], shape=(1,)), model, opt, batch))
    four = next(iter(traced.levels.memory.values()))      # (the trace planned it)
    whole, split = (p.rank(0).by_category["activations"] for p in (one, four))
    assert split < 0.35 * whole, (split, whole)


def test_ring_attention_keeps_the_sequence_split_in_a_llama_step(llama):
    """context_parallel="ring" over cp = 4: attention keeps the sequence
    split and passes key/value blocks around the ring (forward and
    backward, said per attention); no collective gathers, none moves more
    than one rank's block of q (the all-to-alls stripe the causal work),
    each ring_shift at most one rank's K (or dK) block; each rank's planned
    activations are about a quarter of one rank's."""
    model, opt, _, batch = llama
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_llama
    finally:
        sys.path.remove(str(EXAMPLES))
    step = train_llama.make_step(model, opt, 1.0, "ring")
    mesh = dist.Mesh(axes=["cp"], shape=(4,))
    traced = ts.graph.trace(step, *_on(mesh, model, opt, batch))
    over_cp = [c for c in traced.collectives if c.axis == "cp"]
    assert {c.op for c in over_cp} == {"all_to_all", "ring_shift", "all_reduce", "axis_slice"}, \
        traced.report()
    k_block = 2 * (256 // 4) * 64 * 4                     # [B, S / cp, Hkv * D] float32
    assert max(c.bytes for c in over_cp if c.op == "ring_shift") <= k_block, traced.report()
    assert max(c.bytes for c in over_cp if c.op == "all_to_all") <= k_block, traced.report()
    assert len(traced.attention) == 4 and all(
        "kept split over 'cp': ring" in a and "striped" in a for a in traced.attention), \
        traced.attention
    four = next(iter(traced.levels.memory.values()))
    one = step.memory_report(*_on(dist.Mesh(axes=["cp"], shape=(1,)), model, opt, batch))
    whole, split = (p.rank(0).by_category["activations"] for p in (one, four))
    assert split < 0.35 * whole, (split, whole)


def test_a_split_no_head_dimension_can_take_is_gathered_and_said_so():
    """Two grouped key/value heads over 4 ranks (and one batch row) cannot
    take the sequence split: it is gathered, and graph.trace says which
    attention (its Python line)."""
    mesh = dist.Mesh(axes=["cp"], shape=(4,))
    rng = np.random.default_rng()
    seq = dist.ShardSpec((1,), ("cp",))
    q, k = (dist.from_numpy(rng.standard_normal(s).astype(np.float32), seq, mesh)
            for s in ((1, 8, 4, 8), (1, 8, 2, 8)))

    def grouped(q, k):
        return op.attention(q, k, k, causal=True, seq_dim=1)
    traced = ts.graph.trace(ts.compile(grouped, mesh=mesh), q, k)
    [said] = traced.attention
    assert "test_context_parallel.py:" in said and \
        "sequence gathered over 'cp' (every rank attends over the whole sequence)" in said
    assert "all_gather" in {c.op for c in traced.collectives}
