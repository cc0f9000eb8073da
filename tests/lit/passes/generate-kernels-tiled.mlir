// RUN: forge-opt %s --split-input-file --forge-generate-kernels 2>&1 | FileCheck %s
// Both sides of a tiled kernel are coalesced (the untiled forms read strided):
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// A transpose that moves the innermost dimension ([64, 96] -> [96, 64] bf16)
// runs in tiles through shared memory: 32 x 32 tiles (rows padded to 33),
// 256 threads a block, a grid of one block per tile (6), two barriers per
// tile (after staging, before the next tile overwrites it).
// CHECK-LABEL: func.func @transpose
// CHECK: forge.transpose %arg0 {forge.launch = {block = 256 : i64, grid = 6 : i64, kernel = "k0_transpose"}
// CHECK: gpu.func @k0_transpose(%arg0: memref<6144xbf16>, %arg1: memref<6144xbf16>) workgroup(%[[TILE:.+]] : memref<1056xbf16, #gpu.address_space<workgroup>>) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: memref.load %arg0
// CHECK: memref.store %{{.*}}, %[[TILE]]
// CHECK: gpu.barrier
// CHECK: memref.load %[[TILE]]
// CHECK: memref.store %{{.*}}, %arg1
// CHECK: gpu.barrier
// COALESCED: kernel k0_transpose: 8 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @transpose(%x: tensor<64x96xbf16>) -> tensor<96x64xbf16> {
  %t = forge.transpose %x {perm = array<i64: 1, 0>} : (tensor<64x96xbf16>) -> tensor<96x64xbf16>
  return %t : tensor<96x64xbf16>
}

// -----

// An image to channels-last ([2, 3, 16, 16] -> [2, 16, 16, 3]): tiles as
// wide as the 3 channels and 256 rows (16 x 16 pixels, rows of ~1024 / 3
// rounded to warps, capped at the pixels), one per image.
// CHECK-LABEL: func.func @channels_last
// CHECK: {block = 256 : i64, grid = 2 : i64, kernel = "k0_transpose"}
// CHECK: gpu.func @k0_transpose(%arg0: memref<1536xf32>, %arg1: memref<1536xf32>) workgroup(%{{.+}} : memref<771xf32, #gpu.address_space<workgroup>>)
// COALESCED: kernel k0_transpose: 6 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @channels_last(%x: tensor<2x3x16x16xf32>) -> tensor<2x16x16x3xf32> {
  %t = forge.transpose %x {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x3x16x16xf32>) -> tensor<2x16x16x3xf32>
  return %t : tensor<2x16x16x3xf32>
}

// -----

// A view region that transposes tiles as the op does. A transpose that keeps
// the innermost dimension (a head split, [2, 4, 8, 16] -> [2, 8, 4, 16])
// moves runs of 16 elements, contiguous along the 4 heads in the input and
// along the 8 tokens in the output (a vector map kernel read 64-byte runs,
// two per warp): tiles of 8 tokens x 4 heads x the run, staged with the
// run fastest, then heads (4 * (8 * 16 + 1) = 516 elements), one per image.
// CHECK-LABEL: func.func @view_and_split
// CHECK: forge.fusion "loop"(%arg0) {forge.launch = {block = 256 : i64, grid = 2 : i64, kernel = "k0_fusion"}
// CHECK: forge.transpose %arg1 {forge.launch = {block = 256 : i64, grid = 2 : i64, kernel = "k1_transpose"}
// CHECK: gpu.func @k0_fusion(%arg0: memref<2048xf32>, %arg1: memref<2048xf32>) workgroup(%{{.+}} : memref<1056xf32, #gpu.address_space<workgroup>>)
// CHECK: gpu.func @k1_transpose(%arg0: memref<1024xf32>, %arg1: memref<1024xf32>) workgroup(%{{.+}} : memref<516xf32, #gpu.address_space<workgroup>>)
// COALESCED: kernel k0_fusion: 8 coalesced, 0 broadcast, 0 data-dependent, 0 strided
// COALESCED: kernel k1_transpose: 4 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @view_and_split(%x: tensor<32x64xf32>, %h: tensor<2x4x8x16xf32>) -> (tensor<64x32xf32>, tensor<2x8x4x16xf32>) {
  %v = forge.fusion "loop"(%x) : (tensor<32x64xf32>) -> tensor<64x32xf32> {
  ^bb0(%a: tensor<32x64xf32>):
    %t = forge.transpose %a {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
    forge.yield %t : tensor<64x32xf32>
  }
  %s = forge.transpose %h {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %v, %s : tensor<64x32xf32>, tensor<2x8x4x16xf32>
}
