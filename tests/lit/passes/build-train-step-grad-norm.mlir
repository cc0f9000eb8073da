// The global gradient norm (forge.grad_norm) is a pass over every gradient: train_step
// computes and outputs it where clipping or dynamic loss scaling reads it, or with
// grad-norm=true (forgec --grad-norm); otherwise it has neither the sum of squares nor
// the output.
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.5" | FileCheck %s --check-prefix=NONE
// NONE-LABEL: func.func @train_step
// NONE-SAME: -> (tensor<f32> {forge.name = "loss"}, tensor<f32> {forge.name = "forge.lr"}, tensor<2xf32> {forge.updates = "w"})
// NONE-NOT: forge.sqrt
// NONE-NOT: forge.grad_norm
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.5 grad-norm=true" | FileCheck %s --check-prefix=ASKED
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.5 clip-grad-norm=1.0" | FileCheck %s --check-prefix=ASKED
// ASKED-LABEL: func.func @train_step
// ASKED-SAME: -> (tensor<f32> {forge.name = "loss"}, tensor<f32> {forge.name = "forge.lr"}, tensor<f32> {forge.name = "forge.grad_norm"}, tensor<2xf32> {forge.updates = "w"})
// The gradient of w (dy * x), its squares' sum, the square root.
// ASKED: %[[G:.+]] = forge.mul %{{.*}}, %arg0
// ASKED-NEXT: %[[SQ:.+]] = forge.mul %[[G]], %[[G]]
// ASKED-NEXT: %[[SUM:.+]] = forge.reduce_sum %[[SQ]]
// ASKED-NEXT: %[[NORM:.+]] = forge.sqrt %[[SUM]]
// ASKED: return %{{.*}}, %{{.*}}, %[[NORM]], %{{.*}}
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.5 loss-scale=dynamic" | FileCheck %s --check-prefix=SCALED
// SCALED-LABEL: func.func @train_step
// SCALED-SAME: tensor<f32> {forge.name = "forge.grad_norm"}
// SCALED: forge.less
func.func @main(%x: tensor<2xf32> {forge.name = "x"}) -> (tensor<2xf32> {forge.name = "y"}) {
  %w = forge.constant {forge.initializer = "w"} dense<[1.0, 2.0]> : tensor<2xf32>
  %y = forge.mul %x, %w : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  return %y : tensor<2xf32>
}
