// CUTLASS's sm90 GEMMs with fused epilogues: extra candidates a MatmulPlan times
// beside cuBLASLt's algorithms (Matmul.h), for the epilogues cuBLASLt runs well below
// its plain GEMMs' speed on Hopper (bench/cutlass_epilogue_probe.cu, RESULTS).
//
// This header is plain C++ (no CUTLASS, protobuf or MLIR): CutlassGemm.cu, the one
// file nvcc compiles, holds the instantiations. Problems are in cuBLASLt's column-major
// terms, as MatmulPlan states them: D is m x n column-major (leading dimension m), i.e.
// the row-major [n, m] result of a row-major instruction whose rows are the n tokens; A
// is m x k, B is k x n, always K-major (column-major k x n stored as rows of k). Every
// per-row vector (bias) runs along m.
//
// Invariants: operands bf16 (D f32 only with the residual epilogue), one batch, the
// accumulation in f32, alpha (and beta with a C) f32. A configuration runs only on a
// device of compute capability 9.0 (the kernels are sm_90a code).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace forge::rt::cuda {

struct CutlassGemm {
  enum class Epilogue {
    Bias,         // D bf16 = alpha acc + bias (bf16)
    GeluAuxBias,  // aux bf16 = alpha acc + bias (bf16); D bf16 = gelu_tanh(aux)
    ResidualBias, // D f32 = alpha acc + beta C (f32) + bias (f32)
    Dgelu,        // D bf16 = alpha acc * gelu_tanh'(aux) (aux bf16, read)
  } epilogue = Epilogue::Bias;
  int64_t m = 0, n = 0, k = 0;
  bool aKMajor = true; // A stored row-major m x k (else column-major, m contiguous)
  float alpha = 1, beta = 0;
};

struct CutlassOperands {
  const void *a = nullptr, *b = nullptr, *c = nullptr, *bias = nullptr;
  void *d = nullptr;
  void *aux = nullptr; // written (GeluAuxBias) or read (Dgelu); laid out as D
};

/// How many configurations of `g`'s epilogue and A layout this build holds (0: none, or
/// CUTLASS was not built in). Each may still refuse a problem (alignment) when run.
int cutlassGemmConfigs(const CutlassGemm &g);

/// Configuration i's name, for logs and traces ("cutlass coop 128x256", ...).
const char *cutlassGemmConfigName(int config);

/// Enqueues `g` with configuration `config` on `stream`. cudaErrorNotSupported when
/// CUTLASS cannot implement the problem (sizes or pointers not 16-byte aligned, or more
/// workspace than workspaceBytes), else the launch's error.
cudaError_t runCutlassGemm(const CutlassGemm &g, int config, const CutlassOperands &ops,
                           void *workspace, size_t workspaceBytes, cudaStream_t stream);

} // namespace forge::rt::cuda
