// RUN: forge-opt %s --split-input-file --forge-generate-kernels --mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// A lines region (forge-fuse-line-reductions): dk's centring over [B, T, H, D] =
// [2, 8, 4, 16], writing a concat's piece 192 elements a token. Q = 64 columns of 2
// batches: one column a lane (wider vectors would leave SMs without a block): grid
// 2 * 64 / 32 = 4 blocks of 8 warps (one a key row), no atomics (no zeroed output). The
// output spans (2 * 8 - 1) * 192 + 64 = 2944 elements. Pass 1 adds eight rows'
// loads at a time, the warps' partials meet in shared memory (8 warps x 32 columns), pass
// 2 stores each element at its token's row.
// CHECK-LABEL: func.func @centring
// CHECK: forge.fusion "lines"{{.*}}forge.launch = {block = 256 : i64, grid = 4 : i64, kernel = "k0_fusion"}
// CHECK: gpu.func @k0_fusion(%arg0: memref<1024xbf16>, %arg1: memref<2944xbf16>) workgroup(%{{.+}} : memref<256xf32, #gpu.address_space<workgroup>>)
// CHECK-COUNT-8: memref.load %arg0
// CHECK: gpu.barrier
// CHECK: gpu.barrier
// CHECK: arith.constant 192 : index
// CHECK: memref.store {{.*}} : memref<2944xbf16>
// COALESCED: kernel k0_fusion: {{[0-9]+}} coalesced, {{[0-9]+}} broadcast, 0 data-dependent, 0 strided
func.func @centring(%dk: tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xbf16> {
  %c = forge.fusion "lines"(%dk) {forge.out_row_strides = array<i64: 192>} : (tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xbf16> {
  ^bb0(%a: tensor<2x8x4x16xbf16>):
    %m = forge.reduce_mean %a {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x4x16xbf16>) -> tensor<2x1x4x16xf32>
    %0 = forge.cast %a {to = f32} : (tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xf32>
    %1 = forge.sub %0, %m : (tensor<2x8x4x16xf32>, tensor<2x1x4x16xf32>) -> tensor<2x8x4x16xbf16>
    forge.yield %1 : tensor<2x8x4x16xbf16>
  }
  return %c : tensor<2x8x4x16xbf16>
}

// -----

// Enough column groups for every SM at 4 columns a lane (132 lines of 128 columns): V = 4,
// f32 4-wide vector loads and stores; 2 rows -> 2 warps; packed output. The block's 64
// threads are fewer than its 128 columns: each sums the warps' partials of columns t and
// t + 64 (a block that summed one column a thread left columns 64-127 at warp 0's partial:
// gpu_models centred_pairs caught it on the GPU).
// CHECK-LABEL: func.func @wide
// CHECK: forge.fusion "lines"{{.*}}forge.launch = {block = 64 : i64, grid = 132 : i64, kernel = "k0_fusion"}
// CHECK: gpu.func @k0_fusion(%arg0: memref<8448xvector<4xf32>>, %arg1: memref<8448xvector<4xf32>>)
// CHECK: vector.extract
// CHECK: gpu.barrier
// CHECK: scf.for %{{.+}} = %thread_id_x to %{{.+}} step %c64 {
// CHECK: vector.from_elements
// COALESCED: kernel k0_fusion: {{[0-9]+}} coalesced, {{[0-9]+}} broadcast, 0 data-dependent, 0 strided
func.func @wide(%x: tensor<132x2x128xf32>) -> tensor<132x2x128xf32> {
  %c = forge.fusion "lines"(%x) : (tensor<132x2x128xf32>) -> tensor<132x2x128xf32> {
  ^bb0(%a: tensor<132x2x128xf32>):
    %s = forge.reduce_sum %a {axes = array<i64: 1>, keepdims = true} : (tensor<132x2x128xf32>) -> tensor<132x1x128xf32>
    %0 = forge.mul %a, %s : (tensor<132x2x128xf32>, tensor<132x1x128xf32>) -> tensor<132x2x128xf32>
    forge.yield %0 : tensor<132x2x128xf32>
  }
  return %c : tensor<132x2x128xf32>
}

// -----

// 5 rows on 5 warps, 8 rows a pass each (40): rows past the line are read as its last one,
// added as 0 (a select) and not stored (an scf.if per row after the first).
// CHECK-LABEL: func.func @ragged
// CHECK: forge.launch = {block = 160 : i64, grid = 1 : i64, kernel = "k0_fusion"}
// CHECK: arith.minui
// CHECK: arith.select
// CHECK: scf.if
// CHECK: memref.store
func.func @ragged(%x: tensor<1x5x32xf32>) -> tensor<1x5x32xf32> {
  %c = forge.fusion "lines"(%x) : (tensor<1x5x32xf32>) -> tensor<1x5x32xf32> {
  ^bb0(%a: tensor<1x5x32xf32>):
    %m = forge.reduce_mean %a {axes = array<i64: 1>, keepdims = true} : (tensor<1x5x32xf32>) -> tensor<1x1x32xf32>
    %0 = forge.sub %a, %m : (tensor<1x5x32xf32>, tensor<1x1x32xf32>) -> tensor<1x5x32xf32>
    forge.yield %0 : tensor<1x5x32xf32>
  }
  return %c : tensor<1x5x32xf32>
}
