// RUN: tessera-opt %s --split-input-file --tessera-lower-to-schedule --verify-diagnostics | FileCheck %s
// RUN: tessera-opt %s --split-input-file --pass-pipeline='builtin.module(tessera-lower-to-schedule{nvshmem-auto-max-bytes=4096})' --verify-diagnostics | FileCheck %s --check-prefix=SMALL

// Inputs are partitioned Graph IR (per-rank shapes, explicit collectives), as
// tessera-partition leaves it.

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// The collective starts on the comm stream right after the launch producing its
// operand (ordered by an event), the independent matmul and relu are launched
// while it is in flight, and the wait sits right before the first use.
// CHECK-LABEL: func.func @overlap
// CHECK-SAME: %arg0: memref<4x4xf32> {tsched.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["tp"]]>}
// CHECK: %[[COMPUTE:.*]] = tsched.stream "compute"
// CHECK: %[[COMM:.*]] = tsched.stream "comm"
// CHECK: %[[P:.*]] = tsched.alloc : memref<4x6xf32>
// CHECK: tsched.launch @overlap_matmul_0 on %[[COMPUTE]] ins(%arg0, %arg1 : memref<4x4xf32>, memref<4x6xf32>) outs(%[[P]] : memref<4x6xf32>)
// CHECK: %[[E:.*]] = tsched.event_record %[[COMPUTE]]
// CHECK: tsched.event_wait %[[E]] on %[[COMM]]
// CHECK: %[[Y:.*]] = tsched.alloc : memref<4x6xf32>
// CHECK: %[[T:.*]] = tsched.collective_start <all_reduce> %[[P]] -> %[[Y]] on %[[COMM]] over @mesh["tp"] {reduction = #tgraph.reduction<sum>}
// CHECK: tsched.launch @overlap_matmul_1 on %[[COMPUTE]]
// CHECK: tsched.launch @overlap_relu_2 on %[[COMPUTE]]
// CHECK: tsched.collective_wait %[[T]] on %[[COMPUTE]]
// CHECK: tsched.free %[[P]]
// CHECK: return %[[Y]], %{{.*}} : memref<4x6xf32>, memref<4x6xf32>
// Each compute op became a kernel on tensors.
// CHECK: func.func private @overlap_matmul_0(%{{.*}}: tensor<4x4xf32>, %{{.*}}: tensor<4x6xf32>) -> tensor<4x6xf32> attributes {tsched.kernel}
// CHECK-NEXT: tgraph.matmul
// CHECK: func.func private @overlap_relu_2
// CHECK-NEXT: tgraph.relu
func.func @overlap(%x: tensor<4x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                   %a: tensor<4x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                   %y: tensor<4x6xf32>, %b: tensor<6x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>)
    attributes {tgraph.partitioned} {
  %0 = tgraph.matmul %x, %a : tensor<4x4xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %1 = tgraph.matmul %y, %b : tensor<4x6xf32>, tensor<6x6xf32> -> tensor<4x6xf32>
  %2 = tgraph.relu %1 : tensor<4x6xf32>
  // Partitioning placed the reduction next to its consumer; lowering hoists it.
  %3 = tgraph.all_reduce <sum> %0 on @mesh["tp"] : tensor<4x6xf32>
  return %3, %2 : tensor<4x6xf32>, tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// A gather of a function argument starts before any compute and needs no event.
// CHECK-LABEL: func.func @gather_arg
// CHECK: tsched.stream "comm"
// CHECK-NOT: tsched.event_record
// CHECK: tsched.collective_start <all_gather> %arg0 -> %{{.*}} over @mesh["tp"] {dim = 1 : i64} : memref<4x3xf32> -> memref<4x6xf32>
// CHECK: tsched.launch @gather_arg_relu_0
// CHECK: tsched.collective_wait
// CHECK-NEXT: return
func.func @gather_arg(%x: tensor<4x3xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                      %y: tensor<4x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>) attributes {tgraph.partitioned} {
  %0 = tgraph.relu %y : tensor<4x6xf32>
  %1 = tgraph.all_gather %x on @mesh["tp"] dim 1 : tensor<4x3xf32> -> tensor<4x6xf32>
  return %1, %0 : tensor<4x6xf32>, tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// A collective's result read on both streams is waited on each, once.
// CHECK-LABEL: func.func @two_readers
// CHECK: %[[COMPUTE:.*]] = tsched.stream "compute"
// CHECK: %[[COMM:.*]] = tsched.stream "comm"
// CHECK: %[[T:.*]] = tsched.collective_start <all_reduce>
// The all_gather runs on the stream that produced its input: a wait, no event.
// CHECK: tsched.collective_wait %[[T]] on %[[COMM]]
// CHECK-NEXT: tsched.alloc
// CHECK-NEXT: tsched.collective_start <all_gather>
// CHECK-NEXT: tsched.collective_wait %[[T]] on %[[COMPUTE]]
// CHECK-NEXT: tsched.alloc
// CHECK-NEXT: tsched.launch @two_readers_relu
func.func @two_readers(%p: tensor<4x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []], partial = ["tp"]>})
    -> (tensor<4x12xf32>, tensor<4x6xf32>) attributes {tgraph.partitioned} {
  %0 = tgraph.all_reduce <sum> %p on @mesh["tp"] : tensor<4x6xf32>
  %1 = tgraph.all_gather %0 on @mesh["tp"] dim 1 : tensor<4x6xf32> -> tensor<4x12xf32>
  %2 = tgraph.relu %0 : tensor<4x6xf32>
  return %1, %2 : tensor<4x12xf32>, tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @+1 {{run tessera-partition before tessera-lower-to-schedule}}
func.func @not_partitioned(%x: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %0 = tgraph.relu %x : tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

// transport = nvshmem on the GPU target: the all_gather of the matmul's rows
// is no collective; both ops become one kernel, launched on the compute stream.
module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CHECK-LABEL: func.func @gathered
// CHECK-NOT: tsched.collective_start
// CHECK: tsched.launch @gathered_gather_matmul_0 on %{{.*}} ins(%arg0, %arg1 : memref<64x32xbf16>, memref<32x16xbf16>) outs(%{{.*}} : memref<128x16xbf16>)
// CHECK: func.func private @gathered_gather_matmul_0(%{{.*}}: tensor<64x32xbf16>, %{{.*}}: tensor<32x16xbf16>) -> tensor<128x16xbf16> attributes {tsched.kernel}
// CHECK-NEXT: tgraph.all_gather {{.*}} {transport = #tgraph.transport<nvshmem>}
// CHECK-NEXT: tgraph.matmul
func.func @gathered(%x: tensor<64x32xbf16>, %w: tensor<32x16xbf16>) -> tensor<128x16xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<64x32xbf16> -> tensor<128x32xbf16>
  %1 = tgraph.matmul %0, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  return %1 : tensor<128x16xbf16>
}
}

// -----

// transport = auto on the CPU target is the collective library.
module attributes {tessera.target = "cpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CHECK-LABEL: func.func @auto_cpu
// CHECK: tsched.collective_start <all_gather>
// CHECK: tsched.launch @auto_cpu_matmul_0
func.func @auto_cpu(%x: tensor<64x32xbf16>, %w: tensor<32x16xbf16>) -> tensor<128x16xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 0 {transport = #tgraph.transport<auto>} : tensor<64x32xbf16> -> tensor<128x32xbf16>
  %1 = tgraph.matmul %0, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  return %1 : tensor<128x16xbf16>
}
}

// -----

// transport = auto on the GPU target, operand within nvshmem-auto-max-bytes:
// fused. A gathered operand past it (512 MiB of bf16) stays a collective.
// With the option at 4096 bytes the 16 KiB gathered operand stays one too.
module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// SMALL-LABEL: func.func @auto_gpu
// SMALL: tsched.collective_start <all_gather>
// SMALL-NOT: gather_matmul
// SMALL: tsched.launch @auto_gpu_matmul_0
// CHECK-LABEL: func.func @auto_gpu
// CHECK-NOT: tsched.collective_start
// CHECK: tsched.launch @auto_gpu_gather_matmul_0
// CHECK: tgraph.all_gather {{.*}} {transport = #tgraph.transport<nvshmem>}
func.func @auto_gpu(%x: tensor<64x32xbf16>, %w: tensor<32x16xbf16>) -> tensor<128x16xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 0 {transport = #tgraph.transport<auto>} : tensor<64x32xbf16> -> tensor<128x32xbf16>
  %1 = tgraph.matmul %0, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  return %1 : tensor<128x16xbf16>
}
// CHECK-LABEL: func.func @auto_gather_too_big
// CHECK: tsched.collective_start <all_gather>
// CHECK-NOT: gather_matmul
// CHECK: tsched.launch @auto_gather_too_big_matmul_0
func.func @auto_gather_too_big(%x: tensor<65536x2048xbf16>, %w: tensor<2048x16xbf16>) -> tensor<131072x16xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 0 {transport = #tgraph.transport<auto>} : tensor<65536x2048xbf16> -> tensor<131072x2048xbf16>
  %1 = tgraph.matmul %0, %w : tensor<131072x2048xbf16>, tensor<2048x16xbf16> -> tensor<131072x16xbf16>
  return %1 : tensor<131072x16xbf16>
}
}

// -----

module attributes {tessera.target = "cpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @nvshmem_on_cpu(%x: tensor<64x32xbf16>, %w: tensor<32x16xbf16>) -> tensor<128x16xbf16> attributes {tgraph.partitioned} {
  // expected-error @+1 {{transport = nvshmem needs the GPU target}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<64x32xbf16> -> tensor<128x32xbf16>
  %1 = tgraph.matmul %0, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  return %1 : tensor<128x16xbf16>
}
}

// -----

module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @not_fusable(%x: tensor<64x32xbf16>, %w: tensor<32x16xbf16>) -> (tensor<128x16xbf16>, tensor<128x32xbf16>) attributes {tgraph.partitioned} {
  // expected-error @+1 {{cannot be fused into a GEMM: its result is read by something other than one matmul's lhs}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<64x32xbf16> -> tensor<128x32xbf16>
  %1 = tgraph.matmul %0, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  return %1, %0 : tensor<128x16xbf16>, tensor<128x32xbf16>
}
}

// -----

// transport = nvshmem on a reduce_scatter of a matmul's partial sums: no
// collective; the matmul and the reduce_scatter become one kernel, launched on
// the compute stream where the reduce_scatter's result is first needed.
module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CHECK-LABEL: func.func @scattered
// CHECK-NOT: tsched.collective_start
// CHECK: %[[Y:.*]] = tsched.alloc : memref<64x16xbf16>
// CHECK-NEXT: tsched.launch @scattered_matmul_scatter_0 on %{{.*}} ins(%arg0, %arg1 : memref<128x32xbf16>, memref<32x16xbf16>) outs(%[[Y]] : memref<64x16xbf16>)
// CHECK-NEXT: tsched.alloc : memref<64x16xbf16>
// CHECK-NEXT: tsched.launch @scattered_add_1 on %{{.*}} ins(%arg2, %[[Y]] : memref<64x16xbf16>, memref<64x16xbf16>)
// CHECK: func.func private @scattered_matmul_scatter_0(%{{.*}}: tensor<128x32xbf16>, %{{.*}}: tensor<32x16xbf16>) -> tensor<64x16xbf16> attributes {tsched.kernel}
// CHECK-NEXT: tgraph.matmul
// CHECK-NEXT: tgraph.reduce_scatter {{.*}} {transport = #tgraph.transport<nvshmem>}
func.func @scattered(%h: tensor<128x32xbf16>, %w: tensor<32x16xbf16>, %r: tensor<64x16xbf16>) -> tensor<64x16xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.matmul %h, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<128x16xbf16> -> tensor<64x16xbf16>
  %2 = tgraph.add %r, %1 : tensor<64x16xbf16>
  return %2 : tensor<64x16xbf16>
}
}

// -----

// transport = auto on the GPU target: fused when both symmetric copies of
// the product fit in nvshmem-auto-max-bytes (256 MiB); a 16384 x 8192 bf16
// product (256 MiB, 512 MiB in two copies) stays a collective.
module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CHECK-LABEL: func.func @auto_scattered
// CHECK: tsched.launch @auto_scattered_matmul_scatter_0
// CHECK-LABEL: func.func @auto_too_big
// CHECK: tsched.launch @auto_too_big_matmul_0
// CHECK: tsched.collective_start <reduce_scatter>
func.func @auto_scattered(%h: tensor<128x32xbf16>, %w: tensor<32x16xbf16>) -> tensor<64x16xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.matmul %h, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<auto>} : tensor<128x16xbf16> -> tensor<64x16xbf16>
  return %1 : tensor<64x16xbf16>
}
func.func @auto_too_big(%h: tensor<16384x32xbf16>, %w: tensor<32x8192xbf16>) -> tensor<8192x8192xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.matmul %h, %w : tensor<16384x32xbf16>, tensor<32x8192xbf16> -> tensor<16384x8192xbf16>
  %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<auto>} : tensor<16384x8192xbf16> -> tensor<8192x8192xbf16>
  return %1 : tensor<8192x8192xbf16>
}
}

// -----

module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @scatter_not_fusable(%h: tensor<128x32xbf16>, %w: tensor<32x16xbf16>) -> (tensor<64x16xbf16>, tensor<128x16xbf16>) attributes {tgraph.partitioned} {
  %0 = tgraph.matmul %h, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  // expected-error @+1 {{transport = nvshmem: this reduce_scatter cannot be fused into a GEMM: its operand is not a matmul's product that nothing else reads}}
  %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<128x16xbf16> -> tensor<64x16xbf16>
  return %1, %0 : tensor<64x16xbf16>, tensor<128x16xbf16>
}
}

// -----

module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @scatter_columns(%h: tensor<128x32xbf16>, %w: tensor<32x16xbf16>) -> tensor<128x8xbf16> attributes {tgraph.partitioned} {
  %0 = tgraph.matmul %h, %w : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
  // expected-error @+1 {{this reduce_scatter cannot be fused into a GEMM: it scatters columns, not rows; use 'auto' or 'nccl'}}
  %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<128x16xbf16> -> tensor<128x8xbf16>
  return %1 : tensor<128x8xbf16>
}
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// A collective nothing reads (a per-rank body's forward all_gather whose
// value only the backward recomputes) still runs on every rank: it is waited
// for at once, before its buffers are freed.
// CHECK-LABEL: func.func @unread_collective(
// CHECK: %[[T:.*]] = tsched.collective_start <all_gather> %{{.*}} -> %[[D:.*]] on
// CHECK-NEXT: tsched.collective_wait %[[T]]
// CHECK: tsched.free %[[D]]
func.func @unread_collective(%x: tensor<4x2xf32>) -> tensor<4x2xf32> attributes {tgraph.partitioned} {
  %g = tgraph.all_gather %x on @mesh["dp"] dim 1 : tensor<4x2xf32> -> tensor<4x4xf32>
  %e = tgraph.exp %x : tensor<4x2xf32>
  return %e : tensor<4x2xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// Per-rank code's send and recv: the send starts once its value exists and
// is waited for at the end; a recv is waited for where it is first read, or
// at once when nothing reads it.
// CHECK-LABEL: func.func @peers(
// CHECK: %[[E:.*]] = tsched.alloc
// CHECK: tsched.launch @peers_exp_{{.*}} outs(%[[E]] :
// CHECK: %[[S:.*]] = tsched.send %[[E]] to 1 on %{{.*}} over @mesh["dp"] : memref<4xf32>
// CHECK: %[[R:.*]] = tsched.recv %{{.*}} from 1 on %{{.*}} over @mesh["dp"] : memref<4xf32>
// CHECK: %[[U:.*]] = tsched.recv %{{.*}} from 1 on
// CHECK-NEXT: tsched.collective_wait %[[U]]
// CHECK: tsched.collective_wait %[[R]]
// CHECK: tsched.launch @peers_add_
// CHECK: tsched.collective_wait %[[S]]
// CHECK-NEXT: tsched.free %[[E]]
// CHECK: return
func.func @peers(%x: tensor<4xf32>) -> tensor<4xf32> attributes {tgraph.partitioned} {
  %e = tgraph.exp %x : tensor<4xf32>
  tgraph.send %e on @mesh["dp"] to 1 : tensor<4xf32>
  %r = tgraph.recv on @mesh["dp"] from 1 : tensor<4xf32>
  %unread = tgraph.recv on @mesh["dp"] from 1 : tensor<4xf32>
  %s = tgraph.add %r, %x : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

// An identity is a Graph IR function too (it has no tgraph op): its result
// is its argument's buffer.
// CHECK-LABEL: func.func @identity(
// CHECK-SAME: %[[X:.*]]: memref<3x4xf32>
// CHECK-NOT: tsched.launch
// CHECK: return %[[X]] : memref<3x4xf32>
func.func @identity(%x: tensor<3x4xf32>) -> tensor<3x4xf32> attributes {tgraph.partitioned} {
  return %x : tensor<3x4xf32>
}

// -----

// Zero-size tensors launch nothing; a sum over a zero-size dimension, a
// max over one and a matmul with K = 0 are fills of their identity.
// CHECK-LABEL: func.func @empty(
// CHECK-NOT: tsched.launch @empty_exp
// CHECK: tsched.launch @empty_fill_{{[0-9]+}} on
// CHECK: tsched.launch @empty_fill_{{[0-9]+}} on
// CHECK: tsched.launch @empty_fill_{{[0-9]+}} on
// CHECK-NOT: tsched.launch
// CHECK: return
// CHECK: func.func private @empty_fill_{{[0-9]+}}() -> tensor<1x3xf32>
// CHECK-NEXT: tgraph.fill 0.000000e+00
// CHECK: func.func private @empty_fill_{{[0-9]+}}() -> tensor<1x3xf32>
// CHECK-NEXT: tgraph.fill 0xFFF0000000000000
// CHECK: func.func private @empty_fill_{{[0-9]+}}() -> tensor<2x3xf32>
// CHECK-NEXT: tgraph.fill 0.000000e+00
func.func @empty(%x: tensor<0x3xf32>, %a: tensor<2x0xf32>) -> (tensor<0x3xf32>, tensor<1x3xf32>, tensor<1x3xf32>, tensor<2x3xf32>) attributes {tgraph.partitioned} {
  %e = tgraph.exp %x : tensor<0x3xf32>
  %s = tgraph.reduce <sum> %x dims [0] : tensor<0x3xf32> -> tensor<1x3xf32>
  %m = tgraph.reduce <max> %x dims [0] : tensor<0x3xf32> -> tensor<1x3xf32>
  %p = tgraph.matmul %a, %x : tensor<2x0xf32>, tensor<0x3xf32> -> tensor<2x3xf32>
  return %e, %s, %m, %p : tensor<0x3xf32>, tensor<1x3xf32>, tensor<1x3xf32>, tensor<2x3xf32>
}

// -----

// A collective feeding only zero-size work (found by the distributed
// fuzzer): nothing is launched, but it is still waited for before its
// buffer is freed.
tgraph.mesh @mesh axes = ["dp"] shape = [2]
// CHECK-LABEL: func.func @gathered_then_empty(
// CHECK: %[[G:.*]] = tsched.collective_start <all_gather>
// CHECK-NEXT: tsched.collective_wait %[[G]]
// CHECK-NEXT: tsched.free
// CHECK-NOT: tsched.launch
func.func @gathered_then_empty(%x: tensor<1xf32>) -> tensor<0xf32> attributes {tgraph.partitioned} {
  %g = tgraph.all_gather %x on @mesh["dp"] dim 0 : tensor<1xf32> -> tensor<2xf32>
  %s = tgraph.slice %g offsets [0] : tensor<2xf32> -> tensor<0xf32>
  return %s : tensor<0xf32>
}

// -----

// A matmul with K = 0 of a collective's result (found by the distributed
// fuzzer: a dot product of two empty partial sums) is a fill that reads
// nothing, but the collective is still waited for before its buffer goes.
tgraph.mesh @mesh axes = ["dp"] shape = [2]
// CHECK-LABEL: func.func @reduced_then_k0(
// CHECK: %[[R:.*]] = tsched.collective_start <all_reduce>
// CHECK-NEXT: tsched.collective_wait %[[R]]
// CHECK-NEXT: tsched.free
// CHECK: tsched.launch @reduced_then_k0_fill_{{[0-9]+}} on %{{.*}} outs(
func.func @reduced_then_k0(%x: tensor<2x0xf32>, %w: tensor<0x3xf32>) -> tensor<2x3xf32> attributes {tgraph.partitioned} {
  %r = tgraph.all_reduce <sum> %x on @mesh["dp"] : tensor<2x0xf32>
  %p = tgraph.matmul %r, %w : tensor<2x0xf32>, tensor<0x3xf32> -> tensor<2x3xf32>
  return %p : tensor<2x3xf32>
}

// -----

// transport = nvshmem on an all_to_all (an MoE layer's dispatch) on the GPU
// target: no collective; the all_to_all is a kernel of its own
// (tessera-lower-to-tile makes it an NVSHMEM exchange).
module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["ep"] shape = [2]
// CHECK-LABEL: func.func @exchanged
// CHECK-NOT: tsched.collective_start
// CHECK: tsched.launch @exchanged_exchange_0 on %{{.*}} ins(%arg0 : memref<2x16x8xf32>) outs(%{{.*}} : memref<1x32x8xf32>)
// CHECK: func.func private @exchanged_exchange_0(%{{.*}}: tensor<2x16x8xf32>) -> tensor<1x32x8xf32> attributes {tsched.kernel}
// CHECK-NEXT: tgraph.all_to_all {{.*}} {transport = #tgraph.transport<nvshmem>}
func.func @exchanged(%r: tensor<2x16x8xf32>) -> tensor<1x32x8xf32> attributes {tgraph.partitioned} {
  %0 = tgraph.all_to_all %r on @mesh["ep"] split_dim 0 concat_dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
  return %0 : tensor<1x32x8xf32>
}
}

// -----

// The same on the CPU target: no NVSHMEM kernels there, the communicator
// moves it (the design docs' MoE call names NVSHMEM on any machine).
module attributes {tessera.target = "cpu"} {
tgraph.mesh @mesh axes = ["ep"] shape = [2]
// CHECK-LABEL: func.func @exchanged_on_cpu
// CHECK: tsched.collective_start <all_to_all> %arg0 -> %{{.*}} on %{{.*}} over @mesh["ep"] {concat_dim = 1 : i64, dim = 0 : i64} : memref<2x16x8xf32> -> memref<1x32x8xf32>
func.func @exchanged_on_cpu(%r: tensor<2x16x8xf32>) -> tensor<1x32x8xf32> attributes {tgraph.partitioned} {
  %0 = tgraph.all_to_all %r on @mesh["ep"] split_dim 0 concat_dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
  return %0 : tensor<1x32x8xf32>
}
}

// -----

// A ragged all_to_all (an MoE layer's, with row counts): the collective
// takes the counts' buffers, freed only after its wait.
module attributes {tessera.target = "cpu"} {
tgraph.mesh @mesh axes = ["ep"] shape = [2]
// CHECK-LABEL: func.func @ragged
// CHECK: %[[T:.*]] = tsched.collective_start <all_to_all> %arg0 -> %{{.*}} counts(%arg1, %arg2 : memref<2xi32>, memref<2xi32>) on %{{.*}} over @mesh["ep"]
// CHECK: tsched.collective_wait %[[T]]
func.func @ragged(%r: tensor<2x16x8xf32>, %sent: tensor<2xi32>, %got: tensor<2xi32>) -> tensor<1x32x8xf32> attributes {tgraph.partitioned} {
  %0 = tgraph.all_to_all %r counts(%sent, %got : tensor<2xi32>, tensor<2xi32>) on @mesh["ep"] split_dim 0 concat_dim 1 : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
  return %0 : tensor<1x32x8xf32>
}
}

// -----

// Collectives start right after what they read is made: a ragged
// all_to_all waits for its counts too, not only for its operand (here made
// first).
module attributes {tessera.target = "cpu"} {
tgraph.mesh @mesh axes = ["ep"] shape = [2]
// CHECK-LABEL: func.func @counts_made_last
// CHECK: tsched.launch @counts_made_last_neg_0
// CHECK: tsched.launch @counts_made_last_add_1 {{.*}} outs(%[[N:[^ ]*]] :
// CHECK: tsched.collective_start <all_to_all> %{{.*}} -> %{{.*}} counts(%[[N]], %[[N]] :
func.func @counts_made_last(%r: tensor<2x16x8xf32>, %n: tensor<2xi32>) -> tensor<1x32x8xf32> attributes {tgraph.partitioned} {
  %x = tgraph.neg %r : tensor<2x16x8xf32>
  %m = tgraph.add %n, %n : tensor<2xi32>
  %0 = tgraph.all_to_all %x counts(%m, %m : tensor<2xi32>, tensor<2xi32>) on @mesh["ep"] split_dim 0 concat_dim 1 : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
  return %0 : tensor<1x32x8xf32>
}
}

// -----

module attributes {tessera.target = "gpu"} {
tgraph.mesh @mesh axes = ["ep"] shape = [2]
func.func @exchange_not_contiguous(%r: tensor<4x8xf32>) -> tensor<8x4xf32> attributes {tgraph.partitioned} {
  // expected-error @+1 {{transport = nvshmem: this all_to_all cannot be fused into an exchange kernel: its operand's pieces are not contiguous (dimensions [4] before split_dim 1); use 'auto' or 'nccl'}}
  %0 = tgraph.all_to_all %r on @mesh["ep"] split_dim 1 concat_dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<4x8xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
}

// -----

// The GPU target's attention kernels read [..., S, D] operands: attention
// along dimension 1 of [B, S, H, D] is transposed there (one copy per distinct
// operand) and its output back; the lse nothing reads stays. The CPU target's
// kernels read the rows where they lie: no transpose.
module attributes {tessera.target = "gpu"} {
// CHECK-LABEL: func.func @heads_gpu
// CHECK: tsched.launch @heads_gpu_transpose_0 on %{{.*}} ins(%arg0 : memref<2x64x4x16xf32>) outs(%[[Q:.*]] : memref<2x4x64x16xf32>)
// CHECK-NEXT: %[[O:.*]] = tsched.alloc : memref<2x4x64x16xf32>
// CHECK-NEXT: tsched.alloc : memref<2x4x64x1xf32>
// CHECK-NEXT: tsched.launch @heads_gpu_attention_1 on %{{.*}} ins(%[[Q]], %[[Q]], %[[Q]] :
// CHECK: tsched.launch @heads_gpu_transpose_2 on %{{.*}} ins(%[[O]] : memref<2x4x64x16xf32>) outs(%{{.*}} : memref<2x64x4x16xf32>)
// CHECK-NOT: tsched.launch
// CHECK: tgraph.attention %{{.*}} {causal, scale = 2.500000e-01 : f64} : tensor<2x4x64x16xf32>
func.func @heads_gpu(%q: tensor<2x64x4x16xf32>) -> tensor<2x64x4x16xf32> attributes {tgraph.partitioned} {
  %o:2 = tgraph.attention %q, %q, %q {causal, scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32> -> tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
  return %o#0 : tensor<2x64x4x16xf32>
}
}

// -----

module attributes {tessera.target = "cpu"} {
// CHECK-LABEL: func.func @heads_cpu
// CHECK-NOT: transpose
// CHECK: tgraph.attention %{{.*}} {causal, scale = 2.500000e-01 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>
func.func @heads_cpu(%q: tensor<2x64x4x16xf32>) -> tensor<2x64x4x16xf32> attributes {tgraph.partitioned} {
  %o:2 = tgraph.attention %q, %q, %q {causal, scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32> -> tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
  return %o#0 : tensor<2x64x4x16xf32>
}
}

// -----

// A value check launches a kernel that reads its operand and writes nothing;
// its result is the operand's buffer (no copy), freed after its last reader.
// Zero elements: nothing to check, no launch.
// CHECK-LABEL: func.func @check_range
// CHECK: %[[T:.*]] = tsched.alloc : memref<8xi32>
// CHECK: tsched.launch @check_range_reshape_0 on %{{.*}} ins(%arg0 : memref<2x4xi32>) outs(%[[T]] : memref<8xi32>)
// CHECK-NEXT: tsched.launch @check_range_check_range_1 on %{{.*}} ins(%[[T]] : memref<8xi32>){{$}}
// CHECK-NEXT: %[[Y:.*]] = tsched.alloc : memref<8xi32>
// CHECK-NEXT: tsched.launch @check_range_add_2 on %{{.*}} ins(%[[T]], %[[T]] : memref<8xi32>, memref<8xi32>) outs(%[[Y]] : memref<8xi32>)
// CHECK-NEXT: tsched.free %[[T]]
// CHECK-NOT: tsched.launch
// CHECK: return %[[Y]], %arg1
// CHECK: func.func private @check_range_check_range_1(%{{.*}}: tensor<8xi32>) attributes {tsched.kernel}
// CHECK-NEXT: tgraph.check_range %{{.*}} in [0, 7) or [-100] message "{row} {value}" : tensor<8xi32>
// CHECK-NEXT: return{{$}}
func.func @check_range(%x: tensor<2x4xi32>, %e: tensor<0xi32>) -> (tensor<8xi32>, tensor<0xi32>) attributes {tgraph.partitioned} {
  %0 = tgraph.reshape %x : tensor<2x4xi32> to tensor<8xi32>
  %1 = tgraph.check_range %0 in [0, 7) or [-100] message "{row} {value}" : tensor<8xi32>
  %2 = tgraph.add %1, %1 : tensor<8xi32>
  %3 = tgraph.check_range %e in [0, 7) message "{row} {value}" : tensor<0xi32>
  return %2, %3 : tensor<8xi32>, tensor<0xi32>
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [2]
// A linear layer over [B, S, K] rows (a 2-D rhs) and its weight gradient
// (contract_rows) become 2-D GEMMs over the rows: reshapes (views) of the
// local buffers to [rows, K], each made once, contract_rows's lhs transposed.
// CHECK-LABEL: func.func @gemms_over_rows
// CHECK: tsched.launch @gemms_over_rows_reshape_0 {{.*}} memref<2x4x16xf32>{{.*}} memref<8x16xf32>
// CHECK: tsched.launch @gemms_over_rows_matmul_1 {{.*}} memref<8x16xf32>, memref<16x32xf32>{{.*}} memref<8x32xf32>
// CHECK: tsched.launch @gemms_over_rows_reshape_2 {{.*}} memref<8x32xf32>{{.*}} memref<2x4x32xf32>
// CHECK: tsched.launch @gemms_over_rows_transpose_3 {{.*}} memref<8x16xf32>{{.*}} memref<16x8xf32>
// CHECK: tsched.launch @gemms_over_rows_matmul_4 {{.*}} memref<16x8xf32>, memref<8x32xf32>{{.*}} memref<16x32xf32>
// CHECK-NOT: contract_rows
func.func @gemms_over_rows(%x: tensor<2x4x16xf32>, %w: tensor<16x32xf32>)
    -> (tensor<2x4x32xf32>, tensor<16x32xf32>) attributes {tgraph.partitioned} {
  %y = tgraph.matmul %x, %w : tensor<2x4x16xf32>, tensor<16x32xf32> -> tensor<2x4x32xf32>
  %g = tgraph.contract_rows %x, %y : tensor<2x4x16xf32>, tensor<2x4x32xf32> -> tensor<16x32xf32>
  return %y, %g : tensor<2x4x32xf32>, tensor<16x32xf32>
}
