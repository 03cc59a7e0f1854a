"""One rank of the expert-parallel fuzz run (test_fuzz_distributed.py starts
it under mpiexec): random `op.moe` layers (tokens, width, hidden size,
experts, k, capacity or dropless, GELU or SwiGLU experts, forward or with
every gradient) with their experts split over an `ep` mesh of every rank,
each checked against the same layer on one device (float32 rounding: the
routing is the same float32 arithmetic) and the output against the float64
reference (`programs.moe_reference`) where no two router logits of a token
are near a tie. Hypothesis runs derandomized in every rank and each
verdict is agreed by all ranks, as in distributed_worker.py.

argv: EXAMPLES OUT_DIR. Rank 0 writes OUT_DIR/current.json (the layer
being run: a hang names it) and OUT_DIR/result.json."""

import json
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import oracles
from programs import moe_reference
import tessera as ts
from tessera import dist, op

examples, out = int(sys.argv[1]), Path(sys.argv[2])
comm = MPI.COMM_WORLD
mesh = dist.Mesh(axes=["ep"], shape=(comm.size,))
count = [0]


@st.composite
def layers(draw) -> dict:
    """Tokens and experts both split evenly over the ranks."""
    p = comm.size
    experts = p * draw(st.integers(1, 3))
    return {"T": p * draw(st.integers(1, 6)), "D": draw(st.integers(1, 6)),
            "F": draw(st.integers(1, 5)), "E": experts,
            "k": draw(st.integers(1, min(experts, 3))),
            "capacity": draw(st.sampled_from([None, 0.5, 1.0])),
            "swiglu": draw(st.booleans()), "grad": draw(st.booleans()),
            "seed": draw(st.integers(0, 2 ** 16))}


def inputs(c: dict):
    rng = np.random.default_rng(c["seed"])           # the same on every rank
    T, D, F, E = c["T"], c["D"], c["F"], c["E"]
    ex = {"router": rng.standard_normal((D, E)),
          "w1": rng.standard_normal((E, D, F)) / np.sqrt(D),
          "w2": rng.standard_normal((E, F, D)) / np.sqrt(F)}
    if c["swiglu"]:
        ex["w3"] = rng.standard_normal((E, D, F)) / np.sqrt(D)
    x = rng.standard_normal((T, D))
    weights = rng.standard_normal((T, D))             # the loss: sum(y * weights)
    return (x.astype(np.float32), {n: w.astype(np.float32) for n, w in ex.items()},
            weights.astype(np.float32))


def layer(c: dict, on_mesh: bool):
    def step(x, ex, weights):
        y, aux = op.moe(x, experts=ex, k=c["k"], capacity_factor=c["capacity"],
                        return_aux=True, mesh=mesh if on_mesh else None)
        value = op.sum(op.mul(y, weights)) + 0.1 * aux["load_balance"]
        if c["grad"]:
            return y, value, ts.grad(value, [x, ex])
        return y, value
    return ts.jit(mesh=mesh)(step) if on_mesh else ts.jit(step)


def leaves(result) -> dict:
    y, value, *grads = result
    named = {"y": y, "loss": value}
    if grads:
        gx, gex = grads[0]
        named.update({"grad.x": gx, **{f"grad.{n}": g for n, g in gex.items()}})
    return {n: np.asarray(v, np.float64) for n, v in named.items()}


def near_tie(x, router, k: int) -> bool:
    """Whether a token's k-th and (k+1)-th router logits (float64) are close
    enough for float32 rounding to swap them (then the reference may route
    it elsewhere)."""
    logits = np.sort(x.astype(np.float64) @ router.astype(np.float64), axis=1)[:, ::-1]
    gaps = np.diff(-logits, axis=1)
    return bool(gaps.size) and float(gaps.min()) < 1e-4 * (1.0 + float(np.abs(logits).max()))


def check(c: dict) -> str | None:
    """What is wrong with layer `c` on the mesh, on this rank (None: nothing)."""
    x, ex, weights = inputs(c)
    try:
        many = leaves(layer(c, True)(x, ex, weights))
        one = leaves(layer(c, False)(x, ex, weights))
    except Exception as e:           # any error on a valid layer is a bug
        return f"{type(e).__name__}: {e}"
    for name in one:
        scale = 1.0 + float(np.abs(one[name]).max())
        err = float(np.abs(many[name] - one[name]).max())
        if not err <= 1e-5 * scale:
            return f"{name}: expert-parallel differs from one device by {err:.3g} (scale {scale:.3g})"
    if not near_tie(x, ex["router"], c["k"]):
        ref, _ = moe_reference(x, ex, c["k"], c["capacity"])
        scale = 1.0 + float(np.abs(ref).max())
        err = float(np.abs(many["y"] - ref).max())
        if not err <= 1e-4 * scale:
            return f"y: differs from the float64 reference by {err:.3g} (scale {scale:.3g})"
    return None


@settings(max_examples=examples, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(c=layers())
def test_expert_parallel(c):
    count[0] += 1
    if comm.rank == 0:
        (out / "current.json").write_text(json.dumps(c))
    oracles.agree(comm, check(c), f"the layer (ep = {comm.size}) ---\n{json.dumps(c)}")


oracles.run_and_report(test_expert_parallel, comm, out, count)
