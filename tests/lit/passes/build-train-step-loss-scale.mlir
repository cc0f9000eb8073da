// Dynamic loss scaling (forgec --loss-scale, the default of --precision fp16): the scale
// and the count of finite steps are state; the backward starts from the scale; the
// optimizer reads the gradients times 1/scale; every optimizer update keeps its old value when the sum
// of squared gradients (unscaled as a scalar) is not finite (less than +inf is false for inf and NaN); the step
// returns the next scale and count, the scale it used and whether it skipped.
// RUN: forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd:lr=0.5 loss-scale=dynamic:init=1024,interval=3" | FileCheck %s
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %[[W:arg[0-9]+]]: tensor<2xf32> {forge.initial_value = dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32>, forge.kind = "parameter", forge.name = "w"
// CHECK-SAME: %[[S:arg[0-9]+]]: tensor<f32> {forge.initial_value = dense<1.024000e+03> : tensor<f32>, forge.kind = "state", forge.name = "forge.loss_scale", forge.role = "loss_scale"}
// CHECK-SAME: %[[G:arg[0-9]+]]: tensor<f32> {forge.initial_value = dense<0.000000e+00> : tensor<f32>, forge.kind = "state", forge.name = "forge.good_steps", forge.role = "loss_scale"}
// CHECK-SAME: {forge.updates = "w"}, tensor<f32> {forge.updates = "forge.loss_scale"}, tensor<f32> {forge.updates = "forge.good_steps"}, tensor<f32> {forge.name = "forge.loss_scale_used"}, tensor<f32> {forge.name = "forge.skipped"})
// CHECK: forge.mul %{{.*}}, %[[S]]
// CHECK: %[[INV:.+]] = forge.div %{{.*}}, %[[S]]
// CHECK: forge.mul %[[INV]], %[[INV]]
// CHECK: %[[INF:.+]] = forge.constant dense<0x7F800000>
// CHECK: %[[FINITE:.+]] = forge.less %{{.*}}, %[[INF]] : (tensor<f32>, tensor<f32>) -> tensor<i1>
// CHECK: %[[NEW:.+]] = forge.sub %[[W]]
// CHECK: %[[KEPT:.+]] = forge.where %[[FINITE]], %[[NEW]], %[[W]]
// Grown after interval = 3 finite steps (count > 2.5); backed off otherwise.
// CHECK: %[[COUNT:.+]] = forge.where %[[FINITE]]
// CHECK: %[[GROWN:.+]] = forge.less %{{.*}}, %[[COUNT]]
// CHECK: %[[UP:.+]] = forge.where %[[GROWN]], %{{.*}}, %[[S]]
// CHECK: %[[NEXT:.+]] = forge.where %[[FINITE]], %[[UP]], %{{.*}}
// CHECK: %[[RESET:.+]] = forge.where %[[GROWN]], %{{.*}}, %[[COUNT]]
// CHECK: %[[SKIP:.+]] = forge.where %[[FINITE]]
// CHECK: return %{{.*}}, %{{.*}}, %{{.*}}, %[[KEPT]], %[[NEXT]], %[[RESET]], %[[S]], %[[SKIP]]
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd loss-scale=dynamic:growth=1" 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: --loss-scale: 'growth=1' is not a dynamic loss scaling option
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd loss-scale=static" 2>&1 | FileCheck %s --check-prefix=KIND
// KIND: error: --loss-scale: unknown loss scaling 'static' (none, dynamic)
func.func @main(%x: tensor<2xf32> {forge.name = "x"}) -> (tensor<2xf32> {forge.name = "y"}) {
  %w = forge.constant {forge.initializer = "w"} dense<[1.0, 2.0]> : tensor<2xf32>
  %y = forge.mul %x, %w : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  return %y : tensor<2xf32>
}
