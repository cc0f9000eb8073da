// RUN: forge-opt %s --split-input-file --forge-rematerialize="recompute=attention" 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-rematerialize="recompute=attention" 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: forge-opt %s --split-input-file --forge-rematerialize 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not forge-opt %s --split-input-file --forge-rematerialize="recompute=everything" 2>&1 | FileCheck %s --check-prefix=BAD

// An unfused attention as the train step holds it (scores, scale, softmax,
// P V; the backward's dV = P^T dO, softmax_grad, dQ and dK): the scores'
// matmul, the scale and the softmax are cloned right before dV's matmul, the
// first backward reader, from Q, K and the constant; both backward readers
// read the clone, so the forward's P dies at P V.
// CHECK-LABEL: func @attention
// CHECK:      %[[S:.*]] = forge.matmul %arg0, %arg1 {transB = true}
// CHECK-NEXT: %[[M:.*]] = forge.mul %[[S]], %[[C:.*]] :
// CHECK-NEXT: %[[P:.*]] = forge.softmax %[[M]]
// CHECK-NEXT: forge.matmul %[[P]], %arg2 :
// CHECK-NEXT: forge.reduce_sum
// CHECK-NEXT: %[[S2:.*]] = forge.matmul %arg0, %arg1 {transB = true}
// CHECK-NEXT: %[[M2:.*]] = forge.mul %[[S2]], %[[C]] :
// CHECK-NEXT: %[[P2:.*]] = forge.softmax %[[M2]]
// CHECK-NEXT: forge.matmul %[[P2]], %arg3 {transA = true}
// CHECK-NEXT: %[[DP:.*]] = forge.matmul %arg3, %arg2 {transB = true}
// CHECK-NEXT: forge.softmax_grad %[[P2]], %[[DP]]
// CHECK-NOT: forge.softmax %
// REMARK: remark: forge-rematerialize: 1 attention probability recomputed in the backward pass (3 ops cloned); 128.0 B of forward values no longer kept until their backward reader
// NONE-NOT: remark
// NONE-LABEL: func @attention
// NONE-COUNT-1: forge.softmax %
// NONE-NOT: forge.softmax %
func.func @attention(%q: tensor<2x4x8xf32>, %k: tensor<2x4x8xf32>, %v: tensor<2x4x8xf32>, %do: tensor<2x4x8xf32>)
    -> (tensor<f32> {forge.name = "loss"}, tensor<2x4x8xf32> {forge.updates = "q"},
        tensor<2x4x8xf32> {forge.updates = "k"}, tensor<2x4x8xf32> {forge.updates = "v"}) {
  %c = forge.constant dense<0.5> : tensor<f32>
  %s = forge.matmul %q, %k {transB = true} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  %m = forge.mul %s, %c : (tensor<2x4x4xf32>, tensor<f32>) -> tensor<2x4x4xf32>
  %p = forge.softmax %m {axis = 2 : i64} : (tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %o = forge.matmul %p, %v : (tensor<2x4x4xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %l = forge.reduce_sum %o {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x8xf32>) -> tensor<f32>
  %dv = forge.matmul %p, %do {transA = true} : (tensor<2x4x4xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %dp = forge.matmul %do, %v {transB = true} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  %ds = forge.softmax_grad %p, %dp {axis = 2 : i64} : (tensor<2x4x4xf32>, tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %dm = forge.mul %ds, %c : (tensor<2x4x4xf32>, tensor<f32>) -> tensor<2x4x4xf32>
  %dq = forge.matmul %dm, %k : (tensor<2x4x4xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %dk = forge.matmul %dm, %q {transA = true} : (tensor<2x4x4xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %l, %dq, %dk, %dv : tensor<f32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>
}

// -----

// A leaf that nothing reads after the forward (Q scaled before the scores,
// the backward reading the unscaled Q): its producer joins the cone, so the
// scaled Q is not kept either.
// CHECK-LABEL: func @scaled_query
// NONE-LABEL: func @scaled_query
// CHECK:      forge.reduce_sum
// CHECK-NEXT: %[[QS:.*]] = forge.mul %arg0, %{{.*}} :
// CHECK-NEXT: %[[S:.*]] = forge.matmul %[[QS]], %arg1 {transB = true}
// CHECK-NEXT: %[[P:.*]] = forge.softmax %[[S]]
// CHECK-NEXT: forge.softmax_grad %[[P]], %arg2
// REMARK: remark: forge-rematerialize: 1 attention probability recomputed in the backward pass (3 ops cloned)
func.func @scaled_query(%q: tensor<2x4x8xf32>, %k: tensor<2x4x8xf32>, %dp: tensor<2x4x4xf32>)
    -> (tensor<f32> {forge.name = "loss"}, tensor<2x4x4xf32> {forge.updates = "q"}) {
  %c = forge.constant dense<0.125> : tensor<f32>
  %qs = forge.mul %q, %c : (tensor<2x4x8xf32>, tensor<f32>) -> tensor<2x4x8xf32>
  %s = forge.matmul %qs, %k {transB = true} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  %p = forge.softmax %s {axis = 2 : i64} : (tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %l = forge.reduce_sum %p {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4xf32>) -> tensor<f32>
  %ds = forge.softmax_grad %p, %dp {axis = 2 : i64} : (tensor<2x4x4xf32>, tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  return %l, %ds : tensor<f32>, tensor<2x4x4xf32>
}

// -----

// Negative: the probabilities are also a result of the routine (kept anyway).
// CHECK-LABEL: func @returned
// CHECK-COUNT-1: forge.softmax %
// CHECK-NOT: forge.softmax %
// REMARK: remark: forge-rematerialize: nothing to recompute for --recompute attention
func.func @returned(%q: tensor<2x4x8xf32>, %k: tensor<2x4x8xf32>, %dp: tensor<2x4x4xf32>)
    -> (tensor<f32> {forge.name = "loss"}, tensor<2x4x4xf32> {forge.updates = "q"}, tensor<2x4x4xf32>) {
  %s = forge.matmul %q, %k {transB = true} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  %p = forge.softmax %s {axis = 2 : i64} : (tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %l = forge.reduce_sum %p {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4xf32>) -> tensor<f32>
  %ds = forge.softmax_grad %p, %dp {axis = 2 : i64} : (tensor<2x4x4xf32>, tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  return %l, %ds, %p : tensor<f32>, tensor<2x4x4xf32>, tensor<2x4x4xf32>
}

// -----

// Negative: a softmax of no matmul's scores (a classifier's probabilities)
// is not attention.
// CHECK-LABEL: func @no_scores
// CHECK-COUNT-1: forge.softmax %
// CHECK-NOT: forge.softmax %
// REMARK: remark: forge-rematerialize: nothing to recompute
func.func @no_scores(%x: tensor<4x4xf32>, %dp: tensor<4x4xf32>)
    -> (tensor<f32> {forge.name = "loss"}, tensor<4x4xf32> {forge.updates = "x"}) {
  %c = forge.constant dense<2.0> : tensor<f32>
  %m = forge.mul %x, %c : (tensor<4x4xf32>, tensor<f32>) -> tensor<4x4xf32>
  %p = forge.softmax %m {axis = 1 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %l = forge.reduce_sum %p {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x4xf32>) -> tensor<f32>
  %ds = forge.softmax_grad %p, %dp {axis = 1 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %l, %ds : tensor<f32>, tensor<4x4xf32>
}

// -----

// Negative: the scores' cone holds two matmuls (Q projected from X, and the
// projection is not kept for the backward pass): one library call at most.
// CHECK-LABEL: func @two_matmuls
// CHECK-COUNT-1: forge.softmax %
// CHECK-NOT: forge.softmax %
// REMARK: remark: forge-rematerialize: nothing to recompute
func.func @two_matmuls(%x: tensor<2x4x8xf32>, %w: tensor<8x8xf32>, %k: tensor<2x4x8xf32>, %dp: tensor<2x4x4xf32>)
    -> (tensor<f32> {forge.name = "loss"}, tensor<2x4x4xf32> {forge.updates = "w"}) {
  %q = forge.matmul %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %s = forge.matmul %q, %k {transB = true} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  %p = forge.softmax %s {axis = 2 : i64} : (tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %l = forge.reduce_sum %p {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4xf32>) -> tensor<f32>
  %ds = forge.softmax_grad %p, %dp {axis = 2 : i64} : (tensor<2x4x4xf32>, tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  return %l, %ds : tensor<f32>, tensor<2x4x4xf32>
}

// -----

// Negative: a routine that updates nothing (@eval) has no backward pass: no
// clone and no remark.
// CHECK-LABEL: func @eval
// CHECK-COUNT-1: forge.softmax %
// CHECK-NOT: forge.softmax %
// REMARK-NOT: remark
func.func @eval(%q: tensor<2x4x8xf32>, %k: tensor<2x4x8xf32>) -> (tensor<f32> {forge.name = "loss"}, tensor<2x4x4xf32>) {
  %s = forge.matmul %q, %k {transB = true} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  %p = forge.softmax %s {axis = 2 : i64} : (tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %l = forge.reduce_sum %p {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4xf32>) -> tensor<f32>
  return %l, %p : tensor<f32>, tensor<2x4x4xf32>
}

// BAD: error: forge-rematerialize: unknown recompute policy 'everything' (none | attention)
