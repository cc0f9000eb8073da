// RUN: forge-opt %s --forge-generate-kernels="target=cuda:sm_90" | FileCheck %s
// RUN: forge-opt %s --forge-generate-kernels="target=cuda:sm_80" | FileCheck %s --check-prefix=SM80

// A saturating cast to E4M3FN is one hardware conversion on sm_89+ (the
// kernels' module says so), with NaN's sign kept by a select; sm_80 walks the
// grid in software. E5M2 stays in software everywhere (satfinite would turn
// its infinities into +-max). 4-byte f32 in, 1-byte out: vectors of 8.
// CHECK: gpu.module @forge_kernels attributes {forge.float8_cvt}
// CHECK-LABEL: gpu.func @k0_fusion
// CHECK-SAME: memref<128xvector<8xf32>>
// CHECK: llvm.inline_asm "{\0A.reg .b16 t;\0Acvt.rn.satfinite.e4m3x2.f32 t, $1, $1;
// CHECK-LABEL: gpu.func @k1_fusion
// CHECK-NOT: llvm.inline_asm
// CHECK: gpu.return
// SM80: gpu.module @forge_kernels {
// SM80-NOT: llvm.inline_asm
func.func @casts(%x: tensor<1024xf32>) -> (tensor<1024xf8E4M3FN>, tensor<1024xf8E5M2>) {
  %a = forge.fusion "loop"(%x) : (tensor<1024xf32>) -> tensor<1024xf8E4M3FN> {
  ^bb0(%v: tensor<1024xf32>):
    %0 = forge.cast %v {to = f8E4M3FN} : (tensor<1024xf32>) -> tensor<1024xf8E4M3FN>
    forge.yield %0 : tensor<1024xf8E4M3FN>
  }
  %b = forge.fusion "loop"(%x) : (tensor<1024xf32>) -> tensor<1024xf8E5M2> {
  ^bb0(%v: tensor<1024xf32>):
    %0 = forge.cast %v {to = f8E5M2} : (tensor<1024xf32>) -> tensor<1024xf8E5M2>
    forge.yield %0 : tensor<1024xf8E5M2>
  }
  return %a, %b : tensor<1024xf8E4M3FN>, tensor<1024xf8E5M2>
}
