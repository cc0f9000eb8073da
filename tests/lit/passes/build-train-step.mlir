// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-build-train-step="loss=mse:y,target optimizer=momentum:lr=0.5,momentum=0.9 clip-grad-norm=1.0" | FileCheck %s

// One linear layer trained with MSE, heavy-ball momentum and clipping: the
// initializers become parameters (with their initial value and role), the
// label becomes an input, and train_step returns the loss and updates the
// weight, the bias and their momentum buffers.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: {forge.kind = "input", forge.name = "x"}
// CHECK-SAME: {forge.kind = "input", forge.name = "target"}
// CHECK-SAME: forge.kind = "parameter", forge.name = "w", forge.role = "weight"
// CHECK-SAME: forge.kind = "parameter", forge.name = "b", forge.role = "bias"
// CHECK-SAME: forge.kind = "state", forge.name = "w.momentum"
// CHECK-SAME: -> (tensor<f32> {forge.name = "loss"}
// CHECK-SAME: forge.updates = "w"
// CHECK: forge.matmul
// CHECK: forge.reduce_sum
// CHECK: forge.sqrt
// CHECK-LABEL: func.func @eval
// CHECK-NOT: forge.updates
// CHECK: return
module {
  func.func @main(%x: tensor<2x3xf32> {forge.name = "x"}) -> (tensor<2x4xf32> {forge.name = "y"}) {
    %w = forge.constant {forge.initializer = "w"} dense<0.5> : tensor<3x4xf32>
    %b = forge.constant {forge.initializer = "b"} dense<0.25> : tensor<4xf32>
    %m = forge.matmul %x, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
    %y = forge.add %m, %b : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}

// -----

// Negative: the loss must name an output of @main.
// expected-error @+2 {{--loss names output 'y', which the model does not have (outputs: z)}}
module {
  func.func @main(%x: tensor<2x3xf32> {forge.name = "x"}) -> (tensor<2x3xf32> {forge.name = "z"}) {
    %w = forge.constant {forge.initializer = "w"} dense<0.5> : tensor<2x3xf32>
    %y = forge.mul %x, %w : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    return %y : tensor<2x3xf32>
  }
}

// -----

// Negative: nothing to train.
// expected-error @+1 {{no @main function to train}}
module {
  func.func @other(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
}
