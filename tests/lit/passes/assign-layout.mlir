// RUN: forge-opt %s --split-input-file --forge-assign-layout | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-assign-layout=pad-channels=1 | FileCheck %s --check-prefix=PAD
// RUN: forge-opt %s --split-input-file --forge-assign-layout=layout=nchw | FileCheck %s --check-prefix=NCHW
// RUN: not forge-opt %s --split-input-file --forge-assign-layout=layout=nwhc 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: forge-assign-layout: unknown layout 'nwhc' (nchw, nhwc)

// A conv -> relu -> 1x1 conv chain runs channels-last: one transpose at the input, one at
// the output; the ReLU takes the transpose's place and the inner pair cancels. The 1x1
// weight's transpose moves only unit dims: a reshape.
// CHECK-LABEL: func @conv_relu_conv
// CHECK: %[[X:.*]] = forge.transpose %arg0 {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x3x8x8xf32>) -> tensor<2x8x8x3xf32>
// CHECK: %[[W:.*]] = forge.transpose %arg1 {perm = array<i64: 0, 2, 3, 1>} : (tensor<4x3x3x3xf32>) -> tensor<4x3x3x3xf32>
// CHECK: %[[Y:.*]] = forge.conv %[[X]], %[[W]] {channels_last = true{{.*}}} : (tensor<2x8x8x3xf32>, tensor<4x3x3x3xf32>) -> tensor<2x8x8x4xf32>
// CHECK: %[[R:.*]] = forge.relu %[[Y]] : (tensor<2x8x8x4xf32>) -> tensor<2x8x8x4xf32>
// CHECK: %[[W2:.*]] = forge.reshape %arg2 {shape = array<i64: 5, 1, 1, 4>}
// CHECK: %[[Z:.*]] = forge.conv %[[R]], %[[W2]] {channels_last = true{{.*}} -> tensor<2x8x8x5xf32>
// CHECK: %[[O:.*]] = forge.transpose %[[Z]] {perm = array<i64: 0, 3, 1, 2>} : (tensor<2x8x8x5xf32>) -> tensor<2x5x8x8xf32>
// CHECK-NEXT: return %[[O]]
// CHECK-NOT: forge.transpose
// With pad-channels (off by default), each conv of fewer than 8 input channels reads its
// input and weight zero-padded to 8 channels (here both: 3 and 4).
// PAD-LABEL: func @conv_relu_conv
// PAD: %[[X:.*]] = forge.transpose %arg0 {perm = array<i64: 0, 2, 3, 1>}
// PAD: %[[W:.*]] = forge.transpose %arg1
// PAD: %[[XP:.*]] = forge.pad %[[X]] {mode = "constant", pads = array<i64: 0, 0, 0, 0, 0, 0, 0, 5>, value = 0.000000e+00 : f64} : (tensor<2x8x8x3xf32>) -> tensor<2x8x8x8xf32>
// PAD: %[[WP:.*]] = forge.pad %[[W]] {mode = "constant", pads = array<i64: 0, 0, 0, 0, 0, 0, 0, 5>, value = 0.000000e+00 : f64} : (tensor<4x3x3x3xf32>) -> tensor<4x3x3x8xf32>
// PAD: forge.conv %[[XP]], %[[WP]] {channels_last = true{{.*}} : (tensor<2x8x8x8xf32>, tensor<4x3x3x8xf32>) -> tensor<2x8x8x4xf32>
// PAD: forge.pad %{{.*}} {{.*}} : (tensor<2x8x8x4xf32>) -> tensor<2x8x8x8xf32>
// PAD: forge.conv {{.*}} : (tensor<2x8x8x8xf32>, tensor<5x1x1x8xf32>) -> tensor<2x8x8x5xf32>
// NCHW-LABEL: func @conv_relu_conv
// NCHW-NOT: channels_last
// NCHW-NOT: forge.transpose
func.func @conv_relu_conv(%x: tensor<2x3x8x8xf32>, %w1: tensor<4x3x3x3xf32>, %w2: tensor<5x4x1x1xf32>) -> tensor<2x5x8x8xf32> {
  %y = forge.conv %x, %w1 {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x8x8xf32>
  %r = forge.relu %y : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %z = forge.conv %r, %w2 {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x4x8x8xf32>, tensor<5x4x1x1xf32>) -> tensor<2x5x8x8xf32>
  return %z : tensor<2x5x8x8xf32>
}

// -----

// A batch norm after a conv expands into channels-last column sums over [N, H, W] of the
// values shifted by the channel's first value, and a pointwise normalization with [C]
// coefficients; the conv's transpose and the norm's cancel. The running statistics are [C]
// pointwise updates (momentum 0.9; unbiased: M / (M - 1) = 128 / 127).
// CHECK-LABEL: func @conv_batch_norm
// CHECK: forge.constant dense<0.100787{{[0-9]*}}>
// CHECK: %[[Y:.*]] = forge.conv {{.*}}channels_last = true{{.*}} -> tensor<2x8x8x4xf32>
// CHECK: %[[K:.*]] = forge.slice %[[Y]] {ends = array<i64: 1, 1, 1, 4>, starts = array<i64: 0, 0, 0, 0>, steps = array<i64: 1, 1, 1, 1>} : (tensor<2x8x8x4xf32>) -> tensor<1x1x1x4xf32>
// CHECK: %[[S:.*]] = forge.sub %[[Y]], %[[K]] : (tensor<2x8x8x4xf32>, tensor<1x1x1x4xf32>) -> tensor<2x8x8x4xf32>
// CHECK: forge.reduce_sum %[[S]] {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x8x8x4xf32>) -> tensor<4xf32>
// CHECK: %[[SQ:.*]] = forge.mul %[[S]], %[[S]]
// CHECK: forge.reduce_sum %[[SQ]] {axes = array<i64: 0, 1, 2>, keepdims = false}
// CHECK: %[[N:.*]] = forge.add {{.*}} : (tensor<2x8x8x4xf32>, tensor<4xf32>) -> tensor<2x8x8x4xf32>
// CHECK: %[[O:.*]] = forge.transpose %[[N]] {perm = array<i64: 0, 3, 1, 2>}
// CHECK: return %[[O]]
// CHECK-NOT: forge.batch_norm_training
// NCHW-LABEL: func @conv_batch_norm
// NCHW: forge.batch_norm_training
func.func @conv_batch_norm(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>) -> (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>) {
  %y = forge.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x8x8xf32>
  %n, %nm, %nv = forge.batch_norm_training %y, %s, %b, %m, %v {epsilon = 1.0e-05 : f64, momentum = 0.9 : f64, unbiased_var = true} : (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>)
  return %n, %nm, %nv : tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// The gradients: conv_transpose (input gradient) and conv_grad_weight in the channels_last
// form; the weight gradient is transposed back to [M, C, kh, kw] for the optimizer, and
// that transpose is not sunk into the optimizer's pointwise ops (one per gradient).
// Padded: the data gradient keeps the 3-channel weight; the weight gradient is computed at
// 8 channels and sliced to 3, and its transpose still stays out of the optimizer's ops.
// PAD-LABEL: func @conv_gradients
// PAD: forge.conv_transpose {{.*}} : (tensor<2x8x8x4xf32>, tensor<4x3x3x3xf32>) -> tensor<2x8x8x3xf32>
// PAD: %[[XP:.*]] = forge.pad {{.*}} : (tensor<2x8x8x3xf32>) -> tensor<2x8x8x8xf32>
// PAD: %[[G:.*]] = forge.conv_grad_weight %[[XP]], {{.*}} : (tensor<2x8x8x8xf32>, tensor<2x8x8x4xf32>) -> tensor<4x3x3x8xf32>
// PAD: %[[S:.*]] = forge.slice %[[G]] {ends = array<i64: 4, 3, 3, 3>, starts = array<i64: 0, 0, 0, 0>, steps = array<i64: 1, 1, 1, 1>} : (tensor<4x3x3x8xf32>) -> tensor<4x3x3x3xf32>
// PAD: %[[GT:.*]] = forge.transpose %[[S]] {perm = array<i64: 0, 3, 1, 2>}
// PAD: forge.mul %[[GT]], %{{.*}} : (tensor<4x3x3x3xf32>, tensor<f32>)
// PAD: forge.mul %[[GT]], %[[GT]]
// CHECK-LABEL: func @conv_gradients
// CHECK: forge.conv_transpose {{.*}}channels_last = true{{.*}} : (tensor<2x8x8x4xf32>, tensor<4x3x3x3xf32>) -> tensor<2x8x8x3xf32>
// CHECK: %[[G:.*]] = forge.conv_grad_weight {{.*}}channels_last = true{{.*}} : (tensor<2x8x8x3xf32>, tensor<2x8x8x4xf32>) -> tensor<4x3x3x3xf32>
// CHECK: %[[GT:.*]] = forge.transpose %[[G]] {perm = array<i64: 0, 3, 1, 2>}
// CHECK: forge.mul %[[GT]], %{{.*}} : (tensor<4x3x3x3xf32>, tensor<f32>)
// CHECK: forge.mul %[[GT]], %[[GT]]
func.func @conv_gradients(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %dy: tensor<2x4x8x8xf32>, %c: tensor<f32>) -> (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<4x3x3x3xf32>) {
  %dx = forge.conv_transpose %dy, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, output_padding = array<i64: 0, 0>, group = 1 : i64} : (tensor<2x4x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x3x8x8xf32>
  %dw = forge.conv_grad_weight %x, %dy {kernel_shape = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x3x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<4x3x3x3xf32>
  %a = forge.mul %dw, %c : (tensor<4x3x3x3xf32>, tensor<f32>) -> tensor<4x3x3x3xf32>
  %q = forge.mul %dw, %dw : (tensor<4x3x3x3xf32>, tensor<4x3x3x3xf32>) -> tensor<4x3x3x3xf32>
  return %dx, %a, %q : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<4x3x3x3xf32>
}

// -----

// Negative: a function without a rank-4 convolution is unchanged (its transposes and batch
// norm included), and so is a 1-d convolution.
// CHECK-LABEL: func @no_conv2d
// CHECK-NOT: channels_last
// CHECK: forge.conv %arg0
// CHECK: forge.batch_norm_training %arg2
// CHECK: forge.transpose %arg2 {perm = array<i64: 0, 2, 3, 1>}
func.func @no_conv2d(%x: tensor<2x3x8xf32>, %w: tensor<4x3x3xf32>, %i: tensor<2x4x8x8xf32>, %s: tensor<4xf32>) -> (tensor<2x4x6xf32>, tensor<2x4x8x8xf32>, tensor<2x8x8x4xf32>) {
  %y = forge.conv %x, %w {strides = array<i64: 1>, pads = array<i64: 0, 0>, dilations = array<i64: 1>, group = 1 : i64} : (tensor<2x3x8xf32>, tensor<4x3x3xf32>) -> tensor<2x4x6xf32>
  %n, %nm, %nv = forge.batch_norm_training %i, %s, %s, %s, %s {epsilon = 1.0e-05 : f64, momentum = 0.9 : f64} : (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>)
  %t = forge.transpose %i {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x4x8x8xf32>) -> tensor<2x8x8x4xf32>
  return %y, %n, %t : tensor<2x4x6xf32>, tensor<2x4x8x8xf32>, tensor<2x8x8x4xf32>
}

// -----

// A max pool between convolutions and its gradient take the channels_last form too: no
// transpose is left around them.
// CHECK-LABEL: func @conv_pool_conv
// CHECK: forge.conv {{.*}}channels_last = true
// CHECK-NEXT: forge.max_pool %{{.*}} {ceil_mode = false, channels_last = true{{.*}} : (tensor<2x8x8x4xf32>) -> tensor<2x4x4x4xf32>
// CHECK-NEXT: forge.reshape
// CHECK-NEXT: forge.conv {{.*}}channels_last = true
// CHECK: forge.max_pool_grad {{.*}}channels_last = true{{.*}} : (tensor<2x8x8x4xf32>, tensor<2x4x4x4xf32>) -> tensor<2x8x8x4xf32>
// CHECK-NOT: forge.transpose %{{.*}} {perm = array<i64: 0, 3, 1, 2>} : (tensor<2x4x4x4xf32>)
func.func @conv_pool_conv(%x: tensor<2x3x8x8xf32>, %w1: tensor<4x3x3x3xf32>, %w2: tensor<5x4x1x1xf32>, %g: tensor<2x4x4x4xf32>) -> (tensor<2x5x4x4xf32>, tensor<2x4x8x8xf32>) {
  %y = forge.conv %x, %w1 {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x8x8xf32>
  %p = forge.max_pool %y {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, ceil_mode = false} : (tensor<2x4x8x8xf32>) -> tensor<2x4x4x4xf32>
  %z = forge.conv %p, %w2 {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x4x4x4xf32>, tensor<5x4x1x1xf32>) -> tensor<2x5x4x4xf32>
  %d = forge.max_pool_grad %y, %g {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, ceil_mode = false} : (tensor<2x4x8x8xf32>, tensor<2x4x4x4xf32>) -> tensor<2x4x8x8xf32>
  return %z, %d : tensor<2x5x4x4xf32>, tensor<2x4x8x8xf32>
}

// -----

// A conv bias's gradient, dy summed over [N, H, W] without keepdims, reads the channels-last
// tensor directly (the kept dim, C, is last in both orders): no transpose for it. A sum over
// N alone keeps [C, H, W], whose order the channels-last tensor does not have: it keeps its
// transpose.
// CHECK-LABEL: func @bias_gradient
// CHECK: %[[Y:.*]] = forge.conv {{.*}}channels_last = true{{.*}} -> tensor<2x8x8x4xf32>
// CHECK-DAG: forge.reduce_sum %[[Y]] {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x8x8x4xf32>) -> tensor<4xf32>
// CHECK-DAG: %[[T:.*]] = forge.transpose %[[Y]] {perm = array<i64: 0, 3, 1, 2>}
// CHECK: forge.reduce_sum %[[T]] {axes = array<i64: 0>, keepdims = false} : (tensor<2x4x8x8xf32>) -> tensor<4x8x8xf32>
func.func @bias_gradient(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) -> (tensor<4xf32>, tensor<4x8x8xf32>) {
  %y = forge.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x8x8xf32>
  %b = forge.reduce_sum %y {axes = array<i64: 0, 2, 3>, keepdims = false} : (tensor<2x4x8x8xf32>) -> tensor<4xf32>
  %n = forge.reduce_sum %y {axes = array<i64: 0>, keepdims = false} : (tensor<2x4x8x8xf32>) -> tensor<4x8x8xf32>
  return %b, %n : tensor<4xf32>, tensor<4x8x8xf32>
}
