// RUN: forge-opt %s --split-input-file --forge-merge-reductions | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-merge-reductions | forge-opt --split-input-file --verify-each > /dev/null
// RUN: forge-opt %s --split-input-file --forge-merge-reductions="max-horizontal-operands=8" | FileCheck %s --check-prefix=LIMIT

// The loss's sum and a gradient's squared norm, read only by the optimizer's
// late scalar members (the loss's mean, the norm's square root): the
// multi_reduce region becomes the horizontal region's first member, its sums
// yielded first; the readers read them inside; the update and the mean keep
// their other operands (the count, a repeated argument).
// CHECK-LABEL: func @merged
// CHECK-NOT: forge.fusion "multi_reduce"(
// CHECK: %[[H:.*]]:5 = forge.fusion "horizontal"(%arg0, %arg1, %arg2, %arg1, %arg3)
// CHECK-SAME: -> (tensor<f32>, tensor<f32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
// CHECK-NEXT: ^bb0(%[[L:.*]]: tensor<8xf32>, %[[G:.*]]: tensor<64xf32>, %[[P:.*]]: tensor<64xf32>, %[[G2:.*]]: tensor<64xf32>, %[[N:.*]]: tensor<f32>):
// CHECK-NEXT: %[[S:.*]]:2 = forge.fusion "multi_reduce"(%[[L]], %[[G]])
// CHECK: forge.fusion "loop"(%[[P]], %[[G2]])
// CHECK: forge.fusion "loop"(%[[S]]#0, %[[N]])
// CHECK: forge.fusion "loop"(%[[S]]#1)
// CHECK: forge.yield %[[S]]#0, %[[S]]#1,
// CHECK: return %[[H]]#2, %[[H]]#3, %[[H]]#4
// LIMIT-LABEL: func @merged
// LIMIT: forge.fusion "multi_reduce"(%arg0, %arg1)
// LIMIT: forge.fusion "horizontal"(%arg2, %arg1, %{{.*}}#0, %arg3, %{{.*}}#1)
func.func @merged(%loss: tensor<8xf32>, %g: tensor<64xf32>, %p: tensor<64xf32>, %n: tensor<f32>) -> (tensor<64xf32>, tensor<f32>, tensor<f32>) {
  %s:2 = forge.fusion "multi_reduce"(%loss, %g) : (tensor<8xf32>, tensor<64xf32>) -> (tensor<f32>, tensor<f32>) {
  ^bb0(%a: tensor<8xf32>, %b: tensor<64xf32>):
    %t = forge.reduce_sum %a {axes = array<i64: 0>, keepdims = false} : (tensor<8xf32>) -> tensor<f32>
    %q = forge.mul %b, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %u = forge.reduce_sum %q {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
    forge.yield %t, %u : tensor<f32>, tensor<f32>
  }
  %h:3 = forge.fusion "horizontal"(%p, %g, %s#0, %n, %s#1) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<f32>, tensor<f32>) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>, %c: tensor<f32>, %d: tensor<f32>, %e: tensor<f32>):
    %upd = forge.fusion "loop"(%a, %b) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32> {
    ^bb0(%x: tensor<64xf32>, %y: tensor<64xf32>):
      %m = forge.sub %x, %y : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
      forge.yield %m : tensor<64xf32>
    }
    %mean = forge.fusion "loop"(%c, %d) : (tensor<f32>, tensor<f32>) -> tensor<f32> {
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %m = forge.div %x, %y : (tensor<f32>, tensor<f32>) -> tensor<f32>
      forge.yield %m : tensor<f32>
    }
    %norm = forge.fusion "loop"(%e) : (tensor<f32>) -> tensor<f32> {
    ^bb0(%x: tensor<f32>):
      %m = forge.sqrt %x : (tensor<f32>) -> tensor<f32>
      forge.yield %m : tensor<f32>
    }
    forge.yield %upd, %mean, %norm : tensor<64xf32>, tensor<f32>, tensor<f32>
  }
  return %h#0, %h#1, %h#2 : tensor<64xf32>, tensor<f32>, tensor<f32>
}

// -----

// Not: the update reads the norm (a clip scale): the sums must be complete
// before any update, so they keep their launch.
// CHECK-LABEL: func @clipped
// CHECK: %[[S:.*]] = forge.fusion "multi_reduce"
// CHECK: forge.fusion "horizontal"(%arg1, %arg0, %[[S]], %[[S]])
func.func @clipped(%g: tensor<64xf32>, %p: tensor<64xf32>) -> (tensor<64xf32>, tensor<f32>) {
  %s = forge.fusion "multi_reduce"(%g) : (tensor<64xf32>) -> tensor<f32> {
  ^bb0(%b: tensor<64xf32>):
    %q = forge.mul %b, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %u = forge.reduce_sum %q {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
    forge.yield %u : tensor<f32>
  }
  %h:2 = forge.fusion "horizontal"(%p, %g, %s, %s) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<f32>) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>, %c: tensor<f32>, %e: tensor<f32>):
    %upd = forge.fusion "loop"(%a, %b, %c) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>) -> tensor<64xf32> {
    ^bb0(%x: tensor<64xf32>, %y: tensor<64xf32>, %z: tensor<f32>):
      %m = forge.mul %y, %z : (tensor<64xf32>, tensor<f32>) -> tensor<64xf32>
      %k = forge.sub %x, %m : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
      forge.yield %k : tensor<64xf32>
    }
    %norm = forge.fusion "loop"(%e) : (tensor<f32>) -> tensor<f32> {
    ^bb0(%x: tensor<f32>):
      %m = forge.sqrt %x : (tensor<f32>) -> tensor<f32>
      forge.yield %m : tensor<f32>
    }
    forge.yield %upd, %norm : tensor<64xf32>, tensor<f32>
  }
  return %h#0, %h#1 : tensor<64xf32>, tensor<f32>
}

// -----

// Not: the routine returns a sum too (another reader), and a sum that only
// an op outside any region reads.
// CHECK-LABEL: func @other_readers
// CHECK: %[[S:.*]] = forge.fusion "multi_reduce"
// CHECK: forge.fusion "horizontal"(%arg1, %arg0, %[[S]])
// CHECK: %[[T:.*]] = forge.fusion "multi_reduce"
// CHECK: forge.sqrt %[[T]]
func.func @other_readers(%g: tensor<64xf32>, %p: tensor<64xf32>) -> (tensor<64xf32>, tensor<f32>, tensor<f32>, tensor<f32>) {
  %s = forge.fusion "multi_reduce"(%g) : (tensor<64xf32>) -> tensor<f32> {
  ^bb0(%b: tensor<64xf32>):
    %u = forge.reduce_sum %b {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
    forge.yield %u : tensor<f32>
  }
  %h:2 = forge.fusion "horizontal"(%p, %g, %s) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>) -> (tensor<64xf32>, tensor<f32>) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>, %e: tensor<f32>):
    %upd = forge.fusion "loop"(%a, %b) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32> {
    ^bb0(%x: tensor<64xf32>, %y: tensor<64xf32>):
      %k = forge.sub %x, %y : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
      forge.yield %k : tensor<64xf32>
    }
    %norm = forge.fusion "loop"(%e) : (tensor<f32>) -> tensor<f32> {
    ^bb0(%x: tensor<f32>):
      %m = forge.sqrt %x : (tensor<f32>) -> tensor<f32>
      forge.yield %m : tensor<f32>
    }
    forge.yield %upd, %norm : tensor<64xf32>, tensor<f32>
  }
  %t = forge.fusion "multi_reduce"(%p) : (tensor<64xf32>) -> tensor<f32> {
  ^bb0(%b: tensor<64xf32>):
    %u = forge.reduce_sum %b {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
    forge.yield %u : tensor<f32>
  }
  %r = forge.sqrt %t : (tensor<f32>) -> tensor<f32>
  return %h#0, %h#1, %s, %r : tensor<64xf32>, tensor<f32>, tensor<f32>, tensor<f32>
}

// -----

// Not: no f32 result among the readers to count the blocks' arrival in (an
// f16 mean: two bytes).
// CHECK-LABEL: func @no_counter
// CHECK: forge.fusion "multi_reduce"
// CHECK: forge.fusion "horizontal"
func.func @no_counter(%g: tensor<64xf32>, %p: tensor<64xf32>) -> (tensor<64xf32>, tensor<f16>) {
  %s = forge.fusion "multi_reduce"(%g) : (tensor<64xf32>) -> tensor<f32> {
  ^bb0(%b: tensor<64xf32>):
    %u = forge.reduce_sum %b {axes = array<i64: 0>, keepdims = false} : (tensor<64xf32>) -> tensor<f32>
    forge.yield %u : tensor<f32>
  }
  %h:2 = forge.fusion "horizontal"(%p, %g, %s) : (tensor<64xf32>, tensor<64xf32>, tensor<f32>) -> (tensor<64xf32>, tensor<f16>) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>, %e: tensor<f32>):
    %upd = forge.fusion "loop"(%a, %b) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32> {
    ^bb0(%x: tensor<64xf32>, %y: tensor<64xf32>):
      %k = forge.sub %x, %y : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
      forge.yield %k : tensor<64xf32>
    }
    %half = forge.fusion "loop"(%e) : (tensor<f32>) -> tensor<f16> {
    ^bb0(%x: tensor<f32>):
      %m = forge.cast %x {to = f16} : (tensor<f32>) -> tensor<f16>
      forge.yield %m : tensor<f16>
    }
    forge.yield %upd, %half : tensor<64xf32>, tensor<f16>
  }
  return %h#0, %h#1 : tensor<64xf32>, tensor<f16>
}
