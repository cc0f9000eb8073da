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
