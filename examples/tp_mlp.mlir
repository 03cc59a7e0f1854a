// The tensor-parallel MLP in Graph IR, as `tessera.compile` traces examples/tp_mlp.py
// (smaller shapes). Try: tessera-opt examples/tp_mlp.mlir --tessera-partition
tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @mlp(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []]>},
               %w1: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
               %w2: tensor<32x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<8x16xf32> {
  %0 = tgraph.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %1 = tgraph.relu %0 : tensor<8x32xf32>
  %2 = tgraph.matmul %1, %w2 : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}
