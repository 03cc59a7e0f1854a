// RUN: tessera-opt %s --split-input-file --tessera-pipeline-schedule --verify-diagnostics | FileCheck %s

// Two stage calls (model.py:3 and :4) on the 2 ranks of "pp", two
// microbatches, forward only: each op is tagged with the rank and action
// that runs it, rank 0's forwards come first (1F1B), a transfer carries
// each activation to rank 1 at the start of the action that reads it, and
// the results, both rank 1's, are packed there (in its last action) into
// one broadcast from rank 1 and sliced apart on every rank.
// CHECK-LABEL: func.func @step
// CHECK-SAME: tsched.pipeline = {axis = "pp", costs = [{cost = 6.400000e+01 : f64, kind = "F", stage = 0 : i64}, {cost = 8.000000e+00 : f64, kind = "F", stage = 1 : i64}], microbatches = 2 : i64, overlap = true, ranks = 2 : i64, schedule = "1F1B", stages = 2 : i64}
// CHECK: %[[A0:.*]] = tgraph.matmul %arg1, %arg0 {tsched.action = {axis = "pp", chunk = 0 : i64, kind = "F", microbatch = 0 : i64, rank = 0 : i64, stage = 0 : i64}}
// CHECK: %[[A1:.*]] = tgraph.matmul %arg2, %arg0 {tsched.action = {{.*}}microbatch = 1 : i64, rank = 0 : i64
// CHECK: %[[T0:.*]] = tgraph.transfer %[[A0]] on @mesh["pp"] from 0 to 1 {tsched.action = {{.*}}microbatch = 0 : i64, rank = 1 : i64, stage = 1 : i64}
// CHECK: %[[B0:.*]] = tgraph.tanh %[[T0]] {tsched.action = {{.*}}rank = 1 : i64
// CHECK: %[[T1:.*]] = tgraph.transfer %[[A1]] on @mesh["pp"] from 0 to 1
// CHECK: %[[B1:.*]] = tgraph.tanh %[[T1]]
// CHECK: %[[F0:.*]] = tgraph.reshape %[[B0]] {tsched.action = {{.*}}microbatch = 1 : i64, rank = 1 : i64{{.*}}to tensor<8xf32>
// CHECK: %[[F1:.*]] = tgraph.reshape %[[B1]] {tsched.action = {{.*}}microbatch = 1 : i64, rank = 1 : i64
// CHECK: %[[P:.*]] = tgraph.concat %[[F0]], %[[F1]] dim 0 {tsched.action = {{.*}}rank = 1 : i64
// CHECK: %[[R:.*]] = tgraph.transfer %[[P]] on @mesh["pp"] from 1 : tensor<16xf32>
// CHECK: %[[S0:.*]] = tgraph.slice %[[R]] offsets [0] : tensor<16xf32> -> tensor<8xf32>
// CHECK: %[[R0:.*]] = tgraph.reshape %[[S0]] : tensor<8xf32> to tensor<2x4xf32>
// CHECK: %[[S1:.*]] = tgraph.slice %[[R]] offsets [8]
// CHECK: %[[R1:.*]] = tgraph.reshape %[[S1]]
// CHECK: return %[[R0]], %[[R1]]
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @step(%w0: tensor<4x4xf32>, %x0: tensor<2x4xf32>, %x1: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {tgraph.partitioned, tgraph.pipeline = {axis = "pp", schedule = "1F1B", microbatches = 2 : i64, stages = 2 : i64}} {
  %a0 = tgraph.matmul %x0, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %b0 = tgraph.tanh %a0 : tensor<2x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %a1 = tgraph.matmul %x1, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=1"("model.py":3:0))
  %b1 = tgraph.tanh %a1 : tensor<2x4xf32> loc("tessera.pipeline:stage=1:microbatch=1"("model.py":4:0))
  return %b0, %b1 : tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

// A result made early on rank 0 (its first microbatch's activation) is
// broadcast right after the action that makes it, while rank 1 still
// computes, not after the last action; a single result is not packed.
// CHECK-LABEL: func.func @early_result
// CHECK: %[[A0:.*]] = tgraph.matmul %arg1, %arg0 {tsched.action = {{.*}}microbatch = 0 : i64, rank = 0 : i64
// CHECK-NEXT: %[[E:.*]] = tgraph.transfer %[[A0]] on @mesh["pp"] from 0 : tensor<2x4xf32>
// CHECK-NEXT: tgraph.matmul %arg2, %arg0 {tsched.action = {{.*}}microbatch = 1 : i64, rank = 0 : i64
// CHECK: tgraph.concat
// CHECK: return %[[E]],
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @early_result(%w0: tensor<4x4xf32>, %x0: tensor<2x4xf32>, %x1: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) attributes {tgraph.partitioned, tgraph.pipeline = {axis = "pp", schedule = "gpipe", microbatches = 2 : i64, stages = 2 : i64}} {
  %a0 = tgraph.matmul %x0, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %b0 = tgraph.tanh %a0 : tensor<2x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %a1 = tgraph.matmul %x1, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=1"("model.py":3:0))
  %b1 = tgraph.tanh %a1 : tensor<2x4xf32> loc("tessera.pipeline:stage=1:microbatch=1"("model.py":4:0))
  return %a0, %b0, %b1 : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

// Two values made in one action (%a before %c) and read by the next stage in
// the other order: rank 0 sends them as they are made (a send follows its
// producer), so rank 1 receives %a's transfer first, whatever reads first.
// CHECK-LABEL: func.func @two_crossing
// CHECK: %[[A:.*]] = tgraph.matmul
// CHECK: %[[C:.*]] = tgraph.tanh %arg1
// CHECK: tgraph.transfer %[[A]] on @mesh["pp"] from 0 to 1
// CHECK-NEXT: tgraph.transfer %[[C]] on @mesh["pp"] from 0 to 1
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @two_crossing(%w0: tensor<4x8xf32>, %x0: tensor<2x4xf32>) -> tensor<2x8xf32> attributes {tgraph.partitioned, tgraph.pipeline = {axis = "pp", schedule = "1F1B", microbatches = 1 : i64, stages = 2 : i64}} {
  %a = tgraph.matmul %x0, %w0 : tensor<2x4xf32>, tensor<4x8xf32> -> tensor<2x8xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %c = tgraph.tanh %x0 : tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %d = tgraph.concat %c, %c dim 1 : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x8xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %e = tgraph.add %d, %a : tensor<2x8xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  return %e : tensor<2x8xf32>
}

// -----

// On a dp x pp mesh, the dp all_reduces of the gradients one rank makes
// (here rank 1's two, in its action) are bucketed into one all_reduce on
// that rank, as tessera-bucket-collectives does outside pipelines, and the
// bucket is what the broadcast of rank 1's results sends (no unpacking and
// packing again); rank 0's single one stays as it is.
// CHECK-LABEL: func.func @dp_buckets
// CHECK: %[[G0:.*]] = tgraph.all_reduce <sum> %{{.*}} on @mesh["dp"] {tsched.action = {{.*}}rank = 0 : i64{{.*}} : tensor<4x4xf32>
// CHECK: %[[C:.*]] = tgraph.concat %{{.*}}, %{{.*}} dim 0 {tsched.action = {{.*}}rank = 1 : i64
// CHECK-NEXT: %[[R:.*]] = tgraph.all_reduce <sum> %[[C]] on @mesh["dp"] {tsched.action = {{.*}}rank = 1 : i64{{.*}} : tensor<32xf32>
// CHECK-NEXT: %[[B:.*]] = tgraph.transfer %[[R]] on @mesh["pp"] from 1 : tensor<32xf32>
// CHECK-NOT: tgraph.all_reduce
// CHECK-NOT: tgraph.concat
// CHECK: %[[S:.*]] = tgraph.slice %[[B]] offsets [0]
// CHECK: return
tgraph.mesh @mesh axes = ["dp", "pp"] shape = [2, 2]
func.func @dp_buckets(%w0: tensor<4x4xf32>, %w1: tensor<4x4xf32>, %x0: tensor<2x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) attributes {tgraph.partitioned, tgraph.pipeline = {axis = "pp", schedule = "1F1B", microbatches = 1 : i64, stages = 2 : i64}} {
  %a0 = tgraph.matmul %x0, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %g0 = tgraph.mul %w0, %w0 : tensor<4x4xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %s0 = tgraph.all_reduce <sum> %g0 on @mesh["dp"] : tensor<4x4xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %b0 = tgraph.matmul %a0, %w1 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %g1 = tgraph.mul %w1, %w1 : tensor<4x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %g2 = tgraph.add %w1, %w1 : tensor<4x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %s1 = tgraph.all_reduce <sum> %g1 on @mesh["dp"] : tensor<4x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %s2 = tgraph.all_reduce <sum> %g2 on @mesh["dp"] : tensor<4x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  return %s0, %s1, %s2 : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [2]
// expected-error @below {{run tessera-partition before tessera-pipeline-schedule}}
func.func @unpartitioned(%x: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {tgraph.pipeline = {axis = "pp", schedule = "1F1B", microbatches = 1 : i64, stages = 2 : i64}} {
  return %x : tensor<2x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [2]
// expected-error @below {{the step makes 3 stage calls, which do not split evenly over the 2 ranks of axis 'pp'}}
func.func @uneven(%x: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {tgraph.partitioned, tgraph.pipeline = {axis = "pp", schedule = "1F1B", microbatches = 1 : i64, stages = 3 : i64}} {
  return %x : tensor<2x4xf32>
}

// -----

// results = "stage": a result made on one rank stays there, its result
// attributes saying which (%b, the stage-1 sum of the microbatches, on rank
// 1; no broadcast), and a single value (%s, a loss) still reaches every
// rank. An op no stage owns goes to the rank holding most of its operands'
// elements: %e reads %b (8 elements, rank 1) and %w0 (16, the parameter
// that stage 0 reads on rank 0), so it runs on rank 0, in its end action
// (kind E, after all its pipeline work), %b received there.
// CHECK-LABEL: func.func @stage_results
// CHECK-SAME: -> (tensor<2x4xf32> {tsched.held = {axis = "pp", rank = 0 : i64}}, tensor<2x4xf32> {tsched.held = {axis = "pp", rank = 1 : i64}}, tensor<1x1xf32>)
// CHECK: %[[S:.*]] = tgraph.transfer %{{.*}} on @mesh["pp"] from 1 : tensor<1x1xf32>
// CHECK: %[[B:.*]] = tgraph.add {{.*}}rank = 1 : i64
// CHECK: %[[T:.*]] = tgraph.transfer %[[B]] on @mesh["pp"] from 1 to 0 {tsched.action = {axis = "pp", chunk = 0 : i64, kind = "E", microbatch = -1 : i64, rank = 0 : i64, stage = 0 : i64}}
// CHECK: %[[E:.*]] = tgraph.matmul %[[T]], %arg0 {tsched.action = {{.*}}kind = "E"{{.*}}rank = 0 : i64
// CHECK: return %[[E]], %[[B]], %[[S]]
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @stage_results(%w0: tensor<4x4xf32>, %x0: tensor<2x4xf32>, %x1: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<1x1xf32>) attributes {tgraph.partitioned, tgraph.pipeline = {axis = "pp", schedule = "1F1B", microbatches = 2 : i64, stages = 2 : i64, results = "stage"}} {
  %a0 = tgraph.matmul %x0, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=0"("model.py":3:0))
  %b0 = tgraph.tanh %a0 : tensor<2x4xf32> loc("tessera.pipeline:stage=1:microbatch=0"("model.py":4:0))
  %a1 = tgraph.matmul %x1, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("tessera.pipeline:stage=0:microbatch=1"("model.py":3:0))
  %b1 = tgraph.tanh %a1 : tensor<2x4xf32> loc("tessera.pipeline:stage=1:microbatch=1"("model.py":4:0))
  %b = tgraph.add %b0, %b1 : tensor<2x4xf32> loc("model.py":6:0)
  %e = tgraph.matmul %b, %w0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32> loc("model.py":7:0)
  %s = tgraph.reduce <sum> %b0 dims [0, 1] : tensor<2x4xf32> -> tensor<1x1xf32> loc("model.py":8:0)
  return %e, %b, %s : tensor<2x4xf32>, tensor<2x4xf32>, tensor<1x1xf32>
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [2]
// expected-error @below {{tgraph.pipeline: results = "nowhere" must be "every" (every rank receives every result) or "stage"}}
func.func @unknown_results(%x: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {tgraph.partitioned, tgraph.pipeline = {axis = "pp", schedule = "1F1B", microbatches = 1 : i64, stages = 2 : i64, results = "nowhere"}} {
  return %x : tensor<2x4xf32>
}
