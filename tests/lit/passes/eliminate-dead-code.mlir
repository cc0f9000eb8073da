// RUN: forge-opt %s --split-input-file --forge-eliminate-dead-code | FileCheck %s

// A dead chain disappears in one sweep; live ops stay.
// CHECK-LABEL: func @dead_chain
// CHECK-NEXT: %[[R:.*]] = forge.relu %arg0
// CHECK-NEXT: return %[[R]]
func.func @dead_chain(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = forge.relu %x : (tensor<4xf32>) -> tensor<4xf32>
  %e = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %t = forge.tanh %e : (tensor<4xf32>) -> tensor<4xf32>
  %c = forge.constant dense<1.0> : tensor<4xf32>
  %a = forge.add %t, %c : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

// Negative: nothing is dead, nothing changes.
// CHECK-LABEL: func @all_live
// CHECK: forge.exp
// CHECK: forge.tanh
func.func @all_live(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = forge.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %t = forge.tanh %e : (tensor<4xf32>) -> tensor<4xf32>
  return %t : tensor<4xf32>
}
