// RUN: forge-opt %s --split-input-file --forge-chunk-cross-entropy="max-bytes=256 fused-head=true" | FileCheck %s --check-prefix=FUSED
// RUN: forge-opt %s --split-input-file --forge-chunk-cross-entropy="max-bytes=256" | FileCheck %s --check-prefix=PLAIN

// A head forge-fuse-linear-cross-entropy takes (bf16 h [2, 4, 8] and w [16, 8], K and C
// multiples of 8, a bf16 gradient): its f32 logits (512 bytes) are never stored, so with
// fused-head its bytes are the gradient's (256) and it stays whole at 256; without, two
// chunks.
// FUSED-LABEL: func @fusible
// FUSED-COUNT-1: forge.matmul
// FUSED-NOT: forge.matmul
// PLAIN-LABEL: func @fusible
// PLAIN-COUNT-2: forge.matmul
func.func @fusible(%h: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %labels: tensor<2x4xi64>,
                   %g: tensor<f32>) -> (tensor<8xf32>, tensor<8x8xf32>, tensor<16x8xf32>) {
  %p = forge.matmul %h, %w {transB = true} : (tensor<2x4x8xbf16>, tensor<16x8xbf16>) -> tensor<2x4x16xf32>
  %logits = forge.reshape %p {shape = array<i64: 8, 16>} : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %t = forge.reshape %labels {shape = array<i64: 8>} : (tensor<2x4xi64>) -> tensor<8xi64>
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<8x16xf32>, tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>)
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "mean"} : (tensor<8x16xf32>, tensor<8xf32>, tensor<8xi64>, tensor<f32>) -> tensor<8x16xbf16>
  %dh = forge.gemm %d, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<8x16xbf16>, tensor<16x8xbf16>) -> tensor<8x8xf32>
  %h2 = forge.reshape %h {shape = array<i64: 8, 8>} : (tensor<2x4x8xbf16>) -> tensor<8x8xbf16>
  %dw = forge.gemm %d, %h2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<8x16xbf16>, tensor<8x8xbf16>) -> tensor<16x8xf32>
  return %loss, %dh, %dw : tensor<8xf32>, tensor<8x8xf32>, tensor<16x8xf32>
}

// -----

// Negative: an f32 gradient (not the fused form) counts its f32 logits even with
// fused-head: two chunks either way.
// FUSED-LABEL: func @f32_gradient
// FUSED-COUNT-2: forge.matmul
// PLAIN-LABEL: func @f32_gradient
// PLAIN-COUNT-2: forge.matmul
func.func @f32_gradient(%h: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %labels: tensor<2x4xi64>,
                        %g: tensor<f32>) -> (tensor<8xf32>, tensor<8x8xf32>, tensor<16x8xf32>) {
  %p = forge.matmul %h, %w {transB = true} : (tensor<2x4x8xbf16>, tensor<16x8xbf16>) -> tensor<2x4x16xf32>
  %logits = forge.reshape %p {shape = array<i64: 8, 16>} : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %t = forge.reshape %labels {shape = array<i64: 8>} : (tensor<2x4xi64>) -> tensor<8xi64>
  %loss, %lse = forge.cross_entropy %logits, %t : (tensor<8x16xf32>, tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>)
  %d = forge.cross_entropy_grad %logits, %lse, %t, %g {reduction = "mean"} : (tensor<8x16xf32>, tensor<8xf32>, tensor<8xi64>, tensor<f32>) -> tensor<8x16xf32>
  %dh = forge.gemm %d, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<8x16xf32>, tensor<16x8xbf16>) -> tensor<8x8xf32>
  %h2 = forge.reshape %h {shape = array<i64: 8, 8>} : (tensor<2x4x8xbf16>) -> tensor<8x8xbf16>
  %dw = forge.gemm %d, %h2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<8x16xf32>, tensor<8x8xbf16>) -> tensor<16x8xf32>
  return %loss, %dh, %dw : tensor<8xf32>, tensor<8x8xf32>, tensor<16x8xf32>
}
