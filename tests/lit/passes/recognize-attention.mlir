// RUN: forge-opt %s --split-input-file --forge-recognize-composites --forge-eliminate-dead-code | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-recognize-composites="attention=cudnn" --forge-eliminate-dead-code 2>/dev/null | FileCheck %s --check-prefix=CUDNN
// RUN: forge-opt %s --split-input-file --forge-recognize-composites="attention=cudnn" 2>&1 >/dev/null | FileCheck %s --check-prefix=CUDNN-REMARK
// RUN: forge-opt %s --split-input-file --forge-recognize-composites="attention=none" --forge-eliminate-dead-code 2>/dev/null | FileCheck %s --check-prefix=NONE
// RUN: forge-opt %s --split-input-file --forge-recognize-composites="attention=none" 2>&1 >/dev/null | FileCheck %s --check-prefix=NONE-REMARK
// RUN: not forge-opt %s --forge-recognize-composites="attention=fast" 2>&1 | FileCheck %s --check-prefix=BAD

// BAD: attention must be all, cudnn or none, got 'fast'

// The TorchScript GPT (models/make_models.py): q @ k^T (k^T a transpose of the
// split's view), * 1/sqrt(d), where(~tril, -inf, .), softmax, @ v. One
// forge.attention reading k through one transpose of the view (0,2,1,3).
// CHECK-LABEL: func @gpt_causal
// CHECK: %[[K:.*]] = forge.transpose %arg1 {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
// CHECK-NEXT: %[[O:.*]], %{{.*}} = forge.attention %arg0, %[[K]], %arg2 {causal = true, scale = 2.500000e-01 : f64} : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
// CHECK-NEXT: return %[[O]]
// CHECK-NOT: forge.softmax
// CUDNN-LABEL: func @gpt_causal
// CUDNN: forge.attention
// NONE-REMARK: remark: forge-recognize-composites: 1 attention chain(s) left unfused (this target has no fused attention at this precision)
// NONE-LABEL: func @gpt_causal
// NONE-NOT: forge.attention
// NONE: forge.softmax
func.func @gpt_causal(%q: tensor<2x4x8x16xf32>, %kv: tensor<2x8x4x16xf32>, %v: tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32> {
  %kt = forge.transpose %kv {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x16x8xf32>
  %s = forge.matmul %q, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
  %c = forge.constant dense<2.500000e-01> : tensor<f32>
  %s2 = forge.mul %s, %c : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %mask = forge.constant dense<[[[[false, true, true, true, true, true, true, true],
                                  [false, false, true, true, true, true, true, true],
                                  [false, false, false, true, true, true, true, true],
                                  [false, false, false, false, true, true, true, true],
                                  [false, false, false, false, false, true, true, true],
                                  [false, false, false, false, false, false, true, true],
                                  [false, false, false, false, false, false, false, true],
                                  [false, false, false, false, false, false, false, false]]]]> : tensor<1x1x8x8xi1>
  %ninf = forge.constant dense<0xFF800000> : tensor<f32>
  %s3 = forge.where %mask, %ninf, %s2 : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = forge.softmax %s3 {axis = 3 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %o = forge.matmul %p, %v : (tensor<2x4x8x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  return %o : tensor<2x4x8x16xf32>
}

// -----

// No mask, the scale as a division, k^T not a transpose: a new transpose of
// k^T; the mask kept as where(tril, s, -1e9) (the other polarity).
// CHECK-LABEL: func @bidirectional_div
// CHECK: %[[K:.*]] = forge.transpose %arg1 {perm = array<i64: 0, 1, 3, 2>}
// CHECK-NEXT: forge.attention %arg0, %[[K]], %arg2 {causal = false, scale = 1.250000e-01 : f64} : (tensor<1x2x3x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>) -> (tensor<1x2x3x8xf32>, tensor<1x2x3xf32>)
// CHECK-NOT: forge.softmax
func.func @bidirectional_div(%q: tensor<1x2x3x8xf32>, %kt: tensor<1x2x8x5xf32>, %v: tensor<1x2x5x8xf32>) -> tensor<1x2x3x8xf32> {
  %s = forge.matmul %q, %kt : (tensor<1x2x3x8xf32>, tensor<1x2x8x5xf32>) -> tensor<1x2x3x5xf32>
  %c = forge.constant dense<8.000000e+00> : tensor<1xf32>
  %s2 = forge.div %s, %c : (tensor<1x2x3x5xf32>, tensor<1xf32>) -> tensor<1x2x3x5xf32>
  %p = forge.softmax %s2 {axis = 3 : i64} : (tensor<1x2x3x5xf32>) -> tensor<1x2x3x5xf32>
  %o = forge.matmul %p, %v : (tensor<1x2x3x5xf32>, tensor<1x2x5x8xf32>) -> tensor<1x2x3x8xf32>
  return %o : tensor<1x2x3x8xf32>
}

// -----

// where(tril, s, -1e9): causal spelled with the mask's other polarity.
// k^T was k's own transpose: attention reads k.
// CHECK-LABEL: func @causal_keep_mask
// CHECK-NOT: forge.transpose
// CHECK: forge.attention %arg0, %arg1, %arg2 {causal = true, scale = 1.000000e+00
func.func @causal_keep_mask(%q: tensor<1x1x3x8xf32>, %k: tensor<1x1x3x8xf32>, %v: tensor<1x1x3x8xf32>) -> tensor<1x1x3x8xf32> {
  %kt = forge.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x1x3x8xf32>) -> tensor<1x1x8x3xf32>
  %s = forge.matmul %q, %kt : (tensor<1x1x3x8xf32>, tensor<1x1x8x3xf32>) -> tensor<1x1x3x3xf32>
  %mask = forge.constant dense<[[true, false, false], [true, true, false], [true, true, true]]> : tensor<3x3xi1>
  %fill = forge.constant dense<-1.000000e+09> : tensor<f32>
  %s3 = forge.where %mask, %s, %fill : (tensor<3x3xi1>, tensor<1x1x3x3xf32>, tensor<f32>) -> tensor<1x1x3x3xf32>
  %p = forge.softmax %s3 {axis = 3 : i64} : (tensor<1x1x3x3xf32>) -> tensor<1x1x3x3xf32>
  %o = forge.matmul %p, %v : (tensor<1x1x3x3xf32>, tensor<1x1x3x8xf32>) -> tensor<1x1x3x8xf32>
  return %o : tensor<1x1x3x8xf32>
}

// -----

// A where-mask that is not the causal triangle (a padding mask, masked_fill
// of a boolean) becomes the bias where(mask, fill, 0); probabilities read
// twice (negative) stay unfused.
// CHECK-LABEL: func @not_attention
// CHECK: %[[Z:.*]] = forge.constant dense<0.000000e+00> : tensor<f32>
// CHECK: %[[F:.*]] = forge.constant dense<0xFF800000> : tensor<f32>
// CHECK: %[[W:.*]] = forge.where %{{.*}}, %[[F]], %[[Z]] : (tensor<2x2xi1>, tensor<f32>, tensor<f32>) -> tensor<2x2xf32>
// CHECK: %[[B:.*]] = forge.reshape %[[W]] {shape = array<i64: 1, 1, 2, 2>}
// CHECK: forge.attention %arg0, %{{.*}}, %arg2, %[[B]] {causal = false
// CHECK-NOT: forge.attention
// CHECK: forge.softmax
// CHECK-NOT: forge.attention
func.func @not_attention(%q: tensor<1x1x2x8xf32>, %kt: tensor<1x1x8x2xf32>, %v: tensor<1x1x2x8xf32>) -> (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>, tensor<1x1x2x2xf32>) {
  %s = forge.matmul %q, %kt : (tensor<1x1x2x8xf32>, tensor<1x1x8x2xf32>) -> tensor<1x1x2x2xf32>
  %mask = forge.constant dense<[[false, true], [false, true]]> : tensor<2x2xi1>
  %ninf = forge.constant dense<0xFF800000> : tensor<f32>
  %s3 = forge.where %mask, %ninf, %s : (tensor<2x2xi1>, tensor<f32>, tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32>
  %p = forge.softmax %s3 {axis = 3 : i64} : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32>
  %o = forge.matmul %p, %v : (tensor<1x1x2x2xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
  %u = forge.matmul %q, %kt : (tensor<1x1x2x8xf32>, tensor<1x1x8x2xf32>) -> tensor<1x1x2x2xf32>
  %p3 = forge.softmax %u {axis = 3 : i64} : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32>
  %o3 = forge.matmul %p3, %v : (tensor<1x1x2x2xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
  return %o, %o3, %p3 : tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>, tensor<1x1x2x2xf32>
}

// -----

// An additive mask after the scale (HF BERT's extended attention mask, a
// padding mask [B, 1, 1, Tk] made from an input): the op's bias. A rank-2 one
// ([Tq, Tk], LLaMA's causal mask) is reshaped to rank 4. Beside a causal
// where-mask (HF GPT-2: the where, then the add) the triangle joins the bias
// and causal is false (cuDNN's causal fill is finite: a row whose visible keys
// the bias all masks would not come out 0).
// CHECK-LABEL: func @additive_masks
// CHECK: %[[O1:.*]], %{{.*}} = forge.attention %arg0, %arg1, %arg2, %arg3 {causal = false, scale = 1.250000e-01 : f64} : (tensor<2x2x3x8xf32>, tensor<2x2x3x8xf32>, tensor<2x2x3x8xf32>, tensor<2x1x1x3xf32>) -> (tensor<2x2x3x8xf32>, tensor<2x2x3xf32>)
// CHECK: %[[B:.*]] = forge.reshape %arg4 {shape = array<i64: 1, 1, 3, 3>} : (tensor<3x3xf32>) -> tensor<1x1x3x3xf32>
// CHECK: %[[O2:.*]], %{{.*}} = forge.attention %arg0, %arg1, %arg2, %[[B]] {causal = false, {{.*}}scale = 5.000000e-01 : f64}
// CHECK: %[[TRI:.*]] = forge.where %{{.*}}, %{{.*}}, %{{.*}} : (tensor<3x3xi1>, tensor<f32>, tensor<f32>) -> tensor<3x3xf32>
// CHECK: %[[B3:.*]] = forge.add %arg3, %[[TRI]] : (tensor<2x1x1x3xf32>, tensor<3x3xf32>) -> tensor<2x1x3x3xf32>
// CHECK: %[[O3:.*]], %{{.*}} = forge.attention %arg0, %arg1, %arg2, %[[B3]] {causal = false,
// CHECK-NOT: forge.softmax
// CHECK: return %[[O1]], %[[O2]], %[[O3]]
func.func @additive_masks(%q: tensor<2x2x3x8xf32>, %k: tensor<2x2x3x8xf32>, %v: tensor<2x2x3x8xf32>, %pad: tensor<2x1x1x3xf32>, %causal: tensor<3x3xf32>) -> (tensor<2x2x3x8xf32>, tensor<2x2x3x8xf32>, tensor<2x2x3x8xf32>) {
  %kt = forge.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x2x3x8xf32>) -> tensor<2x2x8x3xf32>
  %s = forge.matmul %q, %kt : (tensor<2x2x3x8xf32>, tensor<2x2x8x3xf32>) -> tensor<2x2x3x3xf32>
  %c = forge.constant dense<8.0> : tensor<f32>
  %s1 = forge.div %s, %c : (tensor<2x2x3x3xf32>, tensor<f32>) -> tensor<2x2x3x3xf32>
  %s2 = forge.add %s1, %pad : (tensor<2x2x3x3xf32>, tensor<2x1x1x3xf32>) -> tensor<2x2x3x3xf32>
  %p = forge.softmax %s2 {axis = 3 : i64} : (tensor<2x2x3x3xf32>) -> tensor<2x2x3x3xf32>
  %o = forge.matmul %p, %v : (tensor<2x2x3x3xf32>, tensor<2x2x3x8xf32>) -> tensor<2x2x3x8xf32>
  %kt2 = forge.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x2x3x8xf32>) -> tensor<2x2x8x3xf32>
  %t = forge.matmul %q, %kt2 : (tensor<2x2x3x8xf32>, tensor<2x2x8x3xf32>) -> tensor<2x2x3x3xf32>
  %h = forge.constant dense<0.5> : tensor<f32>
  %t1 = forge.mul %h, %t : (tensor<f32>, tensor<2x2x3x3xf32>) -> tensor<2x2x3x3xf32>
  %t2 = forge.add %causal, %t1 : (tensor<3x3xf32>, tensor<2x2x3x3xf32>) -> tensor<2x2x3x3xf32>
  %p2 = forge.softmax %t2 {axis = 3 : i64} : (tensor<2x2x3x3xf32>) -> tensor<2x2x3x3xf32>
  %o2 = forge.matmul %p2, %v : (tensor<2x2x3x3xf32>, tensor<2x2x3x8xf32>) -> tensor<2x2x3x8xf32>
  %kt3 = forge.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x2x3x8xf32>) -> tensor<2x2x8x3xf32>
  %u = forge.matmul %q, %kt3 : (tensor<2x2x3x8xf32>, tensor<2x2x8x3xf32>) -> tensor<2x2x3x3xf32>
  %u1 = forge.div %u, %c : (tensor<2x2x3x3xf32>, tensor<f32>) -> tensor<2x2x3x3xf32>
  %tri = forge.constant dense<[[true, false, false], [true, true, false], [true, true, true]]> : tensor<3x3xi1>
  %min = forge.constant dense<-3.4e38> : tensor<f32>
  %u2 = forge.where %tri, %u1, %min : (tensor<3x3xi1>, tensor<2x2x3x3xf32>, tensor<f32>) -> tensor<2x2x3x3xf32>
  %u3 = forge.add %u2, %pad : (tensor<2x2x3x3xf32>, tensor<2x1x1x3xf32>) -> tensor<2x2x3x3xf32>
  %p3 = forge.softmax %u3 {axis = 3 : i64} : (tensor<2x2x3x3xf32>) -> tensor<2x2x3x3xf32>
  %o3 = forge.matmul %p3, %v : (tensor<2x2x3x3xf32>, tensor<2x2x3x8xf32>) -> tensor<2x2x3x8xf32>
  return %o, %o2, %o3 : tensor<2x2x3x8xf32>, tensor<2x2x3x8xf32>, tensor<2x2x3x8xf32>
}

// -----

// Negative: a learned bias (a trainable initializer reaches it: T5's relative
// position bias) needs a gradient the op does not give its bias: unfused.
// CHECK-LABEL: func @learned_bias
// CHECK-NOT: forge.attention
// CHECK: forge.softmax
func.func @learned_bias(%q: tensor<1x2x3x8xf32>, %kt: tensor<1x2x8x3xf32>, %v: tensor<1x2x3x8xf32>) -> tensor<1x2x3x8xf32> {
  %w = forge.constant {forge.initializer = "rel_bias"} dense<0.25> : tensor<2x3x3xf32>
  %s = forge.matmul %q, %kt : (tensor<1x2x3x8xf32>, tensor<1x2x8x3xf32>) -> tensor<1x2x3x3xf32>
  %s2 = forge.add %s, %w : (tensor<1x2x3x3xf32>, tensor<2x3x3xf32>) -> tensor<1x2x3x3xf32>
  %p = forge.softmax %s2 {axis = 3 : i64} : (tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
  %o = forge.matmul %p, %v : (tensor<1x2x3x3xf32>, tensor<1x2x3x8xf32>) -> tensor<1x2x3x8xf32>
  return %o : tensor<1x2x3x8xf32>
}

// -----

// cudnn: a head size cuDNN does not take (12) stays unfused, with the reason.
// CUDNN-REMARK: remark: forge-recognize-composites: 1 attention chain(s) left unfused (head size 12 is not a multiple of 8 up to 128)
// CUDNN-LABEL: func @odd_head
// CUDNN-NOT: forge.attention
// CHECK-LABEL: func @odd_head
// CHECK: forge.attention
func.func @odd_head(%q: tensor<1x1x4x12xf32>, %kt: tensor<1x1x12x4xf32>, %v: tensor<1x1x4x12xf32>) -> tensor<1x1x4x12xf32> {
  %s = forge.matmul %q, %kt : (tensor<1x1x4x12xf32>, tensor<1x1x12x4xf32>) -> tensor<1x1x4x4xf32>
  %p = forge.softmax %s {axis = 3 : i64} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %o = forge.matmul %p, %v : (tensor<1x1x4x4xf32>, tensor<1x1x4x12xf32>) -> tensor<1x1x4x12xf32>
  return %o : tensor<1x1x4x12xf32>
}

// -----

// q, k and v all head transposes of [B, T, H, D] views (the TorchScript GPT's
// split heads): layout bshd reads the views, o goes back through one transpose
// (which cancels with the exporter's own in canonicalization).
// CUDNN-LABEL: func @split_heads
// CUDNN: forge.attention {{.*}}layout = "bshd"
// CHECK-LABEL: func @split_heads
// CHECK: %[[O:.*]], %{{.*}} = forge.attention %arg0, %arg1, %arg2 {causal = false, layout = "bshd", scale = 1.250000e-01 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x4x6xf32>)
// CHECK-NEXT: %[[T:.*]] = forge.transpose %[[O]] {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x6x4x8xf32>) -> tensor<2x4x6x8xf32>
// CHECK-NEXT: return %[[T]]
func.func @split_heads(%q: tensor<2x6x4x8xf32>, %k: tensor<2x6x4x8xf32>, %v: tensor<2x6x4x8xf32>) -> tensor<2x4x6x8xf32> {
  %qt = forge.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x6x4x8xf32>) -> tensor<2x4x6x8xf32>
  %kt = forge.transpose %k {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x6x4x8xf32>) -> tensor<2x4x8x6xf32>
  %vt = forge.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x6x4x8xf32>) -> tensor<2x4x6x8xf32>
  %s = forge.matmul %qt, %kt : (tensor<2x4x6x8xf32>, tensor<2x4x8x6xf32>) -> tensor<2x4x6x6xf32>
  %c = forge.constant dense<1.250000e-01> : tensor<f32>
  %s2 = forge.mul %s, %c : (tensor<2x4x6x6xf32>, tensor<f32>) -> tensor<2x4x6x6xf32>
  %p = forge.softmax %s2 {axis = 3 : i64} : (tensor<2x4x6x6xf32>) -> tensor<2x4x6x6xf32>
  %o = forge.matmul %p, %vt : (tensor<2x4x6x6xf32>, tensor<2x4x6x8xf32>) -> tensor<2x4x6x8xf32>
  return %o : tensor<2x4x6x8xf32>
}

// -----

// GQA spelled out (repeat_interleave / expand): 4 query heads on 2 key/value
// heads, each repeated twice in place. The op reads the 2-head k and v.
// CHECK-LABEL: func @gqa_repeated
// CHECK: forge.attention %arg0, %arg1, %arg2 {causal = false, scale = 2.500000e-01 : f64} : (tensor<1x4x5x16xf32>, tensor<1x2x5x16xf32>, tensor<1x2x5x16xf32>) -> (tensor<1x4x5x16xf32>, tensor<1x4x5xf32>)
// CHECK-NOT: forge.broadcast
func.func @gqa_repeated(%q: tensor<1x4x5x16xf32>, %k: tensor<1x2x5x16xf32>, %v: tensor<1x2x5x16xf32>) -> tensor<1x4x5x16xf32> {
  %k5 = forge.reshape %k {shape = array<i64: 1, 2, 1, 5, 16>} : (tensor<1x2x5x16xf32>) -> tensor<1x2x1x5x16xf32>
  %kb = forge.broadcast %k5 {shape = array<i64: 1, 2, 2, 5, 16>} : (tensor<1x2x1x5x16xf32>) -> tensor<1x2x2x5x16xf32>
  %kr = forge.reshape %kb {shape = array<i64: 1, 4, 5, 16>} : (tensor<1x2x2x5x16xf32>) -> tensor<1x4x5x16xf32>
  %v5 = forge.reshape %v {shape = array<i64: 1, 2, 1, 5, 16>} : (tensor<1x2x5x16xf32>) -> tensor<1x2x1x5x16xf32>
  %vb = forge.broadcast %v5 {shape = array<i64: 1, 2, 2, 5, 16>} : (tensor<1x2x1x5x16xf32>) -> tensor<1x2x2x5x16xf32>
  %vr = forge.reshape %vb {shape = array<i64: 1, 4, 5, 16>} : (tensor<1x2x2x5x16xf32>) -> tensor<1x4x5x16xf32>
  %kt = forge.transpose %kr {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x4x5x16xf32>) -> tensor<1x4x16x5xf32>
  %s = forge.matmul %q, %kt : (tensor<1x4x5x16xf32>, tensor<1x4x16x5xf32>) -> tensor<1x4x5x5xf32>
  %c = forge.constant dense<2.500000e-01> : tensor<f32>
  %s2 = forge.mul %c, %s : (tensor<f32>, tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %p = forge.softmax %s2 {axis = 3 : i64} : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %o = forge.matmul %p, %vr : (tensor<1x4x5x5xf32>, tensor<1x4x5x16xf32>) -> tensor<1x4x5x16xf32>
  return %o : tensor<1x4x5x16xf32>
}

// -----

// torch's SDPA export with a boolean mask (HF BERT/GPT-2/LLaMA under
// torch.onnx): q and k^T each scaled by sqrt(scale), the additive bias
// where(mask, 0, -inf), and the NaN guard where(isnan(p), 0, p) after the
// softmax (the op gives a fully masked row o = 0 itself).
// CHECK-LABEL: func @sdpa_export
// CHECK: %[[B:.*]] = forge.where %arg3, %{{.*}}, %{{.*}} : (tensor<2x1x4x4xi1>, tensor<1xf32>, tensor<1xf32>) -> tensor<2x1x4x4xf32>
// CHECK: %[[O:.*]], %{{.*}} = forge.attention %arg0, %{{.*}}, %arg2, %[[B]] {causal = false, scale = 2.500000e-01 : f64}
// CHECK-NOT: forge.isnan
// CHECK-NOT: forge.softmax
// CHECK: return %[[O]]
func.func @sdpa_export(%q: tensor<2x2x4x16xf32>, %kt: tensor<2x2x16x4xf32>, %v: tensor<2x2x4x16xf32>, %mask: tensor<2x1x4x4xi1>) -> tensor<2x2x4x16xf32> {
  %h = forge.constant dense<5.000000e-01> : tensor<f32>
  %qs = forge.mul %q, %h : (tensor<2x2x4x16xf32>, tensor<f32>) -> tensor<2x2x4x16xf32>
  %ks = forge.mul %kt, %h : (tensor<2x2x16x4xf32>, tensor<f32>) -> tensor<2x2x16x4xf32>
  %s = forge.matmul %qs, %ks : (tensor<2x2x4x16xf32>, tensor<2x2x16x4xf32>) -> tensor<2x2x4x4xf32>
  %z = forge.constant dense<0.000000e+00> : tensor<1xf32>
  %ninf = forge.constant dense<0xFF800000> : tensor<1xf32>
  %bias = forge.where %mask, %z, %ninf : (tensor<2x1x4x4xi1>, tensor<1xf32>, tensor<1xf32>) -> tensor<2x1x4x4xf32>
  %s2 = forge.add %s, %bias : (tensor<2x2x4x4xf32>, tensor<2x1x4x4xf32>) -> tensor<2x2x4x4xf32>
  %p = forge.softmax %s2 {axis = 3 : i64} : (tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xf32>
  %nan = forge.isnan %p : (tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xi1>
  %z2 = forge.constant dense<0.000000e+00> : tensor<1xf32>
  %pg = forge.where %nan, %z2, %p : (tensor<2x2x4x4xi1>, tensor<1xf32>, tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xf32>
  %o = forge.matmul %pg, %v : (tensor<2x2x4x4xf32>, tensor<2x2x4x16xf32>) -> tensor<2x2x4x16xf32>
  return %o : tensor<2x2x4x16xf32>
}
