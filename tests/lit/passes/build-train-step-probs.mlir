// RUN: forge-opt %s --forge-build-train-step="loss=cross_entropy:y,q,probs,smoothing=0.1 optimizer=sgd:lr=0.1" | FileCheck %s
// Probability targets: the label input q is f32 class probabilities of the
// logits' shape; the loss is -sum_c q'_c log p_c per row (q' = 0.9 q + 0.1 / 4),
// averaged, with no nll_loss; eval's accuracy compares the argmax of the logits
// with the argmax of q.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg1: tensor<3x4xf32> {forge.kind = "input", forge.name = "q"}
// CHECK-NOT: forge.nll_loss
// CHECK: forge.log_softmax %{{.*}} {axis = 1 : i64} : (tensor<3x4xf32>) -> tensor<3x4xf32>
// CHECK: forge.mul %arg1, %{{.*}} : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
// CHECK: forge.reduce_sum %{{.*}} {axes = array<i64: 1>, keepdims = false} : (tensor<3x4xf32>) -> tensor<3xf32>
// CHECK-LABEL: func.func @eval
// CHECK-SAME: %arg1: tensor<3x4xf32> {forge.name = "q"}
// CHECK: forge.argmax %{{.*}} {axis = 1 : i64, keepdims = false, select_last_index = false} : (tensor<3x4xf32>) -> tensor<3xi64>
// CHECK: forge.argmax %arg1 {axis = 1 : i64, keepdims = false, select_last_index = false} : (tensor<3x4xf32>) -> tensor<3xi64>
func.func @main(%x: tensor<3x2xf32> {forge.name = "x"}) -> (tensor<3x4xf32> {forge.name = "y"}) {
  %w = forge.constant {forge.initializer = "w"} dense<0.5> : tensor<2x4xf32>
  %y = forge.matmul %x, %w : (tensor<3x2xf32>, tensor<2x4xf32>) -> tensor<3x4xf32>
  return %y : tensor<3x4xf32>
}
