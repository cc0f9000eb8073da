// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-gradients=e5m2" 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-gradients=e5m2" 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8" 2>/dev/null | FileCheck %s --check-prefix=BF16
// RUN: not forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-gradients=e4m3" 2>&1 | FileCheck %s --check-prefix=BADGRAD

// fp8-gradients=e5m2: the backward of the float8 product y = x w^T runs in
// float8 too. dx = dy w (transB false) and dw = dy^T x (transA true) read
// exactly one forward tensor each (w's copy, x); the other operand, dy, is
// the gradient:
//  * dy gets an E5M2 copy scaled by 57344 / amax(dy) (its own multi_reduce
//    right after it), and a transposed E5M2 copy with the same amax;
//  * w and x get transposed E4M3 copies (a transpose, then the cast) with
//    the amaxes the forward found (one amax per tensor);
//  * both are scaled_gemms in float8's one layout (lhs [M, K], rhs [N, K]),
//    alpha = 1 / (57344 * 448).
// Without the option (BF16) the backward keeps its bf16 gemms.
// CHECK-LABEL: func @train_step
// CHECK-SAME: %[[X:arg0]]: tensor<32x16xbf16>
// CHECK-SAME: %[[WC:arg[0-9]+]]: tensor<32x16xbf16> {forge.copy_of = "w"
// CHECK: %[[MAX4:.+]] = forge.constant dense<4.480000e+02> : tensor<f32>
// CHECK: %[[MAX5:.+]] = forge.constant dense<5.734400e+04> : tensor<f32>
// CHECK: %[[AMAX:.+]]:2 = forge.fusion "multi_reduce"(%[[X]], %[[WC]], %{{.+}})
// CHECK: %[[WT:.+]] = forge.transpose %[[WC]] {perm = array<i64: 1, 0>} : (tensor<32x16xbf16>) -> tensor<16x32xbf16>
// CHECK: %[[WTQ:.+]] = forge.fusion "loop"(%[[WT]], %[[AMAX]]#1, %[[MAX4]]) : {{.*}} -> tensor<16x32xf8E4M3FN>
// CHECK: %[[XT:.+]] = forge.transpose %[[X]] {perm = array<i64: 1, 0>} : (tensor<32x16xbf16>) -> tensor<16x32xbf16>
// CHECK: %[[XTQ:.+]] = forge.fusion "loop"(%[[XT]], %[[AMAX]]#0, %[[MAX4]]) : {{.*}} -> tensor<16x32xf8E4M3FN>
// CHECK: forge.scaled_gemm {{.*}} -> tensor<32x32xf32>
// CHECK: %[[DY:.+]] = forge.mul {{.*}} -> tensor<32x32xbf16>
// CHECK: %[[DYAMAX:.+]] = forge.fusion "multi_reduce"(%[[DY]], %{{.+}}) : (tensor<32x32xbf16>, tensor<f32>) -> tensor<f32>
// CHECK: %[[DYQ:.+]] = forge.fusion "loop"(%[[DY]], %[[DYAMAX]], %[[MAX5]]) : {{.*}} -> tensor<32x32xf8E5M2>
// CHECK: forge.mul
// CHECK-NEXT: forge.div
// CHECK-NEXT: forge.cast %{{.*}} {to = f8E5M2}
// CHECK: %[[DYT:.+]] = forge.transpose %[[DY]] {perm = array<i64: 1, 0>}
// CHECK: %[[DYTQ:.+]] = forge.fusion "loop"(%[[DYT]], %[[DYAMAX]], %[[MAX5]]) : {{.*}} -> tensor<32x32xf8E5M2>
// CHECK: %[[DX:.+]] = forge.scaled_gemm %[[DYQ]], %[[WTQ]], %[[DYAMAX]], %[[AMAX]]#1 {alpha = 3.8925482302295915E-8 : f64, beta = 0.000000e+00 : f64, transA = false, transB = true} : (tensor<32x32xf8E5M2>, tensor<16x32xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<32x16xf32>
// CHECK: %[[DW:.+]] = forge.scaled_gemm %[[DYTQ]], %[[XTQ]], %[[DYAMAX]], %[[AMAX]]#0 {alpha = 3.8925482302295915E-8 : f64, beta = 0.000000e+00 : f64, transA = false, transB = true} : (tensor<32x32xf8E5M2>, tensor<16x32xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<32x16xf32>
// CHECK-NOT: forge.gemm
// CHECK: return %[[DX]]
// REMARK: 1 GEMM(s) run in float8 (E4M3) from 2 scaled copies, 2 gradient GEMM(s) read E5M2 (4 more copies)
// BF16-LABEL: func @train_step
// BF16: forge.scaled_gemm
// BF16: forge.gemm {{.*}} transA = false, transB = false
// BF16: forge.gemm {{.*}} transA = true, transB = false
// BADGRAD: unknown fp8-gradients 'e4m3' (bf16, e5m2)
func.func @train_step(%x: tensor<32x16xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<32x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<32x16xf32>},
                      %g: tensor<32x32xf32> {forge.kind = "input", forge.name = "g"})
    -> (tensor<32x16xf32>, tensor<32x16xf32> {forge.updates = "w"}) {
  %y = forge.gemm %x, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32>
  %dy = forge.mul %y, %g : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %dx = forge.gemm %dy, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<32x32xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  %dw = forge.gemm %dy, %x {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<32x32xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  %nw = forge.sub %w, %dw : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  return %dx, %nw : tensor<32x16xf32>, tensor<32x16xf32>
}

// -----

// Negative: the forward product stays bf16 (N = 24, not a multiple of 16),
// so its backward does too; a GEMM reading no tensor a float8 product read
// (dy times another input) and one reading a forward tensor (w2's copy)
// beside a C (the accumulation form) stay bf16 as well.
// CHECK-LABEL: func @train_step
// CHECK-NOT: f8E5M2
// CHECK: return
// REMARK: 1 GEMM(s) run in float8 (E4M3) from 2 scaled copies, 0 gradient GEMM(s) read E5M2 (0 more copies)
func.func @train_step(%x: tensor<32x16xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<24x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<24x16xf32>},
                      %w2: tensor<32x16xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.5> : tensor<32x16xf32>},
                      %g: tensor<32x24xf32> {forge.kind = "input", forge.name = "g"},
                      %h: tensor<32x16xf32> {forge.kind = "input", forge.name = "h"},
                      %h2: tensor<32x16xf32> {forge.kind = "input", forge.name = "h2"},
                      %c: tensor<32x16xf32> {forge.kind = "input", forge.name = "c"})
    -> (tensor<32x16xf32>, tensor<32x32xf32>, tensor<24x16xf32>, tensor<32x16xf32>) {
  %y = forge.gemm %x, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x16xf32>, tensor<24x16xf32>) -> tensor<32x24xf32>
  %dy = forge.mul %y, %g : (tensor<32x24xf32>, tensor<32x24xf32>) -> tensor<32x24xf32>
  %dx = forge.gemm %dy, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<32x24xf32>, tensor<24x16xf32>) -> tensor<32x16xf32>
  %y2 = forge.gemm %h, %w2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32>
  %dw = forge.gemm %dy, %h2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<32x24xf32>, tensor<32x16xf32>) -> tensor<24x16xf32>
  %dx2 = forge.gemm %y2, %w2, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<32x32xf32>, tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  return %dx, %y2, %dw, %dx2 : tensor<32x16xf32>, tensor<32x32xf32>, tensor<24x16xf32>, tensor<32x16xf32>
}
