// CUTLASS sm90 GEMM instantiations (CutlassGemm.h): each epilogue in CutlassGemmSm90.cuh's
// two configurations (0 cooperative 128x256, 1 ping-pong 128x128), the configurations
// bench/cutlass_epilogue_probe.cu times on GPT-2's shapes. Only the A layouts a MatmulPlan
// meets in these epilogues are built (instantiations cost compile time): K-major for the
// forward's epilogues (weights [out, in]), M-major for dGELU (the weight read untransposed).
#include "cuda/CutlassGemm.h"

#include "cuda/CutlassGemmSm90.cuh"

namespace forge::rt::cuda {

namespace {

using namespace forge::cutlass_sm90;
namespace fusion = cutlass::epilogue::fusion;

template <bool PP>
using BiasGemm = Gemm<RowMajor, void, bf16, fusion::LinCombPerRowBias<bf16, float, bf16, void>, PP>;
template <bool PP>
using GeluAuxGemm =
    Gemm<RowMajor, void, bf16,
         fusion::LinCombPerRowBiasEltActAux<ColMajor, cutlass::epilogue::thread::GELU_taylor, bf16,
                                            float, bf16, bf16, void>,
         PP>;
template <bool PP>
using ResidualGemm =
    Gemm<RowMajor, float, float, fusion::LinCombPerRowBias<float, float, float, float>, PP>;
template <bool PP>
using DgeluGemm = Gemm<
    ColMajor, void, bf16,
    fusion::LinCombDeEltAct<ColMajor, cutlass::epilogue::thread::dGELU, bf16, float, bf16, void>,
    PP>;

/// The arguments every epilogue shares: shapes, A and B, D, and the packed strides.
template <class G>
typename G::Op::Arguments baseArguments(const CutlassGemm &g, const CutlassOperands &ops) {
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  typename G::Op::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {m, n, k, 1};
  args.mainloop.ptr_A = static_cast<const bf16 *>(ops.a);
  args.mainloop.dA = cutlass::make_cute_packed_stride(typename G::StrideA{}, {m, k, 1});
  args.mainloop.ptr_B = static_cast<const bf16 *>(ops.b);
  args.mainloop.dB = cutlass::make_cute_packed_stride(typename G::StrideB{}, {n, k, 1});
  args.epilogue.dC = cutlass::make_cute_packed_stride(typename G::StrideC{}, {m, n, 1});
  args.epilogue.dD = cutlass::make_cute_packed_stride(typename G::StrideD{}, {m, n, 1});
  args.epilogue.thread.alpha = g.alpha;
  args.epilogue.thread.beta = 0.f;
  return args;
}

template <class G>
typename G::Op::Arguments arguments(const CutlassGemm &g, const CutlassOperands &ops) {
  using Out = typename G::Kernel::ElementD;
  auto args = baseArguments<G>(g, ops);
  args.epilogue.ptr_D = static_cast<Out *>(ops.d);
  switch (g.epilogue) {
  case CutlassGemm::Epilogue::Bias:
    if constexpr (std::is_same_v<G, BiasGemm<false>> || std::is_same_v<G, BiasGemm<true>>)
      args.epilogue.thread.bias_ptr = static_cast<const bf16 *>(ops.bias);
    break;
  case CutlassGemm::Epilogue::GeluAuxBias:
    if constexpr (std::is_same_v<G, GeluAuxGemm<false>> || std::is_same_v<G, GeluAuxGemm<true>>) {
      args.epilogue.thread.bias_ptr = static_cast<const bf16 *>(ops.bias);
      args.epilogue.thread.aux_ptr = static_cast<bf16 *>(ops.aux);
      args.epilogue.thread.dAux = args.epilogue.dD;
    }
    break;
  case CutlassGemm::Epilogue::ResidualBias:
    if constexpr (std::is_same_v<G, ResidualGemm<false>> || std::is_same_v<G, ResidualGemm<true>>) {
      args.epilogue.ptr_C = static_cast<const float *>(ops.c);
      args.epilogue.thread.beta = g.beta;
      args.epilogue.thread.bias_ptr = static_cast<const float *>(ops.bias);
    }
    break;
  case CutlassGemm::Epilogue::Dgelu:
    if constexpr (std::is_same_v<G, DgeluGemm<false>> || std::is_same_v<G, DgeluGemm<true>>) {
      args.epilogue.thread.aux_ptr = static_cast<const bf16 *>(ops.aux);
      args.epilogue.thread.dAux = args.epilogue.dD;
    }
    break;
  }
  return args;
}

template <class G>
cudaError_t launch(const CutlassGemm &g, const CutlassOperands &ops, void *workspace,
                   size_t workspaceBytes, cudaStream_t stream) {
  auto args = arguments<G>(g, ops);
  typename G::Op op;
  if (op.can_implement(args) != cutlass::Status::kSuccess ||
      G::Op::get_workspace_size(args) > workspaceBytes)
    return cudaErrorNotSupported;
  if (op.initialize(args, workspace, stream) != cutlass::Status::kSuccess)
    return cudaErrorNotSupported;
  // GemmUniversalAdapter::run has already taken the launch's error (cudaGetLastError).
  return op.run(stream) == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorLaunchFailure;
}

template <class G> size_t workspace(const CutlassGemm &g) {
  return G::Op::get_workspace_size(arguments<G>(g, CutlassOperands{}));
}

template <class T> struct Tag { using type = T; };

/// Calls f(Tag<G>{}) with config's instantiation G of g's epilogue.
template <class F> auto dispatch(const CutlassGemm &g, int config, F &&f) {
  const bool pp = config == 1;
  switch (g.epilogue) {
  case CutlassGemm::Epilogue::Bias:
    return pp ? f(Tag<BiasGemm<true>>{}) : f(Tag<BiasGemm<false>>{});
  case CutlassGemm::Epilogue::GeluAuxBias:
    return pp ? f(Tag<GeluAuxGemm<true>>{}) : f(Tag<GeluAuxGemm<false>>{});
  case CutlassGemm::Epilogue::ResidualBias:
    return pp ? f(Tag<ResidualGemm<true>>{}) : f(Tag<ResidualGemm<false>>{});
  case CutlassGemm::Epilogue::Dgelu:
    break;
  }
  return pp ? f(Tag<DgeluGemm<true>>{}) : f(Tag<DgeluGemm<false>>{});
}

} // namespace

int cutlassGemmConfigs(const CutlassGemm &g) {
  // dGELU's A (the weight read untransposed) is M-major; the forward's are K-major.
  const bool kMajor = g.epilogue != CutlassGemm::Epilogue::Dgelu;
  return g.aKMajor == kMajor ? 2 : 0;
}

const char *cutlassGemmConfigName(int config) {
  return config == 1 ? "cutlass pingpong 128x128" : "cutlass coop 128x256";
}

size_t cutlassGemmWorkspace(const CutlassGemm &g, int config) {
  if (config < 0 || config >= cutlassGemmConfigs(g))
    return 0;
  return dispatch(g, config, [&](auto tag) { return workspace<typename decltype(tag)::type>(g); });
}

cudaError_t runCutlassGemm(const CutlassGemm &g, int config, const CutlassOperands &ops,
                           void *workspaceBuffer, size_t workspaceBytes, cudaStream_t stream) {
  if (config < 0 || config >= cutlassGemmConfigs(g) || g.m > INT32_MAX || g.n > INT32_MAX ||
      g.k > INT32_MAX)
    return cudaErrorNotSupported;
  // TMA descriptors need 16-byte aligned addresses, and CUTLASS's can_implement checks
  // only shapes (a misaligned one fails cuTensorMapEncodeTiled, past an assert NDEBUG
  // removes). The arena's sections are 64-byte aligned; a view into one may not be.
  for (const void *p : {ops.a, ops.b, ops.c, ops.bias, static_cast<const void *>(ops.d),
                        static_cast<const void *>(ops.aux)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return cudaErrorNotSupported;
  return dispatch(g, config, [&](auto tag) {
    return launch<typename decltype(tag)::type>(g, ops, workspaceBuffer, workspaceBytes, stream);
  });
}

} // namespace forge::rt::cuda
