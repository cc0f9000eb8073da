// RUN: forge-opt %s --split-input-file --forge-generate-kernels 2>&1 | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// resized_crop (forge-augment-inputs' canvas): one thread per output element, c fastest.
// Each axis's tap in f32 in the CPU kernel's order: clamp(origin + (i + 0.5) * box / size
// - 0.5, 0, min(max(extent, 1), canvas) - 1), the second tap min(first + 1, last), the
// weight s - first; four u8 texels (zero-extended), mixed a + (d - a) * w along x then y,
// and the result rounded once to the stored bf16. The texels' addresses depend on the
// boxes (data-dependent), the store is coalesced, the boxes are per-sample broadcasts.
// CHECK-LABEL: func.func @crop
// CHECK: forge.resized_crop {{.*}}kernel = "k0_resized_crop"
// CHECK: gpu.func @k0_resized_crop(%arg0: memref<432xi8>, %arg1: memref<12xf32>, %arg2: memref<120xbf16>)
// CHECK-DAG: %[[NINE:.*]] = arith.constant 9.000000e+00 : f32
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK: %[[EXT:.*]] = arith.maximumf %{{.*}}, %{{.*}} : f32
// CHECK: %[[LIM:.*]] = arith.minimumf %[[EXT]], %[[NINE]] : f32
// CHECK: %[[LAST:.*]] = arith.subf %[[LIM]], %{{.*}} : f32
// CHECK: %[[P:.*]] = arith.addf %{{.*}}, %{{.*}} : f32
// CHECK: %[[Q:.*]] = arith.mulf %[[P]], %{{.*}} : f32
// CHECK: %[[R:.*]] = arith.divf %[[Q]], %{{.*}} : f32
// CHECK: %[[S:.*]] = arith.addf %{{.*}}, %[[R]] : f32
// CHECK: %[[T:.*]] = arith.subf %[[S]], %{{.*}} : f32
// CHECK: %[[LO:.*]] = arith.maximumf %[[T]], %{{.*}} : f32
// CHECK: arith.minimumf %[[LO]], %[[LAST]] : f32
// CHECK: arith.fptosi
// CHECK: arith.minui
// CHECK-COUNT-4: arith.uitofp %{{.*}} : i8 to f32
// CHECK: %[[B:.*]] = arith.truncf %{{.*}} : f32 to bf16
// CHECK-NEXT: memref.store %[[B]], %arg2[%arg3] : memref<120xbf16>
// COALESCED: kernel k0_resized_crop: 1 coalesced, 6 broadcast, 4 data-dependent, 0 strided
func.func @crop(%c: tensor<2x8x9x3xui8>, %g: tensor<2x6xf32>) -> tensor<2x4x5x3xbf16> {
  %y = forge.resized_crop %c, %g {height = 4 : i64, width = 5 : i64} : (tensor<2x8x9x3xui8>, tensor<2x6xf32>) -> tensor<2x4x5x3xbf16>
  return %y : tensor<2x4x5x3xbf16>
}
