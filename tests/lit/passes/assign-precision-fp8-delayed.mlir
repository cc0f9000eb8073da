// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-scaling=delayed fp8-history=8" 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-scaling=delayed fp8-history=8" 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: not forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-scaling=later" 2>&1 | FileCheck %s --check-prefix=BADSCALING
// RUN: not forge-opt %s --split-input-file --forge-assign-precision="precision=fp8 fp8-scaling=delayed fp8-history=0" 2>&1 | FileCheck %s --check-prefix=BADHISTORY

// fp8-scaling=delayed: the activation %h (made by the first GEMM, read by the
// second) is scaled by the largest amax of its history, a state argument [8]
// named after the node that made it, initially [448, 0, ...]:
//  * the history's maximum is one more member of the entry's multi_reduce
//    (beside the arguments' amaxes: x and w's copy keep current scaling);
//  * h's cast follows h at once and reads that maximum, not h's own amax;
//  * h's own amax comes after the cast and only fills slot (step - 1) mod 8
//    of the history, which is returned as its update.
// CHECK-LABEL: func @train_step
// CHECK-SAME: %[[STEP:arg3]]: tensor<f32> {forge.kind = "input", forge.name = "forge.step"}
// CHECK-SAME: %[[HIST:arg[0-9]+]]: tensor<8xf32> {forge.initial_value = dense<[4.480000e+02, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00]> : tensor<8xf32>, forge.kind = "state", forge.name = "fc1.fp8_amax_history", forge.role = "fp8_amax_history"}
// CHECK-SAME: -> (tensor<32x32xf32>, tensor<8xf32> {forge.updates = "fc1.fp8_amax_history"})
// CHECK: %[[ONE:.+]] = forge.constant dense<1.000000e+00> : tensor<f32>
// CHECK: %[[LEN:.+]] = forge.constant dense<8.000000e+00> : tensor<f32>
// CHECK: %[[IOTA:.+]] = forge.constant dense<[0.000000e+00, 1.000000e+00, 2.000000e+00, 3.000000e+00, 4.000000e+00, 5.000000e+00, 6.000000e+00, 7.000000e+00]> : tensor<8xf32>
// CHECK: %[[MAX:.+]] = forge.constant dense<4.480000e+02> : tensor<f32>
// CHECK: %[[ENTRY:.+]]:4 = forge.fusion "multi_reduce"(%arg0, %arg4, %[[HIST]], %arg5, %{{.+}})
// CHECK: %[[H:.+]] = forge.fusion "gemm"
// CHECK: forge.scaled_gemm
// CHECK: %[[HQ:.+]] = forge.fusion "loop"(%[[H]], %[[ENTRY]]#2, %[[MAX]]) : {{.*}} -> tensor<32x32xf8E4M3FN>
// CHECK: %[[NOW:.+]] = forge.fusion "multi_reduce"(%[[H]], %{{.+}}) : (tensor<32x32xbf16>, tensor<f32>) -> tensor<f32>
// CHECK: %[[Y:.+]] = forge.scaled_gemm %[[HQ]], %{{.+}}, %[[ENTRY]]#2, %[[ENTRY]]#3
// CHECK: %[[NEXT:.+]] = forge.fusion "loop"(%[[HIST]], %[[NOW]], %[[STEP]], %[[ONE]], %[[LEN]], %[[IOTA]]) : {{.*}} -> tensor<8xf32>
// CHECK: forge.sub
// CHECK-NEXT: forge.sub
// CHECK-NEXT: forge.div
// CHECK-NEXT: forge.floor
// CHECK-NEXT: forge.equal
// CHECK-NEXT: forge.where
// CHECK: return %[[Y]], %[[NEXT]]
// REMARK: 2 GEMM(s) run in float8 (E4M3) from 4 scaled copies, 1 of them with delayed scaling (amax histories of 8 steps)
// BADSCALING: unknown fp8-scaling 'later' (current, delayed)
// BADHISTORY: fp8-history must be 1..65536, not 0
func.func @train_step(%x: tensor<32x16xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<32x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<32x16xf32>},
                      %w2: tensor<32x32xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.25> : tensor<32x32xf32>},
                      %step: tensor<f32> {forge.kind = "input", forge.name = "forge.step"})
    -> (tensor<32x32xf32>) {
  %h = forge.fusion "gemm"(%x, %w) : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32> {
  ^bb0(%a: tensor<32x16xf32>, %b: tensor<32x16xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32>
    %1 = forge.relu %0 : (tensor<32x32xf32>) -> tensor<32x32xf32>
    forge.yield %1 : tensor<32x32xf32>
  } loc("fc1")
  %y = forge.gemm %h, %w2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  return %y : tensor<32x32xf32>
}

// -----

// Negative: two activations, and a step without forge.step. Each of the two
// has its own history (histories merged into one horizontal update); the
// routine without forge.step (not a training step's form) keeps current
// scaling and gets no history.
// CHECK-LABEL: func @train_step
// CHECK-SAME: forge.name = "fc1.fp8_amax_history"
// CHECK-SAME: forge.name = "fc2.fp8_amax_history"
// CHECK: forge.fusion "horizontal"
// CHECK-COUNT-2: forge.where
// REMARK: 3 GEMM(s) run in float8 (E4M3) from 6 scaled copies, 2 of them with delayed scaling (amax histories of 8 steps)
func.func @train_step(%x: tensor<32x16xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<32x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<32x16xf32>},
                      %w2: tensor<32x32xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.25> : tensor<32x32xf32>},
                      %w3: tensor<32x32xf32> {forge.kind = "parameter", forge.name = "w3", forge.initial_value = dense<0.25> : tensor<32x32xf32>},
                      %step: tensor<f32> {forge.kind = "input", forge.name = "forge.step"})
    -> (tensor<32x32xf32>) {
  %h = forge.fusion "gemm"(%x, %w) : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32> {
  ^bb0(%a: tensor<32x16xf32>, %b: tensor<32x16xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32>
    %1 = forge.relu %0 : (tensor<32x32xf32>) -> tensor<32x32xf32>
    forge.yield %1 : tensor<32x32xf32>
  } loc("fc1")
  %h2 = forge.fusion "gemm"(%h, %w2) : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32> {
  ^bb0(%a: tensor<32x32xf32>, %b: tensor<32x32xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
    %1 = forge.relu %0 : (tensor<32x32xf32>) -> tensor<32x32xf32>
    forge.yield %1 : tensor<32x32xf32>
  } loc("fc2")
  %y = forge.gemm %h2, %w3 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  return %y : tensor<32x32xf32>
}

// -----

// CHECK-LABEL: func @train_step
// CHECK-NOT: fp8_amax_history
// CHECK: forge.fusion "multi_reduce"
// CHECK: forge.scaled_gemm
// CHECK-NOT: fp8_amax_history
// REMARK: 2 GEMM(s) run in float8 (E4M3) from 4 scaled copies{{$}}
func.func @train_step(%x: tensor<32x16xf32> {forge.kind = "input", forge.name = "x"},
                      %w: tensor<32x16xf32> {forge.kind = "parameter", forge.name = "w", forge.initial_value = dense<0.5> : tensor<32x16xf32>},
                      %w2: tensor<32x32xf32> {forge.kind = "parameter", forge.name = "w2", forge.initial_value = dense<0.25> : tensor<32x32xf32>})
    -> (tensor<32x32xf32>) {
  %h = forge.fusion "gemm"(%x, %w) : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32> {
  ^bb0(%a: tensor<32x16xf32>, %b: tensor<32x16xf32>):
    %0 = forge.gemm %a, %b {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x32xf32>
    %1 = forge.relu %0 : (tensor<32x32xf32>) -> tensor<32x32xf32>
    forge.yield %1 : tensor<32x32xf32>
  }
  %y = forge.gemm %h, %w2 {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  return %y : tensor<32x32xf32>
}
