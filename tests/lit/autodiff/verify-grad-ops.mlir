// Backward ops check their shape relation to the forward op.
// RUN: forge-opt %s --split-input-file --verify-diagnostics

func.func @pool_grad_shape(%x: tensor<1x1x6x6xf32>, %dy: tensor<1x1x2x2xf32>) -> tensor<1x1x6x6xf32> {
  // expected-error @+2 {{grad_output has shape [1x1x2x2], expected [1x1x3x3]}}
  // expected-error @+1 {{failed to infer returned types}}
  %r = forge.max_pool_grad %x, %dy {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, ceil_mode = false} : (tensor<1x1x6x6xf32>, tensor<1x1x2x2xf32>) -> tensor<1x1x6x6xf32>
  return %r : tensor<1x1x6x6xf32>
}

// -----

func.func @nothing_requested(%x: tensor<2x4xf32>, %s: tensor<4xf32>) {
  // expected-error @+1 {{must compute at least one gradient}}
  forge.layer_norm_grad %x, %s, %x {axis = 1 : i64, epsilon = 1.0e-05 : f64, input_grad = false, scale_grad = false, bias_grad = false} : (tensor<2x4xf32>, tensor<4xf32>, tensor<2x4xf32>) -> ()
  return
}

// -----

func.func @conv_grad_weight_extent(%x: tensor<1x2x5x5xf32>, %dy: tensor<1x3x4x4xf32>) -> tensor<3x2x3x3xf32> {
  // expected-error @+2 {{grad_output has shape [1x3x4x4], expected [1x3x3x3]}}
  // expected-error @+1 {{failed to infer returned types}}
  %r = forge.conv_grad_weight %x, %dy {kernel_shape = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<1x2x5x5xf32>, tensor<1x3x4x4xf32>) -> tensor<3x2x3x3xf32>
  return %r : tensor<3x2x3x3xf32>
}
