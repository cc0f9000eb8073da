// forge-shard-tensor-parallel, then the train step: parameters of the slices'
// types, the split recorded on them and their optimizer state, the forward's
// sum differentiated by its rule (the identity), the input's gradient summed
// over the group (the pair's input h0 depends on the replicated w0), and the
// gradient norm's squares of the slices summed over the group (the replicated
// w0's counted once, outside the sum).
// RUN: forge-opt %s --forge-shard-tensor-parallel="size=2" --forge-build-train-step="loss=mse:y,t optimizer=adam:lr=0.1 grad-norm=true" | FileCheck %s
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: tensor<8x3xf32> {forge.initial_value = dense<{{.*}}> : tensor<8x6xf32>, forge.kind = "parameter", forge.name = "w1", forge.role = "weight", forge.shard = {axis = 1 : i64, group = "tp", size = 2 : i64}}
// CHECK-SAME: tensor<8x3xf32> {forge.kind = "state", forge.name = "w1.exp_avg", forge.role = "optimizer", forge.shard = {axis = 1 : i64, group = "tp", size = 2 : i64}}
// CHECK-NOT: forge.shard %
// CHECK: forge.enter_group
// CHECK: forge.all_reduce %{{.*}} {group = "tp", reduction = "sum", size = 2 : i64} : (tensor<5x4xf32>)
// CHECK: forge.all_reduce %{{.*}} {group = "tp", reduction = "sum", size = 2 : i64} : (tensor<5x8xf32>)
// CHECK: forge.all_reduce %{{.*}} {group = "tp", reduction = "sum", size = 2 : i64} : (tensor<f32>)
// CHECK-NOT: forge.all_reduce
// CHECK-LABEL: func.func @eval
// CHECK: forge.all_reduce %{{.*}} {group = "tp", reduction = "sum", size = 2 : i64} : (tensor<5x4xf32>)
// CHECK-NOT: forge.all_reduce
func.func @main(%x: tensor<5x8xf32> {forge.name = "x"}) -> (tensor<5x4xf32> {forge.name = "y"}) {
  %w0 = forge.constant {forge.initializer = "w0"} dense<0.5> : tensor<8xf32>
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.25> : tensor<8x6xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.125> : tensor<6x4xf32>
  %h0 = forge.mul %x, %w0 : (tensor<5x8xf32>, tensor<8xf32>) -> tensor<5x8xf32>
  %h = forge.matmul %h0, %w1 : (tensor<5x8xf32>, tensor<8x6xf32>) -> tensor<5x6xf32>
  %r = forge.relu %h : (tensor<5x6xf32>) -> tensor<5x6xf32>
  %y = forge.matmul %r, %w2 : (tensor<5x6xf32>, tensor<6x4xf32>) -> tensor<5x4xf32>
  return %y : tensor<5x4xf32>
}
