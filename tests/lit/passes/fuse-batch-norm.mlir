// RUN: forge-opt %s --split-input-file --forge-fuse | FileCheck %s
// The regions print and parse back (the verifier accepts what the pass makes).
// RUN: forge-opt %s --split-input-file --forge-fuse | forge-opt --split-input-file --verify-each > /dev/null
// RUN: forge-opt %s --split-input-file --forge-fuse="norms=false" | FileCheck %s --check-prefix=OFF

// A batch norm, its ReLU and the ReLU's saved mask: one "batch_norm" region
// yielding the ReLU, the mask, then the running statistics (returned state).
// CHECK-LABEL: func @bn_relu
// CHECK: %[[R:.*]]:4 = forge.fusion "batch_norm"(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5) : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<f32>) -> (tensor<2x4x3x3xf32>, tensor<2x4x3x3xi1>, tensor<4xf32>, tensor<4xf32>) {
// CHECK:   %[[Y:.*]], %[[M:.*]], %[[V:.*]] = forge.batch_norm_training
// CHECK:   %[[RELU:.*]] = forge.relu %[[Y]]
// CHECK:   %[[MASK:.*]] = forge.greater %[[RELU]]
// CHECK:   forge.yield %[[RELU]], %[[MASK]], %[[M]], %[[V]]
// CHECK: return %[[R]]#0, %[[R]]#1, %[[R]]#2, %[[R]]#3
// OFF-LABEL: func @bn_relu
// OFF-NOT: "batch_norm"
func.func @bn_relu(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %rm: tensor<4xf32>, %rv: tensor<4xf32>, %zero: tensor<f32>) -> (tensor<2x4x3x3xf32>, tensor<2x4x3x3xi1>, tensor<4xf32>, tensor<4xf32>) {
  %y, %m, %v = forge.batch_norm_training %x, %s, %b, %rm, %rv {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  %r = forge.relu %y : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
  %k = forge.greater %r, %zero : (tensor<2x4x3x3xf32>, tensor<f32>) -> tensor<2x4x3x3xi1>
  return %r, %k, %m, %v : tensor<2x4x3x3xf32>, tensor<2x4x3x3xi1>, tensor<4xf32>, tensor<4xf32>
}

// -----

// A residual block's end: add(bn(x), identity) then ReLU; the identity has the
// image's shape. A reader of the running mean placed before the epilogue
// moves after the region.
// CHECK-LABEL: func @bn_add_relu
// CHECK: %[[R:.*]]:3 = forge.fusion "batch_norm"(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5)
// CHECK:   forge.add
// CHECK:   forge.relu
// CHECK: forge.neg %[[R]]#1
// CHECK-NOT: forge.batch_norm_training
func.func @bn_add_relu(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %rm: tensor<4xf32>, %rv: tensor<4xf32>, %id: tensor<2x4x3x3xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  %y, %m, %v = forge.batch_norm_training %x, %s, %b, %rm, %rv {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  %n = forge.neg %m : (tensor<4xf32>) -> tensor<4xf32>
  %a = forge.add %y, %id : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
  %r = forge.relu %a : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
  return %r, %n, %v : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Not fused: the normalized output has two readers (a residual's downsample
// branch and its ReLU), and an epilogue that reads a per-channel broadcast
// (not the image's shape, not one element).
// CHECK-LABEL: func @not_fused
// CHECK-NOT: "batch_norm"
// CHECK: return
func.func @not_fused(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %rm: tensor<4xf32>, %rv: tensor<4xf32>, %c: tensor<1x4x1x1xf32>) -> (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) {
  %y, %m, %v = forge.batch_norm_training %x, %s, %b, %rm, %rv {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  %r = forge.relu %y : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
  %e = forge.exp %y : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
  %y2, %m2, %v2 = forge.batch_norm_training %x, %s, %b, %rm, %rv {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  %p = forge.mul %y2, %c : (tensor<2x4x3x3xf32>, tensor<1x4x1x1xf32>) -> tensor<2x4x3x3xf32>
  return %r, %e, %p : tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>
}

// -----

// The backward pass: the ReLU's mask applied to the incoming gradient is the
// batch-norm gradient's prologue (evaluated in both of its passes).
// CHECK-LABEL: func @bn_grad_relu_mask
// CHECK: %[[R:.*]]:3 = forge.fusion "batch_norm"(%arg0, %arg1, %arg2, %arg3, %arg4) : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xi1>, tensor<2x4x3x3xf32>, tensor<f32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
// CHECK:   %[[DY:.*]] = forge.where
// CHECK:   %[[G:.*]]:3 = forge.batch_norm_training_grad %{{.*}}, %{{.*}}, %[[DY]]
// CHECK:   forge.yield %[[G]]#0, %[[G]]#1, %[[G]]#2
// CHECK: return %[[R]]#0, %[[R]]#1, %[[R]]#2
// OFF-LABEL: func @bn_grad_relu_mask
// OFF-NOT: "batch_norm"
func.func @bn_grad_relu_mask(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %mask: tensor<2x4x3x3xi1>, %g: tensor<2x4x3x3xf32>, %zero: tensor<f32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  %dy = forge.where %mask, %g, %zero : (tensor<2x4x3x3xi1>, tensor<2x4x3x3xf32>, tensor<f32>) -> tensor<2x4x3x3xf32>
  %dx, %ds, %db = forge.batch_norm_training_grad %x, %s, %dy {bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  return %dx, %ds, %db : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Not fused: the masked gradient also flows into a residual's other branch.
// CHECK-LABEL: func @bn_grad_shared_dy
// CHECK-NOT: "batch_norm"
// CHECK: return
func.func @bn_grad_shared_dy(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %mask: tensor<2x4x3x3xi1>, %g: tensor<2x4x3x3xf32>, %zero: tensor<f32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>) {
  %dy = forge.where %mask, %g, %zero : (tensor<2x4x3x3xi1>, tensor<2x4x3x3xf32>, tensor<f32>) -> tensor<2x4x3x3xf32>
  %dx, %ds, %db = forge.batch_norm_training_grad %x, %s, %dy {bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  return %dx, %ds, %db, %dy : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>
}
