// RUN: forge-opt %s --split-input-file --forge-fold-attention-views | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-fold-attention-views --forge-plan-memory | FileCheck %s --check-prefix=PLAN

// A fused qkv projection [B, T, 3 * H * D] split along its last axis into
// q, k and v, each reshaped to [B, T, H, D] for cuDNN attention (forward and
// backward): the split becomes a view and the attention ops read the
// projection with a token stride of 3 * H * D = 96 elements.
// CHECK-LABEL: func @qkv
// CHECK: forge.split %arg0 {axis = 2 : i64, forge.placement = "view"
// CHECK: forge.attention {{.*}}forge.row_strides = array<i64: 96, 96, 96>
// CHECK: forge.attention_grad {{.*}}forge.row_strides = array<i64: 96, 96, 96>
// The memory plan puts the pieces in the projection's bytes, 64 bytes apart
// (32 bf16 elements: the offset of each piece's first row).
// PLAN-LABEL: func @qkv
// PLAN-SAME: %arg0: tensor<2x4x96xbf16> {forge.kind = "input", forge.name = "x", forge.offset = 0 : i64}
// PLAN: forge.split %arg0 {axis = 2 : i64, forge.offsets = array<i64: 0, 64, 128>, forge.placement = "view"
// PLAN-NEXT: forge.reshape %0#0 {forge.offsets = array<i64: 0>
// PLAN-NEXT: forge.reshape %0#1 {forge.offsets = array<i64: 64>
// PLAN-NEXT: forge.reshape %0#2 {forge.offsets = array<i64: 128>
func.func @qkv(%x: tensor<2x4x96xbf16> {forge.kind = "input", forge.name = "x"}, %dy: tensor<2x4x2x16xbf16> {forge.kind = "input", forge.name = "dy"}) -> (tensor<2x4x2x16xbf16> {forge.name = "o"}, tensor<2x4x2x16xbf16> {forge.name = "dq"}, tensor<2x4x2x16xbf16> {forge.name = "dk"}, tensor<2x4x2x16xbf16> {forge.name = "dv"}) {
  %p:3 = forge.split %x {axis = 2 : i64, sizes = array<i64: 32, 32, 32>} : (tensor<2x4x96xbf16>) -> (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>)
  %q = forge.reshape %p#0 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %k = forge.reshape %p#1 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %v = forge.reshape %p#2 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %o, %lse = forge.attention %q, %k, %v {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>)
  %dq, %dk, %dv = forge.attention_grad %q, %k, %v, %o, %lse, %dy {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>)
  return %o, %dq, %dk, %dv : tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>
}

// -----

// Not: a piece has another reader (it must be a tensor of its own).
// CHECK-LABEL: func @other_reader
// CHECK-NOT: "view"
// CHECK-NOT: row_strides
// CHECK: return
func.func @other_reader(%x: tensor<2x4x96xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x4x32xbf16>) {
  %p:3 = forge.split %x {axis = 2 : i64, sizes = array<i64: 32, 32, 32>} : (tensor<2x4x96xbf16>) -> (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>)
  %q = forge.reshape %p#0 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %k = forge.reshape %p#1 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %v = forge.reshape %p#2 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %o, %lse = forge.attention %q, %k, %v {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>)
  %n = forge.neg %p#1 : (tensor<2x4x32xbf16>) -> tensor<2x4x32xbf16>
  return %o, %n : tensor<2x4x2x16xbf16>, tensor<2x4x32xbf16>
}

// -----

// Not: an attention that is no cuDNN call (the generated or CPU path reads
// packed operands), nor a split along another axis.
// CHECK-LABEL: func @not_cudnn
// CHECK-NOT: "view"
// CHECK: return
func.func @not_cudnn(%x: tensor<2x4x96xbf16>) -> tensor<2x4x2x16xbf16> {
  %p:3 = forge.split %x {axis = 2 : i64, sizes = array<i64: 32, 32, 32>} : (tensor<2x4x96xbf16>) -> (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>)
  %q = forge.reshape %p#0 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %k = forge.reshape %p#1 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %v = forge.reshape %p#2 {shape = array<i64: 2, 4, 2, 16>} : (tensor<2x4x32xbf16>) -> tensor<2x4x2x16xbf16>
  %o, %lse = forge.attention %q, %k, %v {causal = true, layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>)
  return %o : tensor<2x4x2x16xbf16>
}

// -----

// CHECK-LABEL: func @other_axis
// CHECK-NOT: "view"
// CHECK: return
func.func @other_axis(%x: tensor<2x12x16xbf16>) -> tensor<2x4x2x8xbf16> {
  %p:3 = forge.split %x {axis = 1 : i64, sizes = array<i64: 4, 4, 4>} : (tensor<2x12x16xbf16>) -> (tensor<2x4x16xbf16>, tensor<2x4x16xbf16>, tensor<2x4x16xbf16>)
  %q = forge.reshape %p#0 {shape = array<i64: 2, 4, 2, 8>} : (tensor<2x4x16xbf16>) -> tensor<2x4x2x8xbf16>
  %k = forge.reshape %p#1 {shape = array<i64: 2, 4, 2, 8>} : (tensor<2x4x16xbf16>) -> tensor<2x4x2x8xbf16>
  %v = forge.reshape %p#2 {shape = array<i64: 2, 4, 2, 8>} : (tensor<2x4x16xbf16>) -> tensor<2x4x2x8xbf16>
  %o, %lse = forge.attention %q, %k, %v {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x8xbf16>, tensor<2x4x2x8xbf16>, tensor<2x4x2x8xbf16>) -> (tensor<2x4x2x8xbf16>, tensor<2x2x4xf32>)
  return %o : tensor<2x4x2x8xbf16>
}

// -----

// Not: pieces 32 bytes apart (16 bf16 columns, a tensor-parallel rank's gpt
// fixture): a bundle's tensors start 64-byte aligned.
// CHECK-LABEL: func @unaligned
// CHECK-NOT: "view"
// CHECK: return
func.func @unaligned(%x: tensor<2x4x48xbf16>) -> tensor<2x4x2x8xbf16> {
  %p:3 = forge.split %x {axis = 2 : i64, sizes = array<i64: 16, 16, 16>} : (tensor<2x4x48xbf16>) -> (tensor<2x4x16xbf16>, tensor<2x4x16xbf16>, tensor<2x4x16xbf16>)
  %q = forge.reshape %p#0 {shape = array<i64: 2, 4, 2, 8>} : (tensor<2x4x16xbf16>) -> tensor<2x4x2x8xbf16>
  %k = forge.reshape %p#1 {shape = array<i64: 2, 4, 2, 8>} : (tensor<2x4x16xbf16>) -> tensor<2x4x2x8xbf16>
  %v = forge.reshape %p#2 {shape = array<i64: 2, 4, 2, 8>} : (tensor<2x4x16xbf16>) -> tensor<2x4x2x8xbf16>
  %o, %lse = forge.attention %q, %k, %v {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x8xbf16>, tensor<2x4x2x8xbf16>, tensor<2x4x2x8xbf16>) -> (tensor<2x4x2x8xbf16>, tensor<2x2x4xf32>)
  return %o : tensor<2x4x2x8xbf16>
}

// -----

// The backward's concat of dq, dk and dv: cuDNN writes dq and dv into it, dk's
// centring (a loop region reading cuDNN's packed dk) writes dk, each a token
// stride of 96 elements apart; the concat becomes a view.
// CHECK-LABEL: func @dqkv
// CHECK: forge.attention_grad {{.*}}forge.out_row_strides = array<i64: 96, 0, 96>
// CHECK: forge.fusion "loop"{{.*}}forge.out_row_strides = array<i64: 96>
// CHECK: forge.concat {{.*}}forge.placement = "view"
// The plan puts the makers' results in the concat's bytes at the pieces'
// column offsets (64 bytes apart), the concat where dq starts.
// PLAN-LABEL: func @dqkv
// PLAN: forge.attention_grad {{.*}}forge.offsets = array<i64: [[#C:]], [[#]], [[#V:]]>
// PLAN: forge.fusion "loop"{{.*}}forge.offsets = array<i64: [[#C+64]]>
// PLAN: forge.concat {{.*}}forge.offsets = array<i64: [[#V-128]]>, forge.placement = "view"
// PLAN-NEXT: forge.reshape {{.*}}forge.offsets = array<i64: [[#C]]>
func.func @dqkv(%q: tensor<2x4x2x16xbf16> {forge.kind = "input", forge.name = "q"}, %o: tensor<2x4x2x16xbf16> {forge.kind = "input", forge.name = "o"}, %lse: tensor<2x2x4xf32> {forge.kind = "input", forge.name = "lse"}, %dy: tensor<2x4x2x16xbf16> {forge.kind = "input", forge.name = "dy"}, %w: tensor<96x32xbf16> {forge.kind = "input", forge.name = "w"}) -> (tensor<8x32xf32> {forge.name = "dx"}) {
  %dq, %dk, %dv = forge.attention_grad %q, %q, %q, %o, %lse, %dy {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>)
  %m = forge.reduce_mean %dk {axes = array<i64: 1>, keepdims = true} : (tensor<2x4x2x16xbf16>) -> tensor<2x1x2x16xf32>
  %c = forge.fusion "loop"(%dk, %m) : (tensor<2x4x2x16xbf16>, tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16> {
  ^bb0(%a: tensor<2x4x2x16xbf16>, %b: tensor<2x1x2x16xf32>):
    %0 = forge.cast %a {to = f32} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xf32>
    %1 = forge.sub %0, %b : (tensor<2x4x2x16xf32>, tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16>
    forge.yield %1 : tensor<2x4x2x16xbf16>
  }
  %pq = forge.reshape %dq {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %pk = forge.reshape %c {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %pv = forge.reshape %dv {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %cat = forge.concat %pq, %pk, %pv {axis = 2 : i64} : (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>) -> tensor<2x4x96xbf16>
  %flat = forge.reshape %cat {shape = array<i64: 8, 96>} : (tensor<2x4x96xbf16>) -> tensor<8x96xbf16>
  %dx = forge.gemm %flat, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<8x96xbf16>, tensor<96x32xbf16>) -> tensor<8x32xf32>
  return %dx : tensor<8x32xf32>
}

// -----

// Not: a piece has another reader (dq is also returned), a piece made by a
// plain op (no strided form), a concat that is an output (a buffer of its own).
// CHECK-LABEL: func @concat_negatives
// CHECK-NOT: out_row_strides
// CHECK-NOT: "view"
// CHECK: return
func.func @concat_negatives(%q: tensor<2x4x2x16xbf16>, %o: tensor<2x4x2x16xbf16>, %lse: tensor<2x2x4xf32>, %dy: tensor<2x4x2x16xbf16>, %x: tensor<2x4x2x16xbf16>) -> (tensor<2x4x96xbf16>, tensor<2x4x32xbf16>, tensor<2x4x96xbf16>) {
  %dq, %dk, %dv = forge.attention_grad %q, %q, %q, %o, %lse, %dy {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>)
  %pq = forge.reshape %dq {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %pk = forge.reshape %dk {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %pv = forge.reshape %dv {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %cat = forge.concat %pq, %pk, %pv {axis = 2 : i64} : (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>) -> tensor<2x4x96xbf16>
  %n = forge.neg %x : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xbf16>
  %pn = forge.reshape %n {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %d2, %k2, %v2 = forge.attention_grad %q, %q, %q, %o, %lse, %x {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>)
  %p2 = forge.reshape %d2 {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %pk2 = forge.reshape %k2 {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %cat2 = forge.concat %p2, %pk2, %pn {axis = 2 : i64} : (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>) -> tensor<2x4x96xbf16>
  %d3, %k3, %v3 = forge.attention_grad %q, %q, %q, %o, %lse, %o {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>)
  %p3 = forge.reshape %d3 {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %pk3 = forge.reshape %k3 {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %pv3 = forge.reshape %v3 {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %cat3 = forge.concat %p3, %pk3, %pv3 {axis = 2 : i64} : (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>) -> tensor<2x4x96xbf16>
  return %cat, %pq, %cat3 : tensor<2x4x96xbf16>, tensor<2x4x32xbf16>, tensor<2x4x96xbf16>
}
