// RUN: forge-opt %s --split-input-file --forge-merge-cross-entropy-grad | FileCheck %s

// A classifier's loss and gradient as forge-fuse leaves them, the gradient
// stored in bf16 (forge-assign-precision), its g the backward seed: one
// merged op at the loss's place with the loss's and the gradient's types,
// the padded rows' `classes` kept. The seed's producers (a constant times the
// loss scale), after the loss, move before it in their order.
// CHECK-LABEL: func @seeded
// CHECK-NEXT: %[[K:.*]] = forge.constant dense<5.000000e-01>
// CHECK-NEXT: %[[G:.*]] = forge.mul %[[K]], %arg2
// CHECK-NEXT: %[[LOSS:.*]], %[[D:.*]] = forge.cross_entropy_with_grad %arg0, %arg1, %[[G]] {classes = 15 : i64, reduction = "mean"} : (tensor<8x16xf32>, tensor<8xi64>, tensor<f32>) -> (tensor<8xf32>, tensor<8x16xbf16>)
// CHECK-NEXT: %[[MEAN:.*]] = forge.reduce_mean %[[LOSS]]
// CHECK-NOT: forge.cross_entropy
// CHECK: return %[[MEAN]], %[[D]]
func.func @seeded(%logits: tensor<8x16xf32>, %t: tensor<8xi64>, %scale: tensor<f32>)
    -> (tensor<f32>, tensor<8x16xbf16>) {
  %loss, %lse = forge.cross_entropy %logits, %t {classes = 15 : i64} : (tensor<8x16xf32>, tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>)
  %mean = forge.reduce_mean %loss {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
  %half = forge.constant dense<5.000000e-01> : tensor<f32>
  %g = forge.mul %half, %scale : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {classes = 15 : i64, reduction = "mean"} : (tensor<8x16xf32>, tensor<8xf32>, tensor<8xi64>, tensor<f32>) -> tensor<8x16xbf16>
  return %mean, %d : tensor<f32>, tensor<8x16xbf16>
}

// -----

// Per-row upstream gradients (reduction none) defined before the loss merge
// in place.
// CHECK-LABEL: func @rows
// CHECK-NEXT: %[[LOSS:.*]], %[[D:.*]] = forge.cross_entropy_with_grad %arg0, %arg1, %arg2 {reduction = "none"} : (tensor<4x6xf32>, tensor<4xi32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4x6xf32>)
// CHECK-NEXT: return %[[LOSS]], %[[D]]
func.func @rows(%logits: tensor<4x6xf32>, %t: tensor<4xi32>, %g: tensor<4xf32>)
    -> (tensor<4xf32>, tensor<4x6xf32>) {
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<4x6xf32>, tensor<4xi32>) -> (tensor<4xf32>, tensor<4xf32>)
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "none"} : (tensor<4x6xf32>, tensor<4xf32>, tensor<4xi32>, tensor<4xf32>) -> tensor<4x6xf32>
  return %loss, %d : tensor<4xf32>, tensor<4x6xf32>
}

// -----

// Negative: g depends on the loss (a gradient scaled by the loss itself):
// the pair stays, and so does the order.
// CHECK-LABEL: func @g_reads_loss
// CHECK: forge.cross_entropy %arg0
// CHECK: forge.reduce_mean
// CHECK: forge.cross_entropy_grad
// CHECK-NOT: forge.cross_entropy_with_grad
func.func @g_reads_loss(%logits: tensor<4x6xf32>, %t: tensor<4xi64>) -> tensor<4x6xf32> {
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<4x6xf32>, tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>)
  %g = forge.reduce_mean %loss {axes = array<i64: 0>, keepdims = false} : (tensor<4xf32>) -> tensor<f32>
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "sum"} : (tensor<4x6xf32>, tensor<4xf32>, tensor<4xi64>, tensor<f32>) -> tensor<4x6xf32>
  return %d : tensor<4x6xf32>
}

// -----

// Negative: the lse has another reader (it is returned), so it must be
// stored: the pair stays.
// CHECK-LABEL: func @lse_read
// CHECK: forge.cross_entropy %arg0
// CHECK: forge.cross_entropy_grad
// CHECK-NOT: forge.cross_entropy_with_grad
func.func @lse_read(%logits: tensor<4x6xf32>, %t: tensor<4xi64>, %g: tensor<f32>)
    -> (tensor<4xf32>, tensor<4x6xf32>) {
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<4x6xf32>, tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>)
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "mean"} : (tensor<4x6xf32>, tensor<4xf32>, tensor<4xi64>, tensor<f32>) -> tensor<4x6xf32>
  return %lse, %d : tensor<4xf32>, tensor<4x6xf32>
}

// -----

// Negative: the gradient reads other logits than the loss (a gradient of a
// second head through the first's lse is no merge): the pair stays.
// CHECK-LABEL: func @other_logits
// CHECK: forge.cross_entropy %arg0
// CHECK: forge.cross_entropy_grad %arg1
// CHECK-NOT: forge.cross_entropy_with_grad
func.func @other_logits(%a: tensor<4x6xf32>, %b: tensor<4x6xf32>, %t: tensor<4xi64>,
                        %g: tensor<f32>) -> (tensor<4xf32>, tensor<4x6xf32>) {
  %loss, %lse = forge.cross_entropy %a, %t : (tensor<4x6xf32>, tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>)
  %d = forge.cross_entropy_grad %b, %lse, %t, %g {reduction = "mean"} : (tensor<4x6xf32>, tensor<4xf32>, tensor<4xi64>, tensor<f32>) -> tensor<4x6xf32>
  return %loss, %d : tensor<4xf32>, tensor<4x6xf32>
}
