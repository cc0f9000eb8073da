// RUN: forge-opt %s --split-input-file --forge-generate-kernels 2>&1 | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// arg-max along the innermost axis: a warp per row (8 rows a block of 256),
// lane l scanning elements l, l + 32, ...; the lanes' (value, index) pairs
// combine in 5 butterfly steps (a shuffle of each), lane 0 stores the index.
// Reads are contiguous per warp; the store is one address per warp.
// CHECK-LABEL: func.func @rows
// CHECK: forge.argmax %arg0 {axis = 1 : i64, forge.launch = {block = 256 : i64, grid = 13 : i64, kernel = "k0_argmax"}
// CHECK: gpu.func @k0_argmax(%arg0: memref<10000xbf16>, %arg1: memref<100xi64>) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: scf.for
// CHECK: scf.for
// CHECK-COUNT-10: gpu.shuffle xor
// CHECK: arith.extsi %{{.*}} : i32 to i64
// CHECK: memref.store %{{.*}}, %arg1
// COALESCED: kernel k0_argmax: 1 coalesced, 1 broadcast, 0 data-dependent, 0 strided
func.func @rows(%x: tensor<100x100xbf16>) -> tensor<100xi64> {
  %i = forge.argmax %x {axis = 1 : i64, keepdims = false, select_last_index = false} : (tensor<100x100xbf16>) -> tensor<100xi64>
  return %i : tensor<100xi64>
}

// -----

// Along a middle axis a thread per output walks its line: consecutive
// threads read consecutive elements, no warp per row.
// CHECK-LABEL: func.func @middle
// CHECK: gpu.func @k0_argmax
// CHECK-NOT: gpu.shuffle
// COALESCED: kernel k0_argmax: 3 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @middle(%x: tensor<4x10x64xf32>) -> tensor<4x64xi64> {
  %i = forge.argmax %x {axis = 1 : i64, keepdims = false, select_last_index = true} : (tensor<4x10x64xf32>) -> tensor<4x64xi64>
  return %i : tensor<4x64xi64>
}
