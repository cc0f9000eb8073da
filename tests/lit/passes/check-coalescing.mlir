// RUN: forge-opt %s --split-input-file --forge-check-coalescing=report --verify-diagnostics

// A pointwise copy: thread t of block b at b * 128 + t, read and written (coalesced); a
// scalar read by every thread (a broadcast); a per-column vector of 8 read at t % 8
// (cyclic, contiguous per warp); an index array read per thread (coalesced) and the value
// it points at (a gather: data-dependent).
module attributes {gpu.container_module} {
  gpu.module @kernels {
    // expected-remark @below {{kernel copy: 4 coalesced, 1 broadcast, 1 data-dependent, 0 strided}}
    gpu.func @copy(%a: memref<1024xf32>, %b: memref<1024xf32>, %s: memref<1xf32>, %c: memref<8xf32>, %idx: memref<1024xindex>) kernel attributes {known_block_size = array<i32: 128, 1, 1>} {
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c8 = arith.constant 8 : index
      %0 = arith.muli %bid, %bdim : index
      %1 = arith.addi %0, %tid : index
      %v = memref.load %a[%1] : memref<1024xf32>
      %k = memref.load %s[%c0] : memref<1xf32>
      %col = arith.remui %tid, %c8 : index
      %w = memref.load %c[%col] : memref<8xf32>
      %j = memref.load %idx[%1] : memref<1024xindex>
      %g = memref.load %a[%j] : memref<1024xf32>
      %x = arith.addf %v, %k : f32
      %y = arith.addf %x, %w : f32
      %z = arith.addf %y, %g : f32
      memref.store %z, %b[%1] : memref<1024xf32>
      gpu.return
    }
  }
}

// -----

// Negative: a transpose of [32, 32] reads a column per warp (stride 32 between adjacent
// threads); its write is coalesced. A loop walks rows from the thread's first row.
module attributes {gpu.container_module} {
  gpu.module @kernels {
    // expected-remark @below {{kernel transpose: 1 coalesced, 0 broadcast, 0 data-dependent, 1 strided}}
    gpu.func @transpose(%a: memref<1024xf32>, %b: memref<1024xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>} {
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c32 = arith.constant 32 : index
      scf.for %r = %c0 to %c32 step %c1 {
        %in = arith.muli %tid, %c32 : index
        %i = arith.addi %in, %r : index
        // expected-error @below {{kernel transpose: memref.load on a global memref is not coalesced: index strides between adjacent threads 32, 32, 32, 32, 32, 32, 32, 32, ...}}
        %v = memref.load %a[%i] : memref<1024xf32>
        %rn = arith.muli %r, %c32 : index
        %o = arith.addi %rn, %tid : index
        memref.store %v, %b[%o] : memref<1024xf32>
      }
      gpu.return
    }
  }
}

// -----

// A broadcast row of 24 elements read per output element ((b * 32 + t) % 24):
// block 1's warp reads 8..23 then wraps to 0..15, two ascending runs (one
// drop back to the lowest): coalesced, as a misaligned contiguous access.
// Rows of 24 at a stride of 30 (a padded 2-d walk) leave a gap between the
// runs: strided.
module attributes {gpu.container_module} {
  gpu.module @kernels {
    // expected-remark @below {{kernel wrap: 3 coalesced, 0 broadcast, 0 data-dependent, 1 strided}}
    gpu.func @wrap(%a: memref<1024xf32>, %row: memref<24xf32>, %padded: memref<1024xf32>, %b: memref<1024xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>} {
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %c24 = arith.constant 24 : index
      %c30 = arith.constant 30 : index
      %c32 = arith.constant 32 : index
      %0 = arith.muli %bid, %c32 : index
      %i = arith.addi %0, %tid : index
      %x = memref.load %a[%i] : memref<1024xf32>
      %j = arith.remui %i, %c24 : index
      %s = memref.load %row[%j] : memref<24xf32>
      %r = arith.divui %i, %c24 : index
      %rs = arith.muli %r, %c30 : index
      %k = arith.addi %rs, %j : index
      // expected-error @below {{kernel wrap: memref.load on a global memref is not coalesced: index strides between adjacent threads 1, 1, 1, 1, 1, 1, 1, 1, ...}}
      %u = memref.load %padded[%k] : memref<1024xf32>
      %y = arith.mulf %x, %s : f32
      %z = arith.mulf %y, %u : f32
      memref.store %z, %b[%i] : memref<1024xf32>
      gpu.return
    }
  }
}

// -----

// Rows a token stride apart (a concat's piece written in place): rows of 4
// 16-byte vectors (32 bf16) at a stride of 12 vectors: ascending runs of two
// whole 32-byte sectors each, jumping forward: coalesced. Rows of 3 vectors
// (48 bytes: a half sector at each row's end) are not.
module attributes {gpu.container_module} {
  gpu.module @kernels {
    // expected-remark @below {{kernel rows: 2 coalesced, 0 broadcast, 0 data-dependent, 1 strided}}
    gpu.func @rows(%a: memref<1024xvector<8xbf16>>, %b: memref<4096xvector<8xbf16>>, %c: memref<4096xvector<8xbf16>>) kernel attributes {known_block_size = array<i32: 32, 1, 1>} {
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %c3 = arith.constant 3 : index
      %c4 = arith.constant 4 : index
      %c12 = arith.constant 12 : index
      %c32 = arith.constant 32 : index
      %0 = arith.muli %bid, %c32 : index
      %i = arith.addi %0, %tid : index
      %x = memref.load %a[%i] : memref<1024xvector<8xbf16>>
      %r = arith.divui %i, %c4 : index
      %col = arith.remui %i, %c4 : index
      %rs = arith.muli %r, %c12 : index
      %k = arith.addi %rs, %col : index
      memref.store %x, %b[%k] : memref<4096xvector<8xbf16>>
      %r3 = arith.divui %i, %c3 : index
      %col3 = arith.remui %i, %c3 : index
      %rs3 = arith.muli %r3, %c12 : index
      %k3 = arith.addi %rs3, %col3 : index
      // expected-error @below {{kernel rows: memref.store on a global memref is not coalesced: index strides between adjacent threads}}
      memref.store %x, %c[%k3] : memref<4096xvector<8xbf16>>
      gpu.return
    }
  }
}
