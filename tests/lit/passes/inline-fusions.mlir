// RUN: forge-opt %s --split-input-file --forge-inline-fusions | FileCheck %s

// A loop region becomes its ops, in order, reading the region's inputs.
// CHECK-LABEL: func @loop
// CHECK-NOT: forge.fusion
// CHECK: %[[A:.*]] = forge.add %arg0, %arg1
// CHECK-NEXT: %[[T:.*]] = forge.tanh %[[A]]
// CHECK-NEXT: %[[N:.*]] = forge.neg %[[T]]
// CHECK-NEXT: return %[[N]]
func.func @loop(%x: tensor<2x4xf32>, %b: tensor<4xf32>) -> tensor<2x4xf32> {
  %f = forge.fusion "loop"(%x, %b) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a0: tensor<2x4xf32>, %a1: tensor<4xf32>):
    %0 = forge.add %a0, %a1 : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
    %1 = forge.tanh %0 : (tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %1 : tensor<2x4xf32>
  }
  %n = forge.neg %f : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %n : tensor<2x4xf32>
}

// -----

// A horizontal region: every member's ops, member by member; results in order.
// CHECK-LABEL: func @horizontal
// CHECK-NOT: forge.fusion
// CHECK: %[[S:.*]] = forge.sub %arg0, %arg1
// CHECK-NEXT: %[[M:.*]] = forge.mul %arg2, %arg2
// CHECK-NEXT: return %[[M]], %[[S]]
func.func @horizontal(%p: tensor<8xf32>, %g: tensor<8xf32>, %q: tensor<3xf32>) -> (tensor<3xf32>, tensor<8xf32>) {
  %h:2 = forge.fusion "horizontal"(%p, %g, %q) : (tensor<8xf32>, tensor<8xf32>, tensor<3xf32>) -> (tensor<8xf32>, tensor<3xf32>) {
  ^bb0(%a: tensor<8xf32>, %b: tensor<8xf32>, %c: tensor<3xf32>):
    %0 = forge.fusion "loop"(%a, %b) : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32> {
    ^bb0(%x: tensor<8xf32>, %y: tensor<8xf32>):
      %s = forge.sub %x, %y : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
      forge.yield %s : tensor<8xf32>
    }
    %1 = forge.fusion "loop"(%c) : (tensor<3xf32>) -> tensor<3xf32> {
    ^bb0(%z: tensor<3xf32>):
      %m = forge.mul %z, %z : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
      forge.yield %m : tensor<3xf32>
    }
    forge.yield %0, %1 : tensor<8xf32>, tensor<3xf32>
  }
  return %h#1, %h#0 : tensor<3xf32>, tensor<8xf32>
}

// -----

// A region with a kernel stays.
// CHECK-LABEL: func @has_kernel
// CHECK: forge.fusion "loop"(%arg0) {forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k0_fusion"}}
func.func @has_kernel(%x: tensor<4xf32>) -> tensor<4xf32> {
  %f = forge.fusion "loop"(%x) {forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k0_fusion"}} : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %0 = forge.neg %a : (tensor<4xf32>) -> tensor<4xf32>
    %1 = forge.abs %0 : (tensor<4xf32>) -> tensor<4xf32>
    forge.yield %1 : tensor<4xf32>
  }
  return %f : tensor<4xf32>
}
