// Printed IR parses back to identical IR, in both the custom and the generic form.
// RUN: forge-opt %s > %t.1
// RUN: forge-opt %t.1 > %t.2
// RUN: diff %t.1 %t.2
// RUN: FileCheck %s < %t.2
// RUN: forge-opt %s --mlir-print-op-generic | forge-opt > %t.generic
// RUN: forge-opt %s > %t.custom
// RUN: diff %t.generic %t.custom

// CHECK-LABEL: func @every_kind
func.func @every_kind(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %i: tensor<2xi64>) -> (tensor<2x4x3x3xf32>, tensor<2x3xf32>, tensor<2x2x8x8xf32>) {
  // CHECK: forge.conv %arg0, %arg1 {dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>}
  %c = forge.conv %x, %w {strides = array<i64: 2, 2>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x4x4xf32>
  // CHECK: forge.max_pool
  %p = forge.max_pool %c {kernel_shape = array<i64: 2, 2>, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, ceil_mode = false} : (tensor<2x4x4x4xf32>) -> tensor<2x4x3x3xf32>
  // CHECK: forge.reduce_mean {{.*}} {axes = array<i64: 2, 3>, keepdims = false}
  %m = forge.reduce_mean %x {axes = array<i64: 2, 3>, keepdims = false} : (tensor<2x3x8x8xf32>) -> tensor<2x3xf32>
  // CHECK: forge.gelu {{.*}} {approximate = "tanh"}
  %g = forge.gelu %m {approximate = "tanh"} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // CHECK: forge.gather {{.*}} {axis = 1 : i64}
  %s = forge.gather %x, %i {axis = 1 : i64} : (tensor<2x3x8x8xf32>, tensor<2xi64>) -> tensor<2x2x8x8xf32>
  // CHECK: forge.constant dense<1.500000e+00> : tensor<f32>
  %k = forge.constant dense<1.5> : tensor<f32>
  // CHECK: forge.mul
  %y = forge.mul %g, %k : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  return %p, %y, %s : tensor<2x4x3x3xf32>, tensor<2x3xf32>, tensor<2x2x8x8xf32>
}
