// RUN: forge-opt %s --split-input-file --forge-merge-scalar-regions | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-merge-scalar-regions | forge-opt --split-input-file --verify-each > /dev/null
// RUN: forge-opt %s --split-input-file --forge-merge-scalar-regions="max-horizontal-operands=4" | FileCheck %s --check-prefix=LIMIT

// Early: a scalar region of an argument and a constant (a bias correction
// from the step) rides in the first pointwise region before its reader; the
// constant, defined below that region, moves above it. The reader (the
// update) and the values are unchanged.
// CHECK-LABEL: func @early
// CHECK-NEXT: %[[C:.*]] = forge.constant dense<0.89
// CHECK-NEXT: %[[H:.*]]:2 = forge.fusion "horizontal"(%arg0, %arg1, %arg2, %[[C]])
// CHECK-NEXT: ^bb0(%[[G:.*]]: tensor<64xf32>, %[[Y:.*]]: tensor<64xf32>, %[[S:.*]]: tensor<f32>, %[[K:.*]]: tensor<f32>):
// CHECK-NEXT: forge.fusion "loop"(%[[G]], %[[Y]])
// CHECK: forge.fusion "loop"(%[[S]], %[[K]])
// CHECK: forge.pow
// CHECK: forge.yield %{{.*}}, %{{.*}} : tensor<64xf32>, tensor<f32>
// CHECK-NOT: forge.fusion "horizontal"
// CHECK: forge.fusion "loop"(%arg3, %[[H]]#0, %[[H]]#1)
// LIMIT-LABEL: func @early
// LIMIT-NOT: "horizontal"
// LIMIT: return
func.func @early(%g: tensor<64xf32>, %y: tensor<64xf32>, %step: tensor<f32>, %p: tensor<64xf32>) -> tensor<64xf32> {
  %dy = forge.fusion "loop"(%g, %y) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32> {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    %m = forge.mul %a, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    forge.yield %m : tensor<64xf32>
  }
  %beta = forge.constant dense<0.9> : tensor<f32>
  %bc = forge.fusion "loop"(%step, %beta) : (tensor<f32>, tensor<f32>) -> tensor<f32> {
  ^bb0(%s: tensor<f32>, %k: tensor<f32>):
    %q = forge.pow %k, %s : (tensor<f32>, tensor<f32>) -> tensor<f32>
    forge.yield %q : tensor<f32>
  }
  %new = forge.fusion "loop"(%p, %dy, %bc) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>) -> tensor<64xf32> {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>, %c: tensor<f32>):
    %u = forge.mul %b, %c : (tensor<64xf32>, tensor<f32>) -> tensor<64xf32>
    %v = forge.sub %a, %u : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    forge.yield %v : tensor<64xf32>
  }
  return %new : tensor<64xf32>
}

// -----

// Late: of a scalar group (forge-fuse's horizontal region of scalars), the
// member that only the return reads (a gradient norm: a metric) rides in the
// last pointwise region after it, here an optimizer's horizontal region,
// as its last member; the member that the update reads (a clip scale) keeps
// its place, a loop region of its own again.
// CHECK-LABEL: func @late
// CHECK: %[[SUM:.*]] = forge.reduce_sum
// CHECK-NEXT: %[[CLIP:.*]] = forge.fusion "loop"(%[[SUM]])
// CHECK: forge.div
// CHECK: %[[OPT:.*]]:3 = forge.fusion "horizontal"(%arg1, %arg0, %[[CLIP]], %arg2, %arg0, %[[CLIP]], %[[SUM]])
// CHECK: forge.fusion "loop"
// CHECK: forge.fusion "loop"
// CHECK: forge.fusion "loop"
// CHECK: forge.sqrt
// CHECK: return %[[OPT]]#0, %[[OPT]]#1, %[[OPT]]#2
func.func @late(%g: tensor<64xf32>, %p: tensor<64xf32>, %q: tensor<64xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %sum = forge.reduce_sum %g {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
  %s:2 = forge.fusion "horizontal"(%sum, %sum) : (tensor<f32>, tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  ^bb0(%a0: tensor<f32>, %a1: tensor<f32>):
    %clip = forge.fusion "loop"(%a0) : (tensor<f32>) -> tensor<f32> {
    ^bb0(%x: tensor<f32>):
      %d = forge.div %x, %x : (tensor<f32>, tensor<f32>) -> tensor<f32>
      forge.yield %d : tensor<f32>
    }
    %norm = forge.fusion "loop"(%a1) : (tensor<f32>) -> tensor<f32> {
    ^bb0(%x: tensor<f32>):
      %r = forge.sqrt %x : (tensor<f32>) -> tensor<f32>
      forge.yield %r : tensor<f32>
    }
    forge.yield %clip, %norm : tensor<f32>, tensor<f32>
  }
  %u:2 = forge.fusion "horizontal"(%p, %g, %s#0, %q, %g, %s#0) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>, %c: tensor<f32>, %d: tensor<64xf32>, %e: tensor<64xf32>, %f: tensor<f32>):
    %r1 = forge.fusion "loop"(%a, %b, %c) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>) -> tensor<64xf32> {
    ^bb0(%x: tensor<64xf32>, %y: tensor<64xf32>, %z: tensor<f32>):
      %m = forge.mul %y, %z : (tensor<64xf32>, tensor<f32>) -> tensor<64xf32>
      %n = forge.sub %x, %m : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
      forge.yield %n : tensor<64xf32>
    }
    %r2 = forge.fusion "loop"(%d, %e, %f) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>) -> tensor<64xf32> {
    ^bb0(%x: tensor<64xf32>, %y: tensor<64xf32>, %z: tensor<f32>):
      %m = forge.mul %y, %z : (tensor<64xf32>, tensor<f32>) -> tensor<64xf32>
      %n = forge.add %x, %m : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
      forge.yield %n : tensor<64xf32>
    }
    forge.yield %r1, %r2 : tensor<64xf32>, tensor<64xf32>
  }
  return %u#0, %u#1, %s#1 : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}

// -----

// Not: no pointwise region to ride in (scalars alone; a reduction is no host).
// CHECK-LABEL: func @no_host
// CHECK: forge.reduce_sum
// CHECK-NEXT: %[[N:.*]] = forge.fusion "loop"
// CHECK: return %[[N]]
func.func @no_host(%g: tensor<64xf32>) -> tensor<f32> {
  %sum = forge.reduce_sum %g {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
  %n = forge.fusion "loop"(%sum) : (tensor<f32>) -> tensor<f32> {
  ^bb0(%x: tensor<f32>):
    %r = forge.sqrt %x : (tensor<f32>) -> tensor<f32>
    forge.yield %r : tensor<f32>
  }
  return %n : tensor<f32>
}

// -----

// Not: neither early (it reads a reduction) nor late (a region reads it), and
// not late into a region before it.
// CHECK-LABEL: func @neither
// CHECK: forge.fusion "loop"(%arg1, %arg1)
// CHECK: %[[N:.*]] = forge.fusion "loop"(%{{.*}}) : (tensor<f32>) -> tensor<f32>
// CHECK: forge.fusion "loop"(%arg1, %[[N]])
// CHECK-NOT: "horizontal"
func.func @neither(%g: tensor<64xf32>, %p: tensor<64xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %sq = forge.fusion "loop"(%p, %p) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32> {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    %m = forge.mul %a, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    forge.yield %m : tensor<64xf32>
  }
  %sum = forge.reduce_sum %g {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
  %n = forge.fusion "loop"(%sum) : (tensor<f32>) -> tensor<f32> {
  ^bb0(%x: tensor<f32>):
    %r = forge.sqrt %x : (tensor<f32>) -> tensor<f32>
    forge.yield %r : tensor<f32>
  }
  %u = forge.fusion "loop"(%p, %n) : (tensor<64xf32>, tensor<f32>) -> tensor<64xf32> {
  ^bb0(%a: tensor<64xf32>, %b: tensor<f32>):
    %m = forge.mul %a, %b : (tensor<64xf32>, tensor<f32>) -> tensor<64xf32>
    forge.yield %m : tensor<64xf32>
  }
  return %sq, %u, %n : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}

// -----

// A lone pointwise op of one element (a loss's mean) that only the return
// reads rides too, as a loop region of its own inside the host.
// CHECK-LABEL: func @lone
// CHECK: %[[H:.*]]:2 = forge.fusion "horizontal"(%arg0, %[[SUM:.*]], %arg2)
// CHECK: forge.fusion "loop"
// CHECK: forge.fusion "loop"
// CHECK-NEXT: ^bb0
// CHECK-NEXT: forge.div
// CHECK: return %[[H]]#0, %[[H]]#1
func.func @lone(%p: tensor<64xf32>, %l: tensor<8xf32>, %n: tensor<f32>) -> (tensor<64xf32>, tensor<f32>) {
  %sum = forge.reduce_sum %l {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
  %mean = forge.div %sum, %n : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %u = forge.fusion "loop"(%p) : (tensor<64xf32>) -> tensor<64xf32> {
  ^bb0(%a: tensor<64xf32>):
    %m = forge.neg %a : (tensor<64xf32>) -> tensor<64xf32>
    forge.yield %m : tensor<64xf32>
  }
  return %u, %mean : tensor<64xf32>, tensor<f32>
}

// -----

// A lone op that rides early is read by a scalar region that rides late: the
// late rider reads the early host's result (fp16's loss-scale update has
// this shape).
// CHECK-LABEL: func @chained
// CHECK: %[[E:.*]]:2 = forge.fusion "horizontal"(%arg0, %arg1, %arg2)
// CHECK: forge.div
// CHECK: %[[L:.*]]:2 = forge.fusion "horizontal"(%arg0, %[[E]]#1)
// CHECK: forge.sqrt
// CHECK: return %[[E]]#0, %[[L]]#0, %[[L]]#1
func.func @chained(%p: tensor<64xf32>, %a: tensor<f32>, %b: tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %u = forge.fusion "loop"(%p) : (tensor<64xf32>) -> tensor<64xf32> {
  ^bb0(%x: tensor<64xf32>):
    %m = forge.neg %x : (tensor<64xf32>) -> tensor<64xf32>
    forge.yield %m : tensor<64xf32>
  }
  %d = forge.div %a, %b : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %s = forge.fusion "loop"(%d) : (tensor<f32>) -> tensor<f32> {
  ^bb0(%x: tensor<f32>):
    %r = forge.sqrt %x : (tensor<f32>) -> tensor<f32>
    forge.yield %r : tensor<f32>
  }
  %w = forge.fusion "loop"(%p) : (tensor<64xf32>) -> tensor<64xf32> {
  ^bb0(%x: tensor<64xf32>):
    %m = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
    forge.yield %m : tensor<64xf32>
  }
  return %u, %w, %s : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}

// -----

// No host: the only pointwise region before the reader is dk's centring,
// which writes a piece of the attention gradient's concat. A rider would make
// it a horizontal region, which forge-fold-attention-views does not write in
// place (the concat would copy the gradient again), so the bias correction
// keeps its own region; the centring stays a one-result loop.
// CHECK-LABEL: func @attention_piece
// CHECK: %[[DK:.*]] = forge.fusion "loop"(%{{.*}}) : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xbf16>
// CHECK-NOT: "horizontal"
// CHECK: forge.concat
// CHECK-NOT: "horizontal"
// CHECK: forge.fusion "loop"(%arg5, %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// CHECK-NOT: "horizontal"
// CHECK: return
func.func @attention_piece(%q: tensor<2x4x2x16xbf16>, %o: tensor<2x4x2x16xbf16>, %lse: tensor<2x2x4xf32>, %dy: tensor<2x4x2x16xbf16>, %p: tensor<4xf32>, %step: tensor<f32>) -> (tensor<2x4x96xbf16>, tensor<4xf32>) {
  %dq, %dk, %dv = forge.attention_grad %q, %q, %q, %o, %lse, %dy {causal = true, forge.library = "cudnn", layout = "bshd", scale = 0.35 : f64} : (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x2x4xf32>, tensor<2x4x2x16xbf16>) -> (tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>, tensor<2x4x2x16xbf16>)
  %c = forge.fusion "loop"(%dk) : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xbf16> {
  ^bb0(%a: tensor<2x4x2x16xbf16>):
    %n = forge.neg %a : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xbf16>
    forge.yield %n : tensor<2x4x2x16xbf16>
  }
  %rq = forge.reshape %dq {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %rk = forge.reshape %c {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %rv = forge.reshape %dv {shape = array<i64: 2, 4, 32>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x32xbf16>
  %g = forge.concat %rq, %rk, %rv {axis = 2 : i64} : (tensor<2x4x32xbf16>, tensor<2x4x32xbf16>, tensor<2x4x32xbf16>) -> tensor<2x4x96xbf16>
  %beta = forge.constant dense<0.9> : tensor<f32>
  %bc = forge.fusion "loop"(%step, %beta) : (tensor<f32>, tensor<f32>) -> tensor<f32> {
  ^bb0(%s: tensor<f32>, %k: tensor<f32>):
    %r = forge.pow %k, %s : (tensor<f32>, tensor<f32>) -> tensor<f32>
    forge.yield %r : tensor<f32>
  }
  %new = forge.fusion "loop"(%p, %bc) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>, %b: tensor<f32>):
    %u = forge.mul %a, %b : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
    forge.yield %u : tensor<4xf32>
  }
  return %g, %new : tensor<2x4x96xbf16>, tensor<4xf32>
}
