"""tessera-bucket-collectives: fuse all-reduces that can wait for each other.

Every all_reduce costs a synchronization of its group and a message latency,
whatever its size; a training step all-reduces one gradient per parameter.
This pass groups all_reduces of one kind (axis, reduction, deterministic,
element type) whose operands all exist before any of their results is first
used, and replaces each group by one all_reduce of the concatenated values
(flattened), sliced apart afterwards:

    %a' = all_reduce %a    %b' = all_reduce %b      (both used later)
      ->  %c = concat(reshape %a, reshape %b); %r = all_reduce %c;
          %a' = reshape(slice %r), %b' = reshape(slice %r)

A group never includes an all_reduce whose operand depends on another's
result (its operand would not exist yet), so the order of computation is
kept. Elementwise reductions commute with concatenation, and a deterministic
tree is per element, so the results are the same bits. Groups are capped at
the `bucket-elements` option (default 2^24 elements, 64 MiB of float32).
Runs on partitioned functions (after tessera-partition), except pipelined
ones: their all_reduces belong to different ranks' stages until
tessera-pipeline-schedule has placed them, which then buckets them itself
(`ir.packing.bucket_all_reduces`, which this pass runs too), buckets within
one rank's stage action, the new ops in that action.
"""

from __future__ import annotations

from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.packing import bucket_all_reduces
from tessera_compiler.ir.support import functions, partitioned_all_reduces, run_reporting

def run(op, pass_, options: TargetOptions):
    def body():
        for f in list(functions(op)):
            if partitioned_all_reduces(f, "tessera-bucket-collectives"):
                bucket_all_reduces(f, options.bucket_elements)
    run_reporting(op, pass_, body)
