// RUN: forge-opt %s --split-input-file --forge-fuse-norm-grad-epilogues | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-fuse-norm-grad-epilogues --forge-generate-kernels | FileCheck %s --check-prefix=KERNEL
// RUN: forge-opt %s --split-input-file --forge-fuse-norm-grad-epilogues --forge-generate-kernels | forge-opt --split-input-file --forge-check-coalescing=report -o /dev/null 2>&1 | FileCheck %s --check-prefix=COALESCED

// A layer norm's dx read only by the region that adds it to the residual
// gradient, rounds the sum to bf16 and sums it over the rows (a bias
// gradient, forge-fuse-column-sums' column_reduce): one norm_grad region, the
// norm on its first three arguments, the reader's body on its dx; it yields
// the norm's dscale and dbias, then the reader's results. Its kernel keeps
// dx in registers: it reads the residual gradient with x and dy, a row
// ahead (two loads: the first row, then the next one in the loop), stores
// the f32 sum and its bf16 copy, and adds three column sums (dscale, dbias,
// the bias gradient) once per block and column.
// CHECK-LABEL: func @residual
// CHECK: %[[R:.*]]:5 = forge.fusion "norm_grad"(%arg0, %arg1, %arg2, %arg3)
// CHECK-NEXT: ^bb0(%[[X:.*]]: tensor<64x32xf32>, %[[W:.*]]: tensor<32xf32>, %[[DY:.*]]: tensor<64x32xf32>, %[[G:.*]]: tensor<64x32xf32>):
// CHECK-NEXT: %[[N:.*]]:3 = forge.layer_norm_grad %[[X]], %[[W]], %[[DY]]
// CHECK-NEXT: %[[S:.*]] = forge.add %[[G]], %[[N]]#0
// CHECK-NEXT: %[[B:.*]] = forge.cast %[[S]] {to = bf16}
// CHECK-NEXT: %[[C:.*]] = forge.reduce_sum %[[S]]
// CHECK-NEXT: forge.yield %[[N]]#1, %[[N]]#2, %[[C]], %[[S]], %[[B]]
// CHECK-NOT: forge.layer_norm_grad
// CHECK: return %[[R]]#0, %[[R]]#1, %[[R]]#2, %[[R]]#3, %[[R]]#4
// KERNEL-LABEL: func @residual
// KERNEL: forge.fusion "norm_grad"{{.*}}forge.launch = {{.*}}zero_only = array<i64: 0, 1, 2>, zero_outputs}
// KERNEL: gpu.func @k0_fusion(%arg0: memref<2048xf32>, %arg1: memref<32xf32>, %arg2: memref<2048xf32>, %arg3: memref<2048xf32>, %arg4: memref<32xf32>, %arg5: memref<32xf32>, %arg6: memref<32xf32>, %arg7: memref<2048xf32>, %arg8: memref<2048xbf16>)
// KERNEL-COUNT-2: memref.load %arg3
// KERNEL: memref.store {{.*}}, %arg7
// KERNEL: memref.store {{.*}}, %arg8
// KERNEL: memref.atomic_rmw addf {{.*}}, %arg4
// KERNEL: memref.atomic_rmw addf {{.*}}, %arg5
// KERNEL: memref.atomic_rmw addf {{.*}}, %arg6
// COALESCED: kernel k0_fusion: {{[0-9]+}} coalesced, {{[0-9]+}} broadcast, 0 data-dependent, 0 strided
func.func @residual(%x: tensor<64x32xf32>, %w: tensor<32xf32>, %dy: tensor<64x32xf32>, %g: tensor<64x32xf32>) -> (tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<64x32xf32>, tensor<64x32xbf16>) {
  %d:3 = forge.layer_norm_grad %x, %w, %dy {axis = 1 : i64, bias_grad = true, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>, tensor<32xf32>)
  %r:3 = forge.fusion "column_reduce"(%g, %d#0) : (tensor<64x32xf32>, tensor<64x32xf32>) -> (tensor<32xf32>, tensor<64x32xf32>, tensor<64x32xbf16>) {
  ^bb0(%a: tensor<64x32xf32>, %b: tensor<64x32xf32>):
    %s = forge.add %a, %b : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
    %c = forge.cast %s {to = bf16} : (tensor<64x32xf32>) -> tensor<64x32xbf16>
    %t = forge.reduce_sum %s {axes = array<i64: 0>, keepdims = false} : (tensor<64x32xf32>) -> tensor<32xf32>
    forge.yield %t, %s, %c : tensor<32xf32>, tensor<64x32xf32>, tensor<64x32xbf16>
  }
  return %d#1, %d#2, %r#0, %r#1, %r#2 : tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<64x32xf32>, tensor<64x32xbf16>
}

// -----

// The same with a bf16 dy (forge-assign-precision's low-norm-gradients: the
// next linear layer's dX stored low): the region takes it as it is, and its
// kernel loads dy as bf16 and widens it to f32 in registers.
// CHECK-LABEL: func @residual_low_dy
// CHECK: forge.fusion "norm_grad"(%arg0, %arg1, %arg2, %arg3) : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xbf16>, tensor<64x32xf32>)
// CHECK-NOT: forge.layer_norm_grad {{.*}}forge.launch
// KERNEL-LABEL: func @residual_low_dy
// KERNEL: gpu.func @k0_fusion(%arg0: memref<2048xf32>, %arg1: memref<32xf32>, %arg2: memref<2048xbf16>, %arg3: memref<2048xf32>
// KERNEL: %[[L:.*]] = memref.load %arg2
// KERNEL-NEXT: arith.extf %[[L]] : bf16 to f32
func.func @residual_low_dy(%x: tensor<64x32xf32>, %w: tensor<32xf32>, %dy: tensor<64x32xbf16>, %g: tensor<64x32xf32>) -> (tensor<32xf32>, tensor<32xf32>, tensor<64x32xf32>) {
  %d:3 = forge.layer_norm_grad %x, %w, %dy {axis = 1 : i64, bias_grad = true, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xbf16>) -> (tensor<64x32xf32>, tensor<32xf32>, tensor<32xf32>)
  %r = forge.fusion "loop"(%g, %d#0) : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32> {
  ^bb0(%a: tensor<64x32xf32>, %b: tensor<64x32xf32>):
    %s = forge.add %a, %b : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
    forge.yield %s : tensor<64x32xf32>
  }
  return %d#1, %d#2, %r : tensor<32xf32>, tensor<32xf32>, tensor<64x32xf32>
}

// -----

// A loop reader whose other input is made after the norm: the region goes
// where the reader was (the norm's dscale is read only after it).
// CHECK-LABEL: func @at_reader
// CHECK: forge.exp
// CHECK-NEXT: forge.fusion "norm_grad"
// CHECK-NOT: forge.layer_norm_grad {{.*}}forge.launch
func.func @at_reader(%x: tensor<64x32xf32>, %w: tensor<32xf32>, %dy: tensor<64x32xf32>, %g: tensor<64x32xf32>) -> (tensor<32xf32>, tensor<64x32xf32>) {
  %d:2 = forge.layer_norm_grad %x, %w, %dy {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>)
  %e = forge.exp %g : (tensor<64x32xf32>) -> tensor<64x32xf32>
  %r = forge.fusion "loop"(%e, %d#0) : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32> {
  ^bb0(%a: tensor<64x32xf32>, %b: tensor<64x32xf32>):
    %s = forge.mul %a, %b : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
    forge.yield %s : tensor<64x32xf32>
  }
  return %d#1, %r : tensor<32xf32>, tensor<64x32xf32>
}

// -----

// dx read by other ops too (a final norm's: the bf16 copy for the next GEMM,
// and the residual add, which waits on that GEMM): the first region that can
// go at the norm (the cast) becomes the epilogue, and the region yields dx
// last for the other readers; its kernel stores dx (f32) and the copy.
// CHECK-LABEL: func @dx_read_elsewhere
// CHECK: %[[R:.*]]:3 = forge.fusion "norm_grad"(%arg0, %arg1, %arg2)
// CHECK: %[[N:.*]]:2 = forge.layer_norm_grad
// CHECK-NEXT: %[[C:.*]] = forge.cast %[[N]]#0 {to = bf16}
// CHECK-NEXT: forge.yield %[[N]]#1, %[[C]], %[[N]]#0
// CHECK: %[[L:.*]] = forge.exp %arg3
// CHECK: forge.fusion "loop"(%[[L]], %[[R]]#2)
// CHECK: forge.neg %[[R]]#2
// CHECK-NOT: forge.layer_norm_grad
// KERNEL-LABEL: func @dx_read_elsewhere
// KERNEL: gpu.func @k0_fusion(%arg0: memref<2048xf32>, %arg1: memref<32xf32>, %arg2: memref<2048xf32>, %arg3: memref<32xf32>, %arg4: memref<2048xbf16>, %arg5: memref<2048xf32>)
// KERNEL: memref.store {{.*}}, %arg4
// KERNEL: memref.store {{.*}}, %arg5
func.func @dx_read_elsewhere(%x: tensor<64x32xf32>, %w: tensor<32xf32>, %dy: tensor<64x32xf32>, %g: tensor<64x32xf32>) -> (tensor<32xf32>, tensor<64x32xbf16>, tensor<64x32xf32>, tensor<64x32xf32>) {
  %d:2 = forge.layer_norm_grad %x, %w, %dy {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>)
  %c = forge.fusion "loop"(%d#0) : (tensor<64x32xf32>) -> tensor<64x32xbf16> {
  ^bb0(%a: tensor<64x32xf32>):
    %b = forge.cast %a {to = bf16} : (tensor<64x32xf32>) -> tensor<64x32xbf16>
    forge.yield %b : tensor<64x32xbf16>
  }
  %later = forge.exp %g : (tensor<64x32xf32>) -> tensor<64x32xf32>
  %r = forge.fusion "loop"(%later, %d#0) : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32> {
  ^bb0(%a: tensor<64x32xf32>, %b: tensor<64x32xf32>):
    %s = forge.add %a, %b : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
    forge.yield %s : tensor<64x32xf32>
  }
  %n = forge.neg %d#0 : (tensor<64x32xf32>) -> tensor<64x32xf32>
  return %d#1, %c, %r, %n : tensor<32xf32>, tensor<64x32xbf16>, tensor<64x32xf32>, tensor<64x32xf32>
}

// -----

// Not: dx read by another op too while its region reads a value made after
// the norm (the region would have to go there, after dx's other reader), a
// reader that also reads the norm's dscale (complete only at the kernel's
// end), dx over a non-last axis, and a reader that is no region.
// CHECK-LABEL: func @negatives
// CHECK-NOT: "norm_grad"
// CHECK: return
func.func @negatives(%x: tensor<64x32xf32>, %w: tensor<32xf32>, %dy: tensor<64x32xf32>, %g: tensor<64x32xf32>, %x3: tensor<4x16x32xf32>, %w3: tensor<16x32xf32>) -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x16x32xf32>, tensor<64x32xf32>) {
  %d:2 = forge.layer_norm_grad %x, %w, %dy {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>)
  %n = forge.neg %d#0 : (tensor<64x32xf32>) -> tensor<64x32xf32>
  %later = forge.exp %g : (tensor<64x32xf32>) -> tensor<64x32xf32>
  %r = forge.fusion "loop"(%later, %d#0) : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32> {
  ^bb0(%a: tensor<64x32xf32>, %b: tensor<64x32xf32>):
    %s = forge.add %a, %b : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
    forge.yield %s : tensor<64x32xf32>
  }
  %e:2 = forge.layer_norm_grad %x, %w, %g {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>)
  %q = forge.fusion "loop"(%e#0, %e#1) : (tensor<64x32xf32>, tensor<32xf32>) -> tensor<64x32xf32> {
  ^bb0(%a: tensor<64x32xf32>, %b: tensor<32xf32>):
    %s = forge.mul %a, %b : (tensor<64x32xf32>, tensor<32xf32>) -> tensor<64x32xf32>
    forge.yield %s : tensor<64x32xf32>
  }
  %f:2 = forge.layer_norm_grad %x3, %w3, %x3 {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<4x16x32xf32>, tensor<16x32xf32>, tensor<4x16x32xf32>) -> (tensor<4x16x32xf32>, tensor<16x32xf32>)
  %p = forge.fusion "loop"(%f#0) : (tensor<4x16x32xf32>) -> tensor<4x16x32xf32> {
  ^bb0(%a: tensor<4x16x32xf32>):
    %s = forge.exp %a : (tensor<4x16x32xf32>) -> tensor<4x16x32xf32>
    forge.yield %s : tensor<4x16x32xf32>
  }
  %h:2 = forge.layer_norm_grad %g, %w, %dy {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>)
  %o = forge.exp %h#0 : (tensor<64x32xf32>) -> tensor<64x32xf32>
  return %r, %n, %q, %p, %o : tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x16x32xf32>, tensor<64x32xf32>
}

// -----

// Not: rows wider than the kernel keeps in registers (2048 > 8 columns for
// each of 128 threads), a reader yielding dx itself, a reader dividing
// integers (its zero-divisor fault has no flag in the fused kernel).
// CHECK-LABEL: func @more_negatives
// CHECK-NOT: "norm_grad"
// CHECK: return
func.func @more_negatives(%x: tensor<4x2048xf32>, %w: tensor<2048xf32>, %g: tensor<4x2048xf32>, %y: tensor<64x32xf32>, %v: tensor<32xf32>, %i: tensor<64x32xi32>) -> (tensor<4x2048xf32>, tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xi32>) {
  %d:2 = forge.layer_norm_grad %x, %w, %g {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<4x2048xf32>, tensor<2048xf32>, tensor<4x2048xf32>) -> (tensor<4x2048xf32>, tensor<2048xf32>)
  %r = forge.fusion "loop"(%g, %d#0) : (tensor<4x2048xf32>, tensor<4x2048xf32>) -> tensor<4x2048xf32> {
  ^bb0(%a: tensor<4x2048xf32>, %b: tensor<4x2048xf32>):
    %s = forge.add %a, %b : (tensor<4x2048xf32>, tensor<4x2048xf32>) -> tensor<4x2048xf32>
    forge.yield %s : tensor<4x2048xf32>
  }
  %e:2 = forge.layer_norm_grad %y, %v, %y {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>)
  %q:2 = forge.fusion "loop"(%e#0) : (tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<64x32xf32>) {
  ^bb0(%a: tensor<64x32xf32>):
    %s = forge.exp %a : (tensor<64x32xf32>) -> tensor<64x32xf32>
    forge.yield %s, %a : tensor<64x32xf32>, tensor<64x32xf32>
  }
  %f:2 = forge.layer_norm_grad %y, %v, %q#0 {axis = 1 : i64, bias_grad = false, epsilon = 1.0e-05 : f64, input_grad = true, scale_grad = true} : (tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<32xf32>)
  %p = forge.fusion "loop"(%f#0, %i) : (tensor<64x32xf32>, tensor<64x32xi32>) -> tensor<64x32xi32> {
  ^bb0(%a: tensor<64x32xf32>, %b: tensor<64x32xi32>):
    %c = forge.cast %a {to = i32} : (tensor<64x32xf32>) -> tensor<64x32xi32>
    %s = forge.div %b, %c : (tensor<64x32xi32>, tensor<64x32xi32>) -> tensor<64x32xi32>
    forge.yield %s : tensor<64x32xi32>
  }
  return %r, %q#0, %q#1, %p : tensor<4x2048xf32>, tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xi32>
}
