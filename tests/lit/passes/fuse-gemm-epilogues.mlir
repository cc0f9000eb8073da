// RUN: forge-opt %s --split-input-file --forge-fuse="gemm-epilogues=true aux-epilogues=true relu-aux-epilogues=true" | FileCheck %s
// The regions print and parse back (the verifier accepts what the pass makes).
// RUN: forge-opt %s --split-input-file --forge-fuse="gemm-epilogues=true aux-epilogues=true relu-aux-epilogues=true" | forge-opt --split-input-file --verify-each > /dev/null
// Off by default (the CPU pipeline): no gemm region.
// RUN: forge-opt %s --split-input-file --forge-fuse | FileCheck %s --check-prefix=OFF
// Without aux-epilogues (forgec's default: slower than unfused in f32/TF32), no GELU
// region and no ReLU bitmask.
// RUN: forge-opt %s --split-input-file --forge-fuse="gemm-epilogues=true" | FileCheck %s --check-prefix=NOAUX
// The GELU's aux epilogues without the ReLU's (forgec's bf16 default): GELU regions, no
// ReLU bitmask.
// RUN: forge-opt %s --split-input-file --forge-fuse="gemm-epilogues=true aux-epilogues=true" | FileCheck %s --check-prefix=GELU

// A linear layer's ReLU: one "gemm" region yielding the ReLU; its saved mask
// (y > 0) stays outside and fuses with its reader, the backward's where.
// CHECK-LABEL: func @relu
// CHECK: %[[R:.*]] = forge.fusion "gemm"(%arg0, %arg1, %arg2) : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> tensor<4x5xf32> {
// CHECK:   %[[P:.*]] = forge.gemm %{{.*}}, %{{.*}}, %{{.*}} {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64, transA = false, transB = true}
// CHECK:   %[[Y:.*]] = forge.relu %[[P]]
// CHECK:   forge.yield %[[Y]]
// CHECK: forge.fusion "loop"(%[[R]], %arg3, %arg4)
// CHECK:   forge.greater
// CHECK:   forge.where
// OFF-LABEL: func @relu
// OFF-NOT: "gemm"
func.func @relu(%x: tensor<4x8xf32>, %w: tensor<5x8xf32>, %b: tensor<5xf32>, %zero: tensor<f32>, %g: tensor<4x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>) {
  %p = forge.gemm %x, %w, %b {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
  %m = forge.greater %y, %zero : (tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xi1>
  %d = forge.where %m, %g, %zero : (tensor<4x5xi1>, tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xf32>
  return %y, %d : tensor<4x5xf32>, tensor<4x5xf32>
}

// -----

// A residual linear layer (GPT-2's attention and MLP outputs): the residual
// becomes gemm's C (beta 1) and the bias row the region's last argument, the
// batch folding into M; the result is viewed back as [2, 3, 5].
// CHECK-LABEL: func @residual
// CHECK: %[[A:.*]] = forge.reshape %arg0 {shape = array<i64: 6, 8>}
// CHECK: %[[C:.*]] = forge.reshape %arg3 {shape = array<i64: 6, 5>}
// CHECK: %[[R:.*]] = forge.fusion "gemm"(%[[A]], %arg1, %[[C]], %arg2) : (tensor<6x8xf32>, tensor<5x8xf32>, tensor<6x5xf32>, tensor<5xf32>) -> tensor<6x5xf32> {
// CHECK:   %[[P:.*]] = forge.gemm %{{.*}}, %{{.*}}, %{{.*}} {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64, transA = false, transB = true}
// CHECK:   %[[S:.*]] = forge.add %[[P]], %{{.*}} : (tensor<6x5xf32>, tensor<5xf32>) -> tensor<6x5xf32>
// CHECK:   forge.yield %[[S]]
// CHECK: forge.reshape %[[R]] {shape = array<i64: 2, 3, 5>}
// OFF-LABEL: func @residual
// OFF-NOT: "gemm"
func.func @residual(%x: tensor<2x3x8xf32>, %w: tensor<5x8xf32>, %b: tensor<5xf32>, %r: tensor<2x3x5xf32>) -> tensor<2x3x5xf32> {
  %p = forge.matmul %x, %w {transB = true} : (tensor<2x3x8xf32>, tensor<5x8xf32>) -> tensor<2x3x5xf32>
  %a = forge.add %b, %p : (tensor<5xf32>, tensor<2x3x5xf32>) -> tensor<2x3x5xf32>
  %s = forge.add %r, %a : (tensor<2x3x5xf32>, tensor<2x3x5xf32>) -> tensor<2x3x5xf32>
  return %s : tensor<2x3x5xf32>
}

// -----

// Not: a residual that broadcasts (C must be the product's shape); a biased
// product read twice.
// CHECK-LABEL: func @not_residual
// CHECK-NOT: "gemm"
// CHECK: return
func.func @not_residual(%x: tensor<4x8xf32>, %w: tensor<8x5xf32>, %b: tensor<5xf32>, %r: tensor<1x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>) {
  %p = forge.matmul %x, %w : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
  %a = forge.add %p, %b : (tensor<4x5xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  %s = forge.add %a, %r : (tensor<4x5xf32>, tensor<1x5xf32>) -> tensor<4x5xf32>
  %q = forge.matmul %w, %w {transA = true} : (tensor<8x5xf32>, tensor<8x5xf32>) -> tensor<5x5xf32>
  %p2 = forge.matmul %x, %w : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
  %a2 = forge.add %p2, %b : (tensor<4x5xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  %s2 = forge.add %a2, %p2 : (tensor<4x5xf32>, tensor<4x5xf32>) -> tensor<4x5xf32>
  return %s, %s2, %a2 : tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>
}

// -----

// A weight gradient dW = dy^T x (dy [K, M] read transposed) and the bias
// gradient sum(dy, rows) beside it: one region yielding both, the sum viewed
// back as the original [M]. The reader of dW between them moves after the region.
// CHECK-LABEL: func @bgrad_lhs
// CHECK: %[[R:.*]]:2 = forge.fusion "gemm"(%arg0, %arg1) : (tensor<6x5xf32>, tensor<6x8xf32>) -> (tensor<5x8xf32>, tensor<1x5xf32>) {
// CHECK:   forge.gemm %{{.*}}, %{{.*}} {{{.*}}transA = true, transB = false}
// CHECK:   forge.reduce_sum %{{.*}} {axes = array<i64: 0>, keepdims = true} : (tensor<6x5xf32>) -> tensor<1x5xf32>
// CHECK: %[[B:.*]] = forge.reshape %[[R]]#1 {shape = array<i64: 5>} : (tensor<1x5xf32>) -> tensor<5xf32>
// CHECK: forge.neg %[[R]]#0
// CHECK: return
func.func @bgrad_lhs(%dy: tensor<6x5xf32>, %x: tensor<6x8xf32>) -> (tensor<5x8xf32>, tensor<5xf32>) {
  %dw = forge.gemm %dy, %x {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<6x5xf32>, tensor<6x8xf32>) -> tensor<5x8xf32>
  %n = forge.neg %dw : (tensor<5x8xf32>) -> tensor<5x8xf32>
  %db = forge.reduce_sum %dy {axes = array<i64: 0>, keepdims = false} : (tensor<6x5xf32>) -> tensor<5xf32>
  return %n, %db : tensor<5x8xf32>, tensor<5xf32>
}

// -----

// GPT-2's form: the bias gradient sums the 3-D dy over its two leading axes;
// the GEMM reads dy viewed as [K, M] (and as its plain rhs: x^T dy).
// CHECK-LABEL: func @bgrad_rhs_3d
// CHECK: %[[V:.*]] = forge.reshape %arg0 {shape = array<i64: 6, 5>}
// CHECK: %[[R:.*]]:2 = forge.fusion "gemm"(%{{.*}}, %[[V]]) : (tensor<6x8xf32>, tensor<6x5xf32>) -> (tensor<8x5xf32>, tensor<1x5xf32>)
// CHECK: forge.reshape %[[R]]#1 {shape = array<i64: 1, 1, 5>}
func.func @bgrad_rhs_3d(%dy: tensor<2x3x5xf32>, %x: tensor<6x8xf32>) -> (tensor<8x5xf32>, tensor<1x1x5xf32>) {
  %db = forge.reduce_sum %dy {axes = array<i64: 0, 1>, keepdims = true} : (tensor<2x3x5xf32>) -> tensor<1x1x5xf32>
  %v = forge.reshape %dy {shape = array<i64: 6, 5>} : (tensor<2x3x5xf32>) -> tensor<6x5xf32>
  %dw = forge.matmul %x, %v {transA = true} : (tensor<6x8xf32>, tensor<6x5xf32>) -> tensor<8x5xf32>
  return %dw, %db : tensor<8x5xf32>, tensor<1x1x5xf32>
}

// -----

// Not: a bias gradient over a contraction longer than the product's sides
// (k = 16384 > 128: the GEMM needs split-K, which the epilogue gives up) of a
// product that is not small (2 m n k = 2^28 FLOPs).
// CHECK-LABEL: func @long_contraction
// CHECK-NOT: "gemm"
// CHECK: forge.reduce_sum
func.func @long_contraction(%dy: tensor<16384x64xf32>, %x: tensor<16384x128xf32>) -> (tensor<64x128xf32>, tensor<64xf32>) {
  %dw = forge.gemm %dy, %x {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<16384x64xf32>, tensor<16384x128xf32>) -> tensor<64x128xf32>
  %db = forge.reduce_sum %dy {axes = array<i64: 0>, keepdims = false} : (tensor<16384x64xf32>) -> tensor<64xf32>
  return %dw, %db : tensor<64x128xf32>, tensor<64xf32>
}

// -----

// A long contraction (k = 64 > 8) of a small product (under 2^28 FLOPs: its
// cost is its launch, split or not) takes the epilogue: the column sum's
// launch saved.
// CHECK-LABEL: func @long_contraction_small
// CHECK: forge.fusion "gemm"(%arg0, %arg1) : (tensor<64x5xf32>, tensor<64x8xf32>) -> (tensor<5x8xf32>, tensor<1x5xf32>)
// CHECK: forge.reduce_sum %{{.*}} {axes = array<i64: 0>, keepdims = true}
func.func @long_contraction_small(%dy: tensor<64x5xf32>, %x: tensor<64x8xf32>) -> (tensor<5x8xf32>, tensor<5xf32>) {
  %dw = forge.gemm %dy, %x {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<64x5xf32>, tensor<64x8xf32>) -> tensor<5x8xf32>
  %db = forge.reduce_sum %dy {axes = array<i64: 0>, keepdims = false} : (tensor<64x5xf32>) -> tensor<5xf32>
  return %dw, %db : tensor<5x8xf32>, tensor<5xf32>
}

// -----

// Not: a product of one value with itself (x x^T: one value for two region
// arguments).
// CHECK-LABEL: func @self_product
// CHECK-NOT: "gemm"
// CHECK: forge.relu
func.func @self_product(%x: tensor<4x8xf32>) -> tensor<4x4xf32> {
  %p = forge.matmul %x, %x {transB = true} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
  %y = forge.relu %p : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

// Not: a product read by more than the ReLU (cuBLASLt writes only the ReLU);
// a sum over the contraction of an lhs read untransposed (its axis 0 is M, not
// K); a sum over the last axis; f16; a gemm with a full C beside a bias gradient.
// CHECK-LABEL: func @not_epilogues
// CHECK-NOT: "gemm"
// CHECK: return
func.func @not_epilogues(%x: tensor<4x8xf32>, %w: tensor<8x5xf32>, %dy: tensor<4x5xf32>, %h: tensor<4x8xf16>, %wh: tensor<8x5xf16>, %c: tensor<5x8xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4x5xf16>, tensor<5x8xf32>, tensor<8xf32>) {
  %p = forge.matmul %x, %w : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
  %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
  %s = forge.reduce_sum %x {axes = array<i64: 0>, keepdims = false} : (tensor<4x8xf32>) -> tensor<8xf32>
  %t = forge.reduce_sum %x {axes = array<i64: 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<4xf32>
  %q = forge.matmul %h, %wh : (tensor<4x8xf16>, tensor<8x5xf16>) -> tensor<4x5xf16>
  %r = forge.relu %q : (tensor<4x5xf16>) -> tensor<4x5xf16>
  %dw = forge.gemm %dy, %x, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = true, transB = false} : (tensor<4x5xf32>, tensor<4x8xf32>, tensor<5x8xf32>) -> tensor<5x8xf32>
  %db = forge.reduce_sum %x {axes = array<i64: 0>, keepdims = false} : (tensor<4x8xf32>) -> tensor<8xf32>
  return %y, %p, %s, %t, %r, %dw, %db : tensor<4x5xf32>, tensor<4x5xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4x5xf16>, tensor<5x8xf32>, tensor<8xf32>
}

// -----

// A linear layer's tanh GELU whose input the backward reads: one region with
// the bias as gemm's C, yielding the GELU and the pre-activation (cuBLASLt's
// GELU_AUX_BIAS); the backward's gelu_grad after the GEMM of its grad_output
// (viewed as [2, 3, 8]) becomes a region reading that pre-activation as its
// last argument, with the bias gradient beside it (DGELU_BGRAD).
// CHECK-LABEL: func @gelu
// CHECK: %[[A:.*]] = forge.reshape %arg0 {shape = array<i64: 6, 4>}
// CHECK: %[[F:.*]]:2 = forge.fusion "gemm"(%[[A]], %arg1, %arg2) : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<6x8xf32>, tensor<6x8xf32>) {
// CHECK:   %[[P:.*]] = forge.gemm %{{.*}}, %{{.*}}, %{{.*}} {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64, transA = false, transB = false}
// CHECK:   %[[G:.*]] = forge.gelu %[[P]] {approximate = "tanh"}
// CHECK:   forge.yield %[[G]], %[[P]]
// CHECK: %[[PRE:.*]] = forge.reshape %[[F]]#1 {shape = array<i64: 2, 3, 8>}
// CHECK: %[[X:.*]] = forge.reshape %[[PRE]] {shape = array<i64: 6, 8>}
// CHECK: %[[B:.*]]:2 = forge.fusion "gemm"(%arg3, %arg4, %[[X]]) : (tensor<6x5xf32>, tensor<5x8xf32>, tensor<6x8xf32>) -> (tensor<6x8xf32>, tensor<1x8xf32>) {
// CHECK:   %[[Q:.*]] = forge.gemm %{{.*}}, %{{.*}} {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = false, transB = false}
// CHECK:   %[[D:.*]] = forge.gelu_grad %[[Q]], %{{.*}} {approximate = "tanh"}
// CHECK:   %[[S:.*]] = forge.reduce_sum %[[D]] {axes = array<i64: 0>, keepdims = true}
// CHECK:   forge.yield %[[D]], %[[S]]
// CHECK-NOT: forge.gelu_grad
// CHECK: return
// OFF-LABEL: func @gelu
// OFF-NOT: "gemm"
// NOAUX-LABEL: func @gelu
// NOAUX-NOT: "gemm"
// NOAUX: return
// GELU-LABEL: func @gelu
// GELU: forge.fusion "gemm"
// GELU: forge.gelu
// GELU: forge.fusion "gemm"
// GELU: forge.gelu_grad
// GELU: return
func.func @gelu(%x: tensor<2x3x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>, %dy: tensor<6x5xf32>, %w2: tensor<5x8xf32>) -> (tensor<2x3x8xf32>, tensor<2x3x8xf32>, tensor<1x1x8xf32>) {
  %p = forge.matmul %x, %w : (tensor<2x3x4xf32>, tensor<4x8xf32>) -> tensor<2x3x8xf32>
  %h = forge.add %b, %p : (tensor<8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %g = forge.gelu %h {approximate = "tanh"} : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %q = forge.gemm %dy, %w2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<6x5xf32>, tensor<5x8xf32>) -> tensor<6x8xf32>
  %qv = forge.reshape %q {shape = array<i64: 2, 3, 8>} : (tensor<6x8xf32>) -> tensor<2x3x8xf32>
  %d = forge.gelu_grad %qv, %h {approximate = "tanh"} : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %db = forge.reduce_sum %d {axes = array<i64: 0, 1>, keepdims = true} : (tensor<2x3x8xf32>) -> tensor<1x1x8xf32>
  return %g, %d, %db : tensor<2x3x8xf32>, tensor<2x3x8xf32>, tensor<1x1x8xf32>
}

// -----

// Inference: nothing else reads the GELU's input, so the region yields the
// GELU alone (GELU_BIAS).
// CHECK-LABEL: func @gelu_inference
// CHECK: %[[F:.*]] = forge.fusion "gemm"(%arg0, %arg1, %arg2) : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<6x8xf32> {
// CHECK:   forge.gelu
// CHECK:   forge.yield
// CHECK: return %[[F]]
func.func @gelu_inference(%x: tensor<6x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<6x8xf32> {
  %p = forge.matmul %x, %w : (tensor<6x4xf32>, tensor<4x8xf32>) -> tensor<6x8xf32>
  %h = forge.add %p, %b : (tensor<6x8xf32>, tensor<8xf32>) -> tensor<6x8xf32>
  %g = forge.gelu %h {approximate = "tanh"} : (tensor<6x8xf32>) -> tensor<6x8xf32>
  return %g : tensor<6x8xf32>
}

// -----

// Not: the exact (erf) GELU, which cuBLASLt's epilogue does not compute; a
// gelu_grad whose grad_output's product something else reads too.
// CHECK-LABEL: func @not_gelu
// CHECK-NOT: "gemm"
// CHECK: return
func.func @not_gelu(%x: tensor<6x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>, %dy: tensor<6x5xf32>, %w2: tensor<5x8xf32>) -> (tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>) {
  %p = forge.matmul %x, %w : (tensor<6x4xf32>, tensor<4x8xf32>) -> tensor<6x8xf32>
  %h = forge.add %p, %b : (tensor<6x8xf32>, tensor<8xf32>) -> tensor<6x8xf32>
  %g = forge.gelu %h {approximate = "none"} : (tensor<6x8xf32>) -> tensor<6x8xf32>
  %q = forge.matmul %dy, %w2 : (tensor<6x5xf32>, tensor<5x8xf32>) -> tensor<6x8xf32>
  %d = forge.gelu_grad %q, %h {approximate = "tanh"} : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  return %g, %d, %q : tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>
}

// -----

// A ReLU's gradient after the GEMM of its incoming gradient: the forward region
// also yields the ReLU's bitmask (RELU_AUX_BIAS) and the gradient's GEMM masks
// its product with it (DRELU); the backward reads no f32 output and runs no kernel.
// CHECK-LABEL: func @drelu
// CHECK: %[[F:.*]]:2 = forge.fusion "gemm"(%arg0, %arg1, %arg2) : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> (tensor<4x5xf32>, tensor<4x16xi8>) {
// CHECK:   %[[Y:.*]] = forge.relu
// CHECK:   %[[M:.*]] = forge.relu_bitmask %[[Y]]
// CHECK:   forge.yield %[[Y]], %[[M]]
// CHECK: %[[B:.*]] = forge.fusion "gemm"(%arg3, %arg4, %[[F]]#1) : (tensor<4x3xf32>, tensor<3x5xf32>, tensor<4x16xi8>) -> tensor<4x5xf32> {
// CHECK:   %[[P:.*]] = forge.matmul
// CHECK:   forge.relu_grad_bitmask %[[P]], %{{.*}}
// CHECK-NOT: forge.where
// CHECK: return %[[F]]#0, %[[B]]
// NOAUX-LABEL: func @drelu
// NOAUX-NOT: relu_bitmask
// NOAUX: return
// GELU-LABEL: func @drelu
// GELU-NOT: relu_bitmask
// GELU: return
func.func @drelu(%x: tensor<4x8xf32>, %w: tensor<5x8xf32>, %b: tensor<5xf32>, %g: tensor<4x3xf32>, %w2: tensor<3x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>) {
  %zero = forge.constant dense<0.0> : tensor<f32>
  %p = forge.gemm %x, %w, %b {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<5x8xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
  %q = forge.matmul %g, %w2 : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
  %m = forge.greater %y, %zero : (tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xi1>
  %d = forge.where %m, %q, %zero : (tensor<4x5xi1>, tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xf32>
  return %y, %d : tensor<4x5xf32>, tensor<4x5xf32>
}

// -----

// Not: a mask that is not the ReLU's (y > 1), a product read twice.
// CHECK-LABEL: func @not_drelu
// CHECK-NOT: forge.relu_bitmask
// CHECK: return
func.func @not_drelu(%x: tensor<4x8xf32>, %w: tensor<5x8xf32>, %g: tensor<4x3xf32>, %w2: tensor<3x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>) {
  %zero = forge.constant dense<0.0> : tensor<f32>
  %one = forge.constant dense<1.0> : tensor<f32>
  %p = forge.matmul %x, %w {transB = true} : (tensor<4x8xf32>, tensor<5x8xf32>) -> tensor<4x5xf32>
  %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
  %q = forge.matmul %g, %w2 : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
  %m = forge.greater %y, %one : (tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xi1>
  %d = forge.where %m, %q, %zero : (tensor<4x5xi1>, tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xf32>
  %q2 = forge.matmul %g, %w2 : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
  %m2 = forge.greater %y, %zero : (tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xi1>
  %d2 = forge.where %m2, %q2, %zero : (tensor<4x5xi1>, tensor<4x5xf32>, tensor<f32>) -> tensor<4x5xf32>
  return %y, %d, %d2, %q2 : tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>, tensor<4x5xf32>
}
