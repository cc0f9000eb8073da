// RUN: forge-opt %s --split-input-file --forge-assign-precision=precision=bf16 | FileCheck %s
// The output parses and verifies.
// RUN: forge-opt %s --split-input-file --forge-assign-precision=precision=bf16 | forge-opt --split-input-file --verify-each > /dev/null

// A masked gradient g that a column_reduce region sums directly (and a matmul reads) is
// stored bf16: the region's sums read it as a loose reduce_sum would, through a cast to
// f32, and add in f32 (a residual network's gradient, read by its batch norm's sums).
// CHECK-LABEL: func @train_step
// CHECK: %[[G:.*]] = forge.fusion "loop"(%arg0, %arg1) : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xbf16>
// CHECK: forge.cast %{{.*}} {to = bf16}
// CHECK: forge.fusion "column_reduce"(%[[G]], %arg0) : (tensor<16x8xbf16>, tensor<16x8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
// CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<16x8xbf16>, %{{.*}}: tensor<16x8xf32>):
// CHECK-NEXT: %[[C:.*]] = forge.cast %[[A]] {to = f32}
// CHECK-NEXT: forge.reduce_sum %[[C]] {{.*}} : (tensor<16x8xf32>) -> tensor<8xf32>
func.func @train_step(%x: tensor<16x8xf32> {forge.kind = "input", forge.name = "x"},
                      %y: tensor<16x8xf32> {forge.kind = "input", forge.name = "y"},
                      %w: tensor<8x4xf32> {forge.kind = "input", forge.name = "w"})
    -> (tensor<8xf32>, tensor<8xf32>, tensor<16x4xf32>) {
  %g = forge.fusion "loop"(%x, %y) : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32> {
  ^bb0(%a: tensor<16x8xf32>, %b: tensor<16x8xf32>):
    %0 = forge.add %a, %b : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    forge.yield %0 : tensor<16x8xf32>
  }
  %s:2 = forge.fusion "column_reduce"(%g, %x) : (tensor<16x8xf32>, tensor<16x8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<16x8xf32>, %b: tensor<16x8xf32>):
    %0 = forge.reduce_sum %a {axes = array<i64: 0>, keepdims = false} : (tensor<16x8xf32>) -> tensor<8xf32>
    %1 = forge.mul %a, %b : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %2 = forge.reduce_sum %1 {axes = array<i64: 0>, keepdims = false} : (tensor<16x8xf32>) -> tensor<8xf32>
    forge.yield %0, %2 : tensor<8xf32>, tensor<8xf32>
  }
  %p = forge.matmul %g, %w : (tensor<16x8xf32>, tensor<8x4xf32>) -> tensor<16x4xf32>
  return %s#0, %s#1, %p : tensor<8xf32>, tensor<8xf32>, tensor<16x4xf32>
}

// -----

// A channels-last 1x1 convolution's weight gradient is written bf16 (cuDNN writes its
// operands' type) and reaches the optimizer's horizontal region through a reshape (a
// view). The region's operand and block argument take bf16, and the member loop region
// that reads it casts it back to f32 inside its own body: a horizontal region's body holds
// loop regions only.
// CHECK-LABEL: func @train_step
// CHECK: %[[DW:.*]] = forge.conv_grad_weight {{.*}} -> tensor<4x1x1x3xbf16>
// CHECK: %[[R:.*]] = forge.reshape %[[DW]] {{.*}} -> tensor<4x3x1x1xbf16>
// CHECK: forge.fusion "horizontal"(%arg2, %[[R]], %arg3) : (tensor<4x3x1x1xf32>, tensor<4x3x1x1xbf16>, tensor<f32>)
// CHECK-NEXT: ^bb0(%{{.*}}: tensor<4x3x1x1xf32>, %[[B:.*]]: tensor<4x3x1x1xbf16>, %{{.*}}: tensor<f32>):
// CHECK-NEXT: forge.fusion "loop"(%{{.*}}, %[[B]], %{{.*}}) : (tensor<4x3x1x1xf32>, tensor<4x3x1x1xbf16>, tensor<f32>)
// CHECK-NEXT: ^bb0(%{{.*}}: tensor<4x3x1x1xf32>, %[[L:.*]]: tensor<4x3x1x1xbf16>, %{{.*}}: tensor<f32>):
// CHECK-NEXT: forge.cast %[[L]] {to = f32}
func.func @train_step(%x: tensor<2x8x8x3xf32> {forge.kind = "input", forge.name = "x"},
                      %dy: tensor<2x8x8x4xf32> {forge.kind = "input", forge.name = "dy"},
                      %w: tensor<4x3x1x1xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<4x3x1x1xf32>},
                      %lr: tensor<f32> {forge.kind = "input", forge.name = "lr"})
    -> (tensor<4x3x1x1xf32> {forge.updates = "w"}) {
  %dw = forge.conv_grad_weight %x, %dy {channels_last = true, kernel_shape = array<i64: 1, 1>, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x3xf32>, tensor<2x8x8x4xf32>) -> tensor<4x1x1x3xf32>
  %g = forge.reshape %dw {shape = array<i64: 4, 3, 1, 1>} : (tensor<4x1x1x3xf32>) -> tensor<4x3x1x1xf32>
  %u = forge.fusion "horizontal"(%w, %g, %lr) : (tensor<4x3x1x1xf32>, tensor<4x3x1x1xf32>, tensor<f32>) -> tensor<4x3x1x1xf32> {
  ^bb0(%a: tensor<4x3x1x1xf32>, %b: tensor<4x3x1x1xf32>, %c: tensor<f32>):
    %0 = forge.fusion "loop"(%a, %b, %c) : (tensor<4x3x1x1xf32>, tensor<4x3x1x1xf32>, tensor<f32>) -> tensor<4x3x1x1xf32> {
    ^bb1(%i: tensor<4x3x1x1xf32>, %j: tensor<4x3x1x1xf32>, %k: tensor<f32>):
      %1 = forge.mul %j, %k : (tensor<4x3x1x1xf32>, tensor<f32>) -> tensor<4x3x1x1xf32>
      %2 = forge.sub %i, %1 : (tensor<4x3x1x1xf32>, tensor<4x3x1x1xf32>) -> tensor<4x3x1x1xf32>
      forge.yield %2 : tensor<4x3x1x1xf32>
    }
    forge.yield %0 : tensor<4x3x1x1xf32>
  }
  return %u : tensor<4x3x1x1xf32>
}

// -----

// An image input [N, C, H, W] that only its channels-last transpose reads, read in turn
// only by convolutions (the stem's forward and weight gradient): the input itself becomes
// bf16 (the data loader converts the f32 array) and the transpose copies bf16. No cast
// kernel; the transpose moves half the bytes. So does an input that a convolution reads
// directly (dy).
// CHECK-LABEL: func @train_step
// CHECK-SAME: %arg0: tensor<2x3x8x8xbf16> {forge.kind = "input", forge.name = "x"}
// CHECK-SAME: %arg1: tensor<2x8x8x4xbf16> {forge.kind = "input", forge.name = "dy"}
// CHECK-NOT: forge.cast
// CHECK: %[[T:.*]] = forge.transpose %arg0 {{.*}} : (tensor<2x3x8x8xbf16>) -> tensor<2x8x8x3xbf16>
// CHECK: forge.conv %[[T]], {{.*}} -> tensor<2x8x8x4xbf16>
// CHECK: forge.conv_grad_weight %[[T]], {{.*}} -> tensor<4x3x3x3xbf16>
func.func @train_step(%x: tensor<2x3x8x8xf32> {forge.kind = "input", forge.name = "x"},
                      %dy: tensor<2x8x8x4xf32> {forge.kind = "input", forge.name = "dy"},
                      %w: tensor<4x3x3x3xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<4x3x3x3xf32>})
    -> (tensor<2x8x8x4xf32>, tensor<4x3x3x3xf32>) {
  %t = forge.transpose %x {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x3x8x8xf32>) -> tensor<2x8x8x3xf32>
  %y = forge.conv %t, %w {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x3xf32>, tensor<4x3x3x3xf32>) -> tensor<2x8x8x4xf32>
  %dw = forge.conv_grad_weight %t, %dy {channels_last = true, kernel_shape = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x3xf32>, tensor<2x8x8x4xf32>) -> tensor<4x3x3x3xf32>
  return %y, %dw : tensor<2x8x8x4xf32>, tensor<4x3x3x3xf32>
}

// -----

// Negative: the transposed image is also read by a loop region (f32 arithmetic): the
// input stays f32 and the convolutions read a bf16 copy made by a cast of their own.
// CHECK-LABEL: func @train_step
// CHECK-SAME: %arg0: tensor<2x3x8x8xf32> {forge.kind = "input", forge.name = "x"}
// CHECK: forge.cast
func.func @train_step(%x: tensor<2x3x8x8xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<4x3x3x3xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<4x3x3x3xf32>})
    -> (tensor<2x8x8x4xf32>, tensor<2x8x8x3xf32>) {
  %t = forge.transpose %x {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x3x8x8xf32>) -> tensor<2x8x8x3xf32>
  %y = forge.conv %t, %w {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x3xf32>, tensor<4x3x3x3xf32>) -> tensor<2x8x8x4xf32>
  %e = forge.fusion "loop"(%t) : (tensor<2x8x8x3xf32>) -> tensor<2x8x8x3xf32> {
  ^bb0(%a: tensor<2x8x8x3xf32>):
    %0 = forge.exp %a : (tensor<2x8x8x3xf32>) -> tensor<2x8x8x3xf32>
    forge.yield %0 : tensor<2x8x8x3xf32>
  }
  return %y, %e : tensor<2x8x8x4xf32>, tensor<2x8x8x3xf32>
}

// -----

// A max pool's image (a batch norm's ReLU'd output, saved for the gradient) is stored
// bf16: the pool and its gradient read any float type. The pool's gradient dy (a sum
// of two convolution gradients, a loose add) is stored bf16 too; the gradient's result
// stays f32 (the GPU kernel adds into it with f32 atomics), read by its loop region as is.
// CHECK-LABEL: func @train_step
// CHECK: %[[X:.*]] = forge.fusion "loop"(%arg0) : (tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xbf16>
// CHECK: forge.max_pool %[[X]] {{.*}} : (tensor<2x4x4x8xbf16>) -> tensor<2x2x2x8xbf16>
// CHECK: %[[DY:.*]] = forge.add %arg1, %arg2 : (tensor<2x2x2x8xf32>, tensor<2x2x2x8xf32>) -> tensor<2x2x2x8xbf16>
// CHECK: %[[DX:.*]] = forge.max_pool_grad %[[X]], %[[DY]] {{.*}} : (tensor<2x4x4x8xbf16>, tensor<2x2x2x8xbf16>) -> tensor<2x4x4x8xf32>
// CHECK-NOT: forge.cast
// CHECK: forge.fusion "loop"(%[[DX]], %arg0) : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>)
func.func @train_step(%x: tensor<2x4x4x8xf32> {forge.kind = "input", forge.name = "x"},
                      %d1: tensor<2x2x2x8xf32> {forge.kind = "input", forge.name = "d1"},
                      %d2: tensor<2x2x2x8xf32> {forge.kind = "input", forge.name = "d2"})
    -> (tensor<2x2x2x8xf32>, tensor<2x4x4x8xf32>) {
  %r = forge.fusion "loop"(%x) : (tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32> {
  ^bb0(%a: tensor<2x4x4x8xf32>):
    %0 = forge.relu %a : (tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
    forge.yield %0 : tensor<2x4x4x8xf32>
  }
  %p = forge.max_pool %r {ceil_mode = false, channels_last = true, dilations = array<i64: 1, 1>, kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<2x4x4x8xf32>) -> tensor<2x2x2x8xf32>
  %q = forge.fusion "loop"(%p) : (tensor<2x2x2x8xf32>) -> tensor<2x2x2x8xf32> {
  ^bb0(%a: tensor<2x2x2x8xf32>):
    %0 = forge.relu %a : (tensor<2x2x2x8xf32>) -> tensor<2x2x2x8xf32>
    forge.yield %0 : tensor<2x2x2x8xf32>
  }
  %dy = forge.add %d1, %d2 : (tensor<2x2x2x8xf32>, tensor<2x2x2x8xf32>) -> tensor<2x2x2x8xf32>
  %dx = forge.max_pool_grad %r, %dy {ceil_mode = false, channels_last = true, dilations = array<i64: 1, 1>, kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<2x4x4x8xf32>, tensor<2x2x2x8xf32>) -> tensor<2x4x4x8xf32>
  %g = forge.fusion "loop"(%dx, %x) : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32> {
  ^bb0(%a: tensor<2x4x4x8xf32>, %b: tensor<2x4x4x8xf32>):
    %0 = forge.mul %a, %b : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
    forge.yield %0 : tensor<2x4x4x8xf32>
  }
  return %q, %g : tensor<2x2x2x8xf32>, tensor<2x4x4x8xf32>
}

// -----

// Negative: an image that something else reads in f32 (here the return) stays f32; the
// pool's gradient reads it so beside a bf16 dy (no cast of dy: the kernel takes both).
// CHECK-LABEL: func @train_step
// CHECK: %[[X:.*]] = forge.fusion "loop"(%arg0) : (tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
// CHECK: forge.max_pool_grad %[[X]], %{{.*}} {{.*}} : (tensor<2x4x4x8xf32>, tensor<2x2x2x8xbf16>) -> tensor<2x4x4x8xf32>
func.func @train_step(%x: tensor<2x4x4x8xf32> {forge.kind = "input", forge.name = "x"},
                      %d1: tensor<2x2x2x8xf32> {forge.kind = "input", forge.name = "d1"})
    -> (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) {
  %r = forge.fusion "loop"(%x) : (tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32> {
  ^bb0(%a: tensor<2x4x4x8xf32>):
    %0 = forge.relu %a : (tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
    forge.yield %0 : tensor<2x4x4x8xf32>
  }
  %dy = forge.fusion "loop"(%d1) : (tensor<2x2x2x8xf32>) -> tensor<2x2x2x8xf32> {
  ^bb0(%a: tensor<2x2x2x8xf32>):
    %0 = forge.relu %a : (tensor<2x2x2x8xf32>) -> tensor<2x2x2x8xf32>
    forge.yield %0 : tensor<2x2x2x8xf32>
  }
  %dx = forge.max_pool_grad %r, %dy {ceil_mode = false, channels_last = true, dilations = array<i64: 1, 1>, kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<2x4x4x8xf32>, tensor<2x2x2x8xf32>) -> tensor<2x4x4x8xf32>
  return %r, %dx : tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>
}

// -----

// A data input that only GEMMs read becomes bf16 with its views, and a gemm region that
// reads a view (a weight gradient x^T d with its bias gradient's column sum, BGRAD) takes
// the view's type on its block argument too (it kept f32 there: the region failed to
// verify, "input 0 has type 'tensor<6x2xbf16>' but body argument 0 has type
// 'tensor<6x2xf32>'").
// CHECK-LABEL: func @train_step
// CHECK-SAME: %arg0: tensor<2x3x2xbf16> {forge.kind = "input", forge.name = "x"}
// CHECK: %[[V:.*]] = forge.reshape %arg0 {{.*}} -> tensor<6x2xbf16>
// CHECK: forge.fusion "gemm"(%[[V]], %{{.*}}) : (tensor<6x2xbf16>, tensor<6x4xbf16>)
// CHECK-NEXT: ^bb0(%{{.*}}: tensor<6x2xbf16>, %{{.*}}: tensor<6x4xbf16>):
func.func @train_step(%x: tensor<2x3x2xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<2x4xf32> {forge.kind = "input", forge.name = "w"},
                      %d: tensor<6x4xf32> {forge.kind = "input", forge.name = "d"})
    -> (tensor<2x3x4xf32>, tensor<2x4xf32>, tensor<1x4xf32>) {
  %y = forge.matmul %x, %w : (tensor<2x3x2xf32>, tensor<2x4xf32>) -> tensor<2x3x4xf32>
  %v = forge.reshape %x {shape = array<i64: 6, 2>} : (tensor<2x3x2xf32>) -> tensor<6x2xf32>
  %g:2 = forge.fusion "gemm"(%v, %d) : (tensor<6x2xf32>, tensor<6x4xf32>) -> (tensor<2x4xf32>, tensor<1x4xf32>) {
  ^bb0(%a: tensor<6x2xf32>, %b: tensor<6x4xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = true, transB = false} : (tensor<6x2xf32>, tensor<6x4xf32>) -> tensor<2x4xf32>
    %1 = forge.reduce_sum %b {axes = array<i64: 0>, keepdims = true} : (tensor<6x4xf32>) -> tensor<1x4xf32>
    forge.yield %0, %1 : tensor<2x4xf32>, tensor<1x4xf32>
  }
  return %y, %g#0, %g#1 : tensor<2x3x4xf32>, tensor<2x4xf32>, tensor<1x4xf32>
}
