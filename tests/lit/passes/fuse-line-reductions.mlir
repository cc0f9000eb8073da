// RUN: forge-opt %s --split-input-file --forge-fuse-line-reductions 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-fuse-line-reductions 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// dk's centring as bf16 training leaves it (LibraryGradients.cpp): the f32 mean of the bf16
// dk over the keys (axis 1 of [B, T, H, D]) and a loop region of dk and that mean. One
// "lines" region of dk: the mean over its argument first, then the loop's body.
// CHECK-LABEL: func @centring
// CHECK: %[[R:.+]] = forge.fusion "lines"(%arg0) : (tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xbf16> {
// CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<2x8x4x16xbf16>):
// CHECK-NEXT: %[[M:.+]] = forge.reduce_mean %[[A]] {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x4x16xbf16>) -> tensor<2x1x4x16xf32>
// CHECK-NEXT: %[[C:.+]] = forge.cast %[[A]] {to = f32}
// CHECK-NEXT: %[[S:.+]] = forge.sub %[[C]], %[[M]]
// CHECK-NEXT: forge.yield %[[S]]
// CHECK: return %[[R]]
// CHECK-NOT: forge.fusion "loop"
// REMARK: forge-fuse-line-reductions: 1 reduction(s) over a middle axis in the region reading them
func.func @centring(%dk: tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xbf16> {
  %m = forge.reduce_mean %dk {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x4x16xbf16>) -> tensor<2x1x4x16xf32>
  %c = forge.fusion "loop"(%dk, %m) : (tensor<2x8x4x16xbf16>, tensor<2x1x4x16xf32>) -> tensor<2x8x4x16xbf16> {
  ^bb0(%a: tensor<2x8x4x16xbf16>, %b: tensor<2x1x4x16xf32>):
    %0 = forge.cast %a {to = f32} : (tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xf32>
    %1 = forge.sub %0, %b : (tensor<2x8x4x16xf32>, tensor<2x1x4x16xf32>) -> tensor<2x8x4x16xbf16>
    forge.yield %1 : tensor<2x8x4x16xbf16>
  }
  return %c : tensor<2x8x4x16xbf16>
}

// -----

// In f32 the sub is a lone op (forge-fuse leaves those unwrapped): it becomes a loop region
// first, then joins the sum (here reduce_sum, the loop's inputs in the other order).
// CHECK-LABEL: func @lone_sub
// CHECK: forge.fusion "lines"(%arg0) : (tensor<3x5x32xf32>) -> tensor<3x5x32xf32>
// CHECK: forge.reduce_sum %{{.+}} {axes = array<i64: 1>, keepdims = true}
// CHECK: forge.sub
// CHECK-NOT: forge.fusion "loop"
// REMARK: forge-fuse-line-reductions: 1 reduction(s)
func.func @lone_sub(%x: tensor<3x5x32xf32>) -> tensor<3x5x32xf32> {
  %s = forge.reduce_sum %x {axes = array<i64: 1>, keepdims = true} : (tensor<3x5x32xf32>) -> tensor<3x1x32xf32>
  %d = forge.sub %s, %x : (tensor<3x1x32xf32>, tensor<3x5x32xf32>) -> tensor<3x5x32xf32>
  return %d : tensor<3x5x32xf32>
}

// -----

// Negative, one function per reason the pair stays as it was:
//   a mean the return reads too (two readers: it must be stored);
//   a mean over the innermost axis (a row: forge-fuse's row regions);
//   lines of 16 columns (not whole warps of 32: the kernel has no form for them);
//   a loop reading a third tensor;
//   a loop of two results;
//   a mean kept in bf16 (the kernel adds in f32 and gives the body f32);
//   a mean of a different tensor than the loop reads.
// CHECK-LABEL: func @two_readers
// CHECK-NOT: "lines"
// CHECK-LABEL: func @innermost
// CHECK-NOT: "lines"
// CHECK-LABEL: func @narrow
// CHECK-NOT: "lines"
// CHECK-LABEL: func @third_input
// CHECK-NOT: "lines"
// CHECK-LABEL: func @two_results
// CHECK-NOT: "lines"
// CHECK-LABEL: func @low_mean
// CHECK-NOT: "lines"
// CHECK-LABEL: func @other_tensor
// CHECK-NOT: "lines"
// REMARK-NOT: forge-fuse-line-reductions
func.func @two_readers(%x: tensor<2x8x32xf32>) -> (tensor<2x8x32xf32>, tensor<2x1x32xf32>) {
  %m = forge.reduce_mean %x {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x1x32xf32>
  %c = forge.fusion "loop"(%x, %m) : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32> {
  ^bb0(%a: tensor<2x8x32xf32>, %b: tensor<2x1x32xf32>):
    %0 = forge.sub %a, %b : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32>
    forge.yield %0 : tensor<2x8x32xf32>
  }
  return %c, %m : tensor<2x8x32xf32>, tensor<2x1x32xf32>
}
func.func @innermost(%x: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  %m = forge.reduce_mean %x {axes = array<i64: 2>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x8x1xf32>
  %c = forge.fusion "loop"(%x, %m) : (tensor<2x8x32xf32>, tensor<2x8x1xf32>) -> tensor<2x8x32xf32> {
  ^bb0(%a: tensor<2x8x32xf32>, %b: tensor<2x8x1xf32>):
    %0 = forge.sub %a, %b : (tensor<2x8x32xf32>, tensor<2x8x1xf32>) -> tensor<2x8x32xf32>
    forge.yield %0 : tensor<2x8x32xf32>
  }
  return %c : tensor<2x8x32xf32>
}
func.func @narrow(%x: tensor<2x8x16xf32>) -> tensor<2x8x16xf32> {
  %m = forge.reduce_mean %x {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x16xf32>) -> tensor<2x1x16xf32>
  %c = forge.fusion "loop"(%x, %m) : (tensor<2x8x16xf32>, tensor<2x1x16xf32>) -> tensor<2x8x16xf32> {
  ^bb0(%a: tensor<2x8x16xf32>, %b: tensor<2x1x16xf32>):
    %0 = forge.sub %a, %b : (tensor<2x8x16xf32>, tensor<2x1x16xf32>) -> tensor<2x8x16xf32>
    forge.yield %0 : tensor<2x8x16xf32>
  }
  return %c : tensor<2x8x16xf32>
}
func.func @third_input(%x: tensor<2x8x32xf32>, %y: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  %m = forge.reduce_mean %x {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x1x32xf32>
  %c = forge.fusion "loop"(%x, %m, %y) : (tensor<2x8x32xf32>, tensor<2x1x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  ^bb0(%a: tensor<2x8x32xf32>, %b: tensor<2x1x32xf32>, %e: tensor<2x8x32xf32>):
    %0 = forge.sub %a, %b : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32>
    %1 = forge.mul %0, %e : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
    forge.yield %1 : tensor<2x8x32xf32>
  }
  return %c : tensor<2x8x32xf32>
}
func.func @two_results(%x: tensor<2x8x32xf32>) -> (tensor<2x8x32xf32>, tensor<2x8x32xf32>) {
  %m = forge.reduce_mean %x {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x1x32xf32>
  %c:2 = forge.fusion "loop"(%x, %m) : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> (tensor<2x8x32xf32>, tensor<2x8x32xf32>) {
  ^bb0(%a: tensor<2x8x32xf32>, %b: tensor<2x1x32xf32>):
    %0 = forge.sub %a, %b : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32>
    %1 = forge.mul %0, %0 : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
    forge.yield %0, %1 : tensor<2x8x32xf32>, tensor<2x8x32xf32>
  }
  return %c#0, %c#1 : tensor<2x8x32xf32>, tensor<2x8x32xf32>
}
func.func @low_mean(%x: tensor<2x8x32xbf16>) -> tensor<2x8x32xbf16> {
  %m = forge.reduce_mean %x {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xbf16>) -> tensor<2x1x32xbf16>
  %c = forge.fusion "loop"(%x, %m) : (tensor<2x8x32xbf16>, tensor<2x1x32xbf16>) -> tensor<2x8x32xbf16> {
  ^bb0(%a: tensor<2x8x32xbf16>, %b: tensor<2x1x32xbf16>):
    %0 = forge.sub %a, %b : (tensor<2x8x32xbf16>, tensor<2x1x32xbf16>) -> tensor<2x8x32xbf16>
    forge.yield %0 : tensor<2x8x32xbf16>
  }
  return %c : tensor<2x8x32xbf16>
}
func.func @other_tensor(%x: tensor<2x8x32xf32>, %y: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  %m = forge.reduce_mean %y {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x1x32xf32>
  %c = forge.fusion "loop"(%x, %m) : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32> {
  ^bb0(%a: tensor<2x8x32xf32>, %b: tensor<2x1x32xf32>):
    %0 = forge.sub %a, %b : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32>
    forge.yield %0 : tensor<2x8x32xf32>
  }
  return %c : tensor<2x8x32xf32>
}

// -----

// Negative: a lone pointwise reader whose result the kernel cannot store (a compare's i1) is
// neither fused nor wrapped into a loop region of its own.
// CHECK-LABEL: func @lone_compare
// CHECK-NOT: forge.fusion
// CHECK: forge.greater
// REMARK-NOT: forge-fuse-line-reductions
func.func @lone_compare(%x: tensor<2x8x32xf32>) -> tensor<2x8x32xi1> {
  %m = forge.reduce_mean %x {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x1x32xf32>
  %c = forge.greater %x, %m : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xi1>
  return %c : tensor<2x8x32xi1>
}
