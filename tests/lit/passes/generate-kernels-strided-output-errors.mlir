// RUN: not forge-opt %s --forge-generate-kernels 2>&1 | FileCheck %s

// A stride shorter than the row cannot hold it: the region gets no kernel,
// and forge-generate-kernels refuses to run its ops packed.
// CHECK: error: forge-generate-kernels: a loop region writing a concat's piece (forge.out_row_strides, forge-fold-attention-views) has no kernel
func.func @short_stride(%dk: tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xbf16> {
  %c = forge.fusion "loop"(%dk) {forge.out_row_strides = array<i64: 16>} : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xbf16> {
  ^bb0(%a: tensor<2x4x2x16xbf16>):
    %0 = forge.neg %a : (tensor<2x4x2x16xbf16>) -> tensor<2x4x2x16xbf16>
    forge.yield %0 : tensor<2x4x2x16xbf16>
  }
  return %c : tensor<2x4x2x16xbf16>
}
