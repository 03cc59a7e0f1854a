"""Differential fuzzing on one rank: random programs (programs.py) against
float64 numpy, and their gradients against finite differences of it. A
failure prints the minimal program hypothesis shrank it to, as a script
that runs it. TESSERA_FUZZ_EXAMPLES=N runs N programs per test from a fresh
seed (see docs/testing.md)."""

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, note, strategies as st

import oracles
import programs

_names = itertools.count()


def _failure(p, seed, what) -> str:
    return f"{what}\n--- the program, as a script ---\n{p.source(seed)}"


def _run(p, arrays, tmp_path_factory):
    filename = str(tmp_path_factory.getbasetemp() / f"fuzz_program_{next(_names)}.py")
    return oracles.run(p, arrays, filename)


def _check_forward(p, seed, tmp_path_factory):
    """The program compiles, runs, and matches numpy within its tolerance."""
    arrays = p.draw_inputs(seed)
    note(p.source(seed))
    try:
        got = _run(p, arrays, tmp_path_factory)
    except Exception as e:                    # any error on a valid program is a bug
        raise AssertionError(_failure(p, seed, f"{type(e).__name__}: {e}")) from None
    wrong = oracles.judge_forward(p, arrays, got)
    assert wrong is None, _failure(p, seed, wrong)


def _check_gradient(p, seed, tmp_path_factory):
    """Its gradients match finite differences; a ts.remat region keeps their bits."""
    arrays = p.draw_inputs(seed)
    note(p.source(seed))
    try:
        got = _run(p, arrays, tmp_path_factory)
    except Exception as e:
        raise AssertionError(_failure(p, seed, f"{type(e).__name__}: {e}")) from None
    wrong = oracles.judge_gradient(p, arrays, got)
    assert wrong is None, _failure(p, seed, wrong)
    if p.remat is not None:
        # Recomputation repeats the same kernels: the same bits as without it.
        plain = _run(dataclasses.replace(p, remat=None), arrays, tmp_path_factory)
        for a, b in zip(got, plain):
            a, b = np.ascontiguousarray(np.asarray(a)), np.ascontiguousarray(np.asarray(b))
            assert a.tobytes() == b.tobytes(), _failure(
                p, seed, f"ts.remat{p.remat} changed the gradients' bits")


@oracles.fuzz_settings(examples=75)
@given(p=programs.programs())
def test_random_programs_match_float64_numpy(p, tmp_path_factory):
    """Elementwise ops with broadcasting, reductions (dim=, axis=, keepdim),
    reshape, transpose, slices, concat, split, matmul of ranks 1-4, softmax,
    norms, cross-entropy and bf16 casts, zero-size dimensions included:
    every program compiles, runs, and matches numpy within the documented
    tolerance, with the dtypes numpy's rules (and Tessera's fp32 norms) give."""
    _check_forward(p, 0, tmp_path_factory)


@oracles.fuzz_settings(examples=40)
@given(p=programs.gradient_programs())
def test_random_gradients_match_finite_differences(p, tmp_path_factory):
    """ts.grad of sum(result * weight) by a random subset of a random
    program's inputs matches central differences of the float64 numpy
    reference wherever the loss is differentiable (one-sided differences
    agree); with some steps in a ts.remat region (random policy), its
    gradients are also the same bits as without the region."""
    _check_gradient(p, 1, tmp_path_factory)


# tessera-fold-slices' pattern, in most programs: q, k and v at indices of one
# dimension of one tensor (op.transformer_block's qkv projection), so the
# attention kernels read them, and write their gradients, in place.
ONE_TENSOR_ATTENTION = (programs._attention_of_one_tensor, programs._binary)


@oracles.fuzz_settings(examples=12)
@given(p=programs.programs(max_steps=4, steps=ONE_TENSOR_ATTENTION, min_rank=3))
def test_attention_over_slices_of_one_tensor_matches_float64_numpy(p, tmp_path_factory):
    _check_forward(p, 2, tmp_path_factory)


@oracles.fuzz_settings(examples=12)
@given(p=programs.gradient_programs(max_steps=4, steps=ONE_TENSOR_ATTENTION))
def test_attention_over_slices_of_one_tensor_matches_finite_differences(p, tmp_path_factory):
    _check_gradient(p, 3, tmp_path_factory)


# Value checks: a cross-entropy's targets, one of them out of range, in
# programs of a few other steps.
CHECKED = (programs._cross_entropy, programs._unary, programs._binary, programs._matmul)


@oracles.fuzz_settings(examples=8)
@given(p=programs.programs(max_steps=4, steps=CHECKED, min_rank=2), data=st.data())
def test_a_target_out_of_range_fails_the_step_naming_its_row(p, data, tmp_path_factory):
    """One target outside [0, V) that is not the ignore_index, in a
    cross-entropy the results depend on: the step raises ts.ValueCheckError
    naming that row of the targets, the target and V (the check, like the
    step, runs where the targets are)."""
    import tessera as ts
    live = programs.live_values(p)
    targets = [v for v in p.inputs if v.dtype == "i32" and v.name in live and v.shape[0]]
    assume(targets)
    t = data.draw(st.sampled_from(targets))
    classes = int(t.bound)
    row = data.draw(st.integers(0, t.shape[0] - 1))
    value = data.draw(st.sampled_from([classes, -1, -5, classes + 1000, 2**31 - 1]))
    arrays = p.draw_inputs(4)
    arrays[t.name][row] = value
    note(f"{p.source(4)}\n{t.name}[{row}] = {value}")
    with pytest.raises(ts.ValueCheckError) as err:
        _run(p, arrays, tmp_path_factory)
    e = err.value
    assert (e.row, e.value, e.high) == (row, value, classes), str(e)
    assert f"target {value} in row {row} is out of range for {classes} classes" in str(e)
