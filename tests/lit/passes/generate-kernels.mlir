// RUN: forge-opt %s --split-input-file --forge-generate-kernels --mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s
// RUN: not forge-opt %s --split-input-file --forge-generate-kernels="target=cuda:sm_70" 2>&1 | FileCheck %s --check-prefix=TARGET
// RUN: not forge-opt %s --split-input-file --forge-generate-kernels --forge-generate-kernels --mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s --check-prefix=TWICE
// The kernels print and parse back.
// RUN: forge-opt %s --split-input-file --forge-generate-kernels --mlir-print-op-on-diagnostic=false 2>/dev/null | forge-opt --split-input-file --verify-each > /dev/null

// TARGET: error: unknown target 'cuda:sm_70' (cuda:sm_80, cuda:sm_89, cuda:sm_90)
// TWICE: error: the module already has generated kernels

// Every op gets a placement: a region its kernel, a library call stays as
// forge-select-library marked it, a reshape and an op of empty results are
// copies, equal ops share one kernel. The kernels join the module.
// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK: forge.fusion "loop"(%arg0, %arg1) {forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k0_fusion"}}
// CHECK: forge.matmul %0, %arg2 {forge.library = "cublaslt"}
// CHECK: forge.reshape %0 {forge.placement = "copy"
// CHECK: forge.neg %arg0 {forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k1_neg"}}
// CHECK: forge.neg %3 {forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k1_neg"}}
// CHECK: forge.slice %arg0 {ends = array<i64: 0, 8>, forge.placement = "copy"
// CHECK: gpu.module @forge_kernels
// The bias row is read as 4-wide vectors too: vector i's first element is at
// column (4i mod 8), so its vector index is that over 4.
// CHECK: gpu.func @k0_fusion(%arg0: memref<8xvector<4xf32>>, %arg1: memref<2xvector<4xf32>>, %arg2: memref<8xvector<4xf32>>) kernel
// CHECK: %[[E:.*]] = arith.muli %{{.*}}, %c4
// CHECK: %[[C:.*]] = arith.remui %[[E]], %c8
// CHECK: %[[V:.*]] = arith.divui %{{.*}}, %c4
// CHECK: memref.load %arg1[%[[V]]] : memref<2xvector<4xf32>>
// CHECK: gpu.func @k1_neg(%arg0: memref<8xvector<4xf32>>, %arg1: memref<8xvector<4xf32>>) kernel
// CHECK-NOT: gpu.func
func.func @main(%x: tensor<4x8xf32>, %b: tensor<8xf32>, %w: tensor<8x5xf32>) -> (tensor<4x5xf32>, tensor<32xf32>, tensor<4x8xf32>, tensor<0x8xf32>) {
  %f = forge.fusion "loop"(%x, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a0: tensor<4x8xf32>, %a1: tensor<8xf32>):
    %0 = forge.add %a0, %a1 : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %1 = forge.tanh %0 : (tensor<4x8xf32>) -> tensor<4x8xf32>
    forge.yield %1 : tensor<4x8xf32>
  }
  %m = forge.matmul %f, %w {forge.library = "cublaslt"} : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
  %r = forge.reshape %f {shape = array<i64: 32>} : (tensor<4x8xf32>) -> tensor<32xf32>
  %n1 = forge.neg %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %n2 = forge.neg %n1 : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %e = forge.slice %x {starts = array<i64: 0, 0>, ends = array<i64: 0, 8>, steps = array<i64: 1, 1>} : (tensor<4x8xf32>) -> tensor<0x8xf32>
  return %m, %r, %n2, %e : tensor<4x5xf32>, tensor<32xf32>, tensor<4x8xf32>, tensor<0x8xf32>
}

// -----

// What a kernel checks its data for is part of its launch.
// CHECK-LABEL: func @checks
// CHECK: forge.div %arg0, %arg1 {forge.launch = {block = 32 : i64, fault = "integer division by zero", grid = 1 : i64, kernel = "k0_div"}}
func.func @checks(%a: tensor<4xi32>, %b: tensor<4xi32>) -> tensor<4xi32> {
  %q = forge.div %a, %b : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
  return %q : tensor<4xi32>
}

// -----

// Without a generator: the op runs on the host (a warning lists it), and a
// region whose body has none becomes its ops, placed one by one.
// CHECK: warning: 3 instructions run on the host (no CUDA kernel yet): abs x1, neg x2
// CHECK-LABEL: func @host
// CHECK: forge.neg %arg0 {forge.placement = "host"}
// CHECK-LABEL: func @region
// CHECK-NOT: forge.fusion
// CHECK: forge.neg %arg0 {forge.placement = "host"}
// CHECK-NEXT: forge.abs %0 {forge.placement = "host"}
// CHECK-NOT: gpu.module
func.func @host(%x: tensor<4xf8E4M3FN>) -> tensor<4xf8E4M3FN> {
  %n = forge.neg %x : (tensor<4xf8E4M3FN>) -> tensor<4xf8E4M3FN>
  return %n : tensor<4xf8E4M3FN>
}
func.func @region(%x: tensor<4xf8E4M3FN>) -> tensor<4xf8E4M3FN> {
  %f = forge.fusion "loop"(%x) : (tensor<4xf8E4M3FN>) -> tensor<4xf8E4M3FN> {
  ^bb0(%a: tensor<4xf8E4M3FN>):
    %0 = forge.neg %a : (tensor<4xf8E4M3FN>) -> tensor<4xf8E4M3FN>
    %1 = forge.abs %0 : (tensor<4xf8E4M3FN>) -> tensor<4xf8E4M3FN>
    forge.yield %1 : tensor<4xf8E4M3FN>
  }
  return %f : tensor<4xf8E4M3FN>
}

// -----

// A row region is one row kernel: a block per row, the mask broadcast over
// the batch read at an offset from the row's index, the epilogue applied as
// the row is stored. 40 columns in a block of 64 threads: one register per
// thread, masked at the row's end; every input element is read once.
// CHECK-LABEL: func @rows
// CHECK: forge.fusion "row"(%arg0, %arg1, %arg2, %arg3) {forge.launch = {block = 64 : i64, grid = 6 : i64, kernel = "k0_fusion"}}
// CHECK: gpu.func @k0_fusion(%arg0: memref<240xf32>, %arg1: memref<1xf32>, %arg2: memref<120xi8>, %arg3: memref<1xf32>, %arg4: memref<240xf32>)
// CHECK: memref.load %arg2[
// CHECK: memref.load %arg0[
// CHECK-NOT: memref.load %arg{{[02]}}[
// CHECK: math.exp
// CHECK-NOT: memref.load %arg{{[02]}}[
// CHECK: arith.negf
// CHECK-NOT: memref.load %arg{{[02]}}[
// CHECK: memref.store %{{.*}}, %arg4[
func.func @rows(%qk: tensor<2x3x40xf32>, %scale: tensor<f32>, %mask: tensor<1x3x40xi1>, %fill: tensor<f32>) -> tensor<2x3x40xf32> {
  %f = forge.fusion "row"(%qk, %scale, %mask, %fill) : (tensor<2x3x40xf32>, tensor<f32>, tensor<1x3x40xi1>, tensor<f32>) -> tensor<2x3x40xf32> {
  ^bb0(%a: tensor<2x3x40xf32>, %s: tensor<f32>, %m: tensor<1x3x40xi1>, %v: tensor<f32>):
    %0 = forge.mul %a, %s : (tensor<2x3x40xf32>, tensor<f32>) -> tensor<2x3x40xf32>
    %1 = forge.where %m, %v, %0 : (tensor<1x3x40xi1>, tensor<f32>, tensor<2x3x40xf32>) -> tensor<2x3x40xf32>
    %2 = forge.softmax %1 {axis = 2 : i64} : (tensor<2x3x40xf32>) -> tensor<2x3x40xf32>
    %3 = forge.neg %2 : (tensor<2x3x40xf32>) -> tensor<2x3x40xf32>
    forge.yield %3 : tensor<2x3x40xf32>
  }
  return %f : tensor<2x3x40xf32>
}

// -----

// A multi_reduce region is one kernel: each sum on its own blocks, the
// squares computed as elements are read, one atomic add per block into a
// scalar zeroed before the launch. A member whose elements divide by 4 reads
// 16-byte vectors, about 16 elements per thread (the 40960-element tensor
// takes 10 blocks of 256 threads); the 5-element one reads scalars (1 block).
// CHECK-LABEL: func @norms
// CHECK: forge.fusion "multi_reduce"(%arg0, %arg1) {forge.launch = {block = 256 : i64, grid = 11 : i64, kernel = "k0_fusion", zero_outputs}}
// CHECK: gpu.func @k0_fusion(%arg0: memref<10240xvector<4xf32>>, %arg1: memref<5xf32>, %arg2: memref<1xf32>, %arg3: memref<1xf32>)
// CHECK: arith.cmpi ult, %{{.*}}, %c10
// CHECK: memref.load %arg0[{{.*}}] : memref<10240xvector<4xf32>>
// CHECK-COUNT-4: vector.extract
// CHECK: memref.atomic_rmw addf %{{.*}}, %arg2[
// CHECK: memref.load %arg1[{{.*}}] : memref<5xf32>
// CHECK: arith.mulf
// CHECK: memref.atomic_rmw addf %{{.*}}, %arg3[
func.func @norms(%g: tensor<40x1024xf32>, %h: tensor<5xf32>) -> (tensor<f32>, tensor<f32>) {
  %r:2 = forge.fusion "multi_reduce"(%g, %h) : (tensor<40x1024xf32>, tensor<5xf32>) -> (tensor<f32>, tensor<f32>) {
  ^bb0(%a: tensor<40x1024xf32>, %b: tensor<5xf32>):
    %aa = forge.mul %a, %a : (tensor<40x1024xf32>, tensor<40x1024xf32>) -> tensor<40x1024xf32>
    %s = forge.reduce_sum %aa {axes = array<i64: 0, 1>, keepdims = false} : (tensor<40x1024xf32>) -> tensor<f32>
    %bb = forge.mul %b, %b : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
    %t = forge.reduce_sum %bb {axes = array<i64: 0>, keepdims = false} : (tensor<5xf32>) -> tensor<f32>
    forge.yield %s, %t : tensor<f32>, tensor<f32>
  }
  return %r#0, %r#1 : tensor<f32>, tensor<f32>
}

// -----

// A view region is one strided copy: the head split of columns 8..16 of
// [2, 4, 24] reads element (b, h, t, d) at 8 + 96 b + 4 h + 24 t + d. Its
// runs of 4 continue along h in the input and along t in the output, so it
// runs in shared-memory tiles (generate-kernels-tiled): runs of 4 in tiles of
// 8 x 8, rows padded (8 * (8 * 4 + 1) = 264 staged elements), one tile per
// image. A view whose reshape merges dims that are not contiguous has no
// strided form: its ops are placed one by one.
// CHECK-LABEL: func @views
// CHECK: forge.fusion "loop"(%arg0) {forge.launch = {block = 256 : i64, grid = 2 : i64, kernel = "k0_fusion"}}
// CHECK: forge.slice %arg1 {{.*}}forge.launch
// CHECK: forge.reshape {{.*}}forge.placement = "copy"
// CHECK: gpu.func @k0_fusion(%arg0: memref<192xf32>, %arg1: memref<64xf32>) workgroup(%{{.+}} : memref<264xf32, #gpu.address_space<workgroup>>)
// CHECK-DAG: arith.constant 96 : index
// CHECK-DAG: arith.constant 24 : index
// CHECK-DAG: arith.constant 8 : index
// CHECK: memref.load %arg0
func.func @views(%x: tensor<2x4x24xf32>, %y: tensor<4x24xf32>) -> (tensor<2x2x4x4xf32>, tensor<32xf32>) {
  %v = forge.fusion "loop"(%x) : (tensor<2x4x24xf32>) -> tensor<2x2x4x4xf32> {
  ^bb0(%a: tensor<2x4x24xf32>):
    %s = forge.slice %a {starts = array<i64: 0, 0, 8>, ends = array<i64: 2, 4, 16>, steps = array<i64: 1, 1, 1>} : (tensor<2x4x24xf32>) -> tensor<2x4x8xf32>
    %r = forge.reshape %s {shape = array<i64: 2, 4, 2, 4>} : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
    %t = forge.transpose %r {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
    forge.yield %t : tensor<2x2x4x4xf32>
  }
  %w = forge.fusion "loop"(%y) : (tensor<4x24xf32>) -> tensor<32xf32> {
  ^bb0(%a: tensor<4x24xf32>):
    %s = forge.slice %a {starts = array<i64: 0, 0>, ends = array<i64: 4, 8>, steps = array<i64: 1, 1>} : (tensor<4x24xf32>) -> tensor<4x8xf32>
    %r = forge.reshape %s {shape = array<i64: 32>} : (tensor<4x8xf32>) -> tensor<32xf32>
    forge.yield %r : tensor<32xf32>
  }
  return %v, %w : tensor<2x2x4x4xf32>, tensor<32xf32>
}

// -----

// A batch_norm region is the norm's kernel, one block per channel (4 here):
// one pass of shifted sums, then an output pass that writes the epilogue's
// ReLU (16-byte vectors: a 2x4 plane) and its mask (4-byte vectors of one
// byte per element: a thread's unit is one access of each) instead of the
// normalized value; the running statistics last.
// CHECK-LABEL: func @bn_relu
// CHECK: forge.fusion "batch_norm"(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5) {forge.launch = {block = 32 : i64, grid = 4 : i64, kernel = "k0_fusion"}}
// CHECK: gpu.func @k0_fusion(%arg0: memref<16xvector<4xf32>>, %arg1: memref<4xf32>, %arg2: memref<4xf32>, %arg3: memref<4xf32>, %arg4: memref<4xf32>, %arg5: memref<1xf32>, %arg6: memref<16xvector<4xf32>>, %arg7: memref<16xvector<4xi8>>, %arg8: memref<4xf32>, %arg9: memref<4xf32>) workgroup(
// CHECK: arith.maximumf
// CHECK: math.rsqrt
// CHECK: memref.store %{{.*}}, %arg6[%{{.*}}] : memref<16xvector<4xf32>>
// CHECK: memref.store %{{.*}}, %arg7[%{{.*}}] : memref<16xvector<4xi8>>
// CHECK: memref.store %{{.*}}, %arg8[%{{.*}}] : memref<4xf32>
func.func @bn_relu(%x: tensor<2x4x2x4xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %rm: tensor<4xf32>, %rv: tensor<4xf32>, %zero: tensor<f32>) -> (tensor<2x4x2x4xf32>, tensor<2x4x2x4xi1>, tensor<4xf32>, tensor<4xf32>) {
  %r:4 = forge.fusion "batch_norm"(%x, %s, %b, %rm, %rv, %zero) : (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<f32>) -> (tensor<2x4x2x4xf32>, tensor<2x4x2x4xi1>, tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<2x4x2x4xf32>, %c: tensor<4xf32>, %d: tensor<4xf32>, %e: tensor<4xf32>, %f: tensor<4xf32>, %z: tensor<f32>):
    %y, %m, %v = forge.batch_norm_training %a, %c, %d, %e, %f {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>)
    %relu = forge.relu %y : (tensor<2x4x2x4xf32>) -> tensor<2x4x2x4xf32>
    %mask = forge.greater %relu, %z : (tensor<2x4x2x4xf32>, tensor<f32>) -> tensor<2x4x2x4xi1>
    forge.yield %relu, %mask, %m, %v : tensor<2x4x2x4xf32>, tensor<2x4x2x4xi1>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1, %r#2, %r#3 : tensor<2x4x2x4xf32>, tensor<2x4x2x4xi1>, tensor<4xf32>, tensor<4xf32>
}

// -----

// The gradient's region reads the mask and the incoming gradient wherever
// the norm's kernel reads dy (both passes); dx, dscale and dbias are its
// results.
// CHECK-LABEL: func @bn_grad_mask
// CHECK: forge.fusion "batch_norm"(%arg0, %arg1, %arg2, %arg3, %arg4) {forge.launch = {block = 32 : i64, grid = 4 : i64, kernel = "k0_fusion"}}
// CHECK: gpu.func @k0_fusion(%arg0: memref<16xvector<4xf32>>, %arg1: memref<4xf32>, %arg2: memref<16xvector<4xi8>>, %arg3: memref<16xvector<4xf32>>, %arg4: memref<1xf32>, %arg5: memref<16xvector<4xf32>>, %arg6: memref<4xf32>, %arg7: memref<4xf32>) workgroup(
// CHECK-COUNT-2: memref.load %arg2[
func.func @bn_grad_mask(%x: tensor<2x4x2x4xf32>, %s: tensor<4xf32>, %mask: tensor<2x4x2x4xi1>, %g: tensor<2x4x2x4xf32>, %zero: tensor<f32>) -> (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = forge.fusion "batch_norm"(%x, %s, %mask, %g, %zero) : (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<2x4x2x4xi1>, tensor<2x4x2x4xf32>, tensor<f32>) -> (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<2x4x2x4xf32>, %c: tensor<4xf32>, %k: tensor<2x4x2x4xi1>, %d: tensor<2x4x2x4xf32>, %z: tensor<f32>):
    %dy = forge.where %k, %d, %z : (tensor<2x4x2x4xi1>, tensor<2x4x2x4xf32>, tensor<f32>) -> tensor<2x4x2x4xf32>
    %dx, %ds, %db = forge.batch_norm_training_grad %a, %c, %dy {bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<2x4x2x4xf32>) -> (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>)
    forge.yield %dx, %ds, %db : tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1, %r#2 : tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// An epilogue input that is neither image-sized nor one element (a
// per-channel row) has no kernel: the region's ops are placed one by one.
// CHECK-LABEL: func @bn_broadcast_epilogue
// CHECK-NOT: forge.fusion
// CHECK: forge.batch_norm_training %arg0, {{.*}}kernel = "k0_batch_norm_training"
// CHECK: forge.mul
func.func @bn_broadcast_epilogue(%x: tensor<2x4x2x4xf32>, %s: tensor<4xf32>, %row: tensor<1x4x1x1xf32>) -> (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = forge.fusion "batch_norm"(%x, %s, %row) : (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<1x4x1x1xf32>) -> (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<2x4x2x4xf32>, %c: tensor<4xf32>, %w: tensor<1x4x1x1xf32>):
    %y, %m, %v = forge.batch_norm_training %a, %c, %c, %c, %c {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>)
    %p = forge.mul %y, %w : (tensor<2x4x2x4xf32>, tensor<1x4x1x1xf32>) -> tensor<2x4x2x4xf32>
    forge.yield %p, %m, %v : tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1, %r#2 : tensor<2x4x2x4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// A split moves 4-element vectors when 4 consecutive input elements go to one
// output contiguously: a transformer's qkv split (axis innermost, every
// extent a multiple of 4), 2x24 bf16 elements as 12 vectors, each stored to
// the output its axis coordinate lies in (here one in f32, converted on the
// store). Extents 3 and 5 leave it one element per thread.
// CHECK-LABEL: func @splits
// CHECK: forge.split %arg0 {{.*}}forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k0_split"}
// CHECK: forge.split %arg1 {{.*}}forge.launch = {block = 32 : i64, grid = 1 : i64, kernel = "k1_split"}
// CHECK: gpu.func @k0_split(%arg0: memref<12xvector<4xbf16>>, %arg1: memref<4xvector<4xbf16>>, %arg2: memref<4xvector<4xbf16>>, %arg3: memref<4xvector<4xf32>>)
// CHECK: memref.load %arg0[%{{.*}}] : memref<12xvector<4xbf16>>
// CHECK: arith.extf %{{.*}} : vector<4xbf16> to vector<4xf32>
// CHECK: gpu.func @k1_split(%arg0: memref<16xf32>, %arg1: memref<6xf32>, %arg2: memref<10xf32>)
func.func @splits(%x: tensor<2x24xbf16>, %y: tensor<2x8xf32>) -> (tensor<2x8xbf16>, tensor<2x8xbf16>, tensor<2x8xf32>, tensor<2x3xf32>, tensor<2x5xf32>) {
  %s:3 = forge.split %x {axis = 1 : i64, sizes = array<i64: 8, 8, 8>} : (tensor<2x24xbf16>) -> (tensor<2x8xbf16>, tensor<2x8xbf16>, tensor<2x8xf32>)
  %t:2 = forge.split %y {axis = 1 : i64, sizes = array<i64: 3, 5>} : (tensor<2x8xf32>) -> (tensor<2x3xf32>, tensor<2x5xf32>)
  return %s#0, %s#1, %s#2, %t#0, %t#1 : tensor<2x8xbf16>, tensor<2x8xbf16>, tensor<2x8xf32>, tensor<2x3xf32>, tensor<2x5xf32>
}

// -----

// A column sum (a bias gradient: [tokens, features] over the tokens) whose
// kept dim divides by 4 reads 4 consecutive outputs per lane in one vector
// (8 bytes of bf16) and keeps 4 accumulators; shared memory holds them lane
// by lane (4 x 256 values). 6 features keep one output per lane.
// CHECK-LABEL: func @column_sums
// CHECK: gpu.func @k0_reduce_sum(%arg0: memref<1024xvector<4xbf16>>, %arg1: memref<16xf32>) workgroup(%arg2 : memref<1024xf32, #gpu.address_space<workgroup>>)
// CHECK: memref.load %arg0[%{{.*}}] : memref<1024xvector<4xbf16>>
// CHECK-COUNT-4: vector.extract
// CHECK: gpu.func @k1_reduce_sum(%arg0: memref<1536xbf16>, %arg1: memref<6xf32>)
func.func @column_sums(%d: tensor<256x16xbf16>, %e: tensor<256x6xbf16>) -> (tensor<16xf32>, tensor<6xf32>) {
  %s = forge.reduce_sum %d {axes = array<i64: 0>, keepdims = false} : (tensor<256x16xbf16>) -> tensor<16xf32>
  %t = forge.reduce_sum %e {axes = array<i64: 0>, keepdims = false} : (tensor<256x6xbf16>) -> tensor<6xf32>
  return %s, %t : tensor<16xf32>, tensor<6xf32>
}

// -----

// A middle-axis mean ([B, T, C] over T, keepdims: dk's centring) takes the
// vector form too when C holds whole warps of vectors (C = 256: a warp's 128
// outputs are one run of memory); C = 64 keeps one output per lane.
// CHECK-LABEL: func @middle_axis_means
// The output's input offset: (o % 256) + (o / 256) * 2048, the batch's stride
// (an output index used as an input offset would read batch 0's rows).
// CHECK: gpu.func @k0_reduce_mean(%arg0: memref<2048xvector<4xbf16>>, %arg1: memref<1024xf32>)
// CHECK: %[[REM:.*]] = arith.remui %[[O:.*]], %c256
// CHECK: %[[DIV:.*]] = arith.divui %[[O]], %c256
// CHECK: arith.muli %[[DIV]], %c2048
// CHECK: memref.load %arg0[%{{.*}}] : memref<2048xvector<4xbf16>>
// CHECK-COUNT-4: vector.extract
// CHECK: gpu.func @k1_reduce_mean(%arg0: memref<2048xbf16>, %arg1: memref<256xf32>)
func.func @middle_axis_means(%d: tensor<4x8x256xbf16>, %e: tensor<4x8x64xbf16>) -> (tensor<4x1x256xf32>, tensor<4x1x64xf32>) {
  %s = forge.reduce_mean %d {axes = array<i64: 1>, keepdims = true} : (tensor<4x8x256xbf16>) -> tensor<4x1x256xf32>
  %t = forge.reduce_mean %e {axes = array<i64: 1>, keepdims = true} : (tensor<4x8x64xbf16>) -> tensor<4x1x64xf32>
  return %s, %t : tensor<4x1x256xf32>, tensor<4x1x64xf32>
}

// -----

// A column_reduce region is one kernel: a thread owns 4 columns (one vector load of each
// input per row: the image and the per-column shift), 32 column groups of 128 columns
// side by side with 8 row slots per block, rows split over blocks that add their sums
// atomically into the zeroed f32 results. The loop is software-pipelined: its 16 rows'
// image vectors for the first iteration are loaded before it, and each iteration loads
// the next one's before its sums (the loop carries them after the 8 partial sums). The
// partials meet in shared memory as [partial][thread]; each sum has its own atomic add.
// CHECK-LABEL: func @column_sums
// CHECK: forge.fusion "column_reduce"(%arg0, %arg1) {forge.launch = {block = 256 : i64, grid = {{[0-9]+}} : i64, kernel = "k0_fusion", zero_outputs}}
// CHECK: gpu.func @k0_fusion(%arg0: memref<16384xvector<4xf32>>, %arg1: memref<32xvector<4xf32>>, %arg2: memref<128xf32>, %arg3: memref<128xf32>)
// CHECK-COUNT-16: memref.load %arg0[{{.*}}] : memref<16384xvector<4xf32>>
// CHECK: scf.for {{.*}} -> (f32, f32, f32, f32, f32, f32, f32, f32, vector<4xf32>
// CHECK-COUNT-16: memref.load %arg0[{{.*}}] : memref<16384xvector<4xf32>>
// CHECK: scf.yield
// CHECK: gpu.barrier
// CHECK: memref.atomic_rmw addf %{{.*}}, %arg2[
// CHECK: memref.atomic_rmw addf %{{.*}}, %arg3[
func.func @column_sums(%x: tensor<8x8x8x128xf32>, %k: tensor<128xf32>) -> (tensor<128xf32>, tensor<128xf32>) {
  %r:2 = forge.fusion "column_reduce"(%x, %k) : (tensor<8x8x8x128xf32>, tensor<128xf32>) -> (tensor<128xf32>, tensor<128xf32>) {
  ^bb0(%a: tensor<8x8x8x128xf32>, %b: tensor<128xf32>):
    %s = forge.sub %a, %b : (tensor<8x8x8x128xf32>, tensor<128xf32>) -> tensor<8x8x8x128xf32>
    %t = forge.reduce_sum %s {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<8x8x8x128xf32>) -> tensor<128xf32>
    %q = forge.mul %s, %s : (tensor<8x8x8x128xf32>, tensor<8x8x8x128xf32>) -> tensor<8x8x8x128xf32>
    %u = forge.reduce_sum %q {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<8x8x8x128xf32>) -> tensor<128xf32>
    forge.yield %t, %u : tensor<128xf32>, tensor<128xf32>
  }
  return %r#0, %r#1 : tensor<128xf32>, tensor<128xf32>
}

// -----

// A channels-last max pool: the flat index's remainder by C is the channel (consecutive
// threads read consecutive channels: coalesced), the quotient walks the windows.
// CHECK-LABEL: func @max_pool_channels_last
// CHECK: gpu.func @k0_max_pool(%arg0: memref<2048xf32>, %arg1: memref<512xf32>)
// CHECK: %[[C:.*]] = arith.remui %[[I:.*]], %c16
// CHECK: arith.divui %[[I]], %c16
func.func @max_pool_channels_last(%x: tensor<2x8x8x16xf32>) -> tensor<2x4x4x16xf32> {
  %p = forge.max_pool %x {channels_last = true, kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, ceil_mode = false} : (tensor<2x8x8x16xf32>) -> tensor<2x4x4x16xf32>
  return %p : tensor<2x4x4x16xf32>
}

// -----

// A data-parallel bundle's all_reduce is a collective (NCCL), not a kernel or
// a host op: no warning, no kernel.
// CHECK-LABEL: func @collective
// CHECK: forge.all_reduce {{.*}}forge.placement = "collective"
// CHECK-NOT: run on the host
func.func @collective(%g: tensor<64xf32>, %l: tensor<f32>) -> (tensor<64xf32>, tensor<f32>) {
  %r:2 = forge.all_reduce %g, %l {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<64xf32>, tensor<f32>) -> (tensor<64xf32>, tensor<f32>)
  return %r#0, %r#1 : tensor<64xf32>, tensor<f32>
}

// -----

// ZeRO-1's collectives are too (NCCL reduce-scatter and all-gather; rank_slice
// a copy of this rank's part on the collective stream).
// CHECK-LABEL: func @zero
// CHECK: forge.reduce_scatter {{.*}}forge.placement = "collective"
// CHECK: forge.rank_slice {{.*}}forge.placement = "collective"
// CHECK: forge.all_gather {{.*}}forge.placement = "collective"
// CHECK-NOT: run on the host
func.func @zero(%g: tensor<64x4xf32>, %w: tensor<64x4xf32>) -> (tensor<32x4xf32>, tensor<64x4xf32>) {
  %r = forge.reduce_scatter %g {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<64x4xf32>) -> tensor<32x4xf32>
  %p = forge.rank_slice %w {group = "dp", size = 2 : i64} : (tensor<64x4xf32>) -> tensor<32x4xf32>
  %a = forge.all_gather %p {group = "dp", size = 2 : i64} : (tensor<32x4xf32>) -> tensor<64x4xf32>
  return %r, %a : tensor<32x4xf32>, tensor<64x4xf32>
}

// -----

// The loss and its gradient over rows of 16 with 13 classes (3 padding
// columns), 4-wide vectors: a vector's lanes are logits by two compares of
// its index (lane 0 while v < 4, lanes 1-3 while v < 3), the target by one
// (v == tc / 4) and its lane once a row; the exponentials are exp2 of the
// difference times log2(e) (libdevice's expf made the kernel
// instruction-bound). No compare of a lane's column is left in the loops.
// CHECK-LABEL: func @loss_rows
// CHECK: gpu.func @k0_cross_entropy_with_grad(%arg0: memref<32xvector<4xf32>>
// CHECK-NOT: math.exp{{ }}
// CHECK: scf.for %[[V:.*]] = %thread_id_x to
// CHECK: arith.cmpi ult, %[[V]], %c3
// CHECK: arith.cmpi ult, %[[V]], %c4
// CHECK-NOT: arith.cmpi {{.*}}%[[V]]
// CHECK: math.exp2
// CHECK-NOT: math.exp{{ }}
// CHECK: math.log
// CHECK: scf.for %[[W:.*]] = %thread_id_x{{.*}} to
// CHECK: arith.cmpi ult, %[[W]], %c3
// CHECK-NEXT: arith.constant 4
// CHECK-NEXT: arith.cmpi ult, %[[W]], %c4
// CHECK-NEXT: arith.cmpi eq, %[[W]],
// CHECK-NOT: arith.cmpi
// CHECK-NOT: math.exp{{ }}
// CHECK: memref.store {{.*}} : memref<32xvector<4xbf16>>
// CHECK: gpu.return
func.func @loss_rows(%x: tensor<8x16xf32>, %t: tensor<8xi64>, %g: tensor<f32>) -> (tensor<8xf32>, tensor<8x16xbf16>) {
  %l, %d = forge.cross_entropy_with_grad %x, %t, %g {classes = 13 : i64, reduction = "mean"} : (tensor<8x16xf32>, tensor<8xi64>, tensor<f32>) -> (tensor<8xf32>, tensor<8x16xbf16>)
  return %l, %d : tensor<8xf32>, tensor<8x16xbf16>
}

// -----

// The persistent form: 200 rows of 16400 (16397 classes) in one block of 1024
// threads per SM (132), 4 vectors a thread an iteration; each vector gets its
// two compares (v < 16397 / 4, v <= 16397 / 4), which also reject the vectors
// past the row's end that the unrolled iterations load clamped.
// CHECK-LABEL: func @loss_rows_wide
// CHECK: forge.launch = {block = 1024 : i64, {{.*}}grid = 132 : i64
// CHECK: scf.for %{{.*}} = %block_id_x to %c200 step %c132
// CHECK: scf.for %{{.*}} = %thread_id_x to %c4100{{.*}} step %c4096
// CHECK-COUNT-4: arith.cmpi ult, %{{.*}}, %c4099
// CHECK-NOT: math.exp{{ }}
// CHECK: math.log
func.func @loss_rows_wide(%x: tensor<200x16400xf32>, %t: tensor<200xi64>, %g: tensor<f32>) -> (tensor<200xf32>, tensor<200x16400xbf16>) {
  %l, %d = forge.cross_entropy_with_grad %x, %t, %g {classes = 16397 : i64, reduction = "mean"} : (tensor<200x16400xf32>, tensor<200xi64>, tensor<f32>) -> (tensor<200xf32>, tensor<200x16400xbf16>)
  return %l, %d : tensor<200xf32>, tensor<200x16400xbf16>
}

// -----

// The on-chip form (a bf16 gradient, more rows than two blocks an SM): 264
// blocks of 512 threads, the row's exponentials e = exp(x - mg) as f16 in
// dynamic shared memory (2048 vectors of 4: 16 KiB), at most 64 registers
// (nvvm.minctasm = 2); one exp2 a logit in the first pass (x log2 e - mg
// log2 e in one fma), the f16 stores, one barrier a row (the partials'
// slots by row parity), then the gradient from shared memory, stored bf16.
// CHECK-LABEL: func @loss_rows_on_chip
// CHECK: forge.launch = {block = 512 : i64, {{.*}}grid = 264 : i64, {{.*}}shared_bytes = 16384 : i64}
// CHECK: gpu.func @{{.*}}cross_entropy_with_grad{{.*}} kernel attributes {{.*}}nvvm.minctasm = 2
// CHECK: %[[RAW:.*]] = gpu.dynamic_shared_memory
// CHECK: %[[E:.*]] = memref.view %[[RAW]]{{.*}} to memref<2048xvector<4xf16>, #gpu.address_space<workgroup>>
// CHECK: scf.for %[[ROW:.*]] = %block_id_x to %c600 step %c264
// CHECK: llvm.intr.fma
// CHECK-NEXT: math.exp2
// CHECK-NEXT: arith.addf
// CHECK-NEXT: llvm.intr.fma
// CHECK-NEXT: math.exp2
// CHECK: arith.truncf {{.*}} : vector<4xf32> to vector<4xf16>
// CHECK: memref.store {{.*}}, %[[E]]
// CHECK: gpu.barrier
// CHECK-NOT: gpu.barrier
// CHECK: memref.load %[[E]]
// CHECK: arith.truncf {{.*}} : vector<4xf32> to vector<4xbf16>
// CHECK: gpu.return
func.func @loss_rows_on_chip(%x: tensor<600x8192xf32>, %t: tensor<600xi64>, %g: tensor<f32>) -> (tensor<600xf32>, tensor<600x8192xbf16>) {
  %l, %d = forge.cross_entropy_with_grad %x, %t, %g {classes = 8190 : i64, reduction = "mean"} : (tensor<600x8192xf32>, tensor<600xi64>, tensor<f32>) -> (tensor<600xf32>, tensor<600x8192xbf16>)
  return %l, %d : tensor<600xf32>, tensor<600x8192xbf16>
}

// -----

// An f32 gradient keeps the vector kernel (f16 exponentials would be coarser
// than the gradient it writes).
// CHECK-LABEL: func @loss_rows_f32_gradient
// CHECK: forge.launch = {block = 128 : i64, {{.*}}grid = 600 : i64
// CHECK-NOT: gpu.dynamic_shared_memory
// CHECK: gpu.return
func.func @loss_rows_f32_gradient(%x: tensor<600x8192xf32>, %t: tensor<600xi64>, %g: tensor<f32>) -> (tensor<600xf32>, tensor<600x8192xf32>) {
  %l, %d = forge.cross_entropy_with_grad %x, %t, %g {classes = 8190 : i64, reduction = "mean"} : (tensor<600x8192xf32>, tensor<600xi64>, tensor<f32>) -> (tensor<600xf32>, tensor<600x8192xf32>)
  return %l, %d : tensor<600xf32>, tensor<600x8192xf32>
}

// -----

// zero_outputs (forge-elide-centred-sums; here [256, 1536) by hand, so that the first skipped
// block and the skipped count differ): the column sums' output blocks inside the range are not
// launched (10 of 18 blocks of 128 outputs, 32 splits: grid 256 against 522 for the same sum
// unmarked) and stay as the launch's memset left them; block b >= 2 maps to b + 10, and the
// finish writes 0 inside [256, 1536) too. A sum too short to split (no memset) launches every
// block and writes the range's zeros itself.
// CHECK-LABEL: func @zero_outputs
// CHECK: forge.reduce_sum %arg0 {axes = array<i64: 0>, forge.launch = {block = 256 : i64, grid = 256 : i64, kernel = "[[K0:k[0-9]+_reduce_sum]]", zero_outputs}, keepdims = false, zero_outputs = array<i64: 256, 1536>}
// CHECK: forge.reduce_sum %arg0 {axes = array<i64: 0>, forge.launch = {block = 256 : i64, grid = 522 : i64, kernel = "[[K1:k[0-9]+_reduce_sum]]", zero_outputs}, keepdims = false}
// CHECK: forge.reduce_sum %arg1 {axes = array<i64: 0>, forge.launch = {block = 256 : i64, grid = 2 : i64, kernel = "[[K2:k[0-9]+_reduce_sum]]"}, keepdims = false, zero_outputs = array<i64: 128, 256>}
// CHECK: gpu.func @[[K0]](
// CHECK-DAG: %[[GE:.+]] = arith.cmpi uge, %[[B:[a-z0-9_]+]], %c2{{(_[0-9]+)?}} : index
// CHECK-DAG: %[[UP:.+]] = arith.addi %[[B]], %c10{{(_[0-9]+)?}} : index
// CHECK: arith.select %[[GE]], %[[UP]], %[[B]] : index
// CHECK-DAG: arith.cmpi ult, %{{.+}}, %c1536{{(_[0-9]+)?}} : index
// CHECK-DAG: arith.cmpi uge, %{{.+}}, %c256{{(_[0-9]+)?}} : index
// CHECK: gpu.func @[[K1]](
// CHECK-NOT: %c1536
// CHECK: gpu.func @[[K2]](
// CHECK-DAG: arith.cmpi ult, %{{.+}}, %c256{{(_[0-9]+)?}} : index
// CHECK-DAG: arith.cmpi uge, %{{.+}}, %c128{{(_[0-9]+)?}} : index
// CHECK: gpu.return
func.func @zero_outputs(%d: tensor<4096x2304xbf16>, %e: tensor<64x256xf32>) -> (tensor<2304xf32>, tensor<2304xf32>, tensor<256xf32>) {
  %s = forge.reduce_sum %d {axes = array<i64: 0>, keepdims = false, zero_outputs = array<i64: 256, 1536>} : (tensor<4096x2304xbf16>) -> tensor<2304xf32>
  %t = forge.reduce_sum %d {axes = array<i64: 0>, keepdims = false} : (tensor<4096x2304xbf16>) -> tensor<2304xf32>
  %u = forge.reduce_sum %e {axes = array<i64: 0>, keepdims = false, zero_outputs = array<i64: 128, 256>} : (tensor<64x256xf32>) -> tensor<256xf32>
  return %s, %t, %u : tensor<2304xf32>, tensor<2304xf32>, tensor<256xf32>
}
