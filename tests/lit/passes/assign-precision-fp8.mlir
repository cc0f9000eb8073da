// RUN: forge-opt %s --split-input-file --forge-assign-precision=precision=fp8 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-assign-precision=precision=fp8 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// precision=fp8: bf16 storage, and the GEMM in float8's layout (lhs [M, K], rhs
// [N, K], K and N multiples of 16) runs as a scaled_gemm of E4M3 copies:
//  * the bf16 copies of the arguments it reads (the data input x and w's
//    state copy) get their amax max(|v|, 1e-30) in one multi_reduce at the
//    entry, then a loop region each writing saturate(v * 448 / amax);
//  * the gemm region keeps its epilogue and takes the copies and amaxes as
//    arguments 0-3; alpha is 1/448^2 (each operand is multiplied back by
//    amax / 448);
//  * the gemm with N = 24 (not a multiple of 16) stays bf16.
// CHECK-LABEL: func @train_step
// CHECK-SAME: %[[X:arg0]]: tensor<32x16xbf16> {forge.kind = "input", forge.name = "x"}
// CHECK-SAME: %[[WC:arg[0-9]+]]: tensor<32x16xbf16> {forge.copy_of = "w", forge.kind = "state", forge.name = "w.bf16"
// CHECK-SAME: attributes {forge.precision = "fp8"}
// CHECK: %[[MAX:.+]] = forge.constant dense<4.480000e+02> : tensor<f32>
// CHECK: %[[FLOOR:.+]] = forge.constant dense<1.000000e-30> : tensor<f32>
// CHECK: %[[AMAX:.+]]:2 = forge.fusion "multi_reduce"(%[[X]], %[[WC]], %[[FLOOR]])
// CHECK: forge.abs
// CHECK-NEXT: forge.max
// CHECK-NEXT: forge.reduce_max {{.*}} -> tensor<f32>
// CHECK: forge.reduce_max
// CHECK: %[[WQ:.+]] = forge.fusion "loop"(%[[WC]], %[[AMAX]]#1, %[[MAX]]) : {{.*}} -> tensor<32x16xf8E4M3FN>
// CHECK: forge.mul
// CHECK-NEXT: forge.div
// CHECK-NEXT: forge.cast %{{.*}} {to = f8E4M3FN}
// CHECK: %[[XQ:.+]] = forge.fusion "loop"(%[[X]], %[[AMAX]]#0, %[[MAX]]) : {{.*}} -> tensor<32x16xf8E4M3FN>
// CHECK: %[[H:.+]] = forge.fusion "gemm"(%[[XQ]], %[[WQ]], %[[AMAX]]#0, %[[AMAX]]#1) : (tensor<32x16xf8E4M3FN>, tensor<32x16xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<32x32xbf16>
// CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<32x16xf8E4M3FN>, %[[B:.+]]: tensor<32x16xf8E4M3FN>, %[[SA:.+]]: tensor<f32>, %[[SB:.+]]: tensor<f32>):
// CHECK-NEXT: forge.scaled_gemm %[[A]], %[[B]], %[[SA]], %[[SB]] {alpha = 4.9824617346938772E-6 : f64, beta = 0.000000e+00 : f64, transA = false, transB = true}
// CHECK-NEXT: forge.relu
// CHECK: forge.gemm %[[H]], %{{.*}} : (tensor<32x32xbf16>, tensor<24x32xbf16>) -> tensor<32x24xbf16>
// REMARK: 1 GEMM(s) run in float8 (E4M3) from 2 scaled copies
func.func @train_step(%x: tensor<32x16xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<32x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<32x16xf32>},
                      %w2: tensor<24x32xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.25> : tensor<24x32xf32>},
                      %g: tensor<32x16xf32> {forge.kind = "input", forge.name = "g"})
    -> (tensor<32x16xf32> {forge.updates = "w"}) {
  %h = forge.fusion "gemm"(%x, %w) : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32> {
  ^bb0(%a: tensor<32x16xf32>, %b: tensor<32x16xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32>
    %1 = forge.relu %0 : (tensor<32x32xf32>) -> tensor<32x32xf32>
    forge.yield %1 : tensor<32x32xf32>
  }
  %y = forge.gemm %h, %w2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x32xf32>, tensor<24x32xf32>) -> tensor<32x24xf32>
  %s = forge.reduce_sum %y {axes = array<i64: 0, 1>, keepdims = false} : (tensor<32x24xf32>) -> tensor<f32>
  %u = forge.fusion "loop"(%w, %g, %s) : (tensor<32x16xf32>, tensor<32x16xf32>, tensor<f32>) -> tensor<32x16xf32> {
  ^bb1(%i: tensor<32x16xf32>, %j: tensor<32x16xf32>, %k: tensor<f32>):
    %1 = forge.mul %j, %k : (tensor<32x16xf32>, tensor<f32>) -> tensor<32x16xf32>
    %2 = forge.sub %i, %1 : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
    forge.yield %2 : tensor<32x16xf32>
  }
  return %u : tensor<32x16xf32>
}

// -----

// A loose matmul over a 3-d lhs runs on its rows (reshapes around the
// scaled_gemm); the loss head's matmul (logits into cross_entropy) stays a
// bf16 matmul for forge-chunk-cross-entropy.
// CHECK-LABEL: func @train_step
// CHECK: %[[ROWS:.+]] = forge.reshape %arg0 {shape = array<i64: 16, 32>} : (tensor<2x8x32xbf16>) -> tensor<16x32xbf16>
// CHECK: %[[P:.+]] = forge.scaled_gemm {{.*}} : (tensor<16x32xf8E4M3FN>, tensor<32x32xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<16x32xf32>
// CHECK-NEXT: forge.reshape %[[P]] {shape = array<i64: 2, 8, 32>}
// CHECK: forge.matmul %{{.*}}, %{{.*}} {transB = true} : (tensor<2x8x32xbf16>, tensor<64x32xbf16>) -> tensor<2x8x64xf32>
// CHECK-NOT: forge.scaled_gemm
// CHECK: forge.cross_entropy
// REMARK: 1 GEMM(s) run in float8 (E4M3) from 2 scaled copies
func.func @train_step(%x: tensor<2x8x32xf32> {forge.kind = "input", forge.name = "x"},
                      %t: tensor<16xi64> {forge.kind = "input", forge.name = "t"},
                      %w: tensor<64x32xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<64x32xf32>},
                      %w2: tensor<32x32xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.5> : tensor<32x32xf32>})
    -> (tensor<16xf32>, tensor<2x8x32xf32>) {
  %h = forge.matmul %x, %w2 {transB = true} : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %g = forge.matmul %h, %w {transB = true} : (tensor<2x8x32xf32>, tensor<64x32xf32>) -> tensor<2x8x64xf32>
  %r = forge.reshape %g {shape = array<i64: 16, 64>} : (tensor<2x8x64xf32>) -> tensor<16x64xf32>
  %l, %lse = forge.cross_entropy %r, %t : (tensor<16x64xf32>, tensor<16xi64>) -> (tensor<16xf32>, tensor<16xf32>)
  return %l, %h : tensor<16xf32>, tensor<2x8x32xf32>
}
