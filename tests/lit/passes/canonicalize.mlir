// RUN: forge-opt %s --split-input-file --canonicalize | FileCheck %s

// Identity reshapes, transposes and casts fold away.
// CHECK-LABEL: func @identities
// CHECK-NEXT: return %arg0
func.func @identities(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %r = forge.reshape %x {shape = array<i64: 2, 3>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %t = forge.transpose %r {perm = array<i64: 0, 1>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %c = forge.cast %t {to = f32} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %c : tensor<2x3xf32>
}

// -----

// Reshape of a constant becomes a constant of the new shape.
// CHECK-LABEL: func @reshape_constant
// CHECK: forge.constant dense<{{\[\[}}1, 2], [3, 4]]> : tensor<2x2xi64>
// CHECK-NOT: forge.reshape
func.func @reshape_constant() -> tensor<2x2xi64> {
  %c = forge.constant dense<[1, 2, 3, 4]> : tensor<4xi64>
  %r = forge.reshape %c {shape = array<i64: 2, 2>} : (tensor<4xi64>) -> tensor<2x2xi64>
  return %r : tensor<2x2xi64>
}

// -----

// Negative: a real permutation and a real cast stay.
// CHECK-LABEL: func @keep_real
// CHECK: forge.transpose
// CHECK: forge.cast
func.func @keep_real(%x: tensor<2x3xf32>) -> tensor<3x2xf64> {
  %t = forge.transpose %x {perm = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  %c = forge.cast %t {to = f64} : (tensor<3x2xf32>) -> tensor<3x2xf64>
  return %c : tensor<3x2xf64>
}

// -----

// Two transposes compose into one; a pair that cancels disappears.
// CHECK-LABEL: func @transpose_pairs
// CHECK-NEXT: %[[T:.*]] = forge.transpose %arg0 {perm = array<i64: 2, 0, 1>} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
// CHECK-NEXT: return %[[T]], %arg0
func.func @transpose_pairs(%x: tensor<2x3x4xf32>) -> (tensor<4x2x3xf32>, tensor<2x3x4xf32>) {
  %a = forge.transpose %x {perm = array<i64: 0, 2, 1>} : (tensor<2x3x4xf32>) -> tensor<2x4x3xf32>
  %b = forge.transpose %a {perm = array<i64: 1, 0, 2>} : (tensor<2x4x3xf32>) -> tensor<4x2x3xf32>
  %c = forge.transpose %a {perm = array<i64: 0, 2, 1>} : (tensor<2x4x3xf32>) -> tensor<2x3x4xf32>
  return %b, %c : tensor<4x2x3xf32>, tensor<2x3x4xf32>
}

// -----

// A transpose of the last two dims folds into matmul's flags (the GEMM reads
// the operand in place); other transposes stay.
// CHECK-LABEL: func @matmul_flags
// CHECK-NEXT: %[[M:.*]] = forge.matmul %arg0, %arg1 {transA = true, transB = true} : (tensor<2x3x4xf32>, tensor<2x5x3xf32>) -> tensor<2x4x5xf32>
// CHECK-NEXT: %[[T:.*]] = forge.transpose %arg2 {perm = array<i64: 1, 0, 2>}
// CHECK-NEXT: %[[N:.*]] = forge.matmul %[[T]], %arg1 {transB = true}
// CHECK-NEXT: return %[[M]], %[[N]]
func.func @matmul_flags(%a: tensor<2x3x4xf32>, %b: tensor<2x5x3xf32>, %c: tensor<4x2x3xf32>) -> (tensor<2x4x5xf32>, tensor<2x4x5xf32>) {
  %at = forge.transpose %a {perm = array<i64: 0, 2, 1>} : (tensor<2x3x4xf32>) -> tensor<2x4x3xf32>
  %bt = forge.transpose %b {perm = array<i64: 0, 2, 1>} : (tensor<2x5x3xf32>) -> tensor<2x3x5xf32>
  %m = forge.matmul %at, %bt : (tensor<2x4x3xf32>, tensor<2x3x5xf32>) -> tensor<2x4x5xf32>
  %ct = forge.transpose %c {perm = array<i64: 1, 0, 2>} : (tensor<4x2x3xf32>) -> tensor<2x4x3xf32>
  %n = forge.matmul %ct, %bt : (tensor<2x4x3xf32>, tensor<2x3x5xf32>) -> tensor<2x4x5xf32>
  return %m, %n : tensor<2x4x5xf32>, tensor<2x4x5xf32>
}

// -----

// Attention's head split and K^T in one transpose (0, 2, 3, 1) becomes the
// row-keeping head split (0, 2, 1, 3) and transB; a product transposed by
// (0, 3, 1, 2) is computed transposed (operands swapped, flags swapped and
// flipped) and then head-merged by a row-keeping (0, 2, 1, 3). A transpose
// that keeps the innermost dim, or moves it after a swap too, stays.
// CHECK-LABEL: func @attention_transposes
// CHECK-NEXT: %[[K:.*]] = forge.transpose %arg1 {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x3x4xf32>) -> tensor<2x3x8x4xf32>
// CHECK-NEXT: %[[S:.*]] = forge.matmul %arg0, %[[K]] {transB = true} : (tensor<2x3x8x4xf32>, tensor<2x3x8x4xf32>) -> tensor<2x3x8x8xf32>
// CHECK-NEXT: %[[P:.*]] = forge.matmul %arg2, %arg3 {transA = true} : (tensor<2x3x8x8xf32>, tensor<2x3x8x4xf32>) -> tensor<2x3x8x4xf32>
// CHECK-NEXT: %[[D:.*]] = forge.transpose %[[P]] {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x3x8x4xf32>) -> tensor<2x8x3x4xf32>
// CHECK-NEXT: %[[KEEP:.*]] = forge.transpose %arg1 {perm = array<i64: 1, 0, 2, 3>}
// CHECK-NEXT: %[[MOVE:.*]] = forge.transpose %arg1 {perm = array<i64: 0, 3, 2, 1>}
// CHECK-NEXT: %[[MM:.*]] = forge.matmul %[[MOVE]], %arg4 :
// CHECK-NEXT: return %[[S]], %[[D]], %[[KEEP]], %[[MM]]
func.func @attention_transposes(%q: tensor<2x3x8x4xf32>, %k: tensor<2x8x3x4xf32>, %ds: tensor<2x3x8x8xf32>, %qh: tensor<2x3x8x4xf32>, %w: tensor<2x4x8x5xf32>) -> (tensor<2x3x8x8xf32>, tensor<2x8x3x4xf32>, tensor<8x2x3x4xf32>, tensor<2x4x3x5xf32>) {
  %kt = forge.transpose %k {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x8x3x4xf32>) -> tensor<2x3x4x8xf32>
  %s = forge.matmul %q, %kt : (tensor<2x3x8x4xf32>, tensor<2x3x4x8xf32>) -> tensor<2x3x8x8xf32>
  %qt = forge.transpose %qh {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x3x8x4xf32>) -> tensor<2x3x4x8xf32>
  %p = forge.matmul %qt, %ds : (tensor<2x3x4x8xf32>, tensor<2x3x8x8xf32>) -> tensor<2x3x4x8xf32>
  %dk = forge.transpose %p {perm = array<i64: 0, 3, 1, 2>} : (tensor<2x3x4x8xf32>) -> tensor<2x8x3x4xf32>
  %keep = forge.transpose %k {perm = array<i64: 1, 0, 2, 3>} : (tensor<2x8x3x4xf32>) -> tensor<8x2x3x4xf32>
  %move = forge.transpose %k {perm = array<i64: 0, 3, 2, 1>} : (tensor<2x8x3x4xf32>) -> tensor<2x4x3x8xf32>
  %mm = forge.matmul %move, %w : (tensor<2x4x3x8xf32>, tensor<2x4x8x5xf32>) -> tensor<2x4x3x5xf32>
  return %s, %dk, %keep, %mm : tensor<2x3x8x8xf32>, tensor<2x8x3x4xf32>, tensor<8x2x3x4xf32>, tensor<2x4x3x5xf32>
}

// -----

// gemm absorbs matrix transposes of its operands, and a transposed gemm
// result (no C) is the gemm of the swapped operands.
// CHECK-LABEL: func @gemm_flags
// CHECK-NEXT: %[[G:.*]] = forge.gemm %arg1, %arg0 {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = true, transB = true} : (tensor<3x5xf32>, tensor<4x3xf32>) -> tensor<5x4xf32>
// CHECK-NEXT: return %[[G]]
func.func @gemm_flags(%a: tensor<4x3xf32>, %b: tensor<3x5xf32>) -> tensor<5x4xf32> {
  %at = forge.transpose %a {perm = array<i64: 1, 0>} : (tensor<4x3xf32>) -> tensor<3x4xf32>
  %g = forge.gemm %at, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<3x4xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
  %t = forge.transpose %g {perm = array<i64: 1, 0>} : (tensor<4x5xf32>) -> tensor<5x4xf32>
  return %t : tensor<5x4xf32>
}

// -----

// Negative: a gemm with C (bias) keeps its transposed result as a transpose.
// CHECK-LABEL: func @gemm_with_c
// CHECK: forge.gemm
// CHECK: forge.transpose
func.func @gemm_with_c(%a: tensor<4x3xf32>, %b: tensor<3x5xf32>, %c: tensor<5xf32>) -> tensor<5x4xf32> {
  %g = forge.gemm %a, %b, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<4x3xf32>, tensor<3x5xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  %t = forge.transpose %g {perm = array<i64: 1, 0>} : (tensor<4x5xf32>) -> tensor<5x4xf32>
  return %t : tensor<5x4xf32>
}

// -----

// Attention whose q, k, v (and attention_grad's o and grad_output) are head
// transposes (0, 2, 1, 3) of [B, T, H, D] tensors reads those tensors (layout
// bshd); the results' transposes back cancel: no transpose is left.
// CHECK-LABEL: func @attention_bshd
// CHECK-NOT: forge.transpose
// CHECK: %[[O:.*]], %[[L:.*]] = forge.attention %arg0, %arg1, %arg2 {causal = true, layout = "bshd", scale = 1.250000e-01 : f64} : (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16xf32>)
// CHECK: %{{.*}}, %[[DK:.*]], %{{.*}} = forge.attention_grad %arg0, %arg1, %arg2, %[[O]], %[[L]], %arg3 {causal = true, layout = "bshd", scale = 1.250000e-01 : f64} : {{.*}} -> (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>)
// CHECK-NOT: forge.transpose
// CHECK: return %[[O]], %[[DK]]
func.func @attention_bshd(%q: tensor<2x16x4x8xf32>, %k: tensor<2x16x4x8xf32>, %v: tensor<2x16x4x8xf32>, %g: tensor<2x16x4x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) {
  %qt = forge.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %kt = forge.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %vt = forge.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %o, %lse = forge.attention %qt, %kt, %vt {causal = true, scale = 1.250000e-01 : f64} : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16xf32>)
  %y = forge.transpose %o {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x16x8xf32>) -> tensor<2x16x4x8xf32>
  %gt = forge.transpose %g {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %dq, %dk, %dv = forge.attention_grad %qt, %kt, %vt, %o, %lse, %gt {causal = true, scale = 1.250000e-01 : f64} : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16xf32>, tensor<2x4x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>)
  %dkt = forge.transpose %dk {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x16x8xf32>) -> tensor<2x16x4x8xf32>
  return %y, %dkt : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>
}

// -----

// Negative: one operand is not a head transpose (v is already [B, H, T, D]): unchanged.
// CHECK-LABEL: func @attention_mixed
// CHECK: forge.transpose
// CHECK: forge.attention %{{.*}}, %{{.*}}, %arg2 {causal = false, scale = 1.000000e+00 : f64}
func.func @attention_mixed(%q: tensor<1x8x2x8xf32>, %k: tensor<1x8x2x8xf32>, %v: tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32> {
  %qt = forge.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x2x8xf32>) -> tensor<1x2x8x8xf32>
  %kt = forge.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x2x8xf32>) -> tensor<1x2x8x8xf32>
  %o, %lse = forge.attention %qt, %kt, %v {causal = false, scale = 1.0 : f64} : (tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32>) -> (tensor<1x2x8x8xf32>, tensor<1x2x8xf32>)
  return %o : tensor<1x2x8x8xf32>
}
