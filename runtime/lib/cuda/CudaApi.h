// CUDA libraries the CUDA device uses, resolved at run time so that one
// forge-train binary starts on machines without a GPU, a driver or the CUDA
// libraries (../shared/DESIGN.md §7):
//  * the runtime API is linked statically (cudart_static loads the driver
//    itself and reports cudaErrorInsufficientDriver/NoDevice when absent);
//  * driver API entry points (modules, kernel launches) come from
//    cudaGetDriverEntryPointByVersion;
//  * cuBLASLt and cuDNN are dlopen'ed (libcublasLt.so.13/.12, libcudnn.so.9).
// Function types are taken from the vendor headers with decltype, so a
// signature is never written twice.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>
#include <nccl.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "forge/runtime/Status.h"

namespace forge::rt::cuda {

#define FORGE_CUDA_DRIVER_FUNCTIONS(X)                                                             \
  X(cuModuleLoadData)                                                                              \
  X(cuModuleUnload)                                                                                \
  X(cuModuleGetFunction)                                                                           \
  X(cuLaunchKernel)                                                                                \
  X(cuFuncSetAttribute)                                                                            \
  X(cuGetErrorString)

#define FORGE_CUBLASLT_FUNCTIONS(X)                                                             \
  X(cublasLtCreate)                                                                             \
  X(cublasLtDestroy)                                                                            \
  X(cublasLtGetStatusString)                                                                    \
  X(cublasLtMatmul)                                                                             \
  X(cublasLtMatmulDescCreate)                                                                   \
  X(cublasLtMatmulDescDestroy)                                                                  \
  X(cublasLtMatmulDescSetAttribute)                                                             \
  X(cublasLtMatrixLayoutCreate)                                                                 \
  X(cublasLtMatrixLayoutDestroy)                                                                \
  X(cublasLtMatrixLayoutSetAttribute)                                                           \
  X(cublasLtMatmulPreferenceCreate)                                                             \
  X(cublasLtMatmulPreferenceDestroy)                                                            \
  X(cublasLtMatmulPreferenceSetAttribute)                                                       \
  X(cublasLtMatmulAlgoGetHeuristic)

#define FORGE_CUDNN_FUNCTIONS(X)                                                                \
  X(cudnnCreate)                                                                                \
  X(cudnnDestroy)                                                                               \
  X(cudnnSetStream)                                                                             \
  X(cudnnGetErrorString)                                                                        \
  X(cudnnCreateTensorDescriptor)                                                                \
  X(cudnnSetTensorNdDescriptor)                                                                 \
  X(cudnnDestroyTensorDescriptor)                                                               \
  X(cudnnCreateFilterDescriptor)                                                                \
  X(cudnnSetFilterNdDescriptor)                                                                 \
  X(cudnnDestroyFilterDescriptor)                                                               \
  X(cudnnCreateConvolutionDescriptor)                                                           \
  X(cudnnSetConvolutionNdDescriptor)                                                            \
  X(cudnnSetConvolutionGroupCount)                                                              \
  X(cudnnSetConvolutionMathType)                                                                \
  X(cudnnDestroyConvolutionDescriptor)                                                          \
  X(cudnnGetConvolutionForwardAlgorithm_v7)                                                     \
  X(cudnnGetConvolutionForwardWorkspaceSize)                                                    \
  X(cudnnConvolutionForward)                                                                    \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                                \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)                                               \
  X(cudnnConvolutionBackwardData)                                                               \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                                              \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize)                                             \
  X(cudnnConvolutionBackwardFilter)                                                             \
  X(cudnnAddTensor)

#define FORGE_NCCL_FUNCTIONS(X)                                                                 \
  X(ncclGetUniqueId)                                                                            \
  X(ncclCommInitRank)                                                                           \
  X(ncclCommDestroy)                                                                            \
  X(ncclCommAbort)                                                                              \
  X(ncclAllReduce)                                                                              \
  X(ncclReduceScatter)                                                                          \
  X(ncclAllGather)                                                                              \
  X(ncclGroupStart)                                                                             \
  X(ncclGroupEnd)                                                                               \
  X(ncclGetErrorString)                                                                         \
  X(ncclGetLastError)

struct NcclApi {
#define FORGE_DECLARE(f) decltype(&::f) f = nullptr;
  FORGE_NCCL_FUNCTIONS(FORGE_DECLARE)
#undef FORGE_DECLARE
};

struct CudnnApi {
#define FORGE_DECLARE(f) decltype(&::f) f = nullptr;
  FORGE_CUDNN_FUNCTIONS(FORGE_DECLARE)
#undef FORGE_DECLARE
  /// The dlopen handle of libcudnn (the cuDNN frontend resolves its symbols on it: Attention.cpp).
  void *library = nullptr;
};

struct DriverApi {
#define FORGE_DECLARE(f) decltype(&::f) f = nullptr;
  FORGE_CUDA_DRIVER_FUNCTIONS(FORGE_DECLARE)
#undef FORGE_DECLARE
};

struct CublasLtApi {
#define FORGE_DECLARE(f) decltype(&::f) f = nullptr;
  FORGE_CUBLASLT_FUNCTIONS(FORGE_DECLARE)
#undef FORGE_DECLARE
};

/// Loaded once per process; the error says what is missing.
Expected<const DriverApi *> driverApi();
Expected<const CublasLtApi *> cublasLtApi();
Expected<const CudnnApi *> cudnnApi();
/// NCCL (libnccl.so.2), for data-parallel bundles' collectives only.
Expected<const NcclApi *> ncclApi();

/// "cudaErrorMemoryAllocation: out of memory"
std::string errorString(cudaError_t e);
std::string errorString(const DriverApi &api, CUresult r);

} // namespace forge::rt::cuda
