// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-assign-pipeline-stages="stages=2" | FileCheck %s
// RUN: forge-opt %s --split-input-file --verify-diagnostics --forge-assign-pipeline-stages="stages=3" | FileCheck %s --check-prefix=THREE

// Two layers of about equal cost: the cut falls between them. Constants get no
// stage (every stage may read them); every other op gets one, never decreasing.
// CHECK-LABEL: func @main
// CHECK: forge.constant {forge.initializer = "w1"}
// CHECK-NOT: forge.stage
// CHECK: forge.matmul %arg0, %{{.*}} {forge.stage = 0 : i64}
// CHECK-NEXT: forge.relu %{{.*}} {forge.stage = 0 : i64}
// CHECK-NEXT: forge.matmul %{{.*}} {forge.stage = 1 : i64}
// CHECK-NEXT: forge.relu %{{.*}} {forge.stage = 1 : i64}
// Three stages of four ops: every stage gets at least one.
// THREE-LABEL: func @main
// THREE: forge.matmul %arg0, %{{.*}} {forge.stage = 0 : i64}
// THREE: forge.stage = 1 : i64
// THREE: forge.stage = 2 : i64
// THREE-NOT: forge.stage = 3
// expected-remark @+1 {{forge-assign-pipeline-stages}}
func.func @main(%x: tensor<8x16xf32> {forge.name = "x"}) -> (tensor<8x16xf32> {forge.name = "y"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.5> : tensor<16x16xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.5> : tensor<16x16xf32>
  %h = forge.matmul %x, %w1 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %r = forge.relu %h : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %y = forge.matmul %r, %w2 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %z = forge.relu %y : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %z : tensor<8x16xf32>
}

// -----

// More stages than ops: refused, naming both.
// expected-error @+1 {{: the forward graph has 1 op(s), fewer than the stages to cut it into}}
func.func @main(%x: tensor<8x16xf32> {forge.name = "x"}) -> (tensor<8x16xf32> {forge.name = "y"}) {
  %r = forge.relu %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %r : tensor<8x16xf32>
}

// -----

// Only @main is cut (the forward graph, before the train step exists).
// CHECK-LABEL: func @other
// CHECK-NOT: forge.stage
func.func @other(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %r = forge.relu %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %r : tensor<8x16xf32>
}
