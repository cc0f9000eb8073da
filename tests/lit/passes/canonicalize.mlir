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
