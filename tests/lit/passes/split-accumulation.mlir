// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 grad-norm=true" --forge-split-accumulation | FileCheck %s
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 grad-norm=true" --forge-split-accumulation | FileCheck %s --check-prefix=FIRST
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 grad-norm=true" --forge-split-accumulation=gemm-accumulation=1 | FileCheck %s --check-prefix=GEMM
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 data-parallel=2 grad-norm=true" --forge-split-accumulation | FileCheck %s --check-prefix=DP
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 accumulate=unroll grad-norm=true" --forge-split-accumulation | FileCheck %s --check-prefix=UNROLL
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=4 dynamic-micro-batches=1 grad-norm=true" --forge-split-accumulation | FileCheck %s --check-prefix=DYN
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 accumulate=unroll dynamic-micro-batches=1" 2>&1 | FileCheck %s --check-prefix=DYNBAD
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 accumulate=loop pipeline=2" 2>&1 | FileCheck %s --check-prefix=PP
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 micro-batches=2 accumulate=loops" 2>&1 | FileCheck %s --check-prefix=BAD

// Two micro-batches in a loop: @accumulate is one micro-batch's forward and
// backward over its data inputs (no @k suffix), adding each gradient and the
// loss into the accumulators, whose sums it returns as their updates.
// CHECK-LABEL: func.func @accumulate(
// CHECK-SAME: forge.name = "x"
// CHECK-SAME: forge.name = "t"
// CHECK-SAME: %[[A1:[a-z0-9]+]]: tensor<3x5xf32> {forge.kind = "state", forge.name = "w1.grad_accum", forge.role = "grad_accumulator"}
// CHECK-SAME: %[[A2:[a-z0-9]+]]: tensor<5x2xf32> {forge.kind = "state", forge.name = "w2.grad_accum", forge.role = "grad_accumulator"}
// CHECK-SAME: forge.name = "forge.loss_accum"
// CHECK-SAME: forge.name = "forge.micro_index"
// CHECK-SAME: -> (tensor<3x5xf32> {forge.updates = "w1.grad_accum"}, tensor<5x2xf32> {forge.updates = "w2.grad_accum"}, tensor<f32> {forge.updates = "forge.loss_accum"})
// CHECK-NOT: forge.accumulated
// The first micro-batch (forge.micro_index % 2 == 0) replaces what they hold.
// CHECK: %[[M:.*]] = forge.mod %{{.*}}, %{{.*}} {fmod = false}
// CHECK: %[[FLAG:.*]] = forge.equal %[[M]],
// CHECK: %[[P1:.*]] = forge.add %[[A1]], %[[T1:[^ ]*]] {forge.accumulates}
// CHECK: %[[S1:.*]] = forge.where %[[FLAG]], %[[T1]], %[[P1]] {forge.accumulates}
// CHECK: %[[P2:.*]] = forge.add %[[A2]], %[[T2:[^ ]*]] {forge.accumulates}
// CHECK: %[[S2:.*]] = forge.where %[[FLAG]], %[[T2]], %[[P2]] {forge.accumulates}
// CHECK: return %[[S1]], %[[S2]], %{{.*}} :
// The rest of the step reads the accumulators where it read the sums (the
// norm, the update) and has no data inputs; it does not write them.
// CHECK-LABEL: func.func @train_step(
// CHECK-NOT: forge.kind = "input", forge.name = "x"
// CHECK-SAME: %[[W1:[a-z0-9]+]]: tensor<3x5xf32> {{{.*}}forge.name = "w1"
// CHECK-SAME: %[[G1:[a-z0-9]+]]: tensor<3x5xf32> {forge.kind = "state", forge.name = "w1.grad_accum"
// CHECK-SAME: forge.name = "forge.step"
// CHECK-NOT: forge.micro_index
// CHECK-NOT: forge.updates = "w1.grad_accum"
// CHECK-NOT: forge.accumulated
// CHECK: forge.mul %[[G1]], %[[G1]]
// CHECK: forge.sub %[[W1]],
// CHECK: return
// CHECK-LABEL: func.func @eval(

// The first micro-batch's routine writes each term: no where, no add, no read of
// the accumulators (their arguments unused), the same inputs.
// FIRST-LABEL: func.func @accumulate_first(
// FIRST-SAME: forge.name = "x"
// FIRST-SAME: forge.name = "forge.micro_index"
// FIRST-NOT: forge.where {{.*}}forge.accumulates
// FIRST-NOT: forge.accumulates
// FIRST: %[[W1:.*]] = forge.gemm %{{.*}}, %{{.*}} {alpha = 1.000000e+00 : f64, beta = 0.000000e+00 : f64, transA = true, transB = false} : (tensor<4x3xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>
// FIRST: return %[[W1]], %{{.*}}, %{{.*}} :
// FIRST-LABEL: func.func @accumulate(

// CUDA (gemm-accumulation): a weight gradient that a lone GEMM makes is added through
// the GEMM's C, beta = 1, into the accumulator (the loss keeps its where/add).
// GEMM-LABEL: func.func @accumulate(
// GEMM-SAME: %[[A1:[a-z0-9]+]]: tensor<3x5xf32> {forge.kind = "state", forge.name = "w1.grad_accum"
// GEMM-SAME: %[[A2:[a-z0-9]+]]: tensor<5x2xf32> {forge.kind = "state", forge.name = "w2.grad_accum"
// GEMM: %[[G2:.*]] = forge.gemm %{{.*}}, %{{.*}}, %[[A2]] {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64
// GEMM: %[[G1:.*]] = forge.gemm %{{.*}}, %{{.*}}, %[[A1]] {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64
// GEMM: forge.where {{.*}} {forge.accumulates} : (tensor<i1>, tensor<f32>, tensor<f32>)
// GEMM: return %[[G1]], %[[G2]], %{{.*}} :

// Data parallelism: the one all_reduce runs after the loop, on the sums.
// DP-LABEL: func.func @accumulate(
// DP-NOT: forge.all_reduce
// DP-LABEL: func.func @train_step(
// DP: forge.all_reduce %{{.*}}, %{{.*}}, %{{.*}} {group = "dp", reduction = "mean", size = 2 : i64}

// Unrolled: one step with each micro-batch's inputs, no cut.
// UNROLL-NOT: @accumulate
// UNROLL: forge.name = "x@0"
// UNROLL-SAME: forge.name = "x@1"
// UNROLL-NOT: forge.accumulated
// UNROLL-NOT: @accumulate

// A varying count (forgec --batch-schedule): both routines read forge.micro_count; the
// first micro-batch is index % count == 0, the seed and the loss mean 1 / count, which
// the rest of the step computes again from the input (recomputed, not read across).
// DYN-LABEL: func.func @accumulate(
// DYN-SAME: %[[I:[a-z0-9]+]]: tensor<i64> {forge.kind = "input", forge.name = "forge.micro_index"}
// DYN-SAME: %[[C:[a-z0-9]+]]: tensor<i64> {forge.kind = "input", forge.name = "forge.micro_count"}
// DYN: forge.cast %[[C]] {to = f32}
// DYN: forge.mod %[[I]], %[[C]] {fmod = false}
// DYN-LABEL: func.func @train_step(
// DYN-NOT: forge.micro_index
// DYN-SAME: %[[C2:[a-z0-9]+]]: tensor<i64> {forge.kind = "input", forge.name = "forge.micro_count"}
// DYN: %[[F:.*]] = forge.cast %[[C2]] {to = f32}
// DYN: forge.div %{{.*}}, %[[F]]
// DYNBAD: a varying number of micro-batches (--batch-schedule) needs the accumulation loop
// PP: --accumulate loop with --pp: pipeline stages interleave the unrolled micro-batches (1F1B); use --accumulate unroll
// BAD: --accumulate must be loop or unroll (got 'loops')
func.func @main(%x: tensor<4x3xf32> {forge.name = "x"}) -> (tensor<4x2xf32> {forge.name = "y"}) {
  %w1 = forge.constant {forge.initializer = "w1"} dense<0.5> : tensor<3x5xf32>
  %w2 = forge.constant {forge.initializer = "w2"} dense<0.25> : tensor<5x2xf32>
  %h = forge.matmul %x, %w1 : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
  %r = forge.relu %h : (tensor<4x5xf32>) -> tensor<4x5xf32>
  %y = forge.matmul %r, %w2 : (tensor<4x5xf32>, tensor<5x2xf32>) -> tensor<4x2xf32>
  return %y : tensor<4x2xf32>
}
