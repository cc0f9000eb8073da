// RUN: forge-opt %s --mlir-print-op-on-diagnostic=false --forge-assign-pipeline-stages="stages=2" --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 pipeline=2 grad-norm=true" --forge-split-pipeline-stages 2>&1 | FileCheck %s
// RUN: forge-opt %s --forge-split-pipeline-stages | FileCheck %s --check-prefix=NONE
// RUN: forge-opt %s --mlir-print-op-on-diagnostic=false --forge-assign-pipeline-stages="stages=2" --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 pipeline=2 grad-norm=true" --forge-split-pipeline-stages 2>&1 | FileCheck %s --check-prefix=FEW
// Fewer micro-batches than stages: a warning with the bubble.
// FEW: warning: --pp 2 with 1 micro-batch(es): each stage idles 50% of the step; use --micro-batches >= 2
// FEW: bubble: 1 of 2 slots per stage idle (50.00%)
// RUN: forge-opt %s --mlir-print-op-on-diagnostic=false --forge-assign-pipeline-stages="stages=2" --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 pipeline=2 data-parallel=2 grad-norm=true" --forge-split-pipeline-stages 2>&1 | FileCheck %s --check-prefix=DP

// Two layers over two stages, two micro-batches. Stage 0 runs both forward
// passes before its first backward (1F1B's warm-up), stage 1 alternates.
// CHECK: forge.pipeline_schedule = "train_step stage 0: F0 F1 B0 B1\0Atrain_step stage 1: F0 B0 F1 B1\0Abubble: 1 of 3 slots per stage idle (33.33%)"
// Stage 0: the first layer of micro-batch 0, its activation sent to stage 1
// (tag 0), then micro-batch 1's (tag 2); the activation gradients come back
// (tags 1, 3), each message chained to the one before by its token; the norm's
// partial sum goes to stage 1 (tag 4), w1 is updated here, and the loss and
// the norm arrive from stage 1 (tags 5, 6). It returns w1's update, not w2's.
// CHECK-LABEL: func.func @"train_step@pp0"
// CHECK: %[[A0:.*]] = forge.matmul %arg0, %arg4
// CHECK-NEXT: %[[T0:.*]] = forge.send %[[A0]] {group = "pp", peer = 1 : i64, size = 2 : i64, tag = 0 : i64}
// CHECK: %[[A1:.*]] = forge.matmul %arg2, %arg4
// CHECK-NEXT: %[[T1:.*]] = forge.send %[[A1]], %[[T0]] {group = "pp", peer = 1 : i64, size = 2 : i64, tag = 2 : i64}
// CHECK: %[[G0:.*]], %[[T2:.*]] = forge.recv %[[T1]] {group = "pp", peer = 1 : i64, size = 2 : i64, tag = 1 : i64}
// CHECK: forge.recv %[[T2]] {group = "pp", peer = 1 : i64, size = 2 : i64, tag = 3 : i64}
// CHECK: forge.send {{.*}} {group = "pp", peer = 1 : i64, size = 2 : i64, tag = 4 : i64} : (tensor<f32>, tensor<0xi1>) -> tensor<0xi1>
// CHECK: %[[W1:.*]] = forge.sub %arg4
// CHECK: %[[LOSS:.*]], %{{.*}} = forge.recv {{.*}} tag = 5 : i64
// CHECK: %[[NORM:.*]], %{{.*}} = forge.recv {{.*}} tag = 6 : i64
// CHECK: return %[[LOSS]], %{{.*}}, %[[NORM]], %[[W1]] : tensor<f32>, tensor<f32>, tensor<f32>, tensor<3x5xf32>
// Stage 1: receives each activation, sends its gradient back, computes the
// loss and the whole norm, updates w2.
// CHECK-LABEL: func.func @"train_step@pp1"
// CHECK: forge.recv {group = "pp", peer = 0 : i64, size = 2 : i64, tag = 0 : i64}
// CHECK: forge.send {{.*}} tag = 1 : i64
// CHECK: forge.recv {{.*}} tag = 2 : i64
// CHECK: forge.send {{.*}} tag = 3 : i64
// CHECK: forge.send {{.*}} tag = 5 : i64
// CHECK: forge.recv {{.*}} tag = 4 : i64
// CHECK: forge.sqrt
// CHECK: forge.send {{.*}} tag = 6 : i64
// CHECK: %[[W2:.*]] = forge.sub %arg5
// CHECK: return {{.*}}, %[[W2]] : tensor<f32>, tensor<f32>, tensor<f32>, tensor<5x2xf32>
// Evaluation is split too (no micro-batches: no reordering).
// CHECK-LABEL: func.func @"eval@pp0"
// CHECK: forge.send {{.*}} tag = 7 : i64
// CHECK-LABEL: func.func @"eval@pp1"
// CHECK: forge.recv {{.*}} tag = 7 : i64
// CHECK-NOT: func.func @train_step(
// With --dp 2 the one all_reduce of the train step becomes one per stage: stage
// 0 averages w1's gradient over its data-parallel group, stage 1 w2's and the loss.
// DP-LABEL: func.func @"train_step@pp0"
// DP: forge.all_reduce %{{.*}} {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<3x5xf32>) -> tensor<3x5xf32>
// DP-NOT: forge.all_reduce
// DP-LABEL: func.func @"train_step@pp1"
// DP: forge.all_reduce %{{.*}}, %{{.*}} {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<5x2xf32>, tensor<f32>) -> (tensor<5x2xf32>, tensor<f32>)
// DP-NOT: forge.all_reduce
// Without marks the pass changes nothing.
// NONE-NOT: forge.send
// NONE-NOT: @pp0
func.func @main(%x: tensor<4x3xf32> {forge.name = "x"}) -> (tensor<4x2xf32> {forge.name = "y"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.5> : tensor<3x5xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.25> : tensor<5x2xf32>
  %h = forge.matmul %x, %w1 : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
  %r = forge.relu %h : (tensor<4x5xf32>) -> tensor<4x5xf32>
  %y = forge.matmul %r, %w2 : (tensor<4x5xf32>, tensor<5x2xf32>) -> tensor<4x2xf32>
  return %y : tensor<4x2xf32>
}
