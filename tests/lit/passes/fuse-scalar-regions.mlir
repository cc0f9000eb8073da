// RUN: forge-opt %s --split-input-file --forge-fuse | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-fuse | forge-opt --split-input-file --verify-each > /dev/null

// Two scalar loop regions that do not read each other (a clip scale from the
// gradient norm, a learning rate from the step) become one horizontal region
// at the second one's place: one launch.
// CHECK-LABEL: func @independent
// CHECK: %[[H:.*]]:2 = forge.fusion "horizontal"(%arg0, %arg1, %arg2, %arg3)
// CHECK: forge.sqrt
// CHECK: forge.mul
// CHECK: return %[[H]]#0, %[[H]]#1
func.func @independent(%sum: tensor<f32>, %max: tensor<f32>, %step: tensor<f32>, %lr: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  %n = forge.sqrt %sum : (tensor<f32>) -> tensor<f32>
  %c = forge.div %max, %n : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %s = forge.mul %step, %lr : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t = forge.neg %s : (tensor<f32>) -> tensor<f32>
  return %c, %t : tensor<f32>, tensor<f32>
}

// -----

// Not grouped: the second reads the first.
// CHECK-LABEL: func @dependent
// CHECK-NOT: "horizontal"
// CHECK: return
func.func @dependent(%sum: tensor<f32>, %max: tensor<f32>) -> tensor<f32> {
  %n = forge.sqrt %sum : (tensor<f32>) -> tensor<f32>
  %c = forge.div %max, %n : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %big = forge.broadcast %c {shape = array<i64: 4>} : (tensor<f32>) -> tensor<4xf32>
  %r = forge.reduce_sum %big {axes = array<i64: 0>, keepdims = false} : (tensor<4xf32>) -> tensor<f32>
  %e = forge.exp %r : (tensor<f32>) -> tensor<f32>
  %f = forge.neg %e : (tensor<f32>) -> tensor<f32>
  return %f : tensor<f32>
}

// -----

// Not grouped: an op between the two reads the first (grouping would have to
// move it after the second).
// CHECK-LABEL: func @read_between
// CHECK-NOT: "horizontal"
// CHECK: return
func.func @read_between(%sum: tensor<f32>, %max: tensor<f32>, %step: tensor<f32>, %lr: tensor<f32>) -> (tensor<4xf32>, tensor<f32>) {
  %n = forge.sqrt %sum : (tensor<f32>) -> tensor<f32>
  %c = forge.div %max, %n : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %big = forge.broadcast %c {shape = array<i64: 4>} : (tensor<f32>) -> tensor<4xf32>
  %s = forge.mul %step, %lr : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t = forge.neg %s : (tensor<f32>) -> tensor<f32>
  return %big, %t : tensor<4xf32>, tensor<f32>
}

// -----

// A returned one-element constant (a fixed learning rate as a metric) is
// written by the scalar horizontal region instead of a copy of its own; the
// other reader keeps reading the constant.
// CHECK-LABEL: func @returned_constant
// CHECK: %[[LR:.*]] = forge.constant dense<1.000000e-03>
// CHECK: %[[H:.*]]:2 = forge.fusion "horizontal"(%[[LR]], %arg0, %arg1)
// CHECK: forge.mul %[[LR]], %arg2
// CHECK: return %[[H]]#0, %[[H]]#1, %{{.*}}
func.func @returned_constant(%sum: tensor<f32>, %max: tensor<f32>, %g: tensor<4xf32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>) {
  %lr = forge.constant dense<1.0e-03> : tensor<f32>
  %n = forge.sqrt %sum : (tensor<f32>) -> tensor<f32>
  %c = forge.div %max, %n : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %u = forge.mul %lr, %g : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>
  return %lr, %c, %u : tensor<f32>, tensor<f32>, tensor<4xf32>
}

// -----

// Not: a returned constant of several elements (a copy is its cheapest writer).
// CHECK-LABEL: func @returned_vector_constant
// CHECK-NOT: forge.fusion
// CHECK: return
func.func @returned_vector_constant() -> tensor<2xf32> {
  %c = forge.constant dense<[1.0, 2.0]> : tensor<2xf32>
  return %c : tensor<2xf32>
}
