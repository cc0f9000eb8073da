// RUN: forge-opt %s --split-input-file --forge-augment-inputs="input=x pixels=1 mean=0.5,0.25,0 std=0.5,0.25,2" | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-augment-inputs="input=x mean=1,2,3" | FileCheck %s --check-prefix=FLOAT
// RUN: forge-opt %s --split-input-file --forge-augment-inputs="input=y pixels=1" | FileCheck %s --check-prefix=NONE
// RUN: forge-opt %s --split-input-file --forge-augment-inputs="input=x pixels=1 flip=1" | FileCheck %s --check-prefix=FLIP
// RUN: forge-opt %s --split-input-file --forge-augment-inputs="input=x flip=1" | FileCheck %s --check-prefix=FLIPF
// RUN: not forge-opt %s --split-input-file --forge-augment-inputs="input=x mean=1,2" 2>&1 | FileCheck %s --check-prefix=COUNT
// RUN: not forge-opt %s --split-input-file --forge-augment-inputs="input=x std=1,0,1" 2>&1 | FileCheck %s --check-prefix=STD
// RUN: forge-opt %s --split-input-file --forge-augment-inputs="input=x pixels=1 canvas-height=8 canvas-width=9" | FileCheck %s --check-prefix=CANVAS
// RUN: not forge-opt %s --split-input-file --forge-augment-inputs="input=x canvas-height=8 canvas-width=9" 2>&1 | FileCheck %s --check-prefix=NOPIX
// RUN: not forge-opt %s --split-input-file --forge-augment-inputs="input=x pixels=1 canvas-height=8" 2>&1 | FileCheck %s --check-prefix=NOPIX

// Pixels: the argument becomes u8 [B, H, W, C]; cast, one multiply-add with [C]
// coefficients (scale = 1 / (255 std): 2/255, 4/255, 1/510; shift = -mean / std: -1, -1, 0)
// and a transpose to the model's [B, C, H, W].
// CHECK-LABEL: func @image
// CHECK-SAME: (%[[ARG:.*]]: tensor<2x4x5x3xui8> {forge.name = "x"})
// CHECK: %[[C:.*]] = forge.cast %[[ARG]] {{.*}} -> tensor<2x4x5x3xf32>
// CHECK: %[[S:.*]] = forge.constant dense<[0.00784313772, 0.0156862754, 0.00196078443]> : tensor<3xf32>
// CHECK: %[[M:.*]] = forge.mul %[[C]], %[[S]]
// CHECK: %[[B:.*]] = forge.constant dense<[-1.000000e+00, -1.000000e+00, -0.000000e+00]> : tensor<3xf32>
// CHECK: %[[A:.*]] = forge.add %[[M]], %[[B]]
// CHECK: %[[T:.*]] = forge.transpose %[[A]] {perm = array<i64: 0, 3, 1, 2>} : (tensor<2x4x5x3xf32>) -> tensor<2x3x4x5xf32>
// CHECK: forge.relu %[[T]]
// The float form normalizes the input in place with [C, 1, 1] coefficients.
// FLOAT-LABEL: func @image
// FLOAT-SAME: (%[[ARG:.*]]: tensor<2x3x4x5xf32> {forge.name = "x"})
// FLOAT: %[[B:.*]] = forge.constant dense<{{\[\[\[}}-1.000000e+00]], {{\[\[}}-2.000000e+00]], {{\[\[}}-3.000000e+00]]]> : tensor<3x1x1xf32>
// FLOAT-NEXT: %[[N:.*]] = forge.add %[[ARG]], %[[B]]
// FLOAT-NEXT: forge.relu %[[N]]
// flip: a per-sample draw (dropout of ratio 1/2 over [B, 1, 1, 1] ones: 2 or 0 in train_step,
// 1 in eval), and where(draw > 1.5, x mirrored along the width, x); on the NHWC pixels the
// width is axis 2, before the transpose.
// FLIP-LABEL: func @image
// FLIP: %[[X:.*]] = forge.mul
// FLIP: %[[ONES:.*]] = forge.constant dense<1.000000e+00> : tensor<2x1x1x1xf32>
// FLIP: %[[DRAW:.*]], %{{.*}} = forge.dropout %[[ONES]] {ratio = 5.000000e-01 : f64
// FLIP: %[[HALF:.*]] = forge.constant dense<1.500000e+00> : tensor<f32>
// FLIP: %[[SEL:.*]] = forge.greater %[[DRAW]], %[[HALF]]
// FLIP: %[[MIR:.*]] = forge.slice %[[X]] {ends = array<i64: 2, 4, -1, 3>, starts = array<i64: 0, 0, 4, 0>, steps = array<i64: 1, 1, -1, 1>}
// FLIP: %[[W:.*]] = forge.where %[[SEL]], %[[MIR]], %[[X]]
// FLIP: forge.transpose %[[W]] {perm = array<i64: 0, 3, 1, 2>}
// On a float [B, C, H, W] input the width is axis 3.
// FLIPF-LABEL: func @image
// FLIPF: forge.slice %arg0 {ends = array<i64: 2, 3, 4, -1>, starts = array<i64: 0, 0, 0, 4>, steps = array<i64: 1, 1, 1, -1>}
// An input the function does not have: nothing changes.
// NONE-LABEL: func @image
// NONE-SAME: (%[[ARG:.*]]: tensor<2x3x4x5xf32> {forge.name = "x"})
// NONE-NEXT: forge.relu %[[ARG]]
// A canvas: the u8 argument is [B, Hc, Wc, C], the boxes x.crop [B, 6] follow it, and
// resized_crop makes the [B, H, W, C] pixels (f32, 0..255) the normalization takes.
// CANVAS-LABEL: func @image
// CANVAS-SAME: (%[[ARG:.*]]: tensor<2x8x9x3xui8> {forge.name = "x"}, %[[BOX:.*]]: tensor<2x6xf32> {forge.name = "x.crop"})
// CANVAS: %[[C:.*]] = forge.resized_crop %[[ARG]], %[[BOX]] {height = 4 : i64, width = 5 : i64} : (tensor<2x8x9x3xui8>, tensor<2x6xf32>) -> tensor<2x4x5x3xf32>
// CANVAS: forge.mul %[[C]]
// CANVAS: forge.transpose
// CANVAS-SAME: -> tensor<2x3x4x5xf32>
// NOPIX: error: --augment: input 'x' canvas=HxW needs pixels and a positive height and width
// COUNT: error: --augment: input 'x' has 3 channels but mean has 2 values
// STD: error: --augment: input 'x' std values must be positive
func.func @image(%x: tensor<2x3x4x5xf32> {forge.name = "x"}) -> tensor<2x3x4x5xf32> {
  %y = forge.relu %x : (tensor<2x3x4x5xf32>) -> tensor<2x3x4x5xf32>
  return %y : tensor<2x3x4x5xf32>
}

// -----

// Not an image tensor.
// RUN: not forge-opt %s --split-input-file --forge-augment-inputs="input=v pixels=1" 2>&1 | FileCheck %s --check-prefix=RANK
// RANK: error: --augment: input 'v' must be a static rank-4 float tensor [B, C, H, W], not a tensor of rank 2
func.func @vector(%v: tensor<2x3xf32> {forge.name = "v"}) -> tensor<2x3xf32> {
  return %v : tensor<2x3xf32>
}
