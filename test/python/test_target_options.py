"""TargetOptions: every knob that changes generated code, frozen, with a
digest that is the same in every process (the bundle cache key), and a text
form tessera-opt's pass options read and write."""

import dataclasses
import os
import subprocess
import sys

import pytest

import tessera as ts
from tessera_compiler.ir.options import OPTION_FIELDS, GemmConfig, TargetOptions

#: Another value for every field (the test below fails on a field without one).
OTHER = {"target": "gpu", "target_blocks": 7, "grouped_tile_order": False,
         "gemm_configs": (GemmConfig(64, 64, 32, (2, 2), 3),), "wgmma": False, "tma": False,
         "pingpong": True, "issue_ahead": True,
         "attention_forward_blocks": ((64, (128, 64)),),
         "attention_backward_blocks": ((64, (32, 32)),),
         "nvshmem_auto_max_bytes": 1 << 20, "register_budget": 128, "wait_watchdog_s": 5.0,
         "ranks_per_node": 8, "hierarchical_collectives": False,
         "elementwise_tile_elements": 1024, "bucket_elements": 1 << 16,
         "context_parallel": "ring"}


def test_every_field_changes_the_digest():
    """A new knob that the cache key ignored would reuse stale bundles."""
    base = TargetOptions()
    names = {f.name for f in dataclasses.fields(TargetOptions)}
    assert names == set(OTHER), f"give the new field a value in OTHER: {names ^ set(OTHER)}"
    digests = {base.digest()}
    for name, value in OTHER.items():
        changed = base.with_(**{name: value})
        assert changed != base and changed.digest() != base.digest(), name
        digests.add(changed.digest())
    assert len(digests) == len(OTHER) + 1


def test_digest_and_hash_are_the_same_in_another_process():
    """Python salts str hashes per process; the options' hash and digest
    are computed from their fields' text, so a bundle compiled in one
    process is found by another."""
    options = TargetOptions(target="gpu", wgmma=False, gemm_configs=OTHER["gemm_configs"])
    code = ("from tessera_compiler.ir.options import *; "
            "o = TargetOptions(target='gpu', wgmma=False, "
            "gemm_configs=(GemmConfig(64, 64, 32, (2, 2), 3),)); print(o.digest(), hash(o))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True).stdout.split()
    assert out == [options.digest(), str(hash(options))]


@pytest.mark.parametrize("name", sorted(OTHER))
def test_text_form_round_trips(name):
    """What tessera-opt --help prints for an option (`option_text`) reads back
    (`with_text`) as the same value, for the default and another value."""
    for options in (TargetOptions(), TargetOptions(**{name: OTHER[name]})):
        option = TargetOptions.option_name(name)
        assert option in OPTION_FIELDS
        text = options.option_text(name)
        if text == "unset":
            continue
        assert TargetOptions().with_text({option: text}) == TargetOptions().with_(
            **{name: getattr(options, name)}), (name, text)


def test_bad_values_name_the_option():
    with pytest.raises(ValueError, match="option 'target-blocks'"):
        TargetOptions().with_text({"target-blocks": "many"})
    with pytest.raises(ValueError, match="unknown option 'no-such'"):
        TargetOptions().with_text({"no-such": "1"})
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        TargetOptions(target="tpu")


def test_gemm_config_text_form():
    cfg = GemmConfig(128, 256, 64, (8, 1), 4, wgmma=True, tma=False, producer=False)
    assert str(cfg) == "128x256x64:w8x1:s4:wgmma:no-tma:no-producer"
    assert GemmConfig.parse(str(cfg)) == cfg
    assert GemmConfig.parse("32x32x16") == GemmConfig(32, 32, 16)


def test_jit_compiles_with_the_options_it_is_given():
    """ts.jit(target=TargetOptions(...)): the options reach tessera-lower-to-tile
    (here one GEMM configuration and row-major tile order), and
    graph.trace records them."""
    import numpy as np
    from tessera import op
    x = np.zeros((256, 128), np.float16)
    options = ts.TargetOptions(target="gpu", target_blocks=1, grouped_tile_order=False,
                               gemm_configs=(ts.GemmConfig(64, 64, 32, (2, 2), 3),))
    levels = ts.graph.trace(lambda a, b: op.matmul(a, b), x, x.T.copy(), target=options).levels
    assert levels.options == options and levels.target == "gpu"
    assert "ttile.tile_sizes = array<i64: 64, 64, 32>" in levels.tile
    assert "arith.addi" not in levels.tile.split("ttile.kernel")[1]   # no grouped order
