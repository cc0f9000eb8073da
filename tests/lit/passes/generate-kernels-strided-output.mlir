// RUN: forge-opt %s --split-input-file --forge-generate-kernels 2>&1 | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// A loop region writing a concat's piece (forge.out_row_strides, from
// forge-fold-attention-views): dk's centring over [B, T, H, D] = [2, 4, 2, 16]
// stores each token's row of 32 bf16 elements 96 elements after the previous
// one: 8-element vectors, vector i of a row at (b * 4 * 96 + t * 96 + c) / 8.
// The output spans (2 * 4 - 1) * 96 + 32 = 704 elements (88 vectors); a
// warp's stores are whole 32-byte sectors, rows jumping forward: coalesced.
// CHECK-LABEL: func.func @centring
// CHECK: forge.fusion "loop"{{.*}}forge.launch = {{.*}}kernel = "k0_fusion"
// CHECK: gpu.func @k0_fusion(%arg0: memref<32xvector<8xbf16>>, %arg1: memref<8xvector<8xf32>>, %arg2: memref<88xvector<8xbf16>>)
// CHECK: arith.constant 384 : index
// CHECK: arith.constant 96 : index
// CHECK: memref.store {{.*}} : memref<88xvector<8xbf16>>
// COALESCED: kernel k0_fusion: 3 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @centring(%dk: tensor<2x4x2x16xbf16>, %m: tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16> {
  %c = forge.fusion "loop"(%dk, %m) {forge.out_row_strides = array<i64: 96>} : (tensor<2x4x2x16xbf16>, tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16> {
  ^bb0(%a: tensor<2x4x2x16xbf16>, %b: tensor<2x1x2x16xf32>):
    %0 = forge.cast %a {to = f32} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xf32>
    %1 = forge.sub %0, %b : (tensor<2x4x2x16xf32>, tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16>
    forge.yield %1 : tensor<2x4x2x16xbf16>
  }
  return %c : tensor<2x4x2x16xbf16>
}

// -----

// Without the attribute the same region stores packed: vector i at i.
// CHECK-LABEL: func.func @packed
// CHECK: gpu.func @k0_fusion(%arg0: memref<32xvector<8xbf16>>, %arg1: memref<8xvector<8xf32>>, %arg2: memref<32xvector<8xbf16>>)
// CHECK-NOT: arith.constant 96 : index
// CHECK: memref.store {{.*}} : memref<32xvector<8xbf16>>
func.func @packed(%dk: tensor<2x4x2x16xbf16>, %m: tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16> {
  %c = forge.fusion "loop"(%dk, %m) : (tensor<2x4x2x16xbf16>, tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16> {
  ^bb0(%a: tensor<2x4x2x16xbf16>, %b: tensor<2x1x2x16xf32>):
    %0 = forge.cast %a {to = f32} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xf32>
    %1 = forge.sub %0, %b : (tensor<2x4x2x16xf32>, tensor<2x1x2x16xf32>) -> tensor<2x4x2x16xbf16>
    forge.yield %1 : tensor<2x4x2x16xbf16>
  }
  return %c : tensor<2x4x2x16xbf16>
}
