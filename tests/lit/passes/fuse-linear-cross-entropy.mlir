// RUN: forge-opt %s --split-input-file --forge-fuse-linear-cross-entropy | FileCheck %s

// A language model's head as the loss head's stages leave it (one chunk): the
// bf16 matmul x w^T whose f32 logits only the merged loss reads, a bf16
// gradient. One op at the loss's place, with the loss's and the gradient's
// types and `classes` kept; the matmul is gone and the gradient's readers
// read the new op.
// CHECK-LABEL: func @head
// CHECK-NEXT: %[[LOSS:.*]], %[[D:.*]] = forge.linear_cross_entropy_with_grad %arg0, %arg1, %arg2, %arg3 {classes = 50 : i64, reduction = "sum"} : (tensor<16x32xbf16>, tensor<56x32xbf16>, tensor<16xi64>, tensor<f32>) -> (tensor<16xf32>, tensor<16x56xbf16>)
// CHECK-NEXT: %[[DX:.*]] = forge.gemm %[[D]], %arg1
// CHECK-NOT: forge.matmul
// CHECK-NOT: forge.cross_entropy_with_grad
// CHECK: return %[[LOSS]], %[[DX]]
func.func @head(%x: tensor<16x32xbf16>, %w: tensor<56x32xbf16>, %t: tensor<16xi64>, %g: tensor<f32>)
    -> (tensor<16xf32>, tensor<16x32xf32>) {
  %logits = forge.matmul %x, %w {transB = true} : (tensor<16x32xbf16>, tensor<56x32xbf16>) -> tensor<16x56xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {classes = 50 : i64, reduction = "sum"} : (tensor<16x56xf32>, tensor<16xi64>, tensor<f32>) -> (tensor<16xf32>, tensor<16x56xbf16>)
  %dx = forge.gemm %d, %w {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = false, transB = false} : (tensor<16x56xbf16>, tensor<56x32xbf16>) -> tensor<16x32xf32>
  return %loss, %dx : tensor<16xf32>, tensor<16x32xf32>
}

// -----

// Per-row upstream gradients (reduction none) and i32 targets, no padding.
// CHECK-LABEL: func @rows
// CHECK-NEXT: %[[LOSS:.*]], %[[D:.*]] = forge.linear_cross_entropy_with_grad %arg0, %arg1, %arg2, %arg3 {reduction = "none"} : (tensor<4x8xbf16>, tensor<8x8xbf16>, tensor<4xi32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4x8xbf16>)
// CHECK-NEXT: return %[[LOSS]], %[[D]]
func.func @rows(%x: tensor<4x8xbf16>, %w: tensor<8x8xbf16>, %t: tensor<4xi32>, %g: tensor<4xf32>)
    -> (tensor<4xf32>, tensor<4x8xbf16>) {
  %logits = forge.matmul %x, %w {transB = true} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "none"} : (tensor<4x8xf32>, tensor<4xi32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4x8xbf16>)
  return %loss, %d : tensor<4xf32>, tensor<4x8xbf16>
}

// -----

// An unchunked head: x [B, T, K] by w, the logits [B, T, C] reshaped to the loss's
// [B T, C] rows. x's rows are flattened the same way (a view) and the reshape goes.
// CHECK-LABEL: func @tokens
// CHECK-NEXT: %[[X:.*]] = forge.reshape %arg0 {shape = array<i64: 80, 16>} : (tensor<2x40x16xbf16>) -> tensor<80x16xbf16>
// CHECK-NEXT: %[[LOSS:.*]], %[[D:.*]] = forge.linear_cross_entropy_with_grad %[[X]], %arg1, %arg2, %arg3 {reduction = "mean"} : (tensor<80x16xbf16>, tensor<24x16xbf16>, tensor<80xi64>, tensor<f32>) -> (tensor<80xf32>, tensor<80x24xbf16>)
// CHECK-NEXT: return %[[LOSS]], %[[D]]
func.func @tokens(%x: tensor<2x40x16xbf16>, %w: tensor<24x16xbf16>, %t: tensor<80xi64>, %g: tensor<f32>)
    -> (tensor<80xf32>, tensor<80x24xbf16>) {
  %p = forge.matmul %x, %w {transB = true} : (tensor<2x40x16xbf16>, tensor<24x16xbf16>) -> tensor<2x40x24xf32>
  %logits = forge.reshape %p {shape = array<i64: 80, 24>} : (tensor<2x40x24xf32>) -> tensor<80x24xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "mean"} : (tensor<80x24xf32>, tensor<80xi64>, tensor<f32>) -> (tensor<80xf32>, tensor<80x24xbf16>)
  return %loss, %d : tensor<80xf32>, tensor<80x24xbf16>
}

// -----

// Negative: a reshape that does not keep x's rows as the logits' rows ([2, 40, 24] read as
// [40, 48]: two rows of logits in one): the pair stays.
// CHECK-LABEL: func @mixed_rows
// CHECK: forge.matmul
// CHECK: forge.cross_entropy_with_grad
// CHECK-NOT: forge.linear_cross_entropy_with_grad
func.func @mixed_rows(%x: tensor<2x40x16xbf16>, %w: tensor<24x16xbf16>, %t: tensor<40xi64>, %g: tensor<f32>)
    -> (tensor<40xf32>, tensor<40x48xbf16>) {
  %p = forge.matmul %x, %w {transB = true} : (tensor<2x40x16xbf16>, tensor<24x16xbf16>) -> tensor<2x40x24xf32>
  %logits = forge.reshape %p {shape = array<i64: 40, 48>} : (tensor<2x40x24xf32>) -> tensor<40x48xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "mean"} : (tensor<40x48xf32>, tensor<40xi64>, tensor<f32>) -> (tensor<40xf32>, tensor<40x48xbf16>)
  return %loss, %d : tensor<40xf32>, tensor<40x48xbf16>
}

// -----

// Negative: the logits have another reader (returned): they must be stored.
// CHECK-LABEL: func @logits_read
// CHECK: forge.matmul
// CHECK: forge.cross_entropy_with_grad
// CHECK-NOT: forge.linear_cross_entropy_with_grad
func.func @logits_read(%x: tensor<16x32xbf16>, %w: tensor<56x32xbf16>, %t: tensor<16xi64>, %g: tensor<f32>)
    -> (tensor<16x56xf32>, tensor<16x56xbf16>) {
  %logits = forge.matmul %x, %w {transB = true} : (tensor<16x32xbf16>, tensor<56x32xbf16>) -> tensor<16x56xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "sum"} : (tensor<16x56xf32>, tensor<16xi64>, tensor<f32>) -> (tensor<16xf32>, tensor<16x56xbf16>)
  return %logits, %d : tensor<16x56xf32>, tensor<16x56xbf16>
}

// -----

// Negative: an f32 gradient (the runtime's kernels write bf16), and f32
// operands: both stay.
// CHECK-LABEL: func @f32_gradient
// CHECK: forge.matmul
// CHECK: forge.cross_entropy_with_grad
// CHECK-LABEL: func @f32_operands
// CHECK: forge.matmul
// CHECK: forge.cross_entropy_with_grad
// CHECK-NOT: forge.linear_cross_entropy_with_grad
func.func @f32_gradient(%x: tensor<16x32xbf16>, %w: tensor<56x32xbf16>, %t: tensor<16xi64>, %g: tensor<f32>)
    -> (tensor<16xf32>, tensor<16x56xf32>) {
  %logits = forge.matmul %x, %w {transB = true} : (tensor<16x32xbf16>, tensor<56x32xbf16>) -> tensor<16x56xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "sum"} : (tensor<16x56xf32>, tensor<16xi64>, tensor<f32>) -> (tensor<16xf32>, tensor<16x56xf32>)
  return %loss, %d : tensor<16xf32>, tensor<16x56xf32>
}
func.func @f32_operands(%x: tensor<16x32xf32>, %w: tensor<56x32xf32>, %t: tensor<16xi64>, %g: tensor<f32>)
    -> (tensor<16xf32>, tensor<16x56xbf16>) {
  %logits = forge.matmul %x, %w {transB = true} : (tensor<16x32xf32>, tensor<56x32xf32>) -> tensor<16x56xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "sum"} : (tensor<16x56xf32>, tensor<16xi64>, tensor<f32>) -> (tensor<16xf32>, tensor<16x56xbf16>)
  return %loss, %d : tensor<16xf32>, tensor<16x56xbf16>
}

// -----

// Negative: w not read transposed (x w, w [K, C]), and a K that is not a
// multiple of 8 (TMA's 16-byte rows): both stay.
// CHECK-LABEL: func @untransposed
// CHECK: forge.matmul
// CHECK: forge.cross_entropy_with_grad
// CHECK-LABEL: func @odd_k
// CHECK: forge.matmul
// CHECK: forge.cross_entropy_with_grad
// CHECK-NOT: forge.linear_cross_entropy_with_grad
func.func @untransposed(%x: tensor<16x32xbf16>, %w: tensor<32x56xbf16>, %t: tensor<16xi64>, %g: tensor<f32>)
    -> (tensor<16xf32>, tensor<16x56xbf16>) {
  %logits = forge.matmul %x, %w : (tensor<16x32xbf16>, tensor<32x56xbf16>) -> tensor<16x56xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "sum"} : (tensor<16x56xf32>, tensor<16xi64>, tensor<f32>) -> (tensor<16xf32>, tensor<16x56xbf16>)
  return %loss, %d : tensor<16xf32>, tensor<16x56xbf16>
}
func.func @odd_k(%x: tensor<16x36xbf16>, %w: tensor<56x36xbf16>, %t: tensor<16xi64>, %g: tensor<f32>)
    -> (tensor<16xf32>, tensor<16x56xbf16>) {
  %logits = forge.matmul %x, %w {transB = true} : (tensor<16x36xbf16>, tensor<56x36xbf16>) -> tensor<16x56xf32>
  %loss, %d = forge.cross_entropy_with_grad %logits, %t, %g {reduction = "sum"} : (tensor<16x56xf32>, tensor<16xi64>, tensor<f32>) -> (tensor<16xf32>, tensor<16x56xbf16>)
  return %loss, %d : tensor<16xf32>, tensor<16x56xbf16>
}
