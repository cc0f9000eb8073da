// RUN: forge-opt %s --split-input-file --forge-fold-constants | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-fold-constants=max-elements=2 | FileCheck %s --check-prefix=LIMIT

// All-constant arithmetic folds through the runtime kernels.
// CHECK-LABEL: func @fold_add_mul
// CHECK-NOT: forge.add
// CHECK-NOT: forge.mul
// CHECK: %[[C:.*]] = forge.constant dense<[4.000000e+00, 9.000000e+00, 1.600000e+01]> : tensor<3xf32>
// CHECK: return %[[C]]
func.func @fold_add_mul() -> tensor<3xf32> {
  %a = forge.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %b = forge.constant dense<1.0> : tensor<3xf32>
  %s = forge.add %a, %b : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  %p = forge.mul %s, %s : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  return %p : tensor<3xf32>
}

// LIMIT-LABEL: func @fold_add_mul
// LIMIT: forge.add

// -----

// Shape computations on integers fold too (gather of a shape vector).
// CHECK-LABEL: func @fold_gather
// CHECK: forge.constant dense<[8, 4]> : tensor<2xi64>
// CHECK-NOT: forge.gather
func.func @fold_gather() -> tensor<2xi64> {
  %shape = forge.constant dense<[2, 4, 8]> : tensor<3xi64>
  %idx = forge.constant dense<[2, 1]> : tensor<2xi64>
  %g = forge.gather %shape, %idx {axis = 0 : i64} : (tensor<3xi64>, tensor<2xi64>) -> tensor<2xi64>
  return %g : tensor<2xi64>
}

// -----

// Negative: an op with a non-constant operand stays.
// CHECK-LABEL: func @keep_dynamic
// CHECK: forge.add %arg0
func.func @keep_dynamic(%x: tensor<3xf32>) -> tensor<3xf32> {
  %b = forge.constant dense<1.0> : tensor<3xf32>
  %s = forge.add %x, %b : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  return %s : tensor<3xf32>
}

// -----

// Negative: an out-of-range gather index is not folded (it would fail at
// run time with a clear error instead of being baked into the constant).
// CHECK-LABEL: func @keep_invalid
// CHECK: forge.gather
func.func @keep_invalid() -> tensor<1xi64> {
  %shape = forge.constant dense<[2, 4, 8]> : tensor<3xi64>
  %idx = forge.constant dense<[7]> : tensor<1xi64>
  %g = forge.gather %shape, %idx {axis = 0 : i64} : (tensor<3xi64>, tensor<1xi64>) -> tensor<1xi64>
  return %g : tensor<1xi64>
}
