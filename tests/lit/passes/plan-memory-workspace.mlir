// RUN: forge-opt %s --split-input-file --forge-plan-memory="workspace-floor=256 workspace-cap=1024" | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-plan-memory="workspace-floor=256 workspace-cap=256" | FileCheck %s --check-prefix=CAP
// RUN: forge-opt %s --split-input-file --forge-plan-memory="workspace-floor=256 report=true" -o /dev/null | FileCheck %s --check-prefix=REPORT

// Each cuDNN op gets arena bytes that no tensor live at it holds. Tensors
// (64-byte aligned): x [0, 1024) and w [2304, 2368) throughout, p [1024, 2048)
// at ops 0..1, c [2048, 2304) at ops 1..2, d [1024, 1280) from op 2. At the
// first conv nothing is free below the arena's 2368 bytes, so it gets the
// floor above them (the arena grows to 2624); at the second, p's bytes are
// free but for d's: the gap [1280, 2048) of 768 bytes gives 512 (a power of
// two), or the cap.
// CHECK-LABEL: func @workspace
// CHECK-SAME: attributes {forge.arena_size = 2624 : i64}
// CHECK: forge.neg %arg0 {forge.offsets = array<i64: 1024>}
// CHECK: forge.conv {{.*}}forge.offsets = array<i64: 2048>, forge.workspace = array<i64: 2368, 256>
// CHECK: forge.conv {{.*}}forge.offsets = array<i64: 1024>, forge.workspace = array<i64: 1280, 512>
// CHECK-NOT: forge.workspace
// CAP-LABEL: func @workspace
// CAP: forge.conv {{.*}}forge.workspace = array<i64: 2368, 256>
// CAP: forge.conv {{.*}}forge.workspace = array<i64: 1280, 256>
// REPORT: memory plan of @workspace: arena 2.6 KiB
// REPORT: cuDNN workspace of 2 ops in the arena: 256.0 B to 512.0 B; 1 at the floor (256.0 B), which added 256.0 B to the arena
func.func @workspace(%x: tensor<1x1x16x16xf32> {forge.kind = "input", forge.name = "x"},
                     %w: tensor<1x1x1x1xf32> {forge.kind = "input", forge.name = "w"})
    -> (tensor<1x1x8x8xf32> {forge.name = "y"}) {
  %p = forge.neg %x : (tensor<1x1x16x16xf32>) -> tensor<1x1x16x16xf32>
  %c = forge.conv %p, %w {strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64, forge.library = "cudnn"} : (tensor<1x1x16x16xf32>, tensor<1x1x1x1xf32>) -> tensor<1x1x8x8xf32>
  %d = forge.conv %c, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64, forge.library = "cudnn"} : (tensor<1x1x8x8xf32>, tensor<1x1x1x1xf32>) -> tensor<1x1x8x8xf32>
  return %d : tensor<1x1x8x8xf32>
}

// -----

// Only cuDNN calls get arena workspace: cuBLASLt keeps its fixed one, and a
// routine without cuDNN calls has no workspace line in the report.
// CHECK-LABEL: func @no_cudnn
// CHECK-SAME: attributes {forge.arena_size = 128 : i64}
// CHECK-NOT: forge.workspace
// REPORT: memory plan of @no_cudnn: arena 128.0 B
// REPORT-NOT: cuDNN workspace
func.func @no_cudnn(%a: tensor<4x4xf32> {forge.kind = "input", forge.name = "a"})
    -> (tensor<4x4xf32> {forge.name = "y"}) {
  %m = forge.matmul %a, %a {forge.library = "cublaslt"} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %m : tensor<4x4xf32>
}
