// RUN: forge-opt %s --split-input-file --forge-plan-memory | FileCheck %s

// A collective runs on a stream of its own (CUDA) until the first step that
// reads one of its results. %g, read by the all_reduce alone, is reduced in
// place (result 0 takes its bytes, 64); %h is read again after it, so
// result 1 gets bytes of its own (192). Both operands stay live until the
// compute stream waits for the collective (at the first reader of a result,
// the first mul, whose result may then take them): the add between them may
// not take their bytes (it gets 256, a fresh slot, where a plan for
// sequential steps would have reused one).
// CHECK-LABEL: func @collective
// CHECK-SAME: forge.offset = 0 : i64
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: 64>}
// CHECK: forge.abs %arg0 {forge.offsets = array<i64: 128>}
// CHECK: forge.all_reduce {{.*}} {forge.offsets = array<i64: 64, 192>
// CHECK: forge.add %arg0, %arg0 {forge.offsets = array<i64: 256>}
// CHECK: forge.mul
func.func @collective(%x: tensor<16xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<16xf32> {forge.name = "y"}, tensor<16xf32> {forge.name = "z"}) {
  %g = forge.neg %x : (tensor<16xf32>) -> tensor<16xf32>
  %h = forge.abs %x : (tensor<16xf32>) -> tensor<16xf32>
  %r:2 = forge.all_reduce %g, %h {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<16xf32>, tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>)
  %a = forge.add %x, %x : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  %y = forge.mul %r#0, %a : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  %z = forge.mul %r#1, %h : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  return %y, %z : tensor<16xf32>, tensor<16xf32>
}

// -----

// The collective stream is ordered only after %g's producer (op 0): the
// compute ops after it (exp, transpose) may still run when the all_reduce writes
// its result, which has bytes of its own (%g is read again). So the result
// may not take the bytes of %t, which dies before the all_reduce in program
// order (it would, were the collective on the compute stream).
// CHECK-LABEL: func @result_after_its_wait
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: [[G:[0-9]+]]>}
// CHECK: forge.exp %arg0 {forge.offsets = array<i64: [[T:[0-9]+]]>}
// CHECK: forge.all_reduce
// CHECK-NOT: array<i64: [[T]]>
// CHECK-SAME: forge.offsets = array<i64: {{[0-9]+}}>
func.func @result_after_its_wait(%x: tensor<4x4xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<4x4xf32> {forge.name = "y"}) {
  %g = forge.neg %x : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %t = forge.exp %x : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %u = forge.transpose %t {perm = array<i64: 1, 0>} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %r = forge.all_reduce %g {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %v = forge.mul %r, %g : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %y = forge.add %u, %v : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

// An op beside the compute stream releases its operands at the op before the
// compute op that waits for it, when it is the only side stream (%a, read by
// the exp on compute.1 and waited for by the add); with a second side stream
// an op there (the sqrt on compute.2, ordered only after the abs) could write
// them while the exp still reads them, so they live to the wait: the sqrt's
// result never takes %a's bytes.
// CHECK-LABEL: func @two_side_streams
// CHECK: forge.neg %arg0 {{.*}}forge.offsets = array<i64: [[A:[0-9]+]]>
// CHECK-NOT: forge.offsets = array<i64: [[A]]>, forge.stream = 2
// CHECK: return
func.func @two_side_streams(%x: tensor<16xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<16xf32> {forge.name = "y"}, tensor<16xf32> {forge.name = "z"})
    attributes {forge.streams = ["compute", "compute.1", "compute.2"]} {
  %a = forge.neg %x : (tensor<16xf32>) -> tensor<16xf32>
  %s = forge.exp %a {forge.stream = 1 : i64} : (tensor<16xf32>) -> tensor<16xf32>
  %c = forge.abs %x : (tensor<16xf32>) -> tensor<16xf32>
  %d = forge.add %s, %c : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  %t = forge.sqrt %c {forge.stream = 2 : i64} : (tensor<16xf32>) -> tensor<16xf32>
  %u = forge.mul %t, %t {forge.stream = 2 : i64} : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  return %d, %u : tensor<16xf32>, tensor<16xf32>
}
