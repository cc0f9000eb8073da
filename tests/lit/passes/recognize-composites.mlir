// RUN: forge-opt %s --split-input-file --forge-recognize-composites --forge-eliminate-dead-code | FileCheck %s

// PyTorch's tanh GELU below opset 20 (GPT-2's MLP): one forge.gelu; the chain is dead.
// CHECK-LABEL: func @tanh_gelu
// CHECK-NEXT: %[[G:.*]] = forge.gelu %arg0 {approximate = "tanh"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: return %[[G]]
func.func @tanh_gelu(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %half = forge.constant dense<5.000000e-01> : tensor<f32>
  %one = forge.constant dense<1.000000e+00> : tensor<f32>
  %k = forge.constant dense<0.797884583> : tensor<f32>
  %c = forge.constant dense<4.471500e-02> : tensor<f32>
  %x2 = forge.mul %x, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %x3 = forge.mul %x, %x2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %w = forge.mul %x3, %c : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %v = forge.add %x, %w : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %u = forge.mul %v, %k : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %t = forge.tanh %u : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %b = forge.add %t, %one : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %m = forge.mul %x, %b : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = forge.mul %m, %half : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// The other spelling: (0.5 * x) * (1 + tanh(...)), x^3 as pow(x, 3), operands swapped.
// CHECK-LABEL: func @tanh_gelu_pow
// CHECK-NEXT: %[[G:.*]] = forge.gelu %arg0 {approximate = "tanh"}
// CHECK-NEXT: return %[[G]]
func.func @tanh_gelu_pow(%x: tensor<8xf32>) -> tensor<8xf32> {
  %half = forge.constant dense<5.000000e-01> : tensor<f32>
  %one = forge.constant dense<1.000000e+00> : tensor<f32>
  %three = forge.constant dense<3.000000e+00> : tensor<f32>
  %k = forge.constant dense<0.797884583> : tensor<f32>
  %c = forge.constant dense<4.471500e-02> : tensor<f32>
  %x3 = forge.pow %x, %three : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %w = forge.mul %c, %x3 : (tensor<f32>, tensor<8xf32>) -> tensor<8xf32>
  %v = forge.add %w, %x : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %u = forge.mul %k, %v : (tensor<f32>, tensor<8xf32>) -> tensor<8xf32>
  %t = forge.tanh %u : (tensor<8xf32>) -> tensor<8xf32>
  %b = forge.add %one, %t : (tensor<f32>, tensor<8xf32>) -> tensor<8xf32>
  %h = forge.mul %half, %x : (tensor<f32>, tensor<8xf32>) -> tensor<8xf32>
  %y = forge.mul %b, %h : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %y : tensor<8xf32>
}

// -----

// Not: another constant (0.04 is not GELU's 0.044715); an intermediate read
// outside the chain (tanh's result is returned too).
// CHECK-LABEL: func @not_gelu
// CHECK-NOT: forge.gelu
// CHECK: return
func.func @not_gelu(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %half = forge.constant dense<5.000000e-01> : tensor<f32>
  %one = forge.constant dense<1.000000e+00> : tensor<f32>
  %k = forge.constant dense<0.797884583> : tensor<f32>
  %c = forge.constant dense<4.000000e-02> : tensor<f32>
  %c2 = forge.constant dense<4.471500e-02> : tensor<f32>
  %x2 = forge.mul %x, %x : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %x3 = forge.mul %x, %x2 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %w = forge.mul %x3, %c : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %v = forge.add %x, %w : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %u = forge.mul %v, %k : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %t = forge.tanh %u : (tensor<8xf32>) -> tensor<8xf32>
  %b = forge.add %t, %one : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %m = forge.mul %x, %b : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %y = forge.mul %m, %half : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %x2b = forge.mul %x, %x : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %x3b = forge.mul %x, %x2b : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %wb = forge.mul %x3b, %c2 : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %vb = forge.add %x, %wb : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %ub = forge.mul %vb, %k : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %tb = forge.tanh %ub : (tensor<8xf32>) -> tensor<8xf32>
  %bb = forge.add %tb, %one : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %mb = forge.mul %x, %bb : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %yb = forge.mul %mb, %half : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  return %y, %yb, %tb : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}
