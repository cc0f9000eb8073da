// RUN: forge-opt %s --split-input-file --forge-fuse | FileCheck %s
// The regions print and parse back (the verifier accepts what the pass makes).
// RUN: forge-opt %s --split-input-file --forge-fuse | forge-opt --split-input-file --verify-each > /dev/null

// A channels-last batch norm's statistics: the column sums of x - k and of its square read
// one input, so they become one column_reduce region that recomputes x - k per element
// (nothing of the image's size is written).
// CHECK-LABEL: func @bn_stats
// CHECK: %[[R:.*]]:2 = forge.fusion "column_reduce"(%arg0, %arg1)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: forge.sub
// CHECK-NEXT: forge.reduce_sum
// CHECK-NEXT: forge.mul
// CHECK-NEXT: forge.reduce_sum
// CHECK-NEXT: forge.yield
// CHECK: return %[[R]]#0, %[[R]]#1
func.func @bn_stats(%x: tensor<2x4x4x8xf32>, %k: tensor<1x1x1x8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %s = forge.sub %x, %k : (tensor<2x4x4x8xf32>, tensor<1x1x1x8xf32>) -> tensor<2x4x4x8xf32>
  %a = forge.reduce_sum %s {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  %q = forge.mul %s, %s : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %b = forge.reduce_sum %q {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  return %a, %b : tensor<8xf32>, tensor<8xf32>
}

// -----

// Its gradient: sum(dy) and sum(dy * (x - k)) with dy a ReLU's masked gradient. dy is also
// read by the input gradient's pointwise ops, so the region recomputes it and the original
// stays for that reader; the sum of the first result's users move after the region.
// CHECK-LABEL: func @bn_grad_sums
// CHECK: forge.fusion "column_reduce"(%arg0, %arg1, %arg2, %arg3, %arg4)
// CHECK: forge.where
// CHECK: forge.reduce_sum
// CHECK: forge.sub
// CHECK: forge.mul
// CHECK: forge.reduce_sum
// CHECK: forge.fusion "loop"
func.func @bn_grad_sums(%m: tensor<2x4x4x8xi1>, %g: tensor<2x4x4x8xf32>, %z: tensor<f32>, %x: tensor<2x4x4x8xf32>, %k: tensor<1x1x1x8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<2x4x4x8xf32>) {
  %dy = forge.where %m, %g, %z : (tensor<2x4x4x8xi1>, tensor<2x4x4x8xf32>, tensor<f32>) -> tensor<2x4x4x8xf32>
  %a = forge.reduce_sum %dy {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  %h = forge.mul %a, %a : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %s = forge.sub %x, %k : (tensor<2x4x4x8xf32>, tensor<1x1x1x8xf32>) -> tensor<2x4x4x8xf32>
  %p = forge.mul %dy, %s : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %b = forge.reduce_sum %p {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  %dx = forge.mul %dy, %h : (tensor<2x4x4x8xf32>, tensor<8xf32>) -> tensor<2x4x4x8xf32>
  return %h, %b, %dx : tensor<8xf32>, tensor<8xf32>, tensor<2x4x4x8xf32>
}

// -----

// Negative: column sums of different shapes, or of inputs without a common leaf, stay
// apart; a lone column sum is no region; a sum over other axes is no column sum.
// CHECK-LABEL: func @apart
// CHECK-NOT: column_reduce
// CHECK: return
func.func @apart(%x: tensor<2x4x4x8xf32>, %y: tensor<2x4x4x8xf32>, %w: tensor<4x8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<2x8xf32>) {
  %xx = forge.mul %x, %x : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %a = forge.reduce_sum %xx {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  %yy = forge.mul %y, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %b = forge.reduce_sum %yy {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  %c = forge.reduce_sum %w {axes = array<i64: 0>, keepdims = false} : (tensor<4x8xf32>) -> tensor<8xf32>
  %d = forge.reduce_sum %x {axes = array<i64: 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<2x8xf32>
  return %a, %b, %c, %d : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<2x8xf32>
}

// -----

// A residual network's gradient: g is masked from a chain of more pointwise ops than a
// prologue recomputes (12), and other ops read g (here the return). The sums then read g
// itself, and the mask's input t (returned: written anyway) is no reason to recompute
// it: one region reads g, x and k, and g * (x - k) is never written.
// CHECK-LABEL: func @pruned_grad_sums
// CHECK: %[[L:.*]]:2 = forge.fusion "loop"
// CHECK: %[[R:.*]]:2 = forge.fusion "column_reduce"(%[[L]]#1, %arg3, %arg4) : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>, tensor<1x1x1x8xf32>)
// CHECK-NEXT: ^bb0(%[[G:.*]]: tensor<2x4x4x8xf32>, %[[X:.*]]: tensor<2x4x4x8xf32>, %[[K:.*]]: tensor<1x1x1x8xf32>):
// CHECK-NEXT: forge.reduce_sum %[[G]]
// CHECK-NEXT: %[[S:.*]] = forge.sub %[[X]], %[[K]]
// CHECK-NEXT: %[[P:.*]] = forge.mul %[[G]], %[[S]]
// CHECK-NEXT: forge.reduce_sum %[[P]]
// CHECK-NEXT: forge.yield
// CHECK: return %[[R]]#0, %[[R]]#1, %[[L]]#1, %[[L]]#0
func.func @pruned_grad_sums(%m: tensor<2x4x4x8xi1>, %y: tensor<2x4x4x8xf32>, %z: tensor<f32>, %x: tensor<2x4x4x8xf32>, %k: tensor<1x1x1x8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) {
  %t1 = forge.add %y, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t2 = forge.add %t1, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t3 = forge.add %t2, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t4 = forge.add %t3, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t5 = forge.add %t4, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t6 = forge.add %t5, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t7 = forge.add %t6, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t8 = forge.add %t7, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t9 = forge.add %t8, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t10 = forge.add %t9, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t11 = forge.add %t10, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t12 = forge.add %t11, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %t13 = forge.add %t12, %y : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %g = forge.where %m, %t13, %z : (tensor<2x4x4x8xi1>, tensor<2x4x4x8xf32>, tensor<f32>) -> tensor<2x4x4x8xf32>
  %a = forge.reduce_sum %g {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  %s = forge.sub %x, %k : (tensor<2x4x4x8xf32>, tensor<1x1x1x8xf32>) -> tensor<2x4x4x8xf32>
  %p = forge.mul %g, %s : (tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x4x8xf32>
  %b = forge.reduce_sum %p {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4x8xf32>) -> tensor<8xf32>
  return %a, %b, %g, %t13 : tensor<8xf32>, tensor<8xf32>, tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>
}
