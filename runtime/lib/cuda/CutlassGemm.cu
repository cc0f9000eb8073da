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

/// Whether G is configuration false or true of the epilogue alias E.
template <class G, template <bool> class E>
constexpr bool isGemm = std::is_same_v<G, E<false>> || std::is_same_v<G, E<true>>;

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
  // G is the epilogue's instantiation (dispatch): its own operands.
  if constexpr (isGemm<G, BiasGemm>) {
    args.epilogue.thread.bias_ptr = static_cast<const bf16 *>(ops.bias);
  } else if constexpr (isGemm<G, GeluAuxGemm>) {
    args.epilogue.thread.bias_ptr = static_cast<const bf16 *>(ops.bias);
    args.epilogue.thread.aux_ptr = static_cast<bf16 *>(ops.aux);
    args.epilogue.thread.dAux = args.epilogue.dD;
  } else if constexpr (isGemm<G, ResidualGemm>) {
    args.epilogue.ptr_C = static_cast<const float *>(ops.c);
    args.epilogue.thread.beta = g.beta;
    args.epilogue.thread.bias_ptr = static_cast<const float *>(ops.bias);
  } else {
    static_assert(isGemm<G, DgeluGemm>);
    args.epilogue.thread.aux_ptr = static_cast<const bf16 *>(ops.aux);
    args.epilogue.thread.dAux = args.epilogue.dD;
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
