// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-shard-tensor-parallel="size=2" | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-shard-tensor-parallel="size=1" | FileCheck %s --check-prefix=ONE

// A hidden layer (matmul, bias, relu) and an output layer: the first weight
// and its bias split by columns, the second weight by rows, the partial
// products summed over "tp", the second bias added after the sum.
// CHECK-LABEL: func @mlp
// CHECK-DAG: %[[W1:.*]] = forge.constant {forge.initializer = "w1"} {{.*}} : tensor<8x6xf32>
// CHECK-DAG: %[[S1:.*]] = forge.shard %[[W1]] {axis = 1 : i64, group = "tp", size = 2 : i64} : (tensor<8x6xf32>) -> tensor<8x3xf32>
// CHECK-DAG: %[[B1:.*]] = forge.constant {forge.initializer = "b1"} {{.*}} : tensor<6xf32>
// CHECK-DAG: %[[SB1:.*]] = forge.shard %[[B1]] {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<6xf32>) -> tensor<3xf32>
// CHECK-DAG: %[[W2:.*]] = forge.constant {forge.initializer = "w2"} {{.*}} : tensor<6x4xf32>
// CHECK-DAG: %[[S2:.*]] = forge.shard %[[W2]] {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<6x4xf32>) -> tensor<3x4xf32>
// CHECK: %[[X:.*]] = forge.enter_group %arg0 {group = "tp", size = 2 : i64} : tensor<5x8xf32>
// CHECK: %[[H:.*]] = forge.matmul %[[X]], %[[S1]] : (tensor<5x8xf32>, tensor<8x3xf32>) -> tensor<5x3xf32>
// CHECK: %[[HB:.*]] = forge.add %[[H]], %[[SB1]] : (tensor<5x3xf32>, tensor<3xf32>) -> tensor<5x3xf32>
// CHECK: %[[R:.*]] = forge.relu %[[HB]] : (tensor<5x3xf32>) -> tensor<5x3xf32>
// CHECK: %[[P:.*]] = forge.matmul %[[R]], %[[S2]] : (tensor<5x3xf32>, tensor<3x4xf32>) -> tensor<5x4xf32>
// CHECK: %[[SUM:.*]] = forge.all_reduce %[[P]] {group = "tp", reduction = "sum", size = 2 : i64}
// CHECK: forge.add %[[SUM]], %{{.*}} : (tensor<5x4xf32>, tensor<4xf32>) -> tensor<5x4xf32>
// ONE-LABEL: func @mlp
// ONE-NOT: forge.shard
// ONE-NOT: forge.all_reduce
func.func @mlp(%x: tensor<5x8xf32> {forge.name = "x"}) -> (tensor<5x4xf32> {forge.name = "y"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.25> : tensor<8x6xf32>
  %b1 = forge.constant {forge.initializer = "b1"} dense<0.5> : tensor<6xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.125> : tensor<6x4xf32>
  %b2 = forge.constant {forge.initializer = "b2"} dense<1.0> : tensor<4xf32>
  %h = forge.matmul %x, %w1 : (tensor<5x8xf32>, tensor<8x6xf32>) -> tensor<5x6xf32>
  %hb = forge.add %h, %b1 : (tensor<5x6xf32>, tensor<6xf32>) -> tensor<5x6xf32>
  %r = forge.relu %hb : (tensor<5x6xf32>) -> tensor<5x6xf32>
  %p = forge.matmul %r, %w2 : (tensor<5x6xf32>, tensor<6x4xf32>) -> tensor<5x4xf32>
  %y = forge.add %p, %b2 : (tensor<5x4xf32>, tensor<4xf32>) -> tensor<5x4xf32>
  return %y : tensor<5x4xf32>
}

// -----

// PyTorch's Linear as ONNX Gemm (weights [out, in], transB): the first
// weight splits by rows of its storage, the second by columns; the second
// gemm's C is added once, after the sum.
// CHECK-LABEL: func @gemms
// CHECK-DAG: forge.shard %{{.*}} {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<6x8xf32>) -> tensor<3x8xf32>
// CHECK-DAG: forge.shard %{{.*}} {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<6xf32>) -> tensor<3xf32>
// CHECK-DAG: forge.shard %{{.*}} {axis = 1 : i64, group = "tp", size = 2 : i64} : (tensor<4x6xf32>) -> tensor<4x3xf32>
// CHECK: forge.enter_group %arg0
// CHECK: forge.gemm %{{.*}}, %{{.*}}, %{{.*}} {{.*}} : (tensor<5x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<5x3xf32>
// CHECK: forge.tanh %{{.*}} : (tensor<5x3xf32>) -> tensor<5x3xf32>
// CHECK: %[[G:.*]] = forge.gemm %{{.*}}, %{{.*}} {{.*}} : (tensor<5x3xf32>, tensor<4x3xf32>) -> tensor<5x4xf32>
// CHECK: %[[S:.*]] = forge.all_reduce %[[G]] {group = "tp", reduction = "sum", size = 2 : i64}
// CHECK: %[[Y:.*]] = forge.add %[[S]], %{{.*}} : (tensor<5x4xf32>, tensor<4xf32>) -> tensor<5x4xf32>
// CHECK: return %[[Y]]
func.func @gemms(%x: tensor<5x8xf32> {forge.name = "x"}) -> (tensor<5x4xf32> {forge.name = "y"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.25> : tensor<6x8xf32>
  %b1 = forge.constant {forge.initializer = "b1"} dense<0.5> : tensor<6xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.125> : tensor<4x6xf32>
  %b2 = forge.constant {forge.initializer = "b2"} dense<1.0> : tensor<4xf32>
  %h = forge.gemm %x, %w1, %b1 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<5x8xf32>, tensor<6x8xf32>, tensor<6xf32>) -> tensor<5x6xf32>
  %t = forge.tanh %h : (tensor<5x6xf32>) -> tensor<5x6xf32>
  %y = forge.gemm %t, %w2, %b2 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<5x6xf32>, tensor<4x6xf32>, tensor<4xf32>) -> tensor<5x4xf32>
  return %y : tensor<5x4xf32>
}

// -----

// Negative: a hidden width that does not divide by the group, and a hidden
// value read twice; nothing else to split is an error.
// expected-error @+1 {{--tp 2: no pair of matmuls to split}}
func.func @unsplittable(%x: tensor<5x8xf32> {forge.name = "x"}) -> (tensor<5x4xf32> {forge.name = "y"}, tensor<5x5xf32> {forge.name = "z"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.25> : tensor<8x5xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.125> : tensor<5x4xf32>
  %w3 = forge.constant {forge.initializer = "w3"} dense<0.25> : tensor<8x6xf32>
  %w4 = forge.constant {forge.initializer = "w4"} dense<0.125> : tensor<6x5xf32>
  // expected-remark @+1 {{not split over 2 ranks: its hidden width 5 does not divide by 2}}
  %h = forge.matmul %x, %w1 : (tensor<5x8xf32>, tensor<8x5xf32>) -> tensor<5x5xf32>
  %y = forge.matmul %h, %w2 : (tensor<5x5xf32>, tensor<5x4xf32>) -> tensor<5x4xf32>
  // expected-remark @+1 {{not split over 2 ranks: its hidden value has 2 readers}}
  %g = forge.matmul %x, %w3 : (tensor<5x8xf32>, tensor<8x6xf32>) -> tensor<5x6xf32>
  %z = forge.matmul %g, %w4 : (tensor<5x6xf32>, tensor<6x5xf32>) -> tensor<5x5xf32>
  %u = forge.relu %g : (tensor<5x6xf32>) -> tensor<5x6xf32>
  return %y, %z : tensor<5x4xf32>, tensor<5x5xf32>
}


// -----

// PyTorch's Linear imported as MatMul(x, Transpose(W)), W [out, in], on a 3-D
// activation (a transformer's MLP, bias first in the add, tanh GELU): the
// shards go on the initializers, under their transposes, which take the
// slices' transposed types.
// CHECK-LABEL: func @transformer_mlp
// CHECK-DAG: %[[S1:.*]] = forge.shard %{{.*}} {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<16x4xf32>) -> tensor<8x4xf32>
// CHECK-DAG: %[[SB:.*]] = forge.shard %{{.*}} {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<16xf32>) -> tensor<8xf32>
// CHECK-DAG: %[[S2:.*]] = forge.shard %{{.*}} {axis = 1 : i64, group = "tp", size = 2 : i64} : (tensor<4x16xf32>) -> tensor<4x8xf32>
// CHECK: forge.transpose %[[S1]] {perm = array<i64: 1, 0>} : (tensor<8x4xf32>) -> tensor<4x8xf32>
// CHECK: forge.matmul %{{.*}}, %{{.*}} : (tensor<2x3x4xf32>, tensor<4x8xf32>) -> tensor<2x3x8xf32>
// CHECK: forge.add %[[SB]], %{{.*}} : (tensor<8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
// CHECK: forge.gelu %{{.*}} : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
// CHECK: forge.transpose %[[S2]] {perm = array<i64: 1, 0>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
// CHECK: %[[P:.*]] = forge.matmul %{{.*}}, %{{.*}} : (tensor<2x3x8xf32>, tensor<8x4xf32>) -> tensor<2x3x4xf32>
// CHECK: forge.all_reduce %[[P]] {group = "tp", reduction = "sum", size = 2 : i64}
func.func @transformer_mlp(%x: tensor<2x3x4xf32> {forge.name = "x"}) -> (tensor<2x3x4xf32> {forge.name = "y"}) {
  %w1 = forge.constant {forge.initializer = "fc.weight"} dense<0.25> : tensor<16x4xf32>
  %b1 = forge.constant {forge.initializer = "fc.bias"} dense<0.5> : tensor<16xf32>
  %w2 = forge.constant {forge.initializer = "proj.weight"} dense<0.125> : tensor<4x16xf32>
  %t1 = forge.transpose %w1 {perm = array<i64: 1, 0>} : (tensor<16x4xf32>) -> tensor<4x16xf32>
  %h = forge.matmul %x, %t1 : (tensor<2x3x4xf32>, tensor<4x16xf32>) -> tensor<2x3x16xf32>
  %hb = forge.add %b1, %h : (tensor<16xf32>, tensor<2x3x16xf32>) -> tensor<2x3x16xf32>
  %g = forge.gelu %hb {approximate = "tanh"} : (tensor<2x3x16xf32>) -> tensor<2x3x16xf32>
  %t2 = forge.transpose %w2 {perm = array<i64: 1, 0>} : (tensor<4x16xf32>) -> tensor<16x4xf32>
  %y = forge.matmul %g, %t2 : (tensor<2x3x16xf32>, tensor<16x4xf32>) -> tensor<2x3x4xf32>
  return %y : tensor<2x3x4xf32>
}

// -----

// Self-attention by heads: the fused q/k/v weight and bias by the columns of
// this rank's heads in each of q, k and v (blocks = 3), the split and the
// head reshapes halved, the attention on 2 of the 4 heads, the output
// projection by the rows of those heads, then the sum over the group.
// CHECK-LABEL: func @attention
// CHECK-DAG: %[[W:.*]] = forge.shard %{{.*}} {axis = 0 : i64, blocks = 3 : i64, group = "tp", size = 2 : i64} : (tensor<24x8xf32>) -> tensor<12x8xf32>
// CHECK-DAG: %[[B:.*]] = forge.shard %{{.*}} {axis = 0 : i64, blocks = 3 : i64, group = "tp", size = 2 : i64} : (tensor<24xf32>) -> tensor<12xf32>
// CHECK-DAG: %[[WO:.*]] = forge.shard %{{.*}} {axis = 1 : i64, group = "tp", size = 2 : i64} : (tensor<8x8xf32>) -> tensor<8x4xf32>
// CHECK: %[[X:.*]] = forge.enter_group %arg0
// CHECK: forge.matmul %[[X]], %{{.*}} : (tensor<2x3x8xf32>, tensor<8x12xf32>) -> tensor<2x3x12xf32>
// CHECK: forge.add %{{.*}}, %[[B]] : (tensor<2x3x12xf32>, tensor<12xf32>) -> tensor<2x3x12xf32>
// CHECK: forge.split %{{.*}} {axis = 2 : i64, sizes = array<i64: 4, 4, 4>}
// CHECK-COUNT-3: forge.reshape %{{.*}} {shape = array<i64: 2, 3, 2, 2>} : (tensor<2x3x4xf32>) -> tensor<2x3x2x2xf32>
// CHECK: forge.attention {{.*}} -> (tensor<2x3x2x2xf32>, tensor<2x2x3xf32>)
// CHECK: forge.reshape %{{.*}} {shape = array<i64: 2, 3, 4>} : (tensor<2x3x2x2xf32>) -> tensor<2x3x4xf32>
// CHECK: %[[P:.*]] = forge.matmul %{{.*}}, %{{.*}} : (tensor<2x3x4xf32>, tensor<4x8xf32>) -> tensor<2x3x8xf32>
// CHECK: forge.all_reduce %[[P]] {group = "tp", reduction = "sum", size = 2 : i64}
func.func @attention(%x: tensor<2x3x8xf32> {forge.name = "x"}) -> (tensor<2x3x8xf32> {forge.name = "y"}) {
  %wqkv = forge.constant {forge.initializer = "qkv.weight"} dense<0.25> : tensor<24x8xf32>
  %bqkv = forge.constant {forge.initializer = "qkv.bias"} dense<0.5> : tensor<24xf32>
  %wo = forge.constant {forge.initializer = "o.weight"} dense<0.125> : tensor<8x8xf32>
  %t = forge.transpose %wqkv {perm = array<i64: 1, 0>} : (tensor<24x8xf32>) -> tensor<8x24xf32>
  %p = forge.matmul %x, %t : (tensor<2x3x8xf32>, tensor<8x24xf32>) -> tensor<2x3x24xf32>
  %pb = forge.add %p, %bqkv : (tensor<2x3x24xf32>, tensor<24xf32>) -> tensor<2x3x24xf32>
  %s:3 = forge.split %pb {axis = 2 : i64, sizes = array<i64: 8, 8, 8>} : (tensor<2x3x24xf32>) -> (tensor<2x3x8xf32>, tensor<2x3x8xf32>, tensor<2x3x8xf32>)
  %q = forge.reshape %s#0 {shape = array<i64: 2, 3, 4, 2>} : (tensor<2x3x8xf32>) -> tensor<2x3x4x2xf32>
  %k = forge.reshape %s#1 {shape = array<i64: 2, 3, 4, 2>} : (tensor<2x3x8xf32>) -> tensor<2x3x4x2xf32>
  %v = forge.reshape %s#2 {shape = array<i64: 2, 3, 4, 2>} : (tensor<2x3x8xf32>) -> tensor<2x3x4x2xf32>
  %o, %lse = forge.attention %q, %k, %v {causal = true, layout = "bshd", scale = 0.70710678118654757 : f64} : (tensor<2x3x4x2xf32>, tensor<2x3x4x2xf32>, tensor<2x3x4x2xf32>) -> (tensor<2x3x4x2xf32>, tensor<2x4x3xf32>)
  %r = forge.reshape %o {shape = array<i64: 2, 3, 8>} : (tensor<2x3x4x2xf32>) -> tensor<2x3x8xf32>
  %tw = forge.transpose %wo {perm = array<i64: 1, 0>} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = forge.matmul %r, %tw : (tensor<2x3x8xf32>, tensor<8x8xf32>) -> tensor<2x3x8xf32>
  return %y : tensor<2x3x8xf32>
}
