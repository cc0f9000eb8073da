// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-split-accumulation | FileCheck %s

// The rest of the step may read a micro-batch value only through
// forge.accumulated: here it reads the data-dependent product directly.
func.func @train_step(%x: tensor<4xf32> {forge.kind = "input", forge.name = "x"},
                      %acc: tensor<4xf32> {forge.kind = "state", forge.name = "g.grad_accum"},
                      %step: tensor<f32> {forge.kind = "input", forge.name = "forge.step"})
    -> (tensor<4xf32> {forge.name = "leak"}) {
  %p = forge.mul %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s = forge.add %acc, %p : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %g = forge.accumulated %s {accumulator = "g.grad_accum"} : tensor<4xf32>
  // expected-error @+1 {{forge-split-accumulation: reads a value of the micro-batch's forward/backward (forge.mul) other than through forge.accumulated}}
  %r = forge.add %g, %p : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

// An output (not an update) made by the micro-batch part: the loop has no
// place to return it from.
// expected-error @+1 {{forge-split-accumulation: output 'activation' is made by the micro-batch's forward/backward; the loop returns only the sums (use --accumulate unroll)}}
func.func @train_step(%x: tensor<4xf32> {forge.kind = "input", forge.name = "x"},
                      %acc: tensor<4xf32> {forge.kind = "state", forge.name = "g.grad_accum"})
    -> (tensor<4xf32> {forge.name = "activation"}, tensor<4xf32> {forge.name = "grad"}) {
  %p = forge.mul %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s = forge.add %acc, %p : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %g = forge.accumulated %s {accumulator = "g.grad_accum"} : tensor<4xf32>
  return %p, %g : tensor<4xf32>, tensor<4xf32>
}

// -----

// A value of the micro-batch part that depends on arguments only (the step)
// is recomputed in the rest; the accumulator's argument replaces the sum.
// CHECK-LABEL: func.func @accumulate(
// CHECK-SAME: forge.name = "x"
// CHECK: forge.mul
// CHECK: return
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[ACC:[a-z0-9]+]]: tensor<4xf32> {forge.kind = "state", forge.name = "g.grad_accum"}
// CHECK-SAME: %[[STEP:[a-z0-9]+]]: tensor<f32> {forge.kind = "input", forge.name = "forge.step"}
// CHECK-NOT: forge.name = "x"
// CHECK: %[[C:.*]] = forge.mul %[[STEP]], %[[STEP]]
// CHECK: forge.mul %[[ACC]], %[[C]]
func.func @train_step(%x: tensor<4xf32> {forge.kind = "input", forge.name = "x"},
                      %acc: tensor<4xf32> {forge.kind = "state", forge.name = "g.grad_accum"},
                      %step: tensor<f32> {forge.kind = "input", forge.name = "forge.step"})
    -> (tensor<4xf32> {forge.name = "scaled"}) {
  %c = forge.mul %step, %step : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %p = forge.mul %x, %c : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %s = forge.add %acc, %p : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %g = forge.accumulated %s {accumulator = "g.grad_accum"} : tensor<4xf32>
  %r = forge.mul %g, %c : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}
