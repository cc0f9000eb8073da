// RUN: forge-opt %s --split-input-file --forge-pad-contractions="min-flops=0" | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-pad-contractions | FileCheck %s --check-prefix=SMALL
// RUN: forge-opt %s --split-input-file --forge-pad-contractions="min-flops=0 min-elements=8" | FileCheck %s --check-prefix=LOW

// An LM head: N = 10 is no multiple of 4 f32s. The weight's rows (N, with
// transB) are zero-padded to 12, the product's columns sliced back to 10.
// CHECK-LABEL: func @lm_head
// CHECK: %[[W:.*]] = forge.pad %arg1 {mode = "constant", pads = array<i64: 0, 0, 2, 0>, value = 0.000000e+00 : f64} : (tensor<10x8xf32>) -> tensor<12x8xf32>
// CHECK: %[[P:.*]] = forge.matmul %arg0, %[[W]] {transB = true} : (tensor<2x3x8xf32>, tensor<12x8xf32>) -> tensor<2x3x12xf32>
// CHECK: %[[S:.*]] = forge.slice %[[P]] {ends = array<i64: 2, 3, 10>, starts = array<i64: 0, 0, 0>, steps = array<i64: 1, 1, 1>} : (tensor<2x3x12xf32>) -> tensor<2x3x10xf32>
// CHECK: return %[[S]]
// For bf16 storage later (min-elements=8), rows of 8 elements: 10 -> 16.
// LOW-LABEL: func @lm_head
// LOW: forge.pad %arg1 {{.*}}pads = array<i64: 0, 0, 6, 0>{{.*}} : (tensor<10x8xf32>) -> tensor<16x8xf32>
// Below the default size (2^30 FLOPs) nothing changes.
// SMALL-LABEL: func @lm_head
// SMALL-NOT: forge.pad
// SMALL: forge.matmul %arg0, %arg1
func.func @lm_head(%x: tensor<2x3x8xf32>, %w: tensor<10x8xf32>) -> tensor<2x3x10xf32> {
  %y = forge.matmul %x, %w {transB = true} : (tensor<2x3x8xf32>, tensor<10x8xf32>) -> tensor<2x3x10xf32>
  return %y : tensor<2x3x10xf32>
}

// -----

// Its gradients: dX = dY W contracts over K = 10 (dY's rows): both operands
// padded along K, the product unchanged in shape. dW = dY^T X: M = 10 is
// dY's innermost dim (transA), so dY is padded along it and the product's
// rows are sliced back; the gemm's C grows with M and N.
// CHECK-LABEL: func @lm_head_grads
// CHECK-DAG: %[[DY:.*]] = forge.pad %arg0 {{.*}}pads = array<i64: 0, 0, 0, 2>{{.*}} : (tensor<6x10xf32>) -> tensor<6x12xf32>
// CHECK-DAG: %[[W:.*]] = forge.pad %arg1 {{.*}}pads = array<i64: 0, 0, 2, 0>{{.*}} : (tensor<10x8xf32>) -> tensor<12x8xf32>
// CHECK: %[[DX:.*]] = forge.gemm %[[DY]], %[[W]] {{.*}} : (tensor<6x12xf32>, tensor<12x8xf32>) -> tensor<6x8xf32>
// CHECK: %[[DY2:.*]] = forge.pad %arg0 {{.*}} : (tensor<6x10xf32>) -> tensor<6x12xf32>
// CHECK: %[[C:.*]] = forge.pad %arg3 {{.*}}pads = array<i64: 0, 0, 2, 0>{{.*}} : (tensor<10x8xf32>) -> tensor<12x8xf32>
// CHECK: %[[DW:.*]] = forge.gemm %[[DY2]], %arg2, %[[C]] {{.*}} : (tensor<6x12xf32>, tensor<6x8xf32>, tensor<12x8xf32>) -> tensor<12x8xf32>
// CHECK: %[[S:.*]] = forge.slice %[[DW]] {ends = array<i64: 10, 8>
// CHECK: return %[[DX]], %[[S]]
func.func @lm_head_grads(%dy: tensor<6x10xf32>, %w: tensor<10x8xf32>, %x: tensor<6x8xf32>, %c: tensor<10x8xf32>) -> (tensor<6x8xf32>, tensor<10x8xf32>) {
  %dx = forge.gemm %dy, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<6x10xf32>, tensor<10x8xf32>) -> tensor<6x8xf32>
  %dw = forge.gemm %dy, %x, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = true, transB = false} : (tensor<6x10xf32>, tensor<6x8xf32>, tensor<10x8xf32>) -> tensor<10x8xf32>
  return %dx, %dw : tensor<6x8xf32>, tensor<10x8xf32>
}

// -----

// Not padded: aligned dims; K held outermost by both operands (transA,
// no transB: no leading dimension is K); integer and f64 contractions.
// CHECK-LABEL: func @aligned
// CHECK-NOT: forge.pad
// CHECK-NOT: forge.slice
func.func @aligned(%a: tensor<8x12xf32>, %b: tensor<12x16xf32>, %t: tensor<5x8xf32>, %u: tensor<5x4xf32>, %i: tensor<3x5xi32>, %j: tensor<5x3xi32>, %d: tensor<3x5xf64>, %e: tensor<5x3xf64>) -> (tensor<8x16xf32>, tensor<8x4xf32>, tensor<3x3xi32>, tensor<3x3xf64>) {
  %0 = forge.matmul %a, %b : (tensor<8x12xf32>, tensor<12x16xf32>) -> tensor<8x16xf32>
  %1 = forge.matmul %t, %u {transA = true} : (tensor<5x8xf32>, tensor<5x4xf32>) -> tensor<8x4xf32>
  %2 = forge.matmul %i, %j : (tensor<3x5xi32>, tensor<5x3xi32>) -> tensor<3x3xi32>
  %3 = forge.matmul %d, %e : (tensor<3x5xf64>, tensor<5x3xf64>) -> tensor<3x3xf64>
  return %0, %1, %2, %3 : tensor<8x16xf32>, tensor<8x4xf32>, tensor<3x3xi32>, tensor<3x3xf64>
}
