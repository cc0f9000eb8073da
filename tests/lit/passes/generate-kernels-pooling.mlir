// RUN: forge-opt %s --split-input-file --forge-generate-kernels 2>&1 | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// Channels-last pooling over H and W with C = 8 (not a multiple of 32): a
// warp takes the image's 8 channels in 4 row groups (32 consecutive
// elements per load), lanes of one channel combine by shuffles 8 and 16
// apart, then the 8 warps through shared memory. One block per image, and
// (few images) the rows split over more blocks added atomically.
// CHECK-LABEL: func.func @mean_c8
// CHECK: forge.reduce_mean %arg0 {axes = array<i64: 1, 2>, forge.launch = {block = 256 : i64, grid = {{[0-9]+}} : i64, kernel = "k0_reduce_mean", zero_outputs}
// CHECK: gpu.func @k0_reduce_mean
// CHECK-COUNT-2: gpu.shuffle xor
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.barrier
// CHECK: memref.atomic_rmw addf
// COALESCED: kernel k0_reduce_mean: 2 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @mean_c8(%x: tensor<4x16x16x8xf32>) -> tensor<4x1x1x8xf32> {
  %m = forge.reduce_mean %x {axes = array<i64: 1, 2>, keepdims = true} : (tensor<4x16x16x8xf32>) -> tensor<4x1x1x8xf32>
  return %m : tensor<4x1x1x8xf32>
}

// -----

// C = 48: chunks of 32 channels (lanes past the 48th idle), one row a
// warp's load, no shuffles; bf16 read, f32 sums.
// CHECK-LABEL: func.func @sum_c48
// CHECK: gpu.func @k0_reduce_sum(%arg0: memref<3072xbf16>, %arg1: memref<192xf32>)
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.barrier
// COALESCED: kernel k0_reduce_sum: 2 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @sum_c48(%x: tensor<4x4x4x48xbf16>) -> tensor<4x1x1x48xf32> {
  %s = forge.reduce_sum %x {axes = array<i64: 1, 2>, keepdims = true} : (tensor<4x4x4x48xbf16>) -> tensor<4x1x1x48xf32>
  return %s : tensor<4x1x1x48xf32>
}

// -----

// Channels-first sums over N, H and W with 4 x 4 planes (16 elements, less
// than a warp): a warp takes 2 channels' planes of one image (32 consecutive
// elements), the 16 lanes of a channel combine by shuffles 1, 2, 4 and 8
// apart, warps take images in turn; one block per 2 channels (12).
// CHECK-LABEL: func.func @planes
// CHECK: forge.reduce_sum %arg0 {axes = array<i64: 0, 2, 3>, forge.launch = {block = 256 : i64, grid = 12 : i64, kernel = "k0_reduce_sum"}
// CHECK: gpu.func @k0_reduce_sum(%arg0: memref<1536xf32>, %arg1: memref<24xf32>)
// CHECK-COUNT-4: gpu.shuffle xor
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.barrier
// COALESCED: kernel k0_reduce_sum: 2 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @planes(%x: tensor<4x24x4x4xf32>) -> tensor<24xf32> {
  %s = forge.reduce_sum %x {axes = array<i64: 0, 2, 3>, keepdims = false} : (tensor<4x24x4x4xf32>) -> tensor<24xf32>
  return %s : tensor<24xf32>
}

// -----

// A channels-last 2x2 stride-2 max pool with 16 channels: lanes take (output
// pixel, tap column, channel), so each tap row is 32 consecutive elements a
// warp; the two columns' choices combine by one shuffle of the value and
// one of the offset (16 lanes apart); lanes of column 0 store (8 warps a
// block, a warp per output pixel: 32 blocks). Its f32
// gradient picks the same taps and adds dy there atomically (zeroed first).
// CHECK-LABEL: func.func @pool_c16
// CHECK: forge.max_pool %arg0 {{.*}}forge.launch = {block = 256 : i64, grid = 32 : i64, kernel = "k0_max_pool"}
// CHECK: forge.max_pool_grad %arg0, %arg1 {{.*}}forge.launch = {block = 256 : i64, grid = 32 : i64, kernel = "k1_max_pool_grad", zero_outputs}
// CHECK: gpu.func @k0_max_pool
// CHECK-COUNT-2: gpu.shuffle xor
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.func @k1_max_pool_grad
// CHECK-COUNT-2: gpu.shuffle xor
// CHECK: memref.atomic_rmw addf
// COALESCED: kernel k0_max_pool: 3 coalesced, 0 broadcast, 0 data-dependent, 0 strided
// COALESCED: kernel k1_max_pool_grad: 3 coalesced, 0 broadcast, 1 data-dependent, 0 strided
func.func @pool_c16(%x: tensor<4x16x16x16xbf16>, %dy: tensor<4x8x8x16xbf16>) -> (tensor<4x8x8x16xbf16>, tensor<4x16x16x16xf32>) {
  %y = forge.max_pool %x {ceil_mode = false, channels_last = true, dilations = array<i64: 1, 1>, kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<4x16x16x16xbf16>) -> tensor<4x8x8x16xbf16>
  %dx = forge.max_pool_grad %x, %dy {ceil_mode = false, channels_last = true, dilations = array<i64: 1, 1>, kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<4x16x16x16xbf16>, tensor<4x8x8x16xbf16>) -> tensor<4x16x16x16xf32>
  return %y, %dx : tensor<4x8x8x16xbf16>, tensor<4x16x16x16xf32>
}

// -----

// A channels-first 3x3 stride-2 max pool with padding (ResNet's, overlapping
// windows): a thread per output would read taps 2 elements from its
// neighbour's. A block stages the tile's input rows (all 9 output rows need
// rows -1..17 of the 17-row image: 19 x 20 floats, the row above the image
// -inf) in shared memory, each thread loading consecutive elements, then
// scans its windows there and stores consecutive outputs: 8 planes, one tile
// each. The f32 gradient reads dy consecutively and adds it at the chosen tap
// (data-dependent, zeroed first).
// CHECK-LABEL: func.func @pool_nchw
// CHECK: forge.max_pool %arg0 {{.*}}forge.launch = {block = 256 : i64, grid = 8 : i64, kernel = "k0_max_pool"}
// CHECK: forge.max_pool_grad %arg0, %arg1 {{.*}}forge.launch = {block = 256 : i64, grid = 8 : i64, kernel = "k1_max_pool_grad", zero_outputs}
// CHECK: gpu.func @k0_max_pool({{.*}}) workgroup(%{{.*}} : memref<380xf32, #gpu.address_space<workgroup>>)
// CHECK: gpu.barrier
// CHECK: gpu.barrier
// CHECK: gpu.func @k1_max_pool_grad
// CHECK: gpu.barrier
// CHECK: memref.atomic_rmw addf
// CHECK: gpu.barrier
// COALESCED: kernel k0_max_pool: 2 coalesced, 0 broadcast, 0 data-dependent, 0 strided
// COALESCED: kernel k1_max_pool_grad: 2 coalesced, 0 broadcast, 1 data-dependent, 0 strided
func.func @pool_nchw(%x: tensor<2x4x17x20xf32>, %dy: tensor<2x4x9x10xf32>) -> (tensor<2x4x9x10xf32>, tensor<2x4x17x20xf32>) {
  %y = forge.max_pool %x {ceil_mode = false, dilations = array<i64: 1, 1>, kernel_shape = array<i64: 3, 3>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>} : (tensor<2x4x17x20xf32>) -> tensor<2x4x9x10xf32>
  %dx = forge.max_pool_grad %x, %dy {ceil_mode = false, dilations = array<i64: 1, 1>, kernel_shape = array<i64: 3, 3>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>} : (tensor<2x4x17x20xf32>, tensor<2x4x9x10xf32>) -> tensor<2x4x17x20xf32>
  return %y, %dx : tensor<2x4x9x10xf32>, tensor<2x4x17x20xf32>
}
