// RUN: tessera-opt %s --split-input-file --tessera-propagate-sharding --verify-diagnostics | FileCheck %s

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Column-parallel then row-parallel: the second matmul's result is a partial sum.
// CHECK-LABEL: func.func @mlp
func.func @mlp(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []]>},
               %w1: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
               %w2: tensor<32x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<8x16xf32> {
  // CHECK: tgraph.matmul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["tp"]]>}
  %0 = tgraph.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  // CHECK: tgraph.relu {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["tp"]]>}
  %1 = tgraph.relu %0 : tensor<8x32xf32>
  // CHECK: tgraph.matmul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []], partial = ["tp"]>}
  %2 = tgraph.matmul %1, %w2 : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Arguments without a sharding are replicated; batch rows follow the lhs, a
// linear add of two partial sums stays partial, relu needs the full value.
// CHECK-LABEL: func.func @mesh2d
func.func @mesh2d(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>},
                  %w: tensor<16x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                  %v: tensor<16x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                  %r: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // CHECK: tgraph.matmul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []], partial = ["tp"]>}
  %0 = tgraph.matmul %x, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  %1 = tgraph.matmul %x, %v : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  // CHECK: tgraph.add {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []], partial = ["tp"]>}
  %2 = tgraph.add %0, %1 : tensor<8x4xf32>
  // CHECK: tgraph.relu {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []]>}
  %3 = tgraph.relu %2 : tensor<8x4xf32>
  // Operands that disagree (rows split vs replicated) meet at the split layout:
  // the replicated one is sliced locally, which costs no communication.
  // CHECK: tgraph.add {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []]>}
  %4 = tgraph.add %3, %r : tensor<8x4xf32>
  return %4 : tensor<8x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// tgraph.shard pins a value's sharding.
// CHECK-LABEL: func.func @pinned
func.func @pinned(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // CHECK: tgraph.shard {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"tp"], []]>}
  %0 = tgraph.shard %x : tensor<8x16xf32> to #tgraph.sharding<@mesh, [["tp"], []]>
  // CHECK: tgraph.relu {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"tp"], []]>}
  %1 = tgraph.relu %0 : tensor<8x16xf32>
  return %1 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Reductions: a sum over a split dimension is a pending partial sum; a max over
// one is not (it is all-reduced at once), so its result is replicated there.
// CHECK-LABEL: func.func @reductions
func.func @reductions(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>}) -> tensor<8x1xf32> {
  // CHECK: tgraph.reduce <sum> {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []], partial = ["tp"]>}
  %0 = tgraph.reduce <sum> %x dims [1] : tensor<8x16xf32> -> tensor<8x1xf32>
  // CHECK: tgraph.reduce <max> {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []]>}
  %1 = tgraph.reduce <max> %x dims [1] : tensor<8x16xf32> -> tensor<8x1xf32>
  // CHECK: tgraph.reduce <sum> {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []], partial = ["dp", "tp"]>}
  %2 = tgraph.reduce <sum> %x dims [0, 1] : tensor<8x16xf32> -> tensor<1x1xf32>
  %3 = tgraph.add %0, %1 : tensor<8x1xf32>
  return %3 : tensor<8x1xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Shape ops: broadcast keeps splits of dimensions it does not repeat; reshape
// moves a split to the outermost dimension of a merged or split group; transpose
// permutes; slice and pad replicate the dimensions they cut or grow.
// CHECK-LABEL: func.func @shapes
func.func @shapes(%x: tensor<8x1x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], [], ["tp"]]>}) -> tensor<8x4x2xf32> {
  // CHECK: tgraph.broadcast {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], [], ["tp"]]>}
  %0 = tgraph.broadcast %x : tensor<8x1x16xf32> to tensor<8x4x16xf32>
  // [8, 4, 16] -> [8, 4, 4, 4]: the 16 (split over tp) becomes 4 x 4, the split goes on the first 4.
  // CHECK: tgraph.reshape {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], [], ["tp"], []]>}
  %1 = tgraph.reshape %0 : tensor<8x4x16xf32> to tensor<8x4x4x4xf32>
  // CHECK: tgraph.transpose {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["tp"], ["dp"], []]>}
  %2 = tgraph.transpose %1 perm [3, 2, 0, 1] : tensor<8x4x4x4xf32> -> tensor<4x4x8x4xf32>
  // CHECK: tgraph.slice {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], [], ["dp"], []]>}
  %3 = tgraph.slice %2 offsets [0, 1, 0, 0] : tensor<4x4x8x4xf32> -> tensor<4x2x8x4xf32>
  // [4, 2, 8, 4] -> [8, 4, 8]: the merged 4 x 2 is not split; 8 keeps dp.
  // CHECK: tgraph.reshape {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["dp"], []]>}
  %4 = tgraph.reshape %3 : tensor<4x2x8x4xf32> to tensor<8x8x4xf32>
  %5 = tgraph.slice %4 offsets [0, 0, 0] : tensor<8x8x4xf32> -> tensor<8x4x2xf32>
  // pad grows dimension 2, which is replicated there.
  // CHECK: tgraph.pad {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], [], []]>}
  %6 = tgraph.pad %5 offsets [0, 0, 1] : tensor<8x4x2xf32> -> tensor<8x4x4xf32>
  %7 = tgraph.slice %6 offsets [0, 0, 0] : tensor<8x4x4xf32> -> tensor<8x4x2xf32>
  return %7 : tensor<8x4x2xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// concat: the concatenated dimension is replicated, the others take the most
// split operand's layout; pad keeps splits of the dimensions it does not grow.
// CHECK-LABEL: func.func @concat_pad
func.func @concat_pad(%a: tensor<8x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>},
                      %b: tensor<8x2xf32>) -> tensor<8x8xf32> {
  // CHECK: tgraph.concat {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []]>}
  %0 = tgraph.concat %a, %b dim 1 : tensor<8x4xf32>, tensor<8x2xf32> -> tensor<8x6xf32>
  // CHECK: tgraph.pad {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []]>}
  %1 = tgraph.pad %0 offsets [0, 1] : tensor<8x6xf32> -> tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Vocab-parallel embedding: a table split by rows gives a partial sum over the
// row axis; the indices' batch split carries over. Its gradient (scatter_add
// of batch-split updates) is a partial sum over the batch axis.
// CHECK-LABEL: func.func @embedding
func.func @embedding(%table: tensor<12x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                     %ids: tensor<6xi32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"]]>},
                     %upd: tensor<6x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], []]>}) -> tensor<12x8xf32> {
  // CHECK: tgraph.gather {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []], partial = ["tp"]>}
  %0 = tgraph.gather %table[%ids] : tensor<12x8xf32>, tensor<6xi32> -> tensor<6x8xf32>
  // CHECK: tgraph.scatter_add {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []], partial = ["dp"]>}
  %1 = tgraph.scatter_add %upd[%ids] : tensor<6x8xf32>, tensor<6xi32> -> tensor<12x8xf32>
  return %1 : tensor<12x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Linear in one argument: x * c and x / c keep a pending sum; x * x does not.
// In deterministic mode only add/sub/neg (and data movement) keep one.
// CHECK-LABEL: func.func @linearity
func.func @linearity(%x: tensor<4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                     %w: tensor<8x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                     %c: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
  // CHECK: tgraph.mul {{.*}} partial = ["tp"]
  %1 = tgraph.mul %0, %c : tensor<4x4xf32>
  // CHECK: tgraph.div {{.*}} partial = ["tp"]
  %2 = tgraph.div %1, %c : tensor<4x4xf32>
  // CHECK: tgraph.mul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []]>}
  %3 = tgraph.mul %2, %2 : tensor<4x4xf32>
  return %3 : tensor<4x4xf32>
}
// A pending sum read by two ops (here twice by one) is reduced before its
// readers, as tessera-partition does: the add sees full values.
// CHECK-LABEL: func.func @fan_out
func.func @fan_out(%x: tensor<4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                   %w: tensor<8x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<4x4xf32> {
  %0 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
  // CHECK: tgraph.add {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []]>}
  %1 = tgraph.add %0, %0 : tensor<4x4xf32>
  return %1 : tensor<4x4xf32>
}
// CHECK-LABEL: func.func @linearity_deterministic
func.func @linearity_deterministic(%x: tensor<4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                     %w: tensor<8x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                     %v: tensor<8x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                     %c: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {tgraph.deterministic} {
  %0 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
  %p = tgraph.matmul %x, %v : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
  // CHECK: tgraph.add {{.*}} partial = ["tp"]
  %1 = tgraph.add %0, %p : tensor<4x4xf32>
  // CHECK: tgraph.mul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []]>}
  %2 = tgraph.mul %1, %c : tensor<4x4xf32>
  return %2 : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @early_collective(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'tgraph.all_reduce' is a per-rank collective and appears only after tessera-partition}}
  %0 = tgraph.all_reduce <sum> %x on @mesh["tp"] : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @unknown_op(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'arith.addf' has no sharding rule: only tgraph ops can be distributed}}
  %0 = arith.addf %x, %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tgraph.mesh @a axes = ["tp"] shape = [2]
tgraph.mesh @b axes = ["tp"] shape = [2]
// expected-error @+1 {{function uses several meshes (a, b)}}
func.func @two_meshes(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@a, [[], []]>},
                      %y: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@b, [[], []]>}) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Attention keeps batch (dp) and head (tp) splits; a split sequence is
// gathered (every rank attends over whole sequences). Both results share
// the sharding.
// CHECK-LABEL: func.func @attention
func.func @attention(%q: tensor<2x4x8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"], [], []]>},
                     %k: tensor<2x4x8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], [], ["tp"], []]>}) -> tensor<2x4x8x16xf32> {
  // CHECK: tgraph.attention {{.*}} {scale = 2.500000e-01 : f64, tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], ["tp"], [], []]>}
  %o:2 = tgraph.attention %q, %k, %k {scale = 0.25 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32> -> tensor<2x4x8x16xf32>, tensor<2x4x8x1xf32>
  return %o#0 : tensor<2x4x8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Grouped heads (8 query heads over 2 key/value heads) split over tp = 2:
// each rank's 4 query heads read its own key/value head.
// CHECK-LABEL: func.func @attention_grouped_heads
func.func @attention_grouped_heads(%q: tensor<2x8x16x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"], [], []]>},
                                   %k: tensor<2x2x16x16xf32>) -> tensor<2x8x16x16xf32> {
  // CHECK: tgraph.attention {{.*}} {causal, scale = 2.500000e-01 : f64, tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["tp"], [], []]>}
  %o:2 = tgraph.attention %q, %k, %k {causal, scale = 0.25 : f64} : tensor<2x8x16x16xf32>, tensor<2x2x16x16xf32>, tensor<2x2x16x16xf32> -> tensor<2x8x16x16xf32>, tensor<2x8x16x1xf32>
  return %o#0 : tensor<2x8x16x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
// tp = 4 does not divide the 2 key/value heads: a rank's 2 query heads
// would read half a group, so the heads are gathered (q's too).
// CHECK-LABEL: func.func @attention_grouped_heads_gathered
func.func @attention_grouped_heads_gathered(%q: tensor<2x8x16x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"], [], []]>},
                                            %k: tensor<2x2x16x16xf32>) -> tensor<2x8x16x16xf32> {
  // CHECK: tgraph.attention {{.*}} {causal, scale = 2.500000e-01 : f64, tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], [], [], []]>}
  %o:2 = tgraph.attention %q, %k, %k {causal, scale = 0.25 : f64} : tensor<2x8x16x16xf32>, tensor<2x2x16x16xf32>, tensor<2x2x16x16xf32> -> tensor<2x8x16x16xf32>, tensor<2x8x16x1xf32>
  return %o#0 : tensor<2x8x16x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// A local-view call's results have its out-shardings: the exp after it is
// split by rows like the first result, the neg (linear) a pending sum like
// the second; the body is left alone (it is per-rank).
// CHECK-LABEL: func.func @spmd_results
// CHECK: tgraph.exp %{{.*}}#0 {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}["dp"], []]>}
// CHECK: tgraph.neg %{{.*}}#1 {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}[], []], partial = ["dp"]>}
// CHECK: func.func private @spmd_results_body
// CHECK-NOT: tgraph.sharding
func.func @spmd_results(%x: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<4x4xf32>) {
  %y:2 = tgraph.spmd @spmd_results_body(%x) in [#tgraph.sharding<@mesh, [["dp"], []]>] out [#tgraph.sharding<@mesh, [["dp"], []]>, #tgraph.sharding<@mesh, [[], []], partial = ["dp"]>] : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<4x4xf32>)
  %e = tgraph.exp %y#0 : tensor<8x4xf32>
  %t = tgraph.neg %y#1 : tensor<4x4xf32>
  return %e, %t : tensor<8x4xf32>, tensor<4x4xf32>
}
func.func private @spmd_results_body(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) attributes {tgraph.local} {
  %e = tgraph.exp %x : tensor<4x4xf32>
  %n = tgraph.neg %x : tensor<4x4xf32>
  return %e, %n : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Schedule IR (buffers) is not this pass's input: a function of memrefs
// with only Schedule IR in it is left alone ...
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CHECK-LABEL: func.func @schedule_ir(
// CHECK-NEXT: tsched.stream "comm"
func.func @schedule_ir(%a: memref<6xf32>) {
  %s = tsched.stream "comm"
  return
}

// -----

// ... and Graph IR ops on buffers are an error, not a crash.
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @+1 {{function @mixed holds Graph IR ops but is not a Graph IR function: its argument 0 is memref<4xf32>, not a tensor}}
func.func @mixed(%a: memref<4xf32>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %e = tgraph.exp %x : tensor<4xf32>
  return %e : tensor<4xf32>
}
