// RUN: forge-opt %s --split-input-file --forge-generate-kernels 2>&1 | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// A constant pad of leading rows (the LM head's weight padded to aligned
// rows, its f32 master stored bf16 for the GEMM): 4-element vectors, each
// all from one input row or all the pad value: 16-byte loads of the f32
// rows (clamped into the input where padded), one conversion of the vector,
// a select against the splat value (rounded once to bf16, as the scalar
// form's), 8-byte stores. 14 x 8 outputs: 28
// vectors, one block.
// CHECK-LABEL: func.func @pad_rows
// CHECK: forge.pad %arg0 {{.*}}forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k0_pad"}
// CHECK: gpu.func @k0_pad(%arg0: memref<20xvector<4xf32>>, %arg1: memref<28xvector<4xbf16>>)
// CHECK: arith.minsi
// CHECK: memref.load %arg0[{{.*}}] : memref<20xvector<4xf32>>
// CHECK: arith.truncf {{.*}} : vector<4xf32> to vector<4xbf16>
// CHECK: arith.constant dense<2.500000e-01> : vector<4xbf16>
// CHECK: arith.select {{.*}} : vector<4xbf16>
// CHECK: memref.store {{.*}} : memref<28xvector<4xbf16>>
// COALESCED: kernel k0_pad: 2 coalesced, 0 broadcast, 0 data-dependent, 0 strided
func.func @pad_rows(%w: tensor<10x8xf32>) -> tensor<14x8xbf16> {
  %p = forge.pad %w {mode = "constant", pads = array<i64: 1, 0, 3, 0>, value = 2.500000e-01 : f64} : (tensor<10x8xf32>) -> tensor<14x8xbf16>
  return %p : tensor<14x8xbf16>
}

// -----

// Not vectorized: the innermost dim is padded (its element maps are not
// whole vectors); one thread per element, as before.
// CHECK-LABEL: func.func @pad_columns
// CHECK: gpu.func @k0_pad(%arg0: memref<80xf32>, %arg1: memref<100xf32>)
// CHECK-NOT: vector<4x
// CHECK: gpu.return
func.func @pad_columns(%w: tensor<10x8xf32>) -> tensor<10x10xf32> {
  %p = forge.pad %w {mode = "constant", pads = array<i64: 0, 1, 0, 1>, value = 0.000000e+00 : f64} : (tensor<10x8xf32>) -> tensor<10x10xf32>
  return %p : tensor<10x10xf32>
}
