// The backward-only ops (ForgeGradOps.td): print/parse round trip in the
// custom and generic forms, and their canonicalization.
// RUN: forge-opt %s > %t.1
// RUN: forge-opt %t.1 > %t.2
// RUN: diff %t.1 %t.2
// RUN: forge-opt %s --mlir-print-op-generic | forge-opt > %t.generic
// RUN: diff %t.generic %t.2
// RUN: FileCheck %s < %t.2
// RUN: forge-opt %s --canonicalize | FileCheck %s --check-prefix=CANON

// CHECK-LABEL: func @backward_ops
func.func @backward_ops(%x: tensor<2x3x6x6xf32>, %dy: tensor<2x4x4x4xf32>, %dp: tensor<2x3x3x3xf32>,
                        %i: tensor<2xi64>) -> (tensor<4x3x3x3xf32>, tensor<2x3x6x6xf32>, tensor<2x3x6x6xf32>, tensor<2x3x6x6xf32>, tensor<2x3x6x6xf32>) {
  // CHECK: forge.conv_grad_weight %arg0, %arg1 {{.*}} : (tensor<2x3x6x6xf32>, tensor<2x4x4x4xf32>) -> tensor<4x3x3x3xf32>
  %dw = forge.conv_grad_weight %x, %dy {kernel_shape = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x3x6x6xf32>, tensor<2x4x4x4xf32>) -> tensor<4x3x3x3xf32>
  // CHECK: forge.max_pool_grad %arg0, %arg2
  %mx = forge.max_pool_grad %x, %dp {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, ceil_mode = false} : (tensor<2x3x6x6xf32>, tensor<2x3x3x3xf32>) -> tensor<2x3x6x6xf32>
  // CHECK: forge.avg_pool_grad %arg2
  %av = forge.avg_pool_grad %dp {input_shape = array<i64: 2, 3, 6, 6>, kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, ceil_mode = false, count_include_pad = false} : (tensor<2x3x3x3xf32>) -> tensor<2x3x6x6xf32>
  // CHECK: forge.softmax_grad
  %sm = forge.softmax_grad %x, %x {axis = 3 : i64} : (tensor<2x3x6x6xf32>, tensor<2x3x6x6xf32>) -> tensor<2x3x6x6xf32>
  // CHECK: forge.layer_norm_grad {{.*}} -> (tensor<2x3x6x6xf32>, tensor<6xf32>)
  %s = forge.constant dense<1.0> : tensor<6xf32>
  %ln:2 = forge.layer_norm_grad %x, %s, %x {axis = 3 : i64, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true, bias_grad = false} : (tensor<2x3x6x6xf32>, tensor<6xf32>, tensor<2x3x6x6xf32>) -> (tensor<2x3x6x6xf32>, tensor<6xf32>)
  return %dw, %mx, %av, %sm, %ln#0 : tensor<4x3x3x3xf32>, tensor<2x3x6x6xf32>, tensor<2x3x6x6xf32>, tensor<2x3x6x6xf32>, tensor<2x3x6x6xf32>
}

// CHECK-LABEL: func @scatters
func.func @scatters(%g: tensor<2x3xf32>, %i: tensor<2xi64>, %t: tensor<4xi64>, %l: tensor<f32>) -> (tensor<5x3xf32>, tensor<5x7xf32>, tensor<1x2xf32>, tensor<4x6xf32>) {
  // CHECK: forge.gather_grad %arg0, %arg1 {axis = 0 : i64, input_shape = array<i64: 5, 3>}
  %a = forge.gather_grad %g, %i {axis = 0 : i64, input_shape = array<i64: 5, 3>} : (tensor<2x3xf32>, tensor<2xi64>) -> tensor<5x3xf32>
  // CHECK: forge.slice_grad %arg0
  %b = forge.slice_grad %g {input_shape = array<i64: 5, 7>, starts = array<i64: 0, 1>, ends = array<i64: 4, 7>, steps = array<i64: 2, 2>} : (tensor<2x3xf32>) -> tensor<5x7xf32>
  // CHECK: forge.pad_grad %arg0 {mode = "reflect", pads = array<i64: 1, 0, 0, 1>}
  %c = forge.pad_grad %g {pads = array<i64: 1, 0, 0, 1>, mode = "reflect"} : (tensor<2x3xf32>) -> tensor<1x2xf32>
  // CHECK: forge.nll_loss_grad %arg3, %arg2 {ignore_index = -1 : i64, num_classes = 6 : i64, reduction = "mean"}
  %d = forge.nll_loss_grad %l, %t {reduction = "mean", ignore_index = -1 : i64, num_classes = 6 : i64} : (tensor<f32>, tensor<4xi64>) -> tensor<4x6xf32>
  return %a, %b, %c, %d : tensor<5x3xf32>, tensor<5x7xf32>, tensor<1x2xf32>, tensor<4x6xf32>
}

// A frozen scale and bias: canonicalization drops their gradients from the
// fused backward op.
// CANON-LABEL: func @frozen_params
// CANON: forge.group_norm_grad %arg0, %arg1, %arg2 {{{.*}}bias_grad = false, epsilon = {{.*}}, input_grad = true, num_groups = 2 : i64, scale_grad = false} : {{.*}} -> tensor<2x4x3xf32>
// CANON-NEXT: return
func.func @frozen_params(%x: tensor<2x4x3xf32>, %s: tensor<4xf32>, %dy: tensor<2x4x3xf32>) -> tensor<2x4x3xf32> {
  %r:3 = forge.group_norm_grad %x, %s, %dy {num_groups = 2 : i64, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true, bias_grad = true} : (tensor<2x4x3xf32>, tensor<4xf32>, tensor<2x4x3xf32>) -> (tensor<2x4x3xf32>, tensor<4xf32>, tensor<4xf32>)
  return %r#0 : tensor<2x4x3xf32>
}

// CANON-LABEL: func @only_scale
// CANON: forge.batch_norm_training_grad {{.*}}bias_grad = false, epsilon = {{.*}}, input_grad = false, scale_grad = true} : {{.*}} -> tensor<4xf32>
func.func @only_scale(%x: tensor<2x4x3xf32>, %s: tensor<4xf32>, %dy: tensor<2x4x3xf32>) -> tensor<4xf32> {
  %r:3 = forge.batch_norm_training_grad %x, %s, %dy {epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true, bias_grad = true} : (tensor<2x4x3xf32>, tensor<4xf32>, tensor<2x4x3xf32>) -> (tensor<2x4x3xf32>, tensor<4xf32>, tensor<4xf32>)
  return %r#1 : tensor<4xf32>
}
