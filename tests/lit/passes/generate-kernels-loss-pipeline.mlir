// RUN: forge-opt %s --split-input-file --forge-generate-kernels="pipeline-loss-rows=1" | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | FileCheck %s --check-prefix=PASSES
// The kernels print and parse back.
// RUN: forge-opt %s --split-input-file --forge-generate-kernels="pipeline-loss-rows=1" | forge-opt --split-input-file --verify-each > /dev/null

// forge-generate-kernels{pipeline-loss-rows} (forgec --pipeline-loss-rows):
// the persistent loss kernel (one block of 1024 threads per SM over wide
// rows) computes the first row's statistics, then per row one vector loop
// that writes the row's gradient from the carried log-sum-exp while it
// gathers the next row's (m, s); the next row's loss is stored only if it
// exists (past the last row the loop rereads the current one).
// CHECK-LABEL: gpu.func @k0_cross_entropy_with_grad
// CHECK: scf.for %{{.*}} = %thread_id_x to %c4100{{.*}} step %c4096 iter_args
// CHECK-NOT: memref.store {{.*}}vector<4xbf16>
// CHECK: math.log
// CHECK: memref.store {{.*}}, %arg3[%block_id_x] : memref<200xf32>
// CHECK: gpu.barrier
// CHECK: scf.for %[[ROW:arg[0-9]+]] = %block_id_x to %c200 step %c132 iter_args(%[[LSE:arg[0-9]+]] =
// CHECK-NEXT: arith.constant 4100
// CHECK-NEXT: %[[BASE:[0-9]+]] = arith.muli %[[ROW]], %c4100
// CHECK: %[[NEXT:[0-9]+]] = arith.addi %[[ROW]], %c132
// CHECK: %[[HAS:[0-9]+]] = arith.cmpi ult, %[[NEXT]], %c200
// CHECK: %[[NROW:[0-9]+]] = arith.select %[[HAS]], %[[NEXT]], %[[ROW]]
// CHECK: %[[NBASE:[0-9]+]] = arith.muli %[[NROW]], %c4100
// The next row's vectors (memory), then the current row's (L2), in one loop.
// CHECK: scf.for %{{.*}} = %thread_id_x{{.*}} to %c4100{{.*}} step %c4096{{.*}} iter_args
// CHECK: %[[AHEAD:[0-9]+]] = arith.addi %[[NBASE]], %arg
// CHECK: memref.load %arg0[%[[AHEAD]]]
// CHECK: %[[HERE:[0-9]+]] = arith.addi %[[BASE]], %arg
// CHECK: memref.load %arg0[%[[HERE]]]
// CHECK: arith.subf %{{.*}}, %[[LSE]]
// CHECK: memref.store {{.*}}, %arg4[{{.*}}] : memref<820000xvector<4xbf16>>
// CHECK-NOT: memref.store {{.*}}, %arg3[
// CHECK: scf.yield %{{.*}}, %{{.*}} : f32, f32
// CHECK-NOT: scf.for
// CHECK: math.log
// CHECK: scf.if %[[HAS]]
// CHECK: memref.store %arg6, %arg5
// CHECK: memref.store {{.*}}, %arg3[%[[NEXT]]] : memref<200xf32>
// CHECK-NOT: memref.store {{.*}}, %arg3[
// CHECK: gpu.barrier
// CHECK-NEXT: scf.yield
// Without the option: per row, the statistics' loop, then the gradient's.
// PASSES-LABEL: gpu.func @k0_cross_entropy_with_grad
// PASSES: scf.for %{{.*}} = %block_id_x to %c200 step %c132 {
// PASSES: scf.for {{.*}} iter_args
// PASSES-NOT: memref.store {{.*}}vector<4xbf16>
// PASSES: math.log
// PASSES: gpu.barrier
// PASSES: scf.for
// PASSES: memref.store {{.*}} : memref<820000xvector<4xbf16>>
func.func @loss_rows_wide(%x: tensor<200x16400xf32>, %t: tensor<200xi64>, %g: tensor<f32>) -> (tensor<200xf32>, tensor<200x16400xbf16>) {
  %l, %d = forge.cross_entropy_with_grad %x, %t, %g {classes = 16397 : i64, reduction = "mean"} : (tensor<200x16400xf32>, tensor<200xi64>, tensor<f32>) -> (tensor<200xf32>, tensor<200x16400xbf16>)
  return %l, %d : tensor<200xf32>, tensor<200x16400xbf16>
}

// -----

// No more rows than SMs (132 of 16400): a block a row with or without the
// option (the pipelined form's first row is the block's: it needs rows > SMs).
// CHECK-LABEL: gpu.func @k0_cross_entropy_with_grad
// CHECK-NOT: %block_id_x to
// CHECK: gpu.return
// PASSES-LABEL: gpu.func @k0_cross_entropy_with_grad
// PASSES-NOT: %block_id_x to
// PASSES: gpu.return
func.func @loss_rows_few(%x: tensor<132x16400xf32>, %t: tensor<132xi64>, %g: tensor<f32>) -> (tensor<132xf32>, tensor<132x16400xbf16>) {
  %l, %d = forge.cross_entropy_with_grad %x, %t, %g {classes = 16397 : i64, reduction = "mean"} : (tensor<132x16400xf32>, tensor<132xi64>, tensor<f32>) -> (tensor<132xf32>, tensor<132x16400xbf16>)
  return %l, %d : tensor<132xf32>, tensor<132x16400xbf16>
}
