// ZeRO-1 (--dp 2 --zero 1): w's dim 0 (4) splits over the two ranks, so its
// Adam moments are the rank's part [2, 3] (forge.shard on dim 0 of group dp),
// its gradient is reduced to that part (reduce_scatter, mean), the optimizer
// updates the part of w (rank_slice) and the ranks gather the new w; b's dim 0
// (3) does not split: its gradient and the loss are averaged whole as with
// --dp alone. The gradient norm sums the parts' squares over the group.
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=adam:lr=0.1 data-parallel=2 zero=1 grad-norm=true" | FileCheck %s
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=adam zero=1" 2>&1 | FileCheck %s --check-prefix=NODP
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=adam data-parallel=2 zero=2" 2>&1 | FileCheck %s --check-prefix=STAGE
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: tensor<2x3xf32> {forge.kind = "state", forge.name = "w.exp_avg", forge.role = "optimizer", forge.shard = {axis = 0 : i64, group = "dp", size = 2 : i64}}
// CHECK-SAME: tensor<3xf32> {forge.kind = "state", forge.name = "b.exp_avg", forge.role = "optimizer"}
// CHECK: forge.all_reduce %{{.*}}, %{{.*}} {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<3xf32>, tensor<f32>)
// CHECK: forge.reduce_scatter %{{.*}} {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<4x3xf32>) -> tensor<2x3xf32>
// CHECK: forge.all_reduce %{{.*}} {group = "dp", reduction = "sum", size = 2 : i64} : (tensor<f32>)
// CHECK: forge.rank_slice %{{.*}} {group = "dp", size = 2 : i64} : (tensor<4x3xf32>) -> tensor<2x3xf32>
// CHECK: %[[W:.*]] = forge.all_gather %{{.*}} {group = "dp", size = 2 : i64} : (tensor<2x3xf32>) -> tensor<4x3xf32>
// CHECK: return {{.*}}%[[W]]
// NODP: --zero 1 splits the optimizer state over data-parallel ranks: it needs --dp
// STAGE: --zero must be 0 or 1
func.func @main(%x: tensor<5x4xf32> {forge.name = "x"}) -> (tensor<5x3xf32> {forge.name = "y"}) {
  %w = forge.constant {forge.initializer = "w"} dense<0.5> : tensor<4x3xf32>
  %b = forge.constant {forge.initializer = "b"} dense<0.25> : tensor<3xf32>
  %h = forge.matmul %x, %w : (tensor<5x4xf32>, tensor<4x3xf32>) -> tensor<5x3xf32>
  %y = forge.add %h, %b : (tensor<5x3xf32>, tensor<3xf32>) -> tensor<5x3xf32>
  return %y : tensor<5x3xf32>
}
