// RUN: forge-opt %s --split-input-file --forge-symmetrize-conv-padding | FileCheck %s

// TF-style SAME padding (one extra row and column at the end): a zero pad of the input by
// the difference, then a conv with the symmetric part (here none).
// CHECK-LABEL: func @conv_same_upper
// CHECK: %[[P:.*]] = forge.pad %arg0 {mode = "constant", pads = array<i64: 0, 0, 0, 0, 0, 0, 1, 1>, value = 0.000000e+00 : f64} : (tensor<1x3x8x8xf32>) -> tensor<1x3x9x9xf32>
// CHECK-NEXT: forge.conv %[[P]], %arg1 {{{.*}}pads = array<i64: 0, 0, 0, 0>{{.*}}} : (tensor<1x3x9x9xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x4x4xf32>
func.func @conv_same_upper(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) -> tensor<1x4x4x4xf32> {
  %y = forge.conv %x, %w {strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x4x4xf32>
  return %y : tensor<1x4x4x4xf32>
}

// -----

// Its weight gradient pads the input the same way (CSE later merges the two pads).
// CHECK-LABEL: func @conv_grad_weight
// CHECK: %[[P:.*]] = forge.pad %arg0 {mode = "constant", pads = array<i64: 0, 0, 1, 0, 0, 0, 0, 2>{{.*}}} : (tensor<1x2x7x6xf32>) -> tensor<1x2x8x8xf32>
// CHECK-NEXT: forge.conv_grad_weight %[[P]], %arg1 {{{.*}}pads = array<i64: 0, 0, 0, 0>{{.*}}}
func.func @conv_grad_weight(%x: tensor<1x2x7x6xf32>, %dy: tensor<1x2x2x3xf32>) -> tensor<2x2x3x2xf32> {
  %g = forge.conv_grad_weight %x, %dy {kernel_shape = array<i64: 3, 2>, strides = array<i64: 2, 3>, pads = array<i64: 1, 0, 0, 2>, dilations = array<i64: 2, 1>, group = 1 : i64} : (tensor<1x2x7x6xf32>, tensor<1x2x2x3xf32>) -> tensor<2x2x3x2xf32>
  return %g : tensor<2x2x3x2xf32>
}

// -----

// conv_transpose's pads crop its output: the op keeps the symmetric part (1) and its wider
// result is cropped by the rest (a pad with negative pads).
// CHECK-LABEL: func @conv_transpose
// CHECK: %[[W:.*]] = forge.conv_transpose %arg0, %arg1 {{{.*}}pads = array<i64: 1, 1>{{.*}}} : (tensor<1x2x4xf32>, tensor<2x3x3xf32>) -> tensor<1x3x7xf32>
// CHECK-NEXT: %[[C:.*]] = forge.pad %[[W]] {mode = "constant", pads = array<i64: 0, 0, 0, 0, 0, -1>{{.*}}} : (tensor<1x3x7xf32>) -> tensor<1x3x6xf32>
// CHECK-NEXT: return %[[C]]
func.func @conv_transpose(%x: tensor<1x2x4xf32>, %w: tensor<2x3x3xf32>) -> tensor<1x3x6xf32> {
  %y = forge.conv_transpose %x, %w {strides = array<i64: 2>, pads = array<i64: 1, 2>, dilations = array<i64: 1>, output_padding = array<i64: 0>, group = 1 : i64} : (tensor<1x2x4xf32>, tensor<2x3x3xf32>) -> tensor<1x3x6xf32>
  return %y : tensor<1x3x6xf32>
}

// -----

// Negative: symmetric pads stay as they are, with no pad op.
// CHECK-LABEL: func @symmetric
// CHECK-NOT: forge.pad
// CHECK: forge.conv %arg0, %arg1 {{{.*}}pads = array<i64: 1, 1, 1, 1>
// CHECK-NOT: forge.pad
func.func @symmetric(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) -> tensor<1x4x4x4xf32> {
  %y = forge.conv %x, %w {strides = array<i64: 2, 2>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x4x4xf32>
  return %y : tensor<1x4x4x4xf32>
}
