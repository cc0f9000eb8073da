// RUN: forge-opt %s --split-input-file --cse | FileCheck %s

// Identical pure ops merge.
// CHECK-LABEL: func @merge
// CHECK: %[[E:.*]] = forge.exp %arg0
// CHECK-NOT: forge.exp
// CHECK: forge.add %[[E]], %[[E]]
func.func @merge(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %b = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %s = forge.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

// Negative: ops that differ in an attribute do not merge.
// CHECK-LABEL: func @attrs_differ
// CHECK: forge.leaky_relu %arg0 {alpha = 1.000000e-01 : f64}
// CHECK: forge.leaky_relu %arg0 {alpha = 2.000000e-01 : f64}
func.func @attrs_differ(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = forge.leaky_relu %x {alpha = 0.1 : f64} : (tensor<4xf32>) -> tensor<4xf32>
  %b = forge.leaky_relu %x {alpha = 0.2 : f64} : (tensor<4xf32>) -> tensor<4xf32>
  %s = forge.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %s : tensor<4xf32>
}
