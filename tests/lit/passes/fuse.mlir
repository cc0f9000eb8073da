// RUN: forge-opt %s --split-input-file --forge-fuse | FileCheck %s
// The regions print and parse back (the verifier accepts what the pass makes).
// RUN: forge-opt %s --split-input-file --forge-fuse | forge-opt --split-input-file --verify-each > /dev/null
// RUN: forge-opt %s --split-input-file --forge-fuse="rematerialize=false" | FileCheck %s --check-prefix=OFF
// RUN: forge-opt %s --split-input-file --forge-fuse="rows=false" | FileCheck %s --check-prefix=ROWSOFF

// A chain of pointwise ops of one shape becomes one loop region; the bias of
// another shape enters it as a broadcast input.
// CHECK-LABEL: func @chain
// CHECK-NEXT: %[[F:.*]] = forge.fusion "loop"(%arg0, %arg1) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32> {
// CHECK-NEXT: ^bb0(%[[X:.*]]: tensor<2x4xf32>, %[[B:.*]]: tensor<4xf32>):
// CHECK-NEXT: %[[A:.*]] = forge.add %[[X]], %[[B]]
// CHECK-NEXT: %[[T:.*]] = forge.tanh %[[A]]
// CHECK-NEXT: %[[M:.*]] = forge.mul %[[T]], %[[X]]
// CHECK-NEXT: forge.yield %[[M]] : tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: return %[[F]]
func.func @chain(%x: tensor<2x4xf32>, %b: tensor<4xf32>) -> tensor<2x4xf32> {
  %a = forge.add %x, %b : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  %t = forge.tanh %a : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %m = forge.mul %t, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return %m : tensor<2x4xf32>
}

// -----

// Values used outside become results (an optimizer step: new parameter and
// new moment from one region).
// CHECK-LABEL: func @two_results
// CHECK: %[[F:.*]]:2 = forge.fusion "loop"
// CHECK: forge.yield %{{.*}}, %{{.*}} : tensor<8xf32>, tensor<8xf32>
// CHECK: return %[[F]]#1, %[[F]]#0
func.func @two_results(%p: tensor<8xf32>, %g: tensor<8xf32>, %m: tensor<8xf32>, %lr: tensor<f32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %m2 = forge.add %m, %g : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %s = forge.mul %m2, %lr : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %p2 = forge.sub %p, %s : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %p2, %m2 : tensor<8xf32>, tensor<8xf32>
}

// -----

// An outside user between the region's first and last op moves after it.
// CHECK-LABEL: func @moves_user
// CHECK: %[[F:.*]]:2 = forge.fusion "loop"
// CHECK: forge.reduce_sum %[[F]]#0
// CHECK: return
func.func @moves_user(%x: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
  %e = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %r = forge.reduce_sum %e {axes = array<i64: 0>, keepdims = false} : (tensor<4xf32>) -> tensor<f32>
  %t = forge.tanh %e : (tensor<4xf32>) -> tensor<4xf32>
  return %r, %t : tensor<f32>, tensor<4xf32>
}

// -----

// Negative: joining would make a cycle (the reduction between them reads the
// region and feeds it): the mul stays outside, and no region has two ops.
// CHECK-LABEL: func @cycle
// CHECK-NOT: forge.fusion
// CHECK: forge.exp
// CHECK: forge.reduce_sum
// CHECK: forge.mul
func.func @cycle(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %r = forge.reduce_sum %e {axes = array<i64: 0>, keepdims = true} : (tensor<4xf32>) -> tensor<1xf32>
  %m = forge.mul %e, %r : (tensor<4xf32>, tensor<1xf32>) -> tensor<4xf32>
  return %m : tensor<4xf32>
}

// -----

// Negative: a producer of another shape (it broadcasts into the consumer)
// does not join; a single pointwise op is not wrapped; a non-pointwise op
// (softmax) is never in a loop region.
// CHECK-LABEL: func @no_fusion
// CHECK-NOT: forge.fusion
// CHECK: forge.exp
// CHECK: forge.add
// CHECK: forge.softmax
func.func @no_fusion(%x: tensor<4xf32>, %y: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %e = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %a = forge.add %y, %e : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  %s = forge.softmax %a {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %s : tensor<2x4xf32>
}

// -----

// Two producer regions merge through a shared consumer.
// CHECK-LABEL: func @merge
// CHECK: forge.fusion "loop"(%arg0, %arg1)
// CHECK: forge.exp
// CHECK: forge.neg
// CHECK: forge.tanh
// CHECK: forge.abs
// CHECK: forge.add
// CHECK: forge.yield
// CHECK-NOT: forge.fusion
func.func @merge(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %a = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %b = forge.neg %a : (tensor<4xf32>) -> tensor<4xf32>
  %c = forge.tanh %y : (tensor<4xf32>) -> tensor<4xf32>
  %d = forge.abs %c : (tensor<4xf32>) -> tensor<4xf32>
  %e = forge.add %b, %d : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %e : tensor<4xf32>
}

// -----

// The classifier's loss and its gradient become cross_entropy (+ the mean)
// and cross_entropy_grad; the log-softmax and the one-hot gradient are gone.
// CHECK-LABEL: func @cross_entropy
// CHECK-NEXT: %[[L:.*]], %[[LSE:.*]] = forge.cross_entropy %arg0, %arg1 : (tensor<4x10xf32>, tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>)
// CHECK-NEXT: %[[M:.*]] = forge.reduce_mean %[[L]] {axes = array<i64: 0>, keepdims = false}
// CHECK-NEXT: %[[D:.*]] = forge.cross_entropy_grad %arg0, %[[LSE]], %arg1, %arg2 {reduction = "mean"}
// CHECK-NEXT: return %[[M]], %[[D]]
func.func @cross_entropy(%x: tensor<4x10xf32>, %t: tensor<4xi64>, %g: tensor<f32>) -> (tensor<f32>, tensor<4x10xf32>) {
  %y = forge.log_softmax %x {axis = 1 : i64} : (tensor<4x10xf32>) -> tensor<4x10xf32>
  %l = forge.nll_loss %y, %t {reduction = "mean"} : (tensor<4x10xf32>, tensor<4xi64>) -> tensor<f32>
  %dy = forge.nll_loss_grad %g, %t {num_classes = 10 : i64, reduction = "mean"} : (tensor<f32>, tensor<4xi64>) -> tensor<4x10xf32>
  %dx = forge.log_softmax_grad %y, %dy {axis = 1 : i64} : (tensor<4x10xf32>, tensor<4x10xf32>) -> tensor<4x10xf32>
  return %l, %dx : tensor<f32>, tensor<4x10xf32>
}

// -----

// Evaluation: the per-sample losses, forward only.
// CHECK-LABEL: func @cross_entropy_eval
// CHECK-NEXT: %[[L:.*]], %{{.*}} = forge.cross_entropy %arg0, %arg1
// CHECK-NEXT: return %[[L]]
func.func @cross_entropy_eval(%x: tensor<4x10xf32>, %t: tensor<4xi64>) -> tensor<4xf32> {
  %y = forge.log_softmax %x {axis = 1 : i64} : (tensor<4x10xf32>) -> tensor<4x10xf32>
  %l = forge.nll_loss %y, %t {reduction = "none"} : (tensor<4x10xf32>, tensor<4xi64>) -> tensor<4xf32>
  return %l : tensor<4xf32>
}

// -----

// Negative: an ignore_index, another reader of the log-softmax, or a
// log-softmax over another dim keep the unfused ops.
// CHECK-LABEL: func @cross_entropy_kept
// CHECK-NOT: forge.cross_entropy
// CHECK-COUNT-3: forge.nll_loss
func.func @cross_entropy_kept(%x: tensor<4x10xf32>, %t: tensor<4xi64>, %z: tensor<10x4xf32>, %u: tensor<10xi64>) -> (tensor<f32>, tensor<4x10xf32>, tensor<f32>, tensor<f32>) {
  %y = forge.log_softmax %x {axis = 1 : i64} : (tensor<4x10xf32>) -> tensor<4x10xf32>
  %l = forge.nll_loss %y, %t {ignore_index = 3 : i64, reduction = "mean"} : (tensor<4x10xf32>, tensor<4xi64>) -> tensor<f32>
  %y2 = forge.log_softmax %x {axis = 1 : i64} : (tensor<4x10xf32>) -> tensor<4x10xf32>
  %l2 = forge.nll_loss %y2, %t {reduction = "sum"} : (tensor<4x10xf32>, tensor<4xi64>) -> tensor<f32>
  %e = forge.exp %y2 : (tensor<4x10xf32>) -> tensor<4x10xf32>
  %y3 = forge.log_softmax %z {axis = 0 : i64} : (tensor<10x4xf32>) -> tensor<10x4xf32>
  %l3 = forge.nll_loss %y3, %u {reduction = "mean"} : (tensor<10x4xf32>, tensor<10xi64>) -> tensor<f32>
  return %l, %e, %l2, %l3 : tensor<f32>, tensor<4x10xf32>, tensor<f32>, tensor<f32>
}

// -----

// Two independent parameter updates (results returned with forge.updates)
// become one horizontal region of two loop regions; its operands are each
// member's inputs in turn (the shared learning rate twice).
// CHECK-LABEL: func @optimizer
// CHECK: %[[H:.*]]:2 = forge.fusion "horizontal"(%arg1, %arg4, %arg0, %arg3, %arg4, %arg2)
// CHECK: forge.fusion "loop"
// CHECK: forge.fusion "loop"
// CHECK: return %[[H]]#0, %[[H]]#1
func.func @optimizer(%p: tensor<8xf32>, %g: tensor<8xf32>, %q: tensor<4xf32>, %h: tensor<4xf32>, %lr: tensor<f32>) -> (tensor<8xf32> {forge.updates = "p"}, tensor<4xf32> {forge.updates = "q"}) {
  %s = forge.mul %g, %lr : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %p2 = forge.sub %p, %s : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %t = forge.mul %h, %lr : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %q2 = forge.sub %q, %t : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %p2, %q2 : tensor<8xf32>, tensor<4xf32>
}

// -----

// Negative: the second update reads the first's result (through a
// reduction), so they stay separate loop regions.
// CHECK-LABEL: func @dependent_updates
// CHECK-NOT: "horizontal"
// CHECK-COUNT-2: forge.fusion "loop"
func.func @dependent_updates(%p: tensor<8xf32>, %g: tensor<8xf32>, %q: tensor<4xf32>, %h: tensor<4xf32>) -> (tensor<8xf32> {forge.updates = "p"}, tensor<4xf32> {forge.updates = "q"}) {
  %s = forge.mul %g, %g : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %p2 = forge.sub %p, %s : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %n = forge.reduce_sum %p2 {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
  %t = forge.mul %h, %n : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %q2 = forge.sub %q, %t : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %p2, %q2 : tensor<8xf32>, tensor<4xf32>
}

// -----

// Rematerialization: the backward region recomputes h, c and t from x and b
// (reading 160 bytes) instead of reading three saved 128-byte intermediates;
// the forward region then writes only what the matmul reads.
// CHECK-LABEL: func @remat
// CHECK: %[[F:.*]] = forge.fusion "loop"(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
// CHECK: %[[M:.*]] = forge.matmul %[[F]], %arg2
// CHECK: forge.fusion "loop"(%[[M]], %arg1, %arg0) : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK: forge.tanh
// CHECK: forge.yield
func.func @remat(%x: tensor<4x8xf32>, %b: tensor<8xf32>, %w: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %h = forge.add %x, %b : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %c = forge.mul %h, %h : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %t = forge.tanh %c : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = forge.mul %h, %t : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %m = forge.matmul %y, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %u = forge.mul %m, %t : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %v = forge.mul %u, %c : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d = forge.add %v, %h : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %m, %d : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Negative: recomputing h would read x and b (160 bytes) instead of h (128
// bytes), and h is returned too, so the producer writes it anyway: the
// consumer keeps reading h; with rematerialize=false nothing is recomputed
// either.
// CHECK-LABEL: func @no_remat
// CHECK: %[[F:.*]]:2 = forge.fusion "loop"(%arg0, %arg1)
// CHECK: forge.fusion "loop"(%{{.*}}, %[[F]]#0) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NOT: forge.add %arg
// OFF-LABEL: func @remat
// OFF: forge.fusion "loop"(%{{.*}}, %{{.*}}#{{[0-9]}}, %{{.*}}#{{[0-9]}}, %{{.*}}#{{[0-9]}}) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
func.func @no_remat(%x: tensor<4x8xf32>, %b: tensor<8xf32>, %w: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %h = forge.add %x, %b : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %y = forge.tanh %h : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %m = forge.matmul %y, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %u = forge.mul %m, %h : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d = forge.exp %u : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %m, %d, %h : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Row fusion: an attention's scale and causal mask enter its softmax as a
// prologue (the mask broadcast over batch and heads); the softmax's gradient
// takes the mask and scale of the backward pass as an epilogue. The softmax
// output, which the backward reads too, is the forward region's result.
// CHECK-LABEL: func @attention_rows
// CHECK: %[[Y:.*]] = forge.fusion "row"(%arg0, %arg1, %arg2, %arg3) : (tensor<2x3x4x4xf32>, tensor<f32>, tensor<1x1x4x4xi1>, tensor<f32>) -> tensor<2x3x4x4xf32> {
// CHECK-NEXT: ^bb0
// CHECK-NEXT: forge.mul
// CHECK-NEXT: forge.where
// CHECK-NEXT: %[[S:.*]] = forge.softmax
// CHECK-NEXT: forge.yield %[[S]]
// CHECK: forge.fusion "row"(%[[Y]], %arg4, %arg2, %arg5, %arg1)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: %[[G:.*]] = forge.softmax_grad
// CHECK-NEXT: %[[W:.*]] = forge.where %{{.*}}, %{{.*}}, %[[G]]
// CHECK-NEXT: %[[M:.*]] = forge.mul %[[W]]
// CHECK-NEXT: forge.yield %[[M]]
// OFF-LABEL: func @attention_rows
// OFF: forge.fusion "row"
// ROWSOFF-LABEL: func @attention_rows
// ROWSOFF-NOT: "row"
// ROWSOFF: forge.softmax
// ROWSOFF: forge.softmax_grad
func.func @attention_rows(%qk: tensor<2x3x4x4xf32>, %scale: tensor<f32>, %mask: tensor<1x1x4x4xi1>, %fill: tensor<f32>, %dy: tensor<2x3x4x4xf32>, %zero: tensor<f32>) -> (tensor<2x3x4x4xf32>, tensor<2x3x4x4xf32>) {
  %s = forge.mul %qk, %scale : (tensor<2x3x4x4xf32>, tensor<f32>) -> tensor<2x3x4x4xf32>
  %m = forge.where %mask, %fill, %s : (tensor<1x1x4x4xi1>, tensor<f32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
  %y = forge.softmax %m {axis = 3 : i64} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
  %g = forge.softmax_grad %y, %dy {axis = 3 : i64} : (tensor<2x3x4x4xf32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
  %gm = forge.where %mask, %zero, %g : (tensor<1x1x4x4xi1>, tensor<f32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
  %gs = forge.mul %gm, %scale : (tensor<2x3x4x4xf32>, tensor<f32>) -> tensor<2x3x4x4xf32>
  return %y, %gs : tensor<2x3x4x4xf32>, tensor<2x3x4x4xf32>
}

// -----

// Not fused: a prologue value read by another op too (it would have to be
// written anyway), a softmax over an outer axis (not a row of contiguous
// columns), and a result read by two ops (its epilogue would have to
// yield the softmax as well).
// CHECK-LABEL: func @no_row_fusion
// CHECK-NOT: "row"
// CHECK: forge.exp
// CHECK: forge.softmax %{{.*}} {axis = 1 : i64}
// CHECK: forge.log_softmax %{{.*}} {axis = 2 : i64}
// CHECK: forge.neg
// CHECK: forge.abs
func.func @no_row_fusion(%x: tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>) {
  %e = forge.exp %x : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %s = forge.softmax %e {axis = 1 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %l = forge.log_softmax %e {axis = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %n = forge.neg %l : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %a = forge.abs %l : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %e, %s, %l, %n, %a : tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>
}

// -----

// Logits padded for an aligned GEMM (forge-pad-contractions): the loss and
// its gradient read the padded rows themselves (classes = 10), the slice of
// the logits goes, and the pad of the gradient back to 12 columns is the
// padded gradient itself.
// CHECK-LABEL: func @padded_logits
// CHECK-NOT: forge.slice
// CHECK: %[[L:.*]] = forge.reshape %arg0 {shape = array<i64: 6, 12>} : (tensor<2x3x12xf32>) -> tensor<6x12xf32>
// CHECK: %[[LOSS:.*]], %[[LSE:.*]] = forge.cross_entropy %[[L]], %arg1 {classes = 10 : i64}
// CHECK: %[[D:.*]] = forge.cross_entropy_grad %[[L]], %[[LSE]], %arg1, %arg2 {classes = 10 : i64, reduction = "mean"} : {{.*}} -> tensor<6x12xf32>
// CHECK-NOT: forge.pad
// CHECK-NOT: forge.slice
// CHECK: %[[DW:.*]] = forge.gemm %[[D]], %arg3
// CHECK: return %{{.*}}, %[[DW]]
func.func @padded_logits(%p: tensor<2x3x12xf32>, %t: tensor<6xi64>, %g: tensor<f32>, %w: tensor<12x8xf32>) -> (tensor<f32>, tensor<6x8xf32>) {
  %s = forge.slice %p {starts = array<i64: 0, 0, 0>, ends = array<i64: 2, 3, 10>, steps = array<i64: 1, 1, 1>} : (tensor<2x3x12xf32>) -> tensor<2x3x10xf32>
  %l = forge.reshape %s {shape = array<i64: 6, 10>} : (tensor<2x3x10xf32>) -> tensor<6x10xf32>
  %ls = forge.log_softmax %l {axis = 1 : i64} : (tensor<6x10xf32>) -> tensor<6x10xf32>
  %loss = forge.nll_loss %ls, %t {reduction = "mean"} : (tensor<6x10xf32>, tensor<6xi64>) -> tensor<f32>
  %ng = forge.nll_loss_grad %g, %t {num_classes = 10 : i64, reduction = "mean"} : (tensor<f32>, tensor<6xi64>) -> tensor<6x10xf32>
  %d = forge.log_softmax_grad %ls, %ng {axis = 1 : i64} : (tensor<6x10xf32>, tensor<6x10xf32>) -> tensor<6x10xf32>
  %dp = forge.pad %d {mode = "constant", pads = array<i64: 0, 0, 0, 2>, value = 0.0 : f64} : (tensor<6x10xf32>) -> tensor<6x12xf32>
  %dw = forge.gemm %dp, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<6x12xf32>, tensor<12x8xf32>) -> tensor<6x8xf32>
  return %loss, %dw : tensor<f32>, tensor<6x8xf32>
}

// -----

// Not absorbed: a slice that drops leading columns is not a padding.
// CHECK-LABEL: func @sliced_logits
// CHECK: forge.slice
// CHECK: forge.cross_entropy %{{.*}}, %arg1 :
func.func @sliced_logits(%p: tensor<6x12xf32>, %t: tensor<6xi64>) -> tensor<f32> {
  %s = forge.slice %p {starts = array<i64: 0, 2>, ends = array<i64: 6, 12>, steps = array<i64: 1, 1>} : (tensor<6x12xf32>) -> tensor<6x10xf32>
  %ls = forge.log_softmax %s {axis = 1 : i64} : (tensor<6x10xf32>) -> tensor<6x10xf32>
  %loss = forge.nll_loss %ls, %t {reduction = "mean"} : (tensor<6x10xf32>, tensor<6xi64>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// The global gradient norm: whole-tensor sums of g * g become one
// multi_reduce region (one launch). A square that the optimizer reads too
// is recomputed inside (the optimizer's region then does not write it); a
// sum that depends on another sum stays out.
// CHECK-LABEL: func @grad_norm
// CHECK: %[[S:.*]]:2 = forge.fusion "multi_reduce"(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<f32>, tensor<f32>) {
// CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<4x8xf32>, %[[B:.*]]: tensor<8xf32>):
// CHECK-NEXT: %[[AA:.*]] = forge.mul %[[A]], %[[A]]
// CHECK-NEXT: %[[RA:.*]] = forge.reduce_sum %[[AA]] {axes = array<i64: 0, 1>, keepdims = false}
// CHECK-NEXT: %[[BB:.*]] = forge.mul %[[B]], %[[B]]
// CHECK-NEXT: %[[RB:.*]] = forge.reduce_sum %[[BB]] {axes = array<i64: 0>, keepdims = false}
// CHECK-NEXT: forge.yield %[[RA]], %[[RB]]
// CHECK: forge.reduce_sum %{{.*}} {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
func.func @grad_norm(%g: tensor<4x8xf32>, %h: tensor<8xf32>, %m: tensor<8xf32>) -> (tensor<f32>, tensor<8xf32>, tensor<f32>) {
  %gg = forge.mul %g, %g : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %sg = forge.reduce_sum %gg {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<f32>
  %hh = forge.mul %h, %h : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %sh = forge.reduce_sum %hh {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
  %v = forge.add %m, %hh : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %n = forge.add %sg, %sh : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %scaled = forge.mul %h, %n : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %sd = forge.reduce_sum %scaled {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
  return %n, %v, %sd : tensor<f32>, tensor<8xf32>, tensor<f32>
}

// -----

// A loss's mean joins the multi_reduce region as a sum; its division by n, a
// lone scalar op, joins the scalar regions' horizontal region (with the norm's
// square root and a learning rate): no launch of its own. A mean with no other
// whole-tensor sum beside it stays as it is.
// CHECK-LABEL: func @loss_mean
// CHECK: %[[S:.*]]:2 = forge.fusion "multi_reduce"(%arg0, %arg1) : (tensor<6xf32>, tensor<4x8xf32>) -> (tensor<f32>, tensor<f32>) {
// CHECK-NEXT: ^bb0(%[[L:.*]]: tensor<6xf32>, %{{.*}}: tensor<4x8xf32>):
// CHECK-NEXT: forge.reduce_sum %[[L]] {axes = array<i64: 0>, keepdims = false}
// CHECK: %[[H:.*]]:3 = forge.fusion "horizontal"(%[[S]]#0, %{{.*}}, %[[S]]#1, %arg2)
// CHECK: forge.div
// CHECK: forge.sqrt
// CHECK: forge.mul
// CHECK: return %[[H]]#0, %[[H]]#1, %[[H]]#2
func.func @loss_mean(%l: tensor<6xf32>, %g: tensor<4x8xf32>, %lr: tensor<f32>) -> (tensor<f32>, tensor<f32>, tensor<f32>) {
  %mean = forge.reduce_mean %l {axes = array<i64: 0>, keepdims = false} : (tensor<6xf32>) -> tensor<f32>
  %gg = forge.mul %g, %g : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %sg = forge.reduce_sum %gg {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<f32>
  %n = forge.sqrt %sg : (tensor<f32>) -> tensor<f32>
  %l2 = forge.mul %lr, %lr : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %mean, %n, %l2 : tensor<f32>, tensor<f32>, tensor<f32>
}

// -----

// CHECK-LABEL: func @lone_mean
// CHECK: forge.reduce_mean
// CHECK-NOT: forge.fusion
func.func @lone_mean(%l: tensor<6xf32>) -> tensor<f32> {
  %mean = forge.reduce_mean %l {axes = array<i64: 0>, keepdims = false} : (tensor<6xf32>) -> tensor<f32>
  return %mean : tensor<f32>
}

// -----

// View chains: the head splits of a fused qkv projection read it directly
// (view regions: slice, reshape, transpose); the split goes. A transpose of a
// reshape alone is left as it is (nothing to save).
// CHECK-LABEL: func @qkv_views
// CHECK-NOT: forge.split
// CHECK: forge.fusion "loop"(%arg0) : (tensor<2x4x24xf32>) -> tensor<2x2x4x4xf32> {
// CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<2x4x24xf32>):
// CHECK-NEXT: %[[S:.*]] = forge.slice %[[A]] {ends = array<i64: 2, 4, 8>, starts = array<i64: 0, 0, 0>, steps = array<i64: 1, 1, 1>}
// CHECK-NEXT: %[[R:.*]] = forge.reshape %[[S]] {shape = array<i64: 2, 4, 2, 4>}
// CHECK-NEXT: %[[T:.*]] = forge.transpose %[[R]] {perm = array<i64: 0, 2, 1, 3>}
// CHECK-NEXT: forge.yield %[[T]]
// CHECK: forge.slice %{{.*}} {ends = array<i64: 2, 4, 16>, starts = array<i64: 0, 0, 8>
// CHECK: forge.slice %{{.*}} {ends = array<i64: 2, 4, 24>, starts = array<i64: 0, 0, 16>
// CHECK: %[[U:.*]] = forge.reshape %arg1
// CHECK-NEXT: forge.transpose %[[U]]
func.func @qkv_views(%qkv: tensor<2x4x24xf32>, %o: tensor<2x4x8xf32>) -> (tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>) {
  %s:3 = forge.split %qkv {axis = 2 : i64, sizes = array<i64: 8, 8, 8>} : (tensor<2x4x24xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>)
  %q = forge.reshape %s#0 {shape = array<i64: 2, 4, 2, 4>} : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %qh = forge.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
  %k = forge.reshape %s#1 {shape = array<i64: 2, 4, 2, 4>} : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %kh = forge.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
  %v = forge.reshape %s#2 {shape = array<i64: 2, 4, 2, 4>} : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %vh = forge.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
  %u = forge.reshape %o {shape = array<i64: 2, 4, 2, 4>} : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %uh = forge.transpose %u {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
  return %qh, %kh, %vh, %uh : tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>
}

// -----

// Rematerialization reads a result the producer writes anyway: the consumer of
// gs = g * c (which must wait for a sum of g, so it cannot join g's region)
// reads g, kept for the return, and computes g * c itself instead of reading
// the producer's saved product (64 + 32 bytes read instead of 128 read and
// written); recomputing g from a and b (160 bytes) would not pay. The
// producer then writes g alone.
// CHECK-LABEL: func @remat_reads_kept
// CHECK: %[[P:.*]] = forge.fusion "loop"(%arg0, %arg1) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[S:.*]] = forge.reduce_sum %[[P]]
// CHECK: forge.fusion "loop"(%[[S]], %arg2, %[[P]]) : (tensor<8xf32>, tensor<8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: ^bb0
// CHECK-NEXT: forge.mul
// CHECK-NEXT: forge.add
// OFF-LABEL: func @remat_reads_kept
// OFF: forge.fusion "loop"(%arg0, %arg1, %arg2) : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>)
func.func @remat_reads_kept(%a: tensor<2x8xf32>, %b: tensor<2x8xf32>, %c: tensor<8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  %g = forge.add %a, %b : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %gs = forge.mul %g, %c : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  %r = forge.reduce_sum %g {axes = array<i64: 0>, keepdims = false} : (tensor<2x8xf32>) -> tensor<8xf32>
  %y = forge.add %gs, %r : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  return %y, %g : tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// A state update that the rest of the step also reads (a batch norm's running
// mean, here through a sum) is no member of the optimizer's horizontal region,
// and as the first state update in program order it no longer keeps the
// independent parameter updates after it (which read it) apart.
// CHECK-LABEL: func @bn_state_first
// CHECK: %[[M:.*]] = forge.fusion "loop"(%arg4, %arg5)
// CHECK: %[[H:.*]]:2 = forge.fusion "horizontal"
// CHECK: return %[[H]]#0, %[[H]]#1, %[[M]]
func.func @bn_state_first(%p: tensor<8xf32>, %g: tensor<8xf32>, %q: tensor<4xf32>, %h: tensor<4xf32>, %rm: tensor<4xf32>, %lr: tensor<f32>) -> (tensor<8xf32> {forge.updates = "p"}, tensor<4xf32> {forge.updates = "q"}, tensor<4xf32> {forge.updates = "rm"}) {
  %rm1 = forge.mul %rm, %lr : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %rm2 = forge.add %rm1, %rm : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %n = forge.reduce_sum %rm2 {axes = array<i64: 0>, keepdims = false} : (tensor<4xf32>) -> tensor<f32>
  %s = forge.mul %g, %n : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %p2 = forge.sub %p, %s : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %t = forge.mul %h, %n : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %q2 = forge.sub %q, %t : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %p2, %q2, %rm2 : tensor<8xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Sibling fusion: two small loop regions of one shape that read a common input and do not
// depend on each other become one region at the later one's place (a batch norm's [C]
// coefficients beside its parameters' update); the reader of the first one's result that
// sat between them moves after the merged region.
// CHECK-LABEL: func @siblings
// CHECK: %[[M:.*]]:2 = forge.fusion "loop"(%arg0, %arg1, %arg2) : (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
// CHECK-NOT: forge.fusion "loop"
// CHECK: forge.reduce_sum %[[M]]#0
// CHECK: return
func.func @siblings(%a: tensor<8xf32>, %b: tensor<8xf32>, %c: tensor<8xf32>) -> (tensor<8xf32>, tensor<f32>) {
  %0 = forge.mul %a, %b : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %1 = forge.add %0, %b : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %n = forge.reduce_sum %1 {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
  %2 = forge.sub %a, %c : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %3 = forge.mul %2, %c : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %3, %n : tensor<8xf32>, tensor<f32>
}

// -----

// Sibling fusion takes at most two parameters' updates (6 state results) into one region:
// four updates of [8] parameters reading one gradient become a region of three and one of
// one, which the optimizer's horizontal region then gives their own blocks (one region
// doing GPT-2's 15 norm parameters in turn ran at 28 us a launch).
// CHECK-LABEL: func @state_siblings
// CHECK: forge.fusion "horizontal"
// CHECK-NEXT: ^bb0
// CHECK-NEXT: forge.fusion "loop"({{.*}}) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>)
// CHECK: forge.fusion "loop"({{.*}}) -> (tensor<8xf32>, tensor<8xf32>)
func.func @state_siblings(%w1: tensor<8xf32> {forge.kind = "parameter", forge.name = "w1"}, %w2: tensor<8xf32> {forge.kind = "parameter", forge.name = "w2"}, %w3: tensor<8xf32> {forge.kind = "parameter", forge.name = "w3"}, %w4: tensor<8xf32> {forge.kind = "parameter", forge.name = "w4"}, %m1: tensor<8xf32> {forge.kind = "state", forge.name = "m1"}, %m2: tensor<8xf32> {forge.kind = "state", forge.name = "m2"}, %m3: tensor<8xf32> {forge.kind = "state", forge.name = "m3"}, %m4: tensor<8xf32> {forge.kind = "state", forge.name = "m4"}, %g: tensor<8xf32>) -> (tensor<8xf32> {forge.updates = "w1"}, tensor<8xf32> {forge.updates = "m1"}, tensor<8xf32> {forge.updates = "w2"}, tensor<8xf32> {forge.updates = "m2"}, tensor<8xf32> {forge.updates = "w3"}, tensor<8xf32> {forge.updates = "m3"}, tensor<8xf32> {forge.updates = "w4"}, tensor<8xf32> {forge.updates = "m4"}) {
  %n1 = forge.add %m1, %g : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %v1 = forge.sub %w1, %n1 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %n2 = forge.add %m2, %g : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %v2 = forge.sub %w2, %n2 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %n3 = forge.add %m3, %g : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %v3 = forge.sub %w3, %n3 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %n4 = forge.add %m4, %g : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %v4 = forge.sub %w4, %n4 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %v1, %n1, %v2, %n2, %v3, %n3, %v4, %n4 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// Negative: the second region reads the first's result (through a sum), and regions over
// more than 64k elements stay apart however they relate.
// CHECK-LABEL: func @not_siblings
// CHECK-COUNT-4: forge.fusion "loop"
func.func @not_siblings(%a: tensor<8xf32>, %b: tensor<8xf32>, %x: tensor<256x512xf32>, %y: tensor<256x512xf32>) -> (tensor<8xf32>, tensor<256x512xf32>, tensor<256x512xf32>) {
  %0 = forge.mul %a, %b : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %1 = forge.add %0, %b : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %n = forge.reduce_sum %1 {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
  %2 = forge.mul %a, %n : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %3 = forge.add %2, %a : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %4 = forge.mul %x, %y : (tensor<256x512xf32>, tensor<256x512xf32>) -> tensor<256x512xf32>
  %5 = forge.add %4, %y : (tensor<256x512xf32>, tensor<256x512xf32>) -> tensor<256x512xf32>
  %6 = forge.sub %x, %y : (tensor<256x512xf32>, tensor<256x512xf32>) -> tensor<256x512xf32>
  %7 = forge.mul %6, %y : (tensor<256x512xf32>, tensor<256x512xf32>) -> tensor<256x512xf32>
  return %3, %5, %7 : tensor<8xf32>, tensor<256x512xf32>, tensor<256x512xf32>
}

// -----

// A ReLU's mask for the backward pass stays out of the forward region: the
// ReLU's output is written anyway (a reduction reads it), and the mask's reader
// must wait for that reduction, so the reader's region computes the mask from
// the output instead of the forward region writing an i1 mask kept until then.
// CHECK-LABEL: func @mask_stays_apart
// CHECK: %[[Y:.*]] = forge.fusion "loop"(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
// CHECK: %[[R:.*]] = forge.reduce_sum %[[Y]]
// CHECK: forge.fusion "loop"({{.*}}%[[Y]]{{.*}}) : ({{.*}}) -> tensor<4x8xf32>
// CHECK: forge.greater
// CHECK: forge.where
// CHECK-NOT: xi1>)
func.func @mask_stays_apart(%x: tensor<4x8xf32>, %s: tensor<8xf32>, %d: tensor<4x8xf32>) -> (tensor<8xf32>, tensor<4x8xf32>) {
  %zero = forge.constant dense<0.0> : tensor<f32>
  %a = forge.mul %x, %s : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %y = forge.relu %a : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %r = forge.reduce_sum %y {axes = array<i64: 0>, keepdims = false} : (tensor<4x8xf32>) -> tensor<8xf32>
  %t = forge.mul %d, %r : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %m = forge.greater %y, %zero : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xi1>
  %g = forge.where %m, %t, %zero : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  return %r, %g : tensor<8xf32>, tensor<4x8xf32>
}
