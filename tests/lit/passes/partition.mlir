// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-partition="bucket-bytes=330" | FileCheck %s
// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-partition="bucket-bytes=0" | FileCheck %s --check-prefix=EACH
// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-partition | FileCheck %s --check-prefix=ONE

// A backward pass as forge-build-train-step leaves it with --dp 2: one
// all_reduce after everything. The step makes the loss (4 B) first, then the
// last layer's gradients %g2 (256 B) and %b2 (64 B), then %g1 (256 B) and %b1
// (64 B). With 330-byte buckets: [loss, g2, b2] right after b2 is made, [g1,
// b1] after b1; every reader gets the same averaged value as before.
// CHECK-LABEL: func @buckets
// CHECK: %[[LOSS:.*]] = forge.reduce_mean
// CHECK-NEXT: %[[G2:.*]] = forge.matmul %arg1, %arg2
// CHECK-NEXT: %[[B2:.*]] = forge.reduce_sum %arg2
// CHECK-NEXT: %[[R1:.*]]:3 = forge.all_reduce %[[LOSS]], %[[G2]], %[[B2]] {group = "dp", reduction = "mean", size = 2 : i64}
// CHECK-NEXT: %[[G1:.*]] = forge.matmul %arg0, %arg3
// CHECK-NEXT: %[[B1:.*]] = forge.reduce_sum %arg3
// CHECK-NEXT: %[[R2:.*]]:2 = forge.all_reduce %[[G1]], %[[B1]] {group = "dp", reduction = "mean", size = 2 : i64}
// CHECK-NOT: forge.all_reduce
// CHECK: return %[[R2]]#1, %[[R2]]#0, %[[R1]]#2, %[[R1]]#1, %[[R1]]#0
// bucket-bytes=0: one per tensor, each right after its operand.
// EACH-LABEL: func @buckets
// EACH: forge.reduce_mean
// EACH-NEXT: forge.all_reduce
// EACH-NEXT: forge.matmul %arg1
// EACH-NEXT: forge.all_reduce
// EACH-NEXT: forge.reduce_sum %arg2
// EACH-NEXT: forge.all_reduce
// EACH-NEXT: forge.matmul %arg0
// EACH-NEXT: forge.all_reduce
// EACH-NEXT: forge.reduce_sum %arg3
// EACH-NEXT: forge.all_reduce
// EACH-NOT: forge.all_reduce
// The default (25 MiB): these tensors fit one bucket, after the last of them.
// ONE-LABEL: func @buckets
// ONE: forge.reduce_sum %arg3
// ONE-NEXT: forge.all_reduce %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "dp"
// ONE-NOT: forge.all_reduce
func.func @buckets(%x: tensor<4x16xf32>, %h: tensor<4x8xf32>, %dy: tensor<8x16xf32>,
                   %dh: tensor<16x16xf32>)
    -> (tensor<16xf32>, tensor<4x16xf32>, tensor<16xf32>, tensor<4x16xf32>, tensor<f32>) {
  %loss = forge.reduce_mean %h {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<f32>
  %g2 = forge.matmul %h, %dy : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  %b2 = forge.reduce_sum %dy {axes = array<i64: 0>, keepdims = false} : (tensor<8x16xf32>) -> tensor<16xf32>
  %g1 = forge.matmul %x, %dh : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
  %b1 = forge.reduce_sum %dh {axes = array<i64: 0>, keepdims = false} : (tensor<16x16xf32>) -> tensor<16xf32>
  %r:5 = forge.all_reduce %b1, %g1, %b2, %g2, %loss {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<16xf32>, tensor<4x16xf32>, tensor<16xf32>, tensor<4x16xf32>, tensor<f32>) -> (tensor<16xf32>, tensor<4x16xf32>, tensor<16xf32>, tensor<4x16xf32>, tensor<f32>)
  return %r#0, %r#1, %r#2, %r#3, %r#4 : tensor<16xf32>, tensor<4x16xf32>, tensor<16xf32>, tensor<4x16xf32>, tensor<f32>
}

// -----

// Without data parallelism there is nothing to split.
// CHECK-LABEL: func @none
// CHECK-NOT: forge.all_reduce
func.func @none(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = forge.add %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @bad_types(%x: tensor<4xf32>) -> tensor<4xbf16> {
  // expected-error @+1 {{result 0 is 'tensor<4xbf16>', operand 0 is 'tensor<4xf32>'}}
  %r = forge.all_reduce %x {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  return %r : tensor<4xbf16>
}

// -----

func.func @bad_reduction(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{reduction 'min' is not 'sum', 'mean' or 'max'}}
  %r = forge.all_reduce %x {group = "dp", reduction = "min", size = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

// ZeRO-1: the train step leaves each gradient's reduce_scatter after the whole
// backward pass; each moves right after its gradient, in production order.
// CHECK-LABEL: func @zero
// CHECK: %[[G2:.*]] = forge.matmul %arg1, %arg2
// CHECK-NEXT: forge.reduce_scatter %[[G2]]
// CHECK-NEXT: %[[G1:.*]] = forge.matmul %arg0, %arg3
// CHECK-NEXT: forge.reduce_scatter %[[G1]]
func.func @zero(%h: tensor<16x4xf32>, %x: tensor<16x4xf32>, %d2: tensor<16x4xf32>, %d1: tensor<16x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  %g2 = forge.matmul %x, %d2 {transA = true} : (tensor<16x4xf32>, tensor<16x4xf32>) -> tensor<4x4xf32>
  %g1 = forge.matmul %h, %d1 {transA = true} : (tensor<16x4xf32>, tensor<16x4xf32>) -> tensor<4x4xf32>
  %r2 = forge.reduce_scatter %g2 {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<4x4xf32>) -> tensor<2x4xf32>
  %r1 = forge.reduce_scatter %g1 {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<4x4xf32>) -> tensor<2x4xf32>
  return %r1, %r2 : tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

// fp8 delayed scaling's max over the ranks (forge-assign-precision): its
// buckets keep the reduction; the two amaxes (8 bytes) share one, issued
// after the later one is made.
// CHECK-LABEL: func @amax_max
// CHECK: %[[A:.*]] = forge.reduce_max %arg0
// CHECK-NEXT: %[[B:.*]] = forge.reduce_max %arg1
// CHECK-NEXT: %[[M:.*]]:2 = forge.all_reduce %[[A]], %[[B]] {group = "dp", reduction = "max", size = 2 : i64}
// CHECK-NOT: forge.all_reduce
// CHECK: return %[[M]]#0, %[[M]]#1
// EACH-LABEL: func @amax_max
// EACH: forge.reduce_max %arg0
// EACH-NEXT: forge.all_reduce {{.*}} {group = "dp", reduction = "max", size = 2 : i64}
// EACH-NEXT: forge.reduce_max %arg1
// EACH-NEXT: forge.all_reduce {{.*}} {group = "dp", reduction = "max", size = 2 : i64}
// ONE-LABEL: func @amax_max
// ONE: forge.reduce_max %arg1
// ONE-NEXT: forge.all_reduce %{{.*}}, %{{.*}} {group = "dp", reduction = "max"
func.func @amax_max(%x: tensor<4x16xf32>, %y: tensor<4x8xf32>) -> (tensor<f32>, tensor<f32>) {
  %a = forge.reduce_max %x {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x16xf32>) -> tensor<f32>
  %b = forge.reduce_max %y {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<f32>
  %m:2 = forge.all_reduce %a, %b {group = "dp", reduction = "max", size = 2 : i64} : (tensor<f32>, tensor<f32>) -> (tensor<f32>, tensor<f32>)
  return %m#0, %m#1 : tensor<f32>, tensor<f32>
}
