// With pipeline=2 the train step carries forge-assign-pipeline-stages' marks:
// each forward op keeps its stage, each op of its gradient rule gets the same
// stage, every op of micro-batch m gets forge.micro = m (and the backward's
// forge.backward), a sum of gradient contributions stays unmarked (the split
// puts it where its operands are), and a parameter's update runs on the stage
// of its first forward use. Without pipeline nothing is marked.
// RUN: forge-opt %s --mlir-print-op-on-diagnostic=false --forge-assign-pipeline-stages="stages=2" --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 pipeline=2" 2>&1 | FileCheck %s
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2" | FileCheck %s --check-prefix=NONE
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd pipeline=2 loss-scale=dynamic" 2>&1 | FileCheck %s --check-prefix=SCALE
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd pipeline=0" 2>&1 | FileCheck %s --check-prefix=ZERO
// CHECK-LABEL: func.func @train_step
// CHECK: %[[H0:.*]] = forge.matmul %arg0, %arg4 {forge.micro = 0 : i64, forge.stage = 0 : i64}
// CHECK: forge.relu %[[H0]] {forge.micro = 0 : i64, forge.stage = 1 : i64}
// The relu's gradient (stage 1) and the first matmul's (stage 0), micro-batch 0:
// CHECK: forge.where {{.*}} {forge.backward, forge.micro = 0 : i64, forge.stage = 1 : i64}
// CHECK: forge.gemm %arg0, {{.*}} forge.backward, forge.micro = 0 : i64, forge.stage = 0 : i64
// CHECK: forge.matmul %arg2, %arg4 {forge.micro = 1 : i64, forge.stage = 0 : i64}
// The micro-batch sum of w1's gradient: unmarked stage, kept f32 (forge.accumulates).
// CHECK: forge.add {{.*}} {forge.accumulates, forge.backward, forge.micro = 1 : i64}
// CHECK: forge.sub %arg4, {{.*}} {forge.stage = 0 : i64}
// CHECK: forge.sub %arg5, {{.*}} {forge.stage = 1 : i64}
// NONE-NOT: forge.stage
// NONE-NOT: forge.micro =
// SCALE: error: --pp with --loss-scale is not supported yet
// ZERO: error: --pp must be >= 1
func.func @main(%x: tensor<4x3xf32> {forge.name = "x"}) -> (tensor<4x2xf32> {forge.name = "y"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.5> : tensor<3x5xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.25> : tensor<5x2xf32>
  %h = forge.matmul %x, %w1 : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
  %r = forge.relu %h : (tensor<4x5xf32>) -> tensor<4x5xf32>
  %y = forge.matmul %r, %w2 : (tensor<4x5xf32>, tensor<5x2xf32>) -> tensor<4x2xf32>
  return %y : tensor<4x2xf32>
}
