// With --dp 2 the train step averages every gradient and the loss over the
// data-parallel group with one forge.all_reduce, before the gradient norm and
// the optimizer read them (forge-partition splits it into buckets later);
// eval has none. Without it there is no collective.
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 data-parallel=2 grad-norm=true" | FileCheck %s
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 grad-norm=true" | FileCheck %s --check-prefix=ONE
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd data-parallel=-1" 2>&1 | FileCheck %s --check-prefix=BAD
// A group of one (forgec --dp 1) has the collective too: the code path of D ranks.
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.1 data-parallel=1 grad-norm=true" | FileCheck %s --check-prefix=GROUP1
// GROUP1: forge.all_reduce {{.*}} {group = "dp", reduction = "mean", size = 1 : i64}
// CHECK-LABEL: func.func @train_step
// CHECK: %[[R:.*]]:2 = forge.all_reduce %{{.*}}, %{{.*}} {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<3x2xf32>, tensor<f32>) -> (tensor<3x2xf32>, tensor<f32>)
// CHECK-NOT: forge.all_reduce
// CHECK: forge.mul %[[R]]#0, %[[R]]#0
// CHECK: forge.sub
// CHECK: return %[[R]]#1
// CHECK-LABEL: func.func @eval
// CHECK-NOT: forge.all_reduce
// ONE-NOT: forge.all_reduce
// BAD: error: --dp must be >= 1
func.func @main(%x: tensor<4x3xf32> {forge.name = "x"}) -> (tensor<4x2xf32> {forge.name = "y"}) {
  %w = forge.constant {forge.initializer = "w"} dense<0.5> : tensor<3x2xf32>
  %y = forge.matmul %x, %w : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
  return %y : tensor<4x2xf32>
}
