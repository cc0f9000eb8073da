// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-gradients=e5m2" 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-gradients=e5m2" 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8" 2>/dev/null | FileCheck %s --check-prefix=BF16
// RUN: not forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-gradients=e4m3" 2>&1 | FileCheck %s --check-prefix=BADGRAD

// fp8-gradients=e5m2: the backward of the float8 product y = x w^T runs in
// float8 too. dx = dy w (transB false) and dw = dy^T x (transA true) read
// exactly one forward tensor each (w's copy, x); the other operand, dy, is
// the gradient:
//  * dy gets an E5M2 copy scaled by 57344 / amax(dy) (its own multi_reduce
//    right after it);
//  * the operands read transposed (w for dx; dy and x for dw) are
//    transposes of their float8 copies (w's and x's are the forward's),
//    with the same amaxes (one amax per tensor);
//  * both are scaled_gemms in float8's one layout (lhs [M, K], rhs [N, K]),
//    alpha = 1 / (57344 * 448).
// Without the option (BF16) the backward keeps its bf16 gemms.
// CHECK-LABEL: func @train_step
// CHECK-SAME: %[[X:arg0]]: tensor<32x16xbf16>
// CHECK-SAME: %[[WC:arg[0-9]+]]: tensor<32x16xbf16> {forge.copy_of = "w"
// CHECK: %[[MAX4:.+]] = forge.constant dense<4.480000e+02> : tensor<f32>
// CHECK: %[[MAX5:.+]] = forge.constant dense<5.734400e+04> : tensor<f32>
// CHECK: %[[AMAX:.+]]:2 = forge.fusion "multi_reduce"(%[[X]], %[[WC]], %{{.+}})
// CHECK: %[[WQ:.+]] = forge.fusion "loop"(%[[WC]], %[[AMAX]]#1, %[[MAX4]]) : {{.*}} -> tensor<32x16xf8E4M3FN>
// CHECK: %[[WTQ:.+]] = forge.transpose %[[WQ]] {perm = array<i64: 1, 0>} : (tensor<32x16xf8E4M3FN>) -> tensor<16x32xf8E4M3FN>
// CHECK: %[[XQ:.+]] = forge.fusion "loop"(%[[X]], %[[AMAX]]#0, %[[MAX4]]) : {{.*}} -> tensor<32x16xf8E4M3FN>
// CHECK: %[[XTQ:.+]] = forge.transpose %[[XQ]] {perm = array<i64: 1, 0>} : (tensor<32x16xf8E4M3FN>) -> tensor<16x32xf8E4M3FN>
// CHECK: forge.scaled_gemm %[[XQ]], %[[WQ]]
// CHECK: %[[DY:.+]] = forge.mul {{.*}} -> tensor<32x32xbf16>
// CHECK: %[[DYAMAX:.+]] = forge.fusion "multi_reduce"(%[[DY]], %{{.+}}) : (tensor<32x32xbf16>, tensor<f32>) -> tensor<f32>
// CHECK: %[[DYQ:.+]] = forge.fusion "loop"(%[[DY]], %[[DYAMAX]], %[[MAX5]]) : {{.*}} -> tensor<32x32xf8E5M2>
// CHECK: forge.mul
// CHECK-NEXT: forge.div
// CHECK-NEXT: forge.cast %{{.*}} {to = f8E5M2}
// CHECK: %[[DYTQ:.+]] = forge.transpose %[[DYQ]] {perm = array<i64: 1, 0>} : (tensor<32x32xf8E5M2>) -> tensor<32x32xf8E5M2>
// CHECK: %[[DX:.+]] = forge.scaled_gemm %[[DYQ]], %[[WTQ]], %[[DYAMAX]], %[[AMAX]]#1 {alpha = 3.8925482302295915E-8 : f64, beta = 0.000000e+00 : f64, transA = false, transB = true} : (tensor<32x32xf8E5M2>, tensor<16x32xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<32x16xf32>
// CHECK: %[[DW:.+]] = forge.scaled_gemm %[[DYTQ]], %[[XTQ]], %[[DYAMAX]], %[[AMAX]]#0 {alpha = 3.8925482302295915E-8 : f64, beta = 0.000000e+00 : f64, transA = false, transB = true} : (tensor<32x32xf8E5M2>, tensor<16x32xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<32x16xf32>
// CHECK-NOT: forge.gemm
// CHECK: return %[[DX]]
// REMARK: 1 GEMM(s) run in float8 (E4M3) from 2 scaled copies, 2 gradient GEMM(s) read E5M2 (4 more copies)
// A float8 transpose moves bytes: its kernel loads and stores them as they
// are, through the shared-memory tiles of a transposing kernel.
// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-gradients=e5m2" 2>/dev/null | forge-opt --split-input-file --forge-generate-kernels | FileCheck %s --check-prefix=KERNEL
// KERNEL: gpu.func @{{k[0-9]+}}_transpose(%arg0: memref<512xi8>, %arg1: memref<512xi8>) workgroup(%[[T:.+]] : memref<1056xi8, #gpu.address_space<workgroup>>)
// KERNEL: %[[B:.+]] = memref.load %arg0[%{{.+}}] : memref<512xi8>
// KERNEL: memref.store %[[B]], %[[T]]
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
