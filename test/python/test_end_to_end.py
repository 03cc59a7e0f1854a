"""The tensor-parallel MLP compiled by tessera.compile and run as 2 MPI ranks."""

import json

import numpy as np
import pytest

from pathlib import Path

WORKERS = Path(__file__).resolve().parent / "workers"
REPO = Path(__file__).resolve().parents[2]


def _results(proc, out_dir):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("result.rank*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1], proc.stdout + proc.stderr
    return results


@pytest.mark.parametrize("shape", [(8, 16, 32), (64, 128, 256), (6, 10, 50)])
def test_tp_mlp_matches_numpy_on_two_ranks(run_mpi, shape, tmp_path):
    seed = int(np.random.SeedSequence().entropy % 2**31)   # fresh inputs every run
    results = _results(run_mpi(2, WORKERS / "mlp_worker.py", seed, *shape, tmp_path), tmp_path)
    batch, d_model, d_ff = shape
    for r in results:
        assert r["ok"], f"seed {seed}: max error {r['max_err']}"
        assert r["local_w1"] == [d_model, d_ff // 2]       # column-split
        assert r["local_w2"] == [d_ff // 2, d_model]       # row-split
        assert r["y_shape"] == [batch, d_model] and r["y_local"] == [batch, d_model]
        assert r["repeat_identical"]


def test_two_dimensional_mesh_on_four_ranks(run_mpi, tmp_path):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    proc = run_mpi(4, WORKERS / "mesh2d_worker.py", seed, tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result.rank*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    for r in results:
        assert r["ok"], f"seed {seed}, rank {r['rank']}"
        assert r["swaps_exact"], f"seed {seed}, rank {r['rank']}: send/recv on dp x tp"
        # Grouped-query attention split over dp (batch) and tp (heads) needs
        # no collective: each rank's query heads read its own key/value head.
        # (With dropout too: each rank draws its heads' rows of the global mask.)
        assert r["attention_ok"], f"seed {seed}, rank {r['rank']}: GQA attention on dp x tp"
        assert r["attention_gathers"] == 0
        # Multi-query heads over tp: dk and dv summed over the ranks' heads.
        assert r["mqa_ok"], f"seed {seed}, rank {r['rank']}: MQA gradients over tp"
        # Dropout split over dp x tp draws the single-process mask, with no gather.
        assert r["dropout_ok"] == [True, True, True], r["dropout_ok"]
        assert r["dropout_gathers"] == 0
        # The tiny Llama read per rank over tp = 2: HF's logits, and each rank
        # holds half of every projection (q_proj [32, 32] -> [16, 32]).
        assert r["hf_logits_gap"] <= 5e-5, r["hf_logits_gap"]
        assert r["hf_q_local"] == [16, 32]
        held, everything = r["hf_bytes"]
        assert held < 0.6 * everything, r["hf_bytes"]
        assert r["hf_generate"] is True, r["hf_generate"]      # tensor-parallel decode: HF's
        # its KV caches split by key/value heads over tp: [B, 64, 2, 8] -> [., ., 1, 8]
        (whole, local), batch = r["cache_local"], r["cache_local"][0][0]
        assert whole == [batch, 64, 2, 8] and local == [batch, 64, 1, 8], r["cache_local"]
        # Mixtral over ep x tp: each rank read 2 of the 4 experts; HF's logits.
        assert r["moe_logits_gap"] <= 5e-5, r["moe_logits_gap"]
        assert r["moe_local"] == [[4, 80, 32], [2, 80, 32]], r["moe_local"]
        # The layers split over pp (x tp, x ep): each rank read its stage's
        # layers only (its tp block), a pipeline gives HF's logits, and what
        # needs every layer on every rank is refused, naming where it is.
        assert max(r["pp_gaps"].values()) <= 5e-5, r["pp_gaps"]
        held, everything = r["pp_held"]
        assert held < 0.35 * everything, r["pp_held"]
        stage = r["rank"] // 2
        assert r["pp_q"][stage] == "ndarray[16, 32]", r["pp_q"]
        assert r["pp_q"][1 - stage] == "Absent[16, 32]", r["pp_q"]
        numpy_, generate, unpipelined = r["pp_refusals"]
        assert numpy_.startswith("ShardingError") and "held by the ranks at pp = 1" in numpy_
        assert generate.startswith("ArgumentError") and "split over the 2 ranks of 'pp'" in \
            generate
        assert unpipelined.startswith("ShardingError") and "is not pipelined over 'pp'" in \
            unpipelined
        # Context parallelism (the sequence split over cp, and batch x sequence
        # over dp x cp): grouped-query causal attention over packed documents
        # with dropout, forward and gradients, equal float64's with the global
        # sequence's dropout mask. All-to-alls trade the sequence split for a
        # head split (Ulysses) and back; none moves more than one rank's block
        # of q, and nothing gathers K or V (only the int32 document ids) but
        # multi-query attention's one head (its dk, dv reduce-scattered back).
        # Two grouped key/value heads over 4 ranks ("cp, ring"): the sequence
        # stays split and K/V blocks go around the ring (ring_shift), each
        # moving one rank's block; the causal work is striped by all-to-alls.
        assert sorted(r["cp_runs"]) == ["cp", "cp, multi-query", "cp, ring", "dp x cp"]
        for plan, run in r["cp_runs"].items():
            what = f"seed {seed}, rank {r['rank']}, {plan}"
            assert run["ok"], what
            said = run["attention"]                     # forward(s) and backward
            assert "attention over a split sequence:" in run["inspected"]     # dist.inspect
            assert all(a in run["inspected"] for a in said), run["inspected"]
            most = run["most_bytes"]
            if plan.endswith("ring"):
                assert len(said) >= 2 and all("kept split over 'cp': ring" in a and "striped" in a
                                              for a in said), said
                assert set(most) <= {"all_to_all", "ring_shift", "axis_slice", "all_reduce"}, \
                    (what, most)
                assert most["ring_shift"] <= run["k_block_bytes"], (what, run)
                assert most["all_to_all"] <= 4 * run["k_block_bytes"], (what, run)
                continue
            assert len(said) >= 2 and all("(all-to-all, Ulysses)" in a for a in said), said
            assert set(most) <= {"all_to_all", "all_gather", "all_reduce", "axis_slice",
                                 "reduce_scatter"}, (what, most)
            q_block = 2 * run["k_block_bytes"] * (4 if plan.endswith("multi-query") else 1)
            assert most["all_to_all"] <= q_block, (what, run)
            if plan.endswith("multi-query"):
                assert all(a.endswith("K and V gathered (one head)") for a in said), said
                assert most["reduce_scatter"] <= run["k_block_bytes"] * 4, (what, run)
            else:
                assert most.get("all_gather", 0) <= run["segment_bytes"], (what, run)
                assert "reduce_scatter" not in most, (what, run)
        assert r["x_local"] == [4, 12]
        # The partial sum over tp is reduced on tp; the rows stay split over dp
        # (a result keeps the layout it is computed in).
        assert r["collectives"] == ['tgraph.all_reduce <sum> @mesh["tp"]'], r["collectives"]
        assert r["y_local"] == [4, 12], r["y_layout"]


def test_indivisible_dimension_fails_on_every_rank_without_hanging(run_mpi):
    proc = run_mpi(2, WORKERS / "indivisible_worker.py", timeout=60)
    assert proc.returncode != 0
    message = "W1: dimension 1 (size 15) is not divisible by mesh axis 'tp' (size 2)"
    # Raised on both ranks, printed once by rank 0 with the ranks listed.
    assert proc.stderr.count(message) == 1, proc.stderr
    assert "[tessera] ranks 0, 1 failed with this error; aborting all ranks" in proc.stderr
    assert "indivisible_worker.py:9" in proc.stderr          # the user's source line
    assert "unreachable" not in proc.stdout


def test_bundle_runs_with_only_the_runtime(run_mpi, tmp_path):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    _results(run_mpi(2, WORKERS / "mlp_worker.py", seed, 8, 16, 32, tmp_path, tmp_path), tmp_path)
    bundle = tmp_path / "mlp.tsb"
    assert (bundle / "manifest.json").exists() and (bundle / "kernels" / "libkernels.so").exists()
    assert "pickle" not in (bundle / "program.json").read_text()
    proc = run_mpi(2, WORKERS / "block_compiler.py", bundle, "--inputs",
                   tmp_path / "x.npy", tmp_path / "w1.npy", tmp_path / "w2.npy",
                   "--out", tmp_path / "y.npy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("RUNTIME-ONLY-OK") == 2
    y, ref = np.load(tmp_path / "y.npy"), np.load(tmp_path / "ref.npy")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_readme_example_via_tessera_launch(tmp_path):
    import os
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "tessera", "launch", "-n", "2",
                           str(REPO / "examples" / "tp_mlp.py")],
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TESSERA_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("-> OK") == 2
    assert 'tgraph.all_reduce <sum>' in proc.stdout
