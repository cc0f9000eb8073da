// RUN: forge-opt %s --split-input-file --forge-fold-contiguous-views | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-fold-contiguous-views --forge-plan-memory | FileCheck %s --check-prefix=PLAN

// The loss head in chunks (forge-chunk-cross-entropy): each chunk's rows are
// a contiguous run of the hidden states (a slice of leading rows: a view at
// row 4 x 16 f32 = 256 bytes), its input gradients a contiguous run of their
// concat along axis 0 (the makers write their pieces there); the padded
// weight gradient's leading rows are a view at offset 0.
// CHECK-LABEL: func @chunks
// CHECK: forge.slice %{{.*}}forge.placement = "view"
// CHECK: forge.slice %{{.*}}forge.placement = "view"
// CHECK: forge.concat %{{.*}}forge.placement = "view"
// CHECK: forge.slice %{{.*}}forge.placement = "view"
// PLAN-LABEL: func @chunks
// PLAN: %[[HV:.*]] = forge.neg {{.*}}forge.offsets = array<i64: [[#H:]]>
// PLAN-NEXT: forge.slice %[[HV]] {{.*}}forge.offsets = array<i64: [[#H]]>, forge.placement = "view"
// PLAN-NEXT: forge.slice %[[HV]] {{.*}}forge.offsets = array<i64: [[#H+256]]>, forge.placement = "view"
// PLAN-NEXT: forge.exp {{.*}}forge.offsets = array<i64: [[#C:]]>
// PLAN-NEXT: forge.tanh {{.*}}forge.offsets = array<i64: [[#C+256]]>
// PLAN-NEXT: forge.concat {{.*}}forge.offsets = array<i64: [[#C]]>, forge.placement = "view"
// PLAN: %[[GV:.*]] = forge.sqrt {{.*}}forge.offsets = array<i64: [[#G:]]>
// PLAN-NEXT: forge.slice %[[GV]] {{.*}}forge.offsets = array<i64: [[#G]]>, forge.placement = "view"
func.func @chunks(%x: tensor<8x16xf32> {forge.kind = "input", forge.name = "x"}, %w: tensor<12x16xf32> {forge.kind = "input", forge.name = "w"}) -> (tensor<8x16xf32> {forge.name = "dx"}, tensor<10x16xf32> {forge.name = "dw"}) {
  %h = forge.neg %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %a = forge.slice %h {starts = array<i64: 0, 0>, ends = array<i64: 4, 16>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %b = forge.slice %h {starts = array<i64: 4, 0>, ends = array<i64: 8, 16>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %da = forge.exp %a : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %db = forge.tanh %b : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %cat = forge.concat %da, %db {axis = 0 : i64} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %dx = forge.add %cat, %x : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %g = forge.sqrt %w : (tensor<12x16xf32>) -> tensor<12x16xf32>
  %gs = forge.slice %g {starts = array<i64: 0, 0>, ends = array<i64: 10, 16>, steps = array<i64: 1, 1>} : (tensor<12x16xf32>) -> tensor<10x16xf32>
  %dw = forge.neg %gs : (tensor<10x16xf32>) -> tensor<10x16xf32>
  return %dx, %dw : tensor<8x16xf32>, tensor<10x16xf32>
}

// -----

// Not: a slice of columns (rows apart), a strided slice, a run not 64-byte
// aligned (rows of 8 f32 from row 1: 32 bytes in), a slice of a routine's
// argument (outside the arena's plan), a returned slice (a buffer of its own),
// a slice that converts (bf16 stored as f32: forge-assign-precision's mixed
// storage), a slice of rows cut short after its first sliced dim (rows of 8
// of 16: the run has gaps).
// CHECK-LABEL: func @slice_negatives
// CHECK-NOT: "view"
// CHECK: return
func.func @slice_negatives(%x: tensor<8x16xf32>, %y: tensor<4x8xf32>) -> (tensor<8x8xf32>, tensor<4x16xf32>, tensor<3x8xf32>, tensor<4x16xf32>, tensor<2x16xf32>, tensor<4x16xf32>, tensor<2x8xf32>) {
  %h = forge.neg %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %cols = forge.slice %h {starts = array<i64: 0, 0>, ends = array<i64: 8, 8>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %step = forge.slice %h {starts = array<i64: 0, 0>, ends = array<i64: 8, 16>, steps = array<i64: 2, 1>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %n = forge.neg %y : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %odd = forge.slice %n {starts = array<i64: 1, 0>, ends = array<i64: 4, 8>, steps = array<i64: 1, 1>} : (tensor<4x8xf32>) -> tensor<3x8xf32>
  %arg = forge.slice %x {starts = array<i64: 0, 0>, ends = array<i64: 4, 16>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %ret = forge.slice %h {starts = array<i64: 2, 0>, ends = array<i64: 4, 16>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<2x16xf32>
  %c1 = forge.exp %cols : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %c2 = forge.exp %step : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %c3 = forge.exp %odd : (tensor<3x8xf32>) -> tensor<3x8xf32>
  %c4 = forge.exp %arg : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %lo = forge.cast %h {to = bf16} : (tensor<8x16xf32>) -> tensor<8x16xbf16>
  %wide = forge.slice %lo {starts = array<i64: 0, 0>, ends = array<i64: 4, 16>, steps = array<i64: 1, 1>} : (tensor<8x16xbf16>) -> tensor<4x16xf32>
  %c5 = forge.exp %wide : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %corner = forge.slice %h {starts = array<i64: 0, 0>, ends = array<i64: 2, 8>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<2x8xf32>
  %c6 = forge.exp %corner : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return %c1, %c2, %c3, %c4, %ret, %c5, %c6 : tensor<8x8xf32>, tensor<4x16xf32>, tensor<3x8xf32>, tensor<4x16xf32>, tensor<2x16xf32>, tensor<4x16xf32>, tensor<2x8xf32>
}

// -----

// Not: a concat along an axis with a leading dim > 1 (pieces interleave), one
// whose piece has another reader, one whose piece is a reshape (another
// tensor's bytes), a returned concat.
// CHECK-LABEL: func @concat_negatives
// CHECK-NOT: "view"
// CHECK: return
func.func @concat_negatives(%x: tensor<8x16xf32>) -> (tensor<8x32xf32>, tensor<16x16xf32>, tensor<8x16xf32>, tensor<9x16xf32>, tensor<16x16xf32>) {
  %e = forge.exp %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %t = forge.tanh %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %wide = forge.concat %e, %t {axis = 1 : i64} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x32xf32>
  %a = forge.sqrt %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = forge.abs %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %shared = forge.concat %a, %b {axis = 0 : i64} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
  %c = forge.ceil %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %s = forge.reduce_sum %x {axes = array<i64: 0>, keepdims = false} : (tensor<8x16xf32>) -> tensor<16xf32>
  %r = forge.reshape %s {shape = array<i64: 1, 16>} : (tensor<16xf32>) -> tensor<1x16xf32>
  %viaReshape = forge.concat %c, %r {axis = 0 : i64} : (tensor<8x16xf32>, tensor<1x16xf32>) -> tensor<9x16xf32>
  %f1 = forge.floor %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %f2 = forge.neg %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %out = forge.concat %f1, %f2 {axis = 0 : i64} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
  %w2 = forge.neg %wide : (tensor<8x32xf32>) -> tensor<8x32xf32>
  %s2 = forge.neg %shared : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %v2 = forge.neg %viaReshape : (tensor<9x16xf32>) -> tensor<9x16xf32>
  return %w2, %s2, %a, %v2, %out : tensor<8x32xf32>, tensor<16x16xf32>, tensor<8x16xf32>, tensor<9x16xf32>, tensor<16x16xf32>
}

// -----

// A pointwise op reading a slice view where its group dies writes its result
// in place where the view lies (256 bytes into the slice's operand), not at
// the operand's start (the view's first rows would then be written before
// they are read).
// PLAN-LABEL: func @in_place_at_offset
// PLAN: forge.neg {{.*}}forge.offsets = array<i64: [[#H:]]>
// PLAN-NEXT: forge.slice {{.*}}forge.offsets = array<i64: [[#H+256]]>, forge.placement = "view"
// PLAN-NEXT: forge.exp {{.*}}forge.offsets = array<i64: [[#H+256]]>
func.func @in_place_at_offset(%x: tensor<8x16xf32> {forge.kind = "input", forge.name = "x"}, %y: tensor<4x16xf32> {forge.kind = "input", forge.name = "y"}) -> (tensor<4x16xf32> {forge.name = "z"}) {
  %h = forge.neg %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = forge.slice %h {starts = array<i64: 4, 0>, ends = array<i64: 8, 16>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %e = forge.exp %b : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %z = forge.add %e, %y : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  return %z : tensor<4x16xf32>
}

// -----

// Not in place when another operand lies in the same bytes at another place:
// h - h[0:1] (the row a view of h's first row) must not write over h while
// its first row is still read.
// PLAN-LABEL: func @view_operand_not_in_place
// PLAN: forge.neg {{.*}}forge.offsets = array<i64: [[#H:]]>
// PLAN-NEXT: forge.slice {{.*}}forge.offsets = array<i64: [[#H]]>, forge.placement = "view"
// PLAN-NEXT: forge.sub {{.*}}forge.offsets = array<i64: [[#S:]]>
// PLAN-NOT: [[#H]]
// PLAN: return
func.func @view_operand_not_in_place(%x: tensor<8x16xf32> {forge.kind = "input", forge.name = "x"}) -> (tensor<8x16xf32> {forge.name = "z"}) {
  %h = forge.neg %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %r = forge.slice %h {starts = array<i64: 0, 0>, ends = array<i64: 1, 16>, steps = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<1x16xf32>
  %y = forge.sub %h, %r : (tensor<8x16xf32>, tensor<1x16xf32>) -> tensor<8x16xf32>
  %z = forge.exp %y : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %z : tensor<8x16xf32>
}
