// RUN: forge-opt %s --split-input-file --forge-select-library | FileCheck %s

// cuBLASLt takes matmuls of equal batches, a matrix rhs, and a broadcast side;
// each carries its whole problem (forge.matmul), which the runtime executes:
// equal batches stride both sides, a matrix rhs folds the lhs batch into M
// unless the lhs is transposed, a broadcast side has batch stride 0.
// CHECK-LABEL: func @matmuls
// CHECK: forge.matmul %arg0, %arg1 {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 6 : i64, beta = 0.000000e+00 : f64, c = "none", k = 8 : i64, lhs_batch_stride = 32 : i64, m = 4 : i64, n = 5 : i64, rhs_batch_stride = 40 : i64, trans_a = false, trans_b = false}}
// CHECK: forge.matmul %arg0, %arg2 {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 1 : i64, beta = 0.000000e+00 : f64, c = "none", k = 8 : i64, lhs_batch_stride = 0 : i64, m = 24 : i64, n = 5 : i64, rhs_batch_stride = 0 : i64, trans_a = false, trans_b = false}}
// CHECK: forge.matmul %arg0, %arg3 {forge.library = "cublaslt", forge.matmul = {{{.*}}batch = 1 : i64{{.*}}m = 24 : i64
// CHECK: forge.matmul %arg4, %arg2 {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 6 : i64, beta = 0.000000e+00 : f64, c = "none", k = 8 : i64, lhs_batch_stride = 32 : i64, m = 4 : i64, n = 5 : i64, rhs_batch_stride = 0 : i64, trans_a = true, trans_b = false}
// CHECK: forge.matmul %arg2, %arg1 {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 6 : i64, beta = 0.000000e+00 : f64, c = "none", k = 5 : i64, lhs_batch_stride = 0 : i64, m = 8 : i64, n = 8 : i64, rhs_batch_stride = 40 : i64, trans_a = false, trans_b = true}
// A transposed matrix lhs is one product: no batch strides (the runtime refuses strides on batch 1).
// CHECK: forge.matmul %arg5, %arg2 {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 1 : i64, beta = 0.000000e+00 : f64, c = "none", k = 8 : i64, lhs_batch_stride = 0 : i64, m = 4 : i64, n = 5 : i64, rhs_batch_stride = 0 : i64, trans_a = true, trans_b = false}
func.func @matmuls(%a: tensor<2x3x4x8xf32>, %b: tensor<2x3x8x5xf32>, %m: tensor<8x5xf32>, %c: tensor<1x1x8x5xf32>, %at: tensor<2x3x8x4xf32>, %mt: tensor<8x4xf32>) -> (tensor<2x3x4x5xf32>, tensor<2x3x4x5xf32>, tensor<2x3x4x5xf32>, tensor<2x3x4x5xf32>, tensor<2x3x8x8xf32>, tensor<4x5xf32>) {
  %0 = forge.matmul %a, %b : (tensor<2x3x4x8xf32>, tensor<2x3x8x5xf32>) -> tensor<2x3x4x5xf32>
  %1 = forge.matmul %a, %m : (tensor<2x3x4x8xf32>, tensor<8x5xf32>) -> tensor<2x3x4x5xf32>
  %2 = forge.matmul %a, %c : (tensor<2x3x4x8xf32>, tensor<1x1x8x5xf32>) -> tensor<2x3x4x5xf32>
  %3 = forge.matmul %at, %m {transA = true} : (tensor<2x3x8x4xf32>, tensor<8x5xf32>) -> tensor<2x3x4x5xf32>
  %4 = forge.matmul %m, %b {transB = true} : (tensor<8x5xf32>, tensor<2x3x8x5xf32>) -> tensor<2x3x8x8xf32>
  %5 = forge.matmul %mt, %m {transA = true} : (tensor<8x4xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
  return %0, %1, %2, %3, %4, %5 : tensor<2x3x4x5xf32>, tensor<2x3x4x5xf32>, tensor<2x3x4x5xf32>, tensor<2x3x4x5xf32>, tensor<2x3x8x8xf32>, tensor<4x5xf32>
}

// -----

// Not: batches broadcast on both sides, a vector operand, f16 with f32 (cuBLASLt's
// operands share one type), an empty result,
// an empty contraction (k = 0: cuBLASLt's problem would be refused; a kernel
// writes the zeros).
// CHECK-LABEL: func @not_matmuls
// CHECK-NOT: forge.library
func.func @not_matmuls(%a: tensor<2x1x4x8xf32>, %b: tensor<1x3x8x5xf32>, %v: tensor<8xf32>, %h: tensor<4x8xf16>, %hb: tensor<8x5xf32>, %e: tensor<0x8xf32>, %m: tensor<8x5xf32>, %zk: tensor<4x0xf32>, %zn: tensor<0x5xf32>) -> (tensor<2x3x4x5xf32>, tensor<2x1x4xf32>, tensor<4x5xf16>, tensor<0x5xf32>, tensor<4x5xf32>) {
  %0 = forge.matmul %a, %b : (tensor<2x1x4x8xf32>, tensor<1x3x8x5xf32>) -> tensor<2x3x4x5xf32>
  %1 = forge.matmul %a, %v : (tensor<2x1x4x8xf32>, tensor<8xf32>) -> tensor<2x1x4xf32>
  %2 = forge.matmul %h, %hb : (tensor<4x8xf16>, tensor<8x5xf32>) -> tensor<4x5xf16>
  %3 = forge.matmul %e, %m : (tensor<0x8xf32>, tensor<8x5xf32>) -> tensor<0x5xf32>
  %4 = forge.matmul %zk, %zn : (tensor<4x0xf32>, tensor<0x5xf32>) -> tensor<4x5xf32>
  return %0, %1, %2, %3, %4 : tensor<2x3x4x5xf32>, tensor<2x1x4xf32>, tensor<4x5xf16>, tensor<0x5xf32>, tensor<4x5xf32>
}

// -----

// gemm: a bias row is cuBLASLt's bias epilogue when beta is 1; beta scales a
// full C only.
// CHECK-LABEL: func @gemms
// CHECK: forge.gemm %arg0, %arg1, %arg2 {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64, forge.library = "cublaslt", forge.matmul = {{{.*}}c = "bias"
// CHECK: forge.gemm %arg0, %arg1, %arg3 {alpha = 1.000000e+00 : f64, beta = 5.000000e-01 : f64, forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 1 : i64, beta = 5.000000e-01 : f64, c = "full", k = 8 : i64
// CHECK: forge.gemm %arg0, %arg1, %arg2 {alpha = 1.000000e+00 : f64, beta = 5.000000e-01 : f64, transA = false, transB = false}
func.func @gemms(%a: tensor<4x8xf32>, %b: tensor<8x5xf32>, %bias: tensor<5xf32>, %c: tensor<4x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>) {
  %0 = forge.gemm %a, %b, %bias {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<4x8xf32>, tensor<8x5xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  %1 = forge.gemm %a, %b, %c {alpha = 1.0 : f64, beta = 0.5 : f64, transA = false, transB = false} : (tensor<4x8xf32>, tensor<8x5xf32>, tensor<4x5xf32>) -> tensor<4x5xf32>
  %2 = forge.gemm %a, %b, %bias {alpha = 1.0 : f64, beta = 0.5 : f64, transA = false, transB = false} : (tensor<4x8xf32>, tensor<8x5xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  return %0, %1, %2 : tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>
}

// -----

// cuDNN takes symmetric pads only (forge-symmetrize-conv-padding makes them so).
// CHECK-LABEL: func @convs
// CHECK: forge.conv %arg0, %arg1 {dilations = array<i64: 1, 1>, forge.library = "cudnn"
// CHECK: forge.conv %arg0, %arg1 {dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 0, 0, 1, 1>
// CHECK-NOT: forge.library
func.func @convs(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) -> (tensor<1x4x8x8xf32>, tensor<1x4x4x4xf32>) {
  %0 = forge.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32>
  %1 = forge.conv %x, %w {strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x4x4xf32>
  return %0, %1 : tensor<1x4x8x8xf32>, tensor<1x4x4x4xf32>
}

// -----

// Channels-last (forge-assign-layout) and bf16 convolutions are cuDNN's when every operand
// has the result's type (its legacy API's bf16 configuration); a conv_transpose checked in
// its channels-first form. Mixed types stay off the library.
// CHECK-LABEL: func @convs_channels_last
// CHECK: forge.conv %arg0, %arg1 {channels_last = true{{.*}}forge.library = "cudnn"
// CHECK: forge.conv_transpose %arg2, %arg1 {channels_last = true{{.*}}forge.library = "cudnn"
// CHECK: forge.conv %arg3, %arg1 {channels_last = true
// CHECK-NOT: forge.library
func.func @convs_channels_last(%x: tensor<2x8x8x3xbf16>, %w: tensor<4x3x3x3xbf16>, %dy: tensor<2x8x8x4xbf16>, %xf: tensor<2x8x8x3xf32>) -> (tensor<2x8x8x4xbf16>, tensor<2x8x8x3xbf16>, tensor<2x8x8x4xf32>) {
  %0 = forge.conv %x, %w {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x3xbf16>, tensor<4x3x3x3xbf16>) -> tensor<2x8x8x4xbf16>
  %1 = forge.conv_transpose %dy, %w {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, output_padding = array<i64: 0, 0>, group = 1 : i64} : (tensor<2x8x8x4xbf16>, tensor<4x3x3x3xbf16>) -> tensor<2x8x8x3xbf16>
  %2 = forge.conv %xf, %w {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<2x8x8x3xf32>, tensor<4x3x3x3xbf16>) -> tensor<2x8x8x4xf32>
  return %0, %1, %2 : tensor<2x8x8x4xbf16>, tensor<2x8x8x3xbf16>, tensor<2x8x8x4xf32>
}

// -----

// GEMM regions (forge-fuse) carry the library marks and their epilogue; the
// body stays unmarked (the CPU runs it). A region whose product has no
// cuBLASLt form (batches broadcast on both sides) becomes its ops again.
// CHECK-LABEL: func @gemm_regions
// CHECK: forge.fusion "gemm"(%arg0, %arg1, %arg2) {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 1 : i64, beta = 1.000000e+00 : f64, c = "bias", epilogue = "relu", k = 8 : i64, lhs_batch_stride = 0 : i64, m = 4 : i64, n = 5 : i64, rhs_batch_stride = 0 : i64, trans_a = false, trans_b = true}}
// CHECK-NEXT: ^bb0
// CHECK-NEXT: forge.gemm %{{.*}} {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64, transA = false, transB = true}
// CHECK: forge.fusion "gemm"(%arg3, %arg4) {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 1 : i64, beta = 0.000000e+00 : f64, c = "none", epilogue = "bgrad_lhs", k = 6 : i64, lhs_batch_stride = 0 : i64, m = 5 : i64, n = 8 : i64, rhs_batch_stride = 0 : i64, trans_a = true, trans_b = false}}
// CHECK: forge.fusion "gemm"(%arg4, %arg3) {forge.library = "cublaslt", forge.matmul = {{{.*}}epilogue = "bgrad_rhs", k = 6 : i64, lhs_batch_stride = 0 : i64, m = 8 : i64, n = 5 : i64
// CHECK-NOT: forge.fusion "gemm"
// CHECK: %[[P:.*]] = forge.matmul %arg5, %arg6 : (tensor<2x1x4x8xf32>, tensor<1x3x8x5xf32>) -> tensor<2x3x4x5xf32>
// CHECK-NEXT: forge.relu %[[P]]
func.func @gemm_regions(%x: tensor<4x8xf32>, %w: tensor<5x8xf32>, %b: tensor<5xf32>, %dy: tensor<6x5xf32>, %h: tensor<6x8xf32>, %l: tensor<2x1x4x8xf32>, %r: tensor<1x3x8x5xf32>) -> (tensor<4x5xf32>, tensor<5x8xf32>, tensor<1x5xf32>, tensor<8x5xf32>, tensor<1x5xf32>, tensor<2x3x4x5xf32>) {
  %0 = forge.fusion "gemm"(%x, %w, %b) : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> tensor<4x5xf32> {
  ^bb0(%a0: tensor<4x8xf32>, %a1: tensor<5x8xf32>, %a2: tensor<5xf32>):
    %p = forge.gemm %a0, %a1, %a2 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> tensor<4x5xf32>
    %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
    forge.yield %y : tensor<4x5xf32>
  }
  %1:2 = forge.fusion "gemm"(%dy, %h) : (tensor<6x5xf32>, tensor<6x8xf32>) -> (tensor<5x8xf32>, tensor<1x5xf32>) {
  ^bb0(%a0: tensor<6x5xf32>, %a1: tensor<6x8xf32>):
    %p = forge.gemm %a0, %a1 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<6x5xf32>, tensor<6x8xf32>) -> tensor<5x8xf32>
    %s = forge.reduce_sum %a0 {axes = array<i64: 0>, keepdims = true} : (tensor<6x5xf32>) -> tensor<1x5xf32>
    forge.yield %p, %s : tensor<5x8xf32>, tensor<1x5xf32>
  }
  %2:2 = forge.fusion "gemm"(%h, %dy) : (tensor<6x8xf32>, tensor<6x5xf32>) -> (tensor<8x5xf32>, tensor<1x5xf32>) {
  ^bb0(%a0: tensor<6x8xf32>, %a1: tensor<6x5xf32>):
    %p = forge.matmul %a0, %a1 {transA = true} : (tensor<6x8xf32>, tensor<6x5xf32>) -> tensor<8x5xf32>
    %s = forge.reduce_sum %a1 {axes = array<i64: 0>, keepdims = true} : (tensor<6x5xf32>) -> tensor<1x5xf32>
    forge.yield %p, %s : tensor<8x5xf32>, tensor<1x5xf32>
  }
  %3 = forge.fusion "gemm"(%l, %r) : (tensor<2x1x4x8xf32>, tensor<1x3x8x5xf32>) -> tensor<2x3x4x5xf32> {
  ^bb0(%a0: tensor<2x1x4x8xf32>, %a1: tensor<1x3x8x5xf32>):
    %p = forge.matmul %a0, %a1 : (tensor<2x1x4x8xf32>, tensor<1x3x8x5xf32>) -> tensor<2x3x4x5xf32>
    %y = forge.relu %p : (tensor<2x3x4x5xf32>) -> tensor<2x3x4x5xf32>
    forge.yield %y : tensor<2x3x4x5xf32>
  }
  return %0, %1#0, %1#1, %2#0, %2#1, %3 : tensor<4x5xf32>, tensor<5x8xf32>, tensor<1x5xf32>, tensor<8x5xf32>, tensor<1x5xf32>, tensor<2x3x4x5xf32>
}

// -----

// A residual linear layer's region: the full C and the bias row (input 3) as
// cuBLASLt's BIAS epilogue.
// CHECK-LABEL: func @bias_after_full_c
// CHECK: forge.fusion "gemm"(%arg0, %arg1, %arg2, %arg3) {forge.library = "cublaslt", forge.matmul = {alpha = 1.000000e+00 : f64, batch = 1 : i64, beta = 1.000000e+00 : f64, c = "full", epilogue = "bias", k = 8 : i64, lhs_batch_stride = 0 : i64, m = 6 : i64, n = 5 : i64, rhs_batch_stride = 0 : i64, trans_a = false, trans_b = true}}
func.func @bias_after_full_c(%x: tensor<6x8xf32>, %w: tensor<5x8xf32>, %r: tensor<6x5xf32>, %b: tensor<5xf32>) -> tensor<6x5xf32> {
  %0 = forge.fusion "gemm"(%x, %w, %r, %b) : (tensor<6x8xf32>, tensor<5x8xf32>, tensor<6x5xf32>, tensor<5xf32>) -> tensor<6x5xf32> {
  ^bb0(%a0: tensor<6x8xf32>, %a1: tensor<5x8xf32>, %a2: tensor<6x5xf32>, %a3: tensor<5xf32>):
    %p = forge.gemm %a0, %a1, %a2 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<6x8xf32>, tensor<5x8xf32>, tensor<6x5xf32>) -> tensor<6x5xf32>
    %s = forge.add %p, %a3 : (tensor<6x5xf32>, tensor<5xf32>) -> tensor<6x5xf32>
    forge.yield %s : tensor<6x5xf32>
  }
  return %0 : tensor<6x5xf32>
}

// -----

// GELU regions: GELU_AUX_BIAS (the pre-activation yielded too), GELU_BIAS
// (the GELU alone) and DGELU_BGRAD (the GELU's input as the last argument,
// the bias gradient beside it); n = 5 is no multiple of 8, which aux matrices
// need, so that region goes back to a GEMM and a kernel.
// CHECK-LABEL: func @gelu
// CHECK: forge.fusion "gemm"(%arg0, %arg1, %arg2) {forge.library = "cublaslt", forge.matmul = {{{.*}}c = "bias", epilogue = "gelu_aux", k = 4 : i64{{.*}}m = 6 : i64, n = 8 : i64
// CHECK: forge.fusion "gemm"(%arg0, %arg1, %arg2) {forge.library = "cublaslt", forge.matmul = {{{.*}}c = "bias", epilogue = "gelu", k = 4 : i64
// CHECK: forge.fusion "gemm"(%arg3, %arg4, %arg5) {forge.library = "cublaslt", forge.matmul = {{{.*}}c = "none", epilogue = "dgelu_bgrad", k = 5 : i64{{.*}}m = 6 : i64, n = 8 : i64
// CHECK-NOT: forge.fusion "gemm"
// CHECK: forge.gemm {{.*}}forge.library = "cublaslt"
// CHECK: forge.gelu_grad
func.func @gelu(%x: tensor<6x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>, %dy: tensor<6x5xf32>, %w2: tensor<5x8xf32>, %h: tensor<6x8xf32>, %w5: tensor<8x5xf32>, %h5: tensor<6x5xf32>) -> (tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<1x8xf32>, tensor<6x5xf32>) {
  %0:2 = forge.fusion "gemm"(%x, %w, %b) : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<6x8xf32>, tensor<6x8xf32>) {
  ^bb0(%a0: tensor<6x4xf32>, %a1: tensor<4x8xf32>, %a2: tensor<8xf32>):
    %p = forge.gemm %a0, %a1, %a2 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<6x8xf32>
    %g = forge.gelu %p {approximate = "tanh"} : (tensor<6x8xf32>) -> tensor<6x8xf32>
    forge.yield %g, %p : tensor<6x8xf32>, tensor<6x8xf32>
  }
  %1 = forge.fusion "gemm"(%x, %w, %b) : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<6x8xf32> {
  ^bb0(%a0: tensor<6x4xf32>, %a1: tensor<4x8xf32>, %a2: tensor<8xf32>):
    %p = forge.gemm %a0, %a1, %a2 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<6x8xf32>
    %g = forge.gelu %p {approximate = "tanh"} : (tensor<6x8xf32>) -> tensor<6x8xf32>
    forge.yield %g : tensor<6x8xf32>
  }
  %2:2 = forge.fusion "gemm"(%dy, %w2, %h) : (tensor<6x5xf32>, tensor<5x8xf32>, tensor<6x8xf32>) -> (tensor<6x8xf32>, tensor<1x8xf32>) {
  ^bb0(%a0: tensor<6x5xf32>, %a1: tensor<5x8xf32>, %a2: tensor<6x8xf32>):
    %q = forge.gemm %a0, %a1 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<6x5xf32>, tensor<5x8xf32>) -> tensor<6x8xf32>
    %d = forge.gelu_grad %q, %a2 {approximate = "tanh"} : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
    %s = forge.reduce_sum %d {axes = array<i64: 0>, keepdims = true} : (tensor<6x8xf32>) -> tensor<1x8xf32>
    forge.yield %d, %s : tensor<6x8xf32>, tensor<1x8xf32>
  }
  %3 = forge.fusion "gemm"(%h, %w5, %h5) : (tensor<6x8xf32>, tensor<8x5xf32>, tensor<6x5xf32>) -> tensor<6x5xf32> {
  ^bb0(%a0: tensor<6x8xf32>, %a1: tensor<8x5xf32>, %a2: tensor<6x5xf32>):
    %q = forge.gemm %a0, %a1 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<6x8xf32>, tensor<8x5xf32>) -> tensor<6x5xf32>
    %d = forge.gelu_grad %q, %a2 {approximate = "tanh"} : (tensor<6x5xf32>, tensor<6x5xf32>) -> tensor<6x5xf32>
    forge.yield %d : tensor<6x5xf32>
  }
  return %0#0, %0#1, %1, %2#0, %2#1, %3 : tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<1x8xf32>, tensor<6x5xf32>
}

// -----

// cuBLASLt writes a bias gradient in D's type: beside a bf16 D, the f32 sum
// forge-assign-precision keeps is peeled off (DGELU stays the epilogue; the
// sum becomes a loose reduce_sum of the region's output). The f32 case above
// keeps DGELU_BGRAD.
// CHECK-LABEL: func @dgelu_low
// CHECK: %[[D:.+]] = forge.fusion "gemm"(%arg0, %arg1, %arg2) {forge.library = "cublaslt", forge.matmul = {{{.*}}epilogue = "dgelu",{{.*}}} : (tensor<6x5xbf16>, tensor<5x8xbf16>, tensor<6x8xbf16>) -> tensor<6x8xbf16>
// CHECK: forge.yield %{{.*}} : tensor<6x8xbf16>
// CHECK: %[[S:.+]] = forge.reduce_sum %[[D]] {axes = array<i64: 0>, keepdims = true} : (tensor<6x8xbf16>) -> tensor<1x8xf32>
// CHECK: return %[[D]], %[[S]]
func.func @dgelu_low(%dy: tensor<6x5xbf16>, %w2: tensor<5x8xbf16>, %h: tensor<6x8xbf16>) -> (tensor<6x8xbf16>, tensor<1x8xf32>) {
  %0:2 = forge.fusion "gemm"(%dy, %w2, %h) : (tensor<6x5xbf16>, tensor<5x8xbf16>, tensor<6x8xbf16>) -> (tensor<6x8xbf16>, tensor<1x8xf32>) {
  ^bb0(%a0: tensor<6x5xbf16>, %a1: tensor<5x8xbf16>, %a2: tensor<6x8xbf16>):
    %q = forge.gemm %a0, %a1 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<6x5xbf16>, tensor<5x8xbf16>) -> tensor<6x8xbf16>
    %d = forge.gelu_grad %q, %a2 {approximate = "tanh"} : (tensor<6x8xbf16>, tensor<6x8xbf16>) -> tensor<6x8xbf16>
    %s = forge.reduce_sum %d {axes = array<i64: 0>, keepdims = true} : (tensor<6x8xbf16>) -> tensor<1x8xf32>
    forge.yield %d, %s : tensor<6x8xbf16>, tensor<1x8xf32>
  }
  return %0#0, %0#1 : tensor<6x8xbf16>, tensor<1x8xf32>
}

// -----

// A ReLU region yielding its bitmask (RELU_AUX_BIAS) and the region masking a
// product with it (DRELU).
// CHECK-LABEL: func @relu_bitmask
// CHECK: forge.fusion "gemm"(%arg0, %arg1, %arg2) {forge.library = "cublaslt", forge.matmul = {{{.*}}c = "bias", epilogue = "relu_aux"
// CHECK: forge.fusion "gemm"(%arg3, %arg4, %{{.*}}) {forge.library = "cublaslt", forge.matmul = {{{.*}}c = "none", epilogue = "drelu"
func.func @relu_bitmask(%x: tensor<4x8xf32>, %w: tensor<5x8xf32>, %b: tensor<5xf32>, %g: tensor<4x3xf32>, %w2: tensor<3x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>) {
  %0:2 = forge.fusion "gemm"(%x, %w, %b) : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> (tensor<4x5xf32>, tensor<4x16xi8>) {
  ^bb0(%a0: tensor<4x8xf32>, %a1: tensor<5x8xf32>, %a2: tensor<5xf32>):
    %p = forge.gemm %a0, %a1, %a2 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> tensor<4x5xf32>
    %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
    %m = forge.relu_bitmask %y : (tensor<4x5xf32>) -> tensor<4x16xi8>
    forge.yield %y, %m : tensor<4x5xf32>, tensor<4x16xi8>
  }
  %1 = forge.fusion "gemm"(%g, %w2, %0#1) : (tensor<4x3xf32>, tensor<3x5xf32>, tensor<4x16xi8>) -> tensor<4x5xf32> {
  ^bb0(%a0: tensor<4x3xf32>, %a1: tensor<3x5xf32>, %a2: tensor<4x16xi8>):
    %q = forge.matmul %a0, %a1 : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
    %d = forge.relu_grad_bitmask %q, %a2 : (tensor<4x5xf32>, tensor<4x16xi8>) -> tensor<4x5xf32>
    forge.yield %d : tensor<4x5xf32>
  }
  return %0#0, %1 : tensor<4x5xf32>, tensor<4x5xf32>
}

// -----

// bf16 operands (forge-assign-precision): the product written as f32 or bf16,
// a bias row f32; a bf16 product over a full C of another type is not taken.
// CHECK-LABEL: func @low_precision
// CHECK: forge.gemm %arg0, %arg1, %arg2 {{.*}}forge.library = "cublaslt"{{.*}} -> tensor<4x5xf32>
// CHECK: forge.gemm %arg0, %arg1 {{.*}}forge.library = "cublaslt"{{.*}} -> tensor<4x5xbf16>
// CHECK: forge.gemm %arg0, %arg1, %arg3
// CHECK-NOT: forge.library
// CHECK-SAME: -> tensor<4x5xbf16>
func.func @low_precision(%a: tensor<4x8xbf16>, %b: tensor<8x5xbf16>, %bias: tensor<5xf32>, %c: tensor<4x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xbf16>, tensor<4x5xbf16>) {
  %0 = forge.gemm %a, %b, %bias {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<4x8xbf16>, tensor<8x5xbf16>, tensor<5xf32>) -> tensor<4x5xf32>
  %1 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<4x8xbf16>, tensor<8x5xbf16>) -> tensor<4x5xbf16>
  %2 = forge.gemm %a, %b, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<4x8xbf16>, tensor<8x5xbf16>, tensor<4x5xf32>) -> tensor<4x5xbf16>
  return %0, %1, %2 : tensor<4x5xf32>, tensor<4x5xbf16>, tensor<4x5xbf16>
}

// -----

// Attention and its gradient in bf16 (f32 lse), head size 64: cuDNN's flash attention.
// CHECK-LABEL: func @attention_bf16
// CHECK: forge.attention %arg0, %arg1, %arg2 {causal = true, forge.library = "cudnn", scale = 1.250000e-01 : f64}
// CHECK: forge.attention_grad {{.*}}forge.library = "cudnn"
func.func @attention_bf16(%q: tensor<1x2x16x64xbf16>, %k: tensor<1x2x16x64xbf16>, %v: tensor<1x2x16x64xbf16>, %do: tensor<1x2x16x64xbf16>) -> (tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>) {
  %o, %lse = forge.attention %q, %k, %v {causal = true, scale = 1.250000e-01 : f64} : (tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>) -> (tensor<1x2x16x64xbf16>, tensor<1x2x16xf32>)
  %dq, %dk, %dv = forge.attention_grad %q, %k, %v, %o, %lse, %do {causal = true, scale = 1.250000e-01 : f64} : (tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x2x16xf32>, tensor<1x2x16x64xbf16>) -> (tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>)
  return %o, %dq : tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>
}

// -----

// A scaled_gemm (float8 operands, forge-assign-precision's fp8) states its
// problem with `scaled`; a bf16 bias row is cuBLASLt's BIAS epilogue.
// CHECK-LABEL: func @scaled
// CHECK: forge.scaled_gemm {{.*}}forge.library = "cublaslt", forge.matmul = {alpha = 5.000000e-01 : f64, batch = 1 : i64, beta = 1.000000e+00 : f64, c = "bias", k = 32 : i64, lhs_batch_stride = 0 : i64, m = 8 : i64, n = 16 : i64, rhs_batch_stride = 0 : i64, scaled = true, trans_a = false, trans_b = true}
func.func @scaled(%a: tensor<8x32xf8E4M3FN>, %b: tensor<16x32xf8E4M3FN>, %sa: tensor<f32>, %sb: tensor<f32>, %row: tensor<16xbf16>) -> tensor<8x16xbf16> {
  %0 = forge.scaled_gemm %a, %b, %sa, %sb, %row {alpha = 0.5 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<8x32xf8E4M3FN>, tensor<16x32xf8E4M3FN>, tensor<f32>, tensor<f32>, tensor<16xbf16>) -> tensor<8x16xbf16>
  return %0 : tensor<8x16xbf16>
}
