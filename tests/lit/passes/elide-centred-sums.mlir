// RUN: forge-opt %s --split-input-file --forge-elide-centred-sums 2>/dev/null | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-elide-centred-sums 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// The qkv bias gradient of GPT-2 in bf16 as placement finds it: the sum over every token of
// concat(dq, dk centred over the keys, dv). dk's piece [8, 16) of the result is 0 whatever dk
// holds: marked, so kernels write 0 there without reading it.
// CHECK-LABEL: func @qkv_bias
// CHECK: forge.reduce_sum %{{.+}} {axes = array<i64: 0, 1>, keepdims = true, zero_outputs = array<i64: 8, 16>}
// REMARK: forge-elide-centred-sums: 1 sum(s) with a centred piece written as 0 unread
func.func @qkv_bias(%q: tensor<2x8x2x4xbf16>, %k: tensor<2x8x2x4xbf16>, %v: tensor<2x8x2x4xbf16>) -> tensor<1x1x24xf32> {
  %kc = forge.fusion "lines"(%k) : (tensor<2x8x2x4xbf16>) -> tensor<2x8x2x4xbf16> {
  ^bb0(%a: tensor<2x8x2x4xbf16>):
    %m = forge.reduce_mean %a {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x2x4xbf16>) -> tensor<2x1x2x4xf32>
    %c = forge.cast %a {to = f32} : (tensor<2x8x2x4xbf16>) -> tensor<2x8x2x4xf32>
    %s = forge.sub %c, %m : (tensor<2x8x2x4xf32>, tensor<2x1x2x4xf32>) -> tensor<2x8x2x4xbf16>
    forge.yield %s : tensor<2x8x2x4xbf16>
  }
  %q3 = forge.reshape %q {shape = array<i64: 2, 8, 8>} : (tensor<2x8x2x4xbf16>) -> tensor<2x8x8xbf16>
  %k3 = forge.reshape %kc {shape = array<i64: 2, 8, 8>} : (tensor<2x8x2x4xbf16>) -> tensor<2x8x8xbf16>
  %v3 = forge.reshape %v {shape = array<i64: 2, 8, 8>} : (tensor<2x8x2x4xbf16>) -> tensor<2x8x8xbf16>
  %cat = forge.concat %q3, %k3, %v3 {axis = 2 : i64} : (tensor<2x8x8xbf16>, tensor<2x8x8xbf16>, tensor<2x8x8xbf16>) -> tensor<2x8x24xbf16>
  %sum = forge.reduce_sum %cat {axes = array<i64: 0, 1>, keepdims = true} : (tensor<2x8x24xbf16>) -> tensor<1x1x24xf32>
  return %sum : tensor<1x1x24xf32>
}

// -----

// The loose form (f32, no region): x minus its mean over axis 0, first of two pieces.
// CHECK-LABEL: func @loose
// CHECK: forge.reduce_sum %{{.+}} {axes = array<i64: 0>, keepdims = false, zero_outputs = array<i64: 0, 3>}
func.func @loose(%x: tensor<5x3xf32>, %y: tensor<5x2xf32>) -> tensor<5xf32> {
  %m = forge.reduce_mean %x {axes = array<i64: 0>, keepdims = true} : (tensor<5x3xf32>) -> tensor<1x3xf32>
  %c = forge.sub %x, %m : (tensor<5x3xf32>, tensor<1x3xf32>) -> tensor<5x3xf32>
  %cat = forge.concat %c, %y {axis = 1 : i64} : (tensor<5x3xf32>, tensor<5x2xf32>) -> tensor<5x5xf32>
  %sum = forge.reduce_sum %cat {axes = array<i64: 0>, keepdims = false} : (tensor<5x5xf32>) -> tensor<5xf32>
  return %sum : tensor<5xf32>
}

// -----

// Not marked: the mean is over the last axis, which the reshape merges into the concat axis
// the sum keeps (the piece's columns do not sum to 0).
// CHECK-LABEL: func @centred_over_kept_axis
// CHECK-NOT: zero_outputs
func.func @centred_over_kept_axis(%k: tensor<2x8x2x4xf32>, %v: tensor<2x8x8xf32>) -> tensor<16xf32> {
  %m = forge.reduce_mean %k {axes = array<i64: 3>, keepdims = true} : (tensor<2x8x2x4xf32>) -> tensor<2x8x2x1xf32>
  %c = forge.sub %k, %m : (tensor<2x8x2x4xf32>, tensor<2x8x2x1xf32>) -> tensor<2x8x2x4xf32>
  %k3 = forge.reshape %c {shape = array<i64: 2, 8, 8>} : (tensor<2x8x2x4xf32>) -> tensor<2x8x8xf32>
  %cat = forge.concat %k3, %v {axis = 2 : i64} : (tensor<2x8x8xf32>, tensor<2x8x8xf32>) -> tensor<2x8x16xf32>
  %sum = forge.reduce_sum %cat {axes = array<i64: 0, 1>, keepdims = false} : (tensor<2x8x16xf32>) -> tensor<16xf32>
  return %sum : tensor<16xf32>
}

// -----

// Not marked: the sum keeps axis 1 besides the concat axis (its results are per token: a
// token's centred values need not sum to 0).
// CHECK-LABEL: func @keeps_the_centred_axis
// CHECK-NOT: zero_outputs
func.func @keeps_the_centred_axis(%k: tensor<2x8x8xf32>, %v: tensor<2x8x8xf32>) -> tensor<8x16xf32> {
  %m = forge.reduce_mean %k {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x8xf32>) -> tensor<2x1x8xf32>
  %c = forge.sub %k, %m : (tensor<2x8x8xf32>, tensor<2x1x8xf32>) -> tensor<2x8x8xf32>
  %cat = forge.concat %c, %v {axis = 2 : i64} : (tensor<2x8x8xf32>, tensor<2x8x8xf32>) -> tensor<2x8x16xf32>
  %sum = forge.reduce_sum %cat {axes = array<i64: 0>, keepdims = false} : (tensor<2x8x16xf32>) -> tensor<8x16xf32>
  return %sum : tensor<8x16xf32>
}

// -----

// Not marked: a sub of another tensor's mean, and a concat along an axis the sum reduces.
// CHECK-LABEL: func @not_centred
// CHECK-NOT: zero_outputs
func.func @not_centred(%k: tensor<2x8xf32>, %w: tensor<2x8xf32>, %v: tensor<2x8xf32>) -> (tensor<16xf32>, tensor<1x1xf32>) {
  %m = forge.reduce_mean %w {axes = array<i64: 0>, keepdims = true} : (tensor<2x8xf32>) -> tensor<1x8xf32>
  %c = forge.sub %k, %m : (tensor<2x8xf32>, tensor<1x8xf32>) -> tensor<2x8xf32>
  %cat = forge.concat %c, %v {axis = 1 : i64} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x16xf32>
  %sum = forge.reduce_sum %cat {axes = array<i64: 0>, keepdims = false} : (tensor<2x16xf32>) -> tensor<16xf32>
  %mk = forge.reduce_mean %k {axes = array<i64: 0>, keepdims = true} : (tensor<2x8xf32>) -> tensor<1x8xf32>
  %ck = forge.sub %k, %mk : (tensor<2x8xf32>, tensor<1x8xf32>) -> tensor<2x8xf32>
  %rows = forge.concat %ck, %v {axis = 0 : i64} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<4x8xf32>
  %all = forge.reduce_sum %rows {axes = array<i64: 0, 1>, keepdims = true} : (tensor<4x8xf32>) -> tensor<1x1xf32>
  return %sum, %all : tensor<16xf32>, tensor<1x1xf32>
}

// -----

// Not marked: integers (the mean truncates: the residue does not sum to 0), a narrowing cast
// before the sub (it rounds x), and a centred piece of size 0.
// CHECK-LABEL: func @not_exact
// CHECK-NOT: zero_outputs
func.func @not_exact(%i: tensor<4x3xi32>, %j: tensor<4x2xi32>, %x: tensor<4x3xf32>, %y: tensor<4x2xf16>, %z: tensor<4x0xf32>, %w: tensor<4x2xf32>) -> (tensor<5xi32>, tensor<5xf16>, tensor<2xf32>) {
  %mi = forge.reduce_mean %i {axes = array<i64: 0>, keepdims = true} : (tensor<4x3xi32>) -> tensor<1x3xi32>
  %ci = forge.sub %i, %mi : (tensor<4x3xi32>, tensor<1x3xi32>) -> tensor<4x3xi32>
  %cat_i = forge.concat %ci, %j {axis = 1 : i64} : (tensor<4x3xi32>, tensor<4x2xi32>) -> tensor<4x5xi32>
  %si = forge.reduce_sum %cat_i {axes = array<i64: 0>, keepdims = false} : (tensor<4x5xi32>) -> tensor<5xi32>
  %mx = forge.reduce_mean %x {axes = array<i64: 0>, keepdims = true} : (tensor<4x3xf32>) -> tensor<1x3xf16>
  %hx = forge.cast %x {to = f16} : (tensor<4x3xf32>) -> tensor<4x3xf16>
  %cx = forge.sub %hx, %mx : (tensor<4x3xf16>, tensor<1x3xf16>) -> tensor<4x3xf16>
  %cat_x = forge.concat %cx, %y {axis = 1 : i64} : (tensor<4x3xf16>, tensor<4x2xf16>) -> tensor<4x5xf16>
  %sx = forge.reduce_sum %cat_x {axes = array<i64: 0>, keepdims = false} : (tensor<4x5xf16>) -> tensor<5xf16>
  %mz = forge.reduce_mean %z {axes = array<i64: 0>, keepdims = true} : (tensor<4x0xf32>) -> tensor<1x0xf32>
  %cz = forge.sub %z, %mz : (tensor<4x0xf32>, tensor<1x0xf32>) -> tensor<4x0xf32>
  %cat_z = forge.concat %cz, %w {axis = 1 : i64} : (tensor<4x0xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
  %sz = forge.reduce_sum %cat_z {axes = array<i64: 0>, keepdims = false} : (tensor<4x2xf32>) -> tensor<2xf32>
  return %si, %sx, %sz : tensor<5xi32>, tensor<5xf16>, tensor<2xf32>
}
