// RUN: forge-opt %s --split-input-file --forge-permute-parameters | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-permute-parameters=report=1 --mlir-print-op-on-diagnostic=false 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// A weight read channels-last by both routines (as forge-assign-layout leaves a conv net),
// its gradient arriving through the inverse transpose, momentum SGD and the gradient norm:
// the weight, its momentum and every pointwise value between them are stored [O, kh, kw, C]
// (forge.layout_perm); both transposes go, the norm's whole sum reads the stored order.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg1: tensor<4x3x3x2xf32> {forge.kind = "parameter", forge.layout_perm = array<i64: 0, 2, 3, 1>, forge.name = "w"}
// CHECK-SAME: %arg2: tensor<4x3x3x2xf32> {forge.kind = "state", forge.layout_perm = array<i64: 0, 2, 3, 1>, forge.name = "w.momentum"}
// CHECK-SAME: -> (tensor<f32>, tensor<4x3x3x2xf32> {forge.updates = "w"}, tensor<4x3x3x2xf32> {forge.updates = "w.momentum"})
// CHECK-NOT: forge.transpose
// CHECK: %[[Y:.*]] = forge.conv %arg0, %arg1 {channels_last = true{{.*}}} : (tensor<2x8x8x2xf32>, tensor<4x3x3x2xf32>)
// CHECK: %[[G:.*]] = forge.conv_grad_weight
// CHECK: %[[SQ:.*]] = forge.mul %[[G]], %[[G]] : (tensor<4x3x3x2xf32>, tensor<4x3x3x2xf32>) -> tensor<4x3x3x2xf32>
// CHECK: forge.reduce_sum %[[SQ]] {axes = array<i64: 0, 1, 2, 3>, keepdims = false} : (tensor<4x3x3x2xf32>) -> tensor<f32>
// CHECK: %[[M:.*]] = forge.add {{.*}} : (tensor<4x3x3x2xf32>, tensor<4x3x3x2xf32>) -> tensor<4x3x3x2xf32>
// CHECK: %[[W:.*]] = forge.sub %arg1, {{.*}} : (tensor<4x3x3x2xf32>, tensor<4x3x3x2xf32>) -> tensor<4x3x3x2xf32>
// CHECK: return {{.*}}, %[[W]], %[[M]]
// CHECK-LABEL: func.func @eval
// CHECK-SAME: %arg1: tensor<4x3x3x2xf32> {forge.kind = "parameter", forge.layout_perm = array<i64: 0, 2, 3, 1>, forge.name = "w"}
// CHECK-NOT: forge.transpose
// CHECK: forge.conv %arg0, %arg1
func.func @train_step(%x: tensor<2x8x8x2xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<4x2x3x3xf32> {forge.kind = "parameter", forge.name = "w"},
                      %m: tensor<4x2x3x3xf32> {forge.kind = "state", forge.name = "w.momentum"},
                      %dy: tensor<2x8x8x4xf32> {forge.kind = "input", forge.name = "dy"})
    -> (tensor<f32>, tensor<4x2x3x3xf32> {forge.updates = "w"}, tensor<4x2x3x3xf32> {forge.updates = "w.momentum"}) {
  %wt = forge.transpose %w {perm = array<i64: 0, 2, 3, 1>} : (tensor<4x2x3x3xf32>) -> tensor<4x3x3x2xf32>
  %y = forge.conv %x, %wt {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x2xf32>, tensor<4x3x3x2xf32>) -> tensor<2x8x8x4xf32>
  %gl = forge.conv_grad_weight %x, %dy {channels_last = true, kernel_shape = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x2xf32>, tensor<2x8x8x4xf32>) -> tensor<4x3x3x2xf32>
  %g = forge.transpose %gl {perm = array<i64: 0, 3, 1, 2>} : (tensor<4x3x3x2xf32>) -> tensor<4x2x3x3xf32>
  %sq = forge.mul %g, %g : (tensor<4x2x3x3xf32>, tensor<4x2x3x3xf32>) -> tensor<4x2x3x3xf32>
  %norm = forge.reduce_sum %sq {axes = array<i64: 0, 1, 2, 3>, keepdims = false} : (tensor<4x2x3x3xf32>) -> tensor<f32>
  %mu = forge.constant dense<0.9> : tensor<f32>
  %lr = forge.constant dense<0.1> : tensor<f32>
  %mm = forge.mul %m, %mu : (tensor<4x2x3x3xf32>, tensor<f32>) -> tensor<4x2x3x3xf32>
  %m2 = forge.add %mm, %g : (tensor<4x2x3x3xf32>, tensor<4x2x3x3xf32>) -> tensor<4x2x3x3xf32>
  %step = forge.mul %m2, %lr : (tensor<4x2x3x3xf32>, tensor<f32>) -> tensor<4x2x3x3xf32>
  %w2 = forge.sub %w, %step : (tensor<4x2x3x3xf32>, tensor<4x2x3x3xf32>) -> tensor<4x2x3x3xf32>
  return %norm, %w2, %m2 : tensor<f32>, tensor<4x2x3x3xf32>, tensor<4x2x3x3xf32>
}
func.func @eval(%x: tensor<2x8x8x2xf32> {forge.kind = "input", forge.name = "x"},
                %w: tensor<4x2x3x3xf32> {forge.kind = "parameter", forge.name = "w"}) -> tensor<2x8x8x4xf32> {
  %wt = forge.transpose %w {perm = array<i64: 0, 2, 3, 1>} : (tensor<4x2x3x3xf32>) -> tensor<4x3x3x2xf32>
  %y = forge.conv %x, %wt {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x2xf32>, tensor<4x3x3x2xf32>) -> tensor<2x8x8x4xf32>
  return %y : tensor<2x8x8x4xf32>
}

// -----

// Negative cases, each left in the ONNX layout with a remark: a weight whose optimizer
// reads a per-channel reduction of it (not a whole one), and a weight read through two
// different transposes.
// REMARK: remark: forge-permute-parameters: 'a' keeps its layout: read by 'forge.reduce_sum' in @train_step
// REMARK: remark: forge-permute-parameters: 'b' keeps its layout: read through transposes of different orders
// CHECK-LABEL: func.func @train_step
// CHECK-NOT: forge.layout_perm
// CHECK: forge.transpose %arg0
// CHECK: forge.transpose %arg1
func.func @train_step(%a: tensor<4x2x3x3xf32> {forge.kind = "parameter", forge.name = "a"},
                      %b: tensor<4x2x3x3xf32> {forge.kind = "parameter", forge.name = "b"})
    -> (tensor<4x3x3x2xf32>, tensor<4xf32>, tensor<4x3x3x2xf32>, tensor<4x3x2x3xf32>) {
  %at = forge.transpose %a {perm = array<i64: 0, 2, 3, 1>} : (tensor<4x2x3x3xf32>) -> tensor<4x3x3x2xf32>
  %rows = forge.reduce_sum %a {axes = array<i64: 1, 2, 3>, keepdims = false} : (tensor<4x2x3x3xf32>) -> tensor<4xf32>
  %bt = forge.transpose %b {perm = array<i64: 0, 2, 3, 1>} : (tensor<4x2x3x3xf32>) -> tensor<4x3x3x2xf32>
  %bu = forge.transpose %b {perm = array<i64: 0, 3, 1, 2>} : (tensor<4x2x3x3xf32>) -> tensor<4x3x2x3xf32>
  return %at, %rows, %bt, %bu : tensor<4x3x3x2xf32>, tensor<4xf32>, tensor<4x3x3x2xf32>, tensor<4x3x2x3xf32>
}
