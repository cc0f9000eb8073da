// RUN: forge-opt %s --split-input-file --forge-select-library --verify-diagnostics

// Attention has no generated kernel on CUDA: an f32 one (the recognizer forms it
// there only under --precision bf16/fp16) is an error naming the reason.
func.func @attention_f32(%q: tensor<1x2x16x64xf32>, %k: tensor<1x2x16x64xf32>, %v: tensor<1x2x16x64xf32>) -> tensor<1x2x16x64xf32> {
  // expected-error @+1 {{forge-select-library: no CUDA kernel for forge.attention: cuDNN's flash attention takes bf16 or f16 operands}}
  %o, %lse = forge.attention %q, %k, %v {causal = false, scale = 1.0 : f64} : (tensor<1x2x16x64xf32>, tensor<1x2x16x64xf32>, tensor<1x2x16x64xf32>) -> (tensor<1x2x16x64xf32>, tensor<1x2x16xf32>)
  return %o : tensor<1x2x16x64xf32>
}

// -----

// A head size cuDNN does not take.
func.func @attention_head_12(%q: tensor<1x2x16x12xbf16>, %k: tensor<1x2x16x12xbf16>, %v: tensor<1x2x16x12xbf16>) -> tensor<1x2x16x12xbf16> {
  // expected-error @+1 {{forge-select-library: no CUDA kernel for forge.attention: head size 12 is not a multiple of 8 up to 128}}
  %o, %lse = forge.attention %q, %k, %v {causal = false, scale = 1.0 : f64} : (tensor<1x2x16x12xbf16>, tensor<1x2x16x12xbf16>, tensor<1x2x16x12xbf16>) -> (tensor<1x2x16x12xbf16>, tensor<1x2x16xf32>)
  return %o : tensor<1x2x16x12xbf16>
}

// -----

// Inference rejects a head count that does not divide q's.
func.func @attention_heads(%q: tensor<1x3x16x8xbf16>, %k: tensor<1x2x16x8xbf16>, %v: tensor<1x2x16x8xbf16>) -> tensor<1x3x16x8xbf16> {
  // expected-error @+2 {{attention: k and v need q's batch and a head count dividing q's}}
  // expected-error @+1 {{failed to infer returned types}}
  %o, %lse = forge.attention %q, %k, %v {causal = false, scale = 1.0 : f64} : (tensor<1x3x16x8xbf16>, tensor<1x2x16x8xbf16>, tensor<1x2x16x8xbf16>) -> (tensor<1x3x16x8xbf16>, tensor<1x3x16xf32>)
  return %o : tensor<1x3x16x8xbf16>
}

// -----

// causal beside a bias: cuDNN hides the causal keys with a finite fill, so a
// row whose visible keys the bias all masks would not be 0 (the recognizer
// folds the triangle into the bias instead).
func.func @attention_causal_bias(%q: tensor<1x2x16x64xbf16>, %k: tensor<1x2x16x64xbf16>, %v: tensor<1x2x16x64xbf16>, %b: tensor<1x1x1x16xbf16>) -> tensor<1x2x16x64xbf16> {
  // expected-error @+1 {{forge-select-library: no CUDA kernel for forge.attention: cuDNN's causal mask beside a bias}}
  %o, %lse = forge.attention %q, %k, %v, %b {causal = true, scale = 1.0 : f64} : (tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x1x1x16xbf16>) -> (tensor<1x2x16x64xbf16>, tensor<1x2x16xf32>)
  return %o : tensor<1x2x16x64xbf16>
}

// -----

// A bias that does not broadcast to the scores [1, 2, 16, 16].
func.func @attention_bias_shape(%q: tensor<1x2x16x64xbf16>, %k: tensor<1x2x16x64xbf16>, %v: tensor<1x2x16x64xbf16>, %b: tensor<1x3x1x16xbf16>) -> tensor<1x2x16x64xbf16> {
  // expected-error @+2 {{attention: bias must broadcast to the scores [batch, heads, queries, keys]}}
  // expected-error @+1 {{failed to infer returned types}}
  %o, %lse = forge.attention %q, %k, %v, %b {causal = false, scale = 1.0 : f64} : (tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x2x16x64xbf16>, tensor<1x3x1x16xbf16>) -> (tensor<1x2x16x64xbf16>, tensor<1x2x16xf32>)
  return %o : tensor<1x2x16x64xbf16>
}

// -----

// A scaled_gemm cuBLASLt cannot take (a transposed lhs: float8 GEMMs read
// both operands K-major) has no kernel either.
func.func @scaled_transposed(%a: tensor<32x8xf8E4M3FN>, %b: tensor<16x32xf8E4M3FN>, %sa: tensor<f32>, %sb: tensor<f32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{cuBLASLt takes no form of this scaled_gemm}}
  %0 = forge.scaled_gemm %a, %b, %sa, %sb {alpha = 1.0 : f64, beta = 0.0 : f64, transA = true, transB = true} : (tensor<32x8xf8E4M3FN>, tensor<16x32xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
