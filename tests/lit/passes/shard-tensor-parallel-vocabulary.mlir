// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-shard-tensor-parallel="size=2 loss=cross_entropy:logits,labels" | FileCheck %s
// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-shard-tensor-parallel="size=2 loss=cross_entropy:logits,labels" --forge-build-train-step="loss=cross_entropy:logits,labels optimizer=sgd:lr=0.1" | FileCheck %s --check-prefix=TRAIN

// A language model's tied embedding (PyTorch: the lm head reads
// Transpose(wte), the embedding gathers wte's rows): the vocabulary splits
// by rows of wte, read by both through one forge.shard. The head's input
// enters the group (its gradient summed over the ranks), the logits are
// this rank's 4 of 8 classes and the output says so (forge.shard on the
// result). The lookup reads this rank's rows: the ids less its first class
// (forge.rank_slice of [0, 4]), those outside [0, 4) read row 0 and are
// zeroed, and the group sums the rows.
// CHECK-LABEL: func @main
// CHECK-SAME: -> (tensor<2x3x4xf32> {forge.name = "logits", forge.shard = {axis = 2 : i64, group = "tp", size = 2 : i64}})
// CHECK: %[[W:.*]] = forge.constant {forge.initializer = "wte"} {{.*}} : tensor<8x4xf32>
// CHECK: %[[S:.*]] = forge.shard %[[W]] {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<8x4xf32>) -> tensor<4x4xf32>
// CHECK: %[[OFFSETS:.*]] = forge.constant dense<[0, 4]> : tensor<2xi64>
// CHECK: %[[FIRST:.*]] = forge.rank_slice %[[OFFSETS]] {group = "tp", size = 2 : i64} : (tensor<2xi64>) -> tensor<1xi64>
// CHECK: %[[LOCAL:.*]] = forge.sub %arg0, %[[FIRST]] : (tensor<2x3xi64>, tensor<1xi64>) -> tensor<2x3xi64>
// CHECK: %[[MINE:.*]] = forge.and
// CHECK: %[[ROW:.*]] = forge.where %[[MINE]], %[[LOCAL]], %{{.*}} : (tensor<2x3xi1>, tensor<2x3xi64>, tensor<i64>) -> tensor<2x3xi64>
// CHECK: %[[E:.*]] = forge.gather %[[S]], %[[ROW]] {axis = 0 : i64} : (tensor<4x4xf32>, tensor<2x3xi64>) -> tensor<2x3x4xf32>
// CHECK: %[[M:.*]] = forge.reshape %[[MINE]] {shape = array<i64: 2, 3, 1>}
// CHECK: %[[KEPT:.*]] = forge.where %[[M]], %[[E]], %{{.*}} : (tensor<2x3x1xi1>, tensor<2x3x4xf32>, tensor<f32>) -> tensor<2x3x4xf32>
// CHECK: %[[SUM:.*]] = forge.all_reduce %[[KEPT]] {group = "tp", reduction = "sum", size = 2 : i64}
// CHECK: %[[T:.*]] = forge.transpose %[[S]] {perm = array<i64: 1, 0>} : (tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: %[[X:.*]] = forge.enter_group %[[SUM]] {group = "tp", size = 2 : i64} : tensor<2x3x4xf32>
// CHECK: %[[Y:.*]] = forge.matmul %[[X]], %[[T]] : (tensor<2x3x4xf32>, tensor<4x4xf32>) -> tensor<2x3x4xf32>
// CHECK: return %[[Y]] : tensor<2x3x4xf32>
// The train step's loss on the split logits: each rank's log-sum-exp of its
// classes, gathered [2 ranks, 6 rows] and combined; the label's logit read
// where it lies and summed; the gather's gradient is this rank's row of the
// cotangent (forge.rank_slice), the sums' the identity.
// TRAIN-LABEL: func.func @train_step
// TRAIN-SAME: tensor<4x4xf32> {forge.initial_value = dense<{{.*}}> : tensor<8x4xf32>, forge.kind = "parameter", forge.name = "wte", forge.role = "embedding", forge.shard = {axis = 0 : i64, group = "tp", size = 2 : i64}}
// TRAIN: forge.all_gather %{{.*}} {group = "tp", size = 2 : i64} : (tensor<1x6xf32>) -> tensor<2x6xf32>
// TRAIN: forge.gather_elements %{{.*}}, %{{.*}} {axis = 1 : i64} : (tensor<6x4xf32>, tensor<6x1xi64>) -> tensor<6x1xf32>
// TRAIN: forge.all_reduce %{{.*}} {group = "tp", reduction = "sum", size = 2 : i64} : (tensor<6xf32>) -> tensor<6xf32>
// TRAIN: forge.gather_elements_grad
// TRAIN: forge.rank_slice %{{.*}} {group = "tp", size = 2 : i64} : (tensor<2x6xf32>) -> tensor<1x6xf32>
// TRAIN: forge.all_reduce %{{.*}} {group = "tp", reduction = "sum", size = 2 : i64} : (tensor<2x3x4xf32>)
// TRAIN: forge.gather_grad
// TRAIN-NOT: forge.log_softmax
// TRAIN-LABEL: func.func @eval
// TRAIN: forge.all_gather %{{.*}} : (tensor<1x6xf32>) -> tensor<2x6xf32>
// TRAIN: forge.all_gather %{{.*}} : (tensor<1x6xf32>) -> tensor<2x6xf32>
// TRAIN: return {{.*}} : tensor<f32>, tensor<f32>
func.func @main(%ids: tensor<2x3xi64> {forge.name = "ids"}) -> (tensor<2x3x8xf32> {forge.name = "logits"}) {
  %wte = forge.constant {forge.initializer = "wte"} dense<0.25> : tensor<8x4xf32>
  %e = forge.gather %wte, %ids {axis = 0 : i64} : (tensor<8x4xf32>, tensor<2x3xi64>) -> tensor<2x3x4xf32>
  %t = forge.transpose %wte {perm = array<i64: 1, 0>} : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %y = forge.matmul %e, %t : (tensor<2x3x4xf32>, tensor<4x8xf32>) -> tensor<2x3x8xf32>
  return %y : tensor<2x3x8xf32>
}

// -----

// An MLP pair, then a classifier head of its own ([hidden, classes], a
// bias): the pair splits by columns and rows, the head by classes, its bias
// with it.
// CHECK-LABEL: func @main
// CHECK-SAME: forge.shard = {axis = 1 : i64, group = "tp", size = 2 : i64}
// CHECK-DAG: forge.shard %{{.*}} {axis = 1 : i64, group = "tp", size = 2 : i64} : (tensor<8x6xf32>) -> tensor<8x3xf32>
// CHECK-DAG: forge.shard %{{.*}} {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<6x4xf32>) -> tensor<3x4xf32>
// CHECK-DAG: forge.shard %{{.*}} {axis = 1 : i64, group = "tp", size = 2 : i64} : (tensor<4x10xf32>) -> tensor<4x5xf32>
// CHECK-DAG: forge.shard %{{.*}} {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<10xf32>) -> tensor<5xf32>
// CHECK: forge.all_reduce
// CHECK: forge.enter_group
// CHECK: forge.gemm {{.*}} -> tensor<5x5xf32>
// TRAIN-LABEL: func.func @train_step
// TRAIN: forge.all_gather
func.func @main(%x: tensor<5x8xf32> {forge.name = "x"}) -> (tensor<5x10xf32> {forge.name = "logits"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.25> : tensor<8x6xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.125> : tensor<6x4xf32>
  %w3 = forge.constant {forge.initializer = "w3"} dense<0.5> : tensor<4x10xf32>
  %b3 = forge.constant {forge.initializer = "b3"} dense<1.0> : tensor<10xf32>
  %h = forge.matmul %x, %w1 : (tensor<5x8xf32>, tensor<8x6xf32>) -> tensor<5x6xf32>
  %r = forge.relu %h : (tensor<5x6xf32>) -> tensor<5x6xf32>
  %p = forge.matmul %r, %w2 : (tensor<5x6xf32>, tensor<6x4xf32>) -> tensor<5x4xf32>
  %y = forge.gemm %p, %w3, %b3 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = false} : (tensor<5x4xf32>, tensor<4x10xf32>, tensor<10xf32>) -> tensor<5x10xf32>
  return %y : tensor<5x10xf32>
}

// -----

// Negative: 7 classes do not divide by 2 (a remark), and with no pair either
// nothing is split (the error).
// expected-error @+1 {{--tp 2: no pair of matmuls to split}}
func.func @main(%x: tensor<5x8xf32> {forge.name = "x"}) -> (tensor<5x7xf32> {forge.name = "logits"}) {
  %w = forge.constant {forge.initializer = "w"} dense<0.25> : tensor<8x7xf32>
  // expected-remark @+1 {{the vocabulary of 'logits' is not split over 2 ranks: 7 classes do not divide by 2}}
  %y = forge.matmul %x, %w : (tensor<5x8xf32>, tensor<8x7xf32>) -> tensor<5x7xf32>
  return %y : tensor<5x7xf32>
}

// -----

// Negative: the logits have another reader (an output of their own).
// expected-error @+1 {{no pair of matmuls to split}}
func.func @main(%x: tensor<5x8xf32> {forge.name = "x"}) -> (tensor<5x4xf32> {forge.name = "logits"}, tensor<5x4xf32> {forge.name = "probs"}) {
  %w = forge.constant {forge.initializer = "w"} dense<0.25> : tensor<8x4xf32>
  // expected-remark @+2 {{not split over 2 ranks: its hidden value has 2 readers}}
  // expected-remark @+1 {{the logits have readers besides the return}}
  %y = forge.matmul %x, %w : (tensor<5x8xf32>, tensor<8x4xf32>) -> tensor<5x4xf32>
  %p = forge.softmax %y {axis = 1 : i64} : (tensor<5x4xf32>) -> tensor<5x4xf32>
  return %y, %p : tensor<5x4xf32>, tensor<5x4xf32>
}
