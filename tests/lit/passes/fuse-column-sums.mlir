// RUN: forge-opt %s --split-input-file --forge-fuse-column-sums 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-fuse-column-sums 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// A bias gradient (the column sum of a GELU-gradient loop region's bf16
// result, keepdims) that a GEMM also reads: the loop becomes a column_reduce
// region yielding the sum (f32 [C]) and then the loop's result (a side
// output); the sum's readers get it through a reshape to [1, 1, C], the
// GEMM the side output. The region reads the loop's inputs: two at the
// iteration shape and a per-column bias.
// CHECK-LABEL: func @train_step
// CHECK: %[[R:.+]]:2 = forge.fusion "column_reduce"(%arg0, %arg1, %arg2) : (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>, tensor<64xf32>) -> (tensor<64xf32>, tensor<2x8x64xbf16>)
// CHECK: forge.gelu_grad
// CHECK: %[[LOW:.+]] = forge.cast %{{.+}} {to = bf16}
// CHECK: %[[SUM:.+]] = forge.reduce_sum %[[LOW]] {axes = array<i64: 0, 1>, keepdims = false} : (tensor<2x8x64xbf16>) -> tensor<64xf32>
// CHECK: forge.yield %[[SUM]], %[[LOW]]
// CHECK: forge.reshape %[[R]]#0 {shape = array<i64: 1, 1, 64>}
// CHECK: forge.matmul %[[R]]#1
// CHECK-NOT: forge.fusion "loop"
// REMARK: forge-fuse-column-sums: 1 column sum kernel(s) ride in the region that makes their input
func.func @train_step(%dy: tensor<2x8x64xbf16>, %h: tensor<2x8x64xbf16>, %b: tensor<64xf32>,
                      %w: tensor<64x32xbf16>) -> (tensor<1x1x64xf32>, tensor<2x8x32xf32>) {
  %g = forge.fusion "loop"(%dy, %h, %b) : (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>, tensor<64xf32>) -> tensor<2x8x64xbf16> {
  ^bb0(%a: tensor<2x8x64xbf16>, %c: tensor<2x8x64xbf16>, %d: tensor<64xf32>):
    %0 = forge.cast %a {to = f32} : (tensor<2x8x64xbf16>) -> tensor<2x8x64xf32>
    %1 = forge.cast %c {to = f32} : (tensor<2x8x64xbf16>) -> tensor<2x8x64xf32>
    %2 = forge.add %1, %d : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %3 = forge.gelu_grad %0, %2 {approximate = "tanh"} : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
    %4 = forge.cast %3 {to = bf16} : (tensor<2x8x64xf32>) -> tensor<2x8x64xbf16>
    forge.yield %4 : tensor<2x8x64xbf16>
  }
  %s = forge.reduce_sum %g {axes = array<i64: 0, 1>, keepdims = true} : (tensor<2x8x64xbf16>) -> tensor<1x1x64xf32>
  %m = forge.matmul %g, %w : (tensor<2x8x64xbf16>, tensor<64x32xbf16>) -> tensor<2x8x32xf32>
  return %s, %m : tensor<1x1x64xf32>, tensor<2x8x32xf32>
}

// -----

// Negative: a row sum (axes = [2], not every dim but the last), a sum of a
// loop region that reads a broadcast the column kernel cannot (a [2, 1, 64]
// input over [2, 8, 64]), and a sum of a function argument stay as they are.
// CHECK-LABEL: func @train_step
// CHECK-NOT: column_reduce
// CHECK: forge.fusion "loop"
// CHECK: forge.reduce_sum {{.*}}axes = array<i64: 2>
// CHECK: forge.fusion "loop"
// CHECK: forge.reduce_sum {{.*}}axes = array<i64: 0, 1>
// CHECK: forge.reduce_sum %arg0
func.func @train_step(%x: tensor<2x8x64xf32>, %y: tensor<2x1x64xf32>) -> (tensor<2x8xf32>, tensor<64xf32>, tensor<64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>) {
  %g = forge.fusion "loop"(%x) : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32> {
  ^bb0(%a: tensor<2x8x64xf32>):
    %0 = forge.mul %a, %a : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
    forge.yield %0 : tensor<2x8x64xf32>
  }
  %rows = forge.reduce_sum %g {axes = array<i64: 2>, keepdims = false} : (tensor<2x8x64xf32>) -> tensor<2x8xf32>
  %h = forge.fusion "loop"(%x, %y) : (tensor<2x8x64xf32>, tensor<2x1x64xf32>) -> tensor<2x8x64xf32> {
  ^bb0(%a: tensor<2x8x64xf32>, %c: tensor<2x1x64xf32>):
    %0 = forge.add %a, %c : (tensor<2x8x64xf32>, tensor<2x1x64xf32>) -> tensor<2x8x64xf32>
    forge.yield %0 : tensor<2x8x64xf32>
  }
  %cols = forge.reduce_sum %h {axes = array<i64: 0, 1>, keepdims = false} : (tensor<2x8x64xf32>) -> tensor<64xf32>
  %arg = forge.reduce_sum %x {axes = array<i64: 0, 1>, keepdims = false} : (tensor<2x8x64xf32>) -> tensor<64xf32>
  return %rows, %cols, %arg, %g, %h : tensor<2x8xf32>, tensor<64xf32>, tensor<64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>
}
