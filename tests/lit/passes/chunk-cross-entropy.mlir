// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-chunk-cross-entropy="max-bytes=256" | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-chunk-cross-entropy | FileCheck %s --check-prefix=WHOLE
// RUN: forge-opt %s --split-input-file --forge-chunk-cross-entropy="max-bytes=0" | FileCheck %s --check-prefix=WHOLE

// An LM head as forge-fuse and forge-assign-precision leave it: logits
// [8, 16] f32 (512 bytes) from h [2, 4, 6] (bf16) and the weight [16, 6],
// their loss and gradient (bf16), the hidden state's gradient D W and the
// weight's D^T h. At 256 bytes: two chunks of 4 rows, each slicing h and the
// target, the second adding its weight gradient to the first's (C, beta 1).
// The mean's 1/8 is taken once and the chunks sum. The views of the old head
// that nothing reads are gone.
// CHECK-LABEL: func @lm_head
// CHECK-DAG: %[[H:.*]] = forge.reshape %arg0 {shape = array<i64: 8, 6>} : (tensor<2x4x6xbf16>) -> tensor<8x6xbf16>
// CHECK-DAG: %[[T:.*]] = forge.reshape %arg2 {shape = array<i64: 8>} : (tensor<2x4xi64>) -> tensor<8xi64>
// CHECK-DAG: %[[N:.*]] = forge.constant dense<8.000000e+00> : tensor<f32>
// CHECK: %[[G:.*]] = forge.div %arg3, %[[N]] : (tensor<f32>, tensor<f32>) -> tensor<f32>
// CHECK: %[[H0:.*]] = forge.slice %[[H]] {ends = array<i64: 4, 6>, starts = array<i64: 0, 0>, steps = array<i64: 1, 1>} : (tensor<8x6xbf16>) -> tensor<4x6xbf16>
// CHECK: %[[L0:.*]] = forge.matmul %[[H0]], %arg1 {transB = true} : (tensor<4x6xbf16>, tensor<16x6xbf16>) -> tensor<4x16xf32>
// CHECK: %[[T0:.*]] = forge.slice %[[T]] {ends = array<i64: 4>, starts = array<i64: 0>, steps = array<i64: 1>} : (tensor<8xi64>) -> tensor<4xi64>
// CHECK: %[[LOSS0:.*]], %[[LSE0:.*]] = forge.cross_entropy %[[L0]], %[[T0]] {classes = 15 : i64} : (tensor<4x16xf32>, tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>)
// CHECK: %[[D0:.*]] = forge.cross_entropy_grad %[[L0]], %[[LSE0]], %[[T0]], %[[G]] {classes = 15 : i64, reduction = "sum"} : {{.*}} -> tensor<4x16xbf16>
// CHECK: %[[DH0:.*]] = forge.gemm %[[D0]], %arg1 {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = false, transB = false} : (tensor<4x16xbf16>, tensor<16x6xbf16>) -> tensor<4x6xf32>
// CHECK: %[[DW0:.*]] = forge.gemm %[[D0]], %[[H0]] {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = true, transB = false} : (tensor<4x16xbf16>, tensor<4x6xbf16>) -> tensor<16x6xf32>
// CHECK: %[[H1:.*]] = forge.slice %[[H]] {ends = array<i64: 8, 6>, starts = array<i64: 4, 0>
// CHECK: %[[L1:.*]] = forge.matmul %[[H1]], %arg1
// CHECK: %[[T1:.*]] = forge.slice %[[T]] {ends = array<i64: 8>, starts = array<i64: 4>
// CHECK: %[[LOSS1:.*]], %[[LSE1:.*]] = forge.cross_entropy %[[L1]], %[[T1]]
// CHECK: %[[D1:.*]] = forge.cross_entropy_grad %[[L1]], %[[LSE1]], %[[T1]], %[[G]]
// CHECK: %[[DH1:.*]] = forge.gemm %[[D1]], %arg1
// CHECK: %[[DW:.*]] = forge.gemm %[[D1]], %[[H1]], %[[DW0]] {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64, transA = true, transB = false} : (tensor<4x16xbf16>, tensor<4x6xbf16>, tensor<16x6xf32>) -> tensor<16x6xf32>
// CHECK: %[[DH:.*]] = forge.concat %[[DH0]], %[[DH1]] {axis = 0 : i64} : (tensor<4x6xf32>, tensor<4x6xf32>) -> tensor<8x6xf32>
// CHECK: %[[LOSS:.*]] = forge.concat %[[LOSS0]], %[[LOSS1]] {axis = 0 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<8xf32>
// CHECK-NOT: forge.cross_entropy
// CHECK-NOT: forge.matmul
// CHECK: return %[[LOSS]], %[[DH]], %[[DW]]
// Under the default 1 GiB nothing changes.
// WHOLE-LABEL: func @lm_head
// WHOLE: forge.matmul %arg0, %arg1 {transB = true} : (tensor<2x4x6xbf16>, tensor<16x6xbf16>) -> tensor<2x4x16xf32>
// WHOLE-NOT: forge.slice
func.func @lm_head(%h: tensor<2x4x6xbf16>, %w: tensor<16x6xbf16>, %labels: tensor<2x4xi64>,
                   %g: tensor<f32>) -> (tensor<8xf32>, tensor<8x6xf32>, tensor<16x6xf32>) {
  %p = forge.matmul %h, %w {transB = true} : (tensor<2x4x6xbf16>, tensor<16x6xbf16>) -> tensor<2x4x16xf32>
  %logits = forge.reshape %p {shape = array<i64: 8, 16>} : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %t = forge.reshape %labels {shape = array<i64: 8>} : (tensor<2x4xi64>) -> tensor<8xi64>
  %loss, %lse = forge.cross_entropy %logits, %t {classes = 15 : i64} : (tensor<8x16xf32>, tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>)
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {classes = 15 : i64, reduction = "mean"} : (tensor<8x16xf32>, tensor<8xf32>, tensor<8xi64>, tensor<f32>) -> tensor<8x16xbf16>
  %dh = forge.gemm %d, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<8x16xbf16>, tensor<16x6xbf16>) -> tensor<8x6xf32>
  %h2 = forge.reshape %h {shape = array<i64: 8, 6>} : (tensor<2x4x6xbf16>) -> tensor<8x6xbf16>
  %dw = forge.gemm %d, %h2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<8x16xbf16>, tensor<8x6xbf16>) -> tensor<16x6xf32>
  return %loss, %dh, %dw : tensor<8xf32>, tensor<8x6xf32>, tensor<16x6xf32>
}

// -----

// An untied head [K, V] (x W, weight gradient h^T D) with a per-row upstream
// gradient (reduction none): three chunks of 3, 3 and 2 rows (logits of 768
// bytes: 3 chunks), the gradient's rows sliced with the chunk's; the lse,
// read elsewhere, concatenated.
// CHECK-LABEL: func @untied_none
// CHECK: forge.gemm {{.*}} : (tensor<3x6xf32>, tensor<6x24xf32>) -> tensor<3x24xf32>
// CHECK: forge.slice %arg3 {ends = array<i64: 3>, starts = array<i64: 0>, steps = array<i64: 1>} : (tensor<8xf32>) -> tensor<3xf32>
// CHECK: forge.cross_entropy_grad {{.*}} {reduction = "none"}
// CHECK: %[[DW0:.*]] = forge.gemm %{{.*}}, %{{.*}} {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = true, transB = false} : (tensor<3x6xf32>, tensor<3x24xf32>) -> tensor<6x24xf32>
// CHECK: forge.gemm {{.*}} : (tensor<3x6xf32>, tensor<6x24xf32>) -> tensor<3x24xf32>
// CHECK: %[[DW1:.*]] = forge.gemm %{{.*}}, %{{.*}}, %[[DW0]] {{.*}}beta = 1.000000e+00
// CHECK: forge.gemm {{.*}} : (tensor<2x6xf32>, tensor<6x24xf32>) -> tensor<2x24xf32>
// CHECK: forge.slice %arg3 {ends = array<i64: 8>, starts = array<i64: 6>
// CHECK: %[[DW:.*]] = forge.gemm %{{.*}}, %{{.*}}, %[[DW1]] {{.*}} : (tensor<2x6xf32>, tensor<2x24xf32>, tensor<6x24xf32>) -> tensor<6x24xf32>
// CHECK: %[[LOSS:.*]] = forge.concat {{.*}} -> tensor<8xf32>
// CHECK: %[[LSE:.*]] = forge.concat {{.*}} -> tensor<8xf32>
// CHECK: return %[[LOSS]], %[[LSE]], %[[DW]]
func.func @untied_none(%h: tensor<8x6xf32>, %w: tensor<6x24xf32>, %t: tensor<8xi64>,
                       %g: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<6x24xf32>) {
  %logits = forge.gemm %h, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<8x6xf32>, tensor<6x24xf32>) -> tensor<8x24xf32>
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<8x24xf32>, tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>)
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "none"} : (tensor<8x24xf32>, tensor<8xf32>, tensor<8xi64>, tensor<8xf32>) -> tensor<8x24xf32>
  %dw = forge.gemm %h, %d {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<8x6xf32>, tensor<8x24xf32>) -> tensor<6x24xf32>
  return %loss, %lse, %dw : tensor<8xf32>, tensor<8xf32>, tensor<6x24xf32>
}

// -----

// Negative: the logits are also returned (a user other than the loss), so
// the head stays whole, and the remark says why.
// CHECK-LABEL: func @logits_read_elsewhere
// CHECK: forge.cross_entropy_grad {{.*}} -> tensor<8x16xf32>
// CHECK-NOT: forge.slice
func.func @logits_read_elsewhere(%h: tensor<8x6xf32>, %w: tensor<16x6xf32>, %t: tensor<8xi64>,
                                 %g: tensor<f32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %logits = forge.matmul %h, %w {transB = true} : (tensor<8x6xf32>, tensor<16x6xf32>) -> tensor<8x16xf32>
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<8x16xf32>, tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>)
  // expected-remark @below {{forge-chunk-cross-entropy: logits of 512 bytes not chunked: the logits have a user other than the loss and its gradient}}
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "sum"} : (tensor<8x16xf32>, tensor<8xf32>, tensor<8xi64>, tensor<f32>) -> tensor<8x16xf32>
  return %logits, %d : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Negative: the gradient feeds an elementwise op, not a gemm.
// CHECK-LABEL: func @gradient_read_elsewhere
// CHECK-NOT: forge.slice
func.func @gradient_read_elsewhere(%h: tensor<8x6xf32>, %w: tensor<16x6xf32>, %t: tensor<8xi64>,
                                   %g: tensor<f32>) -> tensor<8x16xf32> {
  %logits = forge.matmul %h, %w {transB = true} : (tensor<8x6xf32>, tensor<16x6xf32>) -> tensor<8x16xf32>
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<8x16xf32>, tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>)
  // expected-remark @below {{not chunked: the logits' gradient has a user other than a gemm without C}}
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "sum"} : (tensor<8x16xf32>, tensor<8xf32>, tensor<8xi64>, tensor<f32>) -> tensor<8x16xf32>
  %e = forge.exp %d : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %e : tensor<8x16xf32>
}
