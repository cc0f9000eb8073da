// RUN: forge-opt %s --split-input-file --forge-assign-precision=precision=bf16 | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-assign-precision=precision=fp32 | FileCheck %s --check-prefix=FP32
// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=bf16 low-norm-gradients=true" | FileCheck %s --check-prefix=LOWDY

// A linear layer with ReLU (gemm region), logits (a GEMM the softmax reads),
// the probabilities read by a GEMM, and the optimizer's update of w.
//  * w gets a bf16 state copy (forge.copy_of) that the optimizer's member
//    writes as one more output, returned with forge.updates = "w.bf16";
//  * the data input x, which only GEMMs read, becomes a bf16 input (the data
//    loader converts f32 arrays);
//  * the ReLU's product is stored bf16 (cuBLASLt writes D low);
//  * the logits stay f32 (operand 0 of softmax, a KeepFP32 op) and the
//    softmax's row region stores its result bf16 (a cast before its yield);
//  * the gradient the optimizer reads stays f32.
// CHECK-LABEL: func @train_step
// CHECK-SAME: %arg0: tensor<4x8xbf16> {forge.kind = "input", forge.name = "x"}
// CHECK-SAME: %[[W2:arg[0-9]+]]: tensor<3x16xf32> {{{.*}}forge.name = "w2"
// CHECK-SAME: %[[WC:arg[0-9]+]]: tensor<16x8xbf16> {forge.copy_of = "w", forge.kind = "state", forge.name = "w.bf16", forge.role = "low_precision_copy"}
// CHECK-SAME: %[[W2C:arg[0-9]+]]: tensor<3x16xbf16> {forge.copy_of = "w2", forge.kind = "state", forge.name = "w2.bf16", forge.role = "low_precision_copy"}
// CHECK-SAME: -> (tensor<16x8xf32> {forge.updates = "w"}, tensor<16x8xbf16> {forge.updates = "w.bf16"})
// CHECK: %[[H:.+]] = forge.fusion "gemm"(%arg0, %[[WC]]) : (tensor<4x8xbf16>, tensor<16x8xbf16>) -> tensor<4x16xbf16>
// CHECK: forge.gemm {{.*}} -> tensor<4x16xbf16>
// CHECK-NEXT: forge.relu {{.*}} -> tensor<4x16xbf16>
// CHECK: %[[Y:.+]] = forge.gemm %[[H]], %[[W2C]] {{.*}} : (tensor<4x16xbf16>, tensor<3x16xbf16>) -> tensor<4x3xf32>
// CHECK: %[[P:.+]] = forge.fusion "row"(%[[Y]]) : (tensor<4x3xf32>) -> tensor<4x3xbf16>
// CHECK: forge.softmax
// CHECK-NEXT: forge.cast %{{.*}} {to = bf16}
// A sum reads a bf16 product (the matmul writes it low) into an f32 result.
// CHECK: %[[G:.+]] = forge.matmul %[[P]], %[[P]] {transA = true} : (tensor<4x3xbf16>, tensor<4x3xbf16>) -> tensor<3x3xbf16>
// CHECK: forge.reduce_sum %[[G]] {{.*}} : (tensor<3x3xbf16>) -> tensor<f32>
// CHECK: %[[U:.+]]:2 = forge.fusion "horizontal"
// CHECK: forge.fusion "loop"{{.*}} -> (tensor<16x8xf32>, tensor<16x8xbf16>)
// CHECK: forge.cast %{{.*}} {to = bf16}
// CHECK-NEXT: forge.yield %{{.*}}, %{{.*}} : tensor<16x8xf32>, tensor<16x8xbf16>
// CHECK: return %[[U]]#0, %[[U]]#1
// FP32-LABEL: func @train_step
// FP32-NOT: bf16
func.func @train_step(%x: tensor<4x8xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<16x8xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<16x8xf32>},
                      %w2: tensor<3x16xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.25> : tensor<3x16xf32>},
                      %g: tensor<16x8xf32> {forge.kind = "input", forge.name = "g"})
    -> (tensor<16x8xf32> {forge.updates = "w"}) {
  %h = forge.fusion "gemm"(%x, %w) : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32> {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<16x8xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
    %1 = forge.relu %0 : (tensor<4x16xf32>) -> tensor<4x16xf32>
    forge.yield %1 : tensor<4x16xf32>
  }
  %y = forge.gemm %h, %w2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<4x16xf32>, tensor<3x16xf32>) -> tensor<4x3xf32>
  %p = forge.fusion "row"(%y) : (tensor<4x3xf32>) -> tensor<4x3xf32> {
  ^bb0(%a: tensor<4x3xf32>):
    %0 = forge.softmax %a {axis = 1 : i64} : (tensor<4x3xf32>) -> tensor<4x3xf32>
    forge.yield %0 : tensor<4x3xf32>
  }
  %gg = forge.matmul %p, %p {transA = true} : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<3x3xf32>
  %s = forge.reduce_sum %gg {axes = array<i64: 0, 1>, keepdims = false} : (tensor<3x3xf32>) -> tensor<f32>
  %u = forge.fusion "horizontal"(%w, %g, %s) : (tensor<16x8xf32>, tensor<16x8xf32>, tensor<f32>) -> tensor<16x8xf32> {
  ^bb0(%a: tensor<16x8xf32>, %b: tensor<16x8xf32>, %c: tensor<f32>):
    %0 = forge.fusion "loop"(%a, %b, %c) : (tensor<16x8xf32>, tensor<16x8xf32>, tensor<f32>) -> tensor<16x8xf32> {
    ^bb1(%i: tensor<16x8xf32>, %j: tensor<16x8xf32>, %k: tensor<f32>):
      %1 = forge.mul %j, %k : (tensor<16x8xf32>, tensor<f32>) -> tensor<16x8xf32>
      %2 = forge.sub %i, %1 : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
      forge.yield %2 : tensor<16x8xf32>
    }
    forge.yield %0 : tensor<16x8xf32>
  }
  return %u : tensor<16x8xf32>
}

// -----

// Kept f32: a GEMM's output over a full C (the residual stream) and what a
// routine returns; a broadcast input of a loop region is not read through a
// cast (the region's verifier wants the iteration shape): its producer keeps
// f32. A data input that something else than a GEMM reads stays f32, and its
// GEMM reads a loop region's cast of it.
// CHECK-LABEL: func @train_step
// CHECK-SAME: %arg0: tensor<4x4xf32>
// CHECK: %[[XC:.+]] = forge.fusion "loop"(%arg0) : (tensor<4x4xf32>) -> tensor<4x4xbf16>
// CHECK-NEXT: ^bb0
// CHECK-NEXT: forge.cast %{{.*}} {to = bf16}
// CHECK: %[[R:.+]] = forge.gemm %[[XC]], %[[XC]], %arg1 {{.*}} -> tensor<4x4xf32>
// CHECK: %[[V:.+]] = forge.fusion "loop"{{.*}} -> tensor<4xf32>
// CHECK: return %[[R]]
func.func @train_step(%x: tensor<4x4xf32> {forge.kind = "input", forge.name = "x"},
                      %c: tensor<4x4xf32> {forge.kind = "input", forge.name = "c"},
                      %v: tensor<4xf32> {forge.kind = "input", forge.name = "v"})
    -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) {
  %r = forge.gemm %x, %x, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = forge.fusion "loop"(%v) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %0 = forge.exp %a : (tensor<4xf32>) -> tensor<4xf32>
    forge.yield %0 : tensor<4xf32>
  }
  %o = forge.fusion "loop"(%r, %b) : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>, %d: tensor<4xf32>):
    %0 = forge.add %a, %d : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
    forge.yield %0 : tensor<4x4xf32>
  }
  %e = forge.fusion "loop"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    %0 = forge.exp %a : (tensor<4x4xf32>) -> tensor<4x4xf32>
    forge.yield %0 : tensor<4x4xf32>
  }
  return %r, %o, %e : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Attention (cuDNN's flash attention reads and writes bf16 only): q, k, v made
// by a loop region are stored bf16 there; o and the gradients are bf16 whoever
// reads them (the f32 readers' regions cast after their block arguments); lse
// stays f32. @eval is assigned as the step is: the input's cast before (an argument keeps
// its type), the output low like the step's.
// CHECK-LABEL: func @train_step
// CHECK: %[[QKV:.+]]:3 = forge.fusion "loop"{{.*}} -> (tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>)
// CHECK: %[[O:.+]], %[[L:.+]] = forge.attention %[[QKV]]#0, %[[QKV]]#1, %[[QKV]]#2 {{.*}} -> (tensor<1x2x8x16xbf16>, tensor<1x2x8xf32>)
// CHECK: %[[Y:.+]]:2 = forge.fusion "loop"(%[[O]]) : (tensor<1x2x8x16xbf16>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8x16xbf16>)
// CHECK-NEXT: ^bb0(%{{.*}}: tensor<1x2x8x16xbf16>):
// CHECK-NEXT: forge.cast %{{.*}} {to = f32}
// CHECK: forge.attention_grad %[[QKV]]#0, %[[QKV]]#1, %[[QKV]]#2, %[[O]], %[[L]], %[[Y]]#1 {{.*}} : (tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8xf32>, tensor<1x2x8x16xbf16>) -> (tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>)
// CHECK-LABEL: func @eval
// CHECK-SAME: -> tensor<1x2x8x16xbf16> attributes {forge.precision = "bf16"}
// CHECK: %[[C:.+]] = forge.fusion "loop"(%arg0) : (tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xbf16>
// CHECK: %[[EO:.+]], %{{.+}} = forge.attention %[[C]], %[[C]], %[[C]] {{.*}} -> (tensor<1x2x8x16xbf16>, tensor<1x2x8xf32>)
// CHECK-NEXT: return %[[EO]]
// FP32-LABEL: func @train_step
// FP32-NOT: bf16
func.func @train_step(%x: tensor<1x2x8x16xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<1x2x8x16xf32> {forge.output = "y"}, tensor<1x2x8x16xf32> {forge.output = "dq"}) {
  %qkv:3 = forge.fusion "loop"(%x) : (tensor<1x2x8x16xf32>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) {
  ^bb0(%a: tensor<1x2x8x16xf32>):
    %n = forge.neg %a : (tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
    %e = forge.exp %a : (tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
    forge.yield %a, %n, %e : tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>
  }
  %o, %lse = forge.attention %qkv#0, %qkv#1, %qkv#2 {causal = true, scale = 2.500000e-01 : f64} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8xf32>)
  %y = forge.fusion "loop"(%o) : (tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32> {
  ^bb0(%a: tensor<1x2x8x16xf32>):
    %t = forge.tanh %a : (tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
    forge.yield %t : tensor<1x2x8x16xf32>
  }
  %dq, %dk, %dv = forge.attention_grad %qkv#0, %qkv#1, %qkv#2, %o, %lse, %y {causal = true, scale = 2.500000e-01 : f64} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8xf32>, tensor<1x2x8x16xf32>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>)
  return %y, %dq : tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>
}
func.func @eval(%x: tensor<1x2x8x16xf32> {forge.kind = "input", forge.name = "x"}) -> tensor<1x2x8x16xf32> {
  %o, %lse = forge.attention %x, %x, %x {causal = false, scale = 2.500000e-01 : f64} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8xf32>)
  return %o : tensor<1x2x8x16xf32>
}

// -----

// attention_grad's dk is bf16 whoever reads it; a loose sub reading it beside
// an f32 mean (the gradient rule's centring over the keys) becomes a loop
// region that reads dk through a cast: operand types never mix in an op.
// CHECK-LABEL: func @train_step
// CHECK: %{{.*}}, %[[DK:.*]], %{{.*}} = forge.attention_grad
// CHECK: %[[M:.*]] = forge.reduce_mean %[[DK]] {{.*}} : (tensor<1x2x8x16xbf16>) -> tensor<1x2x1x16xf32>
// CHECK: forge.fusion "loop"(%[[DK]], %[[M]]) : (tensor<1x2x8x16xbf16>, tensor<1x2x1x16xf32>) -> tensor<1x2x8x16xf32>
// CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<1x2x8x16xbf16>, %[[B:.*]]: tensor<1x2x1x16xf32>):
// CHECK-NEXT: %[[C:.*]] = forge.cast %[[A]] {to = f32}
// CHECK-NEXT: forge.sub %[[C]], %[[B]]
// FP32-LABEL: func @train_step
// FP32: forge.sub %grad_k
func.func @train_step(%q: tensor<1x2x8x16xbf16> {forge.kind = "input", forge.name = "q"},
                      %lse: tensor<1x2x8xf32> {forge.kind = "input", forge.name = "lse"})
    -> (tensor<1x2x8x16xf32> {forge.output = "dk"}) {
  %dq, %dk, %dv = forge.attention_grad %q, %q, %q, %q, %lse, %q {causal = true, scale = 2.500000e-01 : f64} : (tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1x2x8xf32>, tensor<1x2x8x16xbf16>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>)
  %m = forge.reduce_mean %dk {axes = array<i64: 2>, keepdims = true} : (tensor<1x2x8x16xf32>) -> tensor<1x2x1x16xf32>
  %c = forge.sub %dk, %m : (tensor<1x2x8x16xf32>, tensor<1x2x1x16xf32>) -> tensor<1x2x8x16xf32>
  return %c : tensor<1x2x8x16xf32>
}

// -----

// @eval: the heads a split of the qkv projection makes (seen through their reshapes, each
// read by the attention alone) are stored bf16 by the split itself, as it copies: no cast
// kernel.
// CHECK-LABEL: func @eval
// CHECK: %[[S:.+]]:3 = forge.split %arg0 {{.*}} -> (tensor<1x8x32xbf16>, tensor<1x8x32xbf16>, tensor<1x8x32xbf16>)
// CHECK: %[[Q:.+]] = forge.reshape %[[S]]#0 {{.*}} -> tensor<1x8x2x16xbf16>
// CHECK-NOT: forge.fusion "loop"
// CHECK: forge.attention %[[Q]],
// CHECK-NOT: forge.fusion "loop"
// CHECK: return
func.func @train_step(%x: tensor<4xf32> {forge.kind = "input", forge.name = "x"}) -> (tensor<4xf32> {forge.output = "y"}) {
  %y = forge.neg %x : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
func.func @eval(%x: tensor<1x8x96xf32> {forge.kind = "input", forge.name = "x"}) -> tensor<1x8x2x16xf32> {
  %q, %k, %v = forge.split %x {axis = 2 : i64, sizes = array<i64: 32, 32, 32>} : (tensor<1x8x96xf32>) -> (tensor<1x8x32xf32>, tensor<1x8x32xf32>, tensor<1x8x32xf32>)
  %q4 = forge.reshape %q {shape = array<i64: 1, 8, 2, 16>} : (tensor<1x8x32xf32>) -> tensor<1x8x2x16xf32>
  %k4 = forge.reshape %k {shape = array<i64: 1, 8, 2, 16>} : (tensor<1x8x32xf32>) -> tensor<1x8x2x16xf32>
  %v4 = forge.reshape %v {shape = array<i64: 1, 8, 2, 16>} : (tensor<1x8x32xf32>) -> tensor<1x8x2x16xf32>
  %o, %lse = forge.attention %q4, %k4, %v4 {causal = true, layout = "bshd", scale = 2.500000e-01 : f64} : (tensor<1x8x2x16xf32>, tensor<1x8x2x16xf32>, tensor<1x8x2x16xf32>) -> (tensor<1x8x2x16xf32>, tensor<1x2x8xf32>)
  return %o : tensor<1x8x2x16xf32>
}

// -----

// @eval's GEMMs read the low copies the step's optimizer keeps current (w.bf16, an
// argument of @eval that it never writes); a parameter the step keeps no copy of (v: the
// step does not read it through a GEMM) is cast in @eval itself.
// CHECK-LABEL: func @train_step
// CHECK-SAME: forge.copy_of = "w"{{.*}}forge.name = "w.bf16"
// CHECK-LABEL: func @eval
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<4x8xbf16> {forge.kind = "input", forge.name = "x"}
// CHECK-SAME: %[[V:[a-z0-9]+]]: tensor<16x8xf32> {forge.kind = "parameter", forge.name = "v"}
// CHECK-SAME: %[[WL:[a-z0-9]+]]: tensor<16x8xbf16> {forge.copy_of = "w", forge.kind = "state", forge.name = "w.bf16", forge.role = "low_precision_copy"}
// CHECK-NOT: forge.updates
// CHECK: %[[VL:.+]] = forge.fusion "loop"(%[[V]]) : (tensor<16x8xf32>) -> tensor<16x8xbf16>
// CHECK: forge.gemm %[[X]], %[[WL]]
// CHECK: forge.gemm %[[X]], %[[VL]]
func.func @train_step(%x: tensor<4x8xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<16x8xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<16x8xf32>},
                      %v: tensor<16x8xf32> {forge.kind = "parameter", forge.name = "v", forge.initial_value = dense<0.5> : tensor<16x8xf32>})
    -> (tensor<4x16xf32> {forge.name = "y"}, tensor<16x8xf32> {forge.updates = "w"}, tensor<16x8xf32> {forge.updates = "v"}) {
  %y = forge.gemm %x, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %w1 = forge.fusion "loop"(%w) : (tensor<16x8xf32>) -> tensor<16x8xf32> {
  ^bb0(%a: tensor<16x8xf32>):
    %n = forge.neg %a : (tensor<16x8xf32>) -> tensor<16x8xf32>
    forge.yield %n : tensor<16x8xf32>
  }
  %v1 = forge.fusion "loop"(%v) : (tensor<16x8xf32>) -> tensor<16x8xf32> {
  ^bb0(%a: tensor<16x8xf32>):
    %n = forge.neg %a : (tensor<16x8xf32>) -> tensor<16x8xf32>
    forge.yield %n : tensor<16x8xf32>
  }
  return %y, %w1, %v1 : tensor<4x16xf32>, tensor<16x8xf32>, tensor<16x8xf32>
}
func.func @eval(%x: tensor<4x8xf32> {forge.kind = "input", forge.name = "x"},
                %w: tensor<16x8xf32> {forge.kind = "parameter", forge.name = "w"},
                %v: tensor<16x8xf32> {forge.kind = "parameter", forge.name = "v"})
    -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %y = forge.gemm %x, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %z = forge.gemm %x, %v {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  return %y, %z : tensor<4x16xf32>, tensor<4x16xf32>
}

// -----

// A GELU_AUX region (--gemm-aux-epilogues) yields its product beside the
// GELU: both results are stored low (cuBLASLt writes the aux in D's type),
// each result typed as its yielded value, and the bias row read by the
// epilogue becomes its low copy. The DGELU region here writes f32 (what the
// routine returns): it reads the aux converted to its product's type.
// CHECK-LABEL: func @train_step
// CHECK: %[[H:.+]]:2 = forge.fusion "gemm"(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<4x8xbf16>, tensor<8x16xbf16>, tensor<16xbf16>) -> (tensor<4x16xbf16>, tensor<4x16xbf16>)
// CHECK: forge.gemm {{.*}} -> tensor<4x16xbf16>
// CHECK-NEXT: forge.gelu {{.*}} -> tensor<4x16xbf16>
// CHECK-NEXT: forge.yield %{{.*}}, %{{.*}} : tensor<4x16xbf16>, tensor<4x16xbf16>
// CHECK: %[[A:.+]] = forge.cast %[[H]]#1 {to = f32} : (tensor<4x16xbf16>) -> tensor<4x16xf32>
// CHECK: forge.fusion "gemm"(%{{.*}}, %{{.*}}, %[[A]]) : ({{.*}}, tensor<4x16xf32>) -> tensor<4x16xf32>
// CHECK: forge.gelu_grad {{.*}} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
func.func @train_step(%x: tensor<4x8xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<8x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<8x16xf32>},
                      %bias: tensor<16xf32> {forge.kind = "parameter", forge.name = "b", forge.initial_value = dense<0.5> : tensor<16xf32>},
                      %w2: tensor<3x16xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.25> : tensor<3x16xf32>})
    -> tensor<4x16xf32> {
  %h:2 = forge.fusion "gemm"(%x, %w, %bias) : (tensor<4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %c: tensor<16xf32>):
    %0 = forge.gemm %a, %b, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %1 = forge.gelu %0 {approximate = "tanh"} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    forge.yield %1, %0 : tensor<4x16xf32>, tensor<4x16xf32>
  }
  %y = forge.gemm %h#0, %w2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<4x16xf32>, tensor<3x16xf32>) -> tensor<4x3xf32>
  %d = forge.fusion "gemm"(%y, %w2, %h#1) : (tensor<4x3xf32>, tensor<3x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32> {
  ^bb0(%a: tensor<4x3xf32>, %b: tensor<3x16xf32>, %c: tensor<4x16xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<4x3xf32>, tensor<3x16xf32>) -> tensor<4x16xf32>
    %1 = forge.gelu_grad %0, %c {approximate = "tanh"} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    forge.yield %1 : tensor<4x16xf32>
  }
  return %d : tensor<4x16xf32>
}

// -----

// The optimizer's update as a plain loop region (a tied weight: its two gradient GEMMs'
// products summed in the update) with no gradient norm reading them: the region makes w's
// update (forge.updates = "w"), so what it reads stays f32 although a loop region could
// read a low input: both GEMMs write their gradient in f32.
// CHECK-LABEL: forge.name = "d"
// CHECK: %[[G1:.+]] = forge.gemm {{.*}} -> tensor<8x16xf32>
// CHECK: %[[G2:.+]] = forge.gemm {{.*}} -> tensor<8x16xf32>
// CHECK: forge.fusion "loop"(%{{.*}}, %[[G1]], %[[G2]]) : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>)
// A loop region that updates nothing reads a GEMM's product low.
// CHECK: %[[G3:.+]] = forge.gemm {{.*}} -> tensor<8x16xbf16>
// CHECK: forge.fusion "loop"(%[[G3]]) : (tensor<8x16xbf16>)
func.func @train_step(%x: tensor<4x8xf32> {forge.kind = "input", forge.name = "x"},
                      %d: tensor<4x16xf32> {forge.kind = "input", forge.name = "d"},
                      %w: tensor<8x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<8x16xf32>})
    -> (tensor<8x16xf32> {forge.updates = "w"}, tensor<8x16xf32> {forge.name = "other"}) {
  %g1 = forge.gemm %x, %d {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<4x8xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %g2 = forge.gemm %x, %d {alpha = 2.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<4x8xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %u = forge.fusion "loop"(%w, %g1, %g2) : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32> {
  ^bb0(%a: tensor<8x16xf32>, %b: tensor<8x16xf32>, %c: tensor<8x16xf32>):
    %0 = forge.add %b, %c : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    %1 = forge.sub %a, %0 : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    forge.yield %1 : tensor<8x16xf32>
  }
  %g3 = forge.gemm %x, %d {alpha = 3.0 : f64, beta = 0.0 : f64, transA = true, transB = false} : (tensor<4x8xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %v = forge.fusion "loop"(%g3) : (tensor<8x16xf32>) -> tensor<8x16xf32> {
  ^bb0(%a: tensor<8x16xf32>):
    %0 = forge.neg %a : (tensor<8x16xf32>) -> tensor<8x16xf32>
    forge.yield %0 : tensor<8x16xf32>
  }
  return %u, %v : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// A layer norm's gradient reads its grad_output, a GEMM's product (the next
// linear layer's dX), in f32 by default: the matmul writes it f32. With
// low-norm-gradients=true it reads it low and the matmul writes it bf16; its
// x (the residual stream, operand 0) stays f32 either way, and so do its
// results.
// CHECK-LABEL: func @train_step
// CHECK: %[[D:.+]] = forge.matmul %arg1, %arg2 : (tensor<4x16xbf16>, tensor<16x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: forge.layer_norm_grad %arg0, %arg3, %[[D]] {{.*}} : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>)
// LOWDY: %[[D:.+]] = forge.matmul %arg1, %arg2 : (tensor<4x16xbf16>, tensor<16x8xbf16>) -> tensor<4x8xbf16>
// LOWDY-NEXT: forge.layer_norm_grad %arg0, %arg3, %[[D]] {{.*}} : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xbf16>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
func.func @train_step(%x: tensor<4x8xf32> {forge.kind = "input", forge.name = "x"},
                      %dy: tensor<4x16xf32> {forge.kind = "input", forge.name = "dy"},
                      %w: tensor<16x8xf32> {forge.kind = "input", forge.name = "w"},
                      %s: tensor<8xf32> {forge.kind = "input", forge.name = "s"})
    -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %d = forge.matmul %dy, %w : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  %g:3 = forge.layer_norm_grad %x, %s, %d {axis = 1 : i64, bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  return %g#0, %g#1, %g#2 : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
}
