// RUN: forge-opt %s --split-input-file --forge-plan-memory -mlir-print-debuginfo -mlir-print-local-scope | FileCheck %s
// RUN: not forge-opt %s --split-input-file --forge-plan-memory --forge-plan-memory 2>&1 | FileCheck %s --check-prefix=TWICE
// TWICE: error: the routine already has a memory plan
// RUN: forge-opt %s --split-input-file --forge-plan-memory=report=true -o /dev/null | FileCheck %s --check-prefix=REPORT

// A pointwise op reading the old value writes the new one in place (-1: not in
// the arena); the input and the output get arena offsets.
// CHECK-LABEL: func @in_place
// CHECK-SAME: forge.offset = 0 : i64
// CHECK-SAME: attributes {forge.arena_size = 128 : i64}
// CHECK: forge.mul %arg0, %arg1 {forge.offsets = array<i64: 64>}
// CHECK: forge.sub %arg1, %0 {forge.offsets = array<i64: -1>}
// CHECK-NOT: forge.copy
func.func @in_place(%x: tensor<4xf32> {forge.kind = "input", forge.name = "x"}, %w: tensor<4xf32> {forge.kind = "parameter", forge.name = "w"}) -> (tensor<4xf32> {forge.name = "y"}, tensor<4xf32> {forge.updates = "w"}) {
  %y = forge.mul %x, %w : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %w2 = forge.sub %w, %y : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y, %w2 : tensor<4xf32>, tensor<4xf32>
}

// -----

// A later op still reads the old value: the update is copied in at the end.
// CHECK-LABEL: func @read_later
// CHECK: %[[NEW:.*]] = forge.sub %arg1, %arg0 {forge.offsets = array<i64: 64>}
// CHECK: %[[Y:.*]] = forge.mul %arg0, %arg1
// CHECK: %[[C:.*]] = forge.copy %[[NEW]] {forge.offsets = array<i64: -1>, forge.placement = "copy"} : tensor<4xf32> loc("update w")
// CHECK: return %[[Y]], %[[C]]
func.func @read_later(%x: tensor<4xf32> {forge.kind = "input", forge.name = "x"}, %w: tensor<4xf32> {forge.kind = "parameter", forge.name = "w"}) -> (tensor<4xf32> {forge.name = "y"}, tensor<4xf32> {forge.updates = "w"}) {
  %w2 = forge.sub %w, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %y = forge.mul %x, %w : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y, %w2 : tensor<4xf32>, tensor<4xf32>
}

// -----

// A state both reported and updated by the step (a loss scale): the output's
// copy of the old value comes before the update's copy of the new one.
// CHECK-LABEL: func @report_and_update
// CHECK: %[[NEW:.*]] = forge.mul %arg0, %arg0
// CHECK: %[[OLD:.*]] = forge.copy %arg0 {{.*}} loc("output used")
// CHECK: %[[UPD:.*]] = forge.copy %[[NEW]] {{.*}} loc("update s")
// CHECK: return %[[UPD]], %[[OLD]]
func.func @report_and_update(%s: tensor<f32> {forge.kind = "state", forge.name = "s"}) -> (tensor<f32> {forge.updates = "s"}, tensor<f32> {forge.name = "used"}) {
  %n = forge.mul %s, %s : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %n, %s : tensor<f32>, tensor<f32>
}

// -----

// An output that is an input, or a value already returned, gets a copy of its
// own; an unnamed one is named after its position.
// CHECK-LABEL: func @outputs
// CHECK-SAME: -> (tensor<4xf32> {forge.name = "a"}, tensor<4xf32>, tensor<4xf32> {forge.name = "c"}, tensor<4xf32> {forge.name = "output3"})
// CHECK: %[[N:.*]] = forge.neg %arg0
// CHECK: %[[A:.*]] = forge.copy %arg0 {{.*}} loc("output a")
// CHECK: %[[C:.*]] = forge.copy %[[N]] {{.*}} loc("output c")
// CHECK: %[[D:.*]] = forge.copy %arg0 {{.*}} loc("output output3")
// CHECK: return %[[A]], %[[N]], %[[C]], %[[D]]
func.func @outputs(%x: tensor<4xf32> {forge.kind = "input", forge.name = "x"}) -> (tensor<4xf32> {forge.name = "a"}, tensor<4xf32>, tensor<4xf32> {forge.name = "c"}, tensor<4xf32>) {
  %n = forge.neg %x : (tensor<4xf32>) -> tensor<4xf32>
  return %x, %n, %n, %x : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// A pointwise op writes over an operand that dies there; a reshape's result
// is its operand's bytes: the whole chain runs in one buffer (an output too),
// the input keeps its own. The report names the peak and what is live there.
// REPORT: memory plan of @reuse: arena 512.0 B, peak of live tensors 512.0 B (2 buffers), at op 0 (forge.neg tensor<64xf32>)
// REPORT-NEXT: live at the peak, largest first (2 of 2):
// REPORT-NEXT: 256.0 B  ops -1..6  input 'x' tensor<64xf32>
// REPORT-NEXT: 256.0 B  ops 0..6  forge.neg tensor<64xf32> (then 5 more values in its bytes, last forge.reshape tensor<64xf32>)
// CHECK-LABEL: func @reuse
// CHECK-SAME: forge.offset = 0 : i64
// CHECK-SAME: forge.arena_size = 512 : i64
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: 256>}
// CHECK: forge.exp %0 {forge.offsets = array<i64: 256>}
// CHECK: forge.neg %1 {forge.offsets = array<i64: 256>}
// CHECK: forge.reshape %2 {forge.offsets = array<i64: 256>
// CHECK: forge.exp %3 {forge.offsets = array<i64: 256>}
// CHECK: forge.reshape %4 {forge.offsets = array<i64: 256>
func.func @reuse(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"}) -> (tensor<64xf32> {forge.name = "y"}) {
  %a = forge.neg %x : (tensor<64xf32>) -> tensor<64xf32>
  %b = forge.exp %a : (tensor<64xf32>) -> tensor<64xf32>
  %c = forge.neg %b : (tensor<64xf32>) -> tensor<64xf32>
  %r = forge.reshape %c {shape = array<i64: 8, 8>} : (tensor<64xf32>) -> tensor<8x8xf32>
  %d = forge.exp %r : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = forge.reshape %d {shape = array<i64: 64>} : (tensor<8x8xf32>) -> tensor<64xf32>
  return %y : tensor<64xf32>
}

// -----

// Negative: an operand read again later keeps its bytes, a transpose (not
// pointwise) never writes over its operand; disjoint live ranges still share.
// CHECK-LABEL: func @no_reuse
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: [[A:[0-9]+]]>}
// CHECK-NEXT: forge.exp %0 {forge.offsets = array<i64: [[B:[0-9]+]]>}
// CHECK-NEXT: forge.add %0, %1 {forge.offsets = array<i64: [[A]]>}
// CHECK-NEXT: forge.transpose %2 {forge.offsets = array<i64: [[B]]>
func.func @no_reuse(%x: tensor<8x8xf32> {forge.kind = "input", forge.name = "x"}) -> (tensor<8x8xf32> {forge.name = "y"}) {
  %a = forge.neg %x : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %b = forge.exp %a : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %c = forge.add %a, %b : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %t = forge.transpose %c {perm = array<i64: 1, 0>} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return %t : tensor<8x8xf32>
}

// -----

// cross_entropy_grad writes the gradient over the logits when they die there.
// CHECK-LABEL: func @logits
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: [[L:[0-9]+]]>}
// CHECK: forge.cross_entropy_grad %0, {{.*}}forge.offsets = array<i64: [[L]]>
func.func @logits(%x: tensor<4x10xf32> {forge.kind = "input", forge.name = "x"}, %t: tensor<4xi64> {forge.kind = "input", forge.name = "t"}, %dy: tensor<f32> {forge.kind = "input", forge.name = "dy"}) -> (tensor<4x10xf32> {forge.name = "dx"}) {
  %l = forge.neg %x : (tensor<4x10xf32>) -> tensor<4x10xf32>
  %loss, %lse = forge.cross_entropy %l, %t : (tensor<4x10xf32>, tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>)
  %g = forge.cross_entropy_grad %l, %lse, %t, %dy {reduction = "mean"} : (tensor<4x10xf32>, tensor<4xf32>, tensor<4xi64>, tensor<f32>) -> tensor<4x10xf32>
  return %g : tensor<4x10xf32>
}

// -----

// A horizontal region's kernel does not order its members: a member other
// than the writer reads the old value, so the update is copied.
// CHECK-LABEL: func @horizontal
// CHECK: %[[H:.*]]:2 = forge.fusion "horizontal"
// CHECK: forge.copy %[[H]]#0 {{.*}} loc("update w")
func.func @horizontal(%w: tensor<4xf32> {forge.kind = "parameter", forge.name = "w"}, %g: tensor<4xf32> {forge.kind = "input", forge.name = "g"}) -> (tensor<4xf32> {forge.updates = "w"}, tensor<4xf32> {forge.name = "z"}) {
  %h:2 = forge.fusion "horizontal"(%w, %g, %w) {forge.launch = {block = 32 : i64, grid = 2 : i64, kernel = "k0_fusion"}} : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>, %c: tensor<4xf32>):
    %0 = forge.fusion "loop"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> {
    ^bb0(%x: tensor<4xf32>, %y: tensor<4xf32>):
      %s = forge.sub %x, %y : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
      forge.yield %s : tensor<4xf32>
    }
    %1 = forge.fusion "loop"(%c) : (tensor<4xf32>) -> tensor<4xf32> {
    ^bb0(%z: tensor<4xf32>):
      %m = forge.mul %z, %z : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
      forge.yield %m : tensor<4xf32>
    }
    forge.yield %0, %1 : tensor<4xf32>, tensor<4xf32>
  }
  return %h#0, %h#1 : tensor<4xf32>, tensor<4xf32>
}

// -----

// A pointwise region that took a scalar rider (forge-merge-scalar-regions) is
// a horizontal region, yet its loop member writes over an operand that only
// it reads, as it would alone; a second member reading the operand forbids it.
// CHECK-LABEL: func @horizontal_member_in_place
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: [[A:[0-9]+]]>}
// CHECK: forge.fusion "horizontal"{{.*}}forge.offsets = array<i64: [[A]], {{[0-9]+}}>
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: [[B:[0-9]+]]>}
// CHECK-NOT: forge.offsets = array<i64: [[B]],
// CHECK-NOT: forge.offsets = array<i64: {{[0-9]+}}, [[B]]>
// CHECK: return
func.func @horizontal_member_in_place(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"}, %s: tensor<f32> {forge.kind = "input", forge.name = "s"}) -> (tensor<64xf32> {forge.name = "y"}, tensor<f32> {forge.name = "t"}, tensor<64xf32> {forge.name = "y2"}, tensor<64xf32> {forge.name = "t2"}) {
  %a = forge.neg %x : (tensor<64xf32>) -> tensor<64xf32>
  %h:2 = forge.fusion "horizontal"(%a, %s) {forge.launch = {block = 64 : i64, grid = 2 : i64, kernel = "k0_fusion"}} : (tensor<64xf32>, tensor<f32>) -> (tensor<64xf32>, tensor<f32>) {
  ^bb0(%p: tensor<64xf32>, %q: tensor<f32>):
    %e = forge.fusion "loop"(%p) : (tensor<64xf32>) -> tensor<64xf32> {
    ^bb0(%v: tensor<64xf32>):
      %r = forge.exp %v : (tensor<64xf32>) -> tensor<64xf32>
      forge.yield %r : tensor<64xf32>
    }
    %t = forge.fusion "loop"(%q) : (tensor<f32>) -> tensor<f32> {
    ^bb0(%v: tensor<f32>):
      %r = forge.sqrt %v : (tensor<f32>) -> tensor<f32>
      forge.yield %r : tensor<f32>
    }
    forge.yield %e, %t : tensor<64xf32>, tensor<f32>
  }
  %b = forge.neg %x : (tensor<64xf32>) -> tensor<64xf32>
  %h2:2 = forge.fusion "horizontal"(%b, %b) {forge.launch = {block = 64 : i64, grid = 2 : i64, kernel = "k1_fusion"}} : (tensor<64xf32>, tensor<64xf32>) -> (tensor<64xf32>, tensor<64xf32>) {
  ^bb0(%p: tensor<64xf32>, %q: tensor<64xf32>):
    %e = forge.fusion "loop"(%p) : (tensor<64xf32>) -> tensor<64xf32> {
    ^bb0(%v: tensor<64xf32>):
      %r = forge.exp %v : (tensor<64xf32>) -> tensor<64xf32>
      forge.yield %r : tensor<64xf32>
    }
    %t = forge.fusion "loop"(%q) : (tensor<64xf32>) -> tensor<64xf32> {
    ^bb0(%v: tensor<64xf32>):
      %r = forge.neg %v : (tensor<64xf32>) -> tensor<64xf32>
      forge.yield %r : tensor<64xf32>
    }
    forge.yield %e, %t : tensor<64xf32>, tensor<64xf32>
  }
  return %h#0, %h#1, %h2#0, %h2#1 : tensor<64xf32>, tensor<f32>, tensor<64xf32>, tensor<64xf32>
}

// -----

// A member that reads an earlier member's sums (forge-merge-reductions) is
// written by the block that completes them, into outputs zeroed before the
// launch (one holds the blocks' arrival count): never over an operand, even
// one only it reads (%c, which dies here, would otherwise give the mean its
// bytes).
// CHECK-LABEL: func @late_member_not_in_place
// CHECK: forge.neg %arg1 {forge.offsets = array<i64: [[C:[0-9]+]]>}
// CHECK-NOT: forge.offsets = array<i64: {{[0-9]+}}, [[C]]>
// CHECK: forge.mul
func.func @late_member_not_in_place(%g: tensor<64xf32> {forge.kind = "input", forge.name = "g"}, %s: tensor<f32> {forge.kind = "input", forge.name = "s"}) -> (tensor<f32> {forge.name = "y"}) {
  %c = forge.neg %s : (tensor<f32>) -> tensor<f32>
  %h:2 = forge.fusion "horizontal"(%g, %c) {forge.launch = {block = 64 : i64, grid = 1 : i64, kernel = "k0_fusion", zero_only = array<i64: 0, 1>, zero_outputs}} : (tensor<64xf32>, tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<f32>):
    %sum = forge.fusion "multi_reduce"(%a) : (tensor<64xf32>) -> tensor<f32> {
    ^bb0(%v: tensor<64xf32>):
      %r = forge.reduce_sum %v {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
      forge.yield %r : tensor<f32>
    }
    %mean = forge.fusion "loop"(%sum, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32> {
    ^bb0(%v: tensor<f32>, %w: tensor<f32>):
      %r = forge.div %v, %w : (tensor<f32>, tensor<f32>) -> tensor<f32>
      forge.yield %r : tensor<f32>
    }
    forge.yield %sum, %mean : tensor<f32>, tensor<f32>
  }
  %y = forge.mul %h#0, %h#1 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %y : tensor<f32>
}

// -----

// A side-stream op that reads a value last may not write its result over it
// while a compute-stream reader it is not ordered after (%b: the side op
// waits only for %a's event) may still read it: %c gets bytes of its own.
// On the compute stream the same op would take %a's bytes (in_place above).
// CHECK-LABEL: func @side_last_reader
// CHECK: forge.exp %arg0 {forge.event = 1 : i64, forge.offsets = array<i64: 256>}
// CHECK: forge.abs %0 {forge.offsets = array<i64: 512>}
// CHECK: forge.neg %0 {forge.event = 2 : i64, forge.offsets = array<i64: 768>, forge.stream = 1 : i64
func.func @side_last_reader(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<64xf32> {forge.name = "y"}) attributes {forge.streams = ["compute", "compute.1"]} {
  %a = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
  %b = forge.abs %a : (tensor<64xf32>) -> tensor<64xf32>
  %c = forge.neg %a {forge.stream = 1 : i64} : (tensor<64xf32>) -> tensor<64xf32>
  %d = forge.mul %b, %c : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %d : tensor<64xf32>
}
